#!/usr/bin/python3
"""Writes model/testdata/moe_* goldens: a Qwen3-MoE decoder written here
from Hugging Face transformers' definition (modeling_qwen3_moe.py, v4.51 and
v5), independently of the Go code, with Debian's torch.

Qwen3MoeSparseMoeBlock, as transformers computes it:
  router_logits = x · Wgᵀ                    (mlp.gate, a Linear without bias)
  probs = softmax(router_logits) in float32  (float64 here)
  weights, experts = top-k(probs)            (num_experts_per_tok)
  weights /= weights.sum() if norm_topk_prob
  out = Σ_k weights_k · expert_k(x),  expert = down(silu(gate(x)) · up(x))
    (experts of width moe_intermediate_size)
Layer l is sparse unless l is in mlp_only_layers or (l+1) % decoder_sparse_step
!= 0; a dense layer has Qwen3MoeMLP of width intermediate_size. Attention is
Qwen3's (q_norm/k_norm over head_dim before RoPE, grouped-query, causal).

The load-balancing loss is load_balancing_loss_func: the router logits of
every sparse layer concatenated (L_s·T rows), softmax, top-k,
tokens_per_expert = mean(one_hot(experts)) (k, E), router_prob = mean(probs)
(E), loss = E · Σ tokens_per_expert · router_prob. It is added to the loss
with router_aux_loss_coef when output_router_logits (Qwen3MoeForCausalLM's
forward with labels).

Ties. torch.topk leaves equal values in no defined order (its CPU kernel is
std::nth_element then std::sort over (value, index) pairs compared by value):
on rows where two experts tie for the k-th place it picks either. The policy
(kernels.Router) breaks ties towards the lower expert id, which is what
torch.sort(probs, descending=True, stable=True) gives; this reference selects
with that stable sort, and the script reports, for the golden's tie rows, how
often torch.topk chose differently. The tied experts have identical router
rows, so their logits are equal bit for bit (computed as elementwise products
summed along C, the same operations for both); the script checks that.

Packed sequences run layer by layer: attention within each sequence, the MLP
(and the routing, which is per token) over all T tokens at once, so a sparse
layer's assignments are ordered as the policy orders them (by expert, then
by assignment t·K + j), which the bf16 golden's recorded rows follow.

Two goldens per variant:
  golden.safetensors       float64 math on the stored weights: logprob,
                           entropy, loss, router_loss, grad.NAME for every
                           parameter, route.L<l>.experts / .weights;
  golden_bf16.safetensors  (the BF16 variants) the mixed-precision policy in
                           float32 with bf16 rounding where the policy stores
                           a value in bf16, as scripts/golden_model_bf16.py
                           writes it for the dense models, plus every rounded
                           operand: act.L<l>.{ln1,q,k,v,att,ln2} and, per
                           layer, {gate,up,h} (dense) or {egate,eup,eh} (sparse,
                           N = T·K rows in the policy's expert order), act.lnf;
                           dout.L<l>.{qkv,o,att} and {gu,down} (dense) or
                           {router,egu,edown} (sparse).
The bf16 step with its roundings turned off, in float64, reproduces the fp32
golden (a self-check before anything is written).

Storage: moe_k2_nonorm_v5 stores its experts in transformers v5's fused
layout (mlp.experts.gate_up_proj (E, 2·Im, C), mlp.experts.down_proj
(E, C, Im)) with a v5 config.json (num_local_experts, dtype,
rope_parameters); the others store the Hub's per-expert tensors.

Run: /usr/bin/python3 scripts/golden_moe.py   (or `make golden`)
"""
import json
import os
import sys

import torch

sys.dont_write_bytecode = True
sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
import golden_model as gm  # noqa: E402  (rms_norm, rotate_half, inv_freq_of, save, OUT)
import golden_model_bf16 as gb  # noqa: E402  (bf16, R, G, FlashAttn, State, load)

SEED = 20261201
SCRIPT = "scripts/golden_moe.py"
SEQ_LENS = [7, 1, 12, 5, 9]
TEMPERATURE = 0.7
TIES = [(3, 4), (10, 11)]  # experts with identical router rows

