#!/usr/bin/env python3
"""Differential harness: NeMo Gym's own capture writer and builders, on scenarios of our design.

Writes gym/testdata/gymdiff/: capture stores written by Gym's real TokenCaptureStore
(begin_call / put / cancel_call / mark_incomplete / freeze), rollout records, and what Gym's
real builders (prefix_merging, per_request), terminal attribution and projection make of
them. cmd/train/gymdiff_test.go runs `train traces` over the same data and compares field by
field. The directory holds data only; Gym's code is never copied into the repository.

Gym's modules are assembled in a temporary directory outside the repository from:
  --upstream DIR  the six files of NeMo Gym PR #3212 read from Gym's public source:
                  builder.py, training_traces.py  @ f926489d7c01086d0923a5b6333a66df696e6baf
                  records.py                      @ 1cf67559ce25ecf884dde2754306bce64f18f271
                  terminal.py                     @ 313754e2498ec0a112906d9101e343c352ca5938
                  fingerprint.py                  @ 2ab3aea0cb02f8bac7dcf13092810b4da3fa2c31
                  store.py                        @ 05a4377b4b35c044bcb0aeb2bd9810ba18ec9c22
                  (each is checked against its known length in characters)
  --mirror GITDIR a clone of NVIDIA-NeMo/Gym holding main 07d6b0d07b22fcf530b4c211dae2ee23100428e4, for
                  protocols.py (TokenCaptureSnapshot) and rollout_correlation.py (the capture key).
rollout_correlation.py imports two configuration modules for four constants; those two modules
are replaced by stubs holding exactly those constants (_ng_task_index, _ng_rollout_index,
_ng_attempt_index, _ng_rollout_id and "ng-rollout"). Nothing else is stubbed.

The PR's finalizer (delivery.py / consumer.py at the PR head) could not be read; finalize()
below composes Gym's real functions the way spec docs/multitrace-grpo.md §2.3, §3.5 and §3.6
describe: key (rollout_correlation) → freeze_now → incomplete / empty / mixed models →
resolve_terminal → a declared terminal that is not attributed masks → run_builder(all_traces)
→ project_training_traces; any exception masks, as Gym's consumer masks a failed build. Gym's
error text is mapped to tracegrpo's reason codes by gym_reason() (the only judgement here).

Needs Python >= 3.11 with pydantic 2 and orjson (the machine's pyenv python3 has pydantic
2.13.4 and orjson 3.8.3; Debian's python3 lacks both). Run:
  python3 scripts/gym_differential.py --upstream /tmp/gym-upstream-src \\
      --mirror /work/.mirror/NVIDIA-NeMo+Gym/repo
"""
from __future__ import annotations

import argparse
import asyncio
import copy
import hashlib
import json
import multiprocessing
import os
import platform
import resource
import shutil
import subprocess
import sys
import tempfile
import traceback

SCRIPT = "scripts/gym_differential.py"
REPO = os.path.normpath(os.path.join(os.path.dirname(os.path.abspath(__file__)), ".."))
OUT = os.path.join(REPO, "gym", "testdata", "gymdiff")
MAIN_COMMIT = "07d6b0d07b22fcf530b4c211dae2ee23100428e4"
UPSTREAM = {
    "builder.py": ("f926489d7c01086d0923a5b6333a66df696e6baf", 31918),
    "training_traces.py": ("f926489d7c01086d0923a5b6333a66df696e6baf", 6584),
    "records.py": ("1cf67559ce25ecf884dde2754306bce64f18f271", 12452),
    "terminal.py": ("313754e2498ec0a112906d9101e343c352ca5938", 14238),
    "fingerprint.py": ("2ab3aea0cb02f8bac7dcf13092810b4da3fa2c31", 11704),
    "store.py": ("05a4377b4b35c044bcb0aeb2bd9810ba18ec9c22", 20944),
}
FROM_MIRROR = {
    "nemo_gym/token_id_capture/protocols.py": "nemo_gym/token_id_capture/protocols.py",
    "nemo_gym/rollout_correlation.py": "nemo_gym/rollout_correlation.py",
}
STUBS = {
    "nemo_gym/config_types.py": 'ROLLOUT_PATH_PREFIX = "ng-rollout"\n',
    "nemo_gym/global_config.py": (
        'TASK_INDEX_KEY_NAME = "_ng_task_index"\nROLLOUT_INDEX_KEY_NAME = "_ng_rollout_index"\n'
        'ATTEMPT_INDEX_KEY_NAME = "_ng_attempt_index"\nROLLOUT_ID_KEY_NAME = "_ng_rollout_id"\n'
    ),
}
BUILDERS = ("prefix_merging", "per_request")


