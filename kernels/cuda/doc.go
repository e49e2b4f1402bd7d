// Package cuda runs the kernels.Backend ops on an NVIDIA GPU. It is the only
// package of tracegrpo that imports "C".
//
// # Loading
//
// Nothing of CUDA is needed to build it. Open dlopens the driver
// (libcuda.so.1) and cuBLAS (libcublas.so.13, .12 or .11: the newest the
// driver runs), and OpenNCCL libnccl.so.2, at run time, with prototypes
// written in this package's cgo preamble. libsearch.go finds them: in
// $TRACEGRPO_CUDA_LIBS and $LD_LIBRARY_PATH, in the directories NVIDIA's pip
// wheels install them into (CUDA 13's nvidia/cu13/lib, CUDA 12's
// nvidia/cublas/lib, nvidia/nccl/lib) under the active virtualenv or conda
// environment, every python3 on PATH (a virtualenv without VIRTUAL_ENV) and
// the usual Python installs, in the system's ld paths (/etc/ld.so.conf and
// the loader's directories) and the CUDA toolkit's; a cuBLAS from a
// directory is opened after the cuBLASLt beside it. Libraries says which
// file each came from and what was passed over, and why.
// The kernels are PTX generated from csrc/*.cu by `make ptx` (nvcc -ptx
// -arch=sm_80), committed as csrc/gen_*.ptx and embedded; the driver compiles
// them for the device when the backend opens, so one binary runs on any GPU
// of compute capability 8.0 or newer whose driver is at least the PTX's CUDA
// version (11.8). Each gen_*.ptx records the sha256 of its sources and
// TestPTXFresh fails when a .cu changed but its PTX was not regenerated.
//
// Without cgo (CGO_ENABLED=0), Open returns ErrNotBuilt. Without a driver or
// a device, Open returns an error saying which library or call failed; a
// library lacking a symbol is reported by library path and symbol name.
//
// # Threads
//
// A CUDA context is current per OS thread. Instead of one OS-locked
// goroutine that every call is handed to, every C entry point of this
// package makes the backend's primary context current on the OS thread it
// runs on before it does anything else (cuCtxSetCurrent is a thread-local
// store, cheap next to a launch), and the backend is used from one goroutine
// at a time, like a stream (the kernels.Backend contract), guarded by a
// mutex. Whatever thread the Go scheduler runs a call on therefore issues it
// in the right context, on the backend's one stream, in call order: the same
// guarantees as a locked driver goroutine without a channel hop per op.
//
// # Memory and errors
//
// A Buf's Handle is the device pointer of its allocation. Ops are queued on
// one stream and return at once; the first failing driver or cuBLAS status
// is kept (sticky) and returned, with the op's name, by the next Sync, which
// also reports data errors the kernels found (a token id out of range, ...)
// through a device-side flag word. C never keeps a Go pointer: kernel
// arguments are copied into a C-allocated slot array, and uploads and
// downloads wait for their copy before returning.
//
// # Numerics
//
// Elementwise ops, norms, attention and the log-prob reductions compute in
// fp32 whatever the storage; SumSquares accumulates in double. Matmul is
// cuBLAS: fp32 by default, TF32 tensor cores or bf16 inputs with fp32
// accumulation by Options.Matmul; BF16 operands (the kernels package's
// bfloat16 contract) always multiply on bf16 tensor cores with fp32
// accumulation. Attention on BF16 operands with head_dim 64 or 128 runs
// FlashAttention-2-style kernels on mma.sync (P and dS are rounded to bf16
// as mma operands); other head dimensions widen to the fp32 kernels. Both
// families are csrc/attention_family.cuh's: token trees run it over their
// segments, packed sequences as a tree of roots alone. The packed
// backward does not recompute: its dk/dv kernel also writes each pair's
// bf16 dS into a scratch (about T·NH·MaxLen bytes: attnDSWork), and dq is
// dS·K from it, five products a tile pair where the tree backward's dq
// kernel recomputes S and dP (seven). A scratch over attnDSMaxBytes (4 GiB:
// long contexts) falls back to the fp32-arithmetic kernels that recompute
// and need none; the plan counts the scratch by the same predicate
// (attnDSFits). TokenLogprob on BF16 hidden and weight forms its fp32
// logits chunks with bf16 GEMMs and rounds the backward's dz chunk to bf16.
//
// The GEMMs run on cuBLASLt (blaslt.go) when it loads beside cuBLAS (or
// from Options.BlasLtLib), else on cublasGemmEx, which has the same
// tensor-core kernels but no separate C and D. Each distinct GEMM (shape,
// leading dimensions, types, compute type, operand alignment, epilogue)
// is planned at its first call: cublasLtMatmulAlgoGetHeuristic picks one
// algorithm under the backend's fixed 32 MiB workspace, and the plan is
// kept, so every later call runs that algorithm over that workspace.
// Determinism needs both: the algorithm fixes the summation order (split-K
// included), and the heuristic's choice depends on the workspace it may
// use. MatmulAdd (kernels.MatmulAdder) adds the residual as the GEMM's
// epilogue (beta = 1, C the residual, D the output); on cublasGemmEx the
// residual is copied into the output first. A fresh MatmulBackward may
// write a bf16 dinp, rounded once by the GEMM. The LM head's GEMMs take the
// same path, but its online log-sum-exp over a row stays a kernel reading
// each fp32 chunk once: no cuBLASLt epilogue (bias, activation, auxiliary
// outputs) folds it. scripts/gpu-check.sh measures the LM head against the
// bare GEMMs it contains.
//
// Nemotron-H's Mamba-2 scan forward on a bf16 xbc (the bf16 model's) is
// the chunked SSD algorithm on tensor cores (csrc/ssd_fwd.cu): a block per
// (16 columns of a head, head) walks the tree's segments in chunks of 64
// tokens (a child from its parent's final state), the intra-chunk C·Bᵀ
// masked by the decays, the off-diagonal C·S0ᵀ and the chunk's state on
// mma.sync, its fp32 operands as two bf16 parts (kerneltest's TolScanBF16
// against kernels/cpu, measured). An fp32 xbc, a state over 128, and the
// backward's checkpoint pass run the sequential fp32 recurrence of
// csrc/mamba.cu, one block per head. The backward (csrc/ssd_bwd.cu) is the
// chunked SSD algorithm over the chunks of 64 tokens of a segment that
// start at those checkpoints: each chunk's products (C·Bᵀ, dY·Xᵀ, dX, dB,
// dC, the states' terms) in a block of its own, the reverse inter-chunk
// recurrence in fp32 one thread a state element, dB and dC summed over a
// group's heads in head order inside the chunk's block (no per-head
// partials). With bf16 xbc its products run on tensor cores, each operand
// split into bf16 hi + lo and three mma.sync a step (hi·hi + hi·lo +
// lo·hi): one rounding (of the fp32 states and dY) measured 0.67 absolute
// error on dxbc at MP 64, DS 128, the split 0.0017. Results agree with
// kernels/cpu's chunking (aligned to context positions) to rounding, not
// bit for bit.
//
// No kernel adds with atomics: attention's backward pass, SumSquares,
// RMSNormBackward's dweight (per-block partials reduced in block order, with a
// block count that depends on the shape, not the device) and
// EmbeddingBackward (each element summed in token order, bitwise equal to the
// CPU) give the same bits on every run.
//
// # The launch ledger
//
// With StartLedger on, the backend records every kernel launch, cuBLAS GEMM
// and device copy it queues (ledger.go): the op that queued it (the Backend
// method the caller called), the kernel, grid, block and shared memory, the
// bytes it reads and writes and its FLOPs. Every launch site states its
// cost (launch's cost argument); a GEMM's follows from its shape.
// OpenMeter opens the backend on a metering device (meter.h) on which
// nothing runs and nothing is allocated, so a whole training step of any
// model records its ledger on a machine without a GPU, and the roofline
// (roofline.go: FLOPs at the matrix rate, bytes at the copy bandwidth or at
// what the threads in flight draw, the grid's share of the SMs, from each
// kernel's sm_90 registers and shared memory in gen_sm90.go) predicts its
// time per op on an H200: make gpu-model. TestLedger* check the counts
// against each op's arithmetic and, on the emulator, every launch's
// declared writes against the device memory it really changed.
//
// # Testing
//
// Without a GPU (CI, development machines) the tests build a stand-in
// libcuda, cuBLAS and cuBLASLt with g++ (testdata/emu): the .cu files compile as C++
// against a small CUDA emulation header and run on fibers, one per CUDA
// thread, with __syncthreads and warp shuffles as cooperative barriers.
// A launch runs its blocks one at a time in a shuffled order, and each
// block's warps one at a time to their next barrier in a shuffled order,
// lanes too, all drawn from $TRACEGRPO_EMU_SEED (TestConformanceEmu runs
// under each seed of $TRACEGRPO_EMU_SEEDS, and caps grid-stride grids so
// that blocks loop over several rows), so a missing __syncthreads changes
// results; shared memory, static (wherever declared: a kernel, an inline
// function, a template; the build links them into one section) and
// dynamic, is NaN at the start of every block, so a read of a value no
// thread of the block wrote shows; allocations
// sit against a guard page, so out-of-bounds accesses crash; launches
// enforce block, grid and shared-memory limits (above 48 KiB only after
// cuFuncSetAttribute, up to sm_80's 163 KiB); vector accesses must be
// aligned. The tensor-core instructions (csrc/mma.cuh: mma.sync m16n8k16
// bf16, ldmatrix, cp.async) are emulated from the PTX ISA's fragment
// layouts, the warp's operands gathered at a warp barrier, summed in fp32
// steps as the hardware does (never exactly); cp.async leaves
// its destination NaN until the wait, so a read too early or a buffer
// refilled while in use shows. TestMMALayoutEmu checks the emulation against
// a float64 product, TestMMALayoutMutantEmu that a wrong lane mapping fails
// it, and TestMMALayoutGPU the same kernels against the hardware. The fake
// cuBLAS sums in fp32 and, in TF32 mode, rounds its inputs to 10 mantissa
// bits, so no tolerance measured on the emulator is tighter than a GPU's
// rounding allows. The
// backend opened on the emulator runs the conformance suite
// (kernels/kerneltest, its reduced shapes), one fp32 and one mixed-precision
// training step of the tiny models, and the sampler (greedy, top-k and
// top-p with refills) against kernels/cpu. TestSASS assembles the committed
// PTX for sm_80 and sm_90 and checks the tensor-core kernels' HMMA, spills
// and blocks per SM against csrc/gen_sass.md (make sass). What the emulator
// cannot show: GPU timing, the hardware memory model beyond barriers,
// warp-divergence behaviour of real hardware, PTX JIT, and cuBLAS's own
// numerics. The *GPU tests run the same checks on device 0 and skip without
// one (fail, with TRACEGRPO_REQUIRE_GPU=1); scripts/gpu-check.sh runs them
// there in stages (a preflight, correctness with compute-sanitizer, then
// benchmarks), from test binaries built here, and make gpu-check-dry runs
// that script end to end on the emulator.
package cuda

