//go:build cgo

package cuda

// Rope and RopeBackward: csrc/rope.cu.

import (
	"fmt"

	"github.com/tracegrpo/tracegrpo/kernels"
)

func (b *Backend) rope(op string, x, pos kernels.Buf, T, H, HD int, theta, sign float32) {
	if HD%2 != 0 {
		panic(fmt.Sprintf("cuda: %s: odd head dimension %d", op, HD))
	}
	want(x, kernels.F32, T*H*HD, op+" x")
	want(pos, kernels.I32, T, op+" pos")
	defer b.lock()()
	b.elementwise("rope", T*H*HD/2, pa(x), pa(pos), ia(T), ia(H), ia(HD), fa(theta), fa(sign))
}

// Rope implements kernels.Ops: x (T,H,HD) rotated in place by pos (T).
func (b *Backend) Rope(x, pos kernels.Buf, T, H, HD int, theta float32) {
	b.rope("Rope", x, pos, T, H, HD, theta, 1)
}

// RopeBackward implements kernels.Ops: dx (T,H,HD) rotated back in place.
func (b *Backend) RopeBackward(dx, pos kernels.Buf, T, H, HD int, theta float32) {
	b.rope("RopeBackward", dx, pos, T, H, HD, theta, -1)
}
