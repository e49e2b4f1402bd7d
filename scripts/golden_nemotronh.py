#!/usr/bin/python3
"""Writes model/testdata/nh_* goldens: Nemotron-H (model_type nemotron_h)
written here from transformers' NemotronHForCausalLM
(src/transformers/models/nemotron_h/modeling_nemotron_h.py at
897753a012bfa6dac8c0ae3281f23a2fc1e72db6), independently of the Go code,
with Debian's torch, in float64.

A block is residual + mixer(NemotronHRMSNorm(x)), the mixer one of:
  Mamba-2 (NemotronHMamba2Mixer.torch_forward, the naive SSD):
    in_proj → z | xBC | dt; xBC = silu(conv1d(xBC)) (depthwise, padding
    conv_kernel−1, cut to the sequence); x, B, C = split(xBC);
    dt = softplus(dt + dt_bias), then the kernel path's clamp to
    time_step_limit (see below); A = −exp(A_log);
    the chunked scan of segment_sum / reshape_into_chunks (chunk_size,
    padding to a multiple of it), + D·x; Zamba2RMSNormGated(y, z) with
    group_size d_inner/n_groups (the gate before the norm); out_proj.
  attention (NemotronHAttention): GQA, no RoPE, no q/k norm, scale
    head_dim^-0.5, causal.
  MLP (NemotronHMLP): down(relu(up(x))²).
  MoE (NemotronHMoE): router logits in fp32 (float64 here), sigmoid; the
    choice adds gate.e_score_correction_bias, groups score the sum of their
    top 2 (n_group, topk_group), masked_fill(0.0); the weights are the
    unbiased scores gathered, divided by their sum + 1e-20 when
    norm_topk_prob, times routed_scaling_factor; experts down(relu(up(x))²)
    in the latent space (fc1_latent_proj / fc2_latent_proj when
    moe_latent_size); plus the shared expert on the block's normed input.
then norm_f and lm_head.

The time step: transformers' torch path clamps dt at time_step_min
(torch.clamp(dt, self.time_step_min)); its kernel path (cuda_kernels_forward,
which runs on a GPU with mamba_ssm, and Megatron-Core's mixer) passes
dt_limit=time_step_limit to mamba_chunk_scan_combined, whose clamp is
[min, max] of time_step_limit. Training runs the kernel path, so this
reference (and tracegrpo) clamp to time_step_limit; the default (0, inf)
leaves dt unclamped.

The choice of experts is made as transformers' float32 math makes it: the
sigmoid rounded to float32, plus the float32 bias, group sums in float32;
ties (none occur: the script asserts a margin) would go to the lower id
(stable sort). Each sequence runs alone (batch of one): the state and the
conv window start from zero at each.

Variants:
  nh_blocks   every block kind (M * - E M), lengths the chunk (4) does not
              divide, n_groups 2, fp32 weights
  nh_groups   group-limited routing (n_group 4, topk_group 2), a selection
              bias, routed_scaling_factor 2.5, time_step_limit [0.05, 0.5]
              (the clamp active), no conv bias, n_groups 4
  nh_latent   Super's latent MoE (moe_latent_size), norm_topk_prob false,
              tied embeddings
  nh_bf16     BF16 weights, layers_block_type and transformers' __init__
              spellings (mamba_n_groups, mamba_d_conv, mamba_chunk_size),
              time_step_limit [0.0, Infinity] as Python's json writes it

golden.safetensors: tokens, cu_seqlens, temperature, coef, logprob,
entropy, loss = Σ coef·logprob, grad.NAME for every parameter (zero for the
selection biases, which are buffers), route.L<l>.experts / .weights.

Run: /usr/bin/python3 scripts/golden_nemotronh.py   (or `make golden`)
"""
import json
import math
import os
import sys

import torch
import torch.nn.functional as F

sys.dont_write_bytecode = True
sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
import golden_model as gm  # noqa: E402  (save, to_dtype, OUT)

SEED = 20261235
SCRIPT = "scripts/golden_nemotronh.py"
SEQ_LENS = [7, 1, 13, 5, 9]
TEMPERATURE = 0.8
MARGIN = 1e-4  # least gap between a chosen and a passed-over choice score (float32 math on both sides)

