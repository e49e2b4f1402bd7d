#!/usr/bin/python3
"""Times one forward + backward + AdamW step of a Qwen3-shaped model in PyTorch,
the reference for `train bench` (same shapes, same weights, same threads).

It writes the seeded random weights it times as an HF directory (--out:
config.json + model.safetensors, float32) so that `train bench --weights DIR`
times the same model, then prints one JSON line: ms_per_step (median over
--steps after one warm-up), tokens_per_s and peak_rss_mib. With --profile the
per-op table of torch's profiler for one step goes to stderr.

The step matches tracegrpo's: packed rows of equal length (so a (rows, seq)
batch), causal GQA attention, logits ÷ temperature (1), log-softmax, gather of
the next token and entropy (no gradient), loss = Σ dl·logprob, backward, and
AdamW with weight decay 0.01 on matrices and 0 on norm weights.

Debian's python3-torch calls whatever libblas.so.3 resolves to, which is the
reference (unoptimised) BLAS unless an optimised one is installed; the JSON line
names the library used (blas) and, for OpenBLAS, its build and the kernel set
it chose for this CPU (blas_config). scripts/bench_compare.sh points it at OpenBLAS when
libopenblas0-pthread is installed, so the reference is a realistic PyTorch.

With --moe E,K the model is the same one with every MLP sparse (Qwen3-MoE):
E experts of width intermediate_size/K, K per token (so as many active
parameters per token as the dense model, plus the router), computed as
transformers' Qwen3MoeSparseMoeBlock computes it (softmax, top-k,
renormalised; a loop over the experts that got tokens, index_add_).

Run: /usr/bin/python3 scripts/bench_torch.py --out /tmp/tracegrpo-bench [--threads 2] [--moe 16,4]
"""
import argparse
import ctypes
import json
import os
import resource
import struct
import sys
import time

import torch
import torch.nn.functional as F

CONFIG = {
    "model_type": "qwen3", "architectures": ["Qwen3ForCausalLM"], "hidden_size": 512,
    "intermediate_size": 1536, "num_hidden_layers": 8, "num_attention_heads": 8,
    "num_key_value_heads": 4, "head_dim": 64, "rms_norm_eps": 1e-6, "rope_theta": 1000000.0,
    "vocab_size": 8192, "tie_word_embeddings": False, "max_position_embeddings": 4096,
    "torch_dtype": "float32", "hidden_act": "silu", "attention_bias": False, "rope_scaling": None,
}


def moe_config(E, K):
    c = dict(CONFIG, model_type="qwen3_moe", architectures=["Qwen3MoeForCausalLM"], num_experts=E,
             num_experts_per_tok=K, moe_intermediate_size=CONFIG["intermediate_size"] // K, norm_topk_prob=True,
             decoder_sparse_step=1, mlp_only_layers=[], output_router_logits=False, router_aux_loss_coef=0.001)
    return c


def param_shapes(c):
    C, I, HD = c["hidden_size"], c["intermediate_size"], c["head_dim"]
    NH, NKV, V = c["num_attention_heads"], c["num_key_value_heads"], c["vocab_size"]
    out = [("model.embed_tokens.weight", (V, C))]
    for l in range(c["num_hidden_layers"]):
        p = "model.layers.%d." % l
        out += [(p + "input_layernorm.weight", (C,)), (p + "self_attn.q_proj.weight", (NH * HD, C)),
                (p + "self_attn.k_proj.weight", (NKV * HD, C)), (p + "self_attn.v_proj.weight", (NKV * HD, C)),
                (p + "self_attn.o_proj.weight", (C, NH * HD)), (p + "self_attn.q_norm.weight", (HD,)),
                (p + "self_attn.k_norm.weight", (HD,)), (p + "post_attention_layernorm.weight", (C,))]
        if c["model_type"] == "qwen3_moe":
            Im, E = c["moe_intermediate_size"], c["num_experts"]
            out.append((p + "mlp.gate.weight", (E, C)))
            for e in range(E):
                out += [(p + "mlp.experts.%d.gate_proj.weight" % e, (Im, C)), (p + "mlp.experts.%d.up_proj.weight" % e, (Im, C)),
                        (p + "mlp.experts.%d.down_proj.weight" % e, (C, Im))]
            continue
        out += [(p + "mlp.gate_proj.weight", (I, C)), (p + "mlp.up_proj.weight", (I, C)),
                (p + "mlp.down_proj.weight", (C, I))]
    out += [("model.norm.weight", (C,)), ("lm_head.weight", (V, C))]
    return out