BASE = {
    "model_type": "qwen3_moe",
    "architectures": ["Qwen3MoeForCausalLM"],
    "hidden_size": 32,
    "intermediate_size": 48,
    "moe_intermediate_size": 16,
    "num_experts": 16,
    "num_hidden_layers": 2,
    "num_attention_heads": 4,
    "num_key_value_heads": 2,
    "head_dim": 16,
    "rms_norm_eps": 1e-6,
    "rope_theta": 1000000.0,
    "rope_scaling": None,
    "vocab_size": 128,
    "tie_word_embeddings": False,
    "max_position_embeddings": 128,
    "hidden_act": "silu",
    "attention_bias": False,
    "attention_dropout": 0.0,
    "use_sliding_window": False,
    "sliding_window": None,
    "max_window_layers": 2,
    "decoder_sparse_step": 1,
    "mlp_only_layers": [],
    "norm_topk_prob": True,
    "output_router_logits": False,
    "router_aux_loss_coef": 0.001,
    "initializer_range": 0.02,
    "torch_dtype": "float32",
}

# name, config overrides, storage dtype, v5 layout, bf16 golden
VARIANTS = [
    ("moe_k2_norm", {"num_experts_per_tok": 2}, "F32", False, True),
    ("moe_k2_nonorm_v5", {"num_experts_per_tok": 2, "norm_topk_prob": False}, "BF16", True, False),
    ("moe_k1", {"num_experts_per_tok": 1, "norm_topk_prob": False}, "F32", False, True),
    # K = 1 renormalised: every weight is 1, so only the load-balancing loss
    # reaches the router.
    ("moe_k1_norm_aux", {"num_experts_per_tok": 1, "output_router_logits": True, "router_aux_loss_coef": 0.05},
     "F32", False, False),
    # A dense layer between two sparse ones (mlp_only_layers), tied head.
    ("moe_k8_interleaved", {"num_experts_per_tok": 8, "num_hidden_layers": 3, "mlp_only_layers": [1],
                            "tie_word_embeddings": True}, "BF16", False, False),
    # decoder_sparse_step 2: layers 1 and 3 sparse; with the load-balancing loss.
    ("moe_k8_step2", {"num_experts_per_tok": 8, "norm_topk_prob": False, "num_hidden_layers": 4,
                      "decoder_sparse_step": 2, "output_router_logits": True, "router_aux_loss_coef": 0.01},
     "F32", False, True),
]


def sparse_layer(cfg, l):
    return l not in cfg["mlp_only_layers"] and cfg["num_experts"] > 0 and (l + 1) % cfg["decoder_sparse_step"] == 0


def param_shapes(cfg):
    C, I, Im, HD = cfg["hidden_size"], cfg["intermediate_size"], cfg["moe_intermediate_size"], cfg["head_dim"]
    NH, NKV, V, E = cfg["num_attention_heads"], cfg["num_key_value_heads"], cfg["vocab_size"], cfg["num_experts"]
    shapes = [("model.embed_tokens.weight", (V, C))]
    for l in range(cfg["num_hidden_layers"]):
        p = "model.layers.%d." % l
        shapes += [
            (p + "input_layernorm.weight", (C,)),
            (p + "self_attn.q_proj.weight", (NH * HD, C)),
            (p + "self_attn.k_proj.weight", (NKV * HD, C)),
            (p + "self_attn.v_proj.weight", (NKV * HD, C)),
            (p + "self_attn.o_proj.weight", (C, NH * HD)),
            (p + "self_attn.q_norm.weight", (HD,)),
            (p + "self_attn.k_norm.weight", (HD,)),
            (p + "post_attention_layernorm.weight", (C,)),
        ]
        if sparse_layer(cfg, l):
            shapes.append((p + "mlp.gate.weight", (E, C)))
            for e in range(E):
                shapes += [
                    (p + "mlp.experts.%d.gate_proj.weight" % e, (Im, C)),
                    (p + "mlp.experts.%d.up_proj.weight" % e, (Im, C)),
                    (p + "mlp.experts.%d.down_proj.weight" % e, (C, Im)),
                ]
        else:
            shapes += [
                (p + "mlp.gate_proj.weight", (I, C)),
                (p + "mlp.up_proj.weight", (I, C)),
                (p + "mlp.down_proj.weight", (C, I)),
            ]
    shapes.append(("model.norm.weight", (C,)))
    if not cfg["tie_word_embeddings"]:
        shapes.append(("lm_head.weight", (V, C)))
    return shapes


