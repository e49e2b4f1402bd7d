#!/usr/bin/env python3
"""gym_vllm_loop.py: the generator side of tracegrpo's loop (docs/loop.md): NeMo Gym collects each step's rollouts
against a vLLM server serving the trainer's newest weights.

For each step N (starting after the newest step_<N>.jsonl in --rollouts, so a restarted generator resumes where it
stopped, and a restarted trainer finds the files it needs):
  1. wait for W/step_<N-1>/DONE, the weights the trainer published after step N-1 (step_0: its initial weights);
  2. hash W/step_<N-1>/model.safetensors (sha256) and check it against DONE;
  3. make vLLM load those weights (below), and reset its prefix cache;
  4. run NeMo Gym's rollout collection (`gym eval run --no-serve`) on the step's --prompts-per-step task rows, each
     repeated --generations times: one task group per row, its _ng_task_index, every rollout its own explicit
     _ng_rollout_id (s<N>-<task>-<k>, so capture keys never repeat across steps), token-ID capture on, into the
     capture directory C the trainer reads;
  5. write R/step_<N>.meta.json ({"policy_step": N-1, "weights_sha256": ...}) and then R/step_<N>.jsonl, each whole:
     a temporary file, fsync, rename; the trainer waits for step_<N>.jsonl and checks the sidecar beside it.

Loading weights into a running vLLM (step 3). vLLM's OpenAI server exposes POST /collective_rpc, which calls a
method on every worker; it is registered only with VLLM_SERVER_DEV_MODE=1 and passes string arguments only
(vllm/entrypoints/serve/rpc/api_router.py, read at vllm-project/vllm 09cb327f1183534adbdf9eee3e438688e75fbe2b). The
method is this file's worker extension: start vLLM with
    VLLM_SERVER_DEV_MODE=1 PYTHONPATH=scripts vllm serve W/step_0 --worker-extension-cls gym_vllm_loop.TracegrpoWeights ...
and TracegrpoWeights.tracegrpo_load_weights(path) points the worker's model config at the new directory and reloads
in place with vLLM's own Worker.update_config and Worker.reload_weights (vllm/v1/worker/gpu_worker.py, read at
35d5cda123ec28581759b6d34cde8052314fb1e6; reload_weights runs the model loader's load_weights over the new
directory's safetensors). Without update_config (vLLM's v2 model runner before vllm-project/vllm#42783) it feeds the
safetensors to the model's load_weights itself. POST /reset_prefix_cache (vllm/entrypoints/serve/cache/
api_router.py, same commit, dev mode) then drops KV blocks computed with the old weights. Versions: the code above
is what was read; vllm-project/vllm-ascend#4277 (2025-11-19, against vLLM v0.11.2) and huggingface/trl#4571
(2025-11-25) call collective_rpc("update_config") and ("reload_weights") on released vLLM, so use vLLM >= 0.11.2;
older releases were not checked.

NeMo Gym (step 4), read at NVIDIA-NeMo/Gym main 07d6b0d07b22fcf530b4c211dae2ee23100428e4: RolloutCollectionConfig
(nemo_gym/rollout_collection.py: agent, input, output, num_repeats, limit), token_id_capture's settings
(nemo_gym/token_id_capture/config.py: enabled, all_agents, dir (absolute), rebuild_response) and the capture key of
nemo_gym/rollout_correlation.py (an explicit _ng_rollout_id wins; otherwise "<task>-<rollout>", which repeats across
steps). Start Gym's servers yourself with the same capture settings (`gym env start ... --model-type vllm_model
--model-url http://HOST:PORT/v1 ++token_id_capture.enabled=true ++token_id_capture.all_agents=true
++token_id_capture.dir=C`); this script runs only the collection. tracegrpo reads Gym's capture store as Gym main
at the commit above writes it (TokenEntry schema 1: a rollout is trained when it forms one chain, as Gym main's own
finalizer decides; docs/gym.md) and as NeMo Gym PR #3212 writes it (schema 3: every trace of a rollout).

What was run: only --fake. It runs this same loop (steps 1, 2, 5 and the resume) with `train generate --step N` in
place of steps 3 and 4: tracegrpo's CPU generator loads W/step_<N-1> itself, plays the built-in tasks with it and
records their captures in C. vLLM and NeMo Gym were not installed on the machine this was written on; steps 3 and 4
have never run.

Usage:
  python3 scripts/gym_vllm_loop.py --weights W --rollouts R --captures C --steps N \\
      --vllm-url http://127.0.0.1:10240 --tasks TASKS.jsonl --agent AGENT --prompts-per-step P --generations K
  python3 scripts/gym_vllm_loop.py --fake --train bin/train --weights W --rollouts R --captures C --steps N \\
      -- --set grpo.num_prompts_per_step=2 ...      (the trainer's recipe flags, for train generate)
"""
from __future__ import annotations

