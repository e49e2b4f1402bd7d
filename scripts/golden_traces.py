#!/usr/bin/env python3
"""Write gym/testdata/golden_traces.json: training_traces envelopes for call graphs.

An independent implementation of the all_traces builders and the projection of
docs/multitrace-grpo.md §3.1-§3.3 and §2.5, written from the spec text in plain
Python (hashlib for digests). For each case it records the input TokenEntry
records, the terminal call id, and for both builders either the envelope or
"masked". gym/golden_traces_test.go reads the file and never rewrites it.
Run: make golden.
"""
import hashlib
import json
import math
import os
import platform
import random
import struct

SCRIPT = "scripts/golden_traces.py"
SEED = 4078
DOMAIN = b"nemo-gym-tokens"


class Masked(Exception):
    pass


def digest(tokens):
    if not tokens:
        return hashlib.sha256(DOMAIN).hexdigest()
    body = struct.pack(">BQ", 1, len(tokens)) + b"".join(struct.pack(">Q", t) for t in tokens)
    return hashlib.sha256(DOMAIN + body).hexdigest()


def comparable(entry):
    e = dict(entry)
    e.pop("created_at", None)
    return json.dumps(e, sort_keys=True)


def prefix_merging(entries, terminal):
    """Spec §3.1 with all_traces: returns (chains, unresolved_parent, unresolved_retries, terminal_state)."""
    # 1. de-duplicate, first copy wins; a differing later copy is a conflict
    first, order, unresolved_parent = {}, [], []
    for e in entries:
        cid = e["model_call_id"]
        if cid not in first:
            first[cid] = e
            order.append(e)
        elif comparable(first[cid]) != comparable(e):
            unresolved_parent.append(cid)
    full_prompt_ids = {e["model_call_id"] for e in order if not e.get("prompt_is_delta", False)}
    # 3. delta prompts: walk parent_call_id up to a full-prompt ancestor
    by_id = {e["model_call_id"]: e for e in order}

    def cumulative(cid, depth=0, seen=()):
        e = by_id.get(cid)
        if e is None or cid in seen or depth > 10000:
            return None
        if not e.get("prompt_is_delta", False):
            return e["prompt_token_ids"] + e["generation_token_ids"]
        if e.get("parent_call_id") is None:
            return None
        base = cumulative(e["parent_call_id"], depth + 1, seen + (cid,))
        if base is None:
            return None
        return base + e["prompt_token_ids"] + e["generation_token_ids"]

    materialized = []
    for e in order:
        if not e.get("prompt_is_delta", False):
            materialized.append(e)
            continue
        cum = cumulative(e["model_call_id"])
        if cum is None or (e.get("digest") and digest(cum) != e["digest"]):
            unresolved_parent.append(e["model_call_id"])
            continue
        m = dict(e)
        m["prompt_token_ids"] = cum[: len(cum) - len(e["generation_token_ids"])]
        m["prompt_is_delta"] = False
        materialized.append(m)
    # 4. cumulative proofs
    for e in materialized:
        cum = e["prompt_token_ids"] + e["generation_token_ids"]
        if e.get("cum_len") is not None and e["cum_len"] != len(cum):
            raise Masked("proof")
        if e.get("digest") is not None and e["digest"] != digest(cum):
            raise Masked("proof")
    # 5. empty generations
    kept = [e for e in materialized if e["generation_token_ids"]]
    if not kept:
        return [], unresolved_parent, [], ("not_captured" if terminal else "")
    # 6. order
    kept.sort(key=lambda e: (len(e["prompt_token_ids"]), e["model_call_id"]))
    # 7. parents
    nodes, by_call = [], {}
    for e in kept:
        node = {"e": e, "parent": None, "children": [], "q": False, "boundary": False}
        prompt = e["prompt_token_ids"]
        res, claim = e.get("parent_resolution"), e.get("parent_call_id")
        parent, note = None, None
        if res == "root":
            pass
        elif res == "unresolved":
            note = "unresolved"
        elif res == "resolved" or claim is not None:
            if claim is None:
                note = "missing_id"
            elif claim not in by_call:
                # longest earlier node whose cumulative tokens prefix the prompt; unique or nothing
                best, best_len = [], -1
                for other in nodes:
                    oc = other["e"]["prompt_token_ids"] + other["e"]["generation_token_ids"]
                    if len(oc) <= len(prompt) and prompt[: len(oc)] == oc:
                        if len(oc) > best_len:
                            best, best_len = [other], len(oc)
                        elif len(oc) == best_len:
                            best.append(other)
                if len(best) == 1:
                    parent, note = best[0], "recovered"
                else:
                    note = "missing"
            else:
                p = by_call[claim]["e"]
                pc = p["prompt_token_ids"] + p["generation_token_ids"]
                n = p["cum_len"] if p.get("cum_len") is not None else len(pc)
                want = p.get("digest") or digest(pc)
                if 0 <= n <= len(prompt) and digest(prompt[:n]) == want:
                    parent = by_call[claim]
                else:
                    note = "digest_mismatch"
        else:
            note = "missing_resolution"
        if note and note != "recovered":
            rewritten = (note == "digest_mismatch" and res == "resolved" and e["model_call_id"] in full_prompt_ids
                         and e.get("cum_len") is not None and e.get("digest") is not None)
            if not rewritten:
                node["boundary"] = True
                unresolved_parent.append(e["model_call_id"])
        if parent is not None:
            node["parent"] = parent
            parent["children"].append(node)
        nodes.append(node)
        by_call[e["model_call_id"]] = node
    # 8-9. retries
    term = by_call.get(terminal) if terminal else None
    ancestry = set()
    a = term
    while a is not None:
        ancestry.add(id(a))
        a = a["parent"]
    groups = {}
    for n in nodes:
        key = "roots" if n["parent"] is None else id(n["parent"])
        groups.setdefault(key, []).append(n)
    unresolved_retries = []
    for group in groups.values():
        by_prompt = {}
        for n in group:
            by_prompt.setdefault(tuple(n["e"]["prompt_token_ids"]), []).append(n)
        for rg in by_prompt.values():
            if len(rg) < 2:
                continue
            on_path = [n for n in rg if id(n) in ancestry]
            extended = [n for n in rg if any(not c["q"] for c in n["children"])]
            if on_path:
                keep = {id(n) for n in on_path} | {id(n) for n in extended}
            elif extended:
                keep = {id(n) for n in extended}
            else:
                keep = {id(min(rg, key=lambda n: n["e"]["model_call_id"]))}
                unresolved_retries.extend(n["e"]["model_call_id"] for n in rg)
            for n in rg:
                if id(n) not in keep:
                    n["q"] = True

    def path(n):
        out = []
        while n is not None:
            out.append(n)
            n = n["parent"]
        return out[::-1]

    state = ""
    if terminal:
        if term is None:
            state = "not_captured"
        elif any(n["q"] or n["boundary"] for n in path(term)):
            state = "broken"
        else:
            state = "delivered"
    chains = []
    for leaf in nodes:
        if leaf["children"]:
            continue
        p = path(leaf)
        if any(n["q"] for n in p):
            continue
        links, prev = [], None
        for n in p:
            e = n["e"]
            inter = [] if prev is None else e["prompt_token_ids"][prev:]
            links.append((e, inter))
            prev = len(e["prompt_token_ids"]) + len(e["generation_token_ids"])
        chains.append((p[0]["e"]["prompt_token_ids"], links))
    return chains, unresolved_parent, unresolved_retries, state


