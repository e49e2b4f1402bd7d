package cpu

// Rope: rotary position embedding, Hugging Face "rotate half" convention,
// from precomputed tables.
//
//	for each row (t,h) of x (T,H,HD) and i < HD/2, with a = x[i], b = x[i+HD/2],
//	c = cos[pos[t], i], s = sin[pos[t], i] from tables cos, sin (P, HD/2):
//	forward:  x[i] = a·c − b·s,  x[i+HD/2] = b·c + a·s     (in place, =)
//	backward: dx[i] = a·c + b·s, dx[i+HD/2] = b·c − a·s    (in place, =)
//
//	RopeConvert: out (T,H,HD) = the forward rotation of x, in out's dtype    =
//	             (kernels.RopeConverter; x unchanged)
//
// pos (T) is I32. The tables hold cos and sin of each position's angles;
// package model computes them once on the host (Hugging Face's float32
// arithmetic, plain or Llama-3 scaled inverse frequencies). A position
// outside [0, P) leaves its row unchanged and is reported at Sync. Rows are
// independent: thread-count invariant.

import (
	"fmt"

	"github.com/tracegrpo/tracegrpo/kernels"
)

// ropeRows rotates rows [lo, hi) of x (T,H,HD) using tables cosT, sinT
// (P, HD/2) indexed by position. Rows whose position is outside [0, P) are
// skipped.
func ropeRows[F Float](x []F, pos []int32, lo, hi, H, HD int, cosT, sinT []F, inverse bool) {
	half := HD / 2
	P := len(cosT) / half
	for t := lo; t < hi; t++ {
		p := int(pos[t])
		if p < 0 || p >= P {
			continue
		}
		c := cosT[p*half : (p+1)*half]
		s := sinT[p*half : (p+1)*half]
		for h := 0; h < H; h++ {
			row := x[(t*H+h)*HD : (t*H+h+1)*HD]
			x1 := row[:half]
			x2 := row[half:HD]
			if inverse {
				for i := range x1 {
					a, b := x1[i], x2[i]
					x1[i] = a*c[i] + b*s[i]
					x2[i] = b*c[i] - a*s[i]
				}
			} else {
				for i := range x1 {
					a, b := x1[i], x2[i]
					x1[i] = a*c[i] - b*s[i]
					x2[i] = b*c[i] + a*s[i]
				}
			}
		}
	}
}

type ropeTask struct {
	x          []float32 // (T,H,HD)
	pos        []int32   // (T)
	H, HD      int
	cosT, sinT []float32 // (P, HD/2)
	inverse    bool
}

func (t *ropeTask) run(_, lo, hi int) {
	ropeRows(t.x, t.pos, lo, hi, t.H, t.HD, t.cosT, t.sinT, t.inverse)
}

func (b *Backend) rope(op string, x, pos, cosB, sinB kernels.Buf, T, H, HD int, inverse bool) {
	b.ropeOn(op, b.f32n(x, T*H*HD, "Rope x"), pos, cosB, sinB, T, H, HD, inverse)
}

// ropeOn rotates xs (T,H,HD) in place.
func (b *Backend) ropeOn(op string, xs []float32, pos, cosB, sinB kernels.Buf, T, H, HD int, inverse bool) {
	if HD%2 != 0 || HD <= 0 {
		panic(fmt.Sprintf("cpu: %s: head dimension %d is not even and positive", op, HD))
	}
	half := HD / 2
	if cosB.N != sinB.N || cosB.N%half != 0 {
		panic(fmt.Sprintf("cpu: %s: cos (%d) and sin (%d) tables are not both (P, %d)", op, cosB.N, sinB.N, half))
	}
	ps := b.i32n(pos, T, "Rope pos")
	cosT := b.F32(cosB)
	sinT := b.F32(sinB)
	P := cosB.N / half
	for i, p := range ps {
		if p < 0 || int(p) >= P {
			b.fail("%s: position %d at row %d is outside the table's [0, %d) (row left unchanged)", op, p, i, P)
			break
		}
	}
	t := &b.tasks.rope
	*t = ropeTask{x: xs, pos: ps, H: H, HD: HD, cosT: cosT, sinT: sinT, inverse: inverse}
	b.pool.parallel(t, T, max(1, 8192/(H*HD)))
	*t = ropeTask{}
}

