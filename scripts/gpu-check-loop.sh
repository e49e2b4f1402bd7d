#!/usr/bin/env bash
# gpu-check-loop.sh: an optional stage of scripts/gpu-check.sh (GPU_CHECK_LOOP=1),
# outside its 7-minute budget: the weights a CUDA run publishes for its
# generator (--weights-out, docs/loop.md) are a directory transformers loads
# as it is, and its log-probabilities are train score's.
#
#   scripts/gpu-check-loop.sh [--dry] OUTDIR TRAIN
#
# 1. TRAIN (the built-in job, 1 step, --backend cuda) publishes W/step_0 and
#    W/step_1 in bfloat16;
# 2. train score computes the log-probabilities of 8 token sequences under
#    W/step_1 (fp32 on the CPU, from the bf16 weights);
# 3. scripts/loop_transformers_check.py loads W/step_1 with transformers
#    (AutoModelForCausalLM, nothing but the directory) in float32 and in
#    bfloat16 on the GPU and compares its log-probabilities with train
#    score's: float32 within 2e-4, bfloat16 within 0.1 (see the script).
#
# It appends to OUTDIR/loop.log and prints one PASS / FAIL / NOT RUN line per
# result (gpu-check.sh adds them to summary.txt). --dry runs it where there is
# no GPU: on the emulator when gpu-check.sh's dry run set it up
# (TRACEGRPO_CUDA_DRIVER), else on the CPU backend; transformers, absent there,
# is NOT RUN. Exit status 1 when a check failed. GPU_CHECK_LIMITS is the
# three parts' time limits in seconds (gpu-check.sh's loop stage budget sets
# it; default 45 30 120).
set -u -o pipefail
dry=0
if [ "${1:-}" = "--dry" ]; then
	dry=1
	shift
fi
if [ $# -ne 2 ]; then
	echo "usage: $0 [--dry] OUTDIR TRAIN" >&2
	exit 2
fi
root=$(cd "$(dirname "$0")/.." && pwd)
out=$1 train=$2
log=$out/loop.log
py=${GPU_CHECK_PYTHON:-python3}
work=$(mktemp -d)
trap 'rm -rf "$work"' EXIT
read -r lim_train lim_score lim_hf <<<"${GPU_CHECK_LIMITS:-45 30 120}"
status=0
say() { echo "$*"; echo "$*" >>"$log"; }
fail() { say "FAIL: $*"; status=1; }
run() { # LIMIT CMD...: CMD under LIMIT seconds, its output appended to the log and kept in $work/part; sets rc
	local limit=$1
	shift
	echo "=== $(date -u +%H:%M:%S) [limit $limit s] $*" >>"$log"
	timeout -k 5 "$limit" "$@" >"$work/part" 2>&1
	rc=$?
	cat "$work/part" >>"$log"
	echo "=== exit $rc" >>"$log"
}

backend=cuda
if [ $dry = 1 ] && [ ! -f "${TRACEGRPO_CUDA_DRIVER:-/nonexistent}" ]; then
	backend=cpu
	say "dry run without the emulator: the CPU backend publishes the weights"
fi
w=$work/weights
run "$lim_train" "$train" --backend $backend --quiet --out "$work/run" --steps 1 --weights-out "$w" \
	--set grpo.num_prompts_per_step=2 --set grpo.num_generations_per_prompt=4
if [ $rc != 0 ] || [ ! -f "$w/step_1/DONE" ]; then
	fail "loop: train --weights-out on $backend (exit $rc; see loop.log)"
	exit 1
fi
say "PASS: loop: train --backend $backend published $(ls "$w" | tr '\n' ' ')in bfloat16 ($(du -b "$w/step_1/model.safetensors" | cut -f1) bytes)"

# 8 sequences of 12 tokens of the built-in vocabulary (32), the same every run.
awk 'BEGIN { for (s = 0; s < 8; s++) { printf "{\"token_ids\": [1"; for (i = 1; i < 12; i++) printf ", %d", (s * 7 + i * i * 3 + 5) % 29 + 3; print "]}" } }' >"$work/seqs.jsonl"
run "$lim_score" "$train" score --model "$w/step_1" --input "$work/seqs.jsonl"
if [ $rc != 0 ] || [ "$(grep -c logprobs "$work/part")" != 8 ]; then
	fail "loop: train score of W/step_1 (exit $rc; see loop.log)"
	exit 1
fi
grep logprobs "$work/part" >"$work/score.jsonl"
say "PASS: loop: train score of W/step_1: 8 sequences"

if ! "$py" -c 'import transformers, torch' 2>>"$log"; then
	say "NOT RUN: loop: transformers loading W/step_1 ($py has no transformers or torch)"
	exit $status
fi
run "$lim_hf" "$py" "$root/scripts/loop_transformers_check.py" "$w/step_1" "$work/seqs.jsonl" "$work/score.jsonl"
grep -E '^(PASS|FAIL): loop: transformers' "$work/part"
[ $rc = 0 ] || fail "loop: transformers against train score (exit $rc; see loop.log)"
exit $status
