#!/usr/bin/python3
"""Golden learning rates of NeMo RL's DTensor-path schedules, from torch itself.

NeMo RL builds policy.scheduler (a list of torch schedulers plus one entry of
milestones) into torch.optim.lr_scheduler.SequentialLR. This script runs those
schedulers on a torch AdamW optimizer and records the learning rate in force at
each step (read before optimizer.step(), as NeMo RL logs it).

Writes config/testdata/golden_schedule.json. Run with Debian's python3-torch:
    /usr/bin/python3 scripts/golden_schedule.py
"""

import json
import os
import sys
import warnings

import numpy as np
import torch

SEED = 0  # deterministic; no randomness is used
OUT = os.path.join(os.path.dirname(os.path.abspath(__file__)), "..", "config", "testdata", "golden_schedule.json")
STEPS = 80

CASES = [
    ("nemo_rl_grpo_math_1B", 5e-6, [
        {"name": "torch.optim.lr_scheduler.LinearLR", "kwargs": {"start_factor": 0.1, "end_factor": 1.0, "total_iters": 50}},
        {"name": "torch.optim.lr_scheduler.ConstantLR", "kwargs": {"factor": 1.0, "total_iters": 10000000000}},
        {"milestones": [50]},
    ]),
    ("constant_then_linear_decay", 1e-3, [
        {"name": "torch.optim.lr_scheduler.ConstantLR", "kwargs": {"factor": 0.5, "total_iters": 4}},
        {"name": "torch.optim.lr_scheduler.LinearLR", "kwargs": {"start_factor": 1.0, "end_factor": 0.1, "total_iters": 10}},
        {"milestones": [6]},
    ]),
    ("three_phases", 2e-4, [
        {"name": "torch.optim.lr_scheduler.LinearLR", "kwargs": {"start_factor": 0.01, "end_factor": 1.0, "total_iters": 7}},
        {"name": "torch.optim.lr_scheduler.ConstantLR", "kwargs": {"factor": 0.8, "total_iters": 5}},
        {"name": "torch.optim.lr_scheduler.LinearLR", "kwargs": {"start_factor": 0.5, "end_factor": 0.05, "total_iters": 20}},
        {"milestones": [7, 20]},
    ]),
    ("single_linear", 3e-5, [
        {"name": "torch.optim.lr_scheduler.LinearLR", "kwargs": {"start_factor": 0.25, "end_factor": 1.0, "total_iters": 12}},
    ]),
    ("torch_defaults", 1e-4, [
        {"name": "torch.optim.lr_scheduler.ConstantLR", "kwargs": {}},
    ]),
]

SCHEDULERS = {
    "torch.optim.lr_scheduler.LinearLR": torch.optim.lr_scheduler.LinearLR,
    "torch.optim.lr_scheduler.ConstantLR": torch.optim.lr_scheduler.ConstantLR,
}


def run(lr, entries):
    p = torch.nn.Parameter(torch.zeros(1))
    opt = torch.optim.AdamW([p], lr=lr)
    scheds, milestones = [], None
    for e in entries:
        if "milestones" in e:
            milestones = e["milestones"]
            continue
        scheds.append(SCHEDULERS[e["name"]](opt, **e["kwargs"]))
    if len(scheds) > 1:
        sched = torch.optim.lr_scheduler.SequentialLR(opt, scheds, milestones=milestones)
    else:
        sched = scheds[0]
    lrs = []
    for _ in range(STEPS):
        lrs.append(opt.param_groups[0]["lr"])
        opt.step()
        sched.step()
    return lrs


def main():
    warnings.simplefilter("ignore")
    cases = [dict(name=n, lr=lr, scheduler=e, lrs=run(lr, e)) for n, lr, e in CASES]
    doc = dict(meta=dict(script="scripts/golden_schedule.py", seed=SEED, torch=torch.__version__,
                         numpy=np.__version__, python=sys.version.split()[0]), cases=cases)
    with open(OUT, "w") as f:
        json.dump(doc, f, indent=1, allow_nan=False)
        f.write("\n")
    print(f"wrote {OUT}: {len(cases)} schedules x {STEPS} steps")


if __name__ == "__main__":
    main()
