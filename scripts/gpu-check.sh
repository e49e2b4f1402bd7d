#!/usr/bin/env bash
# gpu-check.sh: everything a GPU machine should check and measure of the CUDA
# backend, in one command that finishes inside 8 minutes (its timeouts add up
# to 475 s) and builds nothing there.
#
#   scripts/gpu-check.sh --build     on the development machine (Go + gcc, no
#                                    GPU): builds bin/gpu-check/cuda.test
#                                    (go test -c ./kernels/cuda), optim.test
#                                    and train (./cmd/train)
#   scripts/gpu-check.sh OUTDIR      on the GPU machine, from the repository
#                                    root, with bin/gpu-check carried there
#                                    (torch 2.x on python3 for the reference)
#
# What the run writes into OUTDIR (summary.txt has every result line):
#   nvidia-smi.txt      nvidia-smi and its GPU query (name, driver, memory, clocks)
#   gpu-tests.txt       go test -v of kernels/cuda's device tests, with
#                       TRACEGRPO_REQUIRE_GPU=1 so that "no device" fails:
#                         TestConformanceGPU    kerneltest, every op and shape
#                                               (bf16 attention up to 4096 tokens
#                                               at HD 64/128, device sampling, ...)
#                                               CUDA vs CPU
#                         TestMMALayoutGPU      the emulator's model of mma.sync,
#                                               ldmatrix and cp.async vs the hardware
#                         TestTinyStepGPU       one fp32 training step of the tiny
#                         TestTinyStepBF16GPU   models, and one mixed-precision step,
#                                               CUDA vs CPU
#                         TestTinyStepNCCLGPU   the step through a 1-rank NCCL
#                         TestSamplerGPU        greedy, top-k and top-p sampling with
#                                               refills through the KV cache, CUDA vs CPU
#                         TestMatmulModesGPU    fp32 / tf32 / bf16 GEMMs vs float64
#                         TestPTXAssemblesSM90, TestSASS  with that machine's ptxas,
#                                               if any
#   optim-tests.txt     optim's TestAdamWGolden (PyTorch goldens) on cpu and cuda
#   nccl-*.txt          NCCL across two ranks on the one GPU (torchrun) vs one process
#   perf.txt            TestPerfGPU: copy bandwidth, bf16 GEMM rate, attention
#                       forward/backward TFLOP/s at 4 × 4096 tokens (Qwen3-1.7B
#                       heads, HD 128), the LM head against its GEMMs, and the
#                       memory-bound ops against the copy bandwidth
#   sampler.txt         TestSamplerThroughputGPU: tokens/s at batch 256
#   bench.json          train bench, Qwen3-1.7B shape, 4 × 4096 tokens, bf16 mixed
#   bench.err           precision, one step = forward + backward + AdamW
#   profile.txt         the same step with --profile: time per op (which op holds
#                       the step back)
#   torch.json          scripts/bench_torch_gpu.py: the same step in PyTorch (bf16
#                       autocast, SDPA, fused AdamW)
#   memcheck.txt        compute-sanitizer --tool memcheck of the conformance suite
#   racecheck.txt       compute-sanitizer --tool racecheck of its tensor-core,
#                       sampling and fused-norm cases (the reduced shapes)
#   summary.txt         PASS/FAIL per test part, every PERF line, the step's tokens/s,
#                       MFU and peak memory for both, their ratio, the targets
# The exit status is 0 only when every test part passed (performance targets
# are reported, not enforced).
#
# Dry run without a GPU (checks the script and the binaries on the CPU
# emulator of kernels/cuda's tests; the tests then run on the emulator, the
# perf harness at tiny shapes, the step benchmarks and the sanitizer not at all):
#   TRACEGRPO_EMU_KEEP=/tmp/emu go test -run EmuSmoke ./kernels/cuda
#   TRACEGRPO_CUDA_DRIVER=/tmp/emu/libfakecuda.so TRACEGRPO_CUDA_BLAS=/tmp/emu/libfakecublas.so \
#     GPU_CHECK_SKIP_BENCH=1 scripts/gpu-check.sh /tmp/gpu-check
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
dry=${GPU_CHECK_SKIP_BENCH:-0} # 1: a dry run on the emulator
say() { echo "$*" | tee -a "$summary"; }
for f in cuda.test optim.test train; do
	if [ ! -x "$bin/$f" ]; then
		say "FAIL: $bin/$f missing: run scripts/gpu-check.sh --build on the development machine and carry bin/gpu-check"
		exit 1
	fi
