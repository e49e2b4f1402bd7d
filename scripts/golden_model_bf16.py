#!/usr/bin/python3
"""Writes model/testdata/<variant>/golden_bf16.safetensors: the mixed-precision
(bf16) training step, written independently in PyTorch.

The policy (model.Options.Precision = BF16) is taken from its documentation,
not from the Go code: every op computes in float32 from its inputs (bf16
inputs widened exactly), and a value is rounded to bfloat16 (nearest, ties
to even) only where the policy stores it in bf16:

  forward (per layer, x float32)
    ln1  = bf16(rmsnorm(x)·w1)
    qkv  = ln1·bf16(Wqkv)ᵀ + bias           (float32; Qwen2's bias)
    q, k = Qwen3's per-head rmsnorm, then RoPE (float32)
    q, k, v rounded to bf16
    att  = bf16(causal GQA attention(q, k, v)), lse float32
    xmid = att·bf16(Wo)ᵀ + x
    ln2  = bf16(rmsnorm(xmid)·w2)
    gate, up = bf16(ln2·bf16(Wgu)ᵀ)         (each element rounded)
    h    = bf16(silu(gate)·up)
    x'   = h·bf16(Wdown)ᵀ + xmid
  head: lnf = bf16(rmsnorm(xf)·wf), logits = lnf·bf16(head)ᵀ / temperature,
        logprob and entropy in float32.
  backward: every gradient float32, except that the gradient a GEMM's
    backward reads as dout is rounded to bf16 first (dx before the down and
    o GEMMs, (dgate, dup) before the gate|up GEMM, (dq, dk, dv) after RoPE,
    q/k-norm and bias backward before the q|k|v GEMM), so
    dinp = bf16(dout)·bf16(W) and dW += bf16(dout)ᵀ·inp_bf16. Attention's
    backward is FlashAttention's: it reads bf16(datt), the bf16 output and
    the saved lse, with D = rowsum(bf16(datt)·att_bf16) in place of the
    exact rowsum, so it is written out below (FlashAttn) rather than left to
    autograd. The LM head's dz is float32; the embedding, norm weights and
    biases get float32 gradients.

Two autograd building blocks express the policy: R(x) rounds in the forward
pass and passes the gradient through; G(x) is the identity in the forward
pass and rounds the gradient in the backward pass. So gate|up is
R(G(ln2 @ bf16(Wgu).T)).

Besides logprob, entropy, the loss and grad.NAME for every parameter, the
golden holds every bf16 value the step rounds, as BF16 (T rows of the packed
batch each): act.L<l>.{ln1,q,k,v,att,ln2,gate,up,h} and act.lnf (forward),
dout.L<l>.{down,gu,o,att,qkv} (the rounded gradient each GEMM's or
attention's backward reads; gu is dgate|dup, qkv is dq|dk|dv). Two float32
implementations of the policy that sum in different orders can round a value
lying on a bf16 rounding boundary to its two neighbours; such a flip moves
everything downstream of it, and the Go test uses these tensors to tell
flips from errors.

Inputs are those of the fp32 goldens that scripts/golden_model.py writes (run
it first): each variant's model.safetensors, config.json and the batch
(tokens, cu_seqlens, temperature, coef) of its golden.safetensors, which are
copied in.

Self-checks before anything is written: bf16 rounding agrees with torch's;
FlashAttn's backward equals autograd's softmax attention with rounding
turned off; and the whole model with rounding turned off, in float64,
reproduces the fp32 golden. The script also runs the policy in float64 and
prints how far that moves the results (the effect of rounding flips).

Run: /usr/bin/python3 scripts/golden_model_bf16.py   (or `make golden`)
"""
import json
import os
import struct
import sys

import numpy as np
import torch

sys.dont_write_bytecode = True  # no __pycache__ in scripts/
sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
import golden_model as gm  # noqa: E402  (inv_freq_of, rotate_half, rms_norm, save, OUT)

VARIANTS = ["qwen3_untied", "llama_tied", "qwen2_untied"]
SCRIPT = "scripts/golden_model_bf16.py"
COMMAND = "/usr/bin/python3 " + SCRIPT


# ---------------------------------------------------------------- rounding

class State:
    round = True  # False turns every rounding into the identity (self-checks)
    rec = None    # {tag: {sequence: rows}}: the rounded values, when recording
    seq = 0       # the sequence being run


BF16_MIN_NORMAL = 2.0 ** -126
BF16_MAX = (2.0 - 2.0 ** -7) * 2.0 ** 127


