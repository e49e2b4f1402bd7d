#!/usr/bin/env bash
# gpu-check.sh: everything a GPU machine should check and measure of the CUDA
# backend, in one command that gets one try: a device is lent for minutes,
# start-up included, and has no Go. So nothing is built there, the parts
# run in order of what matters, each under a time limit, and every result is
# written to OUTDIR as it comes (a run cut short still returns the stages
# that finished).
#
#   scripts/gpu-check.sh --build       here (Go, gcc; no GPU): builds stripped
#                                      (-s -w) test binaries and train into
#                                      bin/gpu-check, prints the size to carry,
#                                      fails above 48 MiB (make gpu-check-build)
#   scripts/gpu-check.sh OUTDIR        on the GPU machine, from the repository
#                                      root, with bin/gpu-check carried there
#   scripts/gpu-check.sh --dry OUTDIR  here: the same run end to end on the CPU
#                                      emulator of kernels/cuda's tests
#                                      (make gpu-check-dry builds it first)
#
# Stages, each with a budget of device seconds that the time limits of its
# parts add up to (a dry run multiplies the limits by GPU_CHECK_DRY_SCALE,
# default 12: the emulator is that much slower, and more):
#
#   1 preflight    30 s  the driver's version (nvidia-smi), the libraries the
#                        backend chose (every path, and what it passed over),
#                        the device; then the mma.sync layout test alone,
#                        which also fills the driver's JIT cache for the rest.
#                        Without a driver or cuBLAS nothing else runs.
#   2 correctness 240 s  the conformance subset of bf16 attention, token
#                        logprobs and sampling (full shapes, CUDA vs CPU); the
#                        mma layout again, the fp32 and bf16 tiny-model steps
#                        against the CPU's, the NCCL world-of-one all-reduce,
#                        the sampler, the GEMM modes; compute-sanitizer
#                        memcheck and racecheck on reduced shapes (a sanitizer
#                        run in which no test passed is a failure)
#   3 benchmarks  150 s  one bf16 training step at the Qwen3-1.7B shape
#                        (4 × 4096 tokens) and its MFU, the same step in
#                        PyTorch and the ratio, the sampler's tokens/s
#
# 30 + 240 + 150 = 420 s: the script refuses to start if the budgets add up to
# more than 7 minutes. GPU_CHECK_EXTRA=1 adds a fourth stage outside that
# budget (every conformance case and shape, the op-level measurements, the
# per-op profile of the step, optim's AdamW goldens, NCCL with two ranks), and
# GPU_CHECK_LOOP=1 a fifth (scripts/gpu-check-loop.sh: transformers loads the
# weights directory a CUDA run publishes with --weights-out; loop.log).
#
# OUTDIR gets at most 6 files (the device tool returns 8), each appended to as
# the run goes:
#   summary.txt      one line per result: PASS / FAIL / PARTIAL / NOT RUN with
#                    what, every PERF line, each stage's time against its budget
#   preflight.log    nvidia-smi, the libraries and device, the mma layout test
#   correctness.log  the tests' -test.v output
#   sanitizer.log    compute-sanitizer's output
#   bench.log        the benchmarks' JSON lines and stderr
#   extra.log        GPU_CHECK_EXTRA's stage
# The exit status is 0 only when every correctness part passed (performance
# targets are reported, not enforced).
set -u -o pipefail

root=$(cd "$(dirname "$0")/.." && pwd)
bin=$root/bin/gpu-check
maxCarryMiB=48

if [ "${1:-}" = "--build" ]; then
	set -e
	mkdir -p "$bin"
	cd "$root"
	ld="-s -w" # stripped: the carry is what travels to the device
	go test -c -ldflags "$ld" -o "$bin/cuda.test" ./kernels/cuda
	go test -c -ldflags "$ld" -o "$bin/optim.test" ./optim
	go build -ldflags "$ld" -o "$bin/train" ./cmd/train
	size=$(du -cb "$bin/cuda.test" "$bin/optim.test" "$bin/train" | tail -1 | cut -f1)
	mib=$(awk -v b="$size" 'BEGIN { printf "%.1f", b / 1048576 }')
	echo "built bin/gpu-check/{cuda.test,optim.test,train}: $mib MiB to carry (limit $maxCarryMiB MiB)"
	if [ "$size" -gt $((maxCarryMiB << 20)) ]; then
		echo "gpu-check: the carry is $mib MiB, over the $maxCarryMiB MiB limit" >&2
		exit 1
	fi
	exit 0
