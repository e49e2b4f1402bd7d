#!/usr/bin/env python3
"""Writes gym/testdata/gymmain/: capture stores as NeMo Gym's main writes them today (TokenEntry schema 1), and what
Gym main's own finalizer makes of each rollout.

NeMo Gym's main (07d6b0d07b22fcf530b4c211dae2ee23100428e4, 2026-08-22) writes TokenEntry schema_version 1: identity,
token arrays, routed_experts, output_items, token_item_index, created_at; no lineage. Its prefix_merging builder
chains calls by token prefixes, delivers one chain in response.output (main_chain delivery) and masks a rollout
unless the capture forms one root and one chain with every retry resolved. This script runs Gym main's own code
for each scenario below:

  TokenCaptureStore.begin_call / put / mark_incomplete   (store.py: the capture lines, intents, state files)
  delivery.finalize_rollout_token_capture                (consumer.py, builder.py: freeze, build, verdict)

and writes, under gym/testdata/gymmain/:
  captures/         the store directory after Gym's finalizer froze it (what a trainer reads)
  rollouts.jsonl    the rollout records before finalization (what tracegrpo finalizes)
  gym_finalized.jsonl  the records after Gym main's finalizer (mask_sample, _ng_token_capture,
                    response.output rebuilt with prompt_token_ids/generation_token_ids/generation_log_probs)
  PROVENANCE.json   the Gym files used (commit, length, sha256), the library versions, the stubs

gym/gymmain_test.go reads the store with package gym and checks every record against Gym's verdict and tokens.

Gym's modules are assembled in a temporary directory outside the repository from a clone's git directory. Two
modules are stubs holding only the constants rollout_correlation.py imports (config_types.py,
global_config.py), and the two packages' __init__.py are empty (token_id_capture/__init__.py only re-exports, and
its config.py import needs Gym's server stack); nothing under test is stubbed. Needs Python >= 3.11 with
pydantic 2 and orjson (the machine's pyenv python3). Run:
  python3 scripts/gym_main_capture.py --mirror /work/.mirror/NVIDIA-NeMo+Gym/repo
"""
from __future__ import annotations

import argparse
import asyncio
import hashlib
import json
import os
import platform
import shutil
import subprocess
import sys
import tempfile
import warnings

SCRIPT = "scripts/gym_main_capture.py"
REPO = os.path.normpath(os.path.join(os.path.dirname(os.path.abspath(__file__)), ".."))
OUT = os.path.join(REPO, "gym", "testdata", "gymmain")
MAIN_COMMIT = "07d6b0d07b22fcf530b4c211dae2ee23100428e4"
FROM_MIRROR = (
    "nemo_gym/token_id_capture/records.py",
    "nemo_gym/token_id_capture/store.py",
    "nemo_gym/token_id_capture/protocols.py",
    "nemo_gym/token_id_capture/builder.py",
    "nemo_gym/token_id_capture/consumer.py",
    "nemo_gym/token_id_capture/delivery.py",
    "nemo_gym/rollout_correlation.py",
)
STUBS = {
    "nemo_gym/__init__.py": "",
    "nemo_gym/token_id_capture/__init__.py": "",
    "nemo_gym/config_types.py": 'ROLLOUT_PATH_PREFIX = "ng-rollout"\n',
    "nemo_gym/global_config.py": (
        'TASK_INDEX_KEY_NAME = "_ng_task_index"\nROLLOUT_INDEX_KEY_NAME = "_ng_rollout_index"\n'
        'ATTEMPT_INDEX_KEY_NAME = "_ng_attempt_index"\nROLLOUT_ID_KEY_NAME = "_ng_rollout_id"\n'
    ),
}
MODEL = "policy"
T0 = 1782184800.0


