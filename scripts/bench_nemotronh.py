#!/usr/bin/env python3
"""make bench-nemotron's PyTorch side: one Nemotron-H training step (forward,
backward and AdamW over rows of random tokens, float32) of a tiny-but-not-
trivial model, timed, in Debian's torch 1.13. The model's math is
scripts/golden_nemotronh.py's (written from transformers'
NemotronHForCausalLM: the chunked SSD scan, GQA attention without RoPE, the
squared-ReLU MLP, the sigmoid router with the selection bias and its loop
over experts), run in float32 here. The script writes the model's config.json
and model.safetensors to --out, so that `train bench --model DIR/config.json
--weights DIR` times tracegrpo's step on the same weights and shapes; it
prints one JSON line: ms_per_step (the median of --steps after one warm-up
step), tokens_per_s, the BLAS in use.

    /usr/bin/python3 scripts/bench_nemotronh.py --out DIR [--rows 2] [--seq 256] [--steps 3] [--threads 2]
"""

import argparse
import json
import os
import statistics
import sys
import time

import torch
import torch.nn.functional as F

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
import bench_torch  # noqa: E402  (blas_in_use)
import golden_model as gm  # noqa: E402  (save)
import golden_nemotronh as gn  # noqa: E402  (the model's math)

# A Nemotron-3-shaped pattern at a CPU's size: Mamba-2, sparse and
# attention blocks in Nano's order (MEM*E...), 16 experts of 256, 4 a token,
# a shared expert.
CONFIG = dict(gn.BASE, **{
    "hybrid_override_pattern": "MEM*EME", "hidden_size": 256, "vocab_size": 4096,
    "num_attention_heads": 8, "num_key_value_heads": 2, "head_dim": 32, "intermediate_size": 512,
    "mamba_num_heads": 8, "mamba_head_dim": 32, "n_groups": 2, "ssm_state_size": 64, "chunk_size": 64,
    "n_routed_experts": 16, "num_experts_per_tok": 4, "moe_intermediate_size": 256,
    "moe_shared_expert_intermediate_size": 256, "routed_scaling_factor": 2.5, "max_position_embeddings": 4096,
})


def mamba(P, p, cfg, h):
    """golden_nemotronh.mamba without its float64 check against the
    sequential recurrence (which would run the scan twice)."""
    MH, MP, G, DS, DI, CD = gn.dims(cfg)
    KW, chunk, eps = cfg["conv_kernel"], cfg["chunk_size"], cfg["layer_norm_epsilon"]
    L = h.shape[0]
    z, xbc, dt = (h @ P[p + "in_proj.weight"].T).split([DI, CD, MH], -1)
    xbc = F.silu(F.conv1d(xbc.T[None], P[p + "conv1d.weight"], P.get(p + "conv1d.bias"), padding=KW - 1, groups=CD)[0, :, :L].T)
    x, B, C = xbc.split([DI, G * DS, G * DS], -1)
    dt = F.softplus(dt + P[p + "dt_bias"])
    A = -torch.exp(P[p + "A_log"])
    B = B.reshape(L, G, DS).repeat_interleave(MH // G, dim=1)
    C = C.reshape(L, G, DS).repeat_interleave(MH // G, dim=1)
    y = gn.ssd(x.reshape(L, MH, MP), dt, A, B, C, P[p + "D"], chunk).reshape(L, DI)
    ug = (y * F.silu(z)).reshape(L, G, DI // G)
    ug = ug * torch.rsqrt(ug.pow(2).mean(-1, keepdim=True) + eps)
    return (P[p + "norm.weight"] * ug.reshape(L, DI)) @ P[p + "out_proj.weight"].T


def moe(P, p, cfg, h, route):
    """golden_nemotronh.moe (no latent projections) with transformers'
    loop over the experts (NemotronHMoE: each expert's tokens together)
    instead of the golden's loop over tokens."""
    E = cfg["n_routed_experts"]
    logits = h @ P[p + "gate.weight"].T
    scores = torch.sigmoid(logits)
    idx, _ = gn.choose(logits.detach(), P[p + "gate.e_score_correction_bias"].detach(), cfg)
    w = scores.gather(1, idx)
    if cfg["norm_topk_prob"]:
        w = w / (w.sum(-1, keepdim=True) + 1e-20)
    w = w * cfg["routed_scaling_factor"]
    out = torch.zeros_like(h)
    for e in range(E):
        tok, slot = (idx == e).nonzero(as_tuple=True)
        if len(tok) == 0:
            continue
        q = p + "experts.%d." % e
        y = gn.relu2(h[tok] @ P[q + "up_proj.weight"].T) @ P[q + "down_proj.weight"].T
        out = out.index_add(0, tok, w[tok, slot, None] * y)
    return out + gn.relu2(h @ P[p + "shared_experts.up_proj.weight"].T) @ P[p + "shared_experts.down_proj.weight"].T


gn.mamba, gn.moe = mamba, moe  # forward_seq calls them by their module names


def main():
    ap = argparse.ArgumentParser()
    ap.add_argument("--out", required=True)
    ap.add_argument("--rows", type=int, default=2)
    ap.add_argument("--seq", type=int, default=256)
    ap.add_argument("--steps", type=int, default=3)
    ap.add_argument("--threads", type=int, default=2)
    ap.add_argument("--seed", type=int, default=1)
    a = ap.parse_args()
    torch.set_num_threads(a.threads)
    g = torch.Generator().manual_seed(a.seed)
    W = {k: v.float() for k, v in gn.init_weights(CONFIG, g).items()}
    os.makedirs(a.out, exist_ok=True)
    gm.save(os.path.join(a.out, "model.safetensors"), W, {"format": "pt", "bench_script": "scripts/bench_nemotronh.py"})
    with open(os.path.join(a.out, "config.json"), "w") as f:
        json.dump(CONFIG, f, indent=2, sort_keys=True)
        f.write("\n")
    P = {k: v.clone().requires_grad_(True) for k, v in W.items()}
    opt = torch.optim.AdamW(P.values(), lr=1e-4, eps=1e-8, weight_decay=0.01)
    V = CONFIG["vocab_size"]
    times = []
    for step in range(a.steps + 1):
        toks = torch.randint(0, V, (a.rows, a.seq), generator=g)
        coef = torch.randn(a.rows, a.seq - 1, generator=g)
        t0 = time.perf_counter()
        opt.zero_grad()
        loss = 0
        for r in range(a.rows):
            logp = torch.log_softmax(gn.forward_seq(P, CONFIG, toks[r], {}), -1)
            lp = logp[:-1].gather(1, toks[r, 1:, None]).squeeze(1)
            loss = loss + (coef[r] * lp).sum()
        loss.backward()
        opt.step()
        if step > 0:
            times.append(1e3 * (time.perf_counter() - t0))
    ms = statistics.median(times)
    print(json.dumps({"impl": "torch", "torch": torch.__version__, "threads": a.threads, "rows": a.rows, "seq": a.seq,
                      "steps": a.steps, "ms_per_step": ms, "tokens_per_s": a.rows * a.seq / (ms / 1e3),
                      "params": sum(v.numel() for v in W.values()), "blas": bench_torch.blas_in_use()}))


if __name__ == "__main__":
    main()
