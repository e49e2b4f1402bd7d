#!/usr/bin/env bash
# gpu-check.sh: everything a GPU machine should check of the CUDA backend, in
# one command that finishes in under 6 minutes (its timeouts add up to 340 s)
# and builds nothing there.
#
#   scripts/gpu-check.sh --build     on the development machine (Go + gcc, no
#                                    GPU): builds bin/gpu-check/cuda.test
#                                    (go test -c ./kernels/cuda) and
#                                    bin/gpu-check/train (./cmd/train)
#   scripts/gpu-check.sh OUTDIR      on the GPU machine, from the repository
#                                    root, with bin/gpu-check carried there
#
# What the run writes into OUTDIR:
#   nvidia-smi.txt      nvidia-smi and its GPU query (name, driver, memory, clocks)
#   optim-tests.txt     optim's TestAdamWGolden (PyTorch goldens) on cpu and cuda
#   gpu-tests.txt       go test -v of kernels/cuda's device tests, with
#                       TRACEGRPO_REQUIRE_GPU=1 so that "no device" fails:
#                         TestConformanceGPU   kerneltest: every op, CUDA vs CPU
#                         TestTinyStepGPU      one training step of the tiny
#                                              Qwen3 (model/testdata/qwen3_tied):
#                                              logprobs, loss, gradients and
#                                              AdamW-updated weights, CUDA vs CPU
#                         TestSamplerGPU       greedy sampling through prefill and
#                                              the KV cache (AttentionDecode), CUDA vs CPU
#                         TestMatmulModesGPU   fp32 / tf32 / bf16 GEMMs vs float64
#                         TestPTXAssemblesSM90 the PTX through that ptxas, if any
#   qwen3-0.6b.json     the Qwen3-0.6B config the benchmark builds (random weights)
#   bench_bf16.json     train bench --backend cuda, 8 × 1024 packed tokens, one
#   bench_fp32.json     step = forward + backward + AdamW; GEMMs in bf16 (fp32
#                       accumulation) and in fp32 (TRACEGRPO_CUDA_MATMUL)
#   profile_bf16.txt    the same bf16 step with --profile: time per op
#   summary.txt         PASS/FAIL per part, tokens/s, model FLOPs/token and MFU
#                       against the GPU's dense bf16 peak (table below)
# The exit status is 0 only when every test part passed.
#
# Dry run without a GPU (checks the script and the binaries on the CPU
# emulator of kernels/cuda's tests):
#   TRACEGRPO_EMU_KEEP=/tmp/emu go test -run EmuSmoke ./kernels/cuda
#   TRACEGRPO_CUDA_DRIVER=/tmp/emu/libfakecuda.so TRACEGRPO_CUDA_BLAS=/tmp/emu/libfakecublas.so \
#     GPU_CHECK_SKIP_BENCH=1 scripts/gpu-check.sh /tmp/gpu-check
#
# It expects bin/gpu-check/train to have the `bench` subcommand (cmd/train/
# bench.go: --model CONFIG --rows R --seq T --steps N --backend cuda
# [--profile], printing one JSON line with tokens_per_s and params).
set -u -o pipefail

if [ "${1:-}" = "--build" ]; then
	set -e
	mkdir -p bin/gpu-check
	go test -c -o bin/gpu-check/cuda.test ./kernels/cuda
	go test -c -o bin/gpu-check/optim.test ./optim
	go build -o bin/gpu-check/train ./cmd/train
	echo "built bin/gpu-check/{cuda.test,optim.test,train}; carry bin/gpu-check to the GPU machine"
	exit 0