import argparse
import hashlib
import json
import os
import shlex
import subprocess
import sys
import tempfile
import time
import urllib.request

POLL_S = 1.0
SAY_EVERY_S = 30.0


def log(msg: str) -> None:
    print(f"gym_vllm_loop: {msg}", file=sys.stderr, flush=True)


# ---------------------------------------------------------------- the protocol (package loop)

def weights_dir(root: str, step: int) -> str:
    return os.path.join(root, f"step_{step}")


def step_file(rollouts: str, step: int) -> str:
    return os.path.join(rollouts, f"step_{step}.jsonl")


def meta_file(rollouts: str, step: int) -> str:
    return os.path.join(rollouts, f"step_{step}.meta.json")


def next_step(rollouts: str) -> int:
    """One past the newest step_<N>.jsonl: where a restarted generator resumes."""
    top = 0
    for name in os.listdir(rollouts):
        if name.startswith("step_") and name.endswith(".jsonl"):
            n = name[len("step_"):-len(".jsonl")]
            if n.isdigit() and (n == "0" or not n.startswith("0")):
                top = max(top, int(n))
    return top + 1


def wait_done(root: str, step: int, timeout_s: float) -> dict:
    """Wait for W/step_<step>/DONE and read it, saying every 30 s what it waits for."""
    path = os.path.join(weights_dir(root, step), "DONE")
    start = said = time.monotonic()
    while not os.path.exists(path):
        now = time.monotonic()
        if now - start > timeout_s:
            sys.exit(f"gym_vllm_loop: {path} did not appear within {timeout_s:.0f} s: is the trainer running with --weights-out {root}?")
        if now - said >= SAY_EVERY_S:
            said = now
            log(f"waiting for {path}: {now - start:.0f} s so far")
        time.sleep(POLL_S)
    with open(path) as f:
        done = json.load(f)
    if done.get("format") != "tracegrpo-weights" or done.get("version") != 1 or done.get("step") != step:
        sys.exit(f"gym_vllm_loop: {path}: not a tracegrpo-weights v1 marker of step {step}: {done}")
    return done


def hash_weights(root: str, step: int, done: dict) -> str:
    """The sha256 of W/step_<step>/model.safetensors, checked against DONE."""
    path = os.path.join(weights_dir(root, step), "model.safetensors")
    h = hashlib.sha256()
    with open(path, "rb") as f:
        for block in iter(lambda: f.read(16 << 20), b""):
            h.update(block)
    got = h.hexdigest()
    want = next((e["sha256"] for e in done["files"] if e["name"] == "model.safetensors"), None)
    if got != want:
        sys.exit(f"gym_vllm_loop: {path}: sha256 {got}, but its DONE says {want}: the directory was replaced while it was read; restart")
    return got


def write_whole(path: str, data: bytes) -> None:
    """Write path through a temporary file beside it: write, fsync, rename, fsync the directory."""
    d = os.path.dirname(path) or "."
    fd, tmp = tempfile.mkstemp(dir=d, prefix="." + os.path.basename(path) + ".tmp")
    try:
        with os.fdopen(fd, "wb") as f:
            f.write(data)
            f.flush()
            os.fsync(f.fileno())
        os.chmod(tmp, 0o644)
        os.replace(tmp, path)
    except BaseException:
        if os.path.exists(tmp):
            os.unlink(tmp)
        raise
    dfd = os.open(d, os.O_RDONLY)
    try:
        os.fsync(dfd)
    finally:
        os.close(dfd)


