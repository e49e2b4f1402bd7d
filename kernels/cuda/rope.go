//go:build cgo

package cuda

// Rope and RopeBackward: csrc/rope.cu.

import (
	"fmt"

	"github.com/tracegrpo/tracegrpo/kernels"
)

func (b *Backend) rope(op string, x, pos, cos, sin kernels.Buf, T, H, HD int, sign float32) {
	if HD%2 != 0 || HD <= 0 {
		panic(fmt.Sprintf("cuda: %s: head dimension %d is not even and positive", op, HD))
	}
	half := HD / 2
	if cos.N != sin.N || cos.N%half != 0 || cos.DType != kernels.F32 || sin.DType != kernels.F32 {
		panic(fmt.Sprintf("cuda: %s: cos (%d × %s) and sin (%d × %s) are not both (P, %d) F32", op, cos.N, cos.DType, sin.N, sin.DType, half))
	}
	want(x, kernels.F32, T*H*HD, op+" x")
	want(pos, kernels.I32, T, op+" pos")
	defer b.lock()()
	b.elementwise("rope", T*H*half, pa(x), pa(pos), pa(cos), pa(sin), ia(T), ia(H), ia(HD), ia(cos.N/half), fa(sign), pu(b.flags))
}

// Rope implements kernels.Ops: x (T,H,HD) rotated in place by pos (T) with
// the angles of tables cos, sin (P, HD/2).
func (b *Backend) Rope(x, pos, cos, sin kernels.Buf, T, H, HD int) {
	b.rope("Rope", x, pos, cos, sin, T, H, HD, 1)
}

// RopeBackward implements kernels.Ops: dx (T,H,HD) rotated back in place.
func (b *Backend) RopeBackward(dx, pos, cos, sin kernels.Buf, T, H, HD int) {
	b.rope("RopeBackward", dx, pos, cos, sin, T, H, HD, -1)
}
