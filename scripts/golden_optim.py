#!/usr/bin/env python3
"""Goldens for optim: torch.optim.AdamW + torch.nn.utils.clip_grad_norm_ driven by
the Megatron-Core OptimizerParamScheduler formulas (written out below, with
Megatron-Bridge's sample scaling) and by torch's own SequentialLR/LinearLR/
ConstantLR (NeMo RL's non-Megatron scheduler list).

Writes optim/testdata/golden_optim.json. Run with Debian's python3-torch:
    /usr/bin/python3 scripts/golden_optim.py
Float32 arrays are stored as base64 of little-endian float32 bytes; scalars as
JSON numbers (Python's repr, which round-trips float64 exactly).
"""
import base64
import json
import math
import os

import numpy as np
import torch

SEED = 20261129
OUT = os.path.join(os.path.dirname(os.path.abspath(__file__)), "..", "optim", "testdata", "golden_optim.json")


def b64(a):
    a = np.ascontiguousarray(np.asarray(a, dtype="<f4"))
    return base64.b64encode(a.tobytes()).decode("ascii")


class MegatronScheduler:
    """OptimizerParamScheduler.get_lr/get_wd as in megatron/core/optimizer_param_scheduler.py,
    with the step counts Megatron-Bridge derives from iterations x global batch size."""

    def __init__(self, c):
        gbs = c["train_global_batch_size"]
        decay_iters = c["lr_decay_iters"] or c["train_iters"]
        self.init_lr = c["lr_warmup_init"]
        self.max_lr = c["lr"]
        self.min_lr = c["min_lr"]
        self.lr_decay_steps = decay_iters * gbs
        self.wd_incr_steps = c["train_iters"] * gbs
        if c.get("lr_warmup_fraction") is not None:
            self.lr_warmup_steps = c["lr_warmup_fraction"] * self.lr_decay_steps
        else:
            self.lr_warmup_steps = c["lr_warmup_iters"] * gbs
        if self.lr_warmup_steps >= self.lr_decay_steps:  # Bridge caps with a warning
            self.lr_warmup_steps = self.lr_decay_steps - 1
        self.style = c["lr_decay_style"]
        self.start_wd = c["start_weight_decay"]
        self.end_wd = c["end_weight_decay"]
        self.wd_style = c["weight_decay_incr_style"]
        self.num_steps = 0

    def get_wd(self):
        if self.num_steps > self.wd_incr_steps:
            return self.end_wd
        if self.wd_style == "constant":
            assert self.start_wd == self.end_wd
            return self.end_wd
        r = float(self.num_steps) / float(self.wd_incr_steps)
        if self.wd_style == "linear":
            coeff = r
        elif self.wd_style == "cosine":
            coeff = 0.5 * (math.cos(math.pi * (1 - r)) + 1.0)
        else:
            raise ValueError(self.wd_style)
        return self.start_wd + coeff * (self.end_wd - self.start_wd)

    def get_lr(self):
        if self.lr_warmup_steps > 0 and self.num_steps <= self.lr_warmup_steps:
            return self.init_lr + ((self.max_lr - self.init_lr) * float(self.num_steps) / float(self.lr_warmup_steps))
        if self.style == "constant":
            return self.max_lr
        if self.num_steps > self.lr_decay_steps:
            return self.min_lr
        if self.style == "inverse-square-root":
            w = max(self.lr_warmup_steps, 1)
            n = max(self.num_steps, 1)
            return max(self.min_lr, self.max_lr * w ** 0.5 / (n ** 0.5))
        ratio = float(self.num_steps - self.lr_warmup_steps) / float(self.lr_decay_steps - self.lr_warmup_steps)
        assert 0.0 <= ratio <= 1.0
        if self.style == "linear":
            coeff = 1.0 - ratio
        elif self.style == "cosine":
            coeff = 0.5 * (math.cos(math.pi * ratio) + 1.0)
        else:
            raise ValueError(self.style)
        return self.min_lr + coeff * (self.max_lr - self.min_lr)

    def step(self, increment):
        self.num_steps += increment


