#!/usr/bin/python3
"""Writes model/testdata/mtp_* goldens: a tiny Nemotron-3-Super-shaped
Nemotron-H (Mamba-2, attention, latent MoE) with multi-token prediction
written here from Megatron-Core's code, independently of the Go code, with
Debian's torch, in float64.

The main model is scripts/golden_nemotronh.py's (transformers'
NemotronHForCausalLM; imported). The MTP is Megatron-LM's
megatron/core/transformer/multi_token_prediction.py at
d98e8a64ddf34856e74b24714e3bedb2f5a39553, for one packed micro-batch:

  roll_tensor(shifts=-1) of a packed sequence moves every element one
    place left within the sequence and zeroes its last (the packed-sequence
    branch, _roll_tensor_packed_seq);
  hidden_states: the main model's output after norm_f (hybrid_model.py's
    decoder output, post_layer_norm);
  depth j = 1..D (MultiTokenPredictionBlock.forward):
    input_ids rolled once more (_get_embeddings), decoder_input =
    embedding(input_ids), detached with mtp_detach_heads;
    h = eh_proj(cat(enorm(decoder_input), hnorm(hidden_states))) (the
    embedding first, _concat_embeddings);
    the pattern's blocks (HybridStack, post_layer_norm False): x = x +
    mixer(norm(x)) each; then final_layernorm (_postprocess); that is the
    next depth's hidden_states; with mtp_use_repeated_layer every depth runs
    layer 0 (_build_layers); with mtp_detach_heads the main hidden states
    entering depth 1 are detached (forward) and the output weight is
    detached (process_mtp_loss);
  process_mtp_loss with labels None (NeMo RL's GRPO): labels = input_ids
    rolled once, loss_mask = NeMo RL's mtp_loss_mask (token_mask ·
    sample_mask) rolled once, original_num_tokens N0 = its sum; per depth
    labels and loss_mask rolled once more, num_tokens N_j = the mask's sum,
    mtp_loss = mask · cross_entropy(logits, labels) (logits at temperature
    1), scaled by mtp_loss_scaling_factor / mtp_num_layers · N0 / max(N_j, 1)
    (calculate_per_token_loss, as NeMo RL runs Megatron), and its gradient
    by MTPLossAutoScaler's scale, NeMo RL's mtp_grad_scale_func
    1 / global_valid_toks (megatron_policy_worker.py), global_valid_toks =
    Σ token_mask[:, 1:] · sample_mask (here one micro-batch on one rank, so
    G = N0).

The loss differentiated is L = Σ coef·logprob (the main head, at the
temperature) + Σ_j Σ_i w_j·mask_j[i]·CE_j[i] with w_j the scale above.

Variants (pattern "*E" with Super's latent MoE; backbone "ME*E"):
  mtp_rep_det  2 depths, one block repeated, detached (Super's recipes)
  mtp_rep      2 depths, repeated, not detached
  mtp_sep_det  2 depths, a block each, detached
  mtp_sep      2 depths, a block each, not detached
  mtp_e3       pattern "E", 3 depths, repeated, not detached, BF16 weights,
               group-limited routing

golden.safetensors: tokens, cu_seqlens, temperature, coef, mask (the MTP
loss mask per token), mtp (depths, repeated, detach, scaling factor),
logprob, entropy, mtp.lp.<j> (depth j's log-probability of token t at t,
0 where it predicts nothing), mtp.coef.<j> (∂L/∂mtp.lp.<j>), loss,
grad.NAME for every parameter.

Run: /usr/bin/python3 scripts/golden_mtp.py   (or `make golden`)
"""
import json
import math
import os
import sys

import torch

sys.dont_write_bytecode = True
sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
import golden_model as gm  # noqa: E402
import golden_nemotronh as nh  # noqa: E402

SEED = 20261302
SCRIPT = "scripts/golden_mtp.py"
SEQ_LENS = [7, 2, 11, 1, 9]
TEMPERATURE = 0.8
MEGATRON = "d98e8a64ddf34856e74b24714e3bedb2f5a39553"

