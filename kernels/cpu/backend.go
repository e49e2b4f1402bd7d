// Package cpu is the pure-Go implementation of kernels.Backend: the reference
// every other backend is checked against, and the backend that runs the tests
// and the built-in task.
//
// # Memory
//
// Every allocation is an ordinary Go slice ([]float32, []int32, or []uint16
// for BF16) held in a table; a Buf's Handle is the table index plus one. F32
// and I32 resolve a Buf to the slice it names, so tests and the model can read
// and write buffers directly. Work runs synchronously: DownloadF32 and Sync
// never wait.
//
// # Threads and determinism
//
// A Backend owns a fixed pool of worker goroutines (New(threads)); ops split
// their work into grains whose boundaries never depend on the thread count,
// and every output element is produced by exactly one grain in a fixed order:
//
//   - elementwise ops (Fill, Copy, Scale, Add, Accumulate, SwiGLU, AdamW),
//     Rope, RMSNorm's forward and Embedding: split by element or row;
//   - Matmul, MatmulBackward and the gemms inside Attention and TokenLogprob:
//     split by fixed output tiles, each summing its whole K range in order;
//   - EmbeddingBackward and ScatterRows: split by column, rows in index order;
//   - RMSNormBackward's dweight and SumSquares: fixed-size blocks whose
//     partial sums are added in block order;
//   - AddBias: split by row; BiasBackward: split by fixed groups of
//     columns, each summed over fixed blocks of rows added in block order;
//   - AttentionBackward: split by (sequence, key/value head).
//
// Every op is therefore bit-identical for any thread count
// (TestThreadCountInvariance checks 1, 2, 3 and 5). Results do depend on the
// SIMD path chosen at start-up (see simd.go and Backend.Features), which is
// fixed for a machine.
//
// Per-row results are also pack-invariant: a row's Matmul output and dinp,
// a sequence's Attention outputs and gradients, and a row's TokenLogprob
// outputs and dhidden are bit-identical whether computed alone or packed with
// other rows or sequences (every sum runs over fixed 256-wide K blocks and
// query blocks aligned to the sequence start), so splitting or merging
// micro-batches cannot change per-token values (TestMatmulRowInvariance,
// TestAttentionSequenceInvariance, TestTokenLogprobRowInvariance). Sums over
// tokens (weight gradients) naturally depend on which tokens are present.
//
// A Backend is not safe for concurrent use: one goroutine drives it, as with a
// device stream. It allocates nothing per op call after warm-up
// (TestNoAllocsAfterWarmup).
//
// # Errors
//
// Data errors found inside an op (a token id or scatter index out of range)
// are recorded as a sticky error returned by the next Sync; the op writes
// zeros for the offending rows. Shape and dtype misuse panics.
package cpu

import (
	"fmt"
	"runtime"

	"github.com/tracegrpo/tracegrpo/kernels"
)

type alloc struct {
	f32  []float32
	i32  []int32
	bf16 []uint16
	dt   kernels.DType
	live bool
}

// Backend is the CPU backend. The zero value is not usable; call New.
type Backend struct {
	pool    *pool
	threads int
	allocs  []alloc
	free    []int
	err     error

	scratch scratch
	tasks   tasks

	bf16Scratch   map[string][]float32    // fp32 copies for the BF16 op variants (convert.go)
	sampleZ       []float32               // SampleTokens' scaled logits (V)
	filterScratch []kernels.FilterScratch // the filter's histograms, per worker
	routerDL      [][]float64             // RouterTopKBackward's row of dlogits, per worker (E)
	routerChoice  [][]float32             // the sigmoid router's choice scores, per worker (E)
	routeCursor   []int32                 // ExpertRoute's cursor per expert (E)
	ssmWork       []*ssmWork[float32]     // SSMScan's per-worker scratch, for ssmShape
	ssmShape      kernels.Scan
	ssmBC         []float32 // SSMScanBackward's per-head dB, dC (T,MH,2,DS)
}

// DefaultThreads is the thread count New(0) uses: runtime.GOMAXPROCS(0).
func DefaultThreads() int { return runtime.GOMAXPROCS(0) }

// New returns a CPU backend running ops on threads worker goroutines
// (including the caller's); threads ≤ 0 means DefaultThreads().
func New(threads int) *Backend {
	if threads <= 0 {
		threads = DefaultThreads()
	}
	b := &Backend{pool: newPool(threads), threads: threads}
	b.scratch.init(threads)
	return b
}

// Threads returns the number of threads ops run on.
func (b *Backend) Threads() int { return b.threads }

// Close stops the worker goroutines. The Backend must not be used afterwards.
func (b *Backend) Close() { b.pool.close() }

// Name implements kernels.Memory.
func (b *Backend) Name() string { return "cpu" }

