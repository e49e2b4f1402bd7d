#!/usr/bin/env bash
# gpu-check.sh: everything a GPU machine should check and measure of the CUDA
# backend, in stages that fit one lease: a device is lent for 15 minutes in
# all, its start-up (a minute or two each call) and every call included, and
# has no Go. So nothing is built there, the stages run in order of what
# matters, each part under a time limit, every result is written to OUTDIR
# as it comes (a run cut short still returns the stages that finished), and
# a stage that failed can be rerun alone (GPU_CHECK_STAGES) in what is left.
#
#   scripts/gpu-check.sh --build       here (Go, gcc; no GPU): builds the
#                                      binaries (-trimpath, stripped,
#                                      gzipped) into bin/gpu-check, and fails
#                                      when what the device transfer sends
#                                      would exceed 56 MiB (make
#                                      gpu-check-build; --size says why)
#   scripts/gpu-check.sh --size        here: that measure alone: the tracked
#                                      files and the untracked ones git does
#                                      not ignore, an ignored shared/, and the
#                                      carry, bin/gpu-check
#   scripts/gpu-check.sh --plan        the stages GPU_CHECK_STAGES chooses,
#                                      their limits, and the lease they fit
#   scripts/gpu-check.sh OUTDIR        on the GPU machine, from the repository
#                                      root, with bin/gpu-check carried there
#   scripts/gpu-check.sh --dry OUTDIR  here: the same run end to end on the CPU
#                                      emulator of kernels/cuda's tests
#                                      (make gpu-check-dry builds it first)
#
# Stages (GPU_CHECK_STAGES, comma-separated, in this order whatever the
# order given; default preflight,correct,sanitize,bench), each with a budget
# of device seconds that the time limits of its parts add up to (a dry run
# multiplies the limits by GPU_CHECK_DRY_SCALE, default 12: the emulator is
# that much slower, and more):
#
#   preflight  30 s  the driver's version (nvidia-smi), the libraries the
#                    backend chose (every path, and what it passed over), the
#                    device, how each kernel file loaded (the sm_90 cubins on
#                    CC 9.0: nothing to JIT); the mma.sync layout test.
#                    Without a driver or cuBLAS nothing else runs.
#   correct   130 s  the conformance subset of bf16 attention, token logprobs
#                    and sampling (full shapes, CUDA vs CPU); the mma layout
#                    again, the fp32 and bf16 tiny-model steps against the
#                    CPU's, the NCCL world-of-one all-reduce, the sampler, the
#                    GEMM modes
#   sanitize  110 s  compute-sanitizer memcheck and racecheck on reduced
#                    shapes, the backend loading only the kernel files their
#                    cases launch (TRACEGRPO_CUDA_LOAD=lazy); a sanitizer run
#                    in which no test passed is a failure
#   bench     150 s  one bf16 training step at the Qwen3-1.7B shape (4 × 4096
#                    tokens, weights drawn on all cores) and its MFU, then one
#                    step timed launch by launch beside the roofline's
#                    prediction of each (kernels/cuda/gpumodel: predicted
#                    against measured per op); the same step in PyTorch and
#                    the ratio; the sampler's tokens/s
#   extra     240 s  every conformance case and shape, the op-level
#                    measurements, the per-op profile of the step, optim's
#                    AdamW goldens, NCCL with two ranks (also GPU_CHECK_EXTRA=1)
#   loop      195 s  scripts/gpu-check-loop.sh: transformers loads the weights
#                    directory a CUDA run publishes with --weights-out
#                    (also GPU_CHECK_LOOP=1)
#
# The lease: one call's stages may add up to 7 minutes (the default four do:
# 30 + 130 + 110 + 150 = 420 s), and every stage fits a second call on a
# fresh machine in what the first leaves: 900 s − 2 × 120 s of start-up −
# 420 s = 240 s. The script refuses a choice over 420 s, and --plan prints
# the schedule (make gpu-check-dry shows it with each stage's time).
#
# OUTDIR gets at most 8 files (the device tool returns 8), each appended to as
# the run goes:
#   summary.txt   one line per result: PASS / FAIL / PARTIAL / NOT RUN with
#                 what, every PERF line, predicted against measured per op
#   stages.txt    one line per stage as it finishes: name, result, seconds,
#                 budget (a rerun of GPU_CHECK_STAGES=NAME replaces nothing:
#                 OUTDIR is the call's own)
#   preflight.log, correct.log, sanitize.log, bench.log, extra.log, loop.log:
#                 each stage's output
# The exit status is 0 only when every correctness part of the chosen stages
# passed (performance targets are reported, not enforced); 2 for a usage
# error or a refused plan.
set -u -o pipefail