SUPER = dict(nh.BASE, hybrid_override_pattern="ME*E", moe_latent_size=16, num_experts_per_tok=3,
             routed_scaling_factor=2.5, mtp_hybrid_override_pattern="*E")

# name, config overrides, storage, (depths, repeated, detach, scale)
VARIANTS = [
    ("mtp_rep_det", {"num_nextn_predict_layers": 1}, "F32", (2, True, True, 0.3)),
    ("mtp_rep", {"num_nextn_predict_layers": 1}, "F32", (2, True, False, 0.3)),
    ("mtp_sep_det", {"num_nextn_predict_layers": 2}, "F32", (2, False, True, 0.5)),
    ("mtp_sep", {"num_nextn_predict_layers": 2}, "F32", (2, False, False, 0.3)),
    ("mtp_e3", {"num_nextn_predict_layers": 1, "mtp_hybrid_override_pattern": "E", "n_routed_experts": 16,
                "num_experts_per_tok": 4, "n_group": 4, "topk_group": 2, "torch_dtype": "bfloat16"}, "BF16", (3, True, False, 0.7)),
]

KIND = {"M": "mamba", "*": "attention", "-": "mlp", "E": "moe"}


def mtp_shapes(cfg, blocks):
    """mtp.layers.{j·P+b}.*: Megatron-Bridge's flattened names
    (nemotron_h_bridge.py: eh_proj, enorm, hnorm on the first block of a
    depth, final_layernorm on its last, the mixer's names as the main
    layers')."""
    C = cfg["hidden_size"]
    pat = cfg["mtp_hybrid_override_pattern"]
    sub = dict(cfg, hybrid_override_pattern=pat)
    sub.pop("layers_block_type", None)
    one = [(n, s) for n, s in nh.param_shapes(sub) if n.startswith("backbone.layers.")]
    shapes = []
    for j in range(blocks):
        for b in range(len(pat)):
            i = j * len(pat) + b
            p = "mtp.layers.%d." % i
            if b == 0:
                shapes += [(p + "enorm.weight", (C,)), (p + "hnorm.weight", (C,)), (p + "eh_proj.weight", (C, 2 * C))]
            pre = "backbone.layers.%d." % b
            shapes += [(p + n[len(pre):], s) for n, s in one if n.startswith(pre)]
            if b == len(pat) - 1:
                shapes.append((p + "final_layernorm.weight", (C,)))
    return shapes


def roll(t):
    """roll_tensor(shifts=-1) of one sequence: one place left, last zeroed."""
    out = torch.roll(t, -1, 0).clone()
    out[-1:] = 0
    return out


def block(P, cfg, kind, p, x, routes, key):
    h = nh.rms_norm(x, P[p + "norm.weight"], cfg["layer_norm_epsilon"])
    m = p + "mixer."
    if kind == "mamba":
        return x + nh.mamba(P, m, cfg, h)
    if kind == "attention":
        return x + nh.attention(P, m, cfg, h)
    if kind == "mlp":
        return x + nh.mlp(P, m, h)
    return x + nh.moe(P, m, cfg, h, routes.setdefault(key, []))


def forward_seq(P, cfg, toks, routes, shape):
    """The main model (golden_nemotronh's) and its normed hidden states."""
    eps = cfg["layer_norm_epsilon"]
    x = P["backbone.embeddings.weight"][toks]
    for l, kind in enumerate(nh.blocks(cfg)):
        x = block(P, cfg, kind, "backbone.layers.%d." % l, x, routes, ("L", l))
    h0 = nh.rms_norm(x, P["backbone.norm_f.weight"], eps)
    return h0, h0 @ P["lm_head.weight"].T