done
start=$(date +%s)
cfg=$root/model/testdata/published/qwen3-1.7b.config.json
ROWS=4 SEQ=4096
# tmo S: a part's time limit, S seconds on a GPU (the emulator of a dry run
# is far slower: four times as long there).
tmo() { if [ "$dry" = 1 ]; then echo $(($1 * 4)); else echo "$1"; fi; }
if [ "$dry" = 1 ]; then
	say "dry run (GPU_CHECK_SKIP_BENCH=1): the tests on ${TRACEGRPO_CUDA_DRIVER:-libcuda.so.1} with the reduced conformance shapes, the perf harness at tiny shapes; no step benchmarks, no sanitizer; time limits ×4"
	export TRACEGRPO_CONFORMANCE_REDUCED=1 TRACEGRPO_PERF_SHAPES=tiny
	cfg=$root/model/testdata/qwen3_tied/config.json
	emu_nccl=$(dirname "${TRACEGRPO_CUDA_DRIVER:-.}")/libfakenccl.so # built beside the emulated driver
	if [ -z "${TRACEGRPO_NCCL_LIB:-}" ] && [ -f "$emu_nccl" ]; then export TRACEGRPO_NCCL_LIB=$emu_nccl; fi
fi

# 1. The device. [5 s]
{
	timeout 5 nvidia-smi
	echo
	timeout 5 nvidia-smi --query-gpu=name,driver_version,memory.total,clocks.max.sm,clocks.max.mem --format=csv
} >"$out/nvidia-smi.txt" 2>&1 || say "WARN: nvidia-smi failed (see nvidia-smi.txt)"
gpu=$(timeout 5 nvidia-smi --query-gpu=name --format=csv,noheader 2>/dev/null | head -1)
say "gpu: ${gpu:-unknown}"

