#!/usr/bin/python3
"""Writes kernels/testdata/nemorl_topk_topp.json: NeMo RL's own top-k/top-p
filter of the training log-probabilities, run on random logits.

NeMo RL computes the training log-probabilities of a run whose
policy.generation sets top_k and/or top_p from the filtered distribution
(nemo_rl/models/policy/workers/dtensor_policy_worker.py: logits.div_(T) in
_apply_temperature_scaling, then apply_top_k_top_p, then log_softmax; the
Megatron worker goes through nemo_rl/distributed/model_utils.py's
DistributedLogprobWithSampling the same way). This script imports
nemo_rl/algorithms/logits_sampling_utils.py itself (the file needs only
torch) from a NeMo RL git dir, in a temporary directory outside the
repository, and records for each row:

  keep     the filter's keep_mask (apply_top_k_top_p's second result)
  lse      logsumexp of the filtered logits
  lp       log_softmax(filtered)[target] (-inf when the target is outside)
  ent      the filtered distribution's entropy, -sum p log p over kept tokens
  dz       d lp / d raw logits through NeMo RL's autograd (_ApplyTopKTopP's
           backward masks the gradient of filtered tokens), temperature
           included

Ties. top_k keeps every logit equal to the k-th largest (>= threshold).
top_p sorts ascending with torch.sort, whose order among equal logits decides
which of a tie group at the top-p boundary survive. On a GPU (where NeMo RL
runs) torch.sort of rows longer than 4096 is cub's segmented radix sort,
which is stable: equal logits keep id order, so the higher ids are kept.
torch 1.13's CPU sort is not stable, so this script runs NeMo RL's code with
Tensor.sort made stable (the GPU's order), and checks that the unstable CPU
sort keeps the same number of tokens in every row (it may only pick other
members of a tie group).

Cases cover exact ties (logits drawn from a few values), thresholds inside a
tie group, top_p 1.0 (no filter), top_k equal to V (no filter), top_k > V
(NeMo RL raises: recorded as an error), temperature != 1, and targets outside
the filter. Each row's top-p boundary margin (the cumulative probability's
distance from 1 - top_p on either side) is recorded; a row whose margin is
under 1e-6 would hinge on rounding and is redrawn.

Run (torch from Debian's python3-torch; the mirror from the fetch tool):
  /usr/bin/python3 scripts/nemorl_topk_topp.py --mirror /work/.mirror/NVIDIA-NeMo+RL/repo
Float32 arrays are base64 of little-endian float32; keep is base64 of uint8.
"""
import argparse
import base64
import importlib.util
import json
import math
import os
import subprocess
import sys
import tempfile

import numpy as np
import torch

SEED = 20261202
PATH = "nemo_rl/algorithms/logits_sampling_utils.py"
OUT = os.path.join(os.path.dirname(os.path.abspath(__file__)), "..", "kernels", "testdata", "nemorl_topk_topp.json")


def b64f(a):
    a = np.ascontiguousarray(np.asarray(a, dtype="<f4"))
    return base64.b64encode(a.tobytes()).decode("ascii")


def b64u8(a):
    return base64.b64encode(np.ascontiguousarray(np.asarray(a, dtype=np.uint8)).tobytes()).decode("ascii")


def num(x):
    x = float(x)
    if math.isinf(x):
        return "-inf" if x < 0 else "inf"
    return x


def load_upstream(mirror, rev):
    commit = subprocess.run(["git", "--git-dir", mirror, "rev-parse", rev], check=True, capture_output=True, text=True).stdout.strip()
    src = subprocess.run(["git", "--git-dir", mirror, "show", f"{commit}:{PATH}"], check=True, capture_output=True, text=True).stdout
    d = tempfile.mkdtemp(prefix="nemorl-topk-")
    f = os.path.join(d, "logits_sampling_utils.py")
    with open(f, "w") as fh:
        fh.write(src)
    spec = importlib.util.spec_from_file_location("logits_sampling_utils", f)
    mod = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(mod)
    return mod, commit


_orig_sort = torch.Tensor.sort


def stable_sort(self, dim=-1, descending=False, stable=None):
    return _orig_sort(self, dim=dim, descending=descending, stable=True)


def run_filter(mod, raw, T, k, p, stable):
    """NeMo RL's worker path on raw logits (rows, V): div_(T), apply_top_k_top_p,
    log_softmax. Returns filtered logits, keep mask (None when no filter)."""
    torch.Tensor.sort = stable_sort if stable else _orig_sort
    try:
        z = raw.clone()
        if T != 1.0:
            z.div_(T)
        return mod.apply_top_k_top_p(z, top_k=k, top_p=p)
    finally:
        torch.Tensor.sort = _orig_sort


def margin(z, keep_k, p):
    """Distance of the ascending cumulative probability from 1 - p at the
    boundary (float64), or inf when top-p is off."""
    if p == 1.0:
        return math.inf
    z = z.double()
    if keep_k is not None:
        z = torch.where(keep_k, z, torch.tensor(-math.inf, dtype=torch.float64))
    s, _ = torch.sort(z)
    c = torch.cumsum(torch.softmax(s, -1), -1)
    thr = 1 - p
    return float(torch.min(torch.abs(c - thr)))


def tie_logits(g, rows, V, levels, scale):
    vals = torch.randn(levels, generator=g) * scale
    idx = torch.randint(0, levels, (rows, V), generator=g)
    return vals[idx].float()


