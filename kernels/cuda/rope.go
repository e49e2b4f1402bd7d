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

// QKNormRopeBackward implements kernels.QKNormRopeBackwarder: dqkv
// (T,(NH+2·NKV)·HD) F32|BF16 = the packed gradient from dq (T,NH,HD), dk,
// dv (T,NKV,HD) F32 (only read), through RoPE's backward and, with qw and
// kw (HD), the q/k norms' (dqw, dkw (HD) +=, through per-block partials
// that rmsnorm_dw_reduce adds in block order).
func (b *Backend) QKNormRopeBackward(dqkv, dqw, dkw, dq, dk, dv, qraw, kraw, qrstd, krstd, qw, kw, pos, cos, sin kernels.Buf, T, NH, NKV, HD int) {
	H3 := NH + 2*NKV
	if HD > kernels.QKNormRopeBackwardMaxHD {
		panic(fmt.Sprintf("cuda: QKNormRopeBackward: head dimension %d is above %d", HD, kernels.QKNormRopeBackwardMaxHD))
	}
	P := ropeCheck("QKNormRopeBackward", dq, pos, cos, sin, T, NH, HD)
	dt := operands("QKNormRopeBackward dqkv", dqkv)
	want(dqkv, dt, T*H3*HD, "QKNormRopeBackward dqkv")
	want(dk, kernels.F32, T*NKV*HD, "QKNormRopeBackward dk")
	want(dv, kernels.F32, T*NKV*HD, "QKNormRopeBackward dv")
	norm := qw.N > 0
	if norm {
		want(qw, kernels.F32, HD, "QKNormRopeBackward qw")
		want(kw, kernels.F32, HD, "QKNormRopeBackward kw")
		want(dqw, kernels.F32, HD, "QKNormRopeBackward dqw")
		want(dkw, kernels.F32, HD, "QKNormRopeBackward dkw")
		want(qraw, kernels.F32, T*NH*HD, "QKNormRopeBackward qraw")
		want(kraw, kernels.F32, T*NKV*HD, "QKNormRopeBackward kraw")
		want(qrstd, kernels.F32, T*NH, "QKNormRopeBackward qrstd")
		want(krstd, kernels.F32, T*NKV, "QKNormRopeBackward krstd")
	} else {
		for _, x := range []kernels.Buf{kw, dqw, dkw, qraw, kraw, qrstd, krstd} {
			if x.N != 0 {
				panic("cuda: QKNormRopeBackward: without q/k norms (qw empty) kw, dqw, dkw, qraw, kraw, qrstd and krstd must be empty")
			}
		}
	}
	if T == 0 {
		return
	}
	G, nch := qkRopeBwdShape(HD)
	N := T * H3
	B, R := qkRopeBwdGrid(N, HD)
	if b.opt.maxBlocks > 0 && B > b.opt.maxBlocks { // tests: fewer blocks, more rows each
		B = b.opt.maxBlocks
		R = ceilDiv(N, B)
		B = ceilDiv(N, R)
	}
	// The norms' buffers are null without norms (the kernel's test).
	opt := func(x kernels.Buf) uint64 {
		if x.N == 0 {
			return 0
		}
		return pa(x)
	}
	vec := uint64(0)
	if HD%8 == 0 {
		vec = normVec(8, dqkv, dq, dk, dv, cos, sin)
		if norm && normVec(8, qraw, kraw, qw, kw) == 0 {
			vec = 0
		}
	}
	name := fmt.Sprintf("qk_norm_rope_bwd_f32out_g%d_c%d", G, nch)
	if dt == kernels.BF16 {
		name = fmt.Sprintf("qk_norm_rope_bwd_bf16out_g%d_c%d", G, nch)
	}
	defer b.lock()()
	var partial uintptr
	var pb int64 // bytes of each of the q and k partials
	if norm {
		partial = b.work(workNorm, 2*4*B*HD)
		if partial == 0 {
			return
		}
		pb = int64(B) * int64(HD) * 4
	}
	// Per q/k element: the rotation's 3 FLOPs; with norms the dot's 3,
	// the input gradient's 4 and the weight gradient's 3.
	per := int64(3)
	if norm {
		per += 10
	}
	inflight := 4
	if vec == 1 {
		inflight = 96 * nch // a chunk's dq|dk, raw and cos|sin: two 16-byte loads each
	}
	c := rw(reads(dq, dk, dv, qraw, kraw, qrstd, krstd, qw, kw, pos), dqkv).plus(ropeTableBytes(T, HD), 2*pb).
		with(per*int64(T)*int64(NH+NKV)*int64(HD), inflight)
	b.launch(name, c, B, 1, 1, normBwdThreads, 0, pa(dqkv), pu(partial), pu(partial+uintptr(pb)), pa(dq), pa(dk), pa(dv),
		opt(qraw), opt(kraw), opt(qrstd), opt(krstd), opt(qw), opt(kw), pa(pos), pa(cos), pa(sin),
		ia(T), ia(NH), ia(NKV), ia(HD), ia(P), ia(R), vec, pu(b.flags))
	if norm {
		for i, dw := range []kernels.Buf{dqw, dkw} {
			b.launch("rmsnorm_dw_reduce", rw(reads(dw), dw).plus(pb, 0).with(pb/4, 16), ceilDiv(HD, 32), 1, 1, normBwdThreads, 0,
				pa(dw), pu(partial+uintptr(i)*uintptr(pb)), ia(B), ia(HD))
		}
	}
}

var _ kernels.QKNormRopeBackwarder = (*Backend)(nil)