def assemble(upstream: str, mirror: str) -> tuple[str, dict]:
    root = tempfile.mkdtemp(prefix="gym-diff-")
    assert not os.path.abspath(root).startswith(REPO + os.sep), "assembly must be outside the repository"
    pkg = os.path.join(root, "nemo_gym", "token_id_capture")
    os.makedirs(pkg)
    open(os.path.join(root, "nemo_gym", "__init__.py"), "w").close()
    open(os.path.join(pkg, "__init__.py"), "w").close()
    provenance = {}
    for name, (commit, length) in UPSTREAM.items():
        with open(os.path.join(upstream, name), encoding="utf-8") as f:
            text = f.read()
        if len(text) != length:
            sys.exit(f"{name}: {len(text)} characters, but Gym's file @ {commit[:9]} has {length}")
        with open(os.path.join(pkg, name), "w", encoding="utf-8") as f:
            f.write(text)
        provenance["nemo_gym/token_id_capture/" + name] = {"commit": commit, "chars": length,
                                                           "sha256": hashlib.sha256(text.encode()).hexdigest()}
    for dest, src in FROM_MIRROR.items():
        text = subprocess.run(["git", "--git-dir", mirror, "show", f"{MAIN_COMMIT}:{src}"], check=True,
                              capture_output=True, text=True).stdout
        with open(os.path.join(root, dest), "w", encoding="utf-8") as f:
            f.write(text)
        provenance[dest] = {"commit": MAIN_COMMIT, "chars": len(text), "sha256": hashlib.sha256(text.encode()).hexdigest()}
    for dest, text in STUBS.items():
        with open(os.path.join(root, dest), "w") as f:
            f.write(text)
        provenance[dest] = {"stub": text.strip().replace("\n", "; ")}
    return root, provenance


# ---------------------------------------------------------------- Gym's finalization

def gym_reason(stage: str, err: BaseException | None, tb: str) -> str:
    """Map where and how Gym refused a rollout to tracegrpo's reason code."""
    text = f"{type(err).__name__}: {err}" if err else ""
    if stage == "incomplete":
        return "capture_incomplete"
    if stage == "empty":
        return "nothing_recorded"
    if stage == "mixed":
        return "mixed_models"
    if stage in ("terminal_raises", "declared"):
        return "terminal_unavailable"
    if isinstance(err, MemoryError):
        return "memory_exhausted"
    if stage == "freeze":
        if "Invalid token-capture index offset" in text:
            return "index_mismatch"
        if "conflicting durable payloads" in text:
            return "conflicting_payloads"
        if "in _read_state" in tb or "Invalid token-capture state" in text:
            return "invalid_state"
        if "is retired" in text:
            return "capture_retired"
        if "schema_version" in text:
            return "unsupported_schema"
        if isinstance(err, (IsADirectoryError,)):
            return "not_a_regular_file"
        return "invalid_capture"
    if stage == "build":
        for needle, reason in (("all_traces requires resolved", "unresolved_custody"),
                               ("cumulative proof mismatch", "proof_mismatch"),
                               ("declared terminal call is not safely captured", "terminal_unavailable"),
                               ("different rollout", "foreign_rollout"),
                               ("routed_experts", "routed_experts"),
                               ("nonempty conditioning prompt", "empty_prompt"),
                               ("log-prob/token length mismatch", "invalid_envelope")):
            if needle in text:
                return reason
        if "traces" in text and "at least 1 item" in text:
            return "no_trainable_calls"
        return "gym_build_error"
    return stage


