package cpu

// SwiGLU: the gated MLP activation.
//
//	forward:  out (N) = silu(gate) · up,  silu(g) = g · σ(g)             =
//	backward: dgate (N) = dout · up · σ(g) · (1 + g·(1 − σ(g)))           =
//	          dup (N)   = dout · silu(g)                                   =
//
// SwiGLURows and SwiGLURowsBackward are the same over the gate|up GEMM's
// output as it lies (row r: I gate values, then I up values) and its
// gradient packed alike, one row a piece of work.
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
	out, gate, up, dgate, dup []float32 // all (N); by rows: gate (R,2I) is gu, dgate (R,2I) dgu
	bwd                       bool
	// I is the width of a row of SwiGLURows (0: SwiGLU's flat (N)); the
	// task's range is then rows.
	I int
}

func (t *swigluTask) run(w, lo, hi int) {
	if t.I == 0 {
		if t.bwd {
			t.span(w, t.out[lo:hi], t.gate[lo:hi], t.up[lo:hi], t.dgate[lo:hi], t.dup[lo:hi])
		} else {
			t.span(w, t.out[lo:hi], t.gate[lo:hi], t.up[lo:hi], nil, nil)
		}
		return
	}
	I := t.I
	for r := lo; r < hi; r++ {
		o, g := t.out[r*I:(r+1)*I], t.gate[2*r*I:(2*r+2)*I]
		if t.bwd {
			d := t.dgate[2*r*I : (2*r+2)*I]
			t.span(w, o, g[:I], g[I:], d[:I], d[I:])
		} else {
			t.span(w, o, g[:I], g[I:], nil, nil)
		}
	}
}

// span is the elementwise op over one piece: out = SwiGLU(gate, up), or,
// backward, out holds dout and dgate, dup are written.
func (t *swigluTask) span(w int, out, gate, up, dgate, dup []float32) {
	if useVecExp {
		// σ(g) = 1/(1+exp(−g)) with exp(−g) from the vector exp.
		e := t.ws[w].get(slotRow, len(out))
		copy(e, gate)
		expScaleShift(e, -1, 0)
		if t.bwd {
			swigluBackward32(dgate, dup, out, gate, up, e)
		} else {
			swiglu32(out, gate, up, e)
		}
		return
	}
	if t.bwd {
		swigluBackwardRange(dgate, dup, out, gate, up)
		return
	}
	swigluRange(out, gate, up)
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

// SwiGLURows implements kernels.Ops.
// Shapes: out (R,I), gu (R,2I).
func (b *Backend) SwiGLURows(out, gu kernels.Buf, R, I int) {
	o := b.out(out, R*I, "SwiGLURows out")
	t := &b.tasks.swiglu
	*t = swigluTask{ws: b.scratch.w, out: o, gate: b.in(gu, 2*R*I, "SwiGLURows gu"), I: I}
	if I > 0 {
		b.pool.parallel(t, R, max(1, elemGrain/I))
	}
	*t = swigluTask{}
	b.done(out, o)
}

// SwiGLURowsBackward implements kernels.Ops. (The task's out field carries
// dout, its dgate field dgu.)
// Shapes: dgu (R,2I), dout (R,I), gu (R,2I).
func (b *Backend) SwiGLURowsBackward(dgu, dout, gu kernels.Buf, R, I int) {
	d := b.out(dgu, 2*R*I, "SwiGLURowsBackward dgu")
	t := &b.tasks.swiglu
	*t = swigluTask{
		ws: b.scratch.w, dgate: d, out: b.f32n(dout, R*I, "SwiGLURowsBackward dout"),
		gate: b.in(gu, 2*R*I, "SwiGLURowsBackward gu"), bwd: true, I: I,
	}
	if I > 0 {
		b.pool.parallel(t, R, max(1, elemGrain/I))
	}
	*t = swigluTask{}
	b.done(dgu, d)
}
