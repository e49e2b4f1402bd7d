#!/usr/bin/python3
"""Golden for optim's FusedAdam rule: TransformerEngine's FusedAdam, the
optimizer NeMo RL's recipes with exp_avg_dtype / exp_avg_sq_dtype build
(policy.optimizer.name transformer_engine.pytorch.optimizers.fused_adam.FusedAdam,
master_weights: true, store_param_remainders: true; nemo_rl/models/automodel/
setup.py at NVIDIA-NeMo/RL 7ea279abfbeb, lines 806-820, resolves the "torch."
dtype strings and passes the kwargs through).

FusedAdam needs a GPU (its update is the CUDA kernel multi_tensor_adam), so this
is its torch equivalent: the kernel's arithmetic written out in float32 torch
ops, one rounding per operation, from
transformer_engine/common/multi_tensor/adam.cu at NVIDIA/TransformerEngine
d0067d0da6cb (AdamFunctor / AdamFunctorMaster, ADAM_MODE_1, lines 126-140 and
329-340; the bias corrections from the host code, lines 594-597):

    m = beta1*m + (1-beta1)*g              (every scalar a float32: the kernel's arguments)
    v = beta2*v + (1-beta2)*g*g
    m_hat = m/bc1;  v_hat = v/bc2;  denom = sqrt(v_hat) + eps
    update = m_hat/denom + weight_decay*p;  p = p - lr*update
    bcK = float32(1 - pow(double(float32(betaK)), step))

with the fp32 master weights (store_param_remainders keeps them exactly) and
the moments read from and stored to their dtype: float32, or bfloat16
(rounded to nearest even on store: fuse_unscale, TE's path when both
moments are bf16; the update uses the unrounded float32 moments). The
gradient is clipped by torch.nn.utils.clip_grad_norm_ first, as NeMo RL
does. Three steps, decay and no-decay parameter groups, a learning rate
that changes every step; with clipping and without (max_grad_norm 0: the
gradient untouched, so tracegrpo's CPU backend must match bit for bit).

As a check of the transcription, the float32-moment run is compared with
torch.optim.AdamW on the same gradients (the same update in exact
arithmetic, rounded in another order): they must agree to 1e-5.

Writes optim/testdata/golden_fused_adam.json. Run with Debian's python3-torch:
    /usr/bin/python3 scripts/golden_fused_adam.py
Float32 arrays are base64 of little-endian float32; bf16 moments are stored
widened to float32 (exact).
"""
import base64
import json
import math
import os

import numpy as np
import torch

SEED = 20261203
NSTEPS = 3
OUT = os.path.join(os.path.dirname(os.path.abspath(__file__)), "..", "optim", "testdata", "golden_fused_adam.json")
TENSORS = [("w1", (8, 16), True), ("b1", (16,), False), ("norm", (12,), False), ("w2", (6, 8), True)]
F32 = torch.float32


def b64(a):
    a = np.ascontiguousarray(np.asarray(a, dtype="<f4"))
    return base64.b64encode(a.tobytes()).decode("ascii")


def f32(x):
    return torch.tensor(x, dtype=F32)


class FusedAdamEquivalent:
    """multi_tensor_adam's AdamW mode in float32 torch ops."""

    def __init__(self, groups, beta1, beta2, eps, moment_dtype):
        self.groups = groups  # [{"params": [...], "weight_decay": wd}]
        self.beta1, self.beta2, self.eps = f32(beta1), f32(beta2), f32(eps)
        self.dtype = moment_dtype
        self.state = {}
        self.step_n = 0

    def step(self, lr):
        self.step_n += 1
        b1, b2 = self.beta1, self.beta2
        omb1, omb2 = f32(1) - b1, f32(1) - b2
        bc1 = f32(1 - math.pow(float(b1), self.step_n))
        bc2 = f32(1 - math.pow(float(b2), self.step_n))
        lr_, eps = f32(lr), self.eps
        for grp in self.groups:
            wd = f32(grp["weight_decay"])
            for p in grp["params"]:
                st = self.state.setdefault(p, {"m": torch.zeros_like(p, dtype=self.dtype),
                                               "v": torch.zeros_like(p, dtype=self.dtype)})
                g = p.grad.detach()
                pp = p.detach()
                m = (b1 * st["m"].to(F32)) + (omb1 * g)
                v = (b2 * st["v"].to(F32)) + ((omb2 * g) * g)
                mh, vh = m / bc1, v / bc2
                denom = torch.sqrt(vh) + eps
                u = (mh / denom) + (wd * pp)
                with torch.no_grad():
                    p.copy_(pp - (lr_ * u))
                st["m"], st["v"] = m.to(self.dtype), v.to(self.dtype)


def params_from(init):
    out, off = [], 0
    for _, shape, _ in TENSORS:
        n = int(np.prod(shape))
        out.append(torch.nn.Parameter(torch.from_numpy(init[off:off + n].reshape(shape).copy())))
        off += n
    return out


