#!/usr/bin/python3
"""Writes model/testdata goldens with an independent PyTorch implementation.

The Qwen3 and Llama decoders are written here from Hugging Face transformers'
definitions (modeling_qwen3.py / modeling_llama.py: RMSNorm in float32 style,
q_norm/k_norm over head_dim before RoPE for Qwen3, rotate-half RoPE with
inv_freq = 1/theta^(arange(0, HD, 2)/HD), grouped-query causal attention,
SiLU-gated MLP, optional tied lm_head), in float64 so that the goldens are
the exact values the float32 Go code approximates. Packed sequences are run
one at a time with positions restarting at 0.

For each variant the script generates seeded weights, stores them as
model.safetensors (in the variant's storage dtype; the math uses the stored
values widened to float64) with an HF config.json, and writes golden.safetensors
holding the packed batch (tokens, cu_seqlens, temperature, loss coefficients),
per-token logprobs and entropies (0 at each sequence's first token), the loss
L = sum_t coef[t] * logprob[t], and dL/dparam for every parameter ("grad.NAME").

Run: /usr/bin/python3 scripts/golden_model.py   (or `make golden`)
"""
import json
import os
import struct

import numpy as np
import torch

SEED = 20261129
OUT = os.path.join(os.path.dirname(os.path.abspath(__file__)), "..", "model", "testdata")
RANK = {"F16": 11, "BF16": 12, "I32": 13, "F32": 15}

VARIANTS = [
    # name, model_type, tied, storage dtype, rope_theta
    ("qwen3_untied", "qwen3", False, "F32", 1000000.0),
    ("qwen3_tied", "qwen3", True, "BF16", 1000000.0),
    ("llama_untied", "llama", False, "F16", 10000.0),
    ("llama_tied", "llama", True, "BF16", 500000.0),
]
SEQ_LENS = [7, 1, 12, 5, 9]
TEMPERATURE = 0.7


def base_config(model_type, tied, theta):
    return {
        "model_type": model_type,
        "architectures": ["Qwen3ForCausalLM" if model_type == "qwen3" else "LlamaForCausalLM"],
        "hidden_size": 64,
        "intermediate_size": 128,
        "num_hidden_layers": 2,
        "num_attention_heads": 4,
        "num_key_value_heads": 2,
        "head_dim": 16,
        "rms_norm_eps": 1e-6,
        "rope_theta": theta,
        "vocab_size": 512,
        "tie_word_embeddings": tied,
        "max_position_embeddings": 128,
        "hidden_act": "silu",
        "attention_bias": False,
        "torch_dtype": "float32",
        "initializer_range": 0.02,
        "rope_scaling": None,
    }


def param_shapes(cfg):
    C, I, HD = cfg["hidden_size"], cfg["intermediate_size"], cfg["head_dim"]
    NH, NKV, V = cfg["num_attention_heads"], cfg["num_key_value_heads"], cfg["vocab_size"]
    shapes = [("model.embed_tokens.weight", (V, C))]
    for l in range(cfg["num_hidden_layers"]):
        p = "model.layers.%d." % l
        shapes += [
            (p + "input_layernorm.weight", (C,)),
            (p + "self_attn.q_proj.weight", (NH * HD, C)),
            (p + "self_attn.k_proj.weight", (NKV * HD, C)),
            (p + "self_attn.v_proj.weight", (NKV * HD, C)),
            (p + "self_attn.o_proj.weight", (C, NH * HD)),
        ]
        if cfg["model_type"] == "qwen3":
            shapes += [(p + "self_attn.q_norm.weight", (HD,)), (p + "self_attn.k_norm.weight", (HD,))]
        shapes += [
            (p + "post_attention_layernorm.weight", (C,)),
            (p + "mlp.gate_proj.weight", (I, C)),
            (p + "mlp.up_proj.weight", (I, C)),
            (p + "mlp.down_proj.weight", (C, I)),
        ]
    shapes.append(("model.norm.weight", (C,)))
    if not cfg["tie_word_embeddings"]:
        shapes.append(("lm_head.weight", (V, C)))
    return shapes


def rms_norm(x, w, eps):
    var = x.pow(2).mean(-1, keepdim=True)
    return w * (x * torch.rsqrt(var + eps))


