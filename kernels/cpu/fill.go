package cpu

// Fill, Copy and Scale: elementwise ops on one buffer.
//
//	Fill:  x (N) = v
//	Copy:  dst (N) = src (N)
//	Scale: x (N) *= s
//
// Each element is written once by one grain: thread-count invariant.

import (
	"fmt"

	"github.com/tracegrpo/tracegrpo/kernels"
)

type fillTask struct {
	x, src []float32 // (N)
	v      float32
	mode   int // 0 fill, 1 copy, 2 scale
}

func (t *fillTask) run(_, lo, hi int) {
	x := t.x[lo:hi]
	switch t.mode {
	case 0:
		for i := range x {
			x[i] = t.v
		}
	case 1:
		copy(x, t.src[lo:hi])
	case 2:
		scaleRange(x, t.v)
	}
}

func scaleRange[F Float](x []F, s F) {
	for i := range x {
		x[i] *= s
	}
}

// Fill implements kernels.Ops: x = v.
// Shapes: x (N).
func (b *Backend) Fill(x kernels.Buf, v float32) {
	xs := b.F32(x)
	b.tasks.fill = fillTask{x: xs, v: v, mode: 0}
	b.pool.parallel(&b.tasks.fill, len(xs), elemGrain)
	b.tasks.fill = fillTask{}
}

// Copy implements kernels.Ops: dst = src (same length and dtype).
// Shapes: dst (N), src (N), any dtype.
func (b *Backend) Copy(dst, src kernels.Buf) {
	if dst.N != src.N || dst.DType != src.DType {
		panic(fmt.Sprintf("cpu: Copy of %d %s into %d %s", src.N, src.DType, dst.N, dst.DType))
	}
	switch dst.DType {
	case kernels.I32:
		copy(b.I32(dst), b.I32(src))
		return
	case kernels.BF16:
		copy(b.BF16(dst), b.BF16(src))
		return
	}
	d, s := b.F32(dst), b.F32(src)
	b.tasks.fill = fillTask{x: d, src: s, mode: 1}
	b.pool.parallel(&b.tasks.fill, len(d), elemGrain)
	b.tasks.fill = fillTask{}
}

// Scale implements kernels.Ops: x *= s.
// Shapes: x (N).
func (b *Backend) Scale(x kernels.Buf, s float32) {
	xs := b.F32(x)
	b.tasks.fill = fillTask{x: xs, v: s, mode: 2}
	b.pool.parallel(&b.tasks.fill, len(xs), elemGrain)
	b.tasks.fill = fillTask{}
}