def mtp_seq(P, cfg, toks, h0, shape, routes):
    """Every depth's log-probabilities of one sequence (n tokens): lp[j][t]
    is depth j+1's log-probability of toks[t] (t ≥ j+2), as logits at
    position t−j−2."""
    D, repeated, detach, _ = shape
    eps = cfg["layer_norm_epsilon"]
    pat = [KIND[c] for c in cfg["mtp_hybrid_override_pattern"]]
    Pn = len(pat)
    n = len(toks)
    head = P["lm_head.weight"].detach() if detach else P["lm_head.weight"]
    emb = P["backbone.embeddings.weight"]
    hidden = h0.detach() if detach else h0
    ids = toks.clone()
    out = []
    for j in range(D):
        phys = 0 if repeated else j
        q = "mtp.layers.%d." % (phys * Pn)
        ids = roll(ids)
        e = emb[ids]
        if detach:
            e = e.detach()
        u = torch.cat([nh.rms_norm(e, P[q + "enorm.weight"], eps), nh.rms_norm(hidden, P[q + "hnorm.weight"], eps)], -1)
        x = u @ P[q + "eh_proj.weight"].T
        for b, kind in enumerate(pat):
            x = block(P, cfg, kind, "mtp.layers.%d." % (phys * Pn + b), x, routes, ("M", j, b))
        hidden = nh.rms_norm(x, P["mtp.layers.%d.final_layernorm.weight" % (phys * Pn + Pn - 1)], eps)
        logp = torch.log_softmax(hidden @ head.T, -1)
        lp = torch.zeros(n, dtype=torch.float64)
        k = j + 2  # position i predicts token i+k
        if n > k:
            lp = torch.cat([lp[:k], logp[: n - k].gather(1, toks[k:, None]).squeeze(1)])
        out.append(lp)
    return out


