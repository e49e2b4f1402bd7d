package cuda

// The launch ledger: every kernel launch, cuBLAS call and device copy the
// backend queues, with its grid, block and shared memory, the bytes it
// moves through device memory and the floating-point operations it does
// (Backend.StartLedger, Backend.TakeLedger). Every launch site states its
// cost (a cost argument of launch and elementwise: the compiler makes a new
// kernel state one); a GEMM's is computed from its shape. The roofline
// (roofline.go) turns a ledger into a predicted time per op on a device
// that has never run it: a ledger is recorded on any backend, the metering
// one (OpenMeter, no GPU: nothing runs) included.

import (
	"fmt"
	"runtime"
	"strings"
	"unicode"

	"github.com/tracegrpo/tracegrpo/kernels"
)

// Ledgered is a backend that records a launch ledger: the CUDA backend,
// on a device or on the metering device (OpenMeter).
type Ledgered interface {
	// StartLedger clears the ledger and records from now on.
	StartLedger()
	// TakeLedger returns what was recorded and stops recording.
	TakeLedger() []Launch
}

// Kind is what executes a launch.
type Kind uint8

const (
	// KindSIMT is one of our kernels on the CUDA cores.
	KindSIMT Kind = iota + 1
	// KindMMA is one of our kernels whose matrix products run on tensor
	// cores through mma.sync (HMMA).
	KindMMA
	// KindGEMM is a cuBLAS(Lt) GEMM.
	KindGEMM
	// KindCopy is a device-to-device copy or a memset.
	KindCopy
)

func (k Kind) String() string {
	switch k {
	case KindSIMT:
		return "simt"
	case KindMMA:
		return "mma"
	case KindGEMM:
		return "gemm"
	case KindCopy:
		return "copy"
	}
	return fmt.Sprintf("Kind(%d)", uint8(k))
}

// Launch is one entry of the ledger.
type Launch struct {
	// Op is the Backend method the caller called (RMSNormBackward,
	// Matmul, AdamW, ...): the outermost exported method on the stack.
	Op string
	// Kernel is the kernel's entry point, or "gemm" for a cuBLAS GEMM and
	// "memcpy" / "memset" for driver copies.
	Kernel string
	Kind   Kind
	Grid   [3]int
	Block  int // threads
	Smem   int // dynamic shared memory, bytes
	// Read and Write are the bytes the launch reads from and writes to
	// device memory, each element counted once (an accumulated output is
	// read and written).
	Read, Write int64
	// FLOPs counts floating-point operations (a multiply-add is 2; a
	// GEMM's 2·m·n·k).
	FLOPs int64
	// Inflight is the bytes of loads each thread has in flight at once
	// (memory-level parallelism: what the kernel issues before it waits on
	// the first). The roofline bounds a kernel's bandwidth by the bytes its
	// resident threads keep in flight.
	Inflight int
	// GEMM is the shape of a cuBLAS call (Kind GEMM), else nil.
	GEMM *GemmCall
	// Measured is the device time from this launch's start to the next
	// one's (seconds), read off events recorded before each launch on the
	// stream (a ledger of StartTimedLedger), so it holds any gap before the
	// next launch too; 0 in a ledger that was not timed.
	Measured float64
}

// Blocks is the launch's number of blocks.
func (l Launch) Blocks() int { return l.Grid[0] * l.Grid[1] * l.Grid[2] }

// GemmCall is one cuBLAS GEMM in column-major terms: C (M,N) = alpha·op(A)
// op(B) + beta·C, op(A) (M,K).
type GemmCall struct {
	TransA, TransB bool
	M, N, K        int
	AB, C          kernels.DType // operand and output types
	Beta           float32
	Lt             bool   // through cuBLASLt (cublasLtMatmul) rather than cublasGemmEx
	Epilogue       string // cuBLASLt epilogue ("" for none)
}

func (g GemmCall) String() string {
	t := func(b bool) string {
		if b {
			return "T"
		}
		return "N"
	}
	s := fmt.Sprintf("%s%s %dx%dx%d %s->%s beta=%g", t(g.TransA), t(g.TransB), g.M, g.N, g.K, g.AB, g.C, g.Beta)
	if g.Lt {
		s += " lt"
	}
	if g.Epilogue != "" {
		s += " " + g.Epilogue
	}
	return s
}

// cost is what a launch site states about its launch: the bytes it reads
// and writes and its floating-point operations (Launch's fields of the
// same names), and, for the kernels whose threads keep more than
// defaultInflight bytes of loads in flight, that number.
type cost struct {
	read, write, flops int64
	inflight           int
}

// defaultInflight is a thread's bytes in flight when its launch site says
// nothing: two 4-byte loads issued before the first use (a grid-stride
// loop's body reading two operands).
const defaultInflight = 8

// bytesOf is the bytes of the views' elements.
func bytesOf(bufs ...kernels.Buf) int64 {
	var n int64
	for _, x := range bufs {
		if x.N > 0 {
			n += int64(x.N) * int64(x.DType.Size())
		}
	}
	return n
}

// rw is the cost of a launch that reads the views in and writes those in
// out once each (an accumulated output appears in both).
func rw(in []kernels.Buf, out ...kernels.Buf) cost {
	return cost{read: bytesOf(in...), write: bytesOf(out...)}
}

// reads is a list of views read, for rw.
func reads(bufs ...kernels.Buf) []kernels.Buf { return bufs }

// with returns c with flops and inflight set.
func (c cost) with(flops int64, inflight int) cost {
	c.flops, c.inflight = flops, inflight
	return c
}

// plus adds raw bytes read and written (scratch a launch fills or reads).
func (c cost) plus(read, write int64) cost {
	c.read += read
	c.write += write
	return c
}

// ledger records launches while it is on.
type ledger struct {
	on      bool
	entries []Launch
	// mark, when set (a timed ledger), records a device event on the
	// stream before each launch is queued.
	mark func()
}

// backendMethod is the prefix of a Backend method in a stack frame.
const backendMethod = "kernels/cuda.(*Backend)."

// callerOp returns the outermost exported Backend method on the stack:
// the op the model called, whatever helpers sit between it and the launch.
func callerOp() string {
	pc := make([]uintptr, 64)
	n := runtime.Callers(3, pc)
	frames := runtime.CallersFrames(pc[:n])
	op := ""
	for {
		f, more := frames.Next()
		if i := strings.Index(f.Function, backendMethod); i >= 0 {
			m := f.Function[i+len(backendMethod):]
			if m != "" && unicode.IsUpper(rune(m[0])) && !strings.Contains(m, ".") {
				op = m
			}
		}
		if !more {
			return op
		}
	}
}

// record appends l when the ledger is on (the caller holds b.mu).
func (lg *ledger) record(l Launch) {
	if !lg.on {
		return
	}
	l.Op = callerOp()
	if l.Inflight == 0 {
		l.Inflight = defaultInflight
	}
	lg.entries = append(lg.entries, l)
	if lg.mark != nil {
		lg.mark()
	}
}

// TimedLedgered is a backend that times each launch of its ledger on the
// device (the CUDA backend): predicted against measured time per op.
type TimedLedgered interface {
	Ledgered
	// StartTimedLedger is StartLedger with an event recorded before each
	// launch; TakeLedger then waits for the device and sets each launch's
	// Measured.
	StartTimedLedger()
}
