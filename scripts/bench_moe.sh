#!/usr/bin/env bash
# The sparse (Qwen3-MoE) step on the CPU, measured in one run: the bench
# model with every MLP sparse (E experts of width I/K, K per token: the dense
# model's active parameters per token, plus the router) against
#   - the dense bench model (same shapes), in tracegrpo and in PyTorch, and
#   - the same sparse model in PyTorch (transformers' loop over experts),
# with the same weights (scripts/bench_torch.py writes them), shapes and
# thread count, each step forward + backward + AdamW. Prints the four JSON
# lines and the ratios of the median step times. The machine may be shared:
# the four runs are back to back, and the ratios are what to quote.
# Usage: scripts/bench_moe.sh [--threads 2] [--steps 5] [--experts 16] [--topk 4]
set -euo pipefail
cd "$(dirname "$0")/.."
PYTHON=${PYTHON:-/usr/bin/python3}
GO=${GO:-go}
DIR=${BENCH_DIR:-$(mktemp -d /tmp/tracegrpo-bench-moe.XXXXXX)}
THREADS=2 STEPS=5 E=16 K=4 ROWS=8 SEQ=256
while [ $# -gt 0 ]; do
  case "$1" in
    --threads) THREADS=$2; shift 2 ;;
    --steps) STEPS=$2; shift 2 ;;
    --experts) E=$2; shift 2 ;;
    --topk) K=$2; shift 2 ;;
    --rows) ROWS=$2; shift 2 ;;
    --seq) SEQ=$2; shift 2 ;;
    *) echo "unknown argument $1" >&2; exit 2 ;;
  esac
done
$GO build -o "$DIR/train" ./cmd/train
OPENBLAS=${TORCH_BLAS_DIR:-/usr/lib/x86_64-linux-gnu/openblas-pthread}
TORCH_ENV=()
if [ -e "$OPENBLAS/libblas.so.3" ]; then
  TORCH_ENV=(env LD_LIBRARY_PATH="$OPENBLAS${LD_LIBRARY_PATH:+:$LD_LIBRARY_PATH}" OPENBLAS_NUM_THREADS="$THREADS")
else
  echo "bench_moe: OpenBLAS not found at $OPENBLAS; torch uses the system libblas.so.3" >&2
fi
common=(--rows "$ROWS" --seq "$SEQ" --steps "$STEPS" --threads "$THREADS")
torch_moe=$("${TORCH_ENV[@]}" $PYTHON scripts/bench_torch.py --out "$DIR/moe" --moe "$E,$K" "${common[@]}")
echo "$torch_moe"
torch_dense=$("${TORCH_ENV[@]}" $PYTHON scripts/bench_torch.py --out "$DIR/dense" "${common[@]}")
echo "$torch_dense"
ours_moe=$("$DIR/train" bench --model "$DIR/moe/config.json" --weights "$DIR/moe" "${common[@]}")
echo "$ours_moe"
ours_dense=$("$DIR/train" bench --model "$DIR/dense/config.json" --weights "$DIR/dense" "${common[@]}")
echo "$ours_dense"
$PYTHON - "$torch_moe" "$torch_dense" "$ours_moe" "$ours_dense" <<'PY'
import json, sys
tm, td, m, d = (json.loads(a) for a in sys.argv[1:])
print(json.dumps({"moe_over_dense_tracegrpo": m["ms_per_step"] / d["ms_per_step"],
                  "moe_over_dense_torch": tm["ms_per_step"] / td["ms_per_step"],
                  "tracegrpo_over_torch_moe": m["ms_per_step"] / tm["ms_per_step"],
                  "tracegrpo_over_torch_dense": d["ms_per_step"] / td["ms_per_step"],
                  "torch_moe_ms": tm["ms_per_step"], "torch_dense_ms": td["ms_per_step"],
                  "tracegrpo_moe_ms": m["ms_per_step"], "tracegrpo_dense_ms": d["ms_per_step"],
                  "torch_blas": tm["blas"], "params_moe": m["params"], "params_dense": d["params"]}))
PY
