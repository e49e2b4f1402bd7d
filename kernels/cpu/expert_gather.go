package cpu

// ExpertGather: a sparse layer's input rows in expert-contiguous order
// (kernels.Experts), and its backward.
//
//	forward:  dst (N,C) = src (T,C) [order[p] / K]                        =
//	backward: dsrc (T,C) += Σ_j ddst[slot[t·K + j]], j = 0..K−1          +=
//
// Both are split by output row; each backward row sums its K rows in j
// order: thread-count invariant.

import (
	"fmt"

	"github.com/tracegrpo/tracegrpo/kernels"
)

const gatherRowGrain = 32

type gatherTask struct {
	dst, src   []float32 // forward: (N,C), (T,C); backward: dsrc (T,C), ddst (N,C)
	idx        []int32   // forward: order (N); backward: slot (N)
	K, C, T, N int
	bwd        bool
}

func (t *gatherTask) run(_, lo, hi int) {
	C, K := t.C, t.K
	for r := lo; r < hi; r++ {
		if !t.bwd {
			tok := int(t.idx[r]) / K
			copy(t.dst[r*C:(r+1)*C], t.src[tok*C:(tok+1)*C])
			continue
		}
		d := t.dst[r*C : (r+1)*C]
		for j := 0; j < K; j++ {
			p := int(t.idx[r*K+j])
			s := t.src[p*C : (p+1)*C]
			for c := range d {
				d[c] += s[c]
			}
		}
	}
}

func checkPerm(op string, idx []int32, N int) {
	for i, p := range idx {
		if p < 0 || int(p) >= N {
			panic(fmt.Sprintf("cpu: %s: index %d at %d is outside [0, %d): not an ExpertRoute permutation", op, p, i, N))
		}
	}
}

// ExpertGather implements kernels.Experts.
// Shapes: dst (N,C) F32|BF16, src (T,C) F32|BF16, order (N) I32.
func (b *Backend) ExpertGather(dst, src, order kernels.Buf, T, K, C int) {
	N := T * K
	ord := b.i32n(order, N, "ExpertGather order")
	checkPerm("ExpertGather order", ord, N)
	t := &b.tasks.gather
	*t = gatherTask{dst: b.out(dst, N*C, "ExpertGather dst"), src: b.in(src, T*C, "ExpertGather src"), idx: ord, K: K, C: C, T: T, N: N}
	b.pool.parallel(t, N, gatherRowGrain)
	b.done(dst, t.dst)
	*t = gatherTask{}
}

// ExpertGatherBackward implements kernels.Experts.
// Shapes: dsrc (T,C), ddst (N,C), slot (N) I32.
func (b *Backend) ExpertGatherBackward(dsrc, ddst, slot kernels.Buf, T, K, C int) {
	N := T * K
	sl := b.i32n(slot, N, "ExpertGatherBackward slot")
	checkPerm("ExpertGatherBackward slot", sl, N)
	t := &b.tasks.gather
	*t = gatherTask{dst: b.f32n(dsrc, T*C, "ExpertGatherBackward dsrc"), src: b.f32n(ddst, N*C, "ExpertGatherBackward ddst"),
		idx: sl, K: K, C: C, T: T, N: N, bwd: true}
	b.pool.parallel(t, T, gatherRowGrain)
	*t = gatherTask{}
}
