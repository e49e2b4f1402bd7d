#!/usr/bin/python3
"""Writes kernels/cpu/testdata/golden_ops.json: op-level goldens for the CPU
backend from PyTorch, written here from Hugging Face transformers' eager code
in float32 (the precision the Go backend runs in):

- rope: LlamaRotaryEmbedding / apply_rotary_pos_emb (inv_freq =
  1/theta^(arange(0, HD, 2).float()/HD), freqs = inv_freq @ position_ids in
  float32, rotate_half) at positions up to 32767, theta 1e4 and 1e6, HD 64 and
  128: float32 angle rounding at large positions is where RoPE ports drift;
- rmsnorm: Qwen3RMSNorm (x * rsqrt(mean(x^2) + eps) * weight) with autograd;
- attention: per packed sequence, repeat_kv + causal softmax(QK^T/sqrt(HD))V
  with autograd for dq, dk, dv, and logsumexp of the scaled scores;
- swiglu: silu(gate) * up with autograd;
- token_logprob: log_softmax(h W^T / temperature), gathered logprob, entropy,
  logsumexp, and autograd of sum(dlogprob * logprob) for dhidden, dweight,
  rows with target -1 masked;
- bias: a Linear's bias, x + b with autograd for dbias (300 rows: more than
  one of the Go backend's 256-row partial sums).

Run: /usr/bin/python3 scripts/golden_cpu_ops.py   (or `make golden`)
"""
import json
import os

import torch

SEED = 4242
OUT = os.path.join(os.path.dirname(os.path.abspath(__file__)), "..", "kernels", "cpu", "testdata", "golden_ops.json")


def flat(x):
    # 9 significant digits round-trip every float32 exactly.
    return [float("%.9g" % v) for v in x.detach().reshape(-1).tolist()]