def run(rng, init, moment_dtype, adam, grads, lrs, wd, equivalent=True):
    params = params_from(init)
    decay = [p for p, t in zip(params, TENSORS) if t[2]]
    nodecay = [p for p, t in zip(params, TENSORS) if not t[2]]
    if equivalent:
        opt = FusedAdamEquivalent([{"params": decay, "weight_decay": wd}, {"params": nodecay, "weight_decay": 0.0}],
                                  adam["beta1"], adam["beta2"], adam["eps"], moment_dtype)
    else:
        opt = torch.optim.AdamW([{"params": decay, "weight_decay": wd}, {"params": nodecay, "weight_decay": 0.0}],
                                lr=1.0, betas=(adam["beta1"], adam["beta2"]), eps=adam["eps"])
    steps = []
    for k in range(NSTEPS):
        off = 0
        for p, (_, shape, _) in zip(params, TENSORS):
            n = int(np.prod(shape))
            p.grad = torch.from_numpy(grads[k][off:off + n].reshape(shape).copy())
            off += n
        max_norm = adam["max_grad_norm"] if adam["max_grad_norm"] > 0 else float("inf")
        norm = float(torch.nn.utils.clip_grad_norm_(params, max_norm))
        if equivalent:
            opt.step(lrs[k])
        else:
            for g in opt.param_groups:
                g["lr"] = lrs[k]
            opt.step()
        flat = np.concatenate([p.detach().numpy().reshape(-1) for p in params])
        if equivalent:
            m = np.concatenate([opt.state[p]["m"].to(F32).numpy().reshape(-1) for p in params])
            v = np.concatenate([opt.state[p]["v"].to(F32).numpy().reshape(-1) for p in params])
        else:
            m = np.concatenate([opt.state[p]["exp_avg"].numpy().reshape(-1) for p in params])
            v = np.concatenate([opt.state[p]["exp_avg_sq"].numpy().reshape(-1) for p in params])
        steps.append({"grad_norm": norm, "lr": lrs[k], "params": flat, "m": m, "v": v})
    return steps


def main():
    torch.set_num_threads(1)
    rng = np.random.default_rng(SEED)
    n = sum(int(np.prod(s)) for _, s, _ in TENSORS)
    groups, off = [], 0
    for _, shape, decay in TENSORS:
        k = int(np.prod(shape))
        groups.append({"off": off, "n": k, "decay": decay})
        off += k
    init = (rng.standard_normal(n) * 0.5).astype(np.float32)
    cases = []
    for name, adam, wd in [
        ("clip", {"beta1": 0.9, "beta2": 0.999, "eps": 1e-8, "max_grad_norm": 1.0}, 0.1),
        ("noclip", {"beta1": 0.9, "beta2": 0.95, "eps": 1e-6, "max_grad_norm": 0.0}, 0.01),
    ]:
        grads = [(rng.standard_normal(n) * float(rng.choice([0.05, 0.3, 1.0, 4.0]))).astype(np.float32) for _ in range(NSTEPS)]
        lrs = [1e-3, 3e-3, 2e-3]
        ref = run(rng, init, F32, adam, grads, lrs, wd, equivalent=False)
        for dname, dt in [("float32", F32), ("bfloat16", torch.bfloat16)]:
            steps = run(rng, init, dt, adam, grads, lrs, wd)
            if dt == F32:
                for k in range(NSTEPS):
                    d = np.max(np.abs(steps[k]["params"] - ref[k]["params"])) / np.max(np.abs(ref[k]["params"]))
                    assert d < 1e-5, f"{name} step {k + 1}: the transcription differs from torch.optim.AdamW by {d}"
            cases.append({
                "name": f"{name}_{dname}", "moments": dname, "adam": adam, "weight_decay": wd,
                "steps": [{"grad": b64(grads[k]), "lr": s["lr"], "grad_norm": s["grad_norm"],
                           "params": b64(s["params"]), "m": b64(s["m"]), "v": b64(s["v"])} for k, s in enumerate(steps)],
            })
    meta = {
        "script": "scripts/golden_fused_adam.py", "seed": SEED, "torch": torch.__version__,
        "transformer_engine": "d0067d0da6cb01811b8072a7d304f0e00344ce2b transformer_engine/common/multi_tensor/adam.cu",
        "nemo_rl": "7ea279abfbeb698b092856d0dab61e7cf39bc909",
    }
    out = {"meta": meta, "arena": {"n": n, "groups": groups, "init_params": b64(init)}, "cases": cases}
    with open(OUT + ".tmp", "w") as fh:
        json.dump(out, fh, indent=1)
        fh.write("\n")
    os.replace(OUT + ".tmp", OUT)
    print(f"wrote {OUT}: {len(cases)} cases x {NSTEPS} steps")


if __name__ == "__main__":
    main()
