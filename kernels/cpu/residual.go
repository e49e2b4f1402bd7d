package cpu

// Residual add and gradient accumulation.
//
//	Add:        out (N) = a (N) + b (N)   (out may alias a or b)
//	Accumulate: dst (N) += src (N)
//
// Elementwise: thread-count invariant.

import "github.com/tracegrpo/tracegrpo/kernels"

type addTask struct {
	out, a, b []float32 // (N)
}

func (t *addTask) run(_, lo, hi int) {
	addRange(t.out[lo:hi], t.a[lo:hi], t.b[lo:hi])
}

func addRange[F Float](out, a, b []F) {
	a = a[:len(out)]
	b = b[:len(out)]
	for i := range out {
		out[i] = a[i] + b[i]
	}
}

// Add implements kernels.Ops.
// Shapes: out (N), a (N), b (N).
func (b *Backend) Add(out, x, y kernels.Buf, N int) {
	t := &b.tasks.add
	*t = addTask{out: b.f32n(out, N, "Add out"), a: b.f32n(x, N, "Add a"), b: b.f32n(y, N, "Add b")}
	b.pool.parallel(t, N, elemGrain)
	*t = addTask{}
}

// Accumulate implements kernels.Ops.
// Shapes: dst (N), src (N).
func (b *Backend) Accumulate(dst, src kernels.Buf, N int) {
	d := b.f32n(dst, N, "Accumulate dst")
	t := &b.tasks.add
	*t = addTask{out: d, a: d, b: b.f32n(src, N, "Accumulate src")}
	b.pool.parallel(t, N, elemGrain)
	*t = addTask{}
}