def init_weights(cfg, g):
    W = {}
    for name, shape in param_shapes(cfg):
        if len(shape) == 1:
            w = 1.0 + 0.2 * torch.randn(shape, generator=g)
        elif name.endswith("embed_tokens.weight") or name == "lm_head.weight":
            w = 0.5 * torch.randn(shape, generator=g)
        elif name.endswith("mlp.gate.weight"):
            # A router that decides (probabilities spread over ~0.01..0.5),
            # with the tied pairs' rows equal and larger, so that they often
            # straddle the k-th place.
            w = 2.0 * torch.randn(shape, generator=g) / shape[1] ** 0.5
            for a, b in TIES:
                w[a] *= 1.5
                w[b] = w[a]
        else:
            w = torch.randn(shape, generator=g) / shape[1] ** 0.5
        W[name] = w
    return W


# ------------------------------------------------------------- the model

class Policy:
    """What one forward does besides the math: float64 (the fp32 golden) or
    the bf16 mixed-precision policy (R/G roundings from golden_model_bf16)."""

    def __init__(self, bf16):
        self.bf16 = bf16

    def R(self, x, tag=None):
        return gb.R(x, tag) if self.bf16 else x

    def G(self, x, tag=None):
        return gb.G(x, tag) if self.bf16 else x


def rope(x, pos, theta, hd, dtype):
    freqs = pos.float()[:, None] * gm.inv_freq_of(theta, hd, None)[None, :]
    emb = torch.cat((freqs, freqs), dim=-1)
    cos, sin = emb.cos().to(dtype)[:, None, :], emb.sin().to(dtype)[:, None, :]
    return x * cos + gm.rotate_half(x) * sin


def attention(q, k, v):
    T, NH, HD = q.shape
    rep = NH // k.shape[1]
    S = torch.einsum("thd,shd->hts", q, k.repeat_interleave(rep, dim=1)) / HD ** 0.5
    S = S.masked_fill(~torch.ones(T, T, dtype=torch.bool).tril(), float("-inf"))
    return torch.einsum("hts,shd->thd", torch.softmax(S, -1), v.repeat_interleave(rep, dim=1))


def select(probs, K):
    """The K largest probabilities of each row, descending, ties to the lower
    expert id (a stable sort)."""
    return torch.sort(probs.detach(), dim=-1, descending=True, stable=True).indices[:, :K]


def router_logits(x, wg):
    """x (T,C) · wg (E,C)ᵀ as elementwise products summed along C: equal rows
    of wg give equal logits bit for bit."""
    return (x[:, None, :] * wg[None, :, :]).sum(-1)


def moe_block(pol, P, W, cfg, l, x, stats):
    """Qwen3MoeSparseMoeBlock on x (T,C): the output (T,C), with the router's
    logits, chosen experts and weights appended to stats."""
    p, a, d = "model.layers.%d." % l, "act.L%d." % l, "dout.L%d." % l
    T, C = x.shape
    E, K, Im = cfg["num_experts"], cfg["num_experts_per_tok"], cfg["moe_intermediate_size"]
    logits = router_logits(x, W[p + "router"] if pol.bf16 else P[p + "mlp.gate.weight"])
    logits = pol.G(logits, d + "router")
    probs = torch.softmax(logits, dim=-1)
    experts = select(probs, K)
    weights = probs.gather(1, experts)
    if cfg["norm_topk_prob"]:
        weights = weights / weights.sum(-1, keepdim=True)
    stats.append((logits, experts, weights))
    # The assignments i = t·K + j sorted by expert, then i (stable).
    flat = experts.reshape(-1)
    order = torch.sort(flat, stable=True).indices
    tok = order // K
    xp = x[tok]  # (N,C) by expert
    counts = torch.bincount(flat, minlength=E).tolist()
    ys, gates, ups, hs, lo = [], [], [], [], 0
    for e in range(E):
        n = counts[e]
        if n == 0:
            continue
        xe = xp[lo:lo + n]
        lo += n
        if pol.bf16:
            gu = xe @ W[p + "egu"][e].T
            ys.append(gu)
            continue
        g = xe @ P[p + "mlp.experts.%d.gate_proj.weight" % e].T
        u = xe @ P[p + "mlp.experts.%d.up_proj.weight" % e].T
        h = torch.nn.functional.silu(g) * u
        ys.append(h @ P[p + "mlp.experts.%d.down_proj.weight" % e].T)
    if pol.bf16:
        gu = pol.R(pol.G(torch.cat(ys), d + "egu"), a + "egu")
        h = pol.R(torch.nn.functional.silu(gu[:, :Im]) * gu[:, Im:], a + "eh")
        ys, lo = [], 0
        for e in range(E):
            n = counts[e]
            if n:
                ys.append(h[lo:lo + n] @ W[p + "edown"][e].T)
                lo += n
        y = pol.G(torch.cat(ys), d + "edown")
    else:
        y = torch.cat(ys)
    # out[t] = Σ_j weights[t, j] · y[slot[t·K + j]]
    slot = torch.empty_like(order)
    slot[order] = torch.arange(order.numel())
    yk = y[slot].reshape(T, K, C)
    return (weights[:, :, None] * yk).sum(1)


