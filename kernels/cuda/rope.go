//go:build cgo

package cuda

// Rope, RopeBackward, RopeConvert and QKNormRope: csrc/rope.cu.

import (
	"fmt"

	"github.com/tracegrpo/tracegrpo/kernels"
)

// ropeCheck checks the arguments and returns the tables' positions P.
func ropeCheck(op string, x, pos, cos, sin kernels.Buf, T, H, HD int) int {
	if HD%2 != 0 || HD <= 0 {
		panic(fmt.Sprintf("cuda: %s: head dimension %d is not even and positive", op, HD))
	}
	half := HD / 2
	if cos.N != sin.N || cos.N%half != 0 || cos.DType != kernels.F32 || sin.DType != kernels.F32 {
		panic(fmt.Sprintf("cuda: %s: cos (%d × %s) and sin (%d × %s) are not both (P, %d) F32", op, cos.N, cos.DType, sin.N, sin.DType, half))
	}
	want(x, kernels.F32, T*H*HD, op+" x")
	want(pos, kernels.I32, T, op+" pos")
	return cos.N / half
}

// ropeBlocks is the grid of the warp-per-row rope kernels over T·H rows.
func (b *Backend) ropeBlocks(T, H int) int {
	return b.gridBlocks(max(1, min(ceilDiv(T*H, threads/32), 32*b.d.info.SMs)))
}

// ropeTableBytes is the cos and sin rows T positions read: at most T rows
// of HD/2 each (the rows of the positions present, shared by the heads).
func ropeTableBytes(T, HD int) int64 { return 2 * int64(T) * int64(HD/2) * 4 }

func (b *Backend) rope(op string, x, pos, cos, sin kernels.Buf, T, H, HD int, sign float32) {
	P := ropeCheck(op, x, pos, cos, sin, T, H, HD)
	if T*H == 0 {
		return
	}
	defer b.lock()()
	b.launch("rope", rw(reads(x, pos), x).plus(ropeTableBytes(T, HD), 0).with(3*int64(T)*int64(H)*int64(HD), 0), b.ropeBlocks(T, H), 1, 1, threads, 0, pa(x), pa(pos), pa(cos), pa(sin), ia(T), ia(H), ia(HD), ia(P), fa(sign), pu(b.flags))
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

// RopeConvert implements kernels.RopeConverter: out (T,H,HD) F32|BF16 =
// x (T,H,HD) rotated (x unchanged).
func (b *Backend) RopeConvert(out, x, pos, cos, sin kernels.Buf, T, H, HD int) {
	P := ropeCheck("RopeConvert", x, pos, cos, sin, T, H, HD)
	operands("RopeConvert out", out)
	want(out, out.DType, T*H*HD, "RopeConvert out")
	if T*H == 0 {
		return
	}
	name := "rope_f32out"
	if out.DType == kernels.BF16 {
		name = "rope_bf16out"
	}
	defer b.lock()()
	b.launch(name, rw(reads(x, pos), out).plus(ropeTableBytes(T, HD), 0).with(3*int64(T)*int64(H)*int64(HD), 0), b.ropeBlocks(T, H), 1, 1, threads, 0, pa(out), pa(x), pa(pos), pa(cos), pa(sin), ia(T), ia(H), ia(HD), ia(P), pu(b.flags))
}

var _ kernels.RopeConverter = (*Backend)(nil)

// QKNormRope implements kernels.QKNormRoper: q, k (normed, rotated) and v
// (T,·,HD) F32|BF16, qraw, kraw, qrstd, krstd F32, from qkv
// (T,(NH+2·NKV)·HD) F32 in one launch.
func (b *Backend) QKNormRope(q, k, v, qraw, kraw, qrstd, krstd, qkv, qw, kw, pos, cos, sin kernels.Buf, T, NH, NKV, HD int, eps float32) {
	H3 := NH + 2*NKV
	P := ropeCheck("QKNormRope", qkv, pos, cos, sin, T, H3, HD)
	dt := operands("QKNormRope q, k, v", q, k, v)
	want(q, dt, T*NH*HD, "QKNormRope q")
	want(k, dt, T*NKV*HD, "QKNormRope k")
	want(v, dt, T*NKV*HD, "QKNormRope v")
	want(qraw, kernels.F32, T*NH*HD, "QKNormRope qraw")
	want(kraw, kernels.F32, T*NKV*HD, "QKNormRope kraw")
	want(qrstd, kernels.F32, T*NH, "QKNormRope qrstd")
	want(krstd, kernels.F32, T*NKV, "QKNormRope krstd")
	want(qw, kernels.F32, HD, "QKNormRope qw")
	want(kw, kernels.F32, HD, "QKNormRope kw")
	if T == 0 {
		return
	}
	name := "qk_norm_rope_f32out"
	if dt == kernels.BF16 {
		name = "qk_norm_rope_bf16out"
	}
	// Per q/k element: the square and its sum, the norm's two products,
	// the rotation's two products and a sum. In flight: the first loop's
	// four 4-byte loads a lane (unrolled by 4).
	flops := 7 * int64(T) * int64(NH+NKV) * int64(HD)
	c := rw(reads(qkv, qw, kw, pos), q, k, v, qraw, kraw, qrstd, krstd).plus(ropeTableBytes(T, HD), 0).with(flops, 16)
	defer b.lock()()
	b.launch(name, c, b.ropeBlocks(T, H3), 1, 1, threads, 0, pa(q), pa(k), pa(v), pa(qraw), pa(kraw), pa(qrstd), pa(krstd),
		pa(qkv), pa(qw), pa(kw), pa(pos), pa(cos), pa(sin), ia(T), ia(NH), ia(NKV), ia(HD), ia(P), fa(eps), pu(b.flags))
}

var _ kernels.QKNormRoper = (*Backend)(nil)