fi
if [ $# -ne 1 ]; then
	echo "usage: $0 OUTDIR   (on the GPU machine)  |  $0 --build   (here, first)" >&2
	exit 2
fi
out=$1
mkdir -p "$out"
out=$(cd "$out" && pwd)
root=$(cd "$(dirname "$0")/.." && pwd)
bin=$root/bin/gpu-check
summary=$out/summary.txt
: >"$summary"
status=0
say() { echo "$*" | tee -a "$summary"; }
for f in cuda.test optim.test train; do
	if [ ! -x "$bin/$f" ]; then
		say "FAIL: $bin/$f missing: run scripts/gpu-check.sh --build on the development machine and carry bin/gpu-check"
		exit 1
	fi
done
start=$(date +%s)

# 1. The device.
{
	nvidia-smi
	echo
	nvidia-smi --query-gpu=name,driver_version,memory.total,clocks.max.sm,clocks.max.mem --format=csv
} >"$out/nvidia-smi.txt" 2>&1 || say "WARN: nvidia-smi failed (see nvidia-smi.txt)"
gpu=$(nvidia-smi --query-gpu=name --format=csv,noheader 2>/dev/null | head -1)
say "gpu: ${gpu:-unknown}"

# 2. cuBLAS: kernels/cuda looks in $TRACEGRPO_CUDA_LIBS, $LD_LIBRARY_PATH and
# the loader's path; add the usual toolkit and pip-wheel folders.
libs=""
for d in /usr/local/cuda/lib64 /usr/local/cuda/targets/x86_64-linux/lib /usr/lib/x86_64-linux-gnu \
	$(ls -d /opt/*/.venv/lib/python3*/site-packages/nvidia/*/lib /usr/local/lib/python3*/dist-packages/nvidia/*/lib 2>/dev/null); do
	if ls "$d"/libcublas.so.1[0-9]* >/dev/null 2>&1; then libs="$libs${libs:+:}$d"; fi
done
export TRACEGRPO_CUDA_LIBS="${TRACEGRPO_CUDA_LIBS:-}${TRACEGRPO_CUDA_LIBS:+:}$libs"
say "cuBLAS folders: ${TRACEGRPO_CUDA_LIBS:-none found (relying on the loader path)}"

# 3. Conformance, tiny-model step, GEMM modes (test binary built here, run in
# its package folder so it finds csrc/ and model/testdata).
(cd "$root/kernels/cuda" && TRACEGRPO_REQUIRE_GPU=1 timeout 100 "$bin/cuda.test" \
	-test.run 'GPU$|SM90$' -test.v -test.count=1 -test.timeout 95s) >"$out/gpu-tests.txt" 2>&1
rc=$?
for t in TestConformanceGPU TestTinyStepGPU TestTinyStepNCCLGPU TestSamplerGPU TestMatmulModesGPU; do
	if grep -q -- "--- PASS: $t " "$out/gpu-tests.txt"; then
		say "PASS: $t"
	else
		say "FAIL: $t (see gpu-tests.txt)"
		status=1
	fi
done
[ $rc -eq 0 ] || { say "FAIL: cuda.test exited $rc"; status=1; }
# The committed PTX through that machine's ptxas (CUDA 13), if it has one.
grep -E -- "--- (PASS|SKIP|FAIL): TestPTXAssemblesSM90" "$out/gpu-tests.txt" | sed 's/^--- //' | tee -a "$summary"
grep -E "device: |loss cpu" "$out/gpu-tests.txt" | sed 's/^ */  /' | tee -a "$summary"

# optim's AdamW goldens (PyTorch-authored) on the cuda backend too.
(cd "$root/optim" && TRACEGRPO_REQUIRE_GPU=1 timeout 60 "$bin/optim.test" \
	-test.run 'AdamWGolden' -test.v -test.count=1) >"$out/optim-tests.txt" 2>&1
if [ $? -eq 0 ] && grep -q -- "--- PASS: TestAdamWGolden" "$out/optim-tests.txt"; then
	say "PASS: optim TestAdamWGolden (cpu and cuda)"
else
	say "FAIL: optim TestAdamWGolden (see optim-tests.txt)"
	status=1
fi

# NCCL across processes: two ranks on the one GPU (each its own NCCL host id,
# over loopback), launched by torchrun, against one process: the same data
# and weights within the data-parallel tolerance.
if command -v torchrun >/dev/null 2>&1; then
	nccl_args=(--backend cuda --device 0 --quiet --steps 3 --set grpo.num_prompts_per_step=4
		--set grpo.num_generations_per_prompt=4 --set checkpointing.save_period=1
		--set policy.megatron_cfg.optimizer.adam_eps=1e-4)
	rm -rf "$out/nccl-one" "$out/nccl-two"
	timeout 120 "$bin/train" --out "$out/nccl-one" "${nccl_args[@]}" >"$out/nccl-one.txt" 2>&1
	NCCL_SOCKET_IFNAME=lo timeout 180 torchrun --standalone --nproc-per-node 2 --no-python \
		bash -c 'NCCL_HOSTID=tracegrpo-rank$LOCAL_RANK exec "$0" "$@"' "$bin/train" --out "$out/nccl-two" --dist nccl "${nccl_args[@]}" \
		>"$out/nccl-two.txt" 2>&1
	if cmp -s <(grep -o '"reward_mean":[^,]*' "$out/nccl-one/metrics.jsonl") <(grep -o '"reward_mean":[^,]*' "$out/nccl-two/metrics.jsonl" 2>/dev/null) &&
		[ -s "$out/nccl-two/metrics.jsonl" ]; then
		say "PASS: NCCL, 2 ranks on one GPU (torchrun): the same rewards as one process (see nccl-two.txt)"
		python3 - "$out" <<'PY' 2>&1 | tee -a "$summary"
import sys
from safetensors.numpy import load_file
a = load_file(f"{sys.argv[1]}/nccl-one/checkpoints/step_3/model.safetensors")
b = load_file(f"{sys.argv[1]}/nccl-two/checkpoints/step_3/model.safetensors")
d = max(float(abs(a[k] - b[k]).max()) for k in a)
print(f"{'PASS' if d <= 1e-6 else 'FAIL'}: NCCL, 2 ranks: largest weight difference from one process after 3 steps {d:.3g} (bound 1e-6)")
PY
	else
		say "FAIL: NCCL, 2 ranks on one GPU (see nccl-one.txt, nccl-two.txt)"
		status=1
	fi
else
	say "NOT RUN: NCCL with 2 ranks (no torchrun on this machine)"
fi

# 4. Throughput of one training step of a Qwen3-0.6B-shaped random model.
cfg=$out/qwen3-0.6b.json
cat >"$cfg" <<'EOF'
{
  "architectures": ["Qwen3ForCausalLM"],
  "model_type": "qwen3",
  "hidden_size": 1024,
  "intermediate_size": 3072,
  "num_hidden_layers": 28,
  "num_attention_heads": 16,
  "num_key_value_heads": 8,
  "head_dim": 128,
  "vocab_size": 151936,
  "max_position_embeddings": 40960,
  "rms_norm_eps": 1e-06,
  "rope_theta": 1000000,
  "rope_scaling": null,
  "hidden_act": "silu",
  "attention_bias": false,
  "tie_word_embeddings": true,
  "torch_dtype": "bfloat16"
}
EOF
ROWS=8 SEQ=1024
if [ "${GPU_CHECK_SKIP_BENCH:-0}" = 1 ]; then # dry runs on the CPU emulator
	say "bench: skipped (GPU_CHECK_SKIP_BENCH=1)"
	say "wall time: $(($(date +%s) - start)) s"
	exit $status
fi
bench() { # mode steps extra-args... ; prints the JSON line to stdout
	local mode=$1 steps=$2
	shift 2
	TRACEGRPO_CUDA_MATMUL=$mode timeout 60 "$bin/train" bench --backend cuda --model "$cfg" \
		--rows $ROWS --seq $SEQ --steps "$steps" "$@"
}
bench bf16 3 >"$out/bench_bf16.json" 2>"$out/bench_bf16.err" || say "FAIL: bf16 benchmark (see bench_bf16.err)"
bench fp32 2 >"$out/bench_fp32.json" 2>"$out/bench_fp32.err" || say "FAIL: fp32 benchmark (see bench_fp32.err)"
bench bf16 1 --profile >"$out/profile_bf16.json" 2>"$out/profile_bf16.txt" || say "WARN: profiled run failed (see profile_bf16.txt)"

# Dense bf16 tensor-core peak (TFLOP/s, no sparsity) by the vendor's datasheets.
peak=$(echo "$gpu" | awk '
	/H200 NVL/                      { print 835; exit }
	/H200/                          { print 989; exit }
	/H100 NVL/                      { print 835; exit }
	/H100 PCIe/                     { print 756; exit }
	/H100/                          { print 989; exit }
	/GH200/                         { print 989; exit }
	/A100/                          { print 312; exit }
	{ print 0 }')
# Model FLOPs per trained token (forward + backward = 3 × forward): 6 per
# matmul weight (every projection and the tied LM head) plus causal
# attention, 3 × 4·NH·HD·(SEQ+1)/2 per layer.
flops_per_token=$(awk -v seq=$SEQ 'BEGIN {
	C=1024; I=3072; L=28; NH=16; NKV=8; HD=128; V=151936
	w = L*(C*NH*HD + 2*C*NKV*HD + NH*HD*C + 3*C*I) + V*C
	att = L * 3 * 4*NH*HD*(seq+1)/2
	printf "%.0f", 6*w + att }')
for mode in bf16 fp32; do
	f=$out/bench_$mode.json
	tps=$(sed -n 's/.*"tokens_per_s":\([0-9.e+]*\).*/\1/p' "$f" 2>/dev/null | head -1)
	ms=$(sed -n 's/.*"ms_per_step":\([0-9.e+]*\).*/\1/p' "$f" 2>/dev/null | head -1)
	if [ -z "$tps" ]; then
		say "bench $mode: no result"
		continue
	fi
	awk -v m=$mode -v tps="$tps" -v ms="$ms" -v fpt="$flops_per_token" -v peak="$peak" -v g="$gpu" 'BEGIN {
		tf = tps*fpt/1e12
		if (peak > 0) mfu = sprintf("%.1f%% of %d TFLOP/s dense bf16 (%s)", 100*tf/peak, peak, g)
		else mfu = "n/a (GPU not in the peak table)"
		printf "bench %s: 8x1024 tokens/step, %.1f ms/step, %.0f tokens/s, %.1f model TFLOP/s (%.3g FLOP/token), MFU %s\n", m, ms, tps, tf, fpt, mfu }' |
		tee -a "$summary"
done
say "wall time: $(($(date +%s) - start)) s"
exit $status