def dense_mlp(pol, P, W, l, x):
    p, a, d = "model.layers.%d." % l, "act.L%d." % l, "dout.L%d." % l
    if not pol.bf16:
        g = x @ P[p + "mlp.gate_proj.weight"].T
        u = x @ P[p + "mlp.up_proj.weight"].T
        return (torch.nn.functional.silu(g) * u) @ P[p + "mlp.down_proj.weight"].T
    gu = pol.R(pol.G(x @ W[p + "gu"].T, d + "gu"), a + "gu")
    I = gu.shape[1] // 2
    h = pol.R(torch.nn.functional.silu(gu[:, :I]) * gu[:, I:], a + "h")
    return pol.G(h @ W[p + "down"].T, d + "down")


def gemm_weights(pol, P, cfg):
    """Under bf16, the GEMM weights rounded (R: their gradients reach P) and
    fused as the policy fuses them (q|k|v, gate|up, and each expert's
    gate|up); in float64 nothing."""
    if not pol.bf16:
        return {}
    W = {}
    E = cfg["num_experts"]
    for l in range(cfg["num_hidden_layers"]):
        p = "model.layers.%d." % l
        W[p + "qkv"] = pol.R(torch.cat([P[p + "self_attn.%s_proj.weight" % n] for n in "qkv"]))
        W[p + "o"] = pol.R(P[p + "self_attn.o_proj.weight"])
        if sparse_layer(cfg, l):
            W[p + "router"] = pol.R(P[p + "mlp.gate.weight"])
            W[p + "egu"] = pol.R(torch.stack([torch.cat([P[p + "mlp.experts.%d.gate_proj.weight" % e],
                                                         P[p + "mlp.experts.%d.up_proj.weight" % e]]) for e in range(E)]))
            W[p + "edown"] = pol.R(torch.stack([P[p + "mlp.experts.%d.down_proj.weight" % e] for e in range(E)]))
        else:
            W[p + "gu"] = pol.R(torch.cat([P[p + "mlp.gate_proj.weight"], P[p + "mlp.up_proj.weight"]]))
            W[p + "down"] = pol.R(P[p + "mlp.down_proj.weight"])
    W["head"] = pol.R(P["model.embed_tokens.weight"] if cfg["tie_word_embeddings"] else P["lm_head.weight"])
    return W


