package cpu

// Bias of a Hugging Face Linear (Qwen2's q/k/v projections):
//
//	forward:  out (T,OC) += bias (OC) on every row                  +=
//	backward: dbias (OC) += Σ_t dout (T,OC)                         +=
//
// The forward is split by rows. The backward is split by fixed groups of
// biasCols columns; each column is summed over rows in blocks of biasRows
// rows (each block left to right from zero, in float32), and the block sums
// are added in block order, then added into dbias: the order depends only on
// T and OC, so the result is thread-count invariant.

import (
	"fmt"

	"github.com/tracegrpo/tracegrpo/kernels"
)

const (
	biasCols = 64  // columns per backward grain
	biasRows = 256 // rows per partial sum
)

func addBiasRows[F Float](out, bias []F, lo, hi, OC int) {
	bias = bias[:OC]
	for t := lo; t < hi; t++ {
		row := out[t*OC : (t+1)*OC]
		for j, b := range bias {
			row[j] += b
		}
	}
}

// biasBackwardCols adds Σ_t dout[t, c] into dbias[c] for columns [c0, c1),
// c1−c0 ≤ biasCols.
func biasBackwardCols[F Float](dbias, dout []F, T, OC, c0, c1 int) {
	var acc, part [biasCols]F
	n := c1 - c0
	for r0 := 0; r0 < T; r0 += biasRows {
		clear(part[:n])
		for t := r0; t < min(r0+biasRows, T); t++ {
			row := dout[t*OC+c0 : t*OC+c1]
			for j, v := range row {
				part[j] += v
			}
		}
		for j := range n {
			acc[j] += part[j]
		}
	}
	d := dbias[c0:c1]
	for j := range d {
		d[j] += acc[j]
	}
}

type biasTask struct {
	out, bias   []float32 // (T,OC), (OC): forward
	dbias, dout []float32 // (OC), (T,OC): backward
	T, OC       int
	bwd         bool
}

func (t *biasTask) run(_, lo, hi int) {
	if !t.bwd {
		addBiasRows(t.out, t.bias, lo, hi, t.OC)
		return
	}
	for g := lo; g < hi; g++ {
		biasBackwardCols(t.dbias, t.dout, t.T, t.OC, g*biasCols, min((g+1)*biasCols, t.OC))
	}
}

// AddBias implements kernels.Ops.
// Shapes: out (T,OC), bias (OC).
func (b *Backend) AddBias(out, bias kernels.Buf, T, OC int) {
	if OC <= 0 {
		panic(fmt.Sprintf("cpu: AddBias: OC = %d", OC))
	}
	t := &b.tasks.bias
	*t = biasTask{out: b.f32n(out, T*OC, "AddBias out"), bias: b.f32n(bias, OC, "AddBias bias"), OC: OC}
	b.pool.parallel(t, T, max(1, elemGrain/OC))
	*t = biasTask{}
}

// BiasBackward implements kernels.Ops.
// Shapes: dbias (OC), dout (T,OC).
func (b *Backend) BiasBackward(dbias, dout kernels.Buf, T, OC int) {
	if OC <= 0 {
		panic(fmt.Sprintf("cpu: BiasBackward: OC = %d", OC))
	}
	t := &b.tasks.bias
	*t = biasTask{dbias: b.f32n(dbias, OC, "BiasBackward dbias"), dout: b.f32n(dout, T*OC, "BiasBackward dout"), T: T, OC: OC, bwd: true}
	b.pool.parallel(t, (OC+biasCols-1)/biasCols, 1)
	*t = biasTask{}
}