def rope_case(g, T, H, HD, theta, positions):
    x = torch.randn(T, H, HD, generator=g)
    pos = torch.tensor(positions, dtype=torch.int64)
    inv_freq = 1.0 / (theta ** (torch.arange(0, HD, 2, dtype=torch.int64).float() / HD))
    inv_freq_expanded = inv_freq[None, :, None].float()
    position_ids_expanded = pos[None, None, :].float()
    freqs = (inv_freq_expanded @ position_ids_expanded).transpose(1, 2)[0]  # (T, HD/2)
    emb = torch.cat((freqs, freqs), dim=-1)
    cos, sin = emb.cos()[:, None, :], emb.sin()[:, None, :]

    def rotate_half(t):
        return torch.cat((-t[..., HD // 2:], t[..., : HD // 2]), dim=-1)

    out = (x * cos) + (rotate_half(x) * sin)
    return {"T": T, "H": H, "HD": HD, "theta": theta, "pos": positions, "x": flat(x), "out": flat(out)}


def rmsnorm_case(g, N, C, eps):
    x = torch.randn(N, C, generator=g).requires_grad_()
    w = (1 + 0.5 * torch.randn(C, generator=g)).requires_grad_()
    dout = torch.randn(N, C, generator=g)
    var = x.pow(2).mean(-1, keepdim=True)
    out = w * (x * torch.rsqrt(var + eps))
    out.backward(dout)
    return {"N": N, "C": C, "eps": eps, "x": flat(x), "w": flat(w), "dout": flat(dout), "out": flat(out),
            "rstd": flat(torch.rsqrt(var + eps)), "dinp": flat(x.grad), "dweight": flat(w.grad)}


def attention_case(g, lens, NH, NKV, HD):
    T = sum(lens)
    q = torch.randn(T, NH, HD, generator=g).requires_grad_()
    k = torch.randn(T, NKV, HD, generator=g).requires_grad_()
    v = torch.randn(T, NKV, HD, generator=g).requires_grad_()
    dout = torch.randn(T, NH, HD, generator=g)
    outs, lses = [], []
    s0 = 0
    for L in lens:
        qs = q[s0:s0 + L].transpose(0, 1)  # (NH, L, HD)
        ks = k[s0:s0 + L].transpose(0, 1).repeat_interleave(NH // NKV, dim=0)
        vs = v[s0:s0 + L].transpose(0, 1).repeat_interleave(NH // NKV, dim=0)
        scores = qs @ ks.transpose(-1, -2) / HD ** 0.5
        scores = scores + torch.full((L, L), float("-inf")).triu(1)
        lses.append(torch.logsumexp(scores, dim=-1).transpose(0, 1))  # (L, NH)
        outs.append((torch.softmax(scores, dim=-1) @ vs).transpose(0, 1))
        s0 += L
    out = torch.cat(outs)
    out.backward(dout)
    return {"lens": lens, "NH": NH, "NKV": NKV, "HD": HD, "q": flat(q), "k": flat(k), "v": flat(v),
            "dout": flat(dout), "out": flat(out), "lse": flat(torch.cat(lses)),
            "dq": flat(q.grad), "dk": flat(k.grad), "dv": flat(v.grad)}


def swiglu_case(g, N):
    gate = (4 * torch.randn(N, generator=g)).requires_grad_()
    up = torch.randn(N, generator=g).requires_grad_()
    dout = torch.randn(N, generator=g)
    out = torch.nn.functional.silu(gate) * up
    out.backward(dout)
    return {"N": N, "gate": flat(gate), "up": flat(up), "dout": flat(dout), "out": flat(out),
            "dgate": flat(gate.grad), "dup": flat(up.grad)}


def token_logprob_case(g, T, C, V, temperature):
    h = torch.randn(T, C, generator=g).requires_grad_()
    w = (0.3 * torch.randn(V, C, generator=g)).requires_grad_()
    targets = torch.randint(0, V, (T,), generator=g)
    targets[1::3] = -1
    dlp = torch.randn(T, generator=g)
    z = (h @ w.t()) / temperature
    logp = torch.log_softmax(z, dim=-1)
    mask = targets >= 0
    lp = torch.where(mask, logp.gather(1, targets.clamp(min=0)[:, None])[:, 0], torch.zeros(T))
    ent = torch.where(mask, -(logp.exp() * logp).sum(-1), torch.zeros(T))
    lse = torch.where(mask, torch.logsumexp(z, dim=-1), torch.zeros(T))
    (dlp * lp).sum().backward()
    return {"T": T, "C": C, "V": V, "temperature": temperature, "targets": targets.tolist(),
            "hidden": flat(h), "weight": flat(w), "dlogprob": flat(dlp), "logprob": flat(lp),
            "entropy": flat(ent), "lse": flat(lse), "dhidden": flat(h.grad), "dweight": flat(w.grad)}


def blas_in_use():
    """The BLAS shared libraries mapped into this process, resolved to their
    files. Debian's torch calls whatever libblas.so.3 the alternatives system
    selects (reference BLAS or OpenBLAS), and matmul-based cases change in
    their last bits with it: recorded so that a `make golden` diff can be
    told apart from a regression."""
    libs = set()
    with open("/proc/self/maps") as f:
        for line in f:
            parts = line.split()
            path = parts[-1] if len(parts) >= 6 else ""
            if "blas" in os.path.basename(path) or "lapack" in os.path.basename(path):
                libs.add(os.path.realpath(path))
    return ",".join(sorted(libs)) or "none mapped"


def bias_case(g, T, OC):
    # A Linear's bias (Qwen2's q/k/v projections): out = x + b, dbias = sum_t dout.
    x = torch.randn(T, OC, generator=g)
    b = torch.randn(OC, generator=g).requires_grad_()
    dout = torch.randn(T, OC, generator=g)
    out = x + b
    out.backward(dout)
    return {"T": T, "OC": OC, "x": flat(x), "bias": flat(b), "dout": flat(dout), "out": flat(out),
            "dbias": flat(b.grad)}


def main():
    torch.manual_seed(SEED)
    g = torch.Generator().manual_seed(SEED)
    big = [0, 1, 17, 1000, 4097, 8191, 20000, 32767]
    golden = {
        "metadata": {"script": "scripts/golden_cpu_ops.py", "seed": SEED, "torch": torch.__version__,
                     "note": "float32 PyTorch following Hugging Face transformers' eager code"},
        "rope": [rope_case(g, 8, 2, 64, 1e6, big), rope_case(g, 8, 1, 128, 1e4, big),
                 rope_case(g, 3, 3, 16, 5e5, [2, 3, 300])],
        "rmsnorm": [rmsnorm_case(g, 5, 24, 1e-6), rmsnorm_case(g, 3, 64, 1e-5)],
        "attention": [attention_case(g, [5, 1, 12], 4, 2, 16), attention_case(g, [9, 3], 4, 1, 8),
                      attention_case(g, [50], 2, 2, 8)],
        "swiglu": [swiglu_case(g, 50)],
        "token_logprob": [token_logprob_case(g, 7, 16, 300, 0.7), token_logprob_case(g, 4, 8, 600, 1.0)],
        "bias": [bias_case(g, 5, 24), bias_case(g, 300, 40)],
    }
    # After every case ran: the BLAS that computed them is mapped by now.
    golden["metadata"]["blas"] = blas_in_use()
    os.makedirs(os.path.dirname(OUT), exist_ok=True)
    with open(OUT, "w") as f:
        json.dump(golden, f, separators=(",", ":"))
        f.write("\n")
    print("wrote", OUT, os.path.getsize(OUT), "bytes")


if __name__ == "__main__":
    main()