fi

dry=0
if [ "${1:-}" = "--dry" ]; then
	dry=1
	shift
fi
if [ $# -ne 1 ]; then
	echo "usage: $0 OUTDIR  (on the GPU machine) | $0 --dry OUTDIR (here, on the emulator) | $0 --build (here, first)" >&2
	exit 2
fi
mkdir -p "$1" || exit 2
out=$(cd "$1" && pwd)
summary=$out/summary.txt
: >"$summary"
work=$(mktemp -d)
trap 'rm -rf "$work"' EXIT
status=0
say() { echo "$*" | tee -a "$summary"; }
fail() { say "FAIL: $*"; status=1; }

# The time limits of the parts (device seconds), and so the budget of each
# stage: at most 30 s, 4 minutes and 7 minutes in all, or nothing runs.
lim_smi=5 lim_first=25                       # preflight: nvidia-smi; libraries, device, mma layout
lim_conf=70 lim_tests=60 lim_san=55          # correctness: conformance subset; steps etc.; each sanitizer tool
lim_step=70 lim_torch=50 lim_sampler=30      # benchmarks: tracegrpo's step; PyTorch's; the sampler
budget_preflight=$((lim_smi + lim_first))
budget_correctness=$((lim_conf + lim_tests + 2 * lim_san))
budget_bench=$((lim_step + lim_torch + lim_sampler))
total=$((budget_preflight + budget_correctness + budget_bench))
if [ $budget_preflight -gt 30 ] || [ $budget_correctness -gt 240 ] || [ $total -gt 420 ]; then
	say "FAIL: the budgets (preflight $budget_preflight s, correctness $budget_correctness s, in all $total s) exceed 30 s, 240 s or 7 minutes"
	exit 2
fi
say "budgets: preflight $budget_preflight s, correctness $budget_correctness s, benchmarks $budget_bench s: $total s of the 420 s allowed"

for f in cuda.test optim.test train; do
	if [ ! -x "$bin/$f" ]; then
		say "FAIL: $bin/$f missing: run make gpu-check-build on the development machine and carry bin/gpu-check"
		exit 1
	fi
done

cfg=$root/model/testdata/published/qwen3-1.7b.config.json
ROWS=4 SEQ=4096
py=${GPU_CHECK_PYTHON:-python3}
scale=1
if [ $dry = 1 ]; then
	scale=${GPU_CHECK_DRY_SCALE:-12}
	emu=$root/bin/gpu-check-emu
	export TRACEGRPO_CUDA_DRIVER=${TRACEGRPO_CUDA_DRIVER:-$emu/libfakecuda.so}
	export TRACEGRPO_CUDA_BLAS=${TRACEGRPO_CUDA_BLAS:-$emu/libfakecublas.so}
	export TRACEGRPO_NCCL_LIB=${TRACEGRPO_NCCL_LIB:-$emu/libfakenccl.so}
	export TRACEGRPO_CONFORMANCE_REDUCED=1 TRACEGRPO_PERF_SHAPES=tiny
	cfg=$root/model/testdata/qwen3_tied/config.json
	ROWS=2 SEQ=32
	say "dry run on the emulator ($TRACEGRPO_CUDA_DRIVER): reduced conformance shapes, tiny benchmarks, no nvidia-smi, the sanitizer parts without compute-sanitizer; limits ×$scale"
fi
export TRACEGRPO_REQUIRE_GPU=1
# The driver's JIT cache (the PTX compiled for the device once, in preflight).
export CUDA_CACHE_MAXSIZE=1073741824
start=$(date +%s)

# part LOG LIMIT CMD...: runs CMD under LIMIT device seconds (×scale), its
# output appended to LOG as it comes and kept in $work/part for the checks;
# sets rc (124 on a timeout) and secs.
part() {
	local log=$1 limit=$(($2 * scale))
	shift 2
	local t0=$(date +%s)
	echo "=== $(date -u +%H:%M:%S) [limit ${limit} s] $*" >>"$out/$log"
	timeout -k 5 "$limit" "$@" 2>&1 | tee -a "$out/$log" >"$work/part"
	rc=${PIPESTATUS[0]}
	secs=$(($(date +%s) - t0))
	echo "=== exit $rc after $secs s" >>"$out/$log"
}

# gotests LOG LIMIT FILTER NAMES...: the cuda test binary, in its package
# folder (it reads csrc/ and model/testdata), with -test.run FILTER; each of
# NAMES (a test or test/subtest) must have passed.
gotests() {
	local log=$1 limit=$2 filter=$3
	shift 3
	part "$log" "$limit" bash -c 'cd "$0/kernels/cuda" && exec "$1" -test.run "$2" -test.v -test.count=1' "$root" "$bin/cuda.test" "$filter"
	local t
	for t in "$@"; do
		if grep -q -- "--- PASS: $t " "$work/part"; then
			say "PASS: $t"
		elif grep -q -- "--- FAIL: $t " "$work/part"; then
			fail "$t (see $log)"
		else
			fail "$t did not finish (exit $rc after $secs s; see $log)"
		fi
	done
	[ $rc = 0 ] || [ $rc = 1 ] || fail "cuda.test -test.run '$filter' exited $rc after $secs s (124: its limit)"
}

stage() { # NAME BUDGET T0: the stage's time against its budget
	local took=$(($(date +%s) - $3))
	say "stage $1: $took s (budget $2 s$([ $dry = 1 ] && echo " ×$scale on the emulator"))"
}

# ---- 1. preflight [30 s] ---------------------------------------------------
t0=$(date +%s)
if [ $dry = 1 ]; then
	say "NOT RUN: nvidia-smi (dry run)"
else
	part preflight.log $lim_smi nvidia-smi --query-gpu=name,driver_version,memory.total,compute_cap,clocks.max.sm --format=csv
	say "gpu: $(sed -n 2p "$work/part")"
fi
# TestLibrariesGPU: driver, cuBLAS (and cuBLASLt), NCCL, each path chosen and
# each passed over; TestMMALayoutGPU prints the device and opens the backend,
# so the driver compiles every kernel's PTX for it (into the JIT cache).
gotests preflight.log $lim_first '^(TestLibrariesGPU|TestMMALayoutGPU)$' TestLibrariesGPU TestMMALayoutGPU
grep -E '^ +[a-z_]+\.go:[0-9]+: (library|device:)|^ +passed over' "$work/part" | sed 's/^ *[a-z_]*\.go:[0-9]*: /  /' | tee -a "$summary"
if grep -q 'no CUDA device' "$work/part" || ! grep -q -- "--- PASS: TestLibrariesGPU \|--- PASS: TestMMALayoutGPU " "$work/part"; then
	stage preflight $budget_preflight "$t0"
	say "preflight failed: no driver, cuBLAS or device (see preflight.log), so nothing else can run"
	exit 1
fi
stage preflight $budget_preflight "$t0"

# ---- 2. correctness [240 s] -------------------------------------------------
t0=$(date +%s)
subset='AttentionBF16|TokenLogprob|TokenLogprobBF16|SampleTokens'
gotests correctness.log $lim_conf "^TestConformanceGPU\$/^($subset)\$" \
	TestConformanceGPU/AttentionBF16 TestConformanceGPU/TokenLogprob TestConformanceGPU/TokenLogprobBF16 TestConformanceGPU/SampleTokens
gotests correctness.log $lim_tests '^(TestMMALayoutGPU|TestTinyStepBF16GPU|TestTinyStepGPU|TestTinyStepNCCLGPU|TestSamplerGPU|TestMatmulModesGPU)$' \
	TestMMALayoutGPU TestTinyStepBF16GPU TestTinyStepGPU TestTinyStepNCCLGPU TestSamplerGPU TestMatmulModesGPU
grep -E 'device: |loss cpu|bf16 step |tiny-model step gradients' "$work/part" | sed 's/^ *[a-z_]*\.go:[0-9]*: /  /' | tee -a "$summary"

# compute-sanitizer on the reduced shapes of the kernels with shared memory
# and tensor cores. A run in which no test passed is a failure: the
# sanitizer can refuse a device and still exit 0.
san=$(command -v compute-sanitizer || ls /usr/local/cuda/bin/compute-sanitizer /usr/local/cuda-*/bin/compute-sanitizer \
	/usr/local/cuda*/compute-sanitizer/compute-sanitizer /opt/*/.venv/lib/python3*/site-packages/nvidia/cu13/bin/compute-sanitizer \
	/usr/local/lib/python3*/*-packages/nvidia/cu13/bin/compute-sanitizer 2>/dev/null | head -1)
sanset='AttentionBF16|TokenLogprobBF16|SampleTokens|RMSNormBF16Fused'
for tool in memcheck racecheck; do
	if [ $dry = 1 ]; then
		runner=()
		what="$tool (dry run: the same tests without compute-sanitizer)"
	elif [ -n "$san" ]; then
		runner=("$san" --tool "$tool" --error-exitcode 99)
		what="compute-sanitizer $tool"
	else
		fail "compute-sanitizer $tool: no compute-sanitizer on PATH, in /usr/local/cuda*/bin or a pip wheel"
		continue
	fi
	part sanitizer.log $lim_san env TRACEGRPO_CONFORMANCE_REDUCED=1 bash -c 'cd "$0/kernels/cuda" && exec "$@"' "$root" \
		"${runner[@]}" "$bin/cuda.test" -test.run "^TestConformanceGPU\$/^($sanset)\$" -test.v -test.count=1
	passed=$(grep -c -- '    --- PASS: TestConformanceGPU/' "$work/part")
	failed=$(grep -c -- '    --- FAIL: TestConformanceGPU/' "$work/part")
	errs=$(grep -o 'ERROR SUMMARY: [0-9]* error' "$work/part" | tail -1)
	if [ "$passed" = 0 ]; then
		fail "$what: no test passed (exit $rc after $secs s; see sanitizer.log)"
	elif [ $rc = 0 ] && [ "$failed" = 0 ]; then
		say "PASS: $what ($passed of 4 conformance cases${errs:+; $errs})"
	elif [ $rc = 124 ] && [ "$failed" = 0 ] && ! grep -q '^=========' "$work/part"; then
		say "PARTIAL: $what reached its limit of $((lim_san * scale)) s after $passed of 4 cases passed, with no report"
	else
		fail "$what exited $rc: $passed passed, $failed failed${errs:+, $errs} (see sanitizer.log)"
	fi
done
stage correctness $budget_correctness "$t0"

# ---- 3. benchmarks [150 s] --------------------------------------------------
t0=$(date +%s)
# One training step, bf16 mixed precision: tracegrpo, with the device's
# memory in use sampled meanwhile (its context and cuBLAS workspace
# included; plan_mib is what the backend itself allocated).
memwatch() { # FILE: the largest nvidia-smi memory.used (MiB) until killed
	local max=0 m
	while :; do
		m=$(nvidia-smi --query-gpu=memory.used --format=csv,noheader,nounits 2>/dev/null | head -1)
		[ -n "$m" ] && [ "$m" -gt "$max" ] 2>/dev/null && max=$m && echo "$max" >"$1"
		sleep 0.5
	done
}
mw=""
if [ $dry != 1 ]; then
	memwatch "$work/mem_mib" &
	mw=$!
fi
part bench.log $lim_step "$bin/train" bench --backend cuda --model "$cfg" --rows $ROWS --seq $SEQ --steps 2 --precision bfloat16
grep '^{' "$work/part" | tail -1 >"$work/bench.json"
if [ -n "$mw" ]; then
	kill "$mw" 2>/dev/null
	wait "$mw" 2>/dev/null
fi
[ -s "$work/bench.json" ] || say "NOT RUN: tracegrpo's bf16 step benchmark did not finish (exit $rc after $secs s; see bench.log)"
torchdev=cuda
[ $dry = 1 ] && torchdev=cpu
part bench.log $lim_torch "$py" "$root/scripts/bench_torch_gpu.py" --config "$cfg" --rows $ROWS --seq $SEQ --steps 2 --device $torchdev
grep '^{' "$work/part" | tail -1 >"$work/torch.json"
[ -s "$work/torch.json" ] || say "NOT RUN: the PyTorch step did not finish (exit $rc after $secs s; see bench.log)"
part bench.log $lim_sampler bash -c 'cd "$0/kernels/cuda" && TRACEGRPO_PERF=1 TRACEGRPO_PERF_MODEL="$2" exec "$1" -test.run "^TestSamplerThroughputGPU\$" -test.v -test.count=1' \
	"$root" "$bin/cuda.test" "$cfg"
grep -o 'PERF .*' "$work/part" | tee -a "$summary"
grep -q 'PERF sampler' "$work/part" || say "NOT RUN: the sampler measurement did not finish (exit $rc after $secs s; see bench.log)"

gpu=$(nvidia-smi --query-gpu=name --format=csv,noheader 2>/dev/null | head -1)
# Dense bf16 tensor-core peak (TFLOP/s, no sparsity) by the vendor's datasheets.
peak=$(echo "${gpu:-none}" | awk '
	/H200 NVL/ { print 835; exit } /H200/ { print 989; exit } /H100 NVL/ { print 835; exit }
	/H100 PCIe/ { print 756; exit } /H100/ { print 989; exit } /GH200/ { print 989; exit }
	/A100/ { print 312; exit } { print 0 }')
# Model FLOPs per trained token (forward + backward = 3 × forward): 6 per
# matmul weight (every projection and the LM head) plus causal attention,
# 3 × 4·NH·HD·(SEQ+1)/2 per layer. Recomputation is not counted.
fpt=$("$py" - "$cfg" $SEQ <<'PY'
import json, sys
c = json.load(open(sys.argv[1])); seq = int(sys.argv[2])
C, I, L, NH, NKV, V = c["hidden_size"], c["intermediate_size"], c["num_hidden_layers"], c["num_attention_heads"], c["num_key_value_heads"], c["vocab_size"]
HD = c.get("head_dim", C // NH)
w = L * (C * NH * HD + 2 * C * NKV * HD + NH * HD * C + 3 * C * I) + V * C
print(6 * w + L * 3 * 4 * NH * HD * (seq + 1) / 2)
PY
)
field() { sed -n "s/.*\"$2\": *\([0-9.e+-]*\).*/\1/p" "$1" 2>/dev/null | head -1; }
tg_tps=$(field "$work/bench.json" tokens_per_s) tg_ms=$(field "$work/bench.json" ms_per_step) tg_plan=$(field "$work/bench.json" plan_mib)
pt_tps=$(field "$work/torch.json" tokens_per_s) pt_ms=$(field "$work/torch.json" ms_per_step) pt_mem=$(field "$work/torch.json" peak_mem_mib)
report() { # NAME TOKENS/S MS MEMORY
	awk -v n="$1" -v tps="$2" -v ms="$3" -v mem="$4" -v fpt="$fpt" -v peak="$peak" -v g="${gpu:-the emulator}" -v rows=$ROWS -v seq=$SEQ 'BEGIN {
		tf = tps*fpt/1e12
		if (peak > 0) mfu = sprintf("%.1f%% of %d TFLOP/s dense bf16 (%s)", 100*tf/peak, peak, g)
		else mfu = "n/a (" g " is not in the peak table)"
		printf "PERF step_%s %.0f tokens/s (%dx%d tokens/step, bf16 mixed precision, %.1f ms/step, %.3g model TFLOP/s at %.4g FLOP/token, MFU %s, peak memory %s)\n", n, tps, rows, seq, ms, tf, fpt, mfu, mem }'
}
if [ -n "$tg_tps" ]; then
	report tracegrpo "$tg_tps" "$tg_ms" "$(cat "$work/mem_mib" 2>/dev/null || echo '?') MiB in use on the device, $(printf '%.0f' "${tg_plan:-0}") MiB of it the backend's" | tee -a "$summary"
	awk -v tps="$tg_tps" -v fpt="$fpt" -v peak="$peak" 'BEGIN { if (peak > 0) { m = 100*tps*fpt/1e12/peak; printf "PERF step_mfu %.1f %% target >= 35: %s\n", m, (m >= 35 ? "ok" : "SHORT") } }' | tee -a "$summary"
fi
[ -n "$pt_tps" ] && report pytorch "$pt_tps" "$pt_ms" "$(printf '%.0f' "${pt_mem:-0}") MiB (torch.cuda.max_memory_allocated)" | tee -a "$summary"
if [ -n "$tg_ms" ] && [ -n "$pt_ms" ]; then
	awk -v a="$tg_ms" -v b="$pt_ms" 'BEGIN { r = a/b; printf "PERF step_vs_pytorch %.2f x PyTorch step time target <= 1.5: %s\n", r, (r <= 1.5 ? "ok" : "SHORT") }' | tee -a "$summary"
fi
stage benchmarks $budget_bench "$t0"
say "total: $(($(date +%s) - start)) s (budgets: $total s$([ $dry = 1 ] && echo " ×$scale on the emulator"))"

# ---- 4. extra, GPU_CHECK_EXTRA=1 (outside the 7-minute budget) --------------
if [ "${GPU_CHECK_EXTRA:-0}" = 1 ]; then
	t0=$(date +%s)
	gotests extra.log 90 '^TestConformanceGPU$' TestConformanceGPU
	part extra.log 50 bash -c 'cd "$0/kernels/cuda" && TRACEGRPO_PERF=1 exec "$1" -test.run "^TestPerfGPU\$" -test.v -test.count=1' "$root" "$bin/cuda.test"
	grep -o 'PERF .*' "$work/part" | tee -a "$summary"
	part extra.log 50 "$bin/train" bench --backend cuda --model "$cfg" --rows $ROWS --seq $SEQ --steps 1 --precision bfloat16 --profile
	say "profile of the step (the ops that take longest; extra.log has all):"
	awk '/^op +calls/ { on = 1; n = 0; next } on && n < 8 && NF >= 4 { print "  " $0; n++ }' "$work/part" | tee -a "$summary"
	part extra.log 15 bash -c 'cd "$0/optim" && exec "$1" -test.run AdamWGolden -test.v -test.count=1' "$root" "$bin/optim.test"
	if grep -q -- "--- PASS: TestAdamWGolden" "$work/part"; then say "PASS: optim TestAdamWGolden (cpu and cuda)"; else fail "optim TestAdamWGolden (see extra.log)"; fi
	# NCCL across processes: two ranks on the one GPU (each its own NCCL host
	# id, over loopback), launched by torchrun, against one process.
	if command -v torchrun >/dev/null 2>&1 && [ $dry != 1 ]; then
		args=(--backend cuda --device 0 --quiet --steps 3 --set grpo.num_prompts_per_step=4 --set grpo.num_generations_per_prompt=4
			--set checkpointing.save_period=1 --set policy.megatron_cfg.optimizer.adam_eps=1e-4)
		part extra.log 25 "$bin/train" --out "$work/nccl-one" "${args[@]}"
		NCCL_SOCKET_IFNAME=lo part extra.log 40 torchrun --standalone --nproc-per-node 2 --no-python \
			bash -c 'NCCL_HOSTID=tracegrpo-rank$LOCAL_RANK exec "$0" "$@"' "$bin/train" --out "$work/nccl-two" --dist nccl "${args[@]}"
		if [ -s "$work/nccl-two/metrics.jsonl" ] && cmp -s <(grep -o '"reward_mean":[^,]*' "$work/nccl-one/metrics.jsonl") \
			<(grep -o '"reward_mean":[^,]*' "$work/nccl-two/metrics.jsonl"); then
			say "PASS: NCCL, 2 ranks on one GPU (torchrun): the same rewards as one process"
		else
			fail "NCCL, 2 ranks on one GPU (see extra.log)"
		fi
	else
		say "NOT RUN: NCCL with 2 ranks (no torchrun, or a dry run)"
	fi
	say "stage extra: $(($(date +%s) - t0)) s (outside the 7-minute budget)"
fi

# ---- 5. loop, GPU_CHECK_LOOP=1 (outside the budget): scripts/gpu-check-loop.sh
# (transformers loads the weights a CUDA run publishes for its generator; loop.log)
if [ "${GPU_CHECK_LOOP:-0}" = 1 ]; then
	t0=$(date +%s)
	"$root/scripts/gpu-check-loop.sh" $([ $dry = 1 ] && echo --dry) "$out" "$bin/train" | tee -a "$summary"
	[ "${PIPESTATUS[0]}" = 0 ] || status=1
	say "stage loop: $(($(date +%s) - t0)) s (outside the 7-minute budget)"
fi
exit $status
