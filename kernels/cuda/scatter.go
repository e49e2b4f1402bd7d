//go:build cgo

package cuda

// ScatterRows: csrc/scatter.cu.

import (
	"fmt"

	"github.com/tracegrpo/tracegrpo/kernels"
)

// ScatterRows implements kernels.Ops: dst[idx[i], :] = src[i, :], src (N,W);
// dst and src F32|BF16 (converted).
func (b *Backend) ScatterRows(dst, src, idx kernels.Buf, N, W int) {
	if W <= 0 || dst.N%W != 0 {
		panic(fmt.Sprintf("cuda: ScatterRows: dst of %d elements is not (R, %d)", dst.N, W))
	}
	operands("ScatterRows dst", dst)
	operands("ScatterRows src", src)
	want(src, src.DType, N*W, "ScatterRows src")
	want(idx, kernels.I32, N, "ScatterRows idx")
	if N == 0 {
		return
	}
	name := scatterKernels[[2]kernels.DType{dst.DType, src.DType}]
	defer b.lock()()
	c := rw(reads(src, idx)).plus(0, int64(N)*int64(W)*int64(dst.DType.Size()))
	b.launch(name, c, b.rowBlocks(N), 1, 1, normThreads(W*8), 0, pa(dst), pa(src), pa(idx), ia(N), ia(W), ia(dst.N/W), pu(b.flags))
}

// scatterKernels names ScatterRows' kernel by (dst, src) dtype (built once:
// the sampler scatters twice per layer per decoded token).
var scatterKernels = map[[2]kernels.DType]string{
	{kernels.F32, kernels.F32}: "scatter_rows", {kernels.BF16, kernels.F32}: "scatter_rows_bf16_f32",
	{kernels.BF16, kernels.BF16}: "scatter_rows_bf16_bf16", {kernels.F32, kernels.BF16}: "scatter_rows_f32_bf16",
}