def publish_step(rollouts: str, step: int, records: bytes, policy_step: int, sha: str) -> None:
    """The sidecar first, then the step file: the trainer, waiting for the step file, finds both."""
    meta = {"policy_step": policy_step, "weights_sha256": sha, "generator": "scripts/gym_vllm_loop.py"}
    write_whole(meta_file(rollouts, step), (json.dumps(meta) + "\n").encode())
    write_whole(step_file(rollouts, step), records)


# ---------------------------------------------------------------- vLLM

class TracegrpoWeights:
    """vLLM worker extension (--worker-extension-cls gym_vllm_loop.TracegrpoWeights): mixed into every worker."""

    def tracegrpo_load_weights(self, path: str) -> str:
        if hasattr(self, "update_config") and hasattr(self, "reload_weights"):
            self.update_config({"model_config": {"model": path}})
            self.reload_weights()
            return path
        import glob

        from safetensors.torch import safe_open  # vLLM's own dependency

        def weights():
            for fn in sorted(glob.glob(os.path.join(path, "*.safetensors"))):
                with safe_open(fn, framework="pt") as f:
                    for name in f.keys():
                        yield name, f.get_tensor(name)

        self.model_runner.get_model().load_weights(weights())
        return path


def vllm_post(url: str, path: str, body: dict | None = None, timeout: float = 1800) -> bytes:
    req = urllib.request.Request(url.rstrip("/") + path, data=json.dumps(body or {}).encode(), method="POST",
                                 headers={"Content-Type": "application/json"})
    with urllib.request.urlopen(req, timeout=timeout) as resp:
        return resp.read()


def vllm_load(url: str, path: str) -> None:
    out = json.loads(vllm_post(url, "/collective_rpc", {"method": "tracegrpo_load_weights", "args": [os.path.abspath(path)]}) or b"{}")
    if [r for r in out.get("results", [os.path.abspath(path)]) if r != os.path.abspath(path)]:
        sys.exit(f"gym_vllm_loop: vLLM's workers did not all load {path}: {out}")
    vllm_post(url, "/reset_prefix_cache")


# ---------------------------------------------------------------- NeMo Gym

def step_rows(tasks: list[dict], step: int, prompts: int, generations: int) -> list[dict]:
    """The step's task rows, each repeated once per generation, with Gym's correlation keys set explicitly."""
    rows = []
    for p in range(prompts):
        row = tasks[((step - 1) * prompts + p) % len(tasks)]
        for k in range(generations):
            r = json.loads(json.dumps(row))
            r["_ng_task_index"], r["_ng_rollout_index"], r["_ng_rollout_id"] = p, k, f"s{step}-{p}-{k}"
            rows.append(r)
    return rows


def gym_collect(a, step: int) -> bytes:
    with open(a.tasks) as f:
        tasks = [json.loads(line) for line in f if line.strip()]
    rows = step_rows(tasks, step, a.prompts_per_step, a.generations)
    with tempfile.TemporaryDirectory(prefix=f"gym-step{step}-") as tmp:
        inp, out = os.path.join(tmp, "input.jsonl"), os.path.join(tmp, "rollouts.jsonl")
        with open(inp, "w") as f:
            for r in rows:
                f.write(json.dumps(r) + "\n")
        cmd = shlex.split(a.gym) + ["eval", "run", "--no-serve", "--agent", a.agent, "--input", inp, "--output", out,
                                    "--num-repeats", "1", "++token_id_capture.enabled=true",
                                    "++token_id_capture.all_agents=true", f"++token_id_capture.dir={os.path.abspath(a.captures)}"]
        log("step %d: %s" % (step, " ".join(shlex.quote(c) for c in cmd)))
        subprocess.run(cmd + a.extra, check=True)
        with open(out, "rb") as f:
            records = f.read()
    n = sum(1 for line in records.splitlines() if line.strip())
    if n != len(rows):
        sys.exit(f"gym_vllm_loop: step {step}: Gym wrote {n} rollouts, the step takes {len(rows)} (failed rollouts go to Gym's _failures.jsonl: rerun the step)")
    return records


