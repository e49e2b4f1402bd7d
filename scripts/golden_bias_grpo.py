#!/usr/bin/python3
"""Writes trainer/testdata/bias_grpo/<variant>: two GRPO steps of a tiny
Nemotron-H with aux-loss-free load balancing (Megatron-Core's expert-bias
update, policy.megatron_cfg.moe_router_bias_update_rate), computed here in
float64 from independent references, for the trainer's golden test
(TestExpertBiasGRPOGolden).

The pieces are scripts/golden_mtp_grpo.py's (imported: transformers'
NemotronHForCausalLM from golden_nemotronh, Megatron's MTP from golden_mtp,
NeMo RL's advantages and loss from golden_grpo, torch's AdamW, Megatron's
clipping), with the recipes' freeze_moe_router (the backbone's router
weights not trained; the MTP block's trained) and the update written here
from Megatron-LM d98e8a64ddf34856e74b24714e3bedb2f5a39553:

  counting    TopKRouter._apply_expert_bias (router.py:733-744): every
              training forward adds each token's routing_map row (its K
              chosen experts) to local_tokens_per_expert, float32; each
              trace is its own sequence here, so a token shared by k traces
              counts k times; every router counts, the MTP block's too
              (each depth's pass through the repeated block adds to its one
              router);
  update      finalize_model_grads._update_router_expert_bias
              (finalize_model_grads.py:334-371), once per step after the
              backward, over every router not frozen_expert_bias
              (freeze_moe_router leaves that False): get_updated_expert_bias
              (moe_utils.py:1199-1226), average = Σ_e tokens / E, bias +=
              sign(average − tokens) · rate, all in float32; then the counts
              restart (reset_model_temporary_tensors);
  the bias    a buffer: no gradient, no decay, not in the optimizer nor the
              gradient norm; the choice of experts reads it (score +
              bias, golden_nemotronh.choose), the weights do not.

Variants:
  mtp   Super-shaped (Mamba-2, attention, latent MoE; an MTP "*E" block
        repeated over 2 detached depths, scaling 0.3): the MTP block's
        router's bias updates too;
  nano  Nano-shaped MoE without MTP: 16 experts, 4 per token, group-limited
        routing (4 groups, top 2), not latent.

Each step's rollouts are golden_mtp_grpo's (three task groups of four, half
of them two calls, the per_request builder's two traces). The rate is large
enough that step 2's choice of experts differs from step 1's weights' for
some tokens (golden.json: flips), and every choice keeps a margin above
golden_nemotronh.MARGIN.

Output per variant: config.json and model.safetensors (float32),
golden.json (the rollouts, the --set values, per step loss, grad_norm,
lr, eligible and train tokens, and each router's counts), golden.safetensors
(every parameter after each step, step1.NAME and step2.NAME).

Run: /usr/bin/python3 scripts/golden_bias_grpo.py   (or `make golden`)
"""
import json
import math
import os
import random
import sys

import torch

sys.dont_write_bytecode = True
sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
import golden_grpo as gg  # noqa: E402
import golden_model as gm  # noqa: E402
import golden_mtp as gmtp  # noqa: E402
import golden_mtp_grpo as gmg  # noqa: E402
import golden_nemotronh as nh  # noqa: E402
import golden_optim as go  # noqa: E402

torch.set_default_dtype(torch.float64)

SCRIPT = "scripts/golden_bias_grpo.py"
OUT = os.path.join(os.path.dirname(os.path.abspath(__file__)), "..", "trainer", "testdata", "bias_grpo")
RATE = 0.01
BIAS = "mixer.gate.e_score_correction_bias"

NANO = dict(nh.BASE, hybrid_override_pattern="ME*E", n_routed_experts=16, num_experts_per_tok=4, n_group=4,
            topk_group=2, routed_scaling_factor=2.5)

# name, seed, config, MTP shape (depths, repeated, detach, scale) or None
VARIANTS = [
    ("mtp", 20261405, gmg.CFG, gmg.SHAPE),
    ("nano", 20261413, NANO, None),
]


def sets_of(shape):
    s = {k: v for k, v in gmg.SETS.items() if not k.startswith("policy.megatron_cfg.mtp_")}
    s["policy.megatron_cfg.moe_router_enable_expert_bias"] = True
    s["policy.megatron_cfg.moe_router_bias_update_rate"] = RATE
    s["policy.megatron_cfg.moe_router_load_balancing_type"] = "none"
    s["policy.megatron_cfg.moe_aux_loss_coeff"] = 0
    if shape is not None:
        for k, v in gmg.SETS.items():
            if k.startswith("policy.megatron_cfg.mtp_"):
                s[k] = v
    return s


def bias_name(cfg, shape, key):
    """The bias a route key's router reads: ("L", l) or l a backbone layer,
    ("M", j, b) depth j's block b (the repeated block's for every depth)."""
    if isinstance(key, int):
        return "backbone.layers.%d.%s" % (key, BIAS)
    if key[0] == "L":
        return "backbone.layers.%d.%s" % (key[1], BIAS)
    _, j, b = key
    Pn = len(cfg["mtp_hybrid_override_pattern"])
    phys = 0 if shape[1] else j
    return "mtp.layers.%d.%s" % (phys * Pn + b, BIAS)


