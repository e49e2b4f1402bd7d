#!/usr/bin/python3
"""Writes trainer/testdata/moe_grpo: two GRPO steps of a tiny Qwen3-MoE,
computed here in float64 from independent references, for the trainer's
two-step golden test (TestSparseGRPOGolden).

The pieces:
  model       golden_moe.forward (transformers' Qwen3MoeForCausalLM, written
              from its definition), logprobs at temperature 1;
  advantages  golden_grpo.torch_advantages (leave-one-out baseline,
              normalised rewards: the built-in recipe's adv_estimator);
  loss        golden_grpo.torch_loss (NeMo RL's ClippedPGLossFn, token-level,
              k3 KL against the initial weights), its gradient with respect to
              the logprobs chained into the model by autograd;
  router      golden_moe.load_balancing_loss per forward (one micro-batch),
              in the loss as router_aux_loss_coef · Σ_mb (T_mb / T_step) ·
              aux_mb, the token-weighted mean over the step's micro-batches
              (transformers adds it per forward; tracegrpo's step is the sum
              over micro-batches, each weighted by its share of the tokens);
  optimizer   torch.nn.utils.clip_grad_norm_ and torch.optim.AdamW (decay on
              2-D parameters), lr and weight decay from golden_optim's
              Megatron scheduler (constant here).

Each step's rollouts are one call each (prompt, then generated tokens with
their generation logprobs), three task groups of four; the trainer reads
them as NeMo Gym records and captures. Micro-batches: the rows in order,
packed greedily up to max_total_sequence_length × train_micro_batch_size
tokens (the trainer's packing), so the load-balancing loss sees the same
token sets.

Output: config.json and model.safetensors (the initial weights, float32),
golden.json (the rollouts, the recipe settings the test passes with --set,
and per step loss, kl (the mean k3 over the loss's tokens, before the
penalty's weight), grad_norm (before clipping), router_aux_loss, the
advantages), and
golden.safetensors (every parameter after each step, step1.NAME and
step2.NAME, float32).

Run: /usr/bin/python3 scripts/golden_moe_grpo.py   (or `make golden`)
"""
import json
import math
import os
import random
import sys

import torch

sys.dont_write_bytecode = True
sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
import golden_grpo as gg  # noqa: E402  (torch_loss, torch_advantages, base_options)
import golden_model as gm  # noqa: E402  (save)
import golden_moe as gmoe  # noqa: E402  (BASE, init_weights, forward, load_balancing_loss)
import golden_optim as go  # noqa: E402  (MegatronScheduler)

torch.set_default_dtype(torch.float64)

SEED = 20261202
SCRIPT = "scripts/golden_moe_grpo.py"
OUT = os.path.join(os.path.dirname(os.path.abspath(__file__)), "..", "trainer", "testdata", "moe_grpo")

CFG = dict(gmoe.BASE)
CFG.update({"num_experts": 8, "num_experts_per_tok": 2, "norm_topk_prob": True,
            "output_router_logits": True, "router_aux_loss_coef": 0.05})

GROUPS, PER_GROUP, STEPS = 3, 4, 2
MAX_LEN, MICRO = 32, 1  # max_total_sequence_length, train_micro_batch_size
KL = 0.05
ADAM = {"lr": 1e-3, "beta1": 0.9, "beta2": 0.99, "eps": 1e-4, "weight_decay": 0.01, "clip": 1.0}

# The settings the test passes with --set over the built-in recipe.
SETS = {
    "grpo.num_prompts_per_step": GROUPS,
    "grpo.num_generations_per_prompt": PER_GROUP,
    "policy.train_micro_batch_size": MICRO,
    "policy.max_total_sequence_length": MAX_LEN,
    "loss_fn.reference_policy_kl_penalty": KL,
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
}