// Rope implements kernels.Ops.
// Shapes: x (T,H,HD), pos (T) I32, cos and sin (P, HD/2).
func (b *Backend) Rope(x, pos, cos, sin kernels.Buf, T, H, HD int) {
	b.rope("Rope", x, pos, cos, sin, T, H, HD, false)
}

// RopeBackward implements kernels.Ops.
// Shapes: dx (T,H,HD), pos (T) I32, cos and sin (P, HD/2).
func (b *Backend) RopeBackward(dx, pos, cos, sin kernels.Buf, T, H, HD int) {
	b.rope("RopeBackward", dx, pos, cos, sin, T, H, HD, true)
}

// RopeConvert implements kernels.RopeConverter: Rope of a copy of x, then
// Convert into out.
// Shapes: out (T,H,HD) F32|BF16, x (T,H,HD), pos (T) I32, cos and sin (P, HD/2).
func (b *Backend) RopeConvert(out, x, pos, cos, sin kernels.Buf, T, H, HD int) {
	n := T * H * HD
	xs := b.f32n(x, n, "RopeConvert x")
	o := b.out(out, n, "RopeConvert out")
	copy(o, xs)
	b.ropeOn("RopeConvert", o, pos, cos, sin, T, H, HD, false)
	b.done(out, o)
}

var _ kernels.RopeConverter = (*Backend)(nil)

// QKNormRope implements kernels.QKNormRoper as the model's split path
// computes it: q's and k's heads copied out of qkv, RMSNorm over each head
// row, then Rope (rounded once into q's dtype), v's heads copied (Convert's
// rounding): the same bits as CopyCols, RMSNorm, RopeConvert and CopyCols.
// Shapes: q, qraw (T,NH,HD), k, v, kraw (T,NKV,HD), qrstd (T,NH),
// krstd (T,NKV), qkv (T,(NH+2·NKV)·HD) F32, qw, kw (HD), pos (T) I32,
// cos and sin (P, HD/2).
func (b *Backend) QKNormRope(q, k, v, qraw, kraw, qrstd, krstd, qkv, qw, kw, pos, cos, sin kernels.Buf, T, NH, NKV, HD int, eps float32) {
	same("QKNormRope q, k, v", q, k, v)
	qn, kn := NH*HD, NKV*HD
	W := qn + 2*kn
	x := b.f32n(qkv, T*W, "QKNormRope qkv")
	// Constant names: the bf16 scratch slots are kept by name, and a
	// name built per call would allocate in the step.
	heads := [2]struct {
		out, raw, rstd, w       kernels.Buf
		off, width, nh          int
		what, rawWhat, rstdWhat string
	}{
		{q, qraw, qrstd, qw, 0, qn, NH, "QKNormRope q", "QKNormRope qraw", "QKNormRope qrstd"},
		{k, kraw, krstd, kw, qn, kn, NKV, "QKNormRope k", "QKNormRope kraw", "QKNormRope krstd"},
	}
	for i := range heads {
		h := &heads[i]
		raw := b.f32n(h.raw, T*h.width, h.rawWhat)
		for t := range T {
			copy(raw[t*h.width:(t+1)*h.width], x[t*W+h.off:t*W+h.off+h.width])
		}
		o := b.out(h.out, T*h.width, h.what)
		tk := &b.tasks.rmsnorm
		*tk = rmsnormTask{
			out: o, rstd: b.f32n(h.rstd, T*h.nh, h.rstdWhat),
			inp: raw, weight: b.f32n(h.w, HD, "QKNormRope weight"), C: HD, eps: eps,
		}
		b.pool.parallel(tk, T*h.nh, rmsBlock)
		*tk = rmsnormTask{}
		b.ropeOn("QKNormRope", o, pos, cos, sin, T, h.nh, HD, false)
		b.done(h.out, o)
	}
	vo := b.out(v, T*kn, "QKNormRope v")
	for t := range T {
		copy(vo[t*kn:(t+1)*kn], x[t*W+qn+kn:(t+1)*W])
	}
	b.done(v, vo)
}

