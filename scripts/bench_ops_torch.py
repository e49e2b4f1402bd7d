#!/usr/bin/env python3
"""Times the kernels/cpu benchmark shapes in PyTorch on 2 threads and, in the
same run, the Go benchmarks (go test -bench in kernels/cpu), then prints one
JSON line per op with both medians and the ratio go/torch.

Shapes are those of the issue's Qwen3-shaped model: hidden 512, 8 heads, 4 KV
heads, head_dim 64, intermediate 1536, vocab 8192, 8 sequences x 256 tokens.

Usage: /usr/bin/python3 scripts/bench_ops_torch.py [--count N] [--reps N] [--no-go]
The torch reference is Debian's python3-torch (torch 1.13 API). Its dense
matmuls go to whatever libblas.so.3 the system's alternatives select (reported
as "blas"; on these machines the netlib reference BLAS, ~1 GFLOP/s), so the
script also times every gemm-shaped op through oneDNN (torch's bundled
MKL-DNN, mkldnn_linear: the fast CPU gemm torch ships) and reports a second
ratio against that ("torch_onednn_ms"). The oneDNN attention and token-logprob
variants write the same math (forward, and a hand-written backward) with each
product as an mkldnn_linear; their operand conversions are timed too.
"""
import argparse
import json
import os
import re
import statistics
import subprocess
import sys
import time

import torch
import torch.nn.functional as F

THREADS = 2
T, C, I, V = 2048, 512, 1536, 8192
S, L, NH, NKV, HD = 8, 256, 8, 4, 64


def median_ms(fn, reps):
    fn()
    ts = []
    for _ in range(reps):
        t0 = time.perf_counter()
        fn()
        ts.append((time.perf_counter() - t0) * 1e3)
    return statistics.median(ts)


