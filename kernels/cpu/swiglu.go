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
	ws                        []wscratch
	out, gate, up, dgate, dup []float32 // all (N)
	bwd                       bool
}

func (t *swigluTask) run(w, lo, hi int) {
	if useVecExp {
		// σ(g) = 1/(1+exp(−g)) with exp(−g) from the vector exp.
		e := t.ws[w].get(slotRow, hi-lo)
		copy(e, t.gate[lo:hi])
		expScaleShift(e, -1, 0)
		if t.bwd {
			swigluBackward32(t.dgate[lo:hi], t.dup[lo:hi], t.out[lo:hi], t.gate[lo:hi], t.up[lo:hi], e)
		} else {
			swiglu32(t.out[lo:hi], t.gate[lo:hi], t.up[lo:hi], e)
		}
		return
	}
	if t.bwd {
		swigluBackwardRange(t.dgate[lo:hi], t.dup[lo:hi], t.out[lo:hi], t.gate[lo:hi], t.up[lo:hi])
		return
	}
	swigluRange(t.out[lo:hi], t.gate[lo:hi], t.up[lo:hi])
}

// swiglu32 is swigluRange given en = exp(−gate).
func swiglu32(out, gate, up, en []float32) {
	gate, up, en = gate[:len(out)], up[:len(out)], en[:len(out)]
	for i := range out {
		s := 1 / (1 + en[i])
		out[i] = gate[i] * s * up[i]
	}
}

// swigluBackward32 is swigluBackwardRange given en = exp(−gate). dout may
// alias neither output.
func swigluBackward32(dgate, dup, dout, gate, up, en []float32) {
	n := len(dout)
	dgate, dup, gate, up, en = dgate[:n], dup[:n], gate[:n], up[:n], en[:n]
	for i := range dout {
		g := gate[i]
		s := 1 / (1 + en[i])
		silu := g * s
		dgate[i] = dout[i] * up[i] * (s * (1 + g*(1-s)))
		dup[i] = dout[i] * silu
	}
}

// SwiGLU implements kernels.Ops.
// Shapes: out, gate, up (N).
func (b *Backend) SwiGLU(out, gate, up kernels.Buf, N int) {
	same("SwiGLU gate, up", gate, up)
	o := b.out(out, N, "SwiGLU out")
	t := &b.tasks.swiglu
	*t = swigluTask{ws: b.scratch.w, out: o, gate: b.in(gate, N, "SwiGLU gate"), up: b.in(up, N, "SwiGLU up")}
	b.pool.parallel(t, N, elemGrain)
	*t = swigluTask{}
	b.done(out, o)
}

// SwiGLUBackward implements kernels.Ops. (The task's out field carries dout.)
// Shapes: dgate, dup, dout, gate, up (N).
func (b *Backend) SwiGLUBackward(dgate, dup, dout, gate, up kernels.Buf, N int) {
	same("SwiGLUBackward gate, up", gate, up)
	t := &b.tasks.swiglu
	*t = swigluTask{
		ws:    b.scratch.w,
		dgate: b.f32n(dgate, N, "SwiGLUBackward dgate"), dup: b.f32n(dup, N, "SwiGLUBackward dup"),
		out: b.f32n(dout, N, "SwiGLUBackward dout"), gate: b.in(gate, N, "SwiGLUBackward gate"),
		up: b.in(up, N, "SwiGLUBackward up"), bwd: true,
	}
	b.pool.parallel(t, N, elemGrain)
	*t = swigluTask{}
}