def assemble(mirror: str) -> tuple[str, dict]:
    root = tempfile.mkdtemp(prefix="gym-main-")
    assert not os.path.abspath(root).startswith(REPO + os.sep), "assembly must be outside the repository"
    os.makedirs(os.path.join(root, "nemo_gym", "token_id_capture"))
    provenance = {}
    for dest in FROM_MIRROR:
        text = subprocess.run(["git", "--git-dir", mirror, "show", f"{MAIN_COMMIT}:{dest}"], check=True,
                              capture_output=True, text=True).stdout
        with open(os.path.join(root, dest), "w", encoding="utf-8") as f:
            f.write(text)
        provenance[dest] = {"commit": MAIN_COMMIT, "chars": len(text),
                            "sha256": hashlib.sha256(text.encode()).hexdigest()}
    for dest, text in STUBS.items():
        with open(os.path.join(root, dest), "w", encoding="utf-8") as f:
            f.write(text)
        provenance[dest] = {"stub": text.strip().replace("\n", "; ") or "(empty)"}
    return root, provenance


def text_item(text: str) -> dict:
    return {"id": "msg_" + hashlib.sha256(text.encode()).hexdigest()[:16], "type": "message", "role": "assistant",
            "status": "completed", "content": [{"type": "output_text", "text": text, "annotations": []}]}


# Token streams: BOS 1, role tokens user 4 / assistant 5 / tool 6, end 2; words from 10 up.
SYS = [1, 4, 10, 11, 12, 2, 5]


def scenarios():
    """(name, calls, extra steps): each call is (call_id, prompt, generation, extra TokenEntry fields)."""
    a_gen = [20, 21, 2]
    a_cum = SYS + a_gen
    tool = [6, 30, 31, 2, 5]
    b_prompt = a_cum + tool
    b_gen = [22, 23, 2]
    b_cum = b_prompt + b_gen
    c_prompt = b_cum + [6, 32, 2, 5]
    yield "single", [("c0", SYS, a_gen, {})], None
    yield "chain2", [("c0", SYS, a_gen, {}), ("c1", b_prompt, b_gen, {})], None
    # A writer's extra fields (extra="allow") that look like schema-3 lineage: in schema 1 they mean nothing.
    yield "chain3_lineage_lookalikes", [
        ("c0", SYS, a_gen, {"parent_call_id": "nobody", "digest": "0" * 64}),
        ("c1", b_prompt, b_gen, {"parent_resolution": "unresolved", "cum_len": 3}),
        ("c2", c_prompt, [24, 2], {"prompt_is_delta": True, "response_id": "resp-x"}),
    ], None
    yield "final_retry_unresolved", [("c0", SYS, a_gen, {}), ("c1", b_prompt, b_gen, {}),
                                     ("c1r", b_prompt, [25, 2], {})], None
    yield "middle_retry_resolved", [("c0", SYS, a_gen, {}), ("c1", b_prompt, b_gen, {}),
                                    ("c1r", b_prompt, [25, 2], {}), ("c2", c_prompt, [24, 2], {})], None
    yield "first_retry_resolved", [("c0", SYS, a_gen, {}), ("c0r", SYS, [26, 2], {}),
                                   ("c1", b_prompt, b_gen, {})], None
    yield "two_roots", [("c0", SYS, a_gen, {}), ("s0", [1, 4, 40, 41, 2, 5], [42, 2], {})], None
    yield "branch", [("c0", SYS, a_gen, {}), ("c1", b_prompt, b_gen, {}),
                     ("c1b", a_cum + [6, 33, 2, 5], [27, 2], {})], None
    yield "empty_generation", [("e0", SYS, [], {}), ("c0", SYS + [4, 13, 2, 5], a_gen, {})], None
    yield "only_empty_generations", [("e0", SYS, [], {})], None
    yield "ambiguous_parent", [("c0", SYS, a_gen, {}), ("c0d", SYS, a_gen, {}), ("c1", b_prompt, b_gen, {})], None
    yield "incomplete_marked", [("c0", SYS, a_gen, {})], "mark_incomplete"
    yield "dangling_intent", [("c0", SYS, a_gen, {})], "dangling_intent"
    yield "nothing_recorded", [], None
    yield "routed_experts", [("c0", SYS, a_gen, {"routed_experts": [[0, 1], [1, 2], [0, 2]]})], None
    yield "created_at_order", [("z9", SYS, a_gen, {}), ("a1", b_prompt, b_gen, {})], "reverse_time"