import (
	"errors"
	"fmt"
	"os"
)

// ErrNotBuilt is returned by Open in a binary built without cgo.
var ErrNotBuilt = errors.New("cuda: CUDA support is not built in (this binary was built with CGO_ENABLED=0); rebuild with cgo enabled or use --backend cpu")

// MatmulMode is the arithmetic of the F32 GEMMs.
type MatmulMode uint8

const (
	// MatmulDefault takes the mode from $TRACEGRPO_CUDA_MATMUL ("fp32",
	// "tf32" or "bf16") and is MatmulFP32 when that is unset, so a caller
	// that passes Options{} (train bench) can be switched without a flag.
	MatmulDefault MatmulMode = iota
	// MatmulFP32 is plain fp32 (CUBLAS_COMPUTE_32F).
	MatmulFP32
	// MatmulTF32 lets cuBLAS use TF32 tensor cores (CUBLAS_COMPUTE_32F_FAST_TF32;
	// inputs rounded to 10 mantissa bits, fp32 accumulation).
	MatmulTF32
	// MatmulBF16 rounds both inputs to bf16 (a cast kernel into scratch) and
	// multiplies them on bf16 tensor cores with fp32 accumulation and an fp32
	// result, like torch.autocast(dtype=torch.bfloat16).
	MatmulBF16
)