# ---------------------------------------------------------------- the fake generator

def fake_collect(a, step: int, sha: str) -> bytes:
    """Steps 3 and 4 by tracegrpo's CPU generator: train generate --step loads W/step_<N-1> and plays the built-in tasks."""
    with tempfile.TemporaryDirectory(prefix=f"fake-step{step}-") as tmp:
        recs = os.path.join(tmp, "records.jsonl")
        cmd = shlex.split(a.train) + ["generate", "--step", str(step), "--weights", a.weights, "--captures", a.captures,
                                      "--records", recs] + a.extra
        out = subprocess.run(cmd, check=True, capture_output=True, text=True)
        told = json.loads(out.stdout)
        if told != {"policy_step": step - 1, "weights_sha256": sha}:
            sys.exit(f"gym_vllm_loop: train generate loaded {told}, this loop hashed step_{step - 1} as {sha}")
        with open(recs, "rb") as f:
            return f.read()


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--weights", required=True, help="the trainer's --weights-out directory W")
    ap.add_argument("--rollouts", required=True, help="the trainer's --rollouts directory R")
    ap.add_argument("--captures", required=True, help="the capture directory C (Gym's token_id_capture.dir; the trainer's --captures)")
    ap.add_argument("--steps", type=int, required=True, help="the last step to generate (the trainer's --steps)")
    ap.add_argument("--wait", type=float, default=3600, help="seconds to wait for each weights directory")
    ap.add_argument("--fake", action="store_true", help="no vLLM and no Gym: train generate --step collects each step")
    ap.add_argument("--train", default="bin/train", help="with --fake: the train command")
    ap.add_argument("--vllm-url", help="the vLLM server (started with VLLM_SERVER_DEV_MODE=1 and the worker extension)")
    ap.add_argument("--gym", default="gym", help="NeMo Gym's command")
    ap.add_argument("--agent", help="the Gym agent that plays the tasks")
    ap.add_argument("--tasks", help="Gym task rows (JSONL); step N takes rows (N-1)*P .. N*P-1, cycling")
    ap.add_argument("--prompts-per-step", type=int, help="P: grpo.num_prompts_per_step")
    ap.add_argument("--generations", type=int, help="K: grpo.num_generations_per_prompt")
    ap.add_argument("extra", nargs="*", help="after --: passed on to train generate (--fake) or gym eval run")
    a = ap.parse_args()
    if not a.fake and not all([a.vllm_url, a.agent, a.tasks, a.prompts_per_step, a.generations]):
        ap.error("without --fake: --vllm-url, --agent, --tasks, --prompts-per-step and --generations are needed")
    for d in (a.rollouts, a.captures):
        os.makedirs(d, exist_ok=True)
    first = next_step(a.rollouts)
    if first > 1:
        log(f"resuming at step {first} (step_{first - 1}.jsonl is the newest in {a.rollouts})")
    for step in range(first, a.steps + 1):
        done = wait_done(a.weights, step - 1, a.wait)
        sha = hash_weights(a.weights, step - 1, done)
        t0 = time.monotonic()
        if a.fake:
            records = fake_collect(a, step, sha)
        else:
            vllm_load(a.vllm_url, weights_dir(a.weights, step - 1))
            records = gym_collect(a, step)
        publish_step(a.rollouts, step, records, step - 1, sha)
        n = sum(1 for line in records.splitlines() if line.strip())
        log(f"step {step}: {n} rollouts from {weights_dir(a.weights, step - 1)} (sha256 {sha[:12]}…) in {time.monotonic() - t0:.1f} s -> {step_file(a.rollouts, step)}")


if __name__ == "__main__":
    main()
