#!/usr/bin/python3
"""Independent PyTorch reference for tracegrpo's GRPO loss and advantages.

Written from the spec (docs/multitrace-grpo.md §5 and §6), not from the Go code:
the loss is computed vectorized over padded [B, T] tensors and its gradient with
respect to the current log-probabilities comes from autograd; the advantages use
the spec's matrix form (M = 1 - I for leave-one-out). Runs in float64.

Writes grpo/testdata/golden_grpo.json. Run with Debian's python3-torch:
    /usr/bin/python3 scripts/golden_grpo.py
"""

import json
import math
import os
import random
import sys

import numpy as np
import torch

SEED = 20260829
OUT = os.path.join(os.path.dirname(os.path.abspath(__file__)), "..", "grpo", "testdata", "golden_grpo.json")

torch.set_default_dtype(torch.float64)


def base_options():
    # NeMo RL's ClippedPGLossConfig defaults (spec §6.1).
    return dict(
        ratio_clip_min=0.2, ratio_clip_max=0.2, ratio_clip_c=None,
        reference_policy_kl_penalty=0.01, reference_policy_kl_type="k3",
        kl_input_clamp_value=20.0, kl_output_clamp_value=10.0,
        use_on_policy_kl_approximation=False, use_importance_sampling_correction=False,
        truncated_importance_sampling_type=None, truncated_importance_sampling_ratio=None,
        truncated_importance_sampling_ratio_min=None,
        force_on_policy_ratio=False, disable_ppo_ratio=False, use_cispo=False,
    )


# One entry per golden case: (name, overrides, data knobs). Together they
# exercise every option of the loss.
VARIANTS = [
    ("defaults_k3", {}, {}),
    ("k1_beta0.1", dict(reference_policy_kl_penalty=0.1, reference_policy_kl_type="k1"), {}),
    ("k2_beta0.1", dict(reference_policy_kl_penalty=0.1, reference_policy_kl_type="k2"), {}),
    ("asymmetric_clip", dict(ratio_clip_min=0.1, ratio_clip_max=0.3), dict(spread=0.6)),
    ("dual_clip_c3", dict(ratio_clip_c=3.0), dict(spread=1.5)),
    ("is_correction_untruncated", dict(use_importance_sampling_correction=True), {}),
    ("tis_max_only", dict(use_importance_sampling_correction=True, truncated_importance_sampling_type="tis",
                          truncated_importance_sampling_ratio=1.2), dict(gen_spread=0.5)),
    ("tis_min_max", dict(use_importance_sampling_correction=True, truncated_importance_sampling_type="tis",
                         truncated_importance_sampling_ratio=1.1, truncated_importance_sampling_ratio_min=0.9),
     dict(gen_spread=0.5)),
    ("icepop", dict(use_importance_sampling_correction=True, truncated_importance_sampling_type="icepop",
                    truncated_importance_sampling_ratio=1.25, truncated_importance_sampling_ratio_min=0.8),
     dict(gen_spread=0.5)),
    ("on_policy_kl_approx", dict(use_on_policy_kl_approximation=True, reference_policy_kl_penalty=0.2), {}),
    ("kl_input_clamp_active", dict(kl_input_clamp_value=0.3, reference_policy_kl_penalty=0.5), dict(ref_spread=1.0)),
    ("kl_output_clamp_active", dict(kl_output_clamp_value=0.02, reference_policy_kl_penalty=0.5), dict(ref_spread=1.0)),
    ("force_on_policy_ratio", dict(force_on_policy_ratio=True), {}),
    ("disable_ppo_ratio", dict(disable_ppo_ratio=True), {}),
    ("cispo", dict(use_cispo=True, ratio_clip_max=0.28), dict(spread=0.6)),
    ("no_kl", dict(reference_policy_kl_penalty=0.0), {}),
    ("k1_input_clamp_on_policy", dict(reference_policy_kl_type="k1", kl_input_clamp_value=0.4,
                                      use_on_policy_kl_approximation=True, reference_policy_kl_penalty=0.3),
     dict(ref_spread=1.0)),
    ("force_on_policy_tis", dict(force_on_policy_ratio=True, use_importance_sampling_correction=True,
                                 truncated_importance_sampling_type="tis", truncated_importance_sampling_ratio=1.3,
                                 truncated_importance_sampling_ratio_min=0.7), dict(gen_spread=0.5)),
    ("disable_ppo_icepop", dict(disable_ppo_ratio=True, use_importance_sampling_correction=True,
                                truncated_importance_sampling_type="icepop", truncated_importance_sampling_ratio=1.5,
                                truncated_importance_sampling_ratio_min=0.6), dict(gen_spread=0.5)),
    ("cispo_tis_k2", dict(use_cispo=True, reference_policy_kl_type="k2", reference_policy_kl_penalty=0.05,
                          use_importance_sampling_correction=True, truncated_importance_sampling_type="tis",
                          truncated_importance_sampling_ratio=1.2), dict(spread=0.6, gen_spread=0.4)),
    ("dual_clip_asym_out_clamp", dict(ratio_clip_min=0.15, ratio_clip_max=0.25, ratio_clip_c=2.0,
                                      kl_output_clamp_value=0.05, reference_policy_kl_penalty=0.4),
     dict(spread=1.5, ref_spread=1.0)),
    ("kl_clamps_null", dict(kl_input_clamp_value=None, kl_output_clamp_value=None, reference_policy_kl_penalty=0.1),
     dict(ref_spread=2.0)),
    ("fractional_sample_mask", dict(), dict(fractional=True)),
    ("everything", dict(ratio_clip_min=0.1, ratio_clip_max=0.3, ratio_clip_c=2.5, reference_policy_kl_type="k2",
                        reference_policy_kl_penalty=0.3, kl_input_clamp_value=0.5, kl_output_clamp_value=0.08,
                        use_on_policy_kl_approximation=True, use_importance_sampling_correction=True,
                        truncated_importance_sampling_type="tis", truncated_importance_sampling_ratio=1.15,
                        truncated_importance_sampling_ratio_min=0.85),
     dict(spread=1.2, gen_spread=0.4, ref_spread=1.0, fractional=True)),
]


