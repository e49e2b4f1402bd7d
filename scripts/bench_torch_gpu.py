#!/usr/bin/env python3
"""bench_torch_gpu.py: one GRPO-shaped training step of a Qwen3 model in plain
PyTorch, the reference tracegrpo's `train bench --backend cuda --precision
bfloat16` is compared with on the same GPU (scripts/gpu-check.sh runs both).

Independent of tracegrpo's code: the model is written here from the Qwen3
architecture (config.json fields): token embedding, per layer RMSNorm,
q/k/v/o projections with per-head q/k RMSNorm and rotary embeddings
(rotate-half, theta from the config), causal grouped-query attention by
torch.nn.functional.scaled_dot_product_attention, RMSNorm, SwiGLU MLP, a
final RMSNorm and the (tied or untied) LM head. The step is what the bench
times: forward of rows × seq tokens (each row one sequence), the log
probability of every next token, backward of Σ dl·logprob with random dl,
fused AdamW on fp32 master weights. Mixed precision is torch.autocast(bf16):
GEMMs and attention in bf16 with fp32 accumulation, weights and optimizer
state fp32, as tracegrpo's mixed precision. Weights are random (N(0, 0.02²),
norms 1).

It prints one JSON line: ms_per_step (median of --steps after one warm-up),
tokens_per_s, params, peak_mem_mib (torch.cuda.max_memory_allocated), the
torch version and device. Needs torch >= 2.0 on CUDA; on the CPU (--device
cpu, a tiny --config) it runs the same code in fp32 to check the script.

  python3 scripts/bench_torch_gpu.py --config model/testdata/published/qwen3-1.7b.config.json \
      --rows 4 --seq 4096 --steps 3
"""
import argparse
import json
import math
import statistics
import sys
import time

import torch
import torch.nn.functional as F


class RMSNorm(torch.nn.Module):
    def __init__(self, n, eps):
        super().__init__()
        self.weight = torch.nn.Parameter(torch.ones(n))
        self.eps = eps

    def forward(self, x):
        xf = x.float()
        xf = xf * torch.rsqrt(xf.pow(2).mean(-1, keepdim=True) + self.eps)
        return (xf * self.weight).to(x.dtype)


def rope_tables(seq, hd, theta, device):
    inv = 1.0 / (theta ** (torch.arange(0, hd, 2, dtype=torch.float64, device=device) / hd))
    ang = torch.arange(seq, dtype=torch.float64, device=device)[:, None] * inv[None, :]
    ang = torch.cat([ang, ang], dim=-1)
    return ang.cos().float(), ang.sin().float()


def rotate(x, cos, sin):  # x (B, H, T, HD)
    h = x.shape[-1] // 2
    x1, x2 = x[..., :h], x[..., h:]
    rot = torch.cat([-x2, x1], dim=-1)
    return (x.float() * cos + rot.float() * sin).to(x.dtype)


def attention(q, k, v, nrep):
    if hasattr(F, "scaled_dot_product_attention"):
        if nrep > 1:
            try:
                return F.scaled_dot_product_attention(q, k, v, is_causal=True, enable_gqa=True)
            except TypeError:  # torch < 2.5: no enable_gqa
                k, v = k.repeat_interleave(nrep, dim=1), v.repeat_interleave(nrep, dim=1)
        return F.scaled_dot_product_attention(q, k, v, is_causal=True)
    # torch < 2.0 (the CPU check only)
    k, v = k.repeat_interleave(nrep, dim=1), v.repeat_interleave(nrep, dim=1)
    T = q.shape[-2]
    s = (q @ k.transpose(-1, -2)) / math.sqrt(q.shape[-1])
    s = s.masked_fill(torch.ones(T, T, dtype=torch.bool, device=q.device).triu(1), float("-inf"))
    return s.softmax(-1) @ v