root=$(cd "$(dirname "$0")/.." && pwd)
bin=$root/bin/gpu-check
maxMiB=${GPU_CHECK_MAX_MIB:-56}

# The stages, their order and budgets (device seconds).
allStages="preflight correct sanitize bench extra loop"
lim_smi=5 lim_first=25                 # preflight: nvidia-smi; libraries, device, mma layout
lim_conf=70 lim_tests=60               # correct: conformance subset; steps etc.
lim_san=55                             # sanitize: each of memcheck and racecheck
lim_step=70 lim_torch=50 lim_sampler=30 # bench: tracegrpo's step (and its ledger); PyTorch's; the sampler
lim_xconf=90 lim_xperf=40 lim_xprof=40 lim_xadam=15 lim_xnccl1=20 lim_xnccl2=35 # extra
lim_loop_train=45 lim_loop_score=30 lim_loop_hf=120 # loop (scripts/gpu-check-loop.sh reads them)
budget() {
	case $1 in
	preflight) echo $((lim_smi + lim_first)) ;;
	correct) echo $((lim_conf + lim_tests)) ;;
	sanitize) echo $((2 * lim_san)) ;;
	bench) echo $((lim_step + lim_torch + lim_sampler)) ;;
	extra) echo $((lim_xconf + lim_xperf + lim_xprof + lim_xadam + lim_xnccl1 + lim_xnccl2)) ;;
	loop) echo $((lim_loop_train + lim_loop_score + lim_loop_hf)) ;;
	esac
}
# The lease (/work/.library/device/README.md): 15 minutes of device time,
# start-up of each call included.
lease=900 startup=120 callMax=420
secondMax=$((lease - 2 * startup - callMax))

# The chosen stages, in the stages' order.
want=${GPU_CHECK_STAGES:-preflight,correct,sanitize,bench}
[ "${GPU_CHECK_EXTRA:-0}" = 1 ] && want=$want,extra
[ "${GPU_CHECK_LOOP:-0}" = 1 ] && want=$want,loop
stages=""
for s in ${want//,/ }; do
	case " $allStages " in
	*" $s "*) ;;
	*)
		echo "gpu-check: GPU_CHECK_STAGES names stage '$s'; the stages are: ${allStages// /, }" >&2
		exit 2
		;;
	esac
done
for s in $allStages; do
	case ",$want," in *",$s,"*) stages="$stages $s" ;; esac
done
stages=${stages# }
if [ -z "$stages" ]; then
	echo "gpu-check: GPU_CHECK_STAGES='$want' chooses no stage; the stages are: ${allStages// /, }" >&2
	exit 2
fi
chosen() { case " $stages " in *" $1 "*) return 0 ;; esac; return 1; }
total=0
for s in $stages; do total=$((total + $(budget "$s"))); done

# plan: the schedule of the chosen stages and of the lease; fails when they
# cannot run in one call, or a stage could not be rerun in a second one.
plan() {
	local s b ok=0
	for s in $allStages; do
		b=$(budget "$s")
		printf '  %-9s %4d s%s\n' "$s" "$b" "$(chosen "$s" && echo '  (chosen)')"
		if [ "$b" -gt "$secondMax" ]; then
			echo "  stage $s's $b s do not fit a second call ($secondMax s left of the lease after the first)"
			ok=1
		fi
	done
	echo "chosen: $stages: $total s of the $callMax s one call may take"
	echo "lease: $lease s of device time: $startup s to start a machine, $callMax s for the first call, $startup s to start again, $secondMax s for a stage rerun alone"
	if [ "$total" -gt "$callMax" ]; then
		echo "refused: the chosen stages' limits add up to $total s, over the $callMax s of one call"
		ok=2
	fi
	return $ok
}

# transfer_bytes: what the device transfer sends of this checkout, as it
# counts it: the tracked files and the untracked ones git does not ignore (as
# they are in the working tree now), an ignored shared/ (it travels), and
# the carry, bin/gpu-check.
transfer_bytes() {
	local t s c
	t=$(cd "$root" && git ls-files -z --cached --others --exclude-standard | xargs -0 -r stat -c %s -- 2>/dev/null | awk '{ s += $1 } END { print s + 0 }')
	s=0
	if [ -d "$root/shared" ] && (cd "$root" && git check-ignore -q shared); then
		s=$(du -sb "$root/shared" | cut -f1)
	fi
	c=0
	[ -e "$bin" ] && c=$(du -sb "$bin" | cut -f1)
	echo "$t $s $c"
}
mib() { awk -v b="$1" 'BEGIN { printf "%.1f", b / 1048576 }'; }