BASE = {
    "model_type": "nemotron_h",
    "architectures": ["NemotronHForCausalLM"],
    "hidden_size": 32,
    "vocab_size": 96,
    "num_attention_heads": 4,
    "num_key_value_heads": 2,
    "head_dim": 8,
    "intermediate_size": 40,
    "layer_norm_epsilon": 1e-5,
    "mamba_num_heads": 4,
    "mamba_head_dim": 8,
    "n_groups": 2,
    "ssm_state_size": 8,
    "conv_kernel": 4,
    "chunk_size": 4,
    "use_conv_bias": True,
    "mamba_hidden_act": "silu",
    "mlp_hidden_act": "relu2",
    "n_routed_experts": 8,
    "num_experts_per_tok": 2,
    "moe_intermediate_size": 12,
    "moe_shared_expert_intermediate_size": 20,
    "n_group": 1,
    "topk_group": 1,
    "norm_topk_prob": True,
    "routed_scaling_factor": 1.0,
    "tie_word_embeddings": False,
    "max_position_embeddings": 128,
    "attention_bias": False,
    "mlp_bias": False,
    "use_bias": False,
    "torch_dtype": "float32",
}

# name, config overrides, storage
VARIANTS = [
    ("nh_blocks", {"hybrid_override_pattern": "M*-EM"}, "F32"),
    ("nh_groups", {"hybrid_override_pattern": "ME*E", "n_routed_experts": 16, "num_experts_per_tok": 4, "n_group": 4,
                   "topk_group": 2, "routed_scaling_factor": 2.5, "time_step_limit": [0.05, 0.5], "use_conv_bias": False,
                   "mamba_num_heads": 8, "mamba_head_dim": 4, "n_groups": 4, "ssm_state_size": 6, "chunk_size": 8}, "F32"),
    ("nh_latent", {"hybrid_override_pattern": "ME-E", "moe_latent_size": 16, "num_experts_per_tok": 3,
                   "norm_topk_prob": False, "routed_scaling_factor": 1.5, "tie_word_embeddings": True}, "F32"),
    ("nh_bf16", {"layers_block_type": ["mamba", "attention", "moe"], "time_step_limit": [0.0, float("inf")],
                 "torch_dtype": "bfloat16"}, "BF16"),
]


def cfg_of(overrides):
    cfg = dict(BASE)
    cfg.update(overrides)
    return cfg


def blocks(cfg):
    if "layers_block_type" in cfg:
        return list(cfg["layers_block_type"])
    return [{"M": "mamba", "*": "attention", "-": "mlp", "E": "moe"}[c] for c in cfg["hybrid_override_pattern"]]


def get(cfg, name, alias):
    return cfg[alias] if alias in cfg else cfg[name]


def dims(cfg):
    MH, MP, G, DS = cfg["mamba_num_heads"], cfg["mamba_head_dim"], get(cfg, "n_groups", "mamba_n_groups"), cfg["ssm_state_size"]
    DI = MH * MP
    CD = DI + 2 * G * DS
    return MH, MP, G, DS, DI, CD