def finalize(record: dict, store_dir: str, builder: str) -> dict:
    """Gym's all_traces finalization of one record against a copy of its store."""
    from nemo_gym.rollout_correlation import maybe_rollout_id_from_run_body
    from nemo_gym.token_id_capture.builder import run_builder
    from nemo_gym.token_id_capture.store import TokenCaptureStore
    from nemo_gym.token_id_capture.terminal import resolve_terminal
    from nemo_gym.token_id_capture.training_traces import project_training_traces

    rec = copy.deepcopy(record)
    result = {"outcome": "masked", "reason": "", "error": "", "notes": None, "terminal": None, "training_traces": None}

    def masked(stage, err=None, tb="", metrics=None):
        result["reason"] = gym_reason(stage, err, tb)
        result["error"] = f"{type(err).__name__}: {err}" if err else stage
        rec["mask_sample"] = True
        rec.pop("training_traces", None)
        rec["_ng_token_capture"] = dict(metrics or {}, error=result["error"])
        result["record"] = rec
        return result

    try:
        rid = maybe_rollout_id_from_run_body(rec)
    except (TypeError, ValueError) as err:
        result["stage"] = "correlation"
        return masked("malformed_rollout_id", err)
    if rid is None:
        return masked("no_capture_key")
    store = TokenCaptureStore(store_dir)
    try:
        snap = store.freeze_now(rid)
    except Exception as err:
        return masked("freeze", err, traceback.format_exc())
    entries = list(snap.entries)
    metrics = {"n_calls": len(entries), "capture_incomplete": bool(snap.incomplete)}
    if snap.incomplete:
        return masked("incomplete", metrics=metrics)
    if not entries:
        return masked("empty", metrics=metrics)
    if len({e.model for e in entries}) > 1:
        return masked("mixed", metrics=metrics)
    response = rec.get("response")
    try:
        att = resolve_terminal(entries, response if isinstance(response, dict) else None,
                               rec.get("_ng_terminal_model_call_id") or None,
                               declared_response_id=rec.get("terminal_response_id") or None)
    except Exception as err:
        return masked("terminal_raises", err, traceback.format_exc(), metrics)
    result["terminal"] = {"call_id": att.model_call_id or "", "method": att.method, "reason": att.reason}
    if rec.get("terminal_response_id") and not att.attributed:
        return masked("declared", metrics=metrics)
    try:
        out = run_builder(entries, builder, att.model_call_id, all_traces=True)
    except Exception as err:
        return masked("build", err, traceback.format_exc(), metrics)
    n = out.notes
    result["notes"] = {
        "builder": n.builder, "roots": n.roots, "chains": n.chains,
        "generated_tokens_captured": n.generated_tokens_captured,
        "generated_tokens_delivered": n.generated_tokens_delivered,
        "delivered_fraction": n.delivered_fraction,
        "unresolved_retries": list(n.unresolved_retries), "terminal_call_id": n.terminal_call_id or "",
        "terminal_chain": n.terminal_chain, "empty_generation_calls": list(n.empty_generation_calls),
        "parent_link_failures": dict(n.parent_link_failures), "unresolved_parent_calls": list(n.unresolved_parent_calls),
        "quarantined": list(out.quarantined),
    }
    metrics.update({
        "chains": n.chains, "roots": n.roots, "quarantined_calls": len(out.quarantined),
        "quarantined_fraction": round(len(out.quarantined) / len(entries), 4),
        "delivered_fraction": n.delivered_fraction,
        "generated_tokens_captured": n.generated_tokens_captured,
        "generated_tokens_delivered": n.generated_tokens_delivered,
        "parent_link_failures": dict(n.parent_link_failures),
        "unresolved_parent_calls": len(n.unresolved_parent_calls),
        "empty_generation_calls": len(n.empty_generation_calls),
        "terminal_attribution": {"method": att.method, "call_id": att.model_call_id or "", "reason": att.reason,
                                 "chain": n.terminal_chain},
    })
    try:
        batch = project_training_traces(rid, out)
    except Exception as err:
        return masked("build", err, traceback.format_exc(), metrics)
    result["outcome"] = "delivered"
    result["training_traces"] = batch.model_dump(mode="json")
    rec["training_traces"] = result["training_traces"]
    rec["_ng_token_capture"] = metrics
    result["record"] = rec
    return result


def _finalize_child(q, record, store_dir, builder, gym_root):
    sys.path.insert(0, gym_root)
    resource.setrlimit(resource.RLIMIT_AS, (2 << 30, 2 << 30))
    try:
        q.put(finalize(record, store_dir, builder))
    except BaseException as err:  # MemoryError and the like: Gym's code did not return
        q.put({"outcome": "raised", "reason": "", "error": f"{type(err).__name__}: {err}", "record": record,
               "notes": None, "terminal": None, "training_traces": None})


def finalize_isolated(record, store_dir, builder, gym_root, timeout=5.0):
    """finalize() in a child process, for stores on which Gym's code may hang or grow without bound."""
    ctx = multiprocessing.get_context("fork")
    q = ctx.Queue()
    p = ctx.Process(target=_finalize_child, args=(q, record, store_dir, builder, gym_root))
    p.start()
    p.join(timeout)
    if p.is_alive():
        p.kill()
        p.join()
        return {"outcome": "hang", "reason": "", "error": f"Gym's finalization did not return within {timeout}s",
                "record": record, "notes": None, "terminal": None, "training_traces": None}
    return q.get(timeout=1)


# ---------------------------------------------------------------- scenarios

class Scenario:
    def __init__(self, name, what, departure=""):
        self.name, self.what, self.departure = name, what, departure
        self.rid = name.replace("_", "-")
        self.record = {"_ng_rollout_id": self.rid, "reward": 1.0}
        self.runtime = {}  # fixtures the Go test creates: {"mkfifo": [...], "symlink": {path: target}}
        self.isolated = False


def msg(text):
    return {"type": "message", "role": "assistant", "id": "msg-" + hashlib.sha1(text.encode()).hexdigest()[:8],
            "content": [{"type": "output_text", "text": text, "annotations": []}]}