# size: prints the transfer's parts, fails above maxMiB.
size() {
	local t s c sum
	read -r t s c < <(transfer_bytes)
	sum=$((t + s + c))
	echo "transfer: $(mib "$sum") MiB = tree $(mib "$t") MiB (tracked and untracked-not-ignored files)$([ "$s" -gt 0 ] && echo " + shared/ $(mib "$s") MiB") + carry bin/gpu-check $(mib "$c") MiB; limit $maxMiB MiB (the device refuses over 64)"
	if [ "$sum" -gt $((maxMiB << 20)) ]; then
		echo "gpu-check: the transfer would be $(mib "$sum") MiB, over the $maxMiB MiB limit: shrink the carry or the tree (git ls-files | xargs du -b | sort -n | tail shows the largest tracked files)" >&2
		return 1
	fi
}

case "${1:-}" in
--size)
	size
	exit
	;;
--plan)
	plan
	exit
	;;
--build)
	set -e
	rm -rf "$bin"
	mkdir -p "$bin"
	cd "$root"
	# -trimpath: no paths of this machine in the binaries; -s -w: stripped;
	# gzip: the binaries are a third of it (the embedded PTX compresses
	# well), and every machine has gunzip. The core stages need cuda.test
	# and train; optim.test only the extra stage (GPU_CHECK_EXTRA=1 here).
	flags=(-trimpath -ldflags "-s -w")
	go test -c "${flags[@]}" -o "$bin/cuda.test" ./kernels/cuda
	go build "${flags[@]}" -o "$bin/train" ./cmd/train
	built="cuda.test train"
	if [ "${GPU_CHECK_EXTRA:-0}" = 1 ]; then
		go test -c "${flags[@]}" -o "$bin/optim.test" ./optim
		built="$built optim.test"
	fi
	for f in $built; do gzip -9 -n "$bin/$f"; done
	echo "built bin/gpu-check/{${built// /,}}.gz: carry bin/gpu-check (its binaries are unpacked on the device)"
	set +e
	size
	exit
	;;
esac

dry=0
if [ "${1:-}" = "--dry" ]; then
	dry=1
	shift
