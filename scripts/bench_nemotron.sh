#!/usr/bin/env bash
# make bench-nemotron: Nemotron-H on the CPU, measured in one run.
#   1. One training step (forward, backward, AdamW) of a tiny-but-not-trivial
#      Nemotron-H (scripts/bench_nemotronh.py's: MEM*EME, hidden 256, Mamba-2
#      heads 8 × 32 with state 64, 16 experts of 256, 4 a token, a shared
#      expert) in PyTorch and in tracegrpo (train bench) on the same weights,
#      shapes and thread count, twice each, interleaved; the ratio of the
#      median step times is what to quote (the machine may be shared).
#   2. The Mamba-2 scan's tokens/s against the bench model's attention at
#      4096 tokens: train bench --profile of one row of 4096 tokens through
#      a two-block model "M*" whose attention is the bench model's (hidden 512,
#      8 heads of 64, 4 KV heads) and whose Mamba-2 mixer is Nemotron-3-Nano's
#      shape at that width (16 heads of 64, 8 groups, state 128, chunk 128);
#      forward and backward each, from the profile's per-op times.
# Usage: scripts/bench_nemotron.sh [--threads 2] [--steps 3] [--rows 2] [--seq 256]
set -euo pipefail
cd "$(dirname "$0")/.."
PYTHON=${PYTHON:-/usr/bin/python3}
GO=${GO:-go}
DIR=${BENCH_DIR:-$(mktemp -d /tmp/tracegrpo-bench-nemotron.XXXXXX)}
THREADS=2 STEPS=3 ROWS=2 SEQ=256
while [ $# -gt 0 ]; do
  case "$1" in
    --threads) THREADS=$2; shift 2 ;;
    --steps) STEPS=$2; shift 2 ;;
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
  echo "bench_nemotron: OpenBLAS not found at $OPENBLAS; torch uses the system libblas.so.3" >&2
fi
common=(--rows "$ROWS" --seq "$SEQ" --steps "$STEPS" --threads "$THREADS")
lines=()
for round in 1 2; do
  t=$("${TORCH_ENV[@]}" $PYTHON scripts/bench_nemotronh.py --out "$DIR/model" "${common[@]}")
  echo "$t"
  o=$("$DIR/train" bench --backend cpu --model "$DIR/model/config.json" --weights "$DIR/model" "${common[@]}" 2>/dev/null)
  echo "$o"
  lines+=("$t" "$o")
done
mkdir -p "$DIR/scan"
cat > "$DIR/scan/config.json" <<'JSON'
{"model_type": "nemotron_h", "architectures": ["NemotronHForCausalLM"], "hybrid_override_pattern": "M*",
 "hidden_size": 512, "vocab_size": 8192, "num_attention_heads": 8, "num_key_value_heads": 4, "head_dim": 64,
 "intermediate_size": 1536, "layer_norm_epsilon": 1e-5, "mamba_num_heads": 16, "mamba_head_dim": 64, "n_groups": 8,
 "ssm_state_size": 128, "conv_kernel": 4, "chunk_size": 128, "use_conv_bias": true, "mamba_hidden_act": "silu",
 "mlp_hidden_act": "relu2", "tie_word_embeddings": false, "max_position_embeddings": 4096, "attention_bias": false,
 "mlp_bias": false, "use_bias": false, "torch_dtype": "float32"}
JSON
"$DIR/train" bench --backend cpu --model "$DIR/scan/config.json" --rows 1 --seq 4096 --steps 2 --threads "$THREADS" --profile \
  >"$DIR/scan/bench.json" 2>"$DIR/scan/profile.txt"
$PYTHON - "$DIR/scan/profile.txt" "${lines[@]}" <<'PY'
import json, statistics, sys
prof, runs = sys.argv[1], [json.loads(a) for a in sys.argv[2:]]
torch = [r["ms_per_step"] for r in runs if r.get("impl") == "torch"]
ours = [r["ms_per_step"] for r in runs if r.get("impl") != "torch"]
ms = {}
for line in open(prof):
    f = line.split()
    if len(f) >= 5 and f[4].endswith("%"):
        try:
            ms[f[0]] = float(f[5])  # the op's calls in its least disturbed step, ms
        except ValueError:
            pass
T = 4096
def tps(*ops):
    t = sum(ms.get(o, 0) for o in ops)
    return T / (t / 1e3) if t > 0 else None
print(json.dumps({
    "step_tracegrpo_over_torch": statistics.median(ours) / statistics.median(torch),
    "step_ms_tracegrpo": ours, "step_ms_torch": torch, "params": runs[1]["params"],
    "scan_tokens_per_s_forward": tps("SSMScan"), "attention_tokens_per_s_forward": tps("Attention"),
    "scan_tokens_per_s_backward": tps("SSMScanBackward"), "attention_tokens_per_s_backward": tps("AttentionBackward"),
    "scan_over_attention_tokens_per_s": (tps("SSMScan", "SSMScanBackward") or 0) / (tps("Attention", "AttentionBackward") or 1),
    "profile_ms_per_step": {k: ms.get(k) for k in ("SSMScan", "SSMScanBackward", "Attention", "AttentionBackward", "Conv1D", "Matmul", "MatmulBackward")},
}))
PY
