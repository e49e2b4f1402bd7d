//go:build cgo

package cuda

// Fill, Copy and Scale: csrc/fill.cu (Copy is a device-to-device cuMemcpy).

import (
	"fmt"

	"github.com/tracegrpo/tracegrpo/kernels"
)

// Fill implements kernels.Ops: x = v.
func (b *Backend) Fill(x kernels.Buf, v float32) {
	want(x, kernels.F32, x.N, "Fill x")
	defer b.lock()()
	b.elementwise("fill", rw(nil, x).with(0, 16), x.N, pa(x), fa(v), la(x.N))
}

// Copy implements kernels.Ops: dst = src (any dtype, same length).
func (b *Backend) Copy(dst, src kernels.Buf) {
	if dst.DType != src.DType || dst.N != src.N {
		panic(fmt.Sprintf("cuda: Copy of %d × %s into %d × %s", src.N, src.DType, dst.N, dst.DType))
	}
	defer b.lock()()
	b.copyDtoD(ptr(dst), ptr(src), src.N*src.DType.Size())
}

// Scale implements kernels.Ops: x *= s.
func (b *Backend) Scale(x kernels.Buf, s float32) {
	want(x, kernels.F32, x.N, "Scale x")
	defer b.lock()()
	b.elementwise("scale", rw(reads(x), x).with(int64(x.N), 16), x.N, pa(x), fa(s), la(x.N))
}