def forward(pol, P, cfg, tokens, cu):
    """Final normed hidden states (T, C) of the packed batch, and the routers'
    stats [(logits, experts, weights)] per sparse layer."""
    C, NH, NKV, HD = cfg["hidden_size"], cfg["num_attention_heads"], cfg["num_key_value_heads"], cfg["head_dim"]
    eps, theta = cfg["rms_norm_eps"], cfg["rope_theta"]
    W = gemm_weights(pol, P, cfg)
    qn, kn = NH * HD, NKV * HD
    x = P["model.embed_tokens.weight"][tokens]
    stats = []
    for l in range(cfg["num_hidden_layers"]):
        p, a, d = "model.layers.%d." % l, "act.L%d." % l, "dout.L%d." % l
        ln1 = pol.R(gm.rms_norm(x, P[p + "input_layernorm.weight"], eps), a + "ln1")
        if pol.bf16:
            qkv = pol.G(ln1 @ W[p + "qkv"].T, d + "qkv")
        else:
            qkv = torch.cat([ln1 @ P[p + "self_attn.%s_proj.weight" % n].T for n in "qkv"], dim=1)
        T = x.shape[0]
        q = gm.rms_norm(qkv[:, :qn].reshape(T, NH, HD), P[p + "self_attn.q_norm.weight"], eps)
        k = gm.rms_norm(qkv[:, qn:qn + kn].reshape(T, NKV, HD), P[p + "self_attn.k_norm.weight"], eps)
        v = qkv[:, qn + kn:].reshape(T, NKV, HD)
        outs = []
        for s in range(len(cu) - 1):
            lo, hi = cu[s], cu[s + 1]
            pos = torch.arange(hi - lo)
            qs, ks = rope(q[lo:hi], pos, theta, HD, q.dtype), rope(k[lo:hi], pos, theta, HD, k.dtype)
            if pol.bf16:
                gb.State.seq = s
                o = gb.FlashAttn.apply(pol.R(qs, a + "q"), pol.R(ks, a + "k"), pol.R(v[lo:hi], a + "v"), d + "att")
                gb.record(a + "att", o)
            else:
                o = attention(qs, ks, v[lo:hi])
            outs.append(o.reshape(hi - lo, qn))
        gb.State.seq = 0
        att = torch.cat(outs)
        if pol.bf16:
            xmid = x + pol.G(att @ W[p + "o"].T, d + "o")
        else:
            xmid = x + att @ P[p + "self_attn.o_proj.weight"].T
        ln2 = pol.R(gm.rms_norm(xmid, P[p + "post_attention_layernorm.weight"], eps), a + "ln2")
        if sparse_layer(cfg, l):
            x = xmid + moe_block(pol, P, W, cfg, l, ln2, stats)
        else:
            x = xmid + dense_mlp(pol, P, W, l, ln2)
    lnf = pol.R(gm.rms_norm(x, P["model.norm.weight"], eps), "act.lnf")
    head = W["head"] if pol.bf16 else (P["model.embed_tokens.weight"] if cfg["tie_word_embeddings"] else P["lm_head.weight"])
    return lnf, head, stats


def load_balancing_loss(stats, E, K):
    """transformers' load_balancing_loss_func (no attention mask)."""
    logits = torch.cat([s[0] for s in stats], dim=0)
    probs = torch.softmax(logits, dim=-1)
    selected = select(probs, K)
    mask = torch.nn.functional.one_hot(selected, E).to(probs.dtype)
    tokens_per_expert = mask.mean(0)  # (K, E)
    router_prob = probs.mean(0)  # (E)
    return (tokens_per_expert * router_prob[None]).sum() * E


def step(stored, cfg, tokens, cu, coef, dtype, bf16, rounding=True):
    pol = Policy(bf16)
    P = {k: v.detach().to(dtype).clone().requires_grad_(True) for k, v in stored.items()}
    gb.State.round, gb.State.rec = rounding, ({} if bf16 else None)
    try:
        lnf, head, stats = forward(pol, P, cfg, tokens, cu)
        logits = (lnf @ head.T) / TEMPERATURE
        logp = torch.log_softmax(logits, dim=-1)
        lp = torch.zeros(len(tokens), dtype=dtype)
        ent = torch.zeros(len(tokens), dtype=dtype)
        ent_all = -(logp.exp() * logp).sum(-1)
        lps, ents = [], []
        for s in range(len(cu) - 1):
            lo, hi = cu[s], cu[s + 1]
            z = torch.zeros(1, dtype=dtype)
            if hi - lo > 1:
                lps.append(torch.cat([z, logp[lo:hi - 1].gather(1, tokens[lo + 1:hi, None]).squeeze(1)]))
                ents.append(torch.cat([z, ent_all[lo:hi - 1]]))
            else:
                lps.append(z)
                ents.append(z)
        lp, ent = torch.cat(lps), torch.cat(ents)
        aux = load_balancing_loss(stats, cfg["num_experts"], cfg["num_experts_per_tok"])
        loss = (coef.to(dtype) * lp).sum()
        if cfg["output_router_logits"]:
            loss = loss + cfg["router_aux_loss_coef"] * aux
        loss.backward()
        rec = gb.State.rec
    finally:
        gb.State.round, gb.State.rec = True, None
    grads = {k: v.grad if v.grad is not None else torch.zeros_like(v) for k, v in P.items()}
    return lp.detach(), ent.detach(), loss.detach(), aux.detach(), grads, stats, rec