def make_batch(rng, knobs):
    B = rng.randint(1, 5)
    rows = []
    for b in range(B):
        T = rng.randint(2, 12)
        mask = [0] + [1 if rng.random() < 0.6 else 0 for _ in range(T - 1)]
        if sum(mask) == 0:
            mask[rng.randint(1, T - 1)] = 1
        sm = 1.0
        u = rng.random()
        if u < 0.15:
            sm = 0.0
        elif knobs.get("fractional") and u < 0.6:
            sm = rng.choice([0.25, 0.5, 0.75])
        adv = 0.0 if rng.random() < 0.15 else rng.gauss(0, 1.5)
        lp = [math.log(rng.uniform(0.02, 0.98)) for _ in range(T)]
        spread = knobs.get("spread", 0.25)
        lp_old = [x + rng.gauss(0, spread) for x in lp]
        gs = knobs.get("gen_spread", 0.2)
        lp_gen = [x + rng.gauss(0, gs) for x in lp_old]
        rs = knobs.get("ref_spread", 0.3)
        lp_ref = [x + rng.gauss(0, rs) for x in lp]
        rows.append(dict(lp=lp, lp_old=lp_old, lp_gen=lp_gen, lp_ref=lp_ref, mask=mask,
                         sample_mask=sm, advantage=adv))
    return rows


def k_of(kind, logr):
    if kind == "k1":
        return -logr
    if kind == "k2":
        return logr * logr / 2
    return torch.exp(logr) - 1 - logr


