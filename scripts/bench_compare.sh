#!/usr/bin/env bash
# Times one forward + backward + AdamW step of the Qwen3-shaped bench model in
# PyTorch (scripts/bench_torch.py) and in tracegrpo (train bench) with the same
# weights, shapes and thread count, interleaved: each round runs torch, then
# tracegrpo on every SIMD path in turn (the path chosen for this CPU first,
# then each other path forced with TRACEGRPO_CPU_SIMD). It prints every JSON
# line as it comes, then the host's CPU, the BLAS torch used, and for each
# path the ratio of tracegrpo's median step time to torch's, per round (the
# two measured back to back) and over all rounds, and the ratio of the two
# sides' best steps.
#
# Usage: scripts/bench_compare.sh [--threads 2] [--steps 5] [--rounds 2]
#                                 [--paths "avx512 avx2"] [--profile]
# --paths lists the paths to force after the chosen one (default: the fma
# paths this CPU has; add go for the portable kernel, ~50x slower a step).
# OPENBLAS_CORETYPE=SkylakeX (say) makes torch's OpenBLAS use another of its
# kernels than the one it detects; the summary names the one it used.
set -euo pipefail
cd "$(dirname "$0")/.."
PYTHON=${PYTHON:-/usr/bin/python3}
GO=${GO:-go}
DIR=${BENCH_DIR:-$(mktemp -d /tmp/tracegrpo-bench.XXXXXX)}
THREADS=2 STEPS=5 ROUNDS=2 PROFILE= PATHS=
flags=$(grep -m1 '^flags' /proc/cpuinfo || true)
for p in avx512 avx2; do
  case $p in
    avx512) [[ $flags == *" avx512f "* ]] || continue ;;
    avx2) [[ $flags == *" avx2 "* && $flags == *" fma "* ]] || continue ;;
  esac
  PATHS="$PATHS $p"
done
while [ $# -gt 0 ]; do
  case "$1" in
    --threads) THREADS=$2; shift 2 ;;
    --steps) STEPS=$2; shift 2 ;;
    --rounds) ROUNDS=$2; shift 2 ;;
    --paths) PATHS=$2; shift 2 ;;
    --profile) PROFILE=--profile; shift ;;
    *) echo "unknown argument $1" >&2; exit 2 ;;
  esac
done
$GO build -o "$DIR/train" ./cmd/train
# Debian's torch uses libblas.so.3, the reference BLAS unless configured
# otherwise (~2.5 GFLOP/s): point it at OpenBLAS when that is installed
# (apt-get install libopenblas0-pthread) so the reference is a realistic one.
OPENBLAS=${TORCH_BLAS_DIR:-/usr/lib/x86_64-linux-gnu/openblas-pthread}
torch_env=(OPENBLAS_NUM_THREADS=$THREADS)
if [ -e "$OPENBLAS/libblas.so.3" ]; then
  torch_env+=(LD_LIBRARY_PATH="$OPENBLAS${LD_LIBRARY_PATH:+:$LD_LIBRARY_PATH}")
else
  echo "bench_compare: OpenBLAS not found at $OPENBLAS; torch uses the system libblas.so.3" >&2
fi
# The weights and config torch times, written once for every run.
torch_args=(--rows 8 --seq 256 --steps "$STEPS" --threads "$THREADS")
ours_args=(bench --model "$DIR/model/config.json" --weights "$DIR/model" --rows 8 --seq 256 --steps "$STEPS" --threads "$THREADS")
lines="$DIR/lines.jsonl"
: >"$lines"
for r in $(seq 1 "$ROUNDS"); do
  out=$(env "${torch_env[@]}" "$PYTHON" scripts/bench_torch.py --out "$DIR/model" "${torch_args[@]}" $PROFILE)
  echo "$out"
  echo "{\"round\": $r, \"run\": \"torch\", \"result\": $out}" >>"$lines"
  chosen=
  for p in auto $PATHS; do
    [ "$p" != "$chosen" ] || continue # the chosen path ran as auto
    simd=()
    [ "$p" = auto ] || simd=(TRACEGRPO_CPU_SIMD="$p")
    out=$(env -u LD_LIBRARY_PATH "${simd[@]}" "$DIR/train" "${ours_args[@]}" $PROFILE)
    echo "$out"
    echo "{\"round\": $r, \"run\": \"$p\", \"result\": $out}" >>"$lines"
    if [ "$p" = auto ]; then
      chosen=$(printf '%s' "$out" | "$PYTHON" -c 'import json, sys; print(json.load(sys.stdin).get("kernel_path", "").split(" ")[0])')
    fi
  done
done
$PYTHON - "$lines" "$THREADS" <<'PY'
import json, statistics, sys
runs = [json.loads(l) for l in open(sys.argv[1])]
threads = sys.argv[2]
cpu = {}
for line in open("/proc/cpuinfo"):
    k, _, v = line.partition(":")
    cpu.setdefault(k.strip(), v.strip())
torch = [r["result"] for r in runs if r["run"] == "torch"]
t0 = torch[0]
print(json.dumps({"host_cpu": "%s (%s family %s model %s)" % (cpu.get("model name"), cpu.get("vendor_id"), cpu.get("cpu family"), cpu.get("model")),
                  "threads": int(threads), "torch": t0["torch"], "torch_blas": t0.get("blas_config") or t0["blas"],
                  "torch_ms_per_step": [t["ms_per_step"] for t in torch]}))
paths = []
for r in runs:
    if r["run"] != "torch" and r["run"] not in paths:
        paths.append(r["run"])
for p in paths:
    ours = [(r["round"], r["result"]) for r in runs if r["run"] == p]
    per_round = [o["ms_per_step"] / torch[rnd - 1]["ms_per_step"] for rnd, o in ours]
    med_ours = statistics.median(o["ms_per_step"] for _, o in ours)
    med_torch = statistics.median(t["ms_per_step"] for t in torch)
    o0 = ours[0][1]
    # The least disturbed step of each side (a shared machine steals time
    # from some steps; no step runs faster than the machine allows).
    best = min(o["ms_min"] for _, o in ours) / min(t["ms_min"] for t in torch)
    print(json.dumps({"simd": o0.get("kernel_path", "").split(" ")[0] or p, "chosen_for_this_cpu": p == "auto",
                      "kernel_path": o0.get("kernel_path"), "rounding_path": o0.get("rounding_path"),
                      "ratio_ms_per_step_tracegrpo_over_torch": med_ours / med_torch, "ratio_best_step": best,
                      "ratio_per_round": per_round, "tracegrpo_ms_per_step": [o["ms_per_step"] for _, o in ours],
                      "mean_logprob_last_step": o0["mean_logprob_last_step"],
                      "tracegrpo_peak_rss_mib": o0.get("peak_rss_mib"), "torch_peak_rss_mib": t0["peak_rss_mib"]}))
PY