def tie_report(stats, K):
    """Rows whose k-th place is tied with the (k+1)-th (the choice decides
    which expert runs), and how many of them torch.topk decides otherwise."""
    split = differ = inside = 0
    for logits, experts, _ in stats:
        probs = torch.softmax(logits.detach(), -1)
        for a, b in TIES:
            assert torch.equal(logits[:, a], logits[:, b]), "tied router rows gave different logits"
        sp, _ = torch.sort(probs, dim=-1, descending=True, stable=True)
        for t in range(probs.shape[0]):
            if K < probs.shape[1] and sp[t, K - 1] == sp[t, K]:
                split += 1
                tk = torch.topk(probs[t], K).indices
                if sorted(tk.tolist()) != sorted(experts[t].tolist()):
                    differ += 1
            elif any(sp[t, j] == sp[t, j + 1] for j in range(K - 1)):
                inside += 1
            # Away from exact ties the K-th and (K+1)-th differ clearly, so no
            # float32 rounding can reorder them.
            if K < probs.shape[1] and sp[t, K - 1] != sp[t, K]:
                assert (sp[t, K - 1] - sp[t, K]) / sp[t, K - 1] > 1e-5, "a near-tie at the k-th place"
    return split, differ, inside


def to_dtype(t, name):
    return {"F32": t.float(), "BF16": t.float().to(torch.bfloat16)}[name]


def main():
    torch.set_num_threads(1)
    meta = {"format": "pt", "golden_script": SCRIPT, "golden_seed": str(SEED), "golden_torch": torch.__version__}
    for vi, (name, over, storage, v5, want_bf16) in enumerate(VARIANTS):
        g = torch.Generator().manual_seed(SEED + vi)
        cfg = dict(BASE)
        cfg.update(over)
        cfg["torch_dtype"] = {"F32": "float32", "BF16": "bfloat16"}[storage]
        stored = {k: to_dtype(v, storage) for k, v in init_weights(cfg, g).items()}
        d = os.path.join(gm.OUT, name)
        os.makedirs(d, exist_ok=True)
        saved_cfg = dict(cfg)
        on_disk = dict(stored)
        if v5:
            # transformers v5: fused experts, v5 config keys.
            E = cfg["num_experts"]
            for l in range(cfg["num_hidden_layers"]):
                p = "model.layers.%d.mlp.experts." % l
                if not sparse_layer(cfg, l):
                    continue
                on_disk[p + "gate_up_proj"] = torch.stack([torch.cat([on_disk.pop(p + "%d.gate_proj.weight" % e),
                                                                      on_disk.pop(p + "%d.up_proj.weight" % e)])
                                                           for e in range(E)])
                on_disk[p + "down_proj"] = torch.stack([on_disk.pop(p + "%d.down_proj.weight" % e) for e in range(E)])
            saved_cfg["num_local_experts"] = saved_cfg.pop("num_experts")
            saved_cfg["dtype"] = saved_cfg.pop("torch_dtype")
            saved_cfg["rope_parameters"] = {"rope_theta": saved_cfg.pop("rope_theta"), "rope_type": "default"}
            del saved_cfg["rope_scaling"]
        gm.save(os.path.join(d, "model.safetensors"), on_disk, meta)
        with open(os.path.join(d, "config.json"), "w") as f:
            json.dump(saved_cfg, f, indent=2, sort_keys=True)
            f.write("\n")

        V, K, E = cfg["vocab_size"], cfg["num_experts_per_tok"], cfg["num_experts"]
        tokens = torch.randint(0, V, (sum(SEQ_LENS),), generator=g)
        cu = [0]
        for n in SEQ_LENS:
            cu.append(cu[-1] + n)
        coef = torch.randn(len(tokens), generator=g, dtype=torch.float64)
        lp, ent, loss, aux, grads, stats, _ = step(stored, cfg, tokens, cu, coef, torch.float64, False)
        split, differ, inside = tie_report(stats, K)
        gold = {
            "tokens": tokens.to(torch.int32),
            "cu_seqlens": torch.tensor(cu, dtype=torch.int32),
            "temperature": torch.tensor([TEMPERATURE], dtype=torch.float32),
            "coef": coef.float(),
            "logprob": lp.float(),
            "entropy": ent.float(),
            "loss": loss.float().reshape(1),
            "router_loss": aux.float().reshape(1),
        }
        for k, gr in grads.items():
            gold["grad." + k] = gr.float()
        sparse = [l for l in range(cfg["num_hidden_layers"]) if sparse_layer(cfg, l)]
        for l, (_, experts, weights) in zip(sparse, stats):
            gold["route.L%d.experts" % l] = experts.to(torch.int32)
            gold["route.L%d.weights" % l] = weights.detach().float()
        vmeta = dict(meta, variant=name, tie_rows_at_kth_place=str(split), tie_rows_torch_topk_differs=str(differ),
                     tie_rows_inside_top_k=str(inside))
        gm.save(os.path.join(d, "golden.safetensors"), gold, vmeta)
        msg = ("%s: loss %.6f, router loss %.6f, %d tokens, sparse layers %s; ties: %d rows split at the k-th place "
               "(torch.topk chose otherwise in %d), %d tied inside the top k"
               % (name, loss.item(), aux.item(), len(tokens), sparse, split, differ, inside))
        if want_bf16:
            msg += "; " + write_bf16(d, name, stored, cfg, tokens, cu, coef, gold, meta)
        print(msg)