def main():
    meta = {"format": "pt", "golden_script": SCRIPT, "golden_seed": str(SEED), "golden_torch": torch.__version__,
            "megatron_commit": MEGATRON, "transformers_commit": "897753a012bfa6dac8c0ae3281f23a2fc1e72db6"}
    only = [v for v in os.environ.get("GOLDEN_VARIANTS", "").split(",") if v]
    for vi, (name, overrides, storage, shape) in enumerate(VARIANTS):
        if only and name not in only:
            continue
        D, repeated, detach, scale = shape
        cfg = dict(SUPER)
        cfg.update(overrides)
        for attempt in range(200):
            g = torch.Generator().manual_seed(SEED + 100 * vi + attempt)
            W = nh.init_weights(cfg, g)
            # MTP weights drawn as golden_nemotronh draws any weight of the name's kind.
            Wm = {}
            for n_, s_ in mtp_shapes(cfg, cfg["num_nextn_predict_layers"]):
                if n_.endswith("e_score_correction_bias"):
                    Wm[n_] = 0.05 * torch.randn(s_, generator=g, dtype=torch.float64)
                elif len(s_) == 1:
                    Wm[n_] = 1.0 + 0.2 * torch.randn(s_, generator=g, dtype=torch.float64)
                elif n_.endswith("gate.weight"):
                    Wm[n_] = 2.0 * torch.randn(s_, generator=g, dtype=torch.float64) / s_[1] ** 0.5
                else:
                    Wm[n_] = torch.randn(s_, generator=g, dtype=torch.float64) / s_[-1] ** 0.5
            W.update(Wm)
            stored = {k: gm.to_dtype(v, storage) if not k.endswith("e_score_correction_bias") else v.float() for k, v in W.items()}
            P = {k: v.double().clone().requires_grad_(True) for k, v in stored.items()}
            V = cfg["vocab_size"]
            tokens = torch.randint(0, V, (sum(SEQ_LENS),), generator=g)
            cu = [0]
            for n in SEQ_LENS:
                cu.append(cu[-1] + n)
            coef = torch.randn(len(tokens), generator=g, dtype=torch.float64)
            mask = (torch.rand(len(tokens), generator=g) < 0.7).to(torch.float64)
            for s in range(len(SEQ_LENS)):
                mask[cu[s]] = 0  # never a loss position (NeMo RL's token_mask[:, 0])
            routes = {}
            lps, ents, mtps = [], [], [[] for _ in range(D)]
            for s in range(len(SEQ_LENS)):
                toks = tokens[cu[s]:cu[s + 1]]
                h0, logits = forward_seq(P, cfg, toks, routes, shape)
                logp = torch.log_softmax(logits / TEMPERATURE, -1)
                n = len(toks)
                lp = torch.zeros(n, dtype=torch.float64)
                ent = torch.zeros(n, dtype=torch.float64)
                if n > 1:
                    lp = torch.cat([lp[:1], logp[:-1].gather(1, toks[1:, None]).squeeze(1)])
                    ent = torch.cat([ent[:1], (-(logp.exp() * logp).sum(-1))[:-1]])
                lps.append(lp)
                ents.append(ent)
                for j, x in enumerate(mtp_seq(P, cfg, toks, h0, shape, routes)):
                    mtps[j].append(x)
            margin = min([r[2] for rs in routes.values() for r in rs] + [math.inf])
            if margin > nh.MARGIN:
                break
        else:
            raise SystemExit("%s: no draw with a choice margin above %g" % (name, nh.MARGIN))
        lp, ent = torch.cat(lps), torch.cat(ents)
        # process_mtp_loss's counts on the packed micro-batch: the mask rolled
        # once (N0), then once more per depth (N_j); G = Σ token_mask[:, 1:].
        def rolled(t, times):
            parts = []
            for s in range(len(SEQ_LENS)):
                x = t[cu[s]:cu[s + 1]]
                for _ in range(times):
                    x = roll(x)
                parts.append(x)
            return torch.cat(parts)
        N0 = rolled(mask, 1).sum().item()
        G = sum(mask[cu[s] + 1:cu[s + 1]].sum().item() for s in range(len(SEQ_LENS)))
        assert N0 == G
        loss = (coef * lp).sum()
        mcoefs = []
        for j in range(D):
            mj = rolled(mask, j + 2)  # at position i: the mask of token i+j+2
            Nj = mj.sum().item()
            w = scale / D * N0 / max(Nj, 1) / max(G, 1)
            # The depth's CE at position i is −lp of token i+j+2: mask and
            # lp aligned by the token predicted.
            mt = torch.zeros(len(tokens), dtype=torch.float64)
            for s in range(len(SEQ_LENS)):
                lo, hi = cu[s], cu[s + 1]
                mt[lo + j + 2:hi] = mask[lo + j + 2:hi]
            assert mt.sum().item() == Nj
            lpj = torch.cat(mtps[j])
            loss = loss + w * (mt * -lpj).sum()
            mcoefs.append(-w * mt)
        loss.backward()
        d = os.path.join(gm.OUT, name)
        os.makedirs(d, exist_ok=True)
        gm.save(os.path.join(d, "model.safetensors"), stored, meta)
        with open(os.path.join(d, "config.json"), "w") as f:
            json.dump(cfg, f, indent=2, sort_keys=True)
            f.write("\n")
        gold = {
            "tokens": tokens.to(torch.int32),
            "cu_seqlens": torch.tensor(cu, dtype=torch.int32),
            "temperature": torch.tensor([TEMPERATURE], dtype=torch.float32),
            "coef": coef.float(),
            "mask": mask.to(torch.int32),
            "mtp": torch.tensor([D, int(repeated), int(detach)], dtype=torch.int32),
            "mtp_scale": torch.tensor([scale], dtype=torch.float32),
            "logprob": lp.detach().float(),
            "entropy": ent.detach().float(),
            "loss": loss.detach().float().reshape(1),
        }
        for j in range(D):
            gold["mtp.lp.%d" % (j + 1)] = torch.cat(mtps[j]).detach().float()
            gold["mtp.coef.%d" % (j + 1)] = mcoefs[j].float()
        for pname, p in P.items():
            gold["grad." + pname] = (p.grad if p.grad is not None else torch.zeros_like(p)).float()
        gm.save(os.path.join(d, "golden.safetensors"), gold, dict(meta, variant=name, choice_margin="%.3g" % margin))
        print("%s: loss %.6f, %d tokens, %d depths (repeated %s, detach %s), choice margin %.3g (draw %d)"
              % (name, loss.item(), len(tokens), D, repeated, detach, margin, attempt))


if __name__ == "__main__":
    main()
