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

Qwen2 variants add the q/k/v biases (nonzero, so their gradients matter) and
state no head_dim, as Qwen2.5's configs do. The llama31_long/llama32_long
variants use Llama 3.1's and 3.2's llama3 RoPE scaling (factor 8 and 32) on
a one-layer model with a sequence reaching position 32774; their goldens also
hold logprob_unscaled (the same batch with unscaled RoPE, to show that the
scaling changes the result) and rope.inv_freq. Long sequences attend in query
chunks with activation checkpointing (the same math, less memory).
golden_rope.json holds inv_freq and float32 cos/sin at large positions for
plain and llama3-scaled RoPE, written from transformers' formulas.

Run: /usr/bin/python3 scripts/golden_model.py   (or `make golden`); GOLDEN_VARIANTS=name,...
regenerates some variants alone (the same bytes: each variant has its own seed).
"""
import json
import math
import os
import struct
import warnings

import numpy as np
import torch
import torch.utils.checkpoint

SEED = 20261129
OUT = os.path.join(os.path.dirname(os.path.abspath(__file__)), "..", "model", "testdata")
RANK = {"F16": 11, "BF16": 12, "I32": 13, "F32": 15}

# Llama 3.x RoPE scaling as published: Llama-3.1/3.3 use factor 8, Llama-3.2
# factor 32, both with low/high_freq_factor 1/4 and 8192 original positions.
LLAMA31_SCALING = {"factor": 8.0, "high_freq_factor": 4.0, "low_freq_factor": 1.0,
                   "original_max_position_embeddings": 8192, "rope_type": "llama3"}
LLAMA32_SCALING = dict(LLAMA31_SCALING, factor=32.0)
# The long variants: one layer, one head of 8 dimensions (its four frequencies
# fall in Llama 3's high, medium and low bands at theta 5e5) and a sequence
# reaching position 32774, so the test stays cheap while the scaling matters.
LONG_DIMS = {"hidden_size": 16, "intermediate_size": 32, "num_hidden_layers": 1, "num_attention_heads": 1,
             "num_key_value_heads": 1, "head_dim": 8, "vocab_size": 64, "max_position_embeddings": 131072}

VARIANTS = [
    # name, model_type, tied, storage dtype, rope_theta, rope_scaling, config overrides, sequence lengths
    ("qwen3_untied", "qwen3", False, "F32", 1000000.0, None, {}, None),
    ("qwen3_tied", "qwen3", True, "BF16", 1000000.0, None, {}, None),
    ("llama_untied", "llama", False, "F16", 10000.0, None, {}, None),
    ("llama_tied", "llama", True, "BF16", 500000.0, None, {}, None),
    # Qwen2 (q/k/v biases), tied and untied, F32 and BF16 weights.
    ("qwen2_untied", "qwen2", False, "F32", 1000000.0, None, {}, None),
    ("qwen2_tied", "qwen2", True, "BF16", 1000000.0, None, {}, None),
    ("qwen2_untied_bf16", "qwen2", False, "BF16", 10000.0, None, {}, None),
    ("qwen2_tied_f32", "qwen2", True, "F32", 1000000.0, None, {}, None),
    # Llama 3.1 (factor 8, untied, F32) and Llama 3.2 (factor 32, tied, BF16).
    ("llama31_long", "llama", False, "F32", 500000.0, LLAMA31_SCALING, LONG_DIMS, [32775, 6]),
    ("llama32_long", "llama", True, "BF16", 500000.0, LLAMA32_SCALING, LONG_DIMS, [32775, 6]),
    # Sequences that share prefixes, as a GRPO step's traces do (shared_batch);
    # each runs alone here, and tracegrpo's token-trie packing
    # (model.ForwardTree) must give these unshared values.
    ("qwen3_shared", "qwen3", True, "F32", 1000000.0, None, {}, "shared"),
]
SEQ_LENS = [7, 1, 12, 5, 9]


def shared_batch(g, V):
    """Token sequences sharing prefixes: four generations of one prompt (two
    of them equal, one a prefix of another), a sequence that leaves the prompt
    early, and an agent rollout of three turns that branches at each turn."""
    def toks(n):
        return torch.randint(0, V, (n,), generator=g).tolist()
    prompt = toks(9)
    a = prompt + toks(6)
    same = prompt + toks(3)
    seqs = [prompt + toks(4), a, same, list(same), a[:12], prompt[:4] + toks(5)]
    turn1 = toks(5) + toks(3)
    for b1 in range(2):
        turn2 = turn1 + toks(2) + toks(3)
        seqs.append(turn2)
        for b2 in range(2):
            seqs.append(turn2 + toks(2) + toks(2 + b1 + b2))
    return seqs
TEMPERATURE = 0.7
ARCH_CLASS = {"qwen3": "Qwen3ForCausalLM", "qwen2": "Qwen2ForCausalLM", "llama": "LlamaForCausalLM"}


def base_config(model_type, tied, theta, scaling=None, overrides=None):
    if model_type == "qwen2":
        # As Qwen2.5's published configs: no head_dim (hidden/heads), no
        # attention_bias key (q/k/v always carry one), sliding window off.
        cfg = {
            "model_type": "qwen2",
            "architectures": [ARCH_CLASS["qwen2"]],
            "hidden_size": 64,
            "intermediate_size": 128,
            "num_hidden_layers": 2,
            "num_attention_heads": 4,
            "num_key_value_heads": 2,
            "rms_norm_eps": 1e-6,
            "rope_theta": theta,
            "vocab_size": 512,
            "tie_word_embeddings": tied,
            "max_position_embeddings": 128,
            "hidden_act": "silu",
            "torch_dtype": "float32",
            "initializer_range": 0.02,
            "use_sliding_window": False,
            "sliding_window": 128,
            "max_window_layers": 2,
        }
        cfg["head_dim"] = cfg["hidden_size"] // cfg["num_attention_heads"]  # for param_shapes; removed when saved
        return cfg
    cfg = {
        "model_type": model_type,
        "architectures": [ARCH_CLASS[model_type]],
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
        "rope_scaling": scaling,
    }
    cfg.update(overrides or {})
    return cfg


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
        ]
        if cfg["model_type"] == "qwen2":
            shapes += [
                (p + "self_attn.q_proj.bias", (NH * HD,)),
                (p + "self_attn.k_proj.bias", (NKV * HD,)),
                (p + "self_attn.v_proj.bias", (NKV * HD,)),
            ]
        shapes += [
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


def inv_freq_of(theta, hd, scaling):
    """Rotary inverse frequencies as transformers computes them, in float32:
    1/theta^(arange(0, HD, 2)/HD), and for rope_type "llama3" the per-frequency
    rescaling of _compute_llama3_parameters (keep wavelengths below
    L/high_freq_factor, divide those above L/low_freq_factor by factor,
    interpolate in between)."""
    inv_freq = 1.0 / (theta ** (torch.arange(0, hd, 2, dtype=torch.int64).float() / hd))
    if scaling is None:
        return inv_freq
    assert scaling["rope_type"] == "llama3"
    factor = scaling["factor"]
    low, high = scaling["low_freq_factor"], scaling["high_freq_factor"]
    old_len = scaling["original_max_position_embeddings"]
    low_freq_wavelen, high_freq_wavelen = old_len / low, old_len / high
    wavelen = 2 * math.pi / inv_freq
    scaled = torch.where(wavelen > low_freq_wavelen, inv_freq / factor, inv_freq)
    smooth = (old_len / wavelen - low) / (high - low)
    smoothed = (1 - smooth) * scaled / factor + smooth * scaled
    medium = ~(wavelen < high_freq_wavelen) * ~(wavelen > low_freq_wavelen)
    return torch.where(medium, smoothed, scaled)


def rope(x, pos, theta, hd, scaling=None):
    # x (T, H, HD); HF computes inv_freq and the angles in float32.
    inv_freq = inv_freq_of(theta, hd, scaling)
    freqs = pos.float()[:, None] * inv_freq[None, :]
    emb = torch.cat((freqs, freqs), dim=-1)
    cos, sin = emb.cos().double()[:, None, :], emb.sin().double()[:, None, :]
    return x * cos + rotate_half(x) * sin


LONG = 2048  # sequences longer than this attend in query chunks (memory)


def attention_chunk(q, k, v, lo):
    """Causal attention of queries q (n, H, HD) at positions lo.. over keys
    and values (T, H, HD)."""
    n, HD = q.shape[0], q.shape[2]
    hi = lo + n
    scores = torch.einsum("thd,shd->hts", q, k[:hi]) / (HD ** 0.5)
    mask = torch.arange(hi)[None, :] <= torch.arange(lo, hi)[:, None]
    scores = scores.masked_fill(~mask, float("-inf"))
    att = torch.softmax(scores, dim=-1)
    return torch.einsum("hts,shd->thd", att, v[:hi])


def forward_seq(P, cfg, toks, scaling="config"):
    """Final normed hidden states (T, C) of one sequence."""
    C, HD = cfg["hidden_size"], cfg["head_dim"]
    NH, NKV = cfg["num_attention_heads"], cfg["num_key_value_heads"]
    eps, theta = cfg["rms_norm_eps"], cfg["rope_theta"]
    if scaling == "config":
        scaling = cfg.get("rope_scaling")
    T = toks.shape[0]
    pos = torch.arange(T)
    h = P["model.embed_tokens.weight"][toks]
    mask = torch.ones(T, T, dtype=torch.bool).tril() if T <= LONG else None
    for l in range(cfg["num_hidden_layers"]):
        p = "model.layers.%d." % l
        x = rms_norm(h, P[p + "input_layernorm.weight"], eps)
        q = x @ P[p + "self_attn.q_proj.weight"].T
        k = x @ P[p + "self_attn.k_proj.weight"].T
        v = x @ P[p + "self_attn.v_proj.weight"].T
        if cfg["model_type"] == "qwen2":
            q = q + P[p + "self_attn.q_proj.bias"]
            k = k + P[p + "self_attn.k_proj.bias"]
            v = v + P[p + "self_attn.v_proj.bias"]
        q, k, v = q.view(T, NH, HD), k.view(T, NKV, HD), v.view(T, NKV, HD)
        if cfg["model_type"] == "qwen3":
            q = rms_norm(q, P[p + "self_attn.q_norm.weight"], eps)
            k = rms_norm(k, P[p + "self_attn.k_norm.weight"], eps)
        q, k = rope(q, pos, theta, HD, scaling), rope(k, pos, theta, HD, scaling)
        rep = NH // NKV
        k = k.repeat_interleave(rep, dim=1)
        v = v.repeat_interleave(rep, dim=1)
        if mask is not None:
            scores = torch.einsum("thd,shd->hts", q, k) / (HD ** 0.5)
            scores = scores.masked_fill(~mask, float("-inf"))
            att = torch.softmax(scores, dim=-1)
            o = torch.einsum("hts,shd->thd", att, v).reshape(T, NH * HD)
        else:
            # Query chunks, recomputed in the backward pass (checkpointing)
            # so the T×T scores never exist at once.
            outs = [torch.utils.checkpoint.checkpoint(attention_chunk, q[lo:lo + 1024], k, v, lo)
                    for lo in range(0, T, 1024)]
            o = torch.cat(outs).reshape(T, NH * HD)
        h = h + o @ P[p + "self_attn.o_proj.weight"].T
        x = rms_norm(h, P[p + "post_attention_layernorm.weight"], eps)
        g = x @ P[p + "mlp.gate_proj.weight"].T
        u = x @ P[p + "mlp.up_proj.weight"].T
        h = h + (torch.nn.functional.silu(g) * u) @ P[p + "mlp.down_proj.weight"].T
    return rms_norm(h, P["model.norm.weight"], eps)


def forward(P, cfg, tokens, cu, temperature, scaling="config"):
    head = P["model.embed_tokens.weight"] if cfg["tie_word_embeddings"] else P["lm_head.weight"]
    lps, ents = [], []
    for s in range(len(cu) - 1):
        lo, hi = cu[s], cu[s + 1]
        toks = tokens[lo:hi]
        hid = forward_seq(P, cfg, toks, scaling)
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
    rope_cases = []
    only = [v for v in os.environ.get("GOLDEN_VARIANTS", "").split(",") if v]
    for vi, (name, model_type, tied, storage, theta, scaling, overrides, seq_lens) in enumerate(VARIANTS):
        if only and name not in only:
            continue  # GOLDEN_VARIANTS=a,b regenerates those alone (the same bytes: each has its own seed)
        g = torch.Generator().manual_seed(SEED + vi)
        cfg = base_config(model_type, tied, theta, scaling, overrides)
        seq_lens = seq_lens or SEQ_LENS
        cfg["torch_dtype"] = {"F32": "float32", "BF16": "bfloat16", "F16": "float16"}[storage]
        stored = {}
        for pname, shape in param_shapes(cfg):
            if pname.endswith(".bias"):  # Qwen2's q/k/v biases: nonzero, so they matter
                w = 0.5 * torch.randn(shape, generator=g)
            elif len(shape) == 1:  # norm weights around 1, not exactly 1, so their gradients matter
                w = 1.0 + 0.2 * torch.randn(shape, generator=g)
            elif pname.endswith("embed_tokens.weight") or pname == "lm_head.weight":
                w = 0.5 * torch.randn(shape, generator=g)
            else:
                w = torch.randn(shape, generator=g) / (shape[1] ** 0.5)
            stored[pname] = to_dtype(w, storage)
        d = os.path.join(OUT, name)
        os.makedirs(d, exist_ok=True)
        save(os.path.join(d, "model.safetensors"), stored, meta)
        saved = dict(cfg)
        if model_type == "qwen2":
            del saved["head_dim"]  # Qwen2 configs state none: hidden/heads
        with open(os.path.join(d, "config.json"), "w") as f:
            json.dump(saved, f, indent=2, sort_keys=True)
            f.write("\n")

        P = {k: v.double().clone().requires_grad_(True) for k, v in stored.items()}
        V = cfg["vocab_size"]
        if seq_lens == "shared":
            seqs = shared_batch(g, V)
            seq_lens = [len(x) for x in seqs]
            tokens = torch.tensor([t for x in seqs for t in x], dtype=torch.int64)
        else:
            tokens = torch.randint(0, V, (sum(seq_lens),), generator=g)
        cu = [0]
        for n in seq_lens:
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
        extra = ""
        if scaling is not None:
            # The same weights and tokens with unscaled RoPE: where these differ
            # from logprob, a model ignoring the scaling fails the test.
            with torch.no_grad(), warnings.catch_warnings():
                warnings.simplefilter("ignore")  # checkpointing without gradients
                lp0, _ = forward(P, cfg, tokens, cu, TEMPERATURE, scaling=None)
            gold["logprob_unscaled"] = lp0.float()
            gold["rope.inv_freq"] = inv_freq_of(theta, cfg["head_dim"], scaling)
            extra = ", max |logprob - unscaled| %.3g" % (lp - lp0).abs().max().item()
        save(os.path.join(d, "golden.safetensors"), gold, dict(meta, variant=name))
        print("%s: loss %.6f, %d tokens, %d sequences%s" % (name, loss.item(), len(tokens), len(seq_lens), extra))

    write_rope_golden(meta)


# RoPE tables against which model.RopeInvFreq/RopeTables are checked: the
# published Llama 3.1/3.2 scalings at their head sizes, the long variants'
# head size, an odd scaling and plain RoPE.
ROPE_CASES = [
    (500000.0, 64, LLAMA32_SCALING),
    (500000.0, 128, LLAMA31_SCALING),
    (500000.0, 8, LLAMA31_SCALING),
    (500000.0, 16, LLAMA32_SCALING),
    (10000.0, 128, {"factor": 6.0, "low_freq_factor": 2.0, "high_freq_factor": 3.5,
                    "original_max_position_embeddings": 4096, "rope_type": "llama3"}),
    (500000.0, 128, {"factor": 5.0, "low_freq_factor": 1.5, "high_freq_factor": 7.0,
                     "original_max_position_embeddings": 6000, "rope_type": "llama3"}),
    (1000000.0, 128, None),
    (10000.0, 64, None),
]
ROPE_POSITIONS = [0, 1, 5, 2047, 8191, 8192, 20000, 32767, 131071]


def write_rope_golden(meta):
    cases = []
    for theta, hd, scaling in ROPE_CASES:
        inv = inv_freq_of(theta, hd, scaling)
        pos = torch.tensor(ROPE_POSITIONS, dtype=torch.int64)
        # LlamaRotaryEmbedding.forward: inv_freq @ position_ids in float32, cos/sin of those.
        freqs = (inv[None, :, None].float() @ pos[None, None, :].float()).transpose(1, 2)[0]
        cases.append({"theta": theta, "head_dim": hd, "rope_scaling": scaling, "positions": ROPE_POSITIONS,
                      "inv_freq": [float(x) for x in inv.tolist()],
                      "inv_freq_default": [float(x) for x in inv_freq_of(theta, hd, None).tolist()],
                      "cos": [float(x) for x in freqs.cos().reshape(-1).tolist()],
                      "sin": [float(x) for x in freqs.sin().reshape(-1).tolist()]})
    path = os.path.join(OUT, "golden_rope.json")
    with open(path, "w") as f:
        json.dump({"metadata": {"script": meta["golden_script"], "torch": meta["golden_torch"],
                                "note": "transformers' default and llama3 inv_freq in torch float32; cos/sin in float32"},
                   "cases": cases}, f, indent=1)
        f.write("\n")
    print("wrote", path)


if __name__ == "__main__":
    main()
