package cpu

// SwiGLU: the gated MLP activation.
//
//	forward:  out (N) = silu(gate) · up,  silu(g) = g · σ(g)             =
//	backward: dgate (N) = dout · up · σ(g) · (1 + g·(1 − σ(g)))           =
//	          dup (N)   = dout · silu(g)                                   =
//
// Elementwise: thread-count invariant.

import "github.com/tracegrpo/tracegrpo/kernels"

func swigluRange[F Float](out, gate, up []F) {
	gate = gate[:len(out)]
	up = up[:len(out)]
	for i := range out {
		g := gate[i]
		s := 1 / (1 + expF(-g))
		out[i] = g * s * up[i]
	}
}

func swigluBackwardRange[F Float](dgate, dup, dout, gate, up []F) {
	n := len(dout)
	dgate, dup, gate, up = dgate[:n], dup[:n], gate[:n], up[:n]
	for i := range dout {
		g := gate[i]
		s := 1 / (1 + expF(-g))
		silu := g * s
		dgate[i] = dout[i] * up[i] * (s * (1 + g*(1-s)))
		dup[i] = dout[i] * silu
	}
}

type swigluTask struct {
	out, gate, up, dgate, dup []float32 // all (N)
	bwd                       bool
}

func (t *swigluTask) run(_, lo, hi int) {
	if t.bwd {
		swigluBackwardRange(t.dgate[lo:hi], t.dup[lo:hi], t.out[lo:hi], t.gate[lo:hi], t.up[lo:hi])
		return
	}
	swigluRange(t.out[lo:hi], t.gate[lo:hi], t.up[lo:hi])
}

// SwiGLU implements kernels.Ops.
func (b *Backend) SwiGLU(out, gate, up kernels.Buf, N int) {
	t := &b.tasks.swiglu
	*t = swigluTask{out: b.f32n(out, N, "SwiGLU out"), gate: b.f32n(gate, N, "SwiGLU gate"), up: b.f32n(up, N, "SwiGLU up")}
	b.pool.parallel(t, N, elemGrain)
	*t = swigluTask{}
}

// SwiGLUBackward implements kernels.Ops. (The task's out field carries dout.)
func (b *Backend) SwiGLUBackward(dgate, dup, dout, gate, up kernels.Buf, N int) {
	t := &b.tasks.swiglu
	*t = swigluTask{
		dgate: b.f32n(dgate, N, "SwiGLUBackward dgate"), dup: b.f32n(dup, N, "SwiGLUBackward dup"),
		out: b.f32n(dout, N, "SwiGLUBackward dout"), gate: b.f32n(gate, N, "SwiGLUBackward gate"),
		up: b.f32n(up, N, "SwiGLUBackward up"), bwd: true,
	}
	b.pool.parallel(t, N, elemGrain)
	*t = swigluTask{}
}