func (m MatmulMode) String() string {
	switch m {
	case MatmulDefault:
		return "default"
	case MatmulFP32:
		return "fp32"
	case MatmulTF32:
		return "tf32"
	case MatmulBF16:
		return "bf16"
	}
	return fmt.Sprintf("MatmulMode(%d)", uint8(m))
}

// resolve turns MatmulDefault into the mode $TRACEGRPO_CUDA_MATMUL names.
func (m MatmulMode) resolve() (MatmulMode, error) {
	if m != MatmulDefault {
		return m, nil
	}
	env := os.Getenv("TRACEGRPO_CUDA_MATMUL")
	if env == "" {
		return MatmulFP32, nil
	}
	mode, err := ParseMatmulMode(env)
	if err != nil {
		return 0, fmt.Errorf("$TRACEGRPO_CUDA_MATMUL: %w", err)
	}
	return mode, nil
}

// ParseMatmulMode parses "fp32", "tf32" or "bf16".
func ParseMatmulMode(s string) (MatmulMode, error) {
	for _, m := range []MatmulMode{MatmulFP32, MatmulTF32, MatmulBF16} {
		if m.String() == s {
			return m, nil
		}
	}
	return 0, fmt.Errorf("cuda: matmul mode %q: expected fp32, tf32 or bf16", s)
}

