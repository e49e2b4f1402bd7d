//go:build cgo

package cuda

// Convert: csrc/cast.cu (f32_to_bf16, bf16_to_f32).

import (
	"fmt"

	"github.com/tracegrpo/tracegrpo/kernels"
)

// Convert implements kernels.Ops: dst (N) = src (N) in dst's dtype (F32 and
// BF16; F32 → BF16 rounds to nearest even).
func (b *Backend) Convert(dst, src kernels.Buf) {
	if dst.N != src.N {
		panic(fmt.Sprintf("cuda: Convert of %d elements into %d", src.N, dst.N))
	}
	defer b.lock()()
	switch {
	case dst.DType == src.DType && (dst.DType == kernels.F32 || dst.DType == kernels.BF16):
		if dst.N > 0 && ptr(dst) != ptr(src) {
			b.copyDtoD(ptr(dst), ptr(src), dst.N*dst.DType.Size())
		}
	case dst.DType == kernels.BF16 && src.DType == kernels.F32:
		b.elementwise("f32_to_bf16", rw(reads(src), dst).with(0, 32), dst.N, pa(dst), pa(src), la(dst.N))
	case dst.DType == kernels.F32 && src.DType == kernels.BF16:
		b.elementwise("bf16_to_f32", rw(reads(src), dst).with(0, 16), dst.N, pa(dst), pa(src), la(dst.N))
	default:
		panic(fmt.Sprintf("cuda: Convert %s → %s", src.DType, dst.DType))
	}
}