def bf16(x):
    """x rounded to the nearest bfloat16 value, ties to even, in x's dtype.
    x = m·2^e with 0.5 ≤ |m| < 1; bf16 keeps 8 significant bits, so m·256 is
    rounded to an integer (torch.round rounds half to even)."""
    if not State.round:
        return x
    m, e = torch.frexp(x)
    r = torch.ldexp(torch.round(m * 256.0), e - 8).to(x.dtype)
    a = x.abs()
    if bool(((a > 0) & (a < BF16_MIN_NORMAL)).any()) or bool((r.abs() > BF16_MAX).any()) or not bool(torch.isfinite(x).all()):
        raise ValueError("bf16: value outside bfloat16's normal range (subnormal, overflow or not finite)")
    return r


def record(tag, x):
    if State.rec is not None and tag is not None:
        State.rec.setdefault(tag, {})[State.seq] = x.detach().reshape(x.shape[0], -1).clone()


class _R(torch.autograd.Function):
    """Forward rounds to bf16; backward passes the gradient through."""

    @staticmethod
    def forward(ctx, x, tag):
        y = bf16(x)
        record(tag, y)
        return y

    @staticmethod
    def backward(ctx, g):
        return g, None


class _G(torch.autograd.Function):
    """Forward is the identity; backward rounds the gradient to bf16."""

    @staticmethod
    def forward(ctx, x, tag):
        ctx.tag, ctx.seq = tag, State.seq
        return x.clone()

    @staticmethod
    def backward(ctx, g):
        r = bf16(g)
        State.seq = ctx.seq
        record(ctx.tag, r)
        return r, None


def R(x, tag=None):
    return _R.apply(x, tag)


def G(x, tag=None):
    return _G.apply(x, tag)


# --------------------------------------------------------------- attention

class FlashAttn(torch.autograd.Function):
    """Causal grouped-query attention of one sequence, FlashAttention style.

    q (T,NH,HD), k, v (T,NKV,HD) hold bf16 values; query head h reads
    key/value head h // (NH/NKV). S = q·kᵀ/sqrt(HD), lse = logsumexp(S),
    out = bf16(softmax(S)·v). Backward, from dout rounded to bf16:
    P = exp(S − lse), D = rowsum(dout·out) with the bf16 out,
    dS = P·(dout·vᵀ − D), dq = dS·k/sqrt(HD), dk = dSᵀ·q/sqrt(HD),
    dv = Pᵀ·dout (dk, dv summed over each group's query heads)."""

    @staticmethod
    def forward(ctx, q, k, v, tag):
        P, lse = FlashAttn.probs(q, k)
        rep = q.shape[1] // k.shape[1]
        out = bf16(torch.einsum("hts,shd->thd", P, v.repeat_interleave(rep, dim=1)))
        ctx.save_for_backward(q, k, v, out, lse)
        ctx.tag, ctx.seq = tag, State.seq
        return out

    @staticmethod
    def probs(q, k, lse=None):
        T, NH, HD = q.shape
        rep = NH // k.shape[1]
        S = torch.einsum("thd,shd->hts", q, k.repeat_interleave(rep, dim=1)) / HD ** 0.5
        mask = torch.ones(T, T, dtype=torch.bool).tril()
        S = S.masked_fill(~mask, float("-inf"))
        if lse is None:
            lse = torch.logsumexp(S, dim=-1)  # (NH, T)
        return torch.exp(S - lse[..., None]), lse

    @staticmethod
    def backward(ctx, dout):
        q, k, v, out, lse = ctx.saved_tensors
        T, NH, HD = q.shape
        NKV = k.shape[1]
        rep = NH // NKV
        do = bf16(dout)
        State.seq = ctx.seq
        record(ctx.tag, do)
        P, _ = FlashAttn.probs(q, k, lse)
        kk, vv = k.repeat_interleave(rep, dim=1), v.repeat_interleave(rep, dim=1)
        D = (do * out).sum(-1).T  # (NH, T)
        dS = P * (torch.einsum("thd,shd->hts", do, vv) - D[..., None])
        dq = torch.einsum("hts,shd->thd", dS, kk) / HD ** 0.5
        dkk = torch.einsum("hts,thd->shd", dS, q) / HD ** 0.5
        dvv = torch.einsum("hts,thd->shd", P, do)
        return dq, dkk.reshape(T, NKV, rep, HD).sum(2), dvv.reshape(T, NKV, rep, HD).sum(2), None


# ------------------------------------------------------------------- model