def param_shapes(cfg):
    C, V = cfg["hidden_size"], cfg["vocab_size"]
    NH, NKV, HD = cfg["num_attention_heads"], cfg["num_key_value_heads"], cfg["head_dim"]
    MH, MP, G, DS, DI, CD = dims(cfg)
    KW = get(cfg, "conv_kernel", "mamba_d_conv")
    E, Im, Ish = cfg["n_routed_experts"], cfg["moe_intermediate_size"], cfg["moe_shared_expert_intermediate_size"]
    lat = cfg.get("moe_latent_size")
    In = lat or C
    shapes = [("backbone.embeddings.weight", (V, C))]
    for l, kind in enumerate(blocks(cfg)):
        p = "backbone.layers.%d." % l
        m = p + "mixer."
        shapes.append((p + "norm.weight", (C,)))
        if kind == "mamba":
            shapes += [(m + "in_proj.weight", (DI + CD + MH, C)), (m + "conv1d.weight", (CD, 1, KW))]
            if cfg["use_conv_bias"]:
                shapes.append((m + "conv1d.bias", (CD,)))
            shapes += [(m + "dt_bias", (MH,)), (m + "A_log", (MH,)), (m + "D", (MH,)), (m + "norm.weight", (DI,)),
                       (m + "out_proj.weight", (C, DI))]
        elif kind == "attention":
            shapes += [(m + "q_proj.weight", (NH * HD, C)), (m + "k_proj.weight", (NKV * HD, C)),
                       (m + "v_proj.weight", (NKV * HD, C)), (m + "o_proj.weight", (C, NH * HD))]
        elif kind == "mlp":
            shapes += [(m + "up_proj.weight", (cfg["intermediate_size"], C)), (m + "down_proj.weight", (C, cfg["intermediate_size"]))]
        else:
            shapes += [(m + "gate.weight", (E, C)), (m + "gate.e_score_correction_bias", (E,))]
            if lat:
                shapes += [(m + "fc1_latent_proj.weight", (lat, C)), (m + "fc2_latent_proj.weight", (C, lat))]
            for e in range(E):
                shapes += [(m + "experts.%d.up_proj.weight" % e, (Im, In)), (m + "experts.%d.down_proj.weight" % e, (In, Im))]
            shapes += [(m + "shared_experts.up_proj.weight", (Ish, C)), (m + "shared_experts.down_proj.weight", (C, Ish))]
    shapes.append(("backbone.norm_f.weight", (C,)))
    if not cfg["tie_word_embeddings"]:
        shapes.append(("lm_head.weight", (V, C)))
    return shapes


def init_weights(cfg, g):
    W = {}
    for name, shape in param_shapes(cfg):
        if name.endswith("A_log"):
            w = torch.log(torch.arange(1, shape[0] + 1, dtype=torch.float64)) + 0.3 * torch.randn(shape, generator=g, dtype=torch.float64)
        elif name.endswith("dt_bias"):
            w = 0.8 * torch.randn(shape, generator=g, dtype=torch.float64) - 1.0
        elif name.endswith("e_score_correction_bias"):
            w = 0.05 * torch.randn(shape, generator=g, dtype=torch.float64)
        elif name.endswith("conv1d.weight"):
            w = 0.5 * torch.randn(shape, generator=g, dtype=torch.float64)
        elif name.endswith("conv1d.bias") or name.endswith(".D"):
            w = 0.5 * torch.randn(shape, generator=g, dtype=torch.float64)
        elif len(shape) == 1:  # norm weights around 1, not exactly 1, so their gradients matter
            w = 1.0 + 0.2 * torch.randn(shape, generator=g, dtype=torch.float64)
        elif name.endswith("embeddings.weight") or name == "lm_head.weight":
            w = 0.5 * torch.randn(shape, generator=g, dtype=torch.float64)
        elif name.endswith("gate.weight"):
            w = 2.0 * torch.randn(shape, generator=g, dtype=torch.float64) / shape[1] ** 0.5
        else:
            w = torch.randn(shape, generator=g, dtype=torch.float64) / shape[-1] ** 0.5
        W[name] = w
    return W


def rms_norm(x, w, eps):
    return w * (x * torch.rsqrt(x.pow(2).mean(-1, keepdim=True) + eps))


# --------------------------------------------------------------- Mamba-2

def segment_sum(x):
    """transformers' segment_sum: cumulative sums over the last axis below
    the diagonal, −inf above it."""
    n = x.size(-1)
    x = x[..., None].expand(*x.size(), n)
    mask = torch.tril(torch.ones(n, n, dtype=torch.bool), diagonal=-1)
    x = x.masked_fill(~mask, 0)
    s = torch.cumsum(x, dim=-2)
    mask = torch.tril(torch.ones(n, n, dtype=torch.bool), diagonal=0)
    return s.masked_fill(~mask, -torch.inf)


def pad_chunks(t, pad, chunk):
    """reshape_into_chunks for a (L, ...) tensor of one sequence."""
    t = torch.cat([t, torch.zeros((pad,) + t.shape[1:], dtype=t.dtype)], 0)
    return t.reshape((-1, chunk) + t.shape[1:])