def make_rollouts(rng, V):
    out = []
    for task in range(GROUPS):
        prompt_base = [rng.randrange(V) for _ in range(rng.randint(3, 6))]
        rewards = rng.sample([0.0, 0.25, 0.5, 0.75, 1.0], PER_GROUP)
        for i in range(PER_GROUP):
            prompt = prompt_base + [rng.randrange(V) for _ in range(rng.randint(1, 4))]
            gen = [rng.randrange(V) for _ in range(rng.randint(2, 7))]
            glp = [math.log(rng.uniform(0.05, 0.9)) for _ in gen]
            out.append(dict(task=task, index=i, prompt=prompt, generation=gen, generation_logprobs=glp,
                            reward=rewards[i]))
    return out


GAPS = []


def pack(rows):
    """The trainer's packing: rows in order, a new micro-batch when the next
    row would pass MAX_LEN · MICRO tokens."""
    cap = MAX_LEN * MICRO
    mbs, cur, n = [], [], 0
    for r, row in enumerate(rows):
        t = len(row["tokens"])
        if n + t > cap and cur:
            mbs.append(cur)
            cur, n = [], 0
        cur.append(r)
        n += t
    if cur:
        mbs.append(cur)
    return mbs


def logprobs(P, rows, mb):
    """Per-row logprob tensors (entry t: log p(token t | earlier), 0 at t=0)
    of micro-batch mb, and its load-balancing loss."""
    tokens = torch.tensor([x for r in mb for x in rows[r]["tokens"]])
    cu = [0]
    for r in mb:
        cu.append(cu[-1] + len(rows[r]["tokens"]))
    lnf, head, stats = gmoe.forward(gmoe.Policy(False), P, CFG, tokens, cu)
    gap = route_gap(stats, CFG["num_experts_per_tok"])
    assert gap > 1e-4, "a near-tie in the routing: %g" % gap
    GAPS.append(gap)
    logp = torch.log_softmax(lnf @ head.T, dim=-1)
    out = []
    for s, r in enumerate(mb):
        lo, hi = cu[s], cu[s + 1]
        lp = logp[lo:hi - 1].gather(1, tokens[lo + 1:hi, None]).squeeze(1)
        out.append(torch.cat([torch.zeros(1), lp]))
    aux = gmoe.load_balancing_loss(stats, CFG["num_experts"], CFG["num_experts_per_tok"])
    return out, aux


def route_gap(stats, K):
    """The smallest relative gap between the K-th and (K+1)-th probability
    of any row: far from 0, float32 cannot route otherwise."""
    gap = math.inf
    for logits, _, _ in stats:
        sp = torch.sort(torch.softmax(logits.detach(), -1), dim=-1, descending=True).values
        gap = min(gap, float(((sp[:, K - 1] - sp[:, K]) / sp[:, K - 1]).min()))
    return gap