def torch_sequential(cfg, nsteps):
    """lr before each of nsteps scheduler steps, from torch's own schedulers."""
    p = torch.nn.Parameter(torch.zeros(1))
    opt = torch.optim.SGD([p], lr=cfg["lr"])
    scheds = []
    for ph in cfg["phases"]:
        if ph["name"] == "LinearLR":
            scheds.append(torch.optim.lr_scheduler.LinearLR(opt, start_factor=ph["start_factor"], end_factor=ph["end_factor"], total_iters=ph["total_iters"]))
        elif ph["name"] == "ConstantLR":
            scheds.append(torch.optim.lr_scheduler.ConstantLR(opt, factor=ph["factor"], total_iters=ph["total_iters"]))
        else:
            raise ValueError(ph)
    if len(scheds) > 1:
        sched = torch.optim.lr_scheduler.SequentialLR(opt, schedulers=scheds, milestones=cfg["milestones"])
    else:
        sched = scheds[0]
    lrs = []
    for _ in range(nsteps):
        lrs.append(opt.param_groups[0]["lr"])
        opt.step()
        sched.step()
    return lrs


# The parameter arena: (name, shape, decay) in arena order.
TENSORS = [("w1", (8, 16), True), ("b1", (16,), False), ("norm", (12,), False), ("w2", (6, 8), True)]


def arena_groups():
    groups, off = [], 0
    for _, shape, decay in TENSORS:
        n = int(np.prod(shape))
        groups.append({"off": off, "n": n, "decay": decay})
        off += n
    return groups, off


def megatron_cfg(**kw):
    c = {
        "lr": 1e-2, "min_lr": 1e-3, "lr_warmup_init": 0.0, "lr_warmup_iters": 0, "lr_warmup_fraction": None,
        "lr_decay_iters": 0, "lr_decay_style": "constant", "start_weight_decay": 0.01, "end_weight_decay": 0.01,
        "weight_decay_incr_style": "constant", "train_iters": 20, "train_global_batch_size": 16,
    }
    c.update(kw)
    return c


ADAM_CASES = [
    # name, schedule, adam, steps with a non-finite gradient
    ("constant_clip", {"kind": "megatron", "cfg": megatron_cfg(lr_warmup_iters=3, lr_warmup_init=1e-3)},
     {"beta1": 0.9, "beta2": 0.999, "eps": 1e-8, "max_grad_norm": 1.0}, []),
    ("linear_wdlinear", {"kind": "megatron", "cfg": megatron_cfg(lr_decay_style="linear", lr_warmup_iters=4, lr_warmup_init=2e-3,
                                                                lr_decay_iters=15, start_weight_decay=0.0, end_weight_decay=0.1,
                                                                weight_decay_incr_style="linear")},
     {"beta1": 0.9, "beta2": 0.98, "eps": 1e-6, "max_grad_norm": 0.5}, []),
    ("cosine_wdcosine", {"kind": "megatron", "cfg": megatron_cfg(lr=3e-3, min_lr=3e-4, lr_decay_style="cosine", lr_decay_iters=12,
                                                                start_weight_decay=0.01, end_weight_decay=0.2,
                                                                weight_decay_incr_style="cosine", train_iters=16, train_global_batch_size=32)},
     {"beta1": 0.8, "beta2": 0.95, "eps": 1e-8, "max_grad_norm": 100.0}, []),
    ("isr_noclip_nonfinite", {"kind": "megatron", "cfg": megatron_cfg(lr=5e-3, min_lr=1e-3, lr_decay_style="inverse-square-root",
                                                                     lr_warmup_iters=4, start_weight_decay=0.05, end_weight_decay=0.05)},
     {"beta1": 0.9, "beta2": 0.999, "eps": 1e-8, "max_grad_norm": 0.0}, [6, 13]),
    ("sequential_linear_constant", {"kind": "sequential", "cfg": {"lr": 2e-3, "weight_decay": 0.01, "milestones": [5],
                                                                  "phases": [{"name": "LinearLR", "start_factor": 0.1, "end_factor": 1.0, "total_iters": 5},
                                                                             {"name": "ConstantLR", "factor": 0.5, "total_iters": 4}]}},
     {"beta1": 0.9, "beta2": 0.999, "eps": 1e-8, "max_grad_norm": 1.0}, []),
]