def per_request(entries, terminal):
    chains, up, ur, state = prefix_merging(entries, terminal)
    kept = {}
    for _, links in chains:
        for e, _ in links:
            kept[e["model_call_id"]] = e
    return [(kept[c]["prompt_token_ids"], [(kept[c], [])]) for c in sorted(kept)], up, ur, state


def project(rollout_id, builder, chains, up, ur, state):
    if up or ur:
        raise Masked("custody")
    if state in ("broken", "not_captured"):
        raise Masked("terminal")
    owned, traces = set(), []
    for root, links in sorted(chains, key=lambda c: [e["model_call_id"] for e, _ in c[1]]):
        toks, lps, mask, spans, calls = list(root), [0.0] * len(root), [0] * len(root), [], []
        for e, inter in links:
            if e["rollout_id"] != rollout_id or e.get("routed_experts") is not None:
                raise Masked("evidence")
            calls.append(e["model_call_id"])
            toks += inter
            lps += [0.0] * len(inter)
            mask += [0] * len(inter)
            start = len(toks)
            if start == 0:
                raise Masked("empty prompt")
            toks += e["generation_token_ids"]
            if e["model_call_id"] in owned:
                lps += [0.0] * len(e["generation_token_ids"])
                mask += [0] * len(e["generation_token_ids"])
            else:
                owned.add(e["model_call_id"])
                lps += e["generation_log_probs"]
                mask += [1] * len(e["generation_token_ids"])
                spans.append({"model_call_id": e["model_call_id"], "start": start, "end": len(toks)})
        if spans:
            traces.append({"trace_id": f"{rollout_id}:{calls[-1]}", "model_call_ids": calls, "token_ids": toks,
                           "generation_logprobs": lps, "loss_mask": mask, "sampled_spans": spans})
    if not traces:
        raise Masked("no traces")
    for t in traces:
        if any(not math.isfinite(x) for x in t["generation_logprobs"]):
            raise Masked("nan")
    return {"schema_version": 1, "rollout_id": rollout_id, "builder": builder, "traces": traces}


