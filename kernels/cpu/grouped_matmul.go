package cpu

// GroupedMatmul: every expert's Linear over its own rows (kernels.Experts),
// and the two backward halves.
//
//	forward:  out[lo:hi] (n,OC)     =  inp[lo:hi] (n,C) · weight[e] (OC,C)ᵀ
//	backward: dinp[lo:hi] (n,C)     += dout[lo:hi] (n,OC) · weight[e]
//	          dweight[e] (OC,C)     += dout[lo:hi]ᵀ · inp[lo:hi]
//
// for each expert e with rows [lo, hi) = [offsets[e], offsets[e+1]),
// n = hi − lo; an expert with no rows is skipped (its dweight untouched).
// Each expert's product is Matmul's tiled GEMM over the pool (fixed tiles,
// each summing its whole K range in order): thread-count invariant, and a
// row's out and dinp are what Matmul gives that row alone.

import (
	"fmt"

	"github.com/tracegrpo/tracegrpo/kernels"
)

// groupRanges checks offsets (E+1) against N rows and returns them; what
// names them (a constant: the common path allocates nothing).
func (b *Backend) groupRanges(what string, offsets kernels.Buf, N, E int) []int32 {
	off := b.i32n(offsets, E+1, what)
	ok := off[0] == 0 && int(off[E]) == N
	for e := 0; ok && e < E; e++ {
		ok = off[e] <= off[e+1]
	}
	if !ok {
		panic(fmt.Sprintf("cpu: %s %v do not split %d rows among %d experts (run ExpertRoute first)", what, off, N, E))
	}
	return off
}

// GroupedMatmul implements kernels.Experts.
// Shapes: out (N,OC), inp (N,C), weight (E,OC,C), offsets (E+1) I32.
func (b *Backend) GroupedMatmul(out, inp, weight, offsets kernels.Buf, N, C, OC, E int) {
	same("GroupedMatmul inp, weight", inp, weight)
	off := b.groupRanges("GroupedMatmul offsets", offsets, N, E)
	o := b.out(out, N*OC, "GroupedMatmul out")
	x := b.in(inp, N*C, "GroupedMatmul inp")
	w := b.in(weight, E*OC*C, "GroupedMatmul weight")
	for e := 0; e < E; e++ {
		lo, hi := int(off[e]), int(off[e+1])
		if hi == lo {
			continue
		}
		b.parallelGemm(false, true, hi-lo, OC, C, x[lo*C:], C, w[e*OC*C:], C, o[lo*OC:], OC, false)
	}
	b.done(out, o)
}

// GroupedMatmulBackward implements kernels.Experts.
// Shapes: dinp (N,C) or empty, dweight (E,OC,C) or empty, dout (N,OC),
// inp (N,C), weight (E,OC,C), offsets (E+1) I32.
func (b *Backend) GroupedMatmulBackward(dinp, dweight, dout, inp, weight, offsets kernels.Buf, N, C, OC, E int) {
	dx := b.f32opt(dinp, N*C, "GroupedMatmulBackward dinp")
	dw := b.f32opt(dweight, E*OC*C, "GroupedMatmulBackward dweight")
	if dx == nil && dw == nil {
		return
	}
	off := b.groupRanges("GroupedMatmulBackward offsets", offsets, N, E)
	d := b.in(dout, N*OC, "GroupedMatmulBackward dout")
	var w, x []float32
	if dx != nil {
		same("GroupedMatmulBackward dout, weight", dout, weight)
		w = b.in(weight, E*OC*C, "GroupedMatmulBackward weight")
	}
	if dw != nil {
		same("GroupedMatmulBackward dout, inp", dout, inp)
		x = b.in(inp, N*C, "GroupedMatmulBackward inp")
	}
	for e := 0; e < E; e++ {
		lo, hi := int(off[e]), int(off[e+1])
		if hi == lo {
			continue
		}
		if dx != nil {
			b.parallelGemm(false, false, hi-lo, C, OC, d[lo*OC:], OC, w[e*OC*C:], C, dx[lo*C:], C, true)
		}
		if dw != nil {
			b.parallelGemm(true, false, OC, C, hi-lo, d[lo*OC:], OC, x[lo*C:], C, dw[e*OC*C:], C, true)
		}
	}
}