def save_dir(path, params, config):
    os.makedirs(path, exist_ok=True)
    items = sorted(params.items())
    header = {"__metadata__": {"format": "pt", "written_by": "scripts/bench_torch.py"}}
    off = 0
    for name, t in items:
        n = t.numel() * 4
        header[name] = {"dtype": "F32", "shape": list(t.shape), "data_offsets": [off, off + n]}
        off += n
    h = json.dumps(header, separators=(",", ":")).encode()
    h += b" " * ((8 - len(h) % 8) % 8)
    with open(os.path.join(path, "model.safetensors"), "wb") as f:
        f.write(struct.pack("<Q", len(h)))
        f.write(h)
        for _, t in items:
            f.write(t.detach().contiguous().numpy().astype("<f4").tobytes())
    with open(os.path.join(path, "config.json"), "w") as f:
        json.dump(config, f, indent=2, sort_keys=True)


def blas_in_use():
    """The BLAS library mapped into this process (Debian's torch uses whatever
    libblas.so.3 resolves to: the slow reference BLAS by default)."""
    libs = set()
    with open("/proc/self/maps") as f:
        for line in f:
            path = line.split()[-1] if len(line.split()) >= 6 else ""
            if "blas" in os.path.basename(path):
                libs.add(path)
    return ",".join(sorted(libs)) or "unknown"


def blas_config():
    """OpenBLAS's own account of itself (version, build, and the kernel set it
    picked for this CPU, which OPENBLAS_CORETYPE overrides), or ""."""
    for path in blas_in_use().split(","):
        if "openblas" not in os.path.basename(path):
            continue
        try:
            lib = ctypes.CDLL(path)
            lib.openblas_get_config.restype = ctypes.c_char_p
            lib.openblas_get_corename.restype = ctypes.c_char_p
            return "%s; core %s" % (lib.openblas_get_config().decode(), lib.openblas_get_corename().decode())
        except (OSError, AttributeError):
            continue
    return ""


def rms_norm(x, w, eps):
    return w * (x * torch.rsqrt(x.pow(2).mean(-1, keepdim=True) + eps))


def rotate_half(x):
    h = x.shape[-1] // 2
    return torch.cat((-x[..., h:], x[..., :h]), dim=-1)


def sparse_mlp(P, p, c, x):
    """transformers' Qwen3MoeSparseMoeBlock (v4's eager loop over experts)."""
    shape = x.shape
    x = x.reshape(-1, shape[-1])
    E, K = c["num_experts"], c["num_experts_per_tok"]
    probs = F.softmax(F.linear(x, P[p + "mlp.gate.weight"]), dim=1, dtype=torch.float)
    w, sel = torch.topk(probs, K, dim=-1)
    w = w / w.sum(dim=-1, keepdim=True)
    out = torch.zeros_like(x)
    mask = F.one_hot(sel, num_classes=E).permute(2, 1, 0)
    for e in torch.greater(mask.sum(dim=(-1, -2)), 0).nonzero():
        e = int(e)
        idx, top = torch.where(mask[e])
        cur = x[top]
        q = "%smlp.experts.%d." % (p, e)
        y = F.linear(F.silu(F.linear(cur, P[q + "gate_proj.weight"])) * F.linear(cur, P[q + "up_proj.weight"]),
                     P[q + "down_proj.weight"])
        out.index_add_(0, top, y * w[top, idx, None])
    return out.reshape(shape)