def write_bf16(d, name, stored, cfg, tokens, cu, coef, fp32, meta):
    # Without rounding, in float64, the policy is the fp32 golden's model.
    lp0, ent0, loss0, _, grads0, _, _ = step(stored, cfg, tokens, cu, coef, torch.float64, True, rounding=False)
    assert gb.close(lp0, fp32["logprob"].double(), 1e-6, 1e-6), name
    for k, gr in grads0.items():
        assert gb.close(gr, fp32["grad." + k].double(), 1e-6, 1e-5), (name, k)
    lp, ent, loss, aux, grads, stats, rec = step(stored, cfg, tokens, cu, coef, torch.float32, True)
    tie_report(stats, cfg["num_experts_per_tok"])  # exact ties stay exact, and no near-tie at the k-th place
    gold = {k: fp32[k] for k in ("tokens", "cu_seqlens", "temperature", "coef")}
    gold.update({"logprob": lp, "entropy": ent, "loss": loss.float().reshape(1), "router_loss": aux.float().reshape(1)})
    for k, gr in grads.items():
        gold["grad." + k] = gr
    sparse = [l for l in range(cfg["num_hidden_layers"]) if sparse_layer(cfg, l)]
    for l, (_, experts, weights) in zip(sparse, stats):
        gold["route.L%d.experts" % l] = experts.to(torch.int32)
        gold["route.L%d.weights" % l] = weights.detach().float()
    for tag, parts in rec.items():
        if tag.startswith("act.") and tag.endswith(".att"):
            rows = torch.cat([parts[s] for s in range(len(cu) - 1)])
        elif tag.startswith("dout.") and tag.endswith(".att"):
            width = next(iter(parts.values())).shape[1]
            rows = torch.cat([parts.get(s, torch.zeros(cu[s + 1] - cu[s], width)) for s in range(len(cu) - 1)])
        elif tag.startswith("act.") and (tag.endswith(".q") or tag.endswith(".k") or tag.endswith(".v")):
            rows = torch.cat([parts[s] for s in range(len(cu) - 1)])
        else:
            rows = parts[0]
        if tag.endswith(".gu") or tag.endswith(".egu"):
            if tag.startswith("act."):
                half = rows.shape[1] // 2
                pre = "e" if tag.endswith(".egu") else ""
                base = tag[: tag.rindex(".") + 1]
                gold[base + pre + "gate"] = rows[:, :half].to(torch.bfloat16)
                gold[base + pre + "up"] = rows[:, half:].to(torch.bfloat16)
                continue
        gold[tag] = rows.to(torch.bfloat16)
    vmeta = dict(meta, variant=name, precision="bf16", golden_arith="float32, bf16 rounding to nearest even",
                 golden_inputs="model.safetensors, config.json and the batch of golden.safetensors")
    gm.save(os.path.join(d, "golden_bf16.safetensors"), gold, vmeta)
    return "bf16: loss %.6f, max |Δlogprob| vs fp32 %.3g" % (loss.item(), (lp.double() - fp32["logprob"].double()).abs().max().item())


if __name__ == "__main__":
    main()