NSTEPS = 20


def run_adam_case(rng, name, sched, adam, nonfinite, init):
    groups, n = arena_groups()
    params = []
    for g, (_, shape, _) in zip(groups, TENSORS):
        params.append(torch.nn.Parameter(torch.from_numpy(init[g["off"]:g["off"] + g["n"]].reshape(shape).copy())))
    decay = [p for p, t in zip(params, TENSORS) if t[2]]
    nodecay = [p for p, t in zip(params, TENSORS) if not t[2]]
    opt = torch.optim.AdamW([{"params": decay}, {"params": nodecay, "weight_decay": 0.0}],
                            lr=1.0, betas=(adam["beta1"], adam["beta2"]), eps=adam["eps"], weight_decay=0.0)
    if sched["kind"] == "megatron":
        ms = MegatronScheduler(sched["cfg"])
        gbs = sched["cfg"]["train_global_batch_size"]
        lrs = wds = None
    else:
        ms, gbs = None, 16
        lrs = torch_sequential(sched["cfg"], NSTEPS)
        wds = [sched["cfg"]["weight_decay"]] * NSTEPS
    steps = []
    for k in range(NSTEPS):
        scale = float(rng.choice([0.05, 0.3, 1.0, 4.0]))
        grad = (rng.standard_normal(n) * scale).astype(np.float32)
        if k in nonfinite:
            grad[int(rng.integers(n))] = np.inf if k % 2 == 0 else np.nan
        for p, g in zip(params, groups):
            p.grad = torch.from_numpy(grad[g["off"]:g["off"] + g["n"]].reshape(p.shape).copy())
        if ms is not None:
            lr, wd = ms.get_lr(), ms.get_wd()
        else:
            lr, wd = lrs[k], wds[k]
        opt.param_groups[0]["lr"] = lr
        opt.param_groups[0]["weight_decay"] = wd
        opt.param_groups[1]["lr"] = lr
        max_norm = adam["max_grad_norm"] if adam["max_grad_norm"] > 0 else float("inf")
        norm = float(torch.nn.utils.clip_grad_norm_(params, max_norm))
        skipped = not math.isfinite(norm)
        if not skipped:
            opt.step()
        if ms is not None:
            ms.step(gbs)  # the scheduler advances whether or not the update was skipped
        steps.append({
            "grad": b64(grad), "lr": lr, "wd": wd, "grad_norm": norm if math.isfinite(norm) else str(norm),
            "skipped": skipped,
            "params": b64(np.concatenate([p.detach().numpy().reshape(-1) for p in params])),
        })
    m = np.concatenate([opt.state[p]["exp_avg"].numpy().reshape(-1) for p in params])
    v = np.concatenate([opt.state[p]["exp_avg_sq"].numpy().reshape(-1) for p in params])
    return {"name": name, "schedule": sched, "adam": adam, "increment": gbs, "steps": steps,
            "final_m": b64(m), "final_v": b64(v)}


SCHEDULE_CASES = []
for style in ["constant", "linear", "cosine", "inverse-square-root"]:
    for wd_style, (sw, ew) in [("constant", (0.02, 0.02)), ("linear", (0.0, 0.1)), ("cosine", (0.01, 0.3))]:
        SCHEDULE_CASES.append((f"{style}_{wd_style}", megatron_cfg(
            lr=1e-4, min_lr=1e-6, lr_warmup_init=1e-7, lr_warmup_iters=5, lr_decay_iters=40, lr_decay_style=style,
            start_weight_decay=sw, end_weight_decay=ew, weight_decay_incr_style=wd_style, train_iters=50,
            train_global_batch_size=16)))