def call(rid, cid, prompt, gen, parent=None, *, text=None, resp=None, t=0.0, model="policy", lp0=-0.25, extra=None):
    from nemo_gym.token_id_capture.records import ParentResolutionStatus, TokenEntry, stamp_lineage
    items = [msg(text if text is not None else f"{cid} says {gen}")]
    kw = dict(rollout_id=rid, model_call_id=cid, model=model, prompt_token_ids=list(prompt),
              generation_token_ids=list(gen),
              generation_log_probs=[round(lp0 - 0.125 * i - 0.0009765625 * g, 10) for i, g in enumerate(gen)],
              output_items=items, token_item_index=0, response_id=resp or f"resp-{cid}",
              created_at=1764512345.0 + t, prompt_is_delta=False)
    kw.update(extra or {})
    e = TokenEntry(**kw)
    return stamp_lineage(e, parent, parent_resolution=ParentResolutionStatus.RESOLVED if parent else ParentResolutionStatus.ROOT)


def run(coro):
    return asyncio.run(coro)


def put_all(store, entries, intents=True):
    for e in entries:
        if intents:
            run(store.begin_call(e.rollout_id, e.model_call_id))
        run(store.put(e))


def entries_path(d, rid):
    return os.path.join(d, rid + ".tokens.jsonl")


