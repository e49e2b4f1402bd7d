#!/usr/bin/python3
"""Writes trainer/testdata/shared_grpo: two GRPO steps of a tiny dense Qwen3
whose rollouts share prefixes (a task group's prompt, generations that share
their first tokens, two equal generations), computed here in float64 with
every rollout as its own sequence, for the trainer's two-step golden with
shared prefixes on and off (TestSharedPrefixGRPOGolden).

Nothing here knows about token tries: the reference is the unshared step, so
a trainer that packs the rollouts as a trie must land on it.

The pieces (as scripts/golden_moe_grpo.py, without the experts):
  model       golden_moe.forward with no sparse layer (transformers' Qwen3
              decoder, written from its definition), each row its own
              sequence, logprobs at temperature 1;
  advantages  golden_grpo.torch_advantages (leave-one-out baseline,
              normalised rewards);
  loss        golden_grpo.torch_loss (NeMo RL's ClippedPGLossFn, token-level,
              k3 KL against the initial weights), its gradient with respect to
              the logprobs chained into the model by autograd;
  optimizer   torch.nn.utils.clip_grad_norm_ and torch.optim.AdamW (decay on
              2-D parameters), lr and weight decay from golden_optim's
              Megatron scheduler (constant here).

Each step's rollouts are one call each (prompt, then generated tokens with
their generation logprobs), three task groups of four. In a group every
rollout has the same prompt; the second and third generations share their
first tokens; the fourth repeats the first (two equal traces). The
trainer's micro-batch budget (max_total_sequence_length ×
train_micro_batch_size computed tokens) is smaller than a group's trie, so
the trie is split at branch points too.

Output: config.json and model.safetensors (the initial weights, float32),
golden.json (the rollouts, the recipe settings the test passes with --set,
and per step loss, kl, grad_norm (before clipping), lr, eligible and train
tokens), and golden.safetensors (every parameter after each step, step1.NAME
and step2.NAME, float32).

Run: /usr/bin/python3 scripts/golden_shared_grpo.py   (or `make golden`)
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
import golden_moe as gmoe  # noqa: E402  (BASE, init_weights, forward)
import golden_optim as go  # noqa: E402  (MegatronScheduler)

torch.set_default_dtype(torch.float64)

SEED = 20261201
SCRIPT = "scripts/golden_shared_grpo.py"
OUT = os.path.join(os.path.dirname(os.path.abspath(__file__)), "..", "trainer", "testdata", "shared_grpo")

# A dense Qwen3: golden_moe's shape with no experts (every layer dense);
# config.json leaves out the MoE keys.
CFG = dict(gmoe.BASE)
CFG.update({"model_type": "qwen3", "architectures": ["Qwen3ForCausalLM"], "num_experts": 0})
MOE_KEYS = ("num_experts", "moe_intermediate_size", "decoder_sparse_step", "mlp_only_layers", "norm_topk_prob",
            "output_router_logits", "router_aux_loss_coef")

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
        prompt = [rng.randrange(V) for _ in range(rng.randint(6, 12))]
        rewards = rng.sample([0.0, 0.25, 0.5, 0.75, 1.0], PER_GROUP)
        stem = [rng.randrange(V) for _ in range(rng.randint(2, 4))]  # shared by generations 1 and 2
        gens = []
        for i in range(PER_GROUP):
            if i == 3:
                gen = list(gens[0])  # an equal generation: the same trace twice
            elif i in (1, 2):
                gen = stem + [rng.randrange(V) for _ in range(rng.randint(1, 6))]
            else:
                gen = [rng.randrange(V) for _ in range(rng.randint(2, 8))]
            gens.append(gen)
            glp = [math.log(rng.uniform(0.05, 0.9)) for _ in gen]
            out.append(dict(task=task, index=i, prompt=list(prompt), generation=gen, generation_logprobs=glp,
                            reward=rewards[i]))
    return out


def logprobs(P, rows):
    """Per-row logprob tensors (entry t: log p(token t | earlier), 0 at t=0),
    every row its own sequence."""
    tokens = torch.tensor([x for r in rows for x in r["tokens"]])
    cu = [0]
    for r in rows:
        cu.append(cu[-1] + len(r["tokens"]))
    lnf, head, stats = gmoe.forward(gmoe.Policy(False), P, CFG, tokens, cu)
    assert not stats
    logp = torch.log_softmax(lnf @ head.T, dim=-1)
    out = []
    for s in range(len(rows)):
        lo, hi = cu[s], cu[s + 1]
        lp = logp[lo:hi - 1].gather(1, tokens[lo + 1:hi, None]).squeeze(1)
        out.append(torch.cat([torch.zeros(1), lp]))
    return out


def main():
    torch.set_num_threads(1)
    rng = random.Random(SEED)
    g = torch.Generator().manual_seed(SEED)
    stored = {k: v.float() for k, v in gmoe.init_weights(CFG, g).items()}
    os.makedirs(OUT, exist_ok=True)
    meta = {"format": "pt", "golden_script": SCRIPT, "golden_seed": str(SEED), "golden_torch": torch.__version__}
    gm.save(os.path.join(OUT, "model.safetensors"), stored, meta)
    saved_cfg = {k: v for k, v in CFG.items() if k not in MOE_KEYS}
    with open(os.path.join(OUT, "config.json"), "w") as f:
        json.dump(saved_cfg, f, indent=2, sort_keys=True)
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

    golden = {"script": SCRIPT, "seed": SEED, "torch": torch.__version__, "sets": SETS, "steps": []}
    after = {}
    for step in range(1, STEPS + 1):
        rollouts = make_rollouts(rng, CFG["vocab_size"])
        adv = gg.torch_advantages([r["task"] for r in rollouts], [r["reward"] for r in rollouts],
                                  [1] * len(rollouts), True, True, None, None)["advantage"]
        rows = []
        for r, a in zip(rollouts, adv):
            toks = r["prompt"] + r["generation"]
            assert len(toks) <= MAX_LEN
            mask = [0] * len(r["prompt"]) + [1] * len(r["generation"])
            glp = [0.0] * len(r["prompt"]) + r["generation_logprobs"]
            rows.append(dict(tokens=toks, mask=mask, glp=glp, advantage=a))
        t_step = sum(len(r["tokens"]) for r in rows)
        g_tok = sum(sum(r["mask"][1:]) for r in rows)
        lp_graph = logprobs(P, rows)
        with torch.no_grad():
            lp_ref = logprobs(P0, rows)
        loss_rows = []
        for r, row in enumerate(rows):
            lp = lp_graph[r].detach().tolist()
            loss_rows.append(dict(lp=lp, lp_old=lp, lp_gen=row["glp"], lp_ref=lp_ref[r].tolist(), mask=row["mask"],
                                  sample_mask=1.0, advantage=row["advantage"]))
        res = gg.torch_loss(loss_rows, g_tok, o)
        total = sum((lp_graph[r] * torch.tensor(res["dlp"][r])).sum() for r in range(len(rows)))
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
            rollouts=rollouts, advantages=adv, loss=res["loss"], kl=m["kl_sum"] / g_tok / KL,
            grad_norm=norm, lr=lr, eligible_tokens=m["eligible_tokens"], train_tokens=t_step))
        for k in names:
            after["step%d.%s" % (step, k)] = P[k].detach().float()
        print("step %d: %d trace tokens, loss %.6g, kl %.3g, grad_norm %.6g"
              % (step, t_step, res["loss"], m["kl_sum"] / g_tok / KL, norm))
    gm.save(os.path.join(OUT, "golden.safetensors"), after, meta)
    with open(os.path.join(OUT, "golden.json"), "w") as f:
        json.dump(golden, f, indent=1)
        f.write("\n")


if __name__ == "__main__":
    main()
