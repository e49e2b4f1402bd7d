package cpu

// ReLU2: the squared ReLU of Nemotron-H's MLPs and experts (kernels.Mamba).
//
//	forward:  out (N) = relu(inp)²                                     =
//	backward: dinp (N) = 2·relu(inp)·dout                              =
//
// Elementwise: thread-count invariant.

import "github.com/tracegrpo/tracegrpo/kernels"

type relu2Task struct {
	out, inp, dinp, dout []float32
	bwd                  bool
}

func (t *relu2Task) run(_, lo, hi int) {
	if t.bwd {
		for i := lo; i < hi; i++ {
			r := max(t.inp[i], 0)
			t.dinp[i] = 2 * r * t.dout[i]
		}
		return
	}
	for i := lo; i < hi; i++ {
		r := max(t.inp[i], 0)
		t.out[i] = r * r
	}
}

// ReLU2 implements kernels.Mamba.
// Shapes: out, inp (N), each F32|BF16.
func (b *Backend) ReLU2(out, inp kernels.Buf, N int) {
	o := b.out(out, N, "ReLU2 out")
	t := &b.tasks.relu2
	*t = relu2Task{out: o, inp: b.in(inp, N, "ReLU2 inp")}
	b.pool.parallel(t, N, elemGrain)
	*t = relu2Task{}
	b.done(out, o)
}

// ReLU2Backward implements kernels.Mamba.
// Shapes: dinp, dout (N) F32, inp (N) F32|BF16.
func (b *Backend) ReLU2Backward(dinp, dout, inp kernels.Buf, N int) {
	t := &b.tasks.relu2
	*t = relu2Task{dinp: b.f32n(dinp, N, "ReLU2Backward dinp"), dout: b.f32n(dout, N, "ReLU2Backward dout"),
		inp: b.in(inp, N, "ReLU2Backward inp"), bwd: true}
	b.pool.parallel(t, N, elemGrain)
	*t = relu2Task{}
}