def torch_benches(reps):
    torch.set_num_threads(THREADS)
    g = torch.Generator().manual_seed(0)
    out = {}

    def rnd(*shape, scale=1.0, grad=False):
        x = (torch.rand(*shape, generator=g) * 2 - 1) * scale
        return x.requires_grad_(grad)

    for (t, c, oc) in [(T, C, I), (T, I, C), (T, C, C), (T, C, 256)]:
        x, w, d = rnd(t, c), rnd(oc, c, scale=0.05), rnd(t, oc)
        name = f"T{t}_C{c}_OC{oc}"
        with torch.no_grad():
            out[f"Matmul/fwd/{name}"] = median_ms(lambda: F.linear(x, w), reps)
            out[f"Matmul/bwd_dinp/{name}"] = median_ms(lambda: d.mm(w), reps)
            out[f"Matmul/bwd_dweight/{name}"] = median_ms(lambda: d.t().mm(x), reps)

    # Attention as Hugging Face's eager path does it: repeat_kv, scores,
    # causal mask, softmax, weighted sum; 8 equal sequences form the batch.
    q = rnd(S, NH, L, HD, grad=True)
    k = rnd(S, NKV, L, HD, grad=True)
    v = rnd(S, NKV, L, HD, grad=True)
    mask = torch.full((L, L), float("-inf")).triu(1)

    def attn():
        kk = k.repeat_interleave(NH // NKV, dim=1)
        vv = v.repeat_interleave(NH // NKV, dim=1)
        s = q @ kk.transpose(-1, -2) / HD ** 0.5 + mask
        return torch.softmax(s, dim=-1) @ vv

    dout = rnd(S, NH, L, HD)
    with torch.no_grad():
        out["Attention/fwd/S8_L256_NH8_NKV4_HD64"] = median_ms(attn, reps)
    out["Attention/fwdbwd/S8_L256_NH8_NKV4_HD64"] = median_ms(lambda: attn().backward(dout), reps)

    h, w = rnd(T, C, grad=True), rnd(V, C, scale=0.05, grad=True)
    tg = torch.randint(0, V, (T,), generator=g)
    dlp = rnd(T)

    def tlp():
        z = F.linear(h, w) / 1.0
        lp = torch.log_softmax(z, dim=-1)
        ent = -(lp.exp() * lp).sum(-1)
        return lp.gather(1, tg[:, None])[:, 0], ent

    with torch.no_grad():
        out["TokenLogprob/fwd/T2048_C512_V8192"] = median_ms(tlp, reps)
    out["TokenLogprob/fwdbwd/T2048_C512_V8192"] = median_ms(lambda: tlp()[0].backward(dlp), reps)

    gt, up = rnd(T * I, scale=4, grad=True), rnd(T * I, grad=True)
    dsw = rnd(T * I)
    with torch.no_grad():
        out["Elementwise/swiglu_fwd/N3145728"] = median_ms(lambda: F.silu(gt) * up, reps)
    out["Elementwise/swiglu_fwdbwd/N3145728"] = median_ms(lambda: (F.silu(gt) * up).backward(dsw), reps)

    x, wn = rnd(T, C, grad=True), rnd(C, grad=True)
    dn = rnd(T, C)

    def rms():
        return wn * (x * torch.rsqrt(x.pow(2).mean(-1, keepdim=True) + 1e-6))

    with torch.no_grad():
        out["Elementwise/rmsnorm_fwd/N2048_C512"] = median_ms(rms, reps)
    out["Elementwise/rmsnorm_fwdbwd/N2048_C512"] = median_ms(lambda: rms().backward(dn), reps)
    return out


def nt(a, b):
    """a @ b.T through oneDNN (both dense, converted on the fly)."""
    return torch._C._nn.mkldnn_linear(a.contiguous().to_mkldnn(), b.contiguous().to_mkldnn(), None).to_dense()


def onednn_benches(reps):
    torch.set_num_threads(THREADS)
    g = torch.Generator().manual_seed(0)
    out = {}

    def rnd(*shape, scale=1.0):
        return (torch.rand(*shape, generator=g) * 2 - 1) * scale

    lin = torch._C._nn.mkldnn_linear
    for (t, c, oc) in [(T, C, I), (T, I, C), (T, C, C), (T, C, 256)]:
        x, w, d = rnd(t, c), rnd(oc, c, scale=0.05), rnd(t, oc)
        name = f"T{t}_C{c}_OC{oc}"
        xm, wm, dm = x.to_mkldnn(), w.to_mkldnn(), d.to_mkldnn()
        wtm = w.t().contiguous().to_mkldnn()          # (C, OC): dinp = d @ w
        with torch.no_grad():
            out[f"Matmul/fwd/{name}"] = median_ms(lambda: lin(xm, wm, None), reps)
            out[f"Matmul/bwd_dinp/{name}"] = median_ms(lambda: lin(dm, wtm, None), reps)
            # dweight = d.T @ x: both operands transposed to (OC,T), (C,T) per call.
            out[f"Matmul/bwd_dweight/{name}"] = median_ms(lambda: nt(d.t(), x.t()), reps)

    scale = HD ** -0.5
    q, k, v = rnd(S, NH, L, HD), rnd(S, NKV, L, HD), rnd(S, NKV, L, HD)
    dout = rnd(S, NH, L, HD)
    mask = torch.full((L, L), float("-inf")).triu(1)
    grp = NH // NKV

    def attn_fwd():
        res = []
        for s in range(S):
            for h in range(NH):
                p = torch.softmax(nt(q[s, h], k[s, h // grp]) * scale + mask, dim=-1)
                res.append((p, nt(p, v[s, h // grp].t())))
        return res

    def attn_fwdbwd():
        dk, dv = torch.zeros_like(k), torch.zeros_like(v)
        dq = torch.empty_like(q)
        for s in range(S):
            for h in range(NH):
                kk, vv = k[s, h // grp], v[s, h // grp]
                p = torch.softmax(nt(q[s, h], kk) * scale + mask, dim=-1)
                o = nt(p, vv.t())
                do = dout[s, h]
                dv[s, h // grp] += nt(p.t(), do.t())
                dp = nt(do, vv)
                ds = p * (dp - (do * o).sum(-1, keepdim=True)) * scale
                dq[s, h] = nt(ds, kk.t())
                dk[s, h // grp] += nt(ds.t(), q[s, h].t())
        return dq, dk, dv

    with torch.no_grad():
        out["Attention/fwd/S8_L256_NH8_NKV4_HD64"] = median_ms(attn_fwd, reps)
        out["Attention/fwdbwd/S8_L256_NH8_NKV4_HD64"] = median_ms(attn_fwdbwd, reps)

    h, w = rnd(T, C), rnd(V, C, scale=0.05)
    tg = torch.randint(0, V, (T,), generator=g)
    dlp = rnd(T)
    wm = w.to_mkldnn()

    def tlp_fwd():
        z = lin(h.to_mkldnn(), wm, None).to_dense()
        lp = torch.log_softmax(z, dim=-1)
        ent = -(lp.exp() * lp).sum(-1)
        return lp.gather(1, tg[:, None])[:, 0], ent, lp

    def tlp_fwdbwd():
        _, _, lp = tlp_fwd()
        dz = -lp.exp() * dlp[:, None]
        dz[torch.arange(T), tg] += dlp
        return nt(dz, w.t()), nt(dz.t(), h.t())

    with torch.no_grad():
        out["TokenLogprob/fwd/T2048_C512_V8192"] = median_ms(tlp_fwd, reps)
        out["TokenLogprob/fwdbwd/T2048_C512_V8192"] = median_ms(tlp_fwdbwd, reps)
    return out


def go_benches(count):
    here = os.path.dirname(os.path.abspath(__file__))
    cmd = ["go", "test", "-run", "^$", "-bench", "Matmul|Attention|TokenLogprob|Elementwise",
           "-count", str(count), "./kernels/cpu"]
    res = subprocess.run(cmd, cwd=os.path.dirname(here), capture_output=True, text=True, check=True)
    runs = {}
    for line in res.stdout.splitlines():
        m = re.match(r"Benchmark(\S+?)-\d+\s+\d+\s+([\d.]+) ns/op", line)
        if m:
            runs.setdefault(m.group(1), []).append(float(m.group(2)) / 1e6)
    med = {k: statistics.median(v) for k, v in runs.items()}
    # fwd+bwd sums, to compare with torch's autograd fwd+bwd timings.
    for op in ["Attention/%s/S8_L256_NH8_NKV4_HD64", "TokenLogprob/%s/T2048_C512_V8192",
               "Elementwise/swiglu_%s/N3145728", "Elementwise/rmsnorm_%s/N2048_C512"]:
        f, b = op % "fwd", op % "bwd"
        if f in med and b in med:
            med[op % "fwdbwd"] = med[f] + med[b]
    return med


def main():
    ap = argparse.ArgumentParser()
    ap.add_argument("--count", type=int, default=5, help="go test -count")
    ap.add_argument("--reps", type=int, default=3, help="torch repetitions per op")
    ap.add_argument("--no-go", action="store_true")
    ap.add_argument("--bracket", action="store_true", help="time torch again after Go and take the median of both")
    a = ap.parse_args()
    blas = os.path.realpath("/usr/lib/x86_64-linux-gnu/libblas.so.3")
    tm = torch_benches(a.reps)
    om = onednn_benches(a.reps)
    gm = {} if a.no_go else go_benches(a.count)
    tm2 = torch_benches(a.reps) if a.bracket else tm  # again after Go, to bracket machine noise
    for k in tm:
        tmed = statistics.median([tm[k], tm2[k]])
        row = {"op": k, "torch_ms": round(tmed, 3), "torch": torch.__version__, "threads": THREADS, "blas": blas}
        if k in om:
            row["torch_onednn_ms"] = round(om[k], 3)
        if k in gm:
            row["go_ms"] = round(gm[k], 3)
            row["ratio_go_over_torch"] = round(gm[k] / tmed, 3)
            if k in om:
                row["ratio_go_over_torch_onednn"] = round(gm[k] / om[k], 3)
        print(json.dumps(row))
    sys.stdout.flush()


if __name__ == "__main__":
    main()