def rope(x, pos, theta, hd, scaling):
    """transformers' rotate-half RoPE: angles and their cos/sin in float32,
    applied in x's dtype."""
    freqs = pos.float()[:, None] * gm.inv_freq_of(theta, hd, scaling)[None, :]
    emb = torch.cat((freqs, freqs), dim=-1)
    cos, sin = emb.cos().to(x.dtype)[:, None, :], emb.sin().to(x.dtype)[:, None, :]
    return x * cos + gm.rotate_half(x) * sin


def forward_seq(P, W, cfg, toks):
    """The bf16 final normed hidden states (T, C) of one sequence; P holds
    the parameters, W the bf16 GEMM weights."""
    C, NH, NKV = cfg["hidden_size"], cfg["num_attention_heads"], cfg["num_key_value_heads"]
    HD = cfg.get("head_dim") or C // NH
    eps, theta = cfg["rms_norm_eps"], cfg["rope_theta"]
    scaling = cfg.get("rope_scaling")
    T = toks.shape[0]
    pos = torch.arange(T)
    qn, kn = NH * HD, NKV * HD
    x = P["model.embed_tokens.weight"][toks]
    for l in range(cfg["num_hidden_layers"]):
        p, a, d = "model.layers.%d." % l, "act.L%d." % l, "dout.L%d." % l
        ln1 = R(gm.rms_norm(x, P[p + "input_layernorm.weight"], eps), a + "ln1")
        qkv = G(ln1 @ W[p + "qkv"].T, d + "qkv")
        if cfg["model_type"] == "qwen2":
            qkv = qkv + torch.cat([P[p + "self_attn.%s_proj.bias" % n] for n in "qkv"])
        q = qkv[:, :qn].reshape(T, NH, HD)
        k = qkv[:, qn:qn + kn].reshape(T, NKV, HD)
        v = qkv[:, qn + kn:].reshape(T, NKV, HD)
        if cfg["model_type"] == "qwen3":
            q = gm.rms_norm(q, P[p + "self_attn.q_norm.weight"], eps)
            k = gm.rms_norm(k, P[p + "self_attn.k_norm.weight"], eps)
        q, k = rope(q, pos, theta, HD, scaling), rope(k, pos, theta, HD, scaling)
        att = FlashAttn.apply(R(q, a + "q"), R(k, a + "k"), R(v, a + "v"), d + "att").reshape(T, qn)
        record(a + "att", att)
        xmid = x + G(att @ W[p + "o"].T, d + "o")
        ln2 = R(gm.rms_norm(xmid, P[p + "post_attention_layernorm.weight"], eps), a + "ln2")
        gu = R(G(ln2 @ W[p + "gu"].T, d + "gu"), a + "gu")
        I = gu.shape[1] // 2
        h = R(torch.nn.functional.silu(gu[:, :I]) * gu[:, I:], a + "h")
        x = xmid + G(h @ W[p + "down"].T, d + "down")
    return R(gm.rms_norm(x, P["model.norm.weight"], eps), "act.lnf")


def gemm_weights(P, cfg):
    """The GEMM weights rounded to bf16 (R: their gradients reach P), fused
    as the policy fuses them: q|k|v and gate|up."""
    W = {}
    for l in range(cfg["num_hidden_layers"]):
        p = "model.layers.%d." % l
        W[p + "qkv"] = R(torch.cat([P[p + "self_attn.%s_proj.weight" % n] for n in "qkv"]))
        W[p + "o"] = R(P[p + "self_attn.o_proj.weight"])
        W[p + "gu"] = R(torch.cat([P[p + "mlp.gate_proj.weight"], P[p + "mlp.up_proj.weight"]]))
        W[p + "down"] = R(P[p + "mlp.down_proj.weight"])
    W["head"] = R(P["model.embed_tokens.weight"] if cfg["tie_word_embeddings"] else P["lm_head.weight"])
    return W


def forward(P, cfg, tokens, cu, temperature):
    """Per-token logprobs and entropies (0 at each sequence's first token)."""
    W = gemm_weights(P, cfg)
    lps, ents = [], []
    for s in range(len(cu) - 1):
        State.seq = s
        lo, hi = cu[s], cu[s + 1]
        toks = tokens[lo:hi]
        logits = (forward_seq(P, W, cfg, toks) @ W["head"].T) / temperature
        logp = torch.log_softmax(logits, dim=-1)
        lp = torch.zeros(hi - lo, dtype=logp.dtype)
        ent = torch.zeros(hi - lo, dtype=logp.dtype)
        if hi - lo > 1:
            lp = torch.cat([lp[:1], logp[:-1].gather(1, toks[1:, None]).squeeze(1)])
            ent = torch.cat([ent[:1], -(logp.exp() * logp).sum(-1)[:-1]])
        lps.append(lp)
        ents.append(ent)
    return torch.cat(lps), torch.cat(ents)


