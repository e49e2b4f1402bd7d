# tracegrpo: the two set-up commands are `make run` and `make test`.
GO          ?= go
PYTHON      ?= /usr/bin/python3
STATICCHECK ?= honnef.co/go/tools/cmd/staticcheck@v0.8.2
FUZZTIME    ?= 10s
BENCH       ?= .
BENCHTIME   ?= 1x
CUDA_HOME   ?= $(CURDIR)/.cache/cuda
NVCC        ?= $(CUDA_HOME)/bin/nvcc

.PHONY: all build build-nocgo test deps lint docs fuzz mutate bench golden gym-diff gym-main schema run ptx ptx-sm90 cubin sass gpu-model gpu-check-build gpu-check-dry bench-torch bench-moe bench-nemotron bench-ops clean

all: build

build:
	$(GO) build ./...
	$(GO) build -o bin/train ./cmd/train

# The CPU-only build must always work.
build-nocgo:
	CGO_ENABLED=0 $(GO) build ./...

# Tools make test installs when missing (scripts/deps.sh): g++ for the CUDA
# emulator, Open MPI, procps, and ptxas, cuobjdump and the nvdisasm it runs
# (into TOOLS). The tests run with PATH cut to TOOLS, Go's bin and the system
# directories, and take the CUDA tools from TOOLS alone (TRACEGRPO_TOOLS;
# internal/testtool): a test that needs a program deps.sh does not provide
# fails, as it would on a bare machine, instead of passing on one where it was
# installed by hand. The REQUIRE variables turn a missing emulator, ptxas or
# mpirun into a failure instead of a skip.
TOOLS       ?= $(CURDIR)/.cache/tools/bin
TEST_PATH   := $(TOOLS):$(shell $(GO) env GOROOT)/bin:/usr/sbin:/usr/bin:/sbin:/bin
TEST_ENV    := PATH="$(TEST_PATH)" TRACEGRPO_TOOLS="$(TOOLS)" TRACEGRPO_REQUIRE_EMU=1 TRACEGRPO_REQUIRE_PTXAS=1 TRACEGRPO_REQUIRE_MPI=1

# The CUDA emulator's schedule seeds kernels/cuda's conformance suite runs
# under (TestConformanceEmu, one subtest seed=N each): two fixed, and one
# drawn afresh for every run, printed here, so a failure can be replayed
# (each subtest logs the TRACEGRPO_EMU_SEEDS that replays it; seeds after the
# first run the suite's schedule subset). Set EMU_SEEDS to choose them.
# go test's limit per package: kernels/cuda runs the emulator for minutes (its
# conformance suite under three seeds), and on a loaded 2-core machine it ran past
# Go's default 10 minutes; CI's whole run must stay under 20.
TEST_TIMEOUT ?= 20m
ifeq ($(origin EMU_SEEDS),undefined)
EMU_SEEDS := 1 2 $(shell od -An -N4 -tu4 /dev/urandom | tr -d ' ')
endif

test: deps
	$(GO) vet ./...
	CGO_ENABLED=0 $(GO) build ./...
	@echo "test: the CUDA conformance suite runs on the emulator under schedule seeds $(EMU_SEEDS) (the first runs the reduced suite, the others its schedule subset; a failing subtest logs the TRACEGRPO_EMU_SEEDS that replays it)"
	$(TEST_ENV) TRACEGRPO_EMU_SEEDS="$(EMU_SEEDS)" $(GO) test -timeout $(TEST_TIMEOUT) ./...

deps:
	TOOLS=$(TOOLS) scripts/deps.sh

lint:
	@out=$$(gofmt -l $$(git ls-files '*.go')); if [ -n "$$out" ]; then echo "gofmt would change:"; echo "$$out"; exit 1; fi
	$(GO) vet ./...
	$(GO) run $(STATICCHECK) ./...

# Rewrite the generated parts of README.md and docs/*.md (between
# <!-- gen: NAME --> and <!-- end gen: NAME -->) from the commands that print
# them, in a scratch copy of the repository (internal/docs; docs/testing.md).
# internal/docs's TestGenerated, in make test, fails while one is stale.
docs:
	$(TEST_ENV) $(GO) test ./internal/docs -count=1 -run '^TestGenerated$$' -update