class Layer(torch.nn.Module):
    def __init__(self, c):
        super().__init__()
        C, H, KV, HD, I = c["hidden_size"], c["num_attention_heads"], c["num_key_value_heads"], c["head_dim"], c["intermediate_size"]
        eps = c["rms_norm_eps"]
        self.H, self.KV, self.HD = H, KV, HD
        self.ln1, self.ln2 = RMSNorm(C, eps), RMSNorm(C, eps)
        self.q = torch.nn.Linear(C, H * HD, bias=False)
        self.k = torch.nn.Linear(C, KV * HD, bias=False)
        self.v = torch.nn.Linear(C, KV * HD, bias=False)
        self.o = torch.nn.Linear(H * HD, C, bias=False)
        self.qn, self.kn = RMSNorm(HD, eps), RMSNorm(HD, eps)
        self.gate = torch.nn.Linear(C, I, bias=False)
        self.up = torch.nn.Linear(C, I, bias=False)
        self.down = torch.nn.Linear(I, C, bias=False)

    def forward(self, x, cos, sin):
        B, T, _ = x.shape
        h = self.ln1(x)
        q = self.qn(self.q(h).view(B, T, self.H, self.HD)).transpose(1, 2)
        k = self.kn(self.k(h).view(B, T, self.KV, self.HD)).transpose(1, 2)
        v = self.v(h).view(B, T, self.KV, self.HD).transpose(1, 2)
        q, k = rotate(q, cos, sin), rotate(k, cos, sin)
        a = attention(q, k, v, self.H // self.KV).transpose(1, 2).reshape(B, T, self.H * self.HD)
        x = x + self.o(a)
        h = self.ln2(x)
        return x + self.down(F.silu(self.gate(h)) * self.up(h))


class Qwen3(torch.nn.Module):
    def __init__(self, c):
        super().__init__()
        self.embed = torch.nn.Embedding(c["vocab_size"], c["hidden_size"])
        self.layers = torch.nn.ModuleList(Layer(c) for _ in range(c["num_hidden_layers"]))
        self.norm = RMSNorm(c["hidden_size"], c["rms_norm_eps"])
        self.tied = c.get("tie_word_embeddings", False)
        if not self.tied:
            self.head = torch.nn.Linear(c["hidden_size"], c["vocab_size"], bias=False)
        self.theta, self.hd = c.get("rope_theta", 10000.0), c["head_dim"]

    def forward(self, tokens):
        cos, sin = rope_tables(tokens.shape[1], self.hd, self.theta, tokens.device)
        x = self.embed(tokens)
        for layer in self.layers:
            x = layer(x, cos, sin)
        x = self.norm(x)
        w = self.embed.weight if self.tied else self.head.weight
        return F.linear(x, w)


def main():
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--config", required=True, help="HF config.json (Qwen3)")
    ap.add_argument("--rows", type=int, default=4)
    ap.add_argument("--seq", type=int, default=4096)
    ap.add_argument("--steps", type=int, default=3)
    ap.add_argument("--device", default="cuda")
    ap.add_argument("--seed", type=int, default=1)
    a = ap.parse_args()
    with open(a.config) as f:
        c = json.load(f)
    c.setdefault("head_dim", c["hidden_size"] // c["num_attention_heads"])
    dev = torch.device(a.device)
    cuda = dev.type == "cuda"
    torch.manual_seed(a.seed)
    if cuda:
        torch.backends.cuda.matmul.allow_tf32 = False  # fp32 stays fp32; bf16 comes from autocast
    model = Qwen3(c)
    with torch.no_grad():
        for name, p in model.named_parameters():
            if p.dim() >= 2:
                p.normal_(0, 0.02)
    model.to(dev)
    params = sum(p.numel() for p in model.parameters())
    try:
        opt = torch.optim.AdamW(model.parameters(), lr=1e-6, betas=(0.9, 0.999), eps=1e-8, weight_decay=0.01, fused=cuda)
    except TypeError:  # torch without fused AdamW (the CPU check)
        opt = torch.optim.AdamW(model.parameters(), lr=1e-6, betas=(0.9, 0.999), eps=1e-8, weight_decay=0.01)
    g = torch.Generator(device="cpu").manual_seed(a.seed + 1)
    tokens = torch.randint(0, c["vocab_size"], (a.rows, a.seq), generator=g).to(dev)
    dl = (torch.randn(a.rows, a.seq - 1, generator=g) / (a.rows * a.seq)).to(dev)

    def step():
        opt.zero_grad(set_to_none=True)
        with torch.autocast(device_type=dev.type, dtype=torch.bfloat16, enabled=cuda):
            logits = model(tokens)
        logp = torch.log_softmax(logits[:, :-1].float(), dim=-1)
        lp = logp.gather(-1, tokens[:, 1:, None]).squeeze(-1)
        (lp * dl).sum().backward()
        opt.step()

    def sync():
        if cuda:
            torch.cuda.synchronize()

    step()
    sync()
    if cuda:
        torch.cuda.reset_peak_memory_stats()
    ms = []
    for _ in range(a.steps):
        t0 = time.perf_counter()
        step()
        sync()
        ms.append(1e3 * (time.perf_counter() - t0))
    med = statistics.median(ms)
    out = {
        "impl": "pytorch", "torch": torch.__version__, "device": torch.cuda.get_device_name(dev) if cuda else "cpu",
        "config": a.config, "params": params, "rows": a.rows, "seq": a.seq, "steps": a.steps,
        "precision": "bf16 autocast" if cuda else "float32", "attention": "sdpa" if hasattr(F, "scaled_dot_product_attention") else "math",
        "ms_per_step": med, "ms_min": min(ms), "tokens_per_s": a.rows * a.seq / (med / 1e3),
        "peak_mem_mib": torch.cuda.max_memory_allocated(dev) / 2**20 if cuda else 0,
    }
    print(json.dumps(out))


if __name__ == "__main__":
    sys.exit(main())