SCHEDULE_CASES += [
    ("cosine_fraction", megatron_cfg(lr=1e-4, min_lr=0.0, lr_warmup_fraction=0.125, lr_decay_iters=40, lr_decay_style="cosine",
                                     train_iters=50, train_global_batch_size=8)),
    ("linear_warmup_capped", megatron_cfg(lr=1e-4, min_lr=1e-5, lr_warmup_iters=60, lr_decay_iters=40, lr_decay_style="linear",
                                          train_iters=50, train_global_batch_size=4)),
    ("isr_nowarmup", megatron_cfg(lr=1e-4, min_lr=2e-5, lr_warmup_iters=0, lr_decay_iters=40, lr_decay_style="inverse-square-root",
                                  train_iters=50, train_global_batch_size=16)),
]
SEQ_CASES = [
    ("linear_constant", {"lr": 5e-6, "weight_decay": 0.01, "milestones": [10],
                         "phases": [{"name": "LinearLR", "start_factor": 0.1, "end_factor": 1.0, "total_iters": 10},
                                    {"name": "ConstantLR", "factor": 1.0, "total_iters": 10000000000}]}),
    ("constant_linear_constant", {"lr": 1e-3, "weight_decay": 0.0, "milestones": [4, 20],
                                  "phases": [{"name": "ConstantLR", "factor": 0.25, "total_iters": 2},
                                             {"name": "LinearLR", "start_factor": 1.0, "end_factor": 0.05, "total_iters": 12},
                                             {"name": "ConstantLR", "factor": 0.5, "total_iters": 5}]}),
    ("linear_only", {"lr": 1e-4, "weight_decay": 0.1, "milestones": [],
                     "phases": [{"name": "LinearLR", "start_factor": 0.5, "end_factor": 0.2, "total_iters": 25}]}),
]
SCHED_STEPS = 60


def main():
    rng = np.random.default_rng(SEED)
    groups, n = arena_groups()
    init = (rng.standard_normal(n) * 0.5).astype(np.float32)
    init[groups[2]["off"]:groups[2]["off"] + groups[2]["n"]] = 1.0 + 0.1 * init[groups[2]["off"]:groups[2]["off"] + groups[2]["n"]]
    cases = [run_adam_case(rng, *c, init) for c in ADAM_CASES]
    scheds = []
    for name, cfg in SCHEDULE_CASES:
        ms = MegatronScheduler(cfg)
        lr, wd = [], []
        for _ in range(SCHED_STEPS):
            lr.append(ms.get_lr())
            wd.append(ms.get_wd())
            ms.step(cfg["train_global_batch_size"])
        scheds.append({"name": name, "schedule": {"kind": "megatron", "cfg": cfg}, "increment": cfg["train_global_batch_size"], "lr": lr, "wd": wd})
    for name, cfg in SEQ_CASES:
        lr = torch_sequential(cfg, SCHED_STEPS)
        scheds.append({"name": name, "schedule": {"kind": "sequential", "cfg": cfg}, "increment": 1, "lr": lr,
                       "wd": [cfg["weight_decay"]] * SCHED_STEPS})
    out = {
        "meta": {"script": "scripts/golden_optim.py", "seed": SEED, "torch": torch.__version__, "numpy": np.__version__,
                 "format": "float32 arrays are base64 of little-endian float32"},
        "arena": {"n": n, "groups": groups, "init_params": b64(init)},
        "adam_cases": cases,
        "schedule_cases": scheds,
    }
    os.makedirs(os.path.dirname(OUT), exist_ok=True)
    with open(OUT, "w") as f:
        json.dump(out, f, indent=1)
        f.write("\n")
    print(f"wrote {OUT}: {len(cases)} AdamW cases x {NSTEPS} steps, {len(scheds)} schedules x {SCHED_STEPS} steps")


if __name__ == "__main__":
    main()