# 2. cuBLAS: kernels/cuda looks in $TRACEGRPO_CUDA_LIBS, $LD_LIBRARY_PATH and
# the loader's path; add the usual toolkit and pip-wheel folders.
libs=""
for d in /usr/local/cuda/lib64 /usr/local/cuda/targets/x86_64-linux/lib /usr/lib/x86_64-linux-gnu \
	$(ls -d /opt/*/.venv/lib/python3*/site-packages/nvidia/*/lib /usr/local/lib/python3*/dist-packages/nvidia/*/lib \
		/usr/local/lib/python3*/site-packages/nvidia/*/lib 2>/dev/null); do
	if ls "$d"/libcublas.so.1[0-9]* >/dev/null 2>&1; then libs="$libs${libs:+:}$d"; fi
done
export TRACEGRPO_CUDA_LIBS="${TRACEGRPO_CUDA_LIBS:-}${TRACEGRPO_CUDA_LIBS:+:}$libs"
say "cuBLAS folders: ${TRACEGRPO_CUDA_LIBS:-none found (relying on the loader path)}"

# 3. Correctness on the device (test binary built here, run in its package
# folder so it finds csrc/ and model/testdata). [75 s]
(cd "$root/kernels/cuda" && TRACEGRPO_REQUIRE_GPU=1 timeout "$(tmo 75)" "$bin/cuda.test" \
	-test.run 'GPU$|SM90$|^TestSASS$' -test.skip 'Perf|Throughput' -test.v -test.count=1) >"$out/gpu-tests.txt" 2>&1
rc=$?
for t in TestConformanceGPU TestMMALayoutGPU TestTinyStepGPU TestTinyStepBF16GPU TestTinyStepNCCLGPU TestSamplerGPU TestMatmulModesGPU TestTrainPlanEqualsAllocatedGPU; do
	if grep -q -- "--- PASS: $t " "$out/gpu-tests.txt"; then
		say "PASS: $t"
	else
		say "FAIL: $t (see gpu-tests.txt)"
		status=1
	fi
done
[ $rc -eq 0 ] || { say "FAIL: cuda.test exited $rc"; status=1; }
# The committed PTX through that machine's ptxas, if it has one.
grep -E -- "--- (PASS|SKIP|FAIL): (TestPTXAssemblesSM90|TestSASS)" "$out/gpu-tests.txt" | sed 's/^--- //' | tee -a "$summary"
grep -E "device: |loss cpu|bf16 step: " "$out/gpu-tests.txt" | sed 's/^ */  /' | sort -u | tee -a "$summary"

# 4. optim's AdamW goldens (PyTorch-authored) on the cuda backend too. [15 s]
(cd "$root/optim" && TRACEGRPO_REQUIRE_GPU=1 timeout "$(tmo 15)" "$bin/optim.test" \
	-test.run 'AdamWGolden' -test.v -test.count=1) >"$out/optim-tests.txt" 2>&1
if [ $? -eq 0 ] && grep -q -- "--- PASS: TestAdamWGolden" "$out/optim-tests.txt"; then
	say "PASS: optim TestAdamWGolden (cpu and cuda)"
else
	say "FAIL: optim TestAdamWGolden (see optim-tests.txt)"
	status=1
fi

# 5. NCCL across processes: two ranks on the one GPU (each its own NCCL host
# id, over loopback), launched by torchrun, against one process: the same
# data and weights within the data-parallel tolerance. [25 + 40 s]
if command -v torchrun >/dev/null 2>&1 && [ "$dry" != 1 ]; then
	nccl_args=(--backend cuda --device 0 --quiet --steps 3 --set grpo.num_prompts_per_step=4
		--set grpo.num_generations_per_prompt=4 --set checkpointing.save_period=1
		--set policy.megatron_cfg.optimizer.adam_eps=1e-4)
	rm -rf "$out/nccl-one" "$out/nccl-two"
	timeout 25 "$bin/train" --out "$out/nccl-one" "${nccl_args[@]}" >"$out/nccl-one.txt" 2>&1
	NCCL_SOCKET_IFNAME=lo timeout 40 torchrun --standalone --nproc-per-node 2 --no-python \
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
	say "NOT RUN: NCCL with 2 ranks (no torchrun on this machine, or a dry run)"
fi

# 6. Op-level measurements (kernels/cuda TestPerfGPU). [50 s]
(cd "$root/kernels/cuda" && TRACEGRPO_PERF=1 timeout "$(tmo 50)" "$bin/cuda.test" -test.run '^TestPerfGPU$' -test.v -test.count=1) >"$out/perf.txt" 2>&1 ||
	say "WARN: the op measurements did not finish (see perf.txt)"
grep -o 'PERF .*' "$out/perf.txt" | tee -a "$summary"

# 7. The sampler's tokens/s at batch 256 (model.Sampler on the device). [30 s]
(cd "$root/kernels/cuda" && TRACEGRPO_PERF=1 TRACEGRPO_PERF_MODEL="$cfg" timeout "$(tmo 30)" "$bin/cuda.test" \
	-test.run '^TestSamplerThroughputGPU$' -test.v -test.count=1) >"$out/sampler.txt" 2>&1 ||
	say "WARN: the sampler measurement did not finish (see sampler.txt)"
grep -o 'PERF .*' "$out/sampler.txt" | tee -a "$summary"

if [ "$dry" = 1 ]; then
	say "bench: skipped (GPU_CHECK_SKIP_BENCH=1)"
	say "NOT RUN: compute-sanitizer (a dry run)"
	say "wall time: $(($(date +%s) - start)) s"
	exit $status
fi

# 8. One training step at the Qwen3-1.7B shape, 4 × 4096 tokens, bf16 mixed
# precision: tracegrpo (plain, then per-op profile) and PyTorch. The device's
# memory in use is sampled while tracegrpo runs (its context and cuBLAS
# workspace included; plan_mib is what the backend itself allocated).
memwatch() { # file: the largest nvidia-smi memory.used (MiB) until killed
	local max=0 m
	while :; do
		m=$(nvidia-smi --query-gpu=memory.used --format=csv,noheader,nounits 2>/dev/null | head -1)
		[ -n "$m" ] && [ "$m" -gt "$max" ] 2>/dev/null && max=$m && echo "$max" >"$1"
		sleep 0.5
	done
}
memwatch "$out/bench_mem_mib.txt" &
mw=$!
timeout 70 "$bin/train" bench --backend cuda --model "$cfg" --rows $ROWS --seq $SEQ --steps 2 \
	--precision bfloat16 >"$out/bench.json" 2>"$out/bench.err" || say "FAIL: tracegrpo bf16 step benchmark (see bench.err)"
kill $mw 2>/dev/null
wait $mw 2>/dev/null
timeout 50 "$bin/train" bench --backend cuda --model "$cfg" --rows $ROWS --seq $SEQ --steps 1 \
	--precision bfloat16 --profile >"$out/profile.json" 2>"$out/profile.txt" || say "WARN: the profiled step did not finish (see profile.txt)"
timeout 55 python3 "$root/scripts/bench_torch_gpu.py" --config "$cfg" --rows $ROWS --seq $SEQ --steps 2 \
	>"$out/torch.json" 2>"$out/torch.err" || say "WARN: the PyTorch step did not finish (see torch.err)"

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
# attention, 3 × 4·NH·HD·(SEQ+1)/2 per layer. Recomputation is not counted.
flops_per_token=$(python3 - "$cfg" $SEQ <<'PY'
import json, sys
c = json.load(open(sys.argv[1])); seq = int(sys.argv[2])
C, I, L, NH, NKV, V = c["hidden_size"], c["intermediate_size"], c["num_hidden_layers"], c["num_attention_heads"], c["num_key_value_heads"], c["vocab_size"]
HD = c.get("head_dim", C // NH)
w = L * (C * NH * HD + 2 * C * NKV * HD + NH * HD * C + 3 * C * I) + V * C
print(6 * w + L * 3 * 4 * NH * HD * (seq + 1) / 2)
PY
)
field() { sed -n "s/.*\"$2\": *\([0-9.e+-]*\).*/\1/p" "$1" 2>/dev/null | head -1; }
tg_tps=$(field "$out/bench.json" tokens_per_s)
tg_ms=$(field "$out/bench.json" ms_per_step)
tg_plan=$(field "$out/bench.json" plan_mib)
tg_mem=$(cat "$out/bench_mem_mib.txt" 2>/dev/null)
pt_tps=$(field "$out/torch.json" tokens_per_s)
pt_ms=$(field "$out/torch.json" ms_per_step)
pt_mem=$(field "$out/torch.json" peak_mem_mib)
report() { # name tokens/s ms memory
	awk -v n="$1" -v tps="$2" -v ms="$3" -v mem="$4" -v fpt="$flops_per_token" -v peak="$peak" -v g="$gpu" -v rows=$ROWS -v seq=$SEQ 'BEGIN {
		tf = tps*fpt/1e12
		if (peak > 0) mfu = sprintf("%.1f%% of %d TFLOP/s dense bf16 (%s)", 100*tf/peak, peak, g)
		else mfu = "n/a (GPU not in the peak table)"
		printf "PERF step_%s %.0f tokens/s (%dx%d tokens/step, bf16 mixed precision, no activation checkpointing, %.1f ms/step, %.1f model TFLOP/s at %.4g FLOP/token, MFU %s, peak memory %s)\n", n, tps, rows, seq, ms, tf, fpt, mfu, mem }'
}
if [ -n "$tg_tps" ]; then
	report tracegrpo "$tg_tps" "$tg_ms" "${tg_mem:-?} MiB in use on the device, $(printf '%.0f' "${tg_plan:-0}") MiB of it allocated by the backend" | tee -a "$summary"
	awk -v tps="$tg_tps" -v fpt="$flops_per_token" -v peak="$peak" 'BEGIN { if (peak > 0) { m = 100*tps*fpt/1e12/peak; printf "PERF step_mfu %.1f %% target >= 35: %s\n", m, (m >= 35 ? "ok" : "SHORT") } }' | tee -a "$summary"
else
	say "bench tracegrpo: no result (see bench.err)"
fi
if [ -n "$pt_tps" ]; then
	report pytorch "$pt_tps" "$pt_ms" "$(printf '%.0f' "${pt_mem:-0}") MiB (torch.cuda.max_memory_allocated)" | tee -a "$summary"
else
	say "bench pytorch: no result (see torch.err)"
fi
if [ -n "$tg_ms" ] && [ -n "$pt_ms" ]; then
	awk -v a="$tg_ms" -v b="$pt_ms" 'BEGIN { r = a/b; printf "PERF step_vs_pytorch %.2f x PyTorch step time target <= 1.5: %s\n", r, (r <= 1.5 ? "ok" : "SHORT") }' | tee -a "$summary"
fi
if grep -q "ms/step" "$out/profile.txt" 2>/dev/null; then
	say "profile of the step (the ops that take longest; profile.txt has all):"
	awk '/^op +calls/ { on = 1; n = 0; next } on && n < 8 && NF >= 4 { print "  " $0; n++ }' "$out/profile.txt" | tee -a "$summary"
fi

# 9. compute-sanitizer over the conformance suite (reduced shapes). [25 + 25 s]
san=$(command -v compute-sanitizer || ls /usr/local/cuda*/bin/compute-sanitizer \
	/opt/*/.venv/lib/python3*/site-packages/nvidia/*/compute-sanitizer*/compute-sanitizer \
	/usr/local/lib/python3*/*-packages/nvidia/*/compute-sanitizer*/compute-sanitizer \
	/usr/local/lib/python3*/*-packages/nvidia/*/bin/compute-sanitizer 2>/dev/null | head -1)
if [ -n "$san" ]; then
	for tool in memcheck racecheck; do
		filter='^TestConformanceGPU$'
		[ $tool = racecheck ] && filter='^TestConformanceGPU$/^(AttentionBF16|SampleTokens|RMSNormBF16Fused|TokenLogprobBF16)$'
		(cd "$root/kernels/cuda" && TRACEGRPO_CONFORMANCE_REDUCED=1 timeout 25 "$san" --tool $tool --error-exitcode 99 \
			"$bin/cuda.test" -test.run "$filter" -test.v -test.count=1) >"$out/$tool.txt" 2>&1
		rc=$?
		if [ $rc -eq 0 ]; then
			say "PASS: compute-sanitizer $tool ($(grep -c -- '--- PASS' "$out/$tool.txt") tests; $(grep -o 'ERROR SUMMARY: [0-9]* error' "$out/$tool.txt" | tail -1))"
		elif [ $rc -eq 124 ]; then
			say "PARTIAL: compute-sanitizer $tool timed out after 25 s ($(grep -c -- '--- PASS' "$out/$tool.txt") subtests passed, $(grep -c '========= ' "$out/$tool.txt") sanitizer report lines; see $tool.txt)"
		else
			say "FAIL: compute-sanitizer $tool exited $rc (see $tool.txt)"
			status=1
		fi
	done
else
	say "NOT RUN: compute-sanitizer (not found on PATH, in /usr/local/cuda*/bin or a pip wheel)"
fi
say "wall time: $(($(date +%s) - start)) s"
exit $status
