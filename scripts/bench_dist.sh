#!/usr/bin/env bash
# bench_dist.sh: step time of data-parallel training at 1, 2 and 4 ranks on
# this machine (Open MPI's mpirun, the CPU backend), for the built-in job and
# for the bench model of scripts/bench_torch.py (Qwen3 shape, hidden 512,
# 8 layers, 8 × 256 tokens). Ranks share the machine's cores (train divides
# them), so on a small CPU machine more ranks do not mean more throughput:
# this measures the data-parallel path, not a speed-up. Each runs whole on
# every rank (--shard none) and fully sharded (--shard full). Prints one line
# per measurement.
#   scripts/bench_dist.sh [RANKS...]   (default 1 2 4)
set -euo pipefail
cd "$(dirname "$0")/.."
ranks=${*:-1 2 4}
go build -o bin/train ./cmd/train
tmp=$(mktemp -d)
trap 'rm -rf "$tmp"' EXIT
/usr/bin/python3 -c 'import json, sys; sys.path.insert(0, "scripts"); from bench_torch import CONFIG; json.dump(CONFIG, open(sys.argv[1], "w"))' "$tmp/bench.json"
for n in $ranks; do
	# One rank runs as a plain process (every core); mpirun binds each rank
	# of a small job to a core of its own.
	mpi=()
	if [ "$n" -gt 1 ]; then
		mpi=(mpirun --allow-run-as-root --oversubscribe --mca btl_vader_single_copy_mechanism none -np "$n")
	fi
	for shard in none full; do
		out="$tmp/builtin-$n-$shard"
		"${mpi[@]}" bin/train --backend cpu --quiet --out "$out" --steps 30 --set checkpointing.enabled=false --shard "$shard"
		/usr/bin/python3 - "$out/metrics.jsonl" "$n" "$shard" <<'PY'
import json, statistics, sys
ms = [json.loads(l) for l in open(sys.argv[1])][5:]  # steps 6..30: warmed up
t = statistics.median(m["time_s"] for m in ms)
tok = statistics.median(m["train_tokens"] / m["time_s"] for m in ms)
comm = statistics.median(m.get("comm_gather_bytes", 0) for m in ms) / 2**20
print(f"built-in job, {sys.argv[2]} ranks, --shard {sys.argv[3]}: median step {1000 * t:.1f} ms, {tok:.0f} trained tokens/s, {comm:.2f} MiB gathered a step (steps 6-30)")
PY
		"${mpi[@]}" bin/train bench --backend cpu --model "$tmp/bench.json" --rows 8 --seq 256 --steps 3 --shard "$shard" \
			| /usr/bin/python3 -c 'import json, sys; r = json.loads(sys.stdin.read()); print("bench model (8 x 256 tokens), %d ranks, --shard %s: median step %.0f ms, %.0f tokens/s, %d threads per rank, model state %.0f MiB a rank, peak RSS %s MiB against plans %s MiB, %.0f MiB gathered and %.0f MiB reduce-scattered a step" % (r["ranks"], sys.argv[1], r["ms_per_step"], r["tokens_per_s"], r["threads"], r["model_state_mib"], r.get("peak_rss_ranks_mib", [r["peak_rss_mib"]]), r.get("plan_ranks_mib", [r["plan_mib"]]), r.get("comm_gather_mib_per_step", 0), r.get("comm_reduce_scatter_mib_per_step", 0)))' "$shard"
	done
done