# Each fuzz target for FUZZTIME (go test runs one target at a time).
fuzz:
	FUZZTIME=$(FUZZTIME) GO=$(GO) scripts/fuzz.sh

# The mutation check (not in CI): plants each bug of scripts/mutants.txt in
# turn, runs the tests of the packages it touches with make test's
# environment, and prints caught/total per package (scripts/mutate.sh
# documents the list). MUTATE_FLAGS, e.g. -run '^gym/' or -check.
MUTATE_FLAGS ?=
mutate: deps
	$(TEST_ENV) scripts/mutate.sh $(MUTATE_FLAGS)

bench:
	$(GO) test -run '^$$' -bench '$(BENCH)' -benchtime $(BENCHTIME) -benchmem ./...

# The same forward+backward+AdamW step in PyTorch and tracegrpo (same weights,
# 2 threads), interleaved over 2 rounds and every SIMD path of this CPU: prints
# the CPU, torch's BLAS and each path's ratio. Debian's default libblas is the
# reference BLAS: scripts/deps.sh bench installs torch with OpenBLAS.
bench-torch:
	scripts/deps.sh bench
	scripts/bench_compare.sh --threads 2 --steps 5 --rounds 2

# The sparse step (Qwen3-MoE, 16 experts, 4 per token) against the dense
# model of equal active parameters, in tracegrpo and PyTorch (transformers'
# loop over experts), same weights, one run; prints the ratios. The
# reference BLAS makes torch slow: small shapes.
bench-moe:
	scripts/bench_moe.sh --threads 2 --steps 2 --rows 2 --seq 64

# Nemotron-H: a tiny-but-not-trivial step against PyTorch's (scripts/bench_nemotronh.py) in one run, and the
# Mamba-2 scan's tokens/s against the bench model's attention at 4096 tokens (docs/benchmarks.md#nemotron-h).
bench-nemotron:
	scripts/bench_nemotron.sh --threads 2 --steps 2 --rows 2 --seq 128

# Op-level CPU kernels against torch (reference BLAS and its bundled oneDNN), 2 threads.
bench-ops:
	$(PYTHON) scripts/bench_ops_torch.py --count 5 --reps 3

# Regenerate the committed goldens with the independent implementations
# (Debian's python3-torch and python3-numpy; Python's hashlib).
# Byte order (LC_ALL=C), so golden_model.py runs before golden_model_bf16.py,
# which reads its output.
golden:
	scripts/deps.sh golden
	@for s in $$(LC_ALL=C ls scripts/golden_*.py); do echo "$(PYTHON) $$s"; $(PYTHON) $$s || exit 1; done

# Regenerate gym/testdata/gymdiff with NeMo Gym's own writer and builders
# (see gym/testdata/gymdiff/README.md). GYM_UPSTREAM holds the six PR files,
# GYM_MIRROR is a Gym clone's git dir; GYM_PYTHON needs pydantic 2 and orjson.
GYM_PYTHON   ?= python3
GYM_UPSTREAM ?= /tmp/gym-upstream-src
GYM_MIRROR   ?= /work/.mirror/NVIDIA-NeMo+Gym/repo
gym-diff:
	$(GYM_PYTHON) scripts/gym_differential.py --upstream $(GYM_UPSTREAM) --mirror $(GYM_MIRROR)

# Regenerate gym/testdata/gymmain (TokenEntry schema 1 stores written and
# finalized by NeMo Gym main's own code, read from GYM_MIRROR).
gym-main:
	$(GYM_PYTHON) scripts/gym_main_capture.py --mirror $(GYM_MIRROR)

# NeMo RL's GRPO config keys (config/gen_nemorl_keys.tsv) and its GRPO recipes
# (config/testdata/nemo-rl, with the two base recipes copied beside it), read
# from a NeMo RL clone's git directory at NEMORL_REV; the commit is recorded.
NEMORL_REPO ?= /work/.mirror/NVIDIA-NeMo+RL/repo
NEMORL_REV  ?= HEAD
schema:
	$(PYTHON) scripts/nemorl_schema.py --repo $(NEMORL_REPO) --rev $(NEMORL_REV) --recipes-out config/testdata/nemo-rl
	cp config/testdata/nemo-rl/examples/configs/grpo_math_1B.yaml config/testdata/nemo-rl/examples/configs/grpo_math_1B_megatron.yaml config/testdata/