fi
if [ $# -ne 1 ]; then
	echo "usage: $0 OUTDIR  (on the GPU machine) | $0 --dry OUTDIR (here, on the emulator) | $0 --build | --size | --plan (here)" >&2
	exit 2
fi
mkdir -p "$1" || exit 2
out=$(cd "$1" && pwd)
summary=$out/summary.txt
: >"$summary"
: >"$out/stages.txt"
work=$(mktemp -d)
trap 'rm -rf "$work"' EXIT
status=0
say() { echo "$*" | tee -a "$summary"; }
fail() { say "FAIL: $*"; status=1; }

if ! plan >"$work/plan"; then
	cat "$work/plan" | tee -a "$summary"
	grep -q '^refused' "$work/plan" && exit 2
fi
say "stages: $stages: $total s of the $callMax s one call may take (GPU_CHECK_STAGES; make gpu-check-dry shows the lease)"

# The binaries: gunzipped from the carry (make gpu-check-build), or as they
# are (an older build, or a test's stand-ins).
mkdir -p "$work/bin"
need="cuda.test train"
chosen extra && need="$need optim.test"
for f in $need; do
	if [ -f "$bin/$f.gz" ]; then
		gunzip -c "$bin/$f.gz" >"$work/bin/$f" && chmod +x "$work/bin/$f"
	elif [ -x "$bin/$f" ]; then
		ln -s "$bin/$f" "$work/bin/$f"
	else
		say "FAIL: $bin/$f.gz missing: run make gpu-check-build$([ "$f" = optim.test ] && echo " GPU_CHECK_EXTRA=1") on the development machine and carry bin/gpu-check"
		exit 1
	fi
done
bin=$work/bin

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
# The driver's JIT cache, in the run's directory (bin/, which git ignores
# and a warm machine keeps between calls; not the carry, which each call
# replaces): only PTX is compiled there, for a device other than CC 9.0 or a
# cubin it refused.
export CUDA_CACHE_PATH=${CUDA_CACHE_PATH:-$root/bin/gpu-check-cache} CUDA_CACHE_MAXSIZE=1073741824
mkdir -p "$CUDA_CACHE_PATH"
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

# begin NAME / end NAME: a stage's time and result, written to stages.txt
# (and the summary) as it finishes.
begin() {
	t0=$(date +%s)
	st0=$status
	status=0
}
end() {
	local took=$(($(date +%s) - t0)) res=PASS
	[ $status = 0 ] || res=FAIL
	[ "${2:-}" = "" ] || res=$2
	echo "$1 $res $took s, budget $(budget "$1") s$([ $dry = 1 ] && echo " (×$scale on the emulator)")" >>"$out/stages.txt"
	say "stage $1: $res, $took s (budget $(budget "$1") s$([ $dry = 1 ] && echo " ×$scale on the emulator"))"
	[ $st0 = 0 ] || status=$st0
}

# ---- preflight [30 s] -------------------------------------------------------
if chosen preflight; then
	begin
	if [ $dry = 1 ]; then
		say "NOT RUN: nvidia-smi (dry run)"
	else
		part preflight.log $lim_smi nvidia-smi --query-gpu=name,driver_version,memory.total,compute_cap,clocks.max.sm --format=csv
		say "gpu: $(sed -n 2p "$work/part")"
	fi
	# TestLibrariesGPU: driver, cuBLAS (and cuBLASLt), NCCL, each path chosen
	# and each passed over; TestMMALayoutGPU prints the device and opens the
	# backend, which loads every kernel file (sm_90 cubins on CC 9.0).
	gotests preflight.log $lim_first '^(TestLibrariesGPU|TestMMALayoutGPU)$' TestLibrariesGPU TestMMALayoutGPU
	grep -E '^ +[a-z_]+\.go:[0-9]+: (library|device:|modules:)|^ +passed over' "$work/part" | sed 's/^ *[a-z_]*\.go:[0-9]*: /  /' | tee -a "$summary"
	if grep -q 'no CUDA device' "$work/part" || ! grep -q -- "--- PASS: TestLibrariesGPU \|--- PASS: TestMMALayoutGPU " "$work/part"; then
		status=1
		end preflight
		say "preflight failed: no driver, cuBLAS or device (see preflight.log), so nothing else can run"
		exit 1
	fi
	end preflight
fi

# ---- correct [130 s] --------------------------------------------------------
if chosen correct; then
	begin
	subset='AttentionBF16|TokenLogprob|TokenLogprobBF16|SampleTokens'
	gotests correct.log $lim_conf "^TestConformanceGPU\$/^($subset)\$" \
		TestConformanceGPU/AttentionBF16 TestConformanceGPU/TokenLogprob TestConformanceGPU/TokenLogprobBF16 TestConformanceGPU/SampleTokens
	gotests correct.log $lim_tests '^(TestMMALayoutGPU|TestTinyStepBF16GPU|TestTinyStepGPU|TestTinyStepNCCLGPU|TestSamplerGPU|TestMatmulModesGPU)$' \
		TestMMALayoutGPU TestTinyStepBF16GPU TestTinyStepGPU TestTinyStepNCCLGPU TestSamplerGPU TestMatmulModesGPU
	grep -E 'device: |loss cpu|bf16 step |tiny-model step gradients' "$work/part" | sed 's/^ *[a-z_]*\.go:[0-9]*: /  /' | tee -a "$summary"
	end correct
fi

# ---- sanitize [110 s] -------------------------------------------------------
# compute-sanitizer on the reduced shapes of the kernels with shared memory
# and tensor cores; the backend loads a kernel file at its first launch
# (TRACEGRPO_CUDA_LOAD=lazy), so the sanitizer instruments only the files
# these cases use. A run in which no test passed is a failure: the sanitizer
# can refuse a device and still exit 0.
if chosen sanitize; then
	begin
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
		part sanitize.log $lim_san env TRACEGRPO_CONFORMANCE_REDUCED=1 TRACEGRPO_CUDA_LOAD=lazy bash -c 'cd "$0/kernels/cuda" && exec "$@"' "$root" \
			"${runner[@]}" "$bin/cuda.test" -test.run "^TestConformanceGPU\$/^($sanset)\$" -test.v -test.count=1
		passed=$(grep -c -- '    --- PASS: TestConformanceGPU/' "$work/part")
		failed=$(grep -c -- '    --- FAIL: TestConformanceGPU/' "$work/part")
		errs=$(grep -o 'ERROR SUMMARY: [0-9]* error' "$work/part" | tail -1)
		mods=$(grep -o 'modules: .*' "$work/part" | tail -1)
		if [ "$passed" = 0 ]; then
			fail "$what: no test passed (exit $rc after $secs s; see sanitize.log)"
		elif [ $rc = 0 ] && [ "$failed" = 0 ]; then
			say "PASS: $what ($passed of 4 conformance cases${errs:+; $errs}${mods:+; $mods})"
		elif [ $rc = 124 ] && [ "$failed" = 0 ] && ! grep -q '^=========' "$work/part"; then
			say "PARTIAL: $what reached its limit of $((lim_san * scale)) s after $passed of 4 cases passed, with no report"
		else
			fail "$what exited $rc: $passed passed, $failed failed${errs:+, $errs} (see sanitize.log)"
		fi
	done
	end sanitize
fi

# ---- bench [150 s] ----------------------------------------------------------
if chosen bench; then
	begin
	# One training step, bf16 mixed precision: tracegrpo, with the device's
	# memory in use sampled meanwhile (its context and cuBLAS workspace
	# included; plan_mib is what the backend itself allocated). --ledger: one
	# more step, each launch timed between device events, beside the
	# roofline's prediction (the table train gpu-model prints, measured).
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
	part bench.log $lim_step "$bin/train" bench --backend cuda --model "$cfg" --rows $ROWS --seq $SEQ --steps 2 --precision bfloat16 --ledger
	grep '^{' "$work/part" | tail -1 >"$work/bench.json"
	if [ -n "$mw" ]; then
		kill "$mw" 2>/dev/null
		wait "$mw" 2>/dev/null
	fi
	[ -s "$work/bench.json" ] || say "NOT RUN: tracegrpo's bf16 step benchmark did not finish (exit $rc after $secs s; see bench.log)"
	if grep -q '^predicted against measured' "$work/part"; then
		# The parts, and the 12 ops that take longest (bench.log has every op).
		awk '/^predicted against measured/ { on = 1 } !on { next } /^$/ { if (++blank == 3) exit } blank < 2 || n++ < 15 { print }' "$work/part" | tee -a "$summary"
	else
		say "NOT RUN: predicted against measured time per op (exit $rc after $secs s; see bench.log)"
	fi
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
	end bench
fi

# ---- extra [240 s]: every case and shape, op-level numbers, NCCL over ranks
if chosen extra; then
	begin
	gotests extra.log $lim_xconf '^TestConformanceGPU$' TestConformanceGPU
	part extra.log $lim_xperf bash -c 'cd "$0/kernels/cuda" && TRACEGRPO_PERF=1 exec "$1" -test.run "^TestPerfGPU\$" -test.v -test.count=1' "$root" "$bin/cuda.test"
	grep -o 'PERF .*' "$work/part" | tee -a "$summary"
	part extra.log $lim_xprof "$bin/train" bench --backend cuda --model "$cfg" --rows $ROWS --seq $SEQ --steps 1 --precision bfloat16 --profile
	say "profile of the step (the ops that take longest; extra.log has all):"
	awk '/^op +calls/ { on = 1; n = 0; next } on && n < 8 && NF >= 4 { print "  " $0; n++ }' "$work/part" | tee -a "$summary"
	part extra.log $lim_xadam bash -c 'cd "$0/optim" && exec "$1" -test.run AdamWGolden -test.v -test.count=1' "$root" "$bin/optim.test"
	if grep -q -- "--- PASS: TestAdamWGolden" "$work/part"; then say "PASS: optim TestAdamWGolden (cpu and cuda)"; else fail "optim TestAdamWGolden (see extra.log)"; fi
	# NCCL across processes: two ranks on the one GPU (each its own NCCL host
	# id, over loopback), launched by torchrun, against one process.
	if command -v torchrun >/dev/null 2>&1 && [ $dry != 1 ]; then
		args=(--backend cuda --device 0 --quiet --steps 3 --set grpo.num_prompts_per_step=4 --set grpo.num_generations_per_prompt=4
			--set checkpointing.save_period=1 --set policy.megatron_cfg.optimizer.adam_eps=1e-4)
		part extra.log $lim_xnccl1 "$bin/train" --out "$work/nccl-one" "${args[@]}"
		NCCL_SOCKET_IFNAME=lo part extra.log $lim_xnccl2 torchrun --standalone --nproc-per-node 2 --no-python \
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
	end extra
fi

# ---- loop [195 s]: scripts/gpu-check-loop.sh (transformers loads the weights
# a CUDA run publishes for its generator; loop.log)
if chosen loop; then
	begin
	GPU_CHECK_LIMITS="$((lim_loop_train * scale)) $((lim_loop_score * scale)) $((lim_loop_hf * scale))" \
		"$root/scripts/gpu-check-loop.sh" $([ $dry = 1 ] && echo --dry) "$out" "$bin/train" | tee -a "$summary"
	[ "${PIPESTATUS[0]}" = 0 ] || status=1
	end loop
fi
say "total: $(($(date +%s) - start)) s (the chosen stages' limits: $total s$([ $dry = 1 ] && echo " ×$scale on the emulator"))"
exit $status
