package cpu

// ExpertRoute: the permutation of a sparse layer's assignments to
// expert-contiguous order (kernels.Experts), a stable counting sort.
//
//	offsets (E+1) = offsets[e] = Σ_{e'<e} |{i : experts[i] = e'}|        =
//	order (N)     = assignments i = t·K + j by expert, ascending i within  =
//	slot (N)      = slot[order[p]] = p                                     =
//
// N = T·K. Integer work, one pass to count and one to place, on one
// thread: exact and order-independent. An expert id outside [0, E) is a
// data error (sticky, reported at Sync) and the assignment goes to expert
// 0, so that the outputs stay a permutation the later ops read safely.

import (
	"fmt"

	"github.com/tracegrpo/tracegrpo/kernels"
)

// ExpertRoute implements kernels.Experts.
// Shapes: offsets (E+1) I32, order (N) I32, slot (N) I32, experts (T,K) I32.
func (b *Backend) ExpertRoute(offsets, order, slot, experts kernels.Buf, T, K, E int) {
	if T < 0 || K < 1 || E < 1 {
		panic(fmt.Sprintf("cpu: ExpertRoute: T=%d K=%d E=%d", T, K, E))
	}
	N := T * K
	off := b.i32n(offsets, E+1, "ExpertRoute offsets")
	ord := b.i32n(order, N, "ExpertRoute order")
	sl := b.i32n(slot, N, "ExpertRoute slot")
	ex := b.i32n(experts, N, "ExpertRoute experts")
	clear(off)
	expert := func(i int) int32 {
		if e := ex[i]; e >= 0 && int(e) < E {
			return e
		}
		return 0 // a data error (reported below): routed to expert 0, the outputs stay a permutation
	}
	for i, e := range ex {
		if e < 0 || int(e) >= E {
			b.fail("ExpertRoute: assignment %d (token %d) names expert %d, outside [0, %d)", i, i/K, e, E)
		}
		off[expert(i)+1]++
	}
	for e := 0; e < E; e++ {
		off[e+1] += off[e]
	}
	// Place each assignment at its expert's cursor (E ints, kept).
	if cap(b.routeCursor) < E {
		b.routeCursor = make([]int32, E)
	}
	cur := b.routeCursor[:E]
	copy(cur, off[:E])
	for i := range ex {
		e := expert(i)
		p := cur[e]
		cur[e]++
		ord[p] = int32(i)
		sl[i] = p
	}
}