def torch_loss(rows, g_tok, o):
    B = len(rows)
    T = max(len(r["lp"]) for r in rows)

    def pad(key, fill):
        return torch.tensor([r[key] + [fill] * (T - len(r[key])) for r in rows])

    lp = pad("lp", -1.0).requires_grad_(True)
    lp_old_in, lp_gen, lp_ref = pad("lp_old", -1.0), pad("lp_gen", -1.0), pad("lp_ref", -1.0)
    token_mask = pad("mask", 0).to(torch.float64)
    token_mask[:, 0] = 0  # position 0 never has loss
    sample_mask = torch.tensor([r["sample_mask"] for r in rows])
    A = torch.tensor([r["advantage"] for r in rows])[:, None].expand(B, T)
    m = token_mask * sample_mask[:, None]
    denom = g_tok + 1e-8

    lp_old = lp.detach() if o["force_on_policy_ratio"] else lp_old_in

    lo, hi = 1 - o["ratio_clip_min"], 1 + o["ratio_clip_max"]
    if o["force_on_policy_ratio"]:
        ratio = torch.exp(lp - lp.detach())
        ratio_c = ratio
    elif o["disable_ppo_ratio"]:
        ratio = lp
        ratio_c = lp
    else:
        ratio = torch.exp(lp - lp_old)
        ratio_c = ratio.clamp(lo, hi)
    if o["use_cispo"]:
        ell = -A * ratio_c.detach() * lp
    else:
        ell = torch.max(-A * ratio, -A * ratio_c)
    if o["ratio_clip_c"] is not None:
        ell = torch.where(A < 0, torch.min(ell, -A * o["ratio_clip_c"]), ell)

    w = torch.nan_to_num(torch.exp(lp_old - lp_gen).detach(), nan=0.0, posinf=0.0, neginf=0.0)
    tis = o["truncated_importance_sampling_type"]
    oob = torch.zeros_like(w)
    if tis == "tis":
        wmin = o["truncated_importance_sampling_ratio_min"] or 0.0
        wmax = o["truncated_importance_sampling_ratio"]
        oob = ((w > wmax) | (w < wmin)).to(torch.float64)
        w = w.clamp(wmin, wmax)
    elif tis == "icepop":
        wmin, wmax = o["truncated_importance_sampling_ratio_min"], o["truncated_importance_sampling_ratio"]
        keep = (w >= wmin) & (w <= wmax)
        oob = (~keep).to(torch.float64)
        w = torch.where(keep, w, torch.zeros_like(w))
    w_metric = w
    w_used = w if o["use_importance_sampling_correction"] else torch.ones_like(w)

    actor = (w_used * ell * m).sum() / denom

    beta = o["reference_policy_kl_penalty"]
    if beta != 0:
        raw = lp_ref - lp
        cin = o["kl_input_clamp_value"]
        logr = raw.clamp(-cin, cin) if cin is not None else raw
        kk = k_of(o["reference_policy_kl_type"], logr)
        if o["use_on_policy_kl_approximation"]:
            kw = torch.exp(lp - lp_gen)
        else:
            kw = torch.exp(lp - lp.detach())
        kw = torch.nan_to_num(kw, nan=0.0, posinf=0.0, neginf=0.0)
        if cin is not None:
            kw = torch.where(raw.abs() > cin, kw.detach(), kw)
        v = kw * kk
        cout = o["kl_output_clamp_value"]
        if cout is not None:
            v = v.clamp(-cout, cout)
        kl = beta * v
    else:
        kl = torch.zeros_like(lp)
    kl_loss = (kl * m).sum() / denom
    loss = actor + kl_loss
    loss.backward()
    grad = lp.grad

    with torch.no_grad():
        sel = m > 0
        rd = ratio.detach()

        def ext(x, f):
            v = x[sel]
            return f(v).item() if v.numel() > 0 else None

        ppo = not (o["force_on_policy_ratio"] or o["disable_ppo_ratio"])
        metrics = dict(
            tokens=m.sum().item(),
            eligible_tokens=int(sel.sum().item()),
            nonzero_advantage_tokens=int((sel & (A != 0)).sum().item()),
            ratio_sum=(m * rd).sum().item(),
            ratio_clamped_sum=(m * ratio_c.detach()).sum().item(),
            ratio_min=ext(rd, torch.min), ratio_max=ext(rd, torch.max),
            clip_low=(m * (rd < lo)).sum().item() if ppo else 0.0,
            clip_high=(m * (rd > hi)).sum().item() if ppo else 0.0,
            is_weight_sum=(m * w_metric).sum().item(),
            is_weight_min=ext(w_metric, torch.min), is_weight_max=ext(w_metric, torch.max),
            is_oob=(m * oob).sum().item(),
            kl_sum=(m * kl.detach()).sum().item(),
            token_mult_prob_error=(torch.exp(torch.abs(lp_gen - lp_old.detach()) * m) * m).sum().item(),
            gen_kl_error=(k_of(o["reference_policy_kl_type"], lp_old.detach() - lp_gen) * m).sum().item(),
        )
    dlp = [grad[b, : len(rows[b]["lp"])].tolist() for b in range(B)]
    return dict(loss=loss.item(), actor_loss=actor.item(), kl_loss=kl_loss.item(), dlp=dlp, metrics=metrics)