def step_loss(P, c, tokens, dl, cos, sin, mask):
    R, T = tokens.shape
    C, HD = c["hidden_size"], c["head_dim"]
    NH, NKV, eps = c["num_attention_heads"], c["num_key_value_heads"], c["rms_norm_eps"]
    h = F.embedding(tokens, P["model.embed_tokens.weight"])
    for l in range(c["num_hidden_layers"]):
        p = "model.layers.%d." % l
        x = rms_norm(h, P[p + "input_layernorm.weight"], eps)
        q = F.linear(x, P[p + "self_attn.q_proj.weight"]).view(R, T, NH, HD)
        k = F.linear(x, P[p + "self_attn.k_proj.weight"]).view(R, T, NKV, HD)
        v = F.linear(x, P[p + "self_attn.v_proj.weight"]).view(R, T, NKV, HD)
        q = rms_norm(q, P[p + "self_attn.q_norm.weight"], eps).transpose(1, 2)
        k = rms_norm(k, P[p + "self_attn.k_norm.weight"], eps).transpose(1, 2)
        v = v.transpose(1, 2)
        q = q * cos + rotate_half(q) * sin
        k = k * cos + rotate_half(k) * sin
        k = k.repeat_interleave(NH // NKV, dim=1)
        v = v.repeat_interleave(NH // NKV, dim=1)
        s = (q @ k.transpose(-1, -2)) / (HD ** 0.5)
        s = s.masked_fill(mask, float("-inf"))
        o = (torch.softmax(s, dim=-1) @ v).transpose(1, 2).reshape(R, T, NH * HD)
        h = h + F.linear(o, P[p + "self_attn.o_proj.weight"])
        x = rms_norm(h, P[p + "post_attention_layernorm.weight"], eps)
        if c["model_type"] == "qwen3_moe":
            h = h + sparse_mlp(P, p, c, x)
            continue
        h = h + F.linear(F.silu(F.linear(x, P[p + "mlp.gate_proj.weight"])) * F.linear(x, P[p + "mlp.up_proj.weight"]),
                         P[p + "mlp.down_proj.weight"])
    h = rms_norm(h, P["model.norm.weight"], eps)
    logits = F.linear(h[:, :-1], P["lm_head.weight"])
    logp = torch.log_softmax(logits, dim=-1)
    lp = logp.gather(-1, tokens[:, 1:, None]).squeeze(-1)
    with torch.no_grad():
        ent = -(logp.exp() * logp).sum(-1)
    return (lp * dl).sum(), lp, ent


def main():
    ap = argparse.ArgumentParser()
    ap.add_argument("--out", default="/tmp/tracegrpo-bench")
    ap.add_argument("--rows", type=int, default=8)
    ap.add_argument("--seq", type=int, default=256)
    ap.add_argument("--steps", type=int, default=5)
    ap.add_argument("--threads", type=int, default=2)
    ap.add_argument("--seed", type=int, default=1)
    ap.add_argument("--profile", action="store_true")
    ap.add_argument("--moe", default="", help="E,K: every MLP sparse, E experts, K per token")
    a = ap.parse_args()
    torch.set_num_threads(a.threads)
    g = torch.Generator().manual_seed(a.seed)
    c = CONFIG
    if a.moe:
        E, K = (int(v) for v in a.moe.split(","))
        c = moe_config(E, K)
    P = {}
    for name, shape in param_shapes(c):
        t = torch.ones(shape) if len(shape) == 1 else torch.randn(shape, generator=g) * 0.02
        P[name] = t.requires_grad_(True)
    save_dir(a.out, P, c)
    tokens = torch.randint(0, c["vocab_size"], (a.rows, a.seq), generator=g)
    dl = torch.randn(a.rows, a.seq - 1, generator=g) / (a.rows * a.seq)
    HD = c["head_dim"]
    inv = 1.0 / (c["rope_theta"] ** (torch.arange(0, HD, 2).float() / HD))
    fr = torch.arange(a.seq).float()[:, None] * inv[None]
    emb = torch.cat((fr, fr), -1)
    cos, sin = emb.cos()[None, None], emb.sin()[None, None]
    mask = torch.ones(a.seq, a.seq, dtype=torch.bool).triu(1)
    decay = [t for n, t in P.items() if t.dim() == 2]
    nodecay = [t for n, t in P.items() if t.dim() == 1]
    opt = torch.optim.AdamW([{"params": decay, "weight_decay": 0.01}, {"params": nodecay, "weight_decay": 0.0}],
                            lr=1e-6, betas=(0.9, 0.999), eps=1e-8)

    def step():
        opt.zero_grad(set_to_none=False)
        loss, lp, ent = step_loss(P, c, tokens, dl, cos, sin, mask)
        loss.backward()
        opt.step()
        return lp

    step()  # warm-up
    times = []
    for _ in range(a.steps):
        t0 = time.perf_counter()
        lp = step()
        times.append((time.perf_counter() - t0) * 1e3)
    if a.profile:
        with torch.autograd.profiler.profile() as prof:
            step()
        print(prof.key_averages().table(sort_by="self_cpu_time_total", row_limit=20), file=sys.stderr)
    times.sort()
    n = len(times)
    med = times[n // 2] if n % 2 else (times[n // 2 - 1] + times[n // 2]) / 2
    print(json.dumps({
        "backend": "torch", "model_type": c["model_type"], "torch": torch.__version__, "blas": blas_in_use(), "blas_config": blas_config(), "threads": a.threads, "rows": a.rows, "seq": a.seq,
        "steps": a.steps, "params": sum(t.numel() for t in P.values()), "ms_per_step": med, "ms_min": times[0],
        "tokens_per_s": a.rows * a.seq / (med / 1e3),
        "peak_rss_mib": resource.getrusage(resource.RUSAGE_SELF).ru_maxrss / 1024, "weights": a.out,
    }))


if __name__ == "__main__":
    main()