def step(stored, cfg, tokens, cu, temperature, coef, dtype, rounding=True):
    """One training step in dtype: logprob, entropy, the loss (summed in
    float64), dloss/dparam, and the rounded values {tag: (T, width)}."""
    P = {k: v.detach().to(dtype).clone().requires_grad_(True) for k, v in stored.items()}
    State.round, State.rec = rounding, {}
    try:
        lp, ent = forward(P, cfg, tokens, cu, temperature)
        (coef.to(dtype) * lp).sum().backward()
        rec = State.rec
    finally:
        State.round, State.rec = True, None
    loss = (coef.double() * lp.detach().double()).sum()
    rows = {}
    for tag, parts in rec.items():
        width = next(iter(parts.values())).shape[1]
        # A sequence that got no gradient (one token) has zero rows.
        rows[tag] = torch.cat([parts.get(s, torch.zeros(cu[s + 1] - cu[s], width, dtype=dtype))
                               for s in range(len(cu) - 1)])
    return lp.detach(), ent.detach(), loss, {k: v.grad for k, v in P.items()}, rows


# ------------------------------------------------------------- self-checks

def check_bf16():
    """bf16 agrees with torch's float32 → bfloat16 conversion (round to
    nearest even) on float32 inputs, ties included."""
    g = torch.Generator().manual_seed(5)
    x = (torch.randn(100000, generator=g) * torch.exp(4 * torch.randn(100000, generator=g))).float()
    ties = torch.tensor([1 + 2.0 ** -8, 1 + 3 * 2.0 ** -8, -(1 + 2.0 ** -8), 2.0 ** -9 * 3, 1 - 2.0 ** -9])
    for t in (x, ties.float()):
        assert torch.equal(bf16(t), t.to(torch.bfloat16).float()), "bf16 rounding disagrees with torch's"
        assert torch.equal(bf16(t.double()), t.to(torch.bfloat16).double()), "float64 bf16 rounding disagrees"


def check_flash_attn():
    """With rounding off, FlashAttn's gradients are autograd's of softmax
    attention (its D then equals the exact rowsum)."""
    g = torch.Generator().manual_seed(7)
    T, NH, NKV, HD = 9, 4, 2, 8
    q, k, v = (torch.randn(T, n, HD, generator=g, dtype=torch.float64, requires_grad=True) for n in (NH, NKV, NKV))
    dout = torch.randn(T, NH, HD, generator=g, dtype=torch.float64)
    State.round = False
    try:
        got = torch.autograd.grad((FlashAttn.apply(q, k, v, None) * dout).sum(), (q, k, v))
    finally:
        State.round = True
    S = torch.einsum("thd,shd->hts", q, k.repeat_interleave(2, dim=1)) / HD ** 0.5
    S = S.masked_fill(~torch.ones(T, T, dtype=torch.bool).tril(), float("-inf"))
    ref = torch.einsum("hts,shd->thd", torch.softmax(S, -1), v.repeat_interleave(2, dim=1))
    want = torch.autograd.grad((ref * dout).sum(), (q, k, v))
    for a, b in zip(got, want):
        assert (a - b).abs().max() < 1e-12, "FlashAttn backward disagrees with autograd"


def close(a, b, atol, rtol):
    return bool(((a - b).abs() <= atol + rtol * b.abs()).all())


# ------------------------------------------------------------------- files

def load(path):
    """A safetensors file as {name: float64 or int64 tensor} and its metadata."""
    with open(path, "rb") as f:
        buf = f.read()
    n = struct.unpack("<Q", buf[:8])[0]
    header = json.loads(buf[8:8 + n])
    meta = header.pop("__metadata__", {})
    out = {}
    for name, ti in header.items():
        b = buf[8 + n + ti["data_offsets"][0]:8 + n + ti["data_offsets"][1]]
        dt = ti["dtype"]
        if dt == "BF16":
            a = (np.frombuffer(b, "<u2").astype(np.uint32) << 16).view(np.float32).astype(np.float64)
        elif dt in ("F16", "F32"):
            a = np.frombuffer(b, {"F16": "<f2", "F32": "<f4"}[dt]).astype(np.float64)
        elif dt == "I32":
            a = np.frombuffer(b, "<i4").astype(np.int64)
        else:
            raise ValueError("%s: tensor %s: dtype %s (regenerate with scripts/golden_model.py)" % (path, name, dt))
        out[name] = torch.from_numpy(a.copy()).reshape(ti["shape"])
    return out, meta