def build_scenarios(store_dir):
    from nemo_gym.token_id_capture.fingerprint import FINGERPRINT_VERSION, assistant_fingerprint
    from nemo_gym.token_id_capture.store import TokenCaptureStore

    store = TokenCaptureStore(store_dir)
    out = []

    def add(s):
        out.append(s)
        return s

    def freeze(rid):
        run(store.freeze(rid))

    # 1. one call, scored response matches by id and content
    s = add(Scenario("single_call", "one call; response id and content name it"))
    put_all(store, [call(s.rid, "a", [1, 2, 3], [40, 41, 42])])
    freeze(s.rid)
    s.record["response"] = {"id": "resp-a", "output": [msg("a says [40, 41, 42]")]}

    # 2. append-only multi-turn chain with tool results between calls
    s = add(Scenario("multi_turn", "three calls, each continuing the last with tool tokens between"))
    a = call(s.rid, "t1", [1, 2, 3], [10, 11], t=1)
    b = call(s.rid, "t2", [1, 2, 3, 10, 11, 90, 91], [12, 13, 14], "t1", t=2)
    c = call(s.rid, "t3", [1, 2, 3, 10, 11, 90, 91, 12, 13, 14, 92], [15], "t2", t=3)
    put_all(store, [a, b, c])
    freeze(s.rid)
    s.record["response"] = {"id": "resp-t3", "output": [msg("t3 says [15]")]}

    # 3. forks plus an independent root (spec §3.4)
    s = add(Scenario("forks", "a→b, a→c and an independent root d"))
    put_all(store, [call(s.rid, "a", [1, 2], [10, 11], t=1), call(s.rid, "b", [1, 2, 10, 11, 3], [12], "a", t=2),
                    call(s.rid, "c", [1, 2, 10, 11, 4], [13, 14], "a", t=3), call(s.rid, "d", [5, 6], [15], t=4)])
    freeze(s.rid)
    s.record["response"] = {"id": "resp-b", "output": [msg("b says [12]")]}

    # 4. context compaction: a new root after the summary
    s = add(Scenario("compaction", "a chain, then a compacted root continuing in a second chain"))
    put_all(store, [call(s.rid, "p1", [1, 2, 3], [20, 21], t=1),
                    call(s.rid, "p2", [1, 2, 3, 20, 21, 7], [22], "p1", t=2),
                    call(s.rid, "q1", [1, 99, 22], [30, 31], t=3),
                    call(s.rid, "q2", [1, 99, 22, 30, 31, 8], [32, 33], "q1", t=4)])
    freeze(s.rid)
    s.record["response"] = {"id": "resp-q2", "output": [msg("q2 says [32, 33]")]}

    # 5-9. retries of the final call
    def retry_pair(s):
        put_all(store, [call(s.rid, "ra", [1, 2, 3], [50, 51], t=1, text="A answers 4"),
                        call(s.rid, "rb", [1, 2, 3], [60, 61, 62], t=2, text="B answers 5")])
        freeze(s.rid)

    s = add(Scenario("retry_by_id", "two retries; response id and content name the second"))
    retry_pair(s)
    s.record["response"] = {"id": "resp-rb", "output": [msg("B answers 5")]}
    s = add(Scenario("retry_unresolved", "two retries; the response names neither"))
    retry_pair(s)
    s.record["response"] = {"output": [msg("C answers 6")]}
    s = add(Scenario("retry_by_content", "two retries; no response id, the content names the second"))
    retry_pair(s)
    s.record["response"] = {"output": [{"role": "user", "content": "q"}, msg("B answers 5")]}
    s = add(Scenario("retry_witness_disagreement", "two retries; response id names the first, content the second",
                     departure="witness-disagreement"))
    retry_pair(s)
    s.record["response"] = {"id": "resp-ra", "output": [msg("B answers 5")]}
    s = add(Scenario("retry_cumulative_fingerprint", "two retries; a full transcript matches the recorded continuation fingerprint"))
    transcript = [{"role": "assistant", "content": "plan"}, {"role": "tool", "content": "r", "tool_call_id": "x"},
                  {"role": "assistant", "content": "done"}]
    fp = assistant_fingerprint(transcript)
    put_all(store, [call(s.rid, "ca", [1, 2, 3], [50, 51], t=1, text="other"),
                    call(s.rid, "cb", [1, 2, 3], [60, 61], t=2, text="also other",
                         extra={"continuation_fingerprint": fp, "fingerprint_version": FINGERPRINT_VERSION})])
    freeze(s.rid)
    s.record["response"] = {"output": transcript}

    # 10. witnesses disagree with no retry to resolve
    s = add(Scenario("witness_disagreement_no_retry", "explicit terminal names one call, response id another; no retry",
                     departure="witness-disagreement"))
    put_all(store, [call(s.rid, "w1", [1, 2], [10], t=1), call(s.rid, "w2", [3, 4], [11], t=2)])
    freeze(s.rid)
    s.record.update({"_ng_terminal_model_call_id": "w1", "response": {"id": "resp-w2", "output": []}})

    # 11. declared terminal that matches nothing
    s = add(Scenario("declared_miss", "terminal_response_id names a response no call served"))
    put_all(store, [call(s.rid, "d1", [1, 2], [10], t=1)])
    freeze(s.rid)
    s.record.update({"terminal_response_id": "resp-nope", "response": {"id": "resp-d1", "output": []}})

    # 12. zero calls: an intent opened and cancelled
    s = add(Scenario("zero_call", "an intent opened and cancelled; nothing captured"))
    s.rid = "12-0"
    s.record = {"_ng_task_index": 12, "_ng_rollout_index": 0, "reward": 0.0, "response": {"id": "r", "output": []}}
    run(store.begin_call(s.rid, "never"))
    run(store.cancel_call(s.rid, "never"))
    freeze(s.rid)

    # 13. the environment flagged the sample (the trainer masks it, the build does not)
    s = add(Scenario("env_masked", "instance_config.mask_sample is true; the capture is healthy"))
    put_all(store, [call(s.rid, "e1", [1, 2], [10, 11], t=1)])
    freeze(s.rid)
    s.record.update({"instance_config": {"mask_sample": True}, "response": {"id": "resp-e1", "output": []}})

    # 14. an overlong trace (the trainer masks it row by row, the build delivers it)
    s = add(Scenario("overlong", "a 300-token trace next to a short root"))
    put_all(store, [call(s.rid, "long", list(range(100, 380)), list(range(400, 420)), t=1),
                    call(s.rid, "short", [1, 2], [3], t=2)])
    freeze(s.rid)
    s.record["response"] = {"id": "resp-short", "output": []}

    # 15-16. incomplete captures
    s = add(Scenario("marked_incomplete", "a call was lost: mark_incomplete"))
    put_all(store, [call(s.rid, "m1", [1, 2], [10], t=1)])
    run(store.begin_call(s.rid, "m2"))
    run(store.mark_incomplete(s.rid, "m2"))
    freeze(s.rid)
    s = add(Scenario("dangling_intent", "an intent without an entry"))
    put_all(store, [call(s.rid, "i1", [1, 2], [10], t=1)])
    run(store.begin_call(s.rid, "i2"))
    freeze(s.rid)

    # 17-18. torn tails (the writer died mid-line; not frozen)
    def torn(s, intent):
        put_all(store, [call(s.rid, "x1", [1, 2], [10, 11], t=1)], intents=intent)
        x2 = call(s.rid, "x2", [1, 2, 10, 11, 5], [12], "x1", t=2)
        if intent:
            run(store.begin_call(s.rid, "x2"))
        line = json.dumps(x2.model_dump(mode="json"), sort_keys=True, separators=(",", ":")).encode()
        with open(entries_path(store_dir, s.rid), "ab") as f:
            f.write(line[: len(line) // 2])
    s = add(Scenario("torn_tail_with_intent", "the writer died mid-line of a call whose intent was recorded"))
    torn(s, True)
    s = add(Scenario("torn_tail_no_intent", "the writer died mid-line; no intents were recorded", departure="torn-tail"))
    torn(s, False)

    # 19-20. the index against the file
    s = add(Scenario("lost_acknowledged_line", "no intents; the file lost its last acknowledged line"))
    put_all(store, [call(s.rid, "l1", [1, 2], [10, 11], t=1), call(s.rid, "l2", [1, 2, 10, 11, 5], [12], "l1", t=2)],
            intents=False)
    freeze(s.rid)
    data = open(entries_path(store_dir, s.rid), "rb").read()
    open(entries_path(store_dir, s.rid), "wb").write(data[: data.index(b"\n") + 1])
    s = add(Scenario("acknowledged_line_altered", "an acknowledged line's logprob changed in place (same length, still valid)",
                     departure="acknowledged-digests"))
    put_all(store, [call(s.rid, "g1", [1, 2], [10, 11], t=1)], intents=False)
    freeze(s.rid)
    data = open(entries_path(store_dir, s.rid), "rb").read()
    i = data.index(b'"generation_log_probs":[-0.') + len(b'"generation_log_probs":[-')
    open(entries_path(store_dir, s.rid), "wb").write(data[:i] + b"1" + data[i + 1:])  # -0.25 -> -1.25

    # 21-23. duplicates
    def dup_line(s, created_at_shift):
        put_all(store, [call(s.rid, "u1", [1, 2], [10, 11], t=1)], intents=False)
        freeze(s.rid)
        line = open(entries_path(store_dir, s.rid), "rb").read().splitlines()[0]
        if created_at_shift:
            entry = json.loads(line)
            entry["created_at"] += created_at_shift
            import orjson
            line = orjson.dumps(entry, option=orjson.OPT_SORT_KEYS)
        with open(entries_path(store_dir, s.rid), "ab") as f:
            f.write(line + b"\n")
    s = add(Scenario("duplicate_identical", "an at-least-once transport repeated a line byte for byte"))
    dup_line(s, 0)
    s = add(Scenario("duplicate_conflicting_tail", "a second line for one call id differs in created_at (unindexed)"))
    dup_line(s, 0.5)
    s = add(Scenario("duplicate_conflicting_indexed", "two lines for one call id differ in created_at, both acknowledged",
                     departure="conflict-in-index"))
    dup_line(s, 0.5)
    st = json.load(open(os.path.join(store_dir, s.rid + ".tokens.state.json")))
    st["indexed_size"] = os.path.getsize(entries_path(store_dir, s.rid))
    open(os.path.join(store_dir, s.rid + ".tokens.state.json"), "w").write(json.dumps(st, sort_keys=True) + "\n")

    # 24-27. damaged files
    s = add(Scenario("schema2_line", "a schema_version 2 line after the acknowledged ones"))
    put_all(store, [call(s.rid, "s1", [1, 2], [10], t=1)], intents=False)
    freeze(s.rid)
    old = call(s.rid, "s2", [3, 4], [11], t=2).model_dump(mode="json")
    old["schema_version"] = 2
    with open(entries_path(store_dir, s.rid), "ab") as f:
        f.write(json.dumps(old, sort_keys=True, separators=(",", ":")).encode() + b"\n")
    for name, state in (("state_not_json", b"{\"frozen\": tru"), ("state_not_object", b"[1, 2]\n")):
        s = add(Scenario(name, "the state file is " + ("not JSON" if name == "state_not_json" else "a JSON array")))
        put_all(store, [call(s.rid, "v1", [1, 2], [10], t=1)], intents=False)
        freeze(s.rid)
        open(os.path.join(store_dir, s.rid + ".tokens.state.json"), "wb").write(state)
    s = add(Scenario("type_inexact_token", "an unacknowledged line holds token id 3.0", departure="type-exact"))
    put_all(store, [call(s.rid, "f1", [1, 2], [10], t=1)], intents=False)
    freeze(s.rid)
    line = open(entries_path(store_dir, s.rid), "rb").read().splitlines()[0]
    st = json.load(open(os.path.join(store_dir, s.rid + ".tokens.state.json")))
    open(entries_path(store_dir, s.rid), "wb").write(line.replace(b'"prompt_token_ids":[1,2]', b'"prompt_token_ids":[1,2.0]') + b"\n")
    st.update(indexed_size=0, entry_digests={})
    open(os.path.join(store_dir, s.rid + ".tokens.state.json"), "w").write(json.dumps(st, sort_keys=True) + "\n")
    s = add(Scenario("leftover_incomplete_marker", "a .tokens.incomplete file with a state that says complete",
                     departure="incomplete-marker"))
    put_all(store, [call(s.rid, "k1", [1, 2], [10], t=1)], intents=False)
    freeze(s.rid)
    open(os.path.join(store_dir, s.rid + ".tokens.incomplete"), "w").write("k0\n")

    # 28-29. compressed stores (tracegrpo reads .zst; Gym's store has no such file)
    s = add(Scenario("zst_valid", "the entries file archived as .tokens.jsonl.zst", departure="zst"))
    put_all(store, [call(s.rid, "z1", [1, 2], [10], t=1)], intents=False)
    freeze(s.rid)
    s.runtime["zstd"] = [s.rid + ".tokens.jsonl"]
    s = add(Scenario("zst_corrupt", "a .tokens.jsonl.zst that is not a zstd stream", departure="zst"))
    open(os.path.join(store_dir, s.rid + ".tokens.jsonl.zst"), "wb").write(b"\x28\xb5\x2f\xfd\x00garbage")

    # 30-32. paths that are not plain files (created at test time: git keeps no FIFO)
    s = add(Scenario("fifo_entries", "the entries path is a FIFO", departure="non-regular-files"))
    s.runtime["mkfifo"] = [s.rid + ".tokens.jsonl"]
    s.isolated = True
    s = add(Scenario("symlink_dev_zero", "the entries path is a symlink to /dev/zero", departure="non-regular-files"))
    s.runtime["symlink"] = {s.rid + ".tokens.jsonl": "/dev/zero"}
    s.isolated = True
    s = add(Scenario("symlink_escape", "the entries path is a symlink to a file outside the capture directory",
                     departure="non-regular-files"))
    esc = call(s.rid, "y1", [1, 2], [10], t=1).model_dump(mode="json")
    os.makedirs(os.path.join(os.path.dirname(store_dir), "outside"), exist_ok=True)
    open(os.path.join(os.path.dirname(store_dir), "outside", "escape.jsonl"), "wb").write(
        json.dumps(esc, sort_keys=True, separators=(",", ":")).encode() + b"\n")
    s.runtime["symlink"] = {s.rid + ".tokens.jsonl": "../outside/escape.jsonl"}

    # 33-38. builder refusals
    s = add(Scenario("mixed_models", "two calls served by different models"))
    put_all(store, [call(s.rid, "h1", [1, 2], [10], t=1), call(s.rid, "h2", [3, 4], [11], t=2, model="other")])
    freeze(s.rid)
    s = add(Scenario("proof_mismatch", "a call whose digest does not match its tokens"))
    bad = call(s.rid, "p1", [1, 2], [10], t=1)
    bad.digest = "0" * 64
    put_all(store, [bad])
    freeze(s.rid)
    s = add(Scenario("routed_experts", "a call carrying routed_experts"))
    put_all(store, [call(s.rid, "r1", [1, 2], [10], t=1, extra={"routed_experts": [[0, 1]]})])
    freeze(s.rid)
    s = add(Scenario("foreign_entry", "a line of another rollout inside this rollout's file"))
    put_all(store, [call(s.rid, "o1", [1, 2], [10], t=1)], intents=False)
    freeze(s.rid)
    other = call("someone-else", "o2", [3, 4], [11], t=2).model_dump(mode="json")
    st = json.load(open(os.path.join(store_dir, s.rid + ".tokens.state.json")))
    with open(entries_path(store_dir, s.rid), "ab") as f:
        f.write(json.dumps(other, sort_keys=True, separators=(",", ":")).encode() + b"\n")
    s = add(Scenario("empty_generation_only", "the only call generated nothing"))
    put_all(store, [call(s.rid, "n1", [1, 2], [], t=1)])
    freeze(s.rid)
    s = add(Scenario("unresolved_parent", "a call whose parent resolution is unresolved"))
    from nemo_gym.token_id_capture.records import ParentResolutionStatus, stamp_lineage
    un = call(s.rid, "q2", [1, 2, 10, 5], [11], t=2)
    stamp_lineage(un, None, parent_resolution=ParentResolutionStatus.UNRESOLVED)
    put_all(store, [call(s.rid, "q1", [1, 2], [10], t=1), un])
    freeze(s.rid)
    s = add(Scenario("delta_prompt", "a child recorded with a delta prompt"))
    d1 = call(s.rid, "dd1", [1, 2], [10, 11], t=1)
    d2 = call(s.rid, "dd2", [1, 2, 10, 11, 5, 6], [12], "dd1", t=2)
    d2.prompt_token_ids, d2.prompt_is_delta = [5, 6], True
    put_all(store, [d1, d2])
    freeze(s.rid)
    s = add(Scenario("no_prompt_is_delta_field", "entries written without the prompt_is_delta field",
                     departure="prompt-is-delta"))
    bare = call(s.rid, "b1", [1, 2], [10], t=1).model_dump(mode="json")
    del bare["prompt_is_delta"]
    with open(entries_path(store_dir, s.rid), "wb") as f:
        f.write(json.dumps(bare, sort_keys=True, separators=(",", ":")).encode() + b"\n")
    return out


BAD_ID_RECORDS = [
    ("bad_id_path", {"_ng_rollout_id": "../etc", "reward": 1.0}),
    ("bad_id_type", {"_ng_rollout_id": 7, "reward": 1.0}),
    ("no_capture_key", {"_ng_task_index": 3, "reward": 1.0}),
]


def apply_runtime(store_dir, runtime):
    for name in runtime.get("mkfifo", []):
        os.mkfifo(os.path.join(store_dir, name))
    for name, target in runtime.get("symlink", {}).items():
        os.symlink(target, os.path.join(store_dir, name))


def main():
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--upstream", required=True, help="directory holding Gym's six files (see above)")
    ap.add_argument("--mirror", required=True, help="git dir of a NVIDIA-NeMo/Gym clone holding main " + MAIN_COMMIT[:9])
    args = ap.parse_args()
    gym_root, provenance = assemble(args.upstream, args.mirror)
    sys.path.insert(0, gym_root)
    import orjson
    import pydantic

    work = tempfile.mkdtemp(prefix="gym-diff-work-")
    store_dir = os.path.join(work, "captures")
    os.makedirs(store_dir)
    scenarios = build_scenarios(store_dir)
    for f in os.listdir(store_dir):
        assert not f.startswith(".tokens-state-"), f

    # zstd archives: compress with the zstd CLI when the scenario asks (Gym never reads them).
    for s in scenarios:
        for name in s.runtime.pop("zstd", []):
            p = os.path.join(store_dir, name)
            subprocess.run(["zstd", "-q", "--rm", "-19", p, "-o", p + ".zst"], check=True)

    shutil.rmtree(OUT, ignore_errors=True)
    os.makedirs(OUT)
    shutil.copytree(store_dir, os.path.join(OUT, "captures"), symlinks=True)
    if os.path.isdir(os.path.join(work, "outside")):
        shutil.copytree(os.path.join(work, "outside"), os.path.join(OUT, "outside"))
    with open(os.path.join(OUT, "rollouts.jsonl"), "w") as f:
        for s in scenarios:
            f.write(json.dumps(s.record) + "\n")
    with open(os.path.join(OUT, "bad_ids.jsonl"), "w") as f:
        for _, rec in BAD_ID_RECORDS:
            f.write(json.dumps(rec) + "\n")

    results = {}
    for builder in BUILDERS:
        lines = []
        for s in scenarios:
            run_dir = tempfile.mkdtemp(prefix="gym-diff-run-")
            shutil.copytree(store_dir, os.path.join(run_dir, "captures"), symlinks=True)
            if os.path.isdir(os.path.join(work, "outside")):
                shutil.copytree(os.path.join(work, "outside"), os.path.join(run_dir, "outside"))
            apply_runtime(os.path.join(run_dir, "captures"), s.runtime)
            if s.isolated:
                r = finalize_isolated(s.record, os.path.join(run_dir, "captures"), builder, gym_root)
            else:
                r = finalize(s.record, os.path.join(run_dir, "captures"), builder)
            shutil.rmtree(run_dir)
            r = dict(r, case=s.name)
            lines.append(json.dumps(r))
            results.setdefault(s.name, {})[builder] = r["outcome"] + (":" + r["reason"] if r["reason"] else "")
        with open(os.path.join(OUT, f"gym_{builder}.jsonl"), "w") as f:
            f.write("\n".join(lines) + "\n")
        with open(os.path.join(OUT, f"gym_records_{builder}.jsonl"), "w") as f:
            for line in lines:
                f.write(json.dumps(json.loads(line)["record"]) + "\n")
    bad = []
    for name, rec in BAD_ID_RECORDS:
        r = finalize(rec, store_dir, "prefix_merging")
        bad.append({"case": name, "outcome": r["outcome"], "error": r["error"]})

    # Gym's own fingerprint on the independent goldens.
    from nemo_gym.token_id_capture.fingerprint import assistant_fingerprint
    golden_path = os.path.join(REPO, "gym", "testdata", "golden_fingerprint.json")
    golden_bytes = open(golden_path, "rb").read()
    golden = json.loads(golden_bytes)
    agree = 0
    for c in golden["cases"]:
        try:
            fp, err = assistant_fingerprint(json.loads(c["items"])), ""
        except (TypeError, ValueError):
            fp, err = "", "value"
        except AttributeError:
            fp, err = "", "crash"
        agree += (fp, err) == (c["fingerprint"], c["error"])

    manifest = {
        "meta": {
            "script": SCRIPT,
            "python": platform.python_version(),
            "pydantic": pydantic.VERSION,
            "orjson": orjson.__version__,
            "upstream": provenance,
            "stubs": "nemo_gym.config_types and nemo_gym.global_config hold only the constants rollout_correlation.py imports",
            "fingerprint_golden_agreement": f"{agree}/{len(golden['cases'])}",
            "fingerprint_golden_sha256": hashlib.sha256(golden_bytes).hexdigest(),
        },
        "cases": [{"name": s.name, "rollout_id": s.rid, "what": s.what, "departure": s.departure,
                   "runtime": s.runtime, "gym": results[s.name]} for s in scenarios],
        "bad_ids": [dict(b, departure="fatal-correlation") for b in bad],
    }
    with open(os.path.join(OUT, "manifest.json"), "w") as f:
        json.dump(manifest, f, indent=1)
        f.write("\n")
    shutil.rmtree(work)
    shutil.rmtree(gym_root)
    print(f"wrote {os.path.relpath(OUT, REPO)}: {len(scenarios)} scenarios x {len(BUILDERS)} builders, "
          f"{len(bad)} bad-id records; fingerprint goldens agree {agree}/{len(golden['cases'])}")
    for s in scenarios:
        print(f"  {s.name:32s} {results[s.name]['prefix_merging']:40s} {results[s.name]['per_request']}")


if __name__ == "__main__":
    main()