def main():
    ap = argparse.ArgumentParser()
    ap.add_argument("--mirror", required=True, help="a NeMo RL git dir (the fetch tool's mirror)")
    ap.add_argument("--rev", default="HEAD")
    args = ap.parse_args()
    mod, commit = load_upstream(args.mirror, args.rev)
    g = torch.Generator().manual_seed(SEED)
    torch.set_num_threads(1)

    specs = []  # (name, V, rows, kind, k, p, T)
    for V in (1, 2, 7, 64, 300, 4099):
        grid = ((None, 1.0), (-1, 1.0), (0, 0.9), (1, 1.0), (5, 1.0), (V, 1.0), (V, 0.8), (None, 0.9),
                (None, 0.5), (None, 0.05), (3, 0.7), (V - 1, 0.95), (None, 0.999), (V + 3, 1.0), (V + 3, 0.9))
        if V > 300:  # one long row per case, where torch.sort leaves shared memory
            grid = ((None, 0.9), (40, 0.8))
        for k, p in grid:
            for kind in (("randn", "ties", "wide") if V <= 64 else ("randn", "ties") if V <= 300 else ("ties",)):
                T = {"randn": 1.0, "ties": 0.7, "wide": 1.3}[kind]
                specs.append((f"V{V}_k{k}_p{p}_{kind}", V, 3 if V <= 300 else 2, kind, k, p, T))

    cases, redraws, unstable_same_count = [], 0, 0
    for name, V, rows, kind, k, p, T in specs:
        for attempt in range(50):
            if kind == "randn":
                raw = torch.randn(rows, V, generator=g) * 2
            elif kind == "ties":
                raw = tie_logits(g, rows, V, max(2, min(6, V // 2 + 1)), 2.0)
            else:
                raw = torch.randn(rows, V, generator=g) * 6
            try:
                filt, keep = run_filter(mod, raw, T, k, p, stable=True)
            except RuntimeError as e:
                cases.append({"name": name, "V": V, "rows": rows, "top_k": k, "top_p": p, "temperature": T,
                              "logits": b64f(raw.reshape(-1)), "error": str(e).splitlines()[0]})
                break
            z = raw.clone()
            if T != 1.0:
                z.div_(T)
            keep_k = None
            if k is not None and k > 0 and p != 1.0:
                # the top-k mask alone, for the boundary margin
                _, keep_k = run_filter(mod, raw, T, k, 1.0, stable=True)
            margins = [margin(z[r], None if keep_k is None else keep_k[r], p) for r in range(rows)]
            if min(margins) < 1e-6:
                redraws += 1
                continue
            if keep is None:
                keep = torch.ones(rows, V, dtype=torch.bool)
            # the unstable sort may pick other tie members, never another count
            _, keep_u = run_filter(mod, raw, T, k, p, stable=False)
            if keep_u is None:
                keep_u = torch.ones(rows, V, dtype=torch.bool)
            if not torch.equal(keep_u.sum(-1), keep.sum(-1)):
                raise SystemExit(f"{name}: the unstable CPU sort keeps another number of tokens")
            unstable_same_count += rows
            # targets: a kept one, then (where one exists) a filtered one, then random
            targets = []
            for r in range(rows):
                kept = torch.nonzero(keep[r]).reshape(-1)
                out = torch.nonzero(~keep[r]).reshape(-1)
                if r == 1 and len(out) > 0:
                    targets.append(int(out[torch.randint(0, len(out), (1,), generator=g)]))
                elif r == 0:
                    targets.append(int(kept[torch.randint(0, len(kept), (1,), generator=g)]))
                else:
                    targets.append(int(torch.randint(0, V, (1,), generator=g)))
            lse, lp, ent, dz = [], [], [], []
            for r in range(rows):
                x = raw[r:r + 1].clone().requires_grad_()
                torch.Tensor.sort = stable_sort
                try:
                    zz = x / T if T != 1.0 else x
                    f, _ = mod.apply_top_k_top_p(zz, top_k=k, top_p=p)
                finally:
                    torch.Tensor.sort = _orig_sort
                logp = torch.log_softmax(f.float(), dim=-1)
                lpt = logp[0, targets[r]]
                lpt.backward()
                pr = logp.detach().exp()
                e = -torch.where(keep[r:r + 1], pr * logp.detach(), torch.zeros_like(pr)).sum()
                lse.append(num(torch.logsumexp(f.detach().float(), -1)[0]))
                lp.append(num(lpt.detach()))
                ent.append(num(e))
                dz.append(x.grad.reshape(-1))
            cases.append({
                "name": name, "V": V, "rows": rows, "top_k": k, "top_p": p, "temperature": T,
                "logits": b64f(raw.reshape(-1)), "targets": targets,
                "keep": b64u8(keep.reshape(-1).to(torch.uint8)), "kept": [int(c) for c in keep.sum(-1)],
                "lse": lse, "lp": lp, "ent": ent, "dz": b64f(torch.stack(dz).reshape(-1)),
                "margin": [num(m) for m in margins],
            })
            break
        else:
            raise SystemExit(f"{name}: no draw with a boundary margin over 1e-6 in 50 tries")

    meta = {
        "script": "scripts/nemorl_topk_topp.py", "seed": SEED, "torch": torch.__version__,
        "python": sys.version.split()[0], "nemo_rl_commit": commit, "nemo_rl_file": PATH,
        "sort": "Tensor.sort made stable (the GPU's cub radix order); the unstable CPU sort kept the same count in every row",
        "rows_checked_unstable": unstable_same_count, "redraws": redraws,
    }
    with open(OUT + ".tmp", "w") as fh:
        json.dump({"meta": meta, "cases": cases}, fh, separators=(",", ":"))
        fh.write("\n")
    os.replace(OUT + ".tmp", OUT)
    print(f"wrote {OUT}: {len(cases)} cases, {redraws} redraws, NeMo RL {commit[:12]}, torch {torch.__version__}")


if __name__ == "__main__":
    main()
