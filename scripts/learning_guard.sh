#!/usr/bin/env bash
# learning_guard.sh: measures what trainer's TestBuiltinJobLearns guards, over
# many seeds, to set its threshold (learnGainMin) from their spread.
#
#   scripts/learning_guard.sh [FIRST_SEED] [LAST_SEED] [LR]   (defaults 1 30 3e-3)
#
# Runs the built-in job for 40 steps per seed, as the test does (lr LR,
# checkpointing off), two seeds at a time, and prints per seed the mean
# reward of the first and last 10 steps and their difference (the gain),
# then the mean, standard deviation and least gain. LR=0 measures a policy
# that does not learn (min_lr and the warm-up start are set to 0 with it).
# STEPS=N runs N steps instead of 40; MODEL=NAME trains another model
# (policy.model_name), e.g. MODEL=tracegrpo/tiny-qwen3-moe for the sparse
# model's guard (trainer's TestSparseBuiltinJobLearns).
set -euo pipefail
cd "$(dirname "$0")/.."
first=${1:-1} last=${2:-30} lr=${3:-3e-3}
steps=${STEPS:-40}
go build -o bin/train ./cmd/train
tmp=$(mktemp -d)
trap 'rm -rf "$tmp"' EXIT
extra=()
if [ -n "${MODEL:-}" ]; then
	extra+=(--set policy.model_name="$MODEL")
fi
if [ "$lr" = 0 ]; then
	extra+=(--set policy.megatron_cfg.optimizer.min_lr=0 --set policy.megatron_cfg.scheduler.lr_warmup_init=0)
fi
one() {
	bin/train --backend cpu --threads 1 --quiet --out "$tmp/$1" --steps "$steps" --set grpo.seed="$1" \
		--set policy.megatron_cfg.optimizer.lr="$lr" --set checkpointing.enabled=false ${extra[@]+"${extra[@]}"}
}
for s in $(seq "$first" "$last"); do
	one "$s" &
	if (( (s - first) % 2 == 1 )); then wait; fi
done
wait
/usr/bin/python3 - "$tmp" "$first" "$last" <<'PY'
import json, math, sys
tmp, first, last = sys.argv[1], int(sys.argv[2]), int(sys.argv[3])
gains = []
for s in range(first, last + 1):
    r = [json.loads(l)["reward_mean"] for l in open(f"{tmp}/{s}/metrics.jsonl")]
    f, l = sum(r[:10]) / 10, sum(r[-10:]) / 10
    gains.append(l - f)
    print(f"seed {s}: first 10 {f:.3f}, last 10 {l:.3f}, gain {l - f:.3f}")
m = sum(gains) / len(gains)
sd = math.sqrt(sum((g - m) ** 2 for g in gains) / len(gains))
print(f"{len(gains)} seeds: mean gain {m:.3f}, sd {sd:.3f}, least {min(gains):.3f}")
PY