def torch_advantages(groups, rewards, valid, normalize, loo, clip_low, clip_high):
    g = torch.tensor(groups)
    r = torch.tensor(rewards)
    v = torch.tensor(valid, dtype=torch.float64)
    n = len(groups)
    b = torch.zeros(n)
    std = torch.zeros(n)
    L = 1.0 if loo else 0.0
    for key in torch.unique(g):
        idx = (g == key).nonzero().flatten()
        rv, vv = r[idx], v[idx]
        nv = vv.sum()
        if nv <= 1:
            b[idx] = rv
            std[idx] = 0.0
            continue
        k = len(idx)
        M = torch.ones(k, k) - (torch.eye(k) if loo else 0)
        N = nv - L
        bb = M @ (vv * rv) / N
        q = M @ (vv * rv * rv) / N
        c = M @ (vv * rv) / N
        s = torch.sqrt((q - c * c) * (N / (N - 1)))
        # tracegrpo's one rule beyond NeMo RL: a member whose voting peers'
        # rewards are all identical has std exactly 0 (the one-pass q - c^2
        # leaves rounding noise there that epsilon would then divide).
        W = (M * vv[None, :]) > 0
        big = torch.where(W, rv[None, :].expand(k, k), torch.full((k, k), -math.inf)).max(1).values
        small = torch.where(W, rv[None, :].expand(k, k), torch.full((k, k), math.inf)).min(1).values
        s = torch.where(big == small, torch.zeros_like(s), s)
        s = torch.where(torch.isnan(s), torch.zeros_like(s), s)
        b[idx] = bb
        std[idx] = s
    a = r - b
    if normalize:
        a = torch.where(std > 0, a / (std + 1e-6), a)
    if clip_low is not None or clip_high is not None:
        a = a.clamp(min=clip_low, max=clip_high)
    return dict(
        advantage=a.tolist(),
        baseline=b.tolist(),
        std=[x if math.isfinite(x) else None for x in std.tolist()],
    )


def main():
    rng = random.Random(SEED)
    torch.manual_seed(SEED)
    loss_cases = []
    for rep in range(2):
        for name, over, knobs in VARIANTS:
            o = base_options()
            o.update(over)
            rows = make_batch(rng, knobs)
            g = sum(sum(r["mask"][1:]) * r["sample_mask"] for r in rows)
            if g == 0:
                rows[0]["sample_mask"] = 1.0
                g = sum(sum(r["mask"][1:]) * r["sample_mask"] for r in rows)
            if rep == 1:
                # A micro-batch of a larger step: G_tok counts other rows too.
                g += rng.randint(1, 20)
            out = torch_loss(rows, g, o)
            loss_cases.append(dict(name=f"{name}/{rep}", options=o, g_tok=g, rows=rows, **out))

    adv_cases = []
    for i in range(24):
        n = rng.randint(1, 12)
        ngroups = rng.randint(1, 4)
        groups = [rng.randint(0, ngroups - 1) * 7 + 3 for _ in range(n)]
        if i % 3 == 0:
            rewards = [float(rng.randint(0, 1)) for _ in range(n)]
        elif i % 3 == 1:
            rewards = [rng.choice([0.0, 0.5, 1.0, 2.0]) for _ in range(n)]
        else:
            rewards = [rng.gauss(0, 3) for _ in range(n)]
        valid = [rng.random() < 0.75 for _ in range(n)]
        normalize = i % 2 == 0
        loo = (i // 2) % 2 == 0
        clip_low = -1.0 if i % 5 == 0 else None
        clip_high = 0.8 if i % 7 == 0 else None
        out = torch_advantages(groups, rewards, valid, normalize, loo, clip_low, clip_high)
        adv_cases.append(dict(name=f"adv/{i}", groups=groups, rewards=rewards, valid=valid,
                              normalize_rewards=normalize, leave_one_out=loo,
                              clip_low=clip_low, clip_high=clip_high, **out))

    # Ties on rewards that are not exact binary fractions (0.58 = 0.4*0.7 +
    # 0.6*0.3 in a verifier): a member whose peers all tie must get std 0.
    for i in range(6):
        n = 8
        ties = [0.58, 0.46, 0.1, 0.7, 0.3, 0.83][i]
        rewards = [ties] * n
        rewards[rng.randint(0, n - 1)] = rng.choice([0.46, 0.58, 0.99])
        groups = [5] * n
        valid = [True] * n
        if i >= 3:
            valid[rng.randint(0, n - 1)] = False
        normalize, loo = True, i % 2 == 0
        out = torch_advantages(groups, rewards, valid, normalize, loo, None, None)
        adv_cases.append(dict(name=f"adv/ties/{i}", groups=groups, rewards=rewards, valid=valid,
                              normalize_rewards=normalize, leave_one_out=loo,
                              clip_low=None, clip_high=None, **out))

    doc = dict(
        meta=dict(script="scripts/golden_grpo.py", seed=SEED, torch=torch.__version__, numpy=np.__version__,
                  python=sys.version.split()[0], dtype="float64"),
        loss_cases=loss_cases,
        advantage_cases=adv_cases,
    )
    os.makedirs(os.path.dirname(OUT), exist_ok=True)
    with open(OUT, "w") as f:
        json.dump(doc, f, allow_nan=False, separators=(",", ":"))
        f.write("\n")
    print(f"wrote {OUT}: {len(loss_cases)} loss cases, {len(adv_cases)} advantage cases")


if __name__ == "__main__":
    main()