def entry(cid, prompt, gen, lps, parent=None, resolution="root", stamp=True, delta=False):
    e = {"schema_version": 3, "rollout_id": "r", "model_call_id": cid, "model": "m",
         "prompt_token_ids": prompt, "generation_token_ids": gen, "generation_log_probs": lps,
         "parent_call_id": parent, "parent_resolution": resolution, "prompt_is_delta": delta,
         "cum_len": None, "digest": None}
    return e


def stamp(e, full_prompt):
    cum = full_prompt + e["generation_token_ids"]
    e["cum_len"], e["digest"] = len(cum), digest(cum)


def random_case(rng):
    calls, fulls = [], {}
    for i in range(rng.randint(1, 7)):
        cid = "c%d" % rng.randrange(24)
        parent = None
        prompt = []
        if calls and rng.random() < 0.6:
            p = rng.choice(calls)
            parent = p["model_call_id"]
            prompt = fulls[parent] + p["generation_token_ids"] if parent in fulls else []
        if prompt and rng.random() < 0.15:
            # a chat-template rewrite of the consumed history (spec §3.1 step 7)
            prompt = list(prompt)
            prompt[rng.randrange(len(prompt))] += 6
        prompt = prompt + [rng.randrange(6) for _ in range(rng.randint(0 if parent else 1, 3))]
        gen = [rng.randrange(6) for _ in range(rng.randint(0, 3))]
        lps = [-round(rng.random() * 4, 6) for _ in gen]
        res = "resolved" if parent else ("root" if rng.random() < 0.9 else "unresolved")
        if parent and rng.random() < 0.1:
            parent = "gone"
        e = entry(cid, prompt, gen, lps, parent, res)
        if rng.random() < 0.85:
            stamp(e, prompt)
        if rng.random() < 0.05 and e["cum_len"] is not None:
            e["cum_len"] += 1
        if parent and parent in fulls and rng.random() < 0.25:
            pc = len(fulls[parent]) + len([c for c in calls if c["model_call_id"] == parent][0]["generation_token_ids"])
            if pc <= len(prompt):
                e["prompt_token_ids"] = prompt[pc:]
                e["prompt_is_delta"] = True
        fulls.setdefault(cid, prompt)
        calls.append(e)
        if rng.random() < 0.1:
            calls.append(dict(calls[rng.randrange(len(calls))]))
    terminal = rng.choice(calls)["model_call_id"] if rng.random() < 0.3 else ""
    return calls, terminal


def fixed_cases():
    a = entry("a", [1, 2], [10, 11], [-0.5, -0.25]); stamp(a, [1, 2])
    b = entry("b", [1, 2, 10, 11, 3], [12], [-1.0], "a", "resolved"); stamp(b, b["prompt_token_ids"])
    c = entry("c", [1, 2, 10, 11, 4], [13, 14], [-1.5, -2.0], "a", "resolved"); stamp(c, c["prompt_token_ids"])
    d = entry("d", [5, 6], [15], [-3.0]); stamp(d, [5, 6])
    return [("worked_example", [a, b, c, d], ""), ("worked_example_terminal_c", [d, c, b, a], "c")]


def run(entries, terminal, builder):
    try:
        fn = prefix_merging if builder == "prefix_merging" else per_request
        return project("r", builder, *fn(entries, terminal))
    except Masked:
        return "masked"


def main():
    rng = random.Random(SEED)
    cases = fixed_cases()
    for i in range(200):
        calls, terminal = random_case(rng)
        cases.append(("random_%03d" % i, calls, terminal))
    out = []
    for name, calls, terminal in cases:
        out.append({"name": name, "terminal": terminal, "entries": calls,
                    "prefix_merging": run(calls, terminal, "prefix_merging"),
                    "per_request": run(calls, terminal, "per_request")})
    meta = {"script": SCRIPT, "seed": SEED, "library": "hashlib, json (CPython %s)" % platform.python_version(),
            "spec": "docs/multitrace-grpo.md §2.5, §3.1-§3.3"}
    root = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
    path = os.path.join(root, "gym", "testdata", "golden_traces.json")
    with open(path, "w") as f:
        f.write('{"metadata": %s,\n "cases": [\n' % json.dumps(meta))
        f.write(",\n".join("  " + json.dumps(c) for c in out))
        f.write("\n]}\n")
    delivered = sum(1 for c in out if c["prefix_merging"] != "masked")
    print("wrote", path, len(out), "cases,", delivered, "delivered")


if __name__ == "__main__":
    main()
