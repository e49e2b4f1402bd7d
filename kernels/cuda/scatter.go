//go:build cgo

package cuda

// ScatterRows: csrc/scatter.cu.

import (
	"fmt"

	"github.com/tracegrpo/tracegrpo/kernels"
)

// ScatterRows implements kernels.Ops: dst[idx[i], :] = src[i, :], src (N,W).
func (b *Backend) ScatterRows(dst, src, idx kernels.Buf, N, W int) {
	if W <= 0 || dst.N%W != 0 || dst.DType != kernels.F32 {
		panic(fmt.Sprintf("cuda: ScatterRows: dst of %d × %s is not (R, %d) F32", dst.N, dst.DType, W))
	}
	want(src, kernels.F32, N*W, "ScatterRows src")
	want(idx, kernels.I32, N, "ScatterRows idx")
	defer b.lock()()
	b.elementwise("scatter_rows", N*W, pa(dst), pa(src), pa(idx), ia(N), ia(W), ia(dst.N/W), pu(b.flags))
}
