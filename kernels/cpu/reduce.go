package cpu

// SumSquares: out (1) = Σ x² over x (N), accumulated in float64.
//
// The sum is formed in fixed blocks of reduceBlock elements, each summed
// left to right in float64, and the block sums are added left to right, then
// rounded once to float32. The order depends only on N: thread-count
// invariant.

import (
	"github.com/tracegrpo/tracegrpo/kernels"
)

const reduceBlock = 1 << 14

func sumSquaresRange[F Float](x []F) float64 {
	var s float64
	for _, v := range x {
		s += float64(v) * float64(v)
	}
	return s
}

type sumSquaresTask struct {
	x        []float32 // (N)
	partials []float64 // (ceil(N/reduceBlock))
}

func (t *sumSquaresTask) run(_, lo, hi int) {
	for blk := lo; blk < hi; blk++ {
		a := blk * reduceBlock
		t.partials[blk] = sumSquaresRange(t.x[a:min(a+reduceBlock, len(t.x))])
	}
}

// SumSquares implements kernels.Ops.
// Shapes: out (1), x (N).
func (b *Backend) SumSquares(out, x kernels.Buf) {
	o := b.f32n(out, 1, "SumSquares out")
	xs := b.F32(x)
	nb := (len(xs) + reduceBlock - 1) / reduceBlock
	t := &b.tasks.sumSquares
	*t = sumSquaresTask{x: xs, partials: b.scratch.getPartials(nb)}
	b.pool.parallel(t, nb, 1)
	var s float64
	for _, p := range t.partials {
		s += p
	}
	o[0] = float32(s)
	*t = sumSquaresTask{}
}
