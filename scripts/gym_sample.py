#!/usr/bin/env python3
"""Writes testdata/gym-sample/: a ready-to-train NeMo Gym sample, rollouts and their captures, written by Gym's code.

The rollouts are NeMo Gym's own: environments/blackjack/data/example_rollouts.jsonl at Gym main (one task group,
_ng_task_index 0, five rollouts with _ng_rollout_index 0..4 and rewards -1/+1; two of them play a second hand, so
they made two model calls, the second continuing the first). The records are copied byte for byte. Their captures
are written by Gym's TokenCaptureStore (begin_call, put, freeze) with Gym's TokenEntry and stamp_lineage, keyed by
Gym's rollout_correlation, as Gym's model server writes them during rollout collection.

What Gym's code cannot supply here is the token ids and sampling log-probabilities: the rollouts were collected
without token capture, and no tokenizer or model is on this machine. The script tokenizes each call itself, one
token per whitespace-separated word (FNV-1a of the word, modulo the vocabulary of model/testdata/qwen2_tied,
above its special tokens), rendering every message as a role token, its words and an end token, so that each call's
prompt is the previous call's prompt and generation plus the environment's reply: Gym's continuation. The
log-probabilities are a fixed function of the token (documented in PROVENANCE.json). So the sample exercises the
capture store, correlation, continuation, terminal attribution and the trainer's whole step, not a real policy.

Gym's modules are assembled in a temporary directory outside the repository, as scripts/gym_differential.py does,
from the files gym/testdata/gymdiff/manifest.json records (its meta.upstream: commit, length and sha256 of each):
  --upstream DIR   store.py and records.py of NeMo Gym PR #3212 at the commits that manifest names
                   (each is checked against its sha256)
  --mirror GITDIR  a clone of NVIDIA-NeMo/Gym holding main 07d6b0d07b22fcf530b4c211dae2ee23100428e4, for
                   protocols.py, rollout_correlation.py and the blackjack rollouts
Needs Python >= 3.11 with pydantic 2 and orjson (the machine's pyenv python3). Run:
  python3 scripts/gym_sample.py --upstream /work/ext/gym-pr --mirror /work/.mirror/NVIDIA-NeMo+Gym/repo
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

SCRIPT = "scripts/gym_sample.py"
REPO = os.path.normpath(os.path.join(os.path.dirname(os.path.abspath(__file__)), ".."))
OUT = os.path.join(REPO, "testdata", "gym-sample")
GYMDIFF_MANIFEST = os.path.join(REPO, "gym", "testdata", "gymdiff", "manifest.json")
ROLLOUTS = "environments/blackjack/data/example_rollouts.jsonl"
MODEL = os.path.join(REPO, "model", "testdata", "qwen2_tied", "config.json")
FROM_UPSTREAM = ("nemo_gym/token_id_capture/store.py", "nemo_gym/token_id_capture/records.py")
FROM_MIRROR = ("nemo_gym/token_id_capture/protocols.py", "nemo_gym/rollout_correlation.py")
BOS, EOS, SPECIALS = 1, 2, 8  # ids below SPECIALS are control tokens
ROLE = {"system": 3, "user": 4, "assistant": 5}


def sha(text: str) -> str:
    return hashlib.sha256(text.encode()).hexdigest()


def assemble(upstream: str, mirror: str) -> tuple[str, str, dict]:
    with open(GYMDIFF_MANIFEST, encoding="utf-8") as f:
        known = json.load(f)["meta"]["upstream"]
    main_commit = known[FROM_MIRROR[0]]["commit"]
    root = tempfile.mkdtemp(prefix="gym-sample-")
    assert not os.path.abspath(root).startswith(REPO + os.sep), "assembly must be outside the repository"
    os.makedirs(os.path.join(root, "nemo_gym", "token_id_capture"))
    open(os.path.join(root, "nemo_gym", "__init__.py"), "w").close()
    open(os.path.join(root, "nemo_gym", "token_id_capture", "__init__.py"), "w").close()
    provenance = {}

    def put(dest: str, text: str, want: dict):
        if want.get("sha256") and sha(text) != want["sha256"]:
            sys.exit(f"{dest}: sha256 {sha(text)}, but Gym's file @ {want['commit'][:9]} has {want['sha256']}")
        with open(os.path.join(root, dest), "w", encoding="utf-8") as f:
            f.write(text)
        provenance[dest] = {"commit": want["commit"], "chars": len(text), "sha256": sha(text)}

    for dest in FROM_UPSTREAM:
        with open(os.path.join(upstream, os.path.basename(dest)), encoding="utf-8") as f:
            put(dest, f.read(), known[dest])
    for dest in FROM_MIRROR:
        text = subprocess.run(["git", "--git-dir", mirror, "show", f"{main_commit}:{dest}"], check=True,
                              capture_output=True, text=True).stdout
        put(dest, text, known[dest])
    for dest in ("nemo_gym/config_types.py", "nemo_gym/global_config.py"):
        text = known[dest]["stub"].replace("; ", "\n") + "\n"
        with open(os.path.join(root, dest), "w") as f:
            f.write(text)
        provenance[dest] = {"stub": known[dest]["stub"]}
    rollouts = subprocess.run(["git", "--git-dir", mirror, "show", f"{main_commit}:{ROLLOUTS}"], check=True,
                              capture_output=True).stdout.decode("utf-8")
    provenance[ROLLOUTS] = {"commit": main_commit, "bytes": len(rollouts.encode()), "sha256": sha(rollouts)}
    return root, rollouts, provenance


def fnv1a(word: str) -> int:
    h = 0xCBF29CE484222325
    for b in word.encode("utf-8"):
        h = ((h ^ b) * 0x100000001B3) & 0xFFFFFFFFFFFFFFFF
    return h


def tokens(role: str, text: str, vocab: int, close: bool = True) -> list[int]:
    out = [ROLE[role]] + [SPECIALS + fnv1a(w) % (vocab - SPECIALS) for w in text.split()]
    return out + [EOS] if close else out


def message_text(item: dict) -> str:
    c = item.get("content")
    if isinstance(c, str):
        return c
    return " ".join(part.get("text", "") for part in c or [])


def logprob(tok: int, i: int) -> float:
    return round(-0.25 - 0.125 * (tok % 8) - 0.0078125 * i, 10)


def capture(record: dict, store, vocab: int) -> list:
    """The rollout's model calls as Gym's model server records them: one entry per assistant message."""
    from nemo_gym.rollout_correlation import maybe_rollout_id_from_run_body
    from nemo_gym.token_id_capture.records import ParentResolutionStatus, TokenEntry, stamp_lineage

    rid = maybe_rollout_id_from_run_body(record)
    ctx = [BOS]
    for m in record["responses_create_params"]["input"]:
        ctx += tokens(m["role"], message_text(m), vocab)
    out = record["response"]["output"]
    asks = [i for i, o in enumerate(out) if o.get("type") == "message" and o.get("role") == "assistant"]
    entries, parent = [], None
    for n, i in enumerate(asks):
        prompt = ctx + [ROLE["assistant"]]
        gen = tokens("assistant", message_text(out[i]), vocab)[1:]
        cid = f"{rid}-call{n}"
        last = n == len(asks) - 1
        e = TokenEntry(rollout_id=rid, model_call_id=cid, model=record["response"]["model"],
                       prompt_token_ids=prompt, generation_token_ids=gen,
                       generation_log_probs=[logprob(t, j) for j, t in enumerate(gen)],
                       output_items=[out[i]], token_item_index=0,
                       response_id=record["response"]["id"] if last else f"{record['response']['id']}-call{n}",
                       created_at=float(record["response"]["created_at"]) + n)
        stamp_lineage(e, parent, parent_resolution=ParentResolutionStatus.RESOLVED if parent else ParentResolutionStatus.ROOT)
        asyncio.run(store.begin_call(rid, cid))
        asyncio.run(store.put(e))
        entries.append(e)
        parent = cid
        ctx = prompt + gen
        for o in out[i + 1: asks[n + 1] if not last else len(out)]:  # the environment's reply
            ctx += tokens(o.get("role", "user"), message_text(o), vocab)
    asyncio.run(store.freeze(rid))
    return entries


def main():
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--upstream", required=True)
    ap.add_argument("--mirror", required=True)
    a = ap.parse_args()
    root, rollouts, provenance = assemble(a.upstream, a.mirror)
    sys.path.insert(0, root)
    import orjson
    import pydantic
    from nemo_gym.token_id_capture.store import TokenCaptureStore

    with open(MODEL) as f:
        vocab = json.load(f)["vocab_size"]
    tmp = tempfile.mkdtemp(prefix="gym-sample-out-")
    store = TokenCaptureStore(os.path.join(tmp, "captures"))
    calls = {}
    for line in rollouts.splitlines():
        if line.strip():
            rec = json.loads(line)
            calls[f"{rec['_ng_task_index']}-{rec['_ng_rollout_index']}"] = len(capture(rec, store, vocab))
    with open(os.path.join(tmp, "rollouts.jsonl"), "w", encoding="utf-8") as f:
        f.write(rollouts)
    meta = {
        "script": SCRIPT, "python": platform.python_version(), "pydantic": pydantic.VERSION,
        "orjson": orjson.__version__, "gym": provenance,
        "rollouts": f"{ROLLOUTS} at Gym main, copied byte for byte",
        "calls_per_rollout": calls,
        "tokenizer": f"per message: a role token (system {ROLE['system']}, user {ROLE['user']}, assistant "
                     f"{ROLE['assistant']}), one token per whitespace-separated word ({SPECIALS} + FNV-1a-64 of its "
                     f"UTF-8 bytes mod {vocab}-{SPECIALS}, the vocabulary of model/testdata/qwen2_tied), end {EOS}; "
                     f"a call's prompt is BOS {BOS}, the request's input messages, then the earlier calls and the "
                     f"environment's messages, and the assistant role token; its generation the message's words and end",
        "logprobs": "-0.25 - 0.125*(token mod 8) - 0.0078125*position: fixed, not a model's",
    }
    with open(os.path.join(tmp, "PROVENANCE.json"), "w") as f:
        json.dump(meta, f, indent=1, sort_keys=True)
        f.write("\n")
    if os.path.isdir(OUT):
        shutil.rmtree(OUT)
    shutil.copytree(tmp, OUT)
    for d in (tmp, root):
        shutil.rmtree(d)
    print(f"wrote {OUT}: {len(calls)} rollouts, {sum(calls.values())} model calls")


if __name__ == "__main__":
    main()
