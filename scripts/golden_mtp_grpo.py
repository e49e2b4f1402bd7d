#!/usr/bin/python3
"""Writes trainer/testdata/mtp_grpo: two GRPO steps of a tiny
Nemotron-3-Super-shaped Nemotron-H (Mamba-2, attention, latent MoE) with
multi-token prediction as Super's recipes train it (2 depths of the "*E"
block, mtp_use_repeated_layer, mtp_detach_heads, mtp_loss_scaling_factor
0.3, freeze_moe_router), computed here in float64 from independent
references, for the trainer's golden test (TestMTPGRPOGolden).

The pieces:
  model       golden_mtp.forward_seq / mtp_seq: the main model from
              transformers' NemotronHForCausalLM (golden_nemotronh) and the
              MTP depths from Megatron-Core's multi_token_prediction.py,
              each trace its own sequence; main logprobs at temperature 1;
  advantages  golden_grpo.torch_advantages (leave-one-out, normalised);
  loss        golden_grpo.torch_loss (NeMo RL's ClippedPGLossFn,
              token-level, over the step's G_tok), chained into the model by
              autograd, plus the MTP term: per depth k,
              mtp_loss_scaling_factor / mtp_num_layers · Σ CE / N_k over
              the step's depth-k targets (an eligible token — training mask
              on — at position ≥ k+1 of its trace; N_k their count over the
              whole step): Megatron's per-micro-batch formula
              (process_mtp_loss under calculate_per_token_loss, scaled by
              NeMo RL's 1/global_valid_toks) on one micro-batch, with the
              step's counts — see trainer/mtp.go for the reading;
  optimizer   torch.optim.AdamW (decay on 2-D parameters), the backbone's
              routers frozen (freeze_moe_router: not in the optimizer, the
              norm or the update; the MTP block's router trains, as NeMo
              RL's freeze_moe_router only walks decoder.layers), the
              selection biases buffers; clipping as Megatron's
              clip_grad_norm with the MTP parameters in their own
              grad_norm_group: each set clipped to max_grad_norm by its own
              norm; grad_norm is the main set's.

Each step's rollouts are three task groups of four; half of the rollouts
make two calls (the second's prompt holds the first call's prompt and
generation and a tool turn), which the per_request builder turns into two
traces (the second trace masks the first call's tokens: they are owned by
the first trace, no new samples for the main loss nor the MTP loss).

Output: config.json and model.safetensors (float32), golden.json (the
rollouts, the --set values, per step loss, grad_norm, mtp_grad_norm,
mtp_loss per depth, lr, eligible and train tokens), golden.safetensors
(every parameter after each step, step1.NAME and step2.NAME).

Run: /usr/bin/python3 scripts/golden_mtp_grpo.py   (or `make golden`)
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
import golden_nemotronh as nh  # noqa: E402
import golden_optim as go  # noqa: E402

torch.set_default_dtype(torch.float64)

SEED = 20261304
SCRIPT = "scripts/golden_mtp_grpo.py"
OUT = os.path.join(os.path.dirname(os.path.abspath(__file__)), "..", "trainer", "testdata", "mtp_grpo")

CFG = dict(gmtp.SUPER, num_nextn_predict_layers=1)
SHAPE = (2, True, True, 0.3)  # depths, repeated, detach, scale
GROUPS, PER_GROUP, STEPS = 3, 4, 2
MAX_LEN, MICRO = 40, 1
ADAM = {"lr": 1e-3, "beta1": 0.9, "beta2": 0.99, "eps": 1e-4, "weight_decay": 0.01, "clip": 1.0}

SETS = {
    "grpo.num_prompts_per_step": GROUPS,
    "grpo.num_generations_per_prompt": PER_GROUP,
    "policy.train_micro_batch_size": MICRO,
    "policy.max_total_sequence_length": MAX_LEN,
    "loss_fn.reference_policy_kl_penalty": 0,
    "policy.megatron_cfg.optimizer.lr": ADAM["lr"],
    "policy.megatron_cfg.optimizer.adam_beta1": ADAM["beta1"],
    "policy.megatron_cfg.optimizer.adam_beta2": ADAM["beta2"],
    "policy.megatron_cfg.optimizer.adam_eps": ADAM["eps"],
    "policy.megatron_cfg.optimizer.weight_decay": ADAM["weight_decay"],
    "policy.megatron_cfg.scheduler.start_weight_decay": ADAM["weight_decay"],
    "policy.megatron_cfg.scheduler.end_weight_decay": ADAM["weight_decay"],
    "policy.megatron_cfg.scheduler.lr_decay_style": "constant",
    "policy.megatron_cfg.scheduler.lr_warmup_iters": 0,
    "policy.max_grad_norm": ADAM["clip"],
    "policy.megatron_cfg.freeze_moe_router": True,
    "policy.megatron_cfg.mtp_num_layers": SHAPE[0],
    "policy.megatron_cfg.mtp_use_repeated_layer": SHAPE[1],
    "policy.megatron_cfg.mtp_detach_heads": SHAPE[2],
    "policy.megatron_cfg.mtp_loss_scaling_factor": SHAPE[3],
    "env.nemo_gym.token_id_capture.builder": "per_request",
}


def make_rollouts(rng, V):
    out = []
    for task in range(GROUPS):
        base = [rng.randrange(V) for _ in range(rng.randint(3, 5))]
        rewards = rng.sample([0.0, 0.25, 0.5, 0.75, 1.0], PER_GROUP)
        for i in range(PER_GROUP):
            prompt = base + [rng.randrange(V) for _ in range(rng.randint(1, 3))]
            gen = [rng.randrange(V) for _ in range(rng.randint(2, 6))]
            calls = [dict(prompt=prompt, generation=gen, generation_logprobs=[math.log(rng.uniform(0.05, 0.9)) for _ in gen])]
            if i % 2 == 1:  # a tool turn, then a second call over the whole context
                tool = [rng.randrange(V) for _ in range(rng.randint(1, 3))]
                gen2 = [rng.randrange(V) for _ in range(rng.randint(2, 5))]
                calls.append(dict(prompt=prompt + gen + tool, generation=gen2,
                                  generation_logprobs=[math.log(rng.uniform(0.05, 0.9)) for _ in gen2]))
            out.append(dict(task=task, index=i, calls=calls, reward=rewards[i]))
    return out


MARGINS = []


def row_forward(P, row):
    """The main logprobs (entry t: log p(token t | earlier), 0 at t=0) and
    each depth's (entry t: depth k's log-probability of token t) of one
    trace."""
    toks = torch.tensor(row["tokens"])
    routes = {}
    h0, logits = gmtp.forward_seq(P, CFG, toks, routes, SHAPE)
    logp = torch.log_softmax(logits, -1)
    lp = torch.cat([torch.zeros(1), logp[:-1].gather(1, toks[1:, None]).squeeze(1)])
    mtps = gmtp.mtp_seq(P, CFG, toks, h0, SHAPE, routes)
    MARGINS.append(min([r[2] for rs in routes.values() for r in rs] + [math.inf]))
    return lp, mtps


def main():
    torch.set_num_threads(1)
    rng = random.Random(SEED)
    g = torch.Generator().manual_seed(SEED)
    W = nh.init_weights(CFG, g)
    for name, shape in gmtp.mtp_shapes(CFG, 1):
        if name.endswith("e_score_correction_bias"):
            W[name] = 0.05 * torch.randn(shape, generator=g)
        elif len(shape) == 1:
            W[name] = 1.0 + 0.2 * torch.randn(shape, generator=g)
        elif name.endswith("gate.weight"):
            W[name] = 2.0 * torch.randn(shape, generator=g) / shape[1] ** 0.5
        else:
            W[name] = torch.randn(shape, generator=g) / shape[-1] ** 0.5
    stored = {k: v.float() for k, v in W.items()}
    os.makedirs(OUT, exist_ok=True)
    meta = {"format": "pt", "golden_script": SCRIPT, "golden_seed": str(SEED), "golden_torch": torch.__version__,
            "megatron_commit": gmtp.MEGATRON}
    gm.save(os.path.join(OUT, "model.safetensors"), stored, meta)
    with open(os.path.join(OUT, "config.json"), "w") as f:
        json.dump(CFG, f, indent=2, sort_keys=True)
        f.write("\n")
    names = list(stored)
    P = {k: v.double().clone().requires_grad_(True) for k, v in stored.items()}
    frozen = lambda k: k.endswith("e_score_correction_bias") or (k.startswith("backbone.") and k.endswith("mixer.gate.weight"))
    train = [k for k in names if not frozen(k)]
    decay = [P[k] for k in train if P[k].dim() >= 2]
    nodecay = [P[k] for k in train if P[k].dim() < 2]
    opt = torch.optim.AdamW([{"params": decay}, {"params": nodecay, "weight_decay": 0.0}], lr=ADAM["lr"],
                            betas=(ADAM["beta1"], ADAM["beta2"]), eps=ADAM["eps"], weight_decay=ADAM["weight_decay"])
    sched = go.MegatronScheduler(dict(
        lr=ADAM["lr"], min_lr=1e-4, lr_warmup_init=1e-4, lr_warmup_iters=0, lr_warmup_fraction=None,
        lr_decay_iters=300, lr_decay_style="constant", start_weight_decay=ADAM["weight_decay"],
        end_weight_decay=ADAM["weight_decay"], weight_decay_incr_style="constant", train_iters=300,
        train_global_batch_size=GROUPS * PER_GROUP))
    o = gg.base_options()
    o.update(reference_policy_kl_penalty=0.0, ratio_clip_min=0.2, ratio_clip_max=0.2)
    D, _, _, scale = SHAPE
    golden = {"script": SCRIPT, "seed": SEED, "torch": torch.__version__, "sets": SETS, "steps": []}
    after = {}
    for step in range(1, STEPS + 1):
        rollouts = make_rollouts(rng, CFG["vocab_size"])
        adv = gg.torch_advantages([r["task"] for r in rollouts], [r["reward"] for r in rollouts],
                                  [1] * len(rollouts), True, True, None, None)["advantage"]
        rows = []  # per_request: one trace per call, in call order
        for r, a in zip(rollouts, adv):
            for c in r["calls"]:
                toks = c["prompt"] + c["generation"]
                assert len(toks) <= MAX_LEN
                rows.append(dict(tokens=toks, mask=[0] * len(c["prompt"]) + [1] * len(c["generation"]),
                                 glp=[0.0] * len(c["prompt"]) + c["generation_logprobs"], advantage=a))
        g_tok = sum(sum(r["mask"][1:]) for r in rows)
        t_step = sum(len(r["tokens"]) for r in rows)
        N = [sum(1 for r in rows for t, m in enumerate(r["mask"]) if m and t >= k + 1) for k in range(1, D + 1)]
        lps, mtps = [], []
        for row in rows:
            lp, m = row_forward(P, row)
            lps.append(lp)
            mtps.append(m)
        loss_rows = [dict(lp=lps[r].detach().tolist(), lp_old=lps[r].detach().tolist(), lp_gen=row["glp"],
                          lp_ref=lps[r].detach().tolist(), mask=row["mask"], sample_mask=1.0, advantage=row["advantage"])
                     for r, row in enumerate(rows)]
        res = gg.torch_loss(loss_rows, g_tok, o)
        total = sum((lps[r] * torch.tensor(res["dlp"][r])).sum() for r in range(len(rows)))
        ce = [0.0] * D
        for k in range(D):
            term = 0.0
            for r, row in enumerate(rows):
                mk = torch.tensor([1.0 if (m and t >= k + 2) else 0.0 for t, m in enumerate(row["mask"])])
                x = -(mk * mtps[r][k]).sum()
                term = term + x
                ce[k] += float(x)
            total = total + scale / D * term / max(N[k], 1)
        opt.zero_grad()
        total.backward()
        main = [P[k] for k in train if not k.startswith("mtp.")]
        mtp = [P[k] for k in train if k.startswith("mtp.")]
        norm = float(torch.nn.utils.clip_grad_norm_(main, ADAM["clip"]))
        mnorm = float(torch.nn.utils.clip_grad_norm_(mtp, ADAM["clip"]))
        lr, wd = sched.get_lr(), sched.get_wd()
        for grp in opt.param_groups:
            grp["lr"] = lr
        opt.param_groups[0]["weight_decay"] = wd
        opt.step()
        sched.step(GROUPS * PER_GROUP)
        m = res["metrics"]
        golden["steps"].append(dict(
            rollouts=rollouts, loss=res["loss"], grad_norm=norm, mtp_grad_norm=mnorm,
            mtp_loss=[ce[k] / max(N[k], 1) for k in range(D)], mtp_targets=N, lr=lr,
            eligible_tokens=m["eligible_tokens"], train_tokens=t_step))
        for k in names:
            after["step%d.%s" % (step, k)] = P[k].detach().float()
        print("step %d: %d traces, loss %.6g, grad_norm %.6g, mtp_grad_norm %.6g, mtp_loss %s, targets %s"
              % (step, len(rows), res["loss"], norm, mnorm, ["%.5f" % (ce[k] / N[k]) for k in range(D)], N))
    m = min(MARGINS)
    assert m > nh.MARGIN, "a near-tie in the routing: %g" % m
    print("smallest choice margin %.3g" % m)
    gm.save(os.path.join(OUT, "golden.safetensors"), after, meta)
    with open(os.path.join(OUT, "golden.json"), "w") as f:
        json.dump(golden, f, indent=1)
        f.write("\n")


if __name__ == "__main__":
    main()