def ssd(x, dt, A, B, C, D, chunk):
    """The naive SSD of NemotronHMamba2Mixer.torch_forward for one sequence:
    x (L,H,P), dt (L,H), A (H), B, C (L,H,N) (repeated per head), D (H)."""
    L = x.shape[0]
    pad = (chunk - L % chunk) % chunk
    D_res = D[:, None] * torch.cat([x, torch.zeros((pad,) + x.shape[1:], dtype=x.dtype)], 0)
    x = x * dt[..., None]
    A = A * dt  # (L,H)
    x, A, B, C = [pad_chunks(t, pad, chunk) for t in (x, A, B, C)]  # (c, l, H, ...)
    A = A.permute(2, 0, 1)  # (H, c, l)
    A_cs = torch.cumsum(A, -1)
    Lm = torch.exp(segment_sum(A))  # (H, c, l, s)
    G = (C[:, :, None, :, :] * B[:, None, :, :, :]).sum(-1)  # (c, l, s, H)
    M = G * Lm.permute(1, 2, 3, 0)
    Y_diag = (M[..., None] * x[:, None]).sum(2)  # (c, l, H, P)
    decay_states = torch.exp(A_cs[:, :, -1:] - A_cs)  # (H, c, l)
    B_dec = B * decay_states.permute(1, 2, 0)[..., None]  # (c, l, H, N)
    states = (B_dec[:, :, :, None, :] * x[..., None]).sum(1)  # (c, H, P, N)
    states = torch.cat([torch.zeros_like(states[:1]), states], 0)
    decay_chunk = torch.exp(segment_sum(F.pad(A_cs[:, :, -1], (1, 0))))  # (H, c+1, c+1)
    new_states = (decay_chunk.permute(1, 2, 0)[..., None, None] * states[None]).sum(1)  # (c+1, H, P, N)
    states = new_states[:-1]
    state_out = torch.exp(A_cs).permute(1, 2, 0)  # (c, l, H)
    Y_off = (C[:, :, :, None, :] * states[:, None]).sum(-1) * state_out[..., None]  # (c, l, H, P)
    y = (Y_diag + Y_off).reshape(-1, x.shape[2], x.shape[3]) + D_res
    return y[:L]


def scan_seq(x, dt, A, B, C, D):
    """The recurrence itself, token by token: the self-check of ssd."""
    S = torch.zeros(x.shape[1], x.shape[2], B.shape[2], dtype=x.dtype)
    ys = []
    for t in range(x.shape[0]):
        S = torch.exp(dt[t] * A)[:, None, None] * S + (dt[t][:, None, None] * x[t][:, :, None] * B[t][:, None, :])
        ys.append((S * C[t][:, None, :]).sum(-1) + D[:, None] * x[t])
    return torch.stack(ys)