var _ kernels.QKNormRoper = (*Backend)(nil)

// QKNormRopeBackward implements kernels.QKNormRopeBackwarder as the
// model's split path computes it: dq and dk rotated back in place
// (RopeBackward), then, with norms, each head row through RMSNormBackward
// into a zeroed buffer (here dq and dk themselves, assigned 0 + the
// gradient: the same bits), and the three packed into dqkv (CopyCols): the
// same bits, dqw and dkw summed in RMSNormBackward's order.
// Shapes: dqkv (T,(NH+2·NKV)·HD) F32|BF16, dqw, dkw, qw, kw (HD) or empty,
// dq, qraw (T,NH,HD), dk, dv, kraw (T,NKV,HD), qrstd (T,NH), krstd
// (T,NKV) (qraw, kraw, qrstd, krstd empty without norms), pos (T) I32, cos
// and sin (P, HD/2).
func (b *Backend) QKNormRopeBackward(dqkv, dqw, dkw, dq, dk, dv, qraw, kraw, qrstd, krstd, qw, kw, pos, cos, sin kernels.Buf, T, NH, NKV, HD int) {
	if HD > kernels.QKNormRopeBackwardMaxHD {
		panic(fmt.Sprintf("cpu: QKNormRopeBackward: head dimension %d is above %d", HD, kernels.QKNormRopeBackwardMaxHD))
	}
	qn, kn := NH*HD, NKV*HD
	W := qn + 2*kn
	norm := qw.N > 0
	heads := [2]struct {
		g, raw, rstd, w, dw kernels.Buf
		nh                  int
		what                string
	}{
		{dq, qraw, qrstd, qw, dqw, NH, "QKNormRopeBackward dq"},
		{dk, kraw, krstd, kw, dkw, NKV, "QKNormRopeBackward dk"},
	}
	for i := range heads {
		h := &heads[i]
		n := T * h.nh * HD
		g := b.f32n(h.g, n, h.what)
		b.ropeOn("QKNormRopeBackward", g, pos, cos, sin, T, h.nh, HD, true)
		if norm {
			b.rmsnormBackwardOn(g, b.f32n(h.dw, HD, "QKNormRopeBackward dweight"), g, b.f32n(h.raw, n, "QKNormRopeBackward raw"),
				b.f32n(h.w, HD, "QKNormRopeBackward weight"), b.f32n(h.rstd, T*h.nh, "QKNormRopeBackward rstd"), T*h.nh, HD, true)
		}
	}
	want := func(x kernels.Buf, n int, what string) {
		if x.N != n || x.DType != kernels.F32 {
			panic(fmt.Sprintf("cpu: QKNormRopeBackward %s is %d × %s, want %d × F32", what, x.N, x.DType, n))
		}
	}
	want(dv, T*kn, "dv")
	if dqkv.N != T*W {
		panic(fmt.Sprintf("cpu: QKNormRopeBackward dqkv has %d elements, want %d", dqkv.N, T*W))
	}
	b.CopyCols(dqkv, dq, T, qn, W, qn)
	b.CopyCols(dqkv.Slice(qn, T*W-qn), dk, T, kn, W, kn)
	b.CopyCols(dqkv.Slice(qn+kn, T*W-qn-kn), dv, T, kn, W, kn)
}

var _ kernels.QKNormRopeBackwarder = (*Backend)(nil)