def rotate_half(x):
    h = x.shape[-1] // 2
    return torch.cat((-x[..., h:], x[..., :h]), dim=-1)


def rope(x, pos, theta, hd):
    # x (T, H, HD); HF computes inv_freq and the angles in float32.
    inv_freq = 1.0 / (theta ** (torch.arange(0, hd, 2, dtype=torch.int64).float() / hd))
    freqs = pos.float()[:, None] * inv_freq[None, :]
    emb = torch.cat((freqs, freqs), dim=-1)
    cos, sin = emb.cos().double()[:, None, :], emb.sin().double()[:, None, :]
    return x * cos + rotate_half(x) * sin


def forward_seq(P, cfg, toks):
    """Final normed hidden states (T, C) of one sequence."""
    C, HD = cfg["hidden_size"], cfg["head_dim"]
    NH, NKV = cfg["num_attention_heads"], cfg["num_key_value_heads"]
    eps, theta = cfg["rms_norm_eps"], cfg["rope_theta"]
    T = toks.shape[0]
    pos = torch.arange(T)
    h = P["model.embed_tokens.weight"][toks]
    mask = torch.ones(T, T, dtype=torch.bool).tril()
    for l in range(cfg["num_hidden_layers"]):
        p = "model.layers.%d." % l
        x = rms_norm(h, P[p + "input_layernorm.weight"], eps)
        q = (x @ P[p + "self_attn.q_proj.weight"].T).view(T, NH, HD)
        k = (x @ P[p + "self_attn.k_proj.weight"].T).view(T, NKV, HD)
        v = (x @ P[p + "self_attn.v_proj.weight"].T).view(T, NKV, HD)
        if cfg["model_type"] == "qwen3":
            q = rms_norm(q, P[p + "self_attn.q_norm.weight"], eps)
            k = rms_norm(k, P[p + "self_attn.k_norm.weight"], eps)
        q, k = rope(q, pos, theta, HD), rope(k, pos, theta, HD)
        rep = NH // NKV
        k = k.repeat_interleave(rep, dim=1)
        v = v.repeat_interleave(rep, dim=1)
        scores = torch.einsum("thd,shd->hts", q, k) / (HD ** 0.5)
        scores = scores.masked_fill(~mask, float("-inf"))
        att = torch.softmax(scores, dim=-1)
        o = torch.einsum("hts,shd->thd", att, v).reshape(T, NH * HD)
        h = h + o @ P[p + "self_attn.o_proj.weight"].T
        x = rms_norm(h, P[p + "post_attention_layernorm.weight"], eps)
        g = x @ P[p + "mlp.gate_proj.weight"].T
        u = x @ P[p + "mlp.up_proj.weight"].T
        h = h + (torch.nn.functional.silu(g) * u) @ P[p + "mlp.down_proj.weight"].T
    return rms_norm(h, P["model.norm.weight"], eps)


def forward(P, cfg, tokens, cu, temperature):
    head = P["model.embed_tokens.weight"] if cfg["tie_word_embeddings"] else P["lm_head.weight"]
    lp = torch.zeros(len(tokens), dtype=torch.float64)
    ent = torch.zeros(len(tokens), dtype=torch.float64)
    lps, ents = [], []
    for s in range(len(cu) - 1):
        lo, hi = cu[s], cu[s + 1]
        toks = tokens[lo:hi]
        hid = forward_seq(P, cfg, toks)
        logits = (hid @ head.T) / temperature
        logp = torch.log_softmax(logits, dim=-1)
        seq_lp = torch.zeros(hi - lo, dtype=torch.float64)
        seq_ent = torch.zeros(hi - lo, dtype=torch.float64)
        if hi - lo > 1:
            seq_lp = torch.cat([torch.zeros(1, dtype=torch.float64),
                                logp[:-1].gather(1, toks[1:, None]).squeeze(1)])
            e = -(logp.exp() * logp).sum(-1)
            seq_ent = torch.cat([torch.zeros(1, dtype=torch.float64), e[:-1]])
        lps.append(seq_lp)
        ents.append(seq_ent)
    return torch.cat(lps), torch.cat(ents)