def row_forward(P, cfg, shape, row, counts, margins):
    """Main logprobs (entry t: log p(token t | earlier), 0 at t=0), each
    MTP depth's, and the trace's routing added to counts."""
    toks = torch.tensor(row["tokens"])
    routes = {}
    mtps = []
    if shape is None:
        logits = nh.forward_seq(P, cfg, toks, routes)
    else:
        h0, logits = gmtp.forward_seq(P, cfg, toks, routes, shape)
        mtps = gmtp.mtp_seq(P, cfg, toks, h0, shape, routes)
    logp = torch.log_softmax(logits, -1)
    lp = torch.cat([torch.zeros(1), logp[:-1].gather(1, toks[1:, None]).squeeze(1)])
    E = cfg["n_routed_experts"]
    for key, rs in routes.items():
        name = bias_name(cfg, shape, key)
        for idx, _, margin in rs:
            counts[name] += torch.bincount(idx.reshape(-1), minlength=E).float()
            margins.append(margin)
    return lp, mtps


def updated_expert_bias(tokens_per_expert, expert_bias, rate):
    """Megatron's get_updated_expert_bias on one rank (its all-reduce is the
    identity): float32 throughout."""
    with torch.no_grad():
        average_tokens = tokens_per_expert.sum(dim=-1, keepdim=True) / tokens_per_expert.shape[-1]
        offset = average_tokens - tokens_per_expert
        return expert_bias + torch.sign(offset) * rate


