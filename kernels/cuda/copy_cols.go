//go:build cgo

package cuda

// CopyCols: csrc/copy_cols.cu.

import "github.com/tracegrpo/tracegrpo/kernels"

// CopyCols implements kernels.Ops: dst[r·dstStride + j] = src[r·srcStride + j]
// for r < R, j < W, each side F32 or BF16.
func (b *Backend) CopyCols(dst, src kernels.Buf, R, W, dstStride, srcStride int) {
	kernels.CheckCopyCols("cuda", dst, src, R, W, dstStride, srcStride)
	if R == 0 || W == 0 {
		return
	}
	defer b.lock()()
	// A block per row (striding over rows), its threads over the columns.
	n := int64(R) * int64(W)
	c := cost{read: n * int64(src.DType.Size()), write: n * int64(dst.DType.Size())}
	b.launch("copy_cols_"+dst.DType.String()+"_"+src.DType.String(), c, b.gridBlocks(min(R, 32*b.d.info.SMs)), 1, 1, threads, 0,
		pa(dst), pa(src), la(R), la(W), la(dstStride), la(srcStride))
}