def mamba(P, p, cfg, h):
    MH, MP, G, DS, DI, CD = dims(cfg)
    KW = get(cfg, "conv_kernel", "mamba_d_conv")
    chunk = get(cfg, "chunk_size", "mamba_chunk_size")
    eps = cfg["layer_norm_epsilon"]
    L = h.shape[0]
    proj = h @ P[p + "in_proj.weight"].T
    z, xbc, dt = proj.split([DI, CD, MH], -1)
    bias = P.get(p + "conv1d.bias")
    xbc = F.silu(F.conv1d(xbc.T[None], P[p + "conv1d.weight"], bias, padding=KW - 1, groups=CD)[0, :, :L].T)
    x, B, C = xbc.split([DI, G * DS, G * DS], -1)
    dt = F.softplus(dt + P[p + "dt_bias"])
    lo, hi = get(cfg, "time_step_limit", "mamba_dt_limit") if ("time_step_limit" in cfg or "mamba_dt_limit" in cfg) else (0.0, math.inf)
    dt = torch.clamp(dt, lo, hi)
    A = -torch.exp(P[p + "A_log"])
    B = B.reshape(L, G, DS).repeat_interleave(MH // G, dim=1)
    C = C.reshape(L, G, DS).repeat_interleave(MH // G, dim=1)
    y = ssd(x.reshape(L, MH, MP), dt, A, B, C, P[p + "D"], chunk)
    ys = scan_seq(x.reshape(L, MH, MP), dt, A, B, C, P[p + "D"])
    assert (y - ys).abs().max().item() < 1e-10, "the chunked SSD and the recurrence differ"
    y = y.reshape(L, DI)
    # Zamba2RMSNormGated: the gate before the norm, groups of d_inner/n_groups.
    u = y * F.silu(z)
    ug = u.reshape(L, G, DI // G)
    ug = ug * torch.rsqrt(ug.pow(2).mean(-1, keepdim=True) + eps)
    g = P[p + "norm.weight"] * ug.reshape(L, DI)
    return g @ P[p + "out_proj.weight"].T


def attention(P, p, cfg, h):
    NH, NKV, HD = cfg["num_attention_heads"], cfg["num_key_value_heads"], cfg["head_dim"]
    L = h.shape[0]
    q = (h @ P[p + "q_proj.weight"].T).reshape(L, NH, HD).transpose(0, 1)
    k = (h @ P[p + "k_proj.weight"].T).reshape(L, NKV, HD).transpose(0, 1).repeat_interleave(NH // NKV, 0)
    v = (h @ P[p + "v_proj.weight"].T).reshape(L, NKV, HD).transpose(0, 1).repeat_interleave(NH // NKV, 0)
    s = (q @ k.transpose(1, 2)) * HD ** -0.5
    s = s.masked_fill(~torch.tril(torch.ones(L, L, dtype=torch.bool)), -torch.inf)
    o = (torch.softmax(s, -1) @ v).transpose(0, 1).reshape(L, NH * HD)
    return o @ P[p + "o_proj.weight"].T


def relu2(x):
    return torch.relu(x) ** 2


def mlp(P, p, h):
    return relu2(h @ P[p + "up_proj.weight"].T) @ P[p + "down_proj.weight"].T


def choose(logits, bias, cfg):
    """The choice of experts as transformers' float32 math makes it, and the
    smallest margin between a kept and a passed-over score."""
    E, K = cfg["n_routed_experts"], cfg["num_experts_per_tok"]
    ng, tg = cfg["n_group"], cfg["topk_group"]
    s32 = torch.sigmoid(logits).float()
    c = s32 + bias.float()
    margin = math.inf
    if ng > 1:
        gs = c.view(-1, ng, E // ng).topk(2, dim=-1)[0].sum(-1)  # (T, ng) in float32
        order = torch.sort(gs, dim=-1, descending=True, stable=True)[1]
        keep = torch.zeros_like(gs, dtype=torch.bool)
        keep.scatter_(1, order[:, :tg], True)
        srt = torch.sort(gs, dim=-1, descending=True)[0]
        margin = min(margin, (srt[:, tg - 1] - srt[:, tg]).min().item())
        mask = keep[:, :, None].expand(-1, ng, E // ng).reshape(-1, E)
        c = c.masked_fill(~mask, 0.0)
    srt, idx = torch.sort(c, dim=-1, descending=True, stable=True)
    if K < E:
        margin = min(margin, (srt[:, K - 1] - srt[:, K]).min().item())
    return idx[:, :K], margin


def moe(P, p, cfg, h, route):
    K, lat = cfg["num_experts_per_tok"], cfg.get("moe_latent_size")
    logits = h @ P[p + "gate.weight"].T  # transformers: fp32 (float64 here)
    scores = torch.sigmoid(logits)
    idx, margin = choose(logits.detach(), P[p + "gate.e_score_correction_bias"].detach(), cfg)
    w = scores.gather(1, idx)
    if cfg["norm_topk_prob"]:
        w = w / (w.sum(-1, keepdim=True) + 1e-20)
    w = w * cfg["routed_scaling_factor"]
    xin = h @ P[p + "fc1_latent_proj.weight"].T if lat else h
    out = torch.zeros_like(xin)
    for j in range(K):
        for t in range(h.shape[0]):
            e = idx[t, j].item()
            q = p + "experts.%d." % e
            y = relu2(xin[t] @ P[q + "up_proj.weight"].T) @ P[q + "down_proj.weight"].T
            out = out.index_add(0, torch.tensor([t]), (w[t, j] * y)[None])
    if lat:
        out = out @ P[p + "fc2_latent_proj.weight"].T
    out = out + relu2(h @ P[p + "shared_experts.up_proj.weight"].T) @ P[p + "shared_experts.down_proj.weight"].T
    route.append((idx, w, margin))
    return out


def forward_seq(P, cfg, toks, routes):
    x = P["backbone.embeddings.weight"][toks]
    eps = cfg["layer_norm_epsilon"]
    for l, kind in enumerate(blocks(cfg)):
        p = "backbone.layers.%d." % l
        h = rms_norm(x, P[p + "norm.weight"], eps)
        m = p + "mixer."
        if kind == "mamba":
            o = mamba(P, m, cfg, h)
        elif kind == "attention":
            o = attention(P, m, cfg, h)
        elif kind == "mlp":
            o = mlp(P, m, h)
        else:
            o = moe(P, m, cfg, h, routes.setdefault(l, []))
        x = x + o
    x = rms_norm(x, P["backbone.norm_f.weight"], eps)
    head = P["lm_head.weight" if "lm_head.weight" in P else "backbone.embeddings.weight"]
    return x @ head.T


def forward(P, cfg, tokens, cu, temperature):
    lps, ents, routes = [], [], {}
    for s in range(len(cu) - 1):
        lo, hi = cu[s], cu[s + 1]
        toks = tokens[lo:hi]
        logp = torch.log_softmax(forward_seq(P, cfg, toks, routes) / temperature, -1)
        lp = torch.zeros(hi - lo, dtype=torch.float64)
        ent = torch.zeros(hi - lo, dtype=torch.float64)
        if hi - lo > 1:
            lp = torch.cat([lp[:1], logp[:-1].gather(1, toks[1:, None]).squeeze(1)])
            e = -(logp.exp() * logp).sum(-1)
            ent = torch.cat([ent[:1], e[:-1]])
        lps.append(lp)
        ents.append(ent)
    return torch.cat(lps), torch.cat(ents), routes


def main():
    meta = {"format": "pt", "golden_script": SCRIPT, "golden_seed": str(SEED), "golden_torch": torch.__version__,
            "transformers_commit": "897753a012bfa6dac8c0ae3281f23a2fc1e72db6"}
    only = [v for v in os.environ.get("GOLDEN_VARIANTS", "").split(",") if v]
    for vi, (name, overrides, storage) in enumerate(VARIANTS):
        if only and name not in only:
            continue
        cfg = cfg_of(overrides)
        if name == "nh_bf16":  # transformers' __init__ spellings
            for a, b in [("n_groups", "mamba_n_groups"), ("conv_kernel", "mamba_d_conv"), ("chunk_size", "mamba_chunk_size")]:
                cfg[b] = cfg.pop(a)
        for attempt in range(100):
            g = torch.Generator().manual_seed(SEED + 100 * vi + attempt)
            W = init_weights(cfg, g)
            stored = {k: gm.to_dtype(v, storage) if not k.endswith("e_score_correction_bias") else v.float() for k, v in W.items()}
            P = {k: v.double().clone().requires_grad_(True) for k, v in stored.items()}
            V = cfg["vocab_size"]
            tokens = torch.randint(0, V, (sum(SEQ_LENS),), generator=g)
            cu = [0]
            for n in SEQ_LENS:
                cu.append(cu[-1] + n)
            coef = torch.randn(len(tokens), generator=g, dtype=torch.float64)
            lp, ent, routes = forward(P, cfg, tokens, cu, TEMPERATURE)
            margin = min([r[2] for rs in routes.values() for r in rs] + [math.inf])
            if margin > MARGIN:
                break
        else:
            raise SystemExit("%s: no draw with a choice margin above %g" % (name, MARGIN))
        loss = (coef * lp).sum()
        loss.backward()
        d = os.path.join(gm.OUT, name)
        os.makedirs(d, exist_ok=True)
        gm.save(os.path.join(d, "model.safetensors"), stored, meta)
        with open(os.path.join(d, "config.json"), "w") as f:
            json.dump(cfg, f, indent=2, sort_keys=True)  # Python's json: Infinity where time_step_limit has it
            f.write("\n")
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
            gold["grad." + pname] = (p.grad if p.grad is not None else torch.zeros_like(p)).float()
        for l, rs in routes.items():
            gold["route.L%d.experts" % l] = torch.cat([r[0] for r in rs]).to(torch.int32)
            gold["route.L%d.weights" % l] = torch.cat([r[1] for r in rs]).detach().float()
        gm.save(os.path.join(d, "golden.safetensors"), gold, dict(meta, variant=name, choice_margin="%.3g" % margin))
        print("%s: loss %.6f, %d tokens, %d sequences, choice margin %.3g (draw %d)" % (name, loss.item(), len(tokens), len(SEQ_LENS), margin, attempt))


if __name__ == "__main__":
    main()