// Options configures Open.
type Options struct {
	// Device is the CUDA device ordinal.
	Device int
	// DriverLib is the driver library to dlopen; empty means
	// $TRACEGRPO_CUDA_DRIVER, else "libcuda.so.1" through the loader, then
	// libsearch.go's search.
	DriverLib string
	// BlasLib is the cuBLAS library to dlopen; empty means
	// $TRACEGRPO_CUDA_BLAS, else the newest of libcublas.so.13, .12, .11
	// the driver runs, found by libsearch.go's search.
	BlasLib string
	// BlasLtLib is the cuBLASLt the GEMMs run on; empty means
	// $TRACEGRPO_CUDA_BLASLT, else the libcublasLt beside the cuBLAS
	// loaded (libcublas.so.N's libcublasLt.so.N). "none" keeps them on
	// cublasGemmEx, as does a cuBLASLt that does not load (DeviceInfo
	// says which ran, and Libraries why).
	BlasLtLib string
	// Matmul chooses how Matmul, MatmulBackward and TokenLogprob's GEMMs
	// run on F32 buffers: MatmulFP32, MatmulTF32, MatmulBF16, or
	// MatmulDefault ($TRACEGRPO_CUDA_MATMUL, else fp32).
	Matmul MatmulMode
	// DecodeSplit is how many cache rows one warp of AttentionDecode covers
	// before the splits are combined (flash-decoding); 0 means 256. Rounded
	// down to a multiple of 32.
	DecodeSplit int
	// LogitsScratch caps the elements of the (T, Vc) logits chunk that
	// TokenLogprob forms at once; 0 means 32 Mi elements (128 MiB) until
	// SizeLogitsScratch sizes it from the memory a run's plan leaves free
	// (an explicit value is kept).
	LogitsScratch int

	// PTXOnly loads every kernel file from its PTX (the driver compiles
	// it) even on a device of compute capability 9.0, whose committed
	// cubins load otherwise.
	PTXOnly bool

	// kernelFiles, when set, limits the embedded PTX files loaded (tests of
	// an emulator built from some of the kernel sources).
	kernelFiles []string
	// meter opens the metering device (OpenMeter) instead of a driver.
	meter bool
	// maxBlocks, when positive, caps the grid of every grid-stride kernel
	// (tests: the emulator's conformance run caps it low, so that every
	// loop over rows or elements runs several times per block, and a
	// barrier missing between two iterations changes the result).
	maxBlocks int
}