def run(name, seed, cfg, shape):
    out = os.path.join(OUT, name)
    rng = random.Random(seed)
    g = torch.Generator().manual_seed(seed)
    W = nh.init_weights(cfg, g)
    if shape is not None:
        for n_, s_ in gmtp.mtp_shapes(cfg, cfg["num_nextn_predict_layers"]):
            if n_.endswith("e_score_correction_bias"):
                W[n_] = 0.05 * torch.randn(s_, generator=g)
            elif len(s_) == 1:
                W[n_] = 1.0 + 0.2 * torch.randn(s_, generator=g)
            elif n_.endswith("gate.weight"):
                W[n_] = 2.0 * torch.randn(s_, generator=g) / s_[1] ** 0.5
            else:
                W[n_] = torch.randn(s_, generator=g) / s_[-1] ** 0.5
    stored = {k: v.float() for k, v in W.items()}
    os.makedirs(out, exist_ok=True)
    meta = {"format": "pt", "golden_script": SCRIPT, "golden_seed": str(seed), "golden_torch": torch.__version__,
            "megatron_commit": gmtp.MEGATRON}
    gm.save(os.path.join(out, "model.safetensors"), stored, meta)
    with open(os.path.join(out, "config.json"), "w") as f:
        json.dump(cfg, f, indent=2, sort_keys=True)
        f.write("\n")
    names = list(stored)
    biases = [k for k in names if k.endswith(BIAS)]
    P = {k: v.double().clone().requires_grad_(not k.endswith(BIAS)) for k, v in stored.items()}
    frozen = lambda k: k.endswith(BIAS) or (k.startswith("backbone.") and k.endswith("mixer.gate.weight"))
    train = [k for k in names if not frozen(k)]
    A = gmg.ADAM
    decay = [P[k] for k in train if P[k].dim() >= 2]
    nodecay = [P[k] for k in train if P[k].dim() < 2]
    opt = torch.optim.AdamW([{"params": decay}, {"params": nodecay, "weight_decay": 0.0}], lr=A["lr"],
                            betas=(A["beta1"], A["beta2"]), eps=A["eps"], weight_decay=A["weight_decay"])
    sched = go.MegatronScheduler(dict(
        lr=A["lr"], min_lr=1e-4, lr_warmup_init=1e-4, lr_warmup_iters=0, lr_warmup_fraction=None,
        lr_decay_iters=300, lr_decay_style="constant", start_weight_decay=A["weight_decay"],
        end_weight_decay=A["weight_decay"], weight_decay_incr_style="constant", train_iters=300,
        train_global_batch_size=gmg.GROUPS * gmg.PER_GROUP))
    o = gg.base_options()
    o.update(reference_policy_kl_penalty=0.0, ratio_clip_min=0.2, ratio_clip_max=0.2)
    D, scale = (shape[0], shape[3]) if shape is not None else (0, 0.0)
    golden = {"script": SCRIPT, "seed": seed, "torch": torch.__version__, "megatron_commit": gmtp.MEGATRON,
              "rate": RATE, "sets": sets_of(shape), "steps": []}
    after, margins = {}, []
    E = cfg["n_routed_experts"]
    prev_choice = None
    for step in range(1, gmg.STEPS + 1):
        rollouts = gmg.make_rollouts(rng, cfg["vocab_size"])
        adv = gg.torch_advantages([r["task"] for r in rollouts], [r["reward"] for r in rollouts],
                                  [1] * len(rollouts), True, True, None, None)["advantage"]
        rows = []  # per_request: one trace per call, in call order
        for r, a in zip(rollouts, adv):
            for c in r["calls"]:
                toks = c["prompt"] + c["generation"]
                assert len(toks) <= gmg.MAX_LEN
                rows.append(dict(tokens=toks, mask=[0] * len(c["prompt"]) + [1] * len(c["generation"]),
                                 glp=[0.0] * len(c["prompt"]) + c["generation_logprobs"], advantage=a))
        g_tok = sum(sum(r["mask"][1:]) for r in rows)
        t_step = sum(len(r["tokens"]) for r in rows)
        N = [sum(1 for r in rows for t, m in enumerate(r["mask"]) if m and t >= k + 1) for k in range(1, D + 1)]
        counts = {b: torch.zeros(E, dtype=torch.float32) for b in biases}
        lps, mtps = [], []
        for row in rows:
            lp, m = row_forward(P, cfg, shape, row, counts, margins)
            lps.append(lp)
            mtps.append(m)
        loss_rows = [dict(lp=lps[r].detach().tolist(), lp_old=lps[r].detach().tolist(), lp_gen=row["glp"],
                          lp_ref=lps[r].detach().tolist(), mask=row["mask"], sample_mask=1.0, advantage=row["advantage"])
                     for r, row in enumerate(rows)]
        res = gg.torch_loss(loss_rows, g_tok, o)
        total = sum((lps[r] * torch.tensor(res["dlp"][r])).sum() for r in range(len(rows)))
        for k in range(D):
            term = 0.0
            for r, row in enumerate(rows):
                mk = torch.tensor([1.0 if (m and t >= k + 2) else 0.0 for t, m in enumerate(row["mask"])])
                term = term - (mk * mtps[r][k]).sum()
            total = total + scale / D * term / max(N[k], 1)
        opt.zero_grad()
        total.backward()
        for b in biases:
            assert P[b].grad is None, b
        main = [P[k] for k in train if not k.startswith("mtp.")]
        mtp = [P[k] for k in train if k.startswith("mtp.")]
        norm = float(torch.nn.utils.clip_grad_norm_(main, A["clip"]))
        if mtp:
            torch.nn.utils.clip_grad_norm_(mtp, A["clip"])
        # finalize_model_grads: the expert-bias update, then the optimizer.
        stacked = torch.stack([counts[b] for b in biases])
        bias32 = torch.stack([P[b].detach().float() for b in biases])
        new = updated_expert_bias(stacked, bias32, RATE)
        with torch.no_grad():
            for b, v in zip(biases, new):
                P[b].copy_(v.double())
        lr, wd = sched.get_lr(), sched.get_wd()
        for grp in opt.param_groups:
            grp["lr"] = lr
        opt.param_groups[0]["weight_decay"] = wd
        opt.step()
        sched.step(gmg.GROUPS * gmg.PER_GROUP)
        m = res["metrics"]
        golden["steps"].append(dict(
            rollouts=rollouts, loss=res["loss"], grad_norm=norm, lr=lr,
            eligible_tokens=m["eligible_tokens"], train_tokens=t_step,
            counts={b: [int(x) for x in counts[b].tolist()] for b in biases}))
        for k in names:
            after["step%d.%s" % (step, k)] = P[k].detach().float()
        print("%s step %d: %d traces, loss %.6g, grad_norm %.6g, routed %s" % (
            name, step, len(rows), res["loss"], norm, {b.split(".mixer")[0]: int(counts[b].sum()) for b in biases}))
    # How much the update moves the choice: step 2's rollouts routed with
    # the biases before and after step 1's update (the weights after it).
    flips = 0
    with torch.no_grad():
        for row_set in [golden["steps"][1]["rollouts"]]:
            for r in row_set:
                for c in r["calls"]:
                    toks = c["prompt"] + c["generation"]
                    choice = []
                    for bset in ("init", "after"):
                        Q = dict(P)
                        if bset == "init":
                            for b in biases:
                                Q[b] = stored[b].double()
                        counts = {b: torch.zeros(E, dtype=torch.float32) for b in biases}
                        row_forward(Q, cfg, shape, dict(tokens=toks), counts, [])
                        choice.append(torch.stack([counts[b] for b in biases]))
                    flips += int((choice[0] != choice[1]).sum())
    golden["flips"] = flips
    mg = min(margins)
    assert mg > nh.MARGIN, "%s: a near-tie in the routing: %g" % (name, mg)
    assert flips > 0, "%s: the bias update changed no choice of experts" % name
    print("%s: smallest choice margin %.3g; expert counts that the update changed in step 2: %d" % (name, mg, flips))
    gm.save(os.path.join(out, "golden.safetensors"), after, meta)
    with open(os.path.join(out, "golden.json"), "w") as f:
        json.dump(golden, f, indent=1)
        f.write("\n")


def main():
    torch.set_num_threads(1)
    for v in VARIANTS:
        run(*v)


if __name__ == "__main__":
    main()
