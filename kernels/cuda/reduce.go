//go:build cgo

package cuda

// SumSquares: csrc/reduce.cu.

import "github.com/tracegrpo/tracegrpo/kernels"

// SumSquares implements kernels.Ops: out (1) = Σ x², in double, in an order
// fixed by len(x) alone.
func (b *Backend) SumSquares(out, x kernels.Buf) {
	want(out, kernels.F32, 1, "SumSquares out")
	want(x, kernels.F32, x.N, "SumSquares x")
	defer b.lock()()
	b.launch("sum_squares_partial", rw(reads(x)).plus(0, 8*reduceBlocks).with(2*int64(x.N), 0), reduceBlocks, 1, 1, threads, 0, pu(b.partials), pa(x), la(x.N))
	b.launch("sum_squares_final", rw(nil, out).plus(8*reduceBlocks, 0).with(reduceBlocks, 0), 1, 1, 1, threads, 0, pa(out), pu(b.partials), ia(reduceBlocks))
}