// Alloc implements kernels.Memory: a zeroed buffer of n elements.
func (b *Backend) Alloc(dt kernels.DType, n int) (kernels.Buf, error) {
	if n < 0 {
		return kernels.Buf{}, fmt.Errorf("cpu: alloc of %d %s elements", n, dt)
	}
	a := alloc{dt: dt, live: true}
	switch dt {
	case kernels.F32:
		a.f32 = make([]float32, n)
	case kernels.I32:
		a.i32 = make([]int32, n)
	case kernels.BF16:
		a.bf16 = make([]uint16, n)
	default:
		return kernels.Buf{}, fmt.Errorf("cpu: alloc: unknown dtype %d", dt)
	}
	var idx int
	if k := len(b.free); k > 0 {
		idx = b.free[k-1]
		b.free = b.free[:k-1]
		b.allocs[idx] = a
	} else {
		idx = len(b.allocs)
		b.allocs = append(b.allocs, a)
	}
	return kernels.Buf{Handle: uintptr(idx + 1), Off: 0, N: n, DType: dt}, nil
}

// Free implements kernels.Memory.
func (b *Backend) Free(buf kernels.Buf) {
	a := b.lookup(buf)
	if buf.Off != 0 || buf.N != max(len(a.f32), len(a.i32), len(a.bf16)) {
		panic(fmt.Sprintf("cpu: Free of a view (off %d, n %d)", buf.Off, buf.N))
	}
	idx := int(buf.Handle) - 1
	b.allocs[idx] = alloc{}
	b.free = append(b.free, idx)
}

func (b *Backend) lookup(buf kernels.Buf) *alloc {
	idx := int(buf.Handle) - 1
	if idx < 0 || idx >= len(b.allocs) || !b.allocs[idx].live {
		panic(fmt.Sprintf("cpu: buffer handle %d is not a live allocation of this backend", buf.Handle))
	}
	a := &b.allocs[idx]
	if a.dt != buf.DType {
		panic(fmt.Sprintf("cpu: buffer handle %d holds %s, view says %s", buf.Handle, a.dt, buf.DType))
	}
	return a
}

// F32 returns the float32 elements a buffer names (a view of the backend's
// memory, not a copy). It panics if buf is not an F32 buffer of this backend.
func (b *Backend) F32(buf kernels.Buf) []float32 {
	a := b.lookup(buf)
	if buf.DType != kernels.F32 {
		panic(fmt.Sprintf("cpu: F32 of a %s buffer", buf.DType))
	}
	return a.f32[buf.Off : buf.Off+buf.N : buf.Off+buf.N]
}

// I32 returns the int32 elements a buffer names (a view, not a copy).
func (b *Backend) I32(buf kernels.Buf) []int32 {
	a := b.lookup(buf)
	if buf.DType != kernels.I32 {
		panic(fmt.Sprintf("cpu: I32 of a %s buffer", buf.DType))
	}
	return a.i32[buf.Off : buf.Off+buf.N : buf.Off+buf.N]
}

// BF16 returns the raw bfloat16 bits a buffer names (a view, not a copy).
func (b *Backend) BF16(buf kernels.Buf) []uint16 {
	a := b.lookup(buf)
	if buf.DType != kernels.BF16 {
		panic(fmt.Sprintf("cpu: BF16 of a %s buffer", buf.DType))
	}
	return a.bf16[buf.Off : buf.Off+buf.N : buf.Off+buf.N]
}

// f32n resolves buf and checks that it holds exactly n elements.
func (b *Backend) f32n(buf kernels.Buf, n int, what string) []float32 {
	s := b.F32(buf)
	if len(s) != n {
		panic(fmt.Sprintf("cpu: %s has %d elements, want %d", what, len(s), n))
	}
	return s
}

func (b *Backend) i32n(buf kernels.Buf, n int, what string) []int32 {
	s := b.I32(buf)
	if len(s) != n {
		panic(fmt.Sprintf("cpu: %s has %d elements, want %d", what, len(s), n))
	}
	return s
}

// f32opt is f32n for an optional output: a zero-length buffer returns nil.
func (b *Backend) f32opt(buf kernels.Buf, n int, what string) []float32 {
	if buf.N == 0 {
		return nil
	}
	return b.f32n(buf, n, what)
}

// UploadF32 implements kernels.Memory.
func (b *Backend) UploadF32(dst kernels.Buf, src []float32) {
	copy(b.f32n(dst, len(src), "UploadF32 dst"), src)
}

// UploadI32 implements kernels.Memory.
func (b *Backend) UploadI32(dst kernels.Buf, src []int32) {
	copy(b.i32n(dst, len(src), "UploadI32 dst"), src)
}

// DownloadF32 implements kernels.Memory.
func (b *Backend) DownloadF32(dst []float32, src kernels.Buf) {
	copy(dst, b.f32n(src, len(dst), "DownloadF32 src"))
}

// DownloadI32 implements kernels.Memory.
func (b *Backend) DownloadI32(dst []int32, src kernels.Buf) {
	copy(dst, b.i32n(src, len(dst), "DownloadI32 src"))
}

// Sync implements kernels.Memory: ops run synchronously, so it only returns
// and clears the sticky error.
func (b *Backend) Sync() error {
	err := b.err
	b.err = nil
	return err
}

// fail records the first data error an op finds.
func (b *Backend) fail(format string, args ...any) {
	if b.err == nil {
		b.err = fmt.Errorf("cpu: "+format, args...)
	}
}

var _ kernels.Backend = (*Backend)(nil)
var _ kernels.Experts = (*Backend)(nil)