def to_dtype(t, name):
    return {"F32": t.float(), "BF16": t.float().to(torch.bfloat16), "F16": t.float().to(torch.float16)}[name]


def raw(t):
    if t.dtype == torch.bfloat16:
        return t.contiguous().view(torch.int16).numpy().astype("<i2").tobytes()
    if t.dtype == torch.float16:
        return t.contiguous().numpy().astype("<f2").tobytes()
    if t.dtype == torch.float32:
        return t.contiguous().numpy().astype("<f4").tobytes()
    if t.dtype == torch.int32:
        return t.contiguous().numpy().astype("<i4").tobytes()
    raise ValueError(t.dtype)


def dtname(t):
    return {torch.bfloat16: "BF16", torch.float16: "F16", torch.float32: "F32", torch.int32: "I32"}[t.dtype]


def save(path, tensors, meta):
    """safetensors laid out by hand from HF's specification."""
    items = sorted(tensors.items(), key=lambda kv: (-RANK[dtname(kv[1])], kv[0]))
    header = {"__metadata__": dict(sorted(meta.items()))}
    blobs, off = [], 0
    for name, t in items:
        b = raw(t)
        header[name] = {"dtype": dtname(t), "shape": list(t.shape), "data_offsets": [off, off + len(b)]}
        off += len(b)
        blobs.append(b)
    h = json.dumps(header, separators=(",", ":")).encode()
    h += b" " * ((8 - len(h) % 8) % 8)
    with open(path, "wb") as f:
        f.write(struct.pack("<Q", len(h)))
        f.write(h)
        for b in blobs:
            f.write(b)


def main():
    torch.manual_seed(SEED)
    meta = {"format": "pt", "golden_script": "scripts/golden_model.py", "golden_seed": str(SEED),
            "golden_torch": torch.__version__}
    for vi, (name, model_type, tied, storage, theta) in enumerate(VARIANTS):
        g = torch.Generator().manual_seed(SEED + vi)
        cfg = base_config(model_type, tied, theta)
        cfg["torch_dtype"] = {"F32": "float32", "BF16": "bfloat16", "F16": "float16"}[storage]
        stored = {}
        for pname, shape in param_shapes(cfg):
            if len(shape) == 1:  # norm weights around 1, not exactly 1, so their gradients matter
                w = 1.0 + 0.2 * torch.randn(shape, generator=g)
            elif pname.endswith("embed_tokens.weight") or pname == "lm_head.weight":
                w = 0.5 * torch.randn(shape, generator=g)
            else:
                w = torch.randn(shape, generator=g) / (shape[1] ** 0.5)
            stored[pname] = to_dtype(w, storage)
        d = os.path.join(OUT, name)
        os.makedirs(d, exist_ok=True)
        save(os.path.join(d, "model.safetensors"), stored, meta)
        with open(os.path.join(d, "config.json"), "w") as f:
            json.dump(cfg, f, indent=2, sort_keys=True)
            f.write("\n")

        P = {k: v.double().clone().requires_grad_(True) for k, v in stored.items()}
        V = cfg["vocab_size"]
        tokens = torch.randint(0, V, (sum(SEQ_LENS),), generator=g)
        cu = [0]
        for n in SEQ_LENS:
            cu.append(cu[-1] + n)
        coef = torch.randn(len(tokens), generator=g, dtype=torch.float64)
        lp, ent = forward(P, cfg, tokens, cu, TEMPERATURE)
        loss = (coef * lp).sum()
        loss.backward()
        gold = {
            "tokens": tokens.to(torch.int32),
            "cu_seqlens": torch.tensor(cu, dtype=torch.int32),
            "temperature": torch.tensor([TEMPERATURE], dtype=torch.float32),
            "coef": coef.float(),
            "logprob": lp.detach().float(),
            "entropy": ent.detach().float(),
            "loss": loss.detach().float().reshape(1),
        }
        for pname, p in P.items():
            gold["grad." + pname] = p.grad.float()
        save(os.path.join(d, "golden.safetensors"), gold, dict(meta, variant=name))
        print("%s: loss %.6f, %d tokens, %d sequences" % (name, loss.item(), len(tokens), len(SEQ_LENS)))


if __name__ == "__main__":
    main()
