package cpu

// CopyCols: the strided 2-D copy that splits a fused projection's output
// into its parts and packs their gradients back.
//
//	CopyCols:  dst[r·dstStride + j] = src[r·srcStride + j]   =
//	           for r < R, j < W, in dst's dtype (Convert's rounding)
//
// Each element is converted on its own: thread-count invariant.

import "github.com/tracegrpo/tracegrpo/kernels"

type copyColsTask struct {
	w, dstStride, srcStride int
	df32, sf32              []float32 // the F32 side(s), else nil
	dbf, sbf                []uint16  // the BF16 side(s), else nil
}

func (t *copyColsTask) run(_, lo, hi int) {
	W := t.w
	for r := lo; r < hi; r++ {
		do, so := r*t.dstStride, r*t.srcStride
		switch {
		case t.df32 != nil && t.sf32 != nil:
			copy(t.df32[do:do+W], t.sf32[so:so+W])
		case t.dbf != nil && t.sbf != nil:
			copy(t.dbf[do:do+W], t.sbf[so:so+W])
		case t.dbf != nil:
			d, s := t.dbf[do:do+W], t.sf32[so:so+W]
			for j, x := range s {
				d[j] = F32ToBF16(x)
			}
		default:
			d, s := t.df32[do:do+W], t.sbf[so:so+W]
			for j, x := range s {
				d[j] = BF16ToF32(x)
			}
		}
	}
}

// CopyCols implements kernels.Ops.
// Shapes: dst rows of W elements dstStride apart, src rows srcStride apart,
// R rows; F32 or BF16 each.
func (b *Backend) CopyCols(dst, src kernels.Buf, R, W, dstStride, srcStride int) {
	kernels.CheckCopyCols("cpu", dst, src, R, W, dstStride, srcStride)
	if R == 0 || W == 0 {
		return
	}
	t := &b.tasks.copyCols
	*t = copyColsTask{w: W, dstStride: dstStride, srcStride: srcStride}
	if dst.DType == kernels.F32 {
		t.df32 = b.F32(dst)
	} else {
		t.dbf = b.BF16(dst)
	}
	if src.DType == kernels.F32 {
		t.sf32 = b.F32(src)
	} else {
		t.sbf = b.BF16(src)
	}
	b.pool.parallel(t, R, max(1, elemGrain/W))
	*t = copyColsTask{}
}