def main():
    torch.set_num_threads(1)
    gmoe.TIES = []  # no tied router rows here: every choice is clear
    rng = random.Random(SEED)
    g = torch.Generator().manual_seed(SEED)
    cfg = dict(CFG)
    stored = {k: v.float() for k, v in gmoe.init_weights(cfg, g).items()}
    os.makedirs(OUT, exist_ok=True)
    meta = {"format": "pt", "golden_script": SCRIPT, "golden_seed": str(SEED), "golden_torch": torch.__version__}
    gm.save(os.path.join(OUT, "model.safetensors"), stored, meta)
    with open(os.path.join(OUT, "config.json"), "w") as f:
        json.dump(cfg, f, indent=2, sort_keys=True)
        f.write("\n")

    names = list(stored)
    P0 = {k: v.double() for k, v in stored.items()}
    P = {k: v.double().clone().requires_grad_(True) for k, v in stored.items()}
    decay = [P[k] for k in names if P[k].dim() == 2]
    nodecay = [P[k] for k in names if P[k].dim() != 2]
    opt = torch.optim.AdamW([{"params": decay}, {"params": nodecay, "weight_decay": 0.0}], lr=ADAM["lr"],
                            betas=(ADAM["beta1"], ADAM["beta2"]), eps=ADAM["eps"], weight_decay=ADAM["weight_decay"])
    sched = go.MegatronScheduler(dict(
        lr=ADAM["lr"], min_lr=1e-4, lr_warmup_init=1e-4, lr_warmup_iters=0, lr_warmup_fraction=None,
        lr_decay_iters=300, lr_decay_style="constant", start_weight_decay=ADAM["weight_decay"],
        end_weight_decay=ADAM["weight_decay"], weight_decay_incr_style="constant", train_iters=300,
        train_global_batch_size=GROUPS * PER_GROUP))
    o = gg.base_options()
    o.update(reference_policy_kl_penalty=KL, ratio_clip_min=0.2, ratio_clip_max=0.2)
    coef = cfg["router_aux_loss_coef"]

    golden = {"script": SCRIPT, "seed": SEED, "torch": torch.__version__, "sets": SETS, "steps": []}
    after = {}
    for step in range(1, STEPS + 1):
        rollouts = make_rollouts(rng, cfg["vocab_size"])
        adv = gg.torch_advantages([r["task"] for r in rollouts], [r["reward"] for r in rollouts],
                                  [1] * len(rollouts), True, True, None, None)["advantage"]
        rows = []
        for r, a in zip(rollouts, adv):
            toks = r["prompt"] + r["generation"]
            assert len(toks) <= MAX_LEN
            mask = [0] * len(r["prompt"]) + [1] * len(r["generation"])
            glp = [0.0] * len(r["prompt"]) + r["generation_logprobs"]
            rows.append(dict(tokens=toks, mask=mask, glp=glp, advantage=a))
        mbs = pack(rows)
        t_step = sum(len(r["tokens"]) for r in rows)
        g_tok = sum(sum(r["mask"][1:]) for r in rows)
        lp_graph, aux_mb, lp_ref = [None] * len(rows), [], [None] * len(rows)
        for mb in mbs:
            lps, aux = logprobs(P, rows, mb)
            with torch.no_grad():
                refs, _ = logprobs(P0, rows, mb)
            for r, lp, ref in zip(mb, lps, refs):
                lp_graph[r], lp_ref[r] = lp, ref
            aux_mb.append((sum(len(rows[r]["tokens"]) for r in mb), aux))
        loss_rows = []
        for r, row in enumerate(rows):
            lp = lp_graph[r].detach().tolist()
            loss_rows.append(dict(lp=lp, lp_old=lp, lp_gen=row["glp"], lp_ref=lp_ref[r].tolist(), mask=row["mask"],
                                  sample_mask=1.0, advantage=row["advantage"]))
        res = gg.torch_loss(loss_rows, g_tok, o)
        total = sum((lp_graph[r] * torch.tensor(res["dlp"][r])).sum() for r in range(len(rows)))
        aux_mean = sum(n * a for n, a in aux_mb) / t_step
        total = total + coef * aux_mean
        opt.zero_grad()
        total.backward()
        norm = float(torch.nn.utils.clip_grad_norm_([P[k] for k in names], ADAM["clip"]))
        lr, wd = sched.get_lr(), sched.get_wd()
        for grp in opt.param_groups:
            grp["lr"] = lr
        opt.param_groups[0]["weight_decay"] = wd
        opt.step()
        sched.step(GROUPS * PER_GROUP)
        m = res["metrics"]
        golden["steps"].append(dict(
            rollouts=rollouts, advantages=adv, micro_batches=mbs, loss=res["loss"], kl=m["kl_sum"] / g_tok / KL,
            grad_norm=norm, router_aux_loss=float(aux_mean), lr=lr, eligible_tokens=m["eligible_tokens"],
            train_tokens=t_step))
        for k in names:
            after["step%d.%s" % (step, k)] = P[k].detach().float()
        print("step %d: %d micro-batches, loss %.6g, kl %.3g, grad_norm %.6g, router_aux_loss %.6g"
              % (step, len(mbs), res["loss"], m["kl_sum"] / g_tok / KL, norm, float(aux_mean)))
    print("smallest relative gap at the k-th place: %.3g" % min(GAPS))
    gm.save(os.path.join(OUT, "golden.safetensors"), after, meta)
    with open(os.path.join(OUT, "golden.json"), "w") as f:
        json.dump(golden, f, indent=1)
        f.write("\n")


if __name__ == "__main__":
    main()
