package cpu

// ExpertCombine: the inverse permutation with the routing weights
// (kernels.Experts), and its backward.
//
//	forward:  out (T,C) = Σ_j weights[t,j] · y[slot[t·K + j]], j in order =
//	backward: dy (N,C)  = weights[i] · dout[i / K], i = order[p]          =
//	          dweights (T,K) = dout[t] · y[slot[t·K + j]] (a dot product   =
//	                          over C, summed left to right)
//
// Split by output row (token for out and dweights, position for dy):
// thread-count invariant.

import "github.com/tracegrpo/tracegrpo/kernels"

type combineTask struct {
	out, y, weights []float32 // forward: (T,C), (N,C), (T,K)
	dy, dw, dout    []float32 // backward: (N,C), (T,K), (T,C)
	order, slot     []int32
	K, C            int
	phase           int // 0 forward, 1 dy, 2 dweights
}

func (t *combineTask) run(_, lo, hi int) {
	C, K := t.C, t.K
	for r := lo; r < hi; r++ {
		switch t.phase {
		case 0:
			o := t.out[r*C : (r+1)*C]
			clear(o)
			for j := 0; j < K; j++ {
				p := int(t.slot[r*K+j])
				w := t.weights[r*K+j]
				s := t.y[p*C : (p+1)*C]
				for c := range o {
					o[c] += w * s[c]
				}
			}
		case 1:
			i := int(t.order[r])
			w := t.weights[i]
			d := t.dout[(i/K)*C : (i/K+1)*C]
			o := t.dy[r*C : (r+1)*C]
			for c := range o {
				o[c] = w * d[c]
			}
		case 2:
			d := t.dout[r*C : (r+1)*C]
			for j := 0; j < K; j++ {
				p := int(t.slot[r*K+j])
				s := t.y[p*C : (p+1)*C]
				var acc float32
				for c, v := range d {
					acc += v * s[c]
				}
				t.dw[r*K+j] = acc
			}
		}
	}
}

// ExpertCombine implements kernels.Experts.
// Shapes: out (T,C), y (N,C), weights (T,K), slot (N) I32.
func (b *Backend) ExpertCombine(out, y, weights, slot kernels.Buf, T, K, C int) {
	N := T * K
	sl := b.i32n(slot, N, "ExpertCombine slot")
	checkPerm("ExpertCombine slot", sl, N)
	t := &b.tasks.combine
	*t = combineTask{out: b.f32n(out, T*C, "ExpertCombine out"), y: b.f32n(y, N*C, "ExpertCombine y"),
		weights: b.f32n(weights, T*K, "ExpertCombine weights"), slot: sl, K: K, C: C}
	b.pool.parallel(t, T, gatherRowGrain)
	*t = combineTask{}
}

// ExpertCombineBackward implements kernels.Experts.
// Shapes: dy (N,C) F32|BF16, dweights (T,K), dout (T,C), y (N,C),
// weights (T,K), order (N) I32, slot (N) I32.
func (b *Backend) ExpertCombineBackward(dy, dweights, dout, y, weights, order, slot kernels.Buf, T, K, C int) {
	N := T * K
	ord := b.i32n(order, N, "ExpertCombineBackward order")
	sl := b.i32n(slot, N, "ExpertCombineBackward slot")
	checkPerm("ExpertCombineBackward order", ord, N)
	checkPerm("ExpertCombineBackward slot", sl, N)
	t := &b.tasks.combine
	*t = combineTask{dy: b.out(dy, N*C, "ExpertCombineBackward dy"), dw: b.f32n(dweights, T*K, "ExpertCombineBackward dweights"),
		dout: b.f32n(dout, T*C, "ExpertCombineBackward dout"), y: b.f32n(y, N*C, "ExpertCombineBackward y"),
		weights: b.f32n(weights, T*K, "ExpertCombineBackward weights"), order: ord, slot: sl, K: K, C: C, phase: 1}
	b.pool.parallel(t, N, gatherRowGrain)
	t.phase = 2
	b.pool.parallel(t, T, gatherRowGrain)
	b.done(dy, t.dy)
	*t = combineTask{}
}
