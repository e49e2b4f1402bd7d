#!/usr/bin/env bash
# Times one forward + backward + AdamW step of the Qwen3-shaped bench model in
# PyTorch (scripts/bench_torch.py) and in tracegrpo (train bench) with the same
# weights, shapes and thread count, back to back, and prints both JSON lines
# and the ratio of their median step times. Extra args go to both (--steps N).
# Usage: scripts/bench_compare.sh [--threads 2] [--steps 5] [--profile]
set -euo pipefail
cd "$(dirname "$0")/.."
PYTHON=${PYTHON:-/usr/bin/python3}
GO=${GO:-go}
DIR=${BENCH_DIR:-$(mktemp -d /tmp/tracegrpo-bench.XXXXXX)}
THREADS=2 STEPS=5 PROFILE=
while [ $# -gt 0 ]; do
  case "$1" in
    --threads) THREADS=$2; shift 2 ;;
    --steps) STEPS=$2; shift 2 ;;
    --profile) PROFILE=--profile; shift ;;
    *) echo "unknown argument $1" >&2; exit 2 ;;
  esac
done
$GO build -o "$DIR/train" ./cmd/train
# Debian's torch uses libblas.so.3, the reference BLAS unless configured
# otherwise (~2.5 GFLOP/s): point it at OpenBLAS when that is installed
# (apt-get install libopenblas0-pthread) so the reference is a realistic one.
OPENBLAS=${TORCH_BLAS_DIR:-/usr/lib/x86_64-linux-gnu/openblas-pthread}
if [ -e "$OPENBLAS/libblas.so.3" ]; then
  export LD_LIBRARY_PATH="$OPENBLAS${LD_LIBRARY_PATH:+:$LD_LIBRARY_PATH}" OPENBLAS_NUM_THREADS=$THREADS
else
  echo "bench_compare: OpenBLAS not found at $OPENBLAS; torch uses the system libblas.so.3" >&2
fi
torch=$($PYTHON scripts/bench_torch.py --out "$DIR/model" --rows 8 --seq 256 --steps "$STEPS" --threads "$THREADS" $PROFILE)
echo "$torch"
ours=$(env -u LD_LIBRARY_PATH "$DIR/train" bench --model "$DIR/model/config.json" --weights "$DIR/model" --rows 8 --seq 256 --steps "$STEPS" --threads "$THREADS" $PROFILE)
echo "$ours"
$PYTHON - "$torch" "$ours" <<'PY'
import json, sys
t, o = json.loads(sys.argv[1]), json.loads(sys.argv[2])
print(json.dumps({"ratio_ms_per_step_tracegrpo_over_torch": o["ms_per_step"] / t["ms_per_step"],
                  "torch_ms": t["ms_per_step"], "tracegrpo_ms": o["ms_per_step"],
                  "torch_peak_rss_mib": t["peak_rss_mib"], "tracegrpo_peak_rss_mib": o["peak_rss_mib"]}))
PY