# The main job: the built-in agentic task on the CPU, into runs/builtin (a
# previous run of it there is replaced), then its curves.
run: build
	rm -rf runs/builtin
	./bin/train --out runs/builtin
	./bin/train plot --out runs/builtin

# nvcc comes from scripts/deps.sh nvcc (CUDA 11.8 extracted into .cache/cuda,
# nothing installed with dpkg); its host-compiler check predates gcc 12, which
# only preprocesses here.
ptx:
	CUDA_HOME=$(CUDA_HOME) scripts/deps.sh nvcc
	$(MAKE) -C kernels/cuda/csrc NVCC=$(NVCC) NVFLAGS="-O3 -std=c++14 -allow-unsupported-compiler"
	$(MAKE) cubin

# Assemble every committed PTX for Hopper with the ptxas deps.sh provides.
ptx-sm90: deps
	$(MAKE) -C kernels/cuda/csrc sm90 PTXAS=$(TOOLS)/ptxas

# The committed sm_90 cubins (kernels/cuda/csrc/gen_*.sm_90.cubin, loaded on
# a device of compute capability 9.0 instead of compiling the PTX) and
# their manifest, assembled from the committed PTX by the ptxas deps.sh
# provides. Run it after make ptx; TestCubinsFresh and TestSASS check them.
cubin: deps
	$(MAKE) -C kernels/cuda/csrc cubin PTXAS=$(TOOLS)/ptxas

# Rewrite kernels/cuda/csrc/gen_sass.md (the SASS facts of the committed PTX:
# tensor-core instructions, registers, spills, blocks per SM) with the ptxas
# and cuobjdump make deps installs; TestSASS checks the file is current.
sass: deps
	$(TEST_ENV) $(GO) test ./kernels/cuda -count=1 -run '^TestSASS$$' -update-sass

# The predicted time per op of one training step on an H200 (the bench
# shape: Qwen3-1.7B, bf16, 8 × 4096 tokens) and its MFU, from the launch
# ledger of the step on kernels/cuda's metering device (no GPU; nothing
# runs). GPU_MODEL_FLAGS adds train gpu-model flags (--rows, --seq, ...).
GPU_MODEL_CONFIG ?= model/testdata/published/qwen3-1.7b.config.json
GPU_MODEL_FLAGS  ?=
gpu-model:
	$(GO) run ./cmd/train gpu-model --model $(GPU_MODEL_CONFIG) $(GPU_MODEL_FLAGS)

# Build what scripts/gpu-check.sh's core stages run on a GPU machine
# (-trimpath, stripped, gzipped) into bin/gpu-check (carry that folder
# there; GPU_CHECK_EXTRA=1 adds optim.test for the extra stage); fails when
# the device transfer (the tracked and untracked-not-ignored files, shared/
# and the carry) would exceed 56 MiB (GPU_CHECK_MAX_MIB).
gpu-check-build:
	scripts/gpu-check.sh --build

# scripts/gpu-check.sh end to end on the CPU emulator (bin/gpu-check-emu):
# every chosen stage and part as on a GPU (GPU_CHECK_STAGES, default the
# four core ones), with the emulator's libraries, reduced shapes and no
# compute-sanitizer; prints each stage's time against its budget, then the
# lease's plan: the core stages' limits (at most 7 minutes) and what a
# second call has for a stage rerun alone. Writes GPU_CHECK_OUT.
GPU_CHECK_OUT ?= /tmp/tracegrpo-gpu-check-dry
gpu-check-dry: gpu-check-build
	rm -rf bin/gpu-check-emu $(GPU_CHECK_OUT)
	cd kernels/cuda && TRACEGRPO_EMU_KEEP=$(CURDIR)/bin/gpu-check-emu $(GO) test -count=1 -run '^TestEmuSmoke$$' .
	GPU_CHECK_PYTHON=$(PYTHON) scripts/gpu-check.sh --dry $(GPU_CHECK_OUT)
	@echo "gpu-check-dry: $$(ls $(GPU_CHECK_OUT) | wc -l) files in $(GPU_CHECK_OUT) (the device returns 8 at most):"; ls -l $(GPU_CHECK_OUT)
	@scripts/gpu-check.sh --plan

clean:
	rm -rf bin