def save_atomic(path, tensors, meta):
    tmp = path + ".tmp"
    gm.save(tmp, tensors, meta)
    with open(tmp, "rb+") as f:
        os.fsync(f.fileno())
    os.replace(tmp, path)


def main():
    torch.set_num_threads(1)  # one summation order
    check_bf16()
    check_flash_attn()
    for name in VARIANTS:
        d = os.path.join(gm.OUT, name)
        with open(os.path.join(d, "config.json")) as f:
            cfg = json.load(f)
        stored, _ = load(os.path.join(d, "model.safetensors"))
        fp32, fp32_meta = load(os.path.join(d, "golden.safetensors"))
        tokens, cu = fp32["tokens"], fp32["cu_seqlens"].tolist()
        temperature, coef = float(fp32["temperature"][0]), fp32["coef"]

        # Without rounding, in float64, this is the fp32 golden's model.
        lp0, ent0, _, grads0, _ = step(stored, cfg, tokens, cu, temperature, coef, torch.float64, rounding=False)
        assert close(lp0, fp32["logprob"], 1e-6, 1e-6) and close(ent0, fp32["entropy"], 1e-6, 1e-6), name
        for k, g in grads0.items():
            assert close(g, fp32["grad." + k], 1e-6, 1e-5), (name, k)

        lp, ent, loss, grads, rows = step(stored, cfg, tokens, cu, temperature, coef, torch.float32)
        gold = {
            "tokens": tokens.to(torch.int32),
            "cu_seqlens": torch.tensor(cu, dtype=torch.int32),
            "temperature": fp32["temperature"].float(),
            "coef": coef.float(),
            "logprob": lp,
            "entropy": ent,
            "loss": loss.float().reshape(1),
        }
        for k, g in grads.items():
            gold["grad." + k] = g
        for tag, r in rows.items():
            if tag.endswith(".gu") and tag.startswith("act."):
                half = r.shape[1] // 2
                gold[tag[:-2] + "gate"] = r[:, :half].to(torch.bfloat16)
                gold[tag[:-2] + "up"] = r[:, half:].to(torch.bfloat16)
            else:
                gold[tag] = r.to(torch.bfloat16)
        meta = {"format": "pt", "golden_script": SCRIPT, "golden_command": COMMAND,
                "golden_torch": torch.__version__, "golden_arith": "float32, bf16 rounding to nearest even",
                "variant": name, "precision": "bf16",
                "golden_inputs": "model.safetensors, config.json and the batch of golden.safetensors "
                                 "(%s, seed %s)" % (fp32_meta.get("golden_script"), fp32_meta.get("golden_seed"))}
        save_atomic(os.path.join(d, "golden_bf16.safetensors"), gold, meta)

        # The same policy in float64: its roundings differ from float32's only
        # where a value lies on a bf16 rounding boundary (a flip), and each
        # flip moves everything downstream.
        lp6, _, _, grads6, rows6 = step(stored, cfg, tokens, cu, temperature, coef, torch.float64)
        flips = sum(int((rows6[t] != r.double()).sum()) for t, r in rows.items())
        first = min((t for t, r in rows.items() if (rows6[t] != r.double()).any()), default="none",
                    key=lambda t: list(rows).index(t))
        g6 = max(((grads6[k] - g.double()).norm() / g.double().norm()).item() for k, g in grads.items())
        gf = max(((grads0[k] - g.double()).norm() / grads0[k].norm()).item() for k, g in grads.items())
        print("%s: loss %.6f (fp32 golden %.6f); bf16 vs fp32: max |Δlogprob| %.3g, worst ‖Δgrad‖/‖grad‖ %.3g; "
              "float64 policy vs float32: %d of %d rounded values differ (first %s), max |Δlogprob| %.3g, "
              "worst ‖Δgrad‖/‖grad‖ %.3g"
              % (name, loss.item(), fp32["loss"].item(), (lp.double() - fp32["logprob"]).abs().max().item(), gf,
                 flips, sum(r.numel() for r in rows.values()), first, (lp6 - lp.double()).abs().max().item(), g6))


if __name__ == "__main__":
    main()