async def build(root: str, work: str) -> tuple[list[dict], list[dict]]:
    sys.path.insert(0, root)
    from nemo_gym.token_id_capture.delivery import finalize_rollout_token_capture
    from nemo_gym.token_id_capture.records import TOKEN_ENTRY_RECORD_SCHEMA_VERSION, TokenEntry
    from nemo_gym.token_id_capture.store import TokenCaptureStore

    assert TOKEN_ENTRY_RECORD_SCHEMA_VERSION == 1, TOKEN_ENTRY_RECORD_SCHEMA_VERSION
    store = TokenCaptureStore(work)
    before, after = [], []
    for i, (name, calls, step) in enumerate(scenarios()):
        rid = f"0-{i}"
        for j, (call, prompt, gen, extra) in enumerate(calls):
            call_id = f"{rid}-{call}"
            created = T0 + i * 10 + (len(calls) - j if step == "reverse_time" else j)
            fields = dict(extra)
            entry = TokenEntry(rollout_id=rid, model_call_id=call_id, model=MODEL, prompt_token_ids=prompt,
                               generation_token_ids=gen,
                               generation_log_probs=[-0.25 - 0.125 * (t % 8) - 0.0078125 * k for k, t in enumerate(gen)],
                               output_items=[text_item(f"{name} {call}")], token_item_index=0, created_at=created,
                               **fields)
            await store.begin_call(rid, call_id)
            await store.put(entry)
        if step == "mark_incomplete":
            await store.mark_incomplete(rid, f"{rid}-lost")
        elif step == "dangling_intent":
            await store.begin_call(rid, f"{rid}-lost")
        text = " ".join(f"{name} {c[0]}" for c in calls[-1:]) or name
        record = {"_ng_task_index": 0, "_ng_rollout_index": i, "scenario": name, "reward": float(i % 2),
                  "response": {"id": f"resp-{rid}", "model": MODEL, "object": "response", "output": [text_item(text)]}}
        before.append(json.loads(json.dumps(record)))
        with warnings.catch_warnings():
            warnings.simplefilter("ignore")
            await finalize_rollout_token_capture(record, store)
        after.append(record)
    return before, after


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--mirror", required=True, help="git directory of a NVIDIA-NeMo/Gym clone holding main " + MAIN_COMMIT)
    args = ap.parse_args()
    root, provenance = assemble(args.mirror)
    work = tempfile.mkdtemp(prefix="gym-main-store-")
    try:
        before, after = asyncio.run(build(root, work))
        import orjson
        import pydantic
        if os.path.isdir(OUT):
            shutil.rmtree(OUT)
        os.makedirs(OUT)
        shutil.copytree(work, os.path.join(OUT, "captures"))
        for name, recs in (("rollouts.jsonl", before), ("gym_finalized.jsonl", after)):
            with open(os.path.join(OUT, name), "w", encoding="utf-8") as f:
                for r in recs:
                    f.write(json.dumps(r, sort_keys=True) + "\n")
        meta = {
            "script": SCRIPT,
            "gym": provenance,
            "python": platform.python_version(),
            "pydantic": pydantic.VERSION,
            "orjson": orjson.__version__,
            "scenarios": [r["scenario"] for r in before],
            "tokens": "hand-made token ids (BOS 1, roles user 4 / assistant 5 / tool 6, end 2, words from 10); "
                      "logprobs -0.25 - 0.125*(token mod 8) - 0.0078125*position: fixed, not a model's",
            "stubs": "nemo_gym/__init__.py and token_id_capture/__init__.py are empty; config_types.py and "
                     "global_config.py hold only the constants rollout_correlation.py imports",
        }
        with open(os.path.join(OUT, "PROVENANCE.json"), "w", encoding="utf-8") as f:
            json.dump(meta, f, indent=1, sort_keys=True)
            f.write("\n")
    finally:
        shutil.rmtree(root, ignore_errors=True)
        shutil.rmtree(work, ignore_errors=True)
    print(f"wrote {OUT}: {len(before)} rollouts")


if __name__ == "__main__":
    main()
