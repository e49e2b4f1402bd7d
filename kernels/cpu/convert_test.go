package cpu

import (
	"math"
	"math/rand/v2"
	"testing"

	"github.com/tracegrpo/tracegrpo/kernels"
)

// TestF32ToBF16 against the definition: the nearest bfloat16, ties to the
// even mantissa, NaN kept NaN, and exact round trips of bf16 values.
func TestF32ToBF16(t *testing.T) {
	for _, c := range []struct {
		in   float32
		want uint16
	}{
		{1, 0x3f80}, {-2, 0xc000}, {1.00390625, 0x3f80}, {1.01171875, 0x3f82}, {1.0078125, 0x3f81},
		{float32(math.Inf(1)), 0x7f80}, {3.4028235e38, 0x7f80}, {0, 0}, {float32(math.Copysign(0, -1)), 0x8000},
	} {
		if got := F32ToBF16(c.in); got != c.want {
			t.Errorf("F32ToBF16(%v) = %#04x, want %#04x", c.in, got, c.want)
		}
	}
	if x := BF16ToF32(F32ToBF16(float32(math.NaN()))); !math.IsNaN(float64(x)) {
		t.Errorf("NaN became %v", x)
	}
	r := rand.New(rand.NewPCG(5, 6))
	for range 100000 {
		f := float32(r.NormFloat64() * math.Pow(2, float64(r.IntN(60)-30)))
		h := F32ToBF16(f)
		lo, hi := BF16ToF32(h-1), BF16ToF32(h+1)
		g := BF16ToF32(h)
		// g is the nearest bf16: neither neighbour is closer.
		if d := math.Abs(float64(f - g)); d > math.Abs(float64(f-lo)) || d > math.Abs(float64(f-hi)) {
			t.Fatalf("F32ToBF16(%v) = %v, but a neighbour (%v or %v) is closer", f, g, lo, hi)
		}
		if F32ToBF16(g) != h {
			t.Fatalf("bf16 %v does not round-trip", g)
		}
	}
}

// TestBF16VariantsAreWidenedF32 checks the definition of every BF16 op
// variant: the fp32 op on the bf16 values, its BF16 outputs rounded once.
func TestBF16VariantsAreWidenedF32(t *testing.T) {
	b := New(2)
	defer b.Close()
	r := rand.New(rand.NewPCG(7, 8))
	alloc := func(dt kernels.DType, n int) kernels.Buf {
		x, err := b.Alloc(dt, n)
		if err != nil {
			t.Fatal(err)
		}
		return x
	}
	// pair returns a BF16 buffer of random values and an F32 buffer of the
	// same (rounded) values.
	pair := func(n int, sd float64) (h, f kernels.Buf) {
		h, f = alloc(kernels.BF16, n), alloc(kernels.F32, n)
		v := b.F32(f)
		for i := range v {
			v[i] = BF16ToF32(F32ToBF16(float32(r.NormFloat64() * sd)))
		}
		b.Convert(h, f)
		return h, f
	}
	// same32 compares an F32 result with the F32 reference, bitwise.
	same32 := func(what string, got, want kernels.Buf) {
		t.Helper()
		g, w := b.F32(got), b.F32(want)
		for i := range w {
			if math.Float32bits(g[i]) != math.Float32bits(w[i]) {
				t.Fatalf("%s[%d] = %v, want %v", what, i, g[i], w[i])
			}
		}
	}
	// same16 compares a BF16 result with the rounded F32 reference.
	same16 := func(what string, got, want kernels.Buf) {
		t.Helper()
		g, w := b.BF16(got), b.F32(want)
		for i := range w {
			if g[i] != F32ToBF16(w[i]) {
				t.Fatalf("%s[%d] = %v, want %v rounded", what, i, BF16ToF32(g[i]), w[i])
			}
		}
	}
	const T, C, OC = 19, 40, 33
	inp16, inp32 := pair(T*C, 1)
	w16, w32 := pair(OC*C, 1)
	o16, o32, ref := alloc(kernels.BF16, T*OC), alloc(kernels.F32, T*OC), alloc(kernels.F32, T*OC)
	b.Matmul(ref, inp32, w32, T, C, OC)
	b.Matmul(o16, inp16, w16, T, C, OC)
	b.Matmul(o32, inp16, w16, T, C, OC)
	same16("Matmul → bf16", o16, ref)
	same32("Matmul → f32", o32, ref)
	d16, d32 := pair(T*OC, 1)
	dx, dw, dxRef, dwRef := alloc(kernels.F32, T*C), alloc(kernels.F32, OC*C), alloc(kernels.F32, T*C), alloc(kernels.F32, OC*C)
	b.MatmulBackward(dx, dw, d16, inp16, w16, T, C, OC)
	b.MatmulBackward(dxRef, dwRef, d32, inp32, w32, T, C, OC)
	same32("MatmulBackward dinp", dx, dxRef)
	same32("MatmulBackward dweight", dw, dwRef)

	norm := alloc(kernels.F32, C)
	b.Fill(norm, 1.25)
	x := alloc(kernels.F32, T*C)
	b.Convert(x, inp16)
	rstd := alloc(kernels.F32, T)
	n16, n32 := alloc(kernels.BF16, T*C), alloc(kernels.F32, T*C)
	b.RMSNorm(n16, rstd, x, norm, T, C, 1e-6)
	b.RMSNorm(n32, rstd, x, norm, T, C, 1e-6)
	same16("RMSNorm → bf16", n16, n32)

	g16, g32 := pair(T*C, 2)
	u16, u32 := pair(T*C, 2)
	s16, s32 := alloc(kernels.BF16, T*C), alloc(kernels.F32, T*C)
	b.SwiGLU(s16, g16, u16, T*C)
	b.SwiGLU(s32, g32, u32, T*C)
	same16("SwiGLU → bf16", s16, s32)
	dg, du, dgRef, duRef := alloc(kernels.F32, T*C), alloc(kernels.F32, T*C), alloc(kernels.F32, T*C), alloc(kernels.F32, T*C)
	b.SwiGLUBackward(dg, du, x, g16, u16, T*C)
	b.SwiGLUBackward(dgRef, duRef, x, g32, u32, T*C)
	same32("SwiGLUBackward dgate", dg, dgRef)
	same32("SwiGLUBackward dup", du, duRef)

	const NH, NKV, HD = 4, 2, 8
	cu := alloc(kernels.I32, 3)
	b.UploadI32(cu, []int32{0, 7, T})
	seqs := kernels.Seqs{CuSeqlens: cu, S: 2, MaxLen: T - 7}
	q16, q32 := pair(T*NH*HD, 1)
	k16, k32 := pair(T*NKV*HD, 1)
	v16, v32 := pair(T*NKV*HD, 1)
	a16, a32, lse := alloc(kernels.BF16, T*NH*HD), alloc(kernels.F32, T*NH*HD), alloc(kernels.F32, T*NH)
	b.Attention(a16, lse, q16, k16, v16, seqs, NH, NKV, HD)
	b.Attention(a32, lse, q32, k32, v32, seqs, NH, NKV, HD)
	same16("Attention → bf16", a16, a32)
	// The backward pass with bf16 operands: out is the rounded forward.
	ao32 := alloc(kernels.F32, T*NH*HD)
	b.Convert(ao32, a16)
	do16, do32 := pair(T*NH*HD, 1)
	dq, dk, dv := alloc(kernels.F32, T*NH*HD), alloc(kernels.F32, T*NKV*HD), alloc(kernels.F32, T*NKV*HD)
	dqR, dkR, dvR := alloc(kernels.F32, T*NH*HD), alloc(kernels.F32, T*NKV*HD), alloc(kernels.F32, T*NKV*HD)
	b.AttentionBackward(dq, dk, dv, do16, a16, lse, q16, k16, v16, seqs, NH, NKV, HD)
	b.AttentionBackward(dqR, dkR, dvR, do32, ao32, lse, q32, k32, v32, seqs, NH, NKV, HD)
	same32("AttentionBackward dq", dq, dqR)
	same32("AttentionBackward dk", dk, dkR)
	same32("AttentionBackward dv", dv, dvR)

	const V = 50
	h16, h32 := pair(T*C, 1)
	wv16, wv32 := pair(V*C, 0.3)
	targets := alloc(kernels.I32, T)
	tg := make([]int32, T)
	for i := range tg {
		tg[i] = int32(r.IntN(V))
	}
	tg[3] = -1
	b.UploadI32(targets, tg)
	lp, ent, lz := alloc(kernels.F32, T), alloc(kernels.F32, T), alloc(kernels.F32, T)
	lpR, entR, lzR := alloc(kernels.F32, T), alloc(kernels.F32, T), alloc(kernels.F32, T)
	b.TokenLogprob(lp, ent, lz, h16, wv16, targets, T, C, V, 0.7)
	b.TokenLogprob(lpR, entR, lzR, h32, wv32, targets, T, C, V, 0.7)
	same32("TokenLogprob logprob", lp, lpR)
	same32("TokenLogprob entropy", ent, entR)
	dlp, _ := pair(T, 1)
	dlp32 := alloc(kernels.F32, T)
	b.Convert(dlp32, dlp)
	dh, dwv, dhR, dwvR := alloc(kernels.F32, T*C), alloc(kernels.F32, V*C), alloc(kernels.F32, T*C), alloc(kernels.F32, V*C)
	b.TokenLogprobBackward(dh, dwv, dlp32, h16, wv16, targets, lz, T, C, V, 0.7)
	b.TokenLogprobBackward(dhR, dwvR, dlp32, h32, wv32, targets, lzR, T, C, V, 0.7)
	same32("TokenLogprobBackward dhidden", dh, dhR)
	same32("TokenLogprobBackward dweight", dwv, dwvR)

	const B, Tmax = 3, 6
	qd16, qd32 := pair(B*NH*HD, 1)
	kc16, kc32 := pair(B*Tmax*NKV*HD, 1)
	vc16, vc32 := pair(B*Tmax*NKV*HD, 1)
	lens := alloc(kernels.I32, B)
	b.UploadI32(lens, []int32{1, 6, 4})
	od, odR := alloc(kernels.F32, B*NH*HD), alloc(kernels.F32, B*NH*HD)
	b.AttentionDecode(od, qd16, kc16, vc16, lens, B, Tmax, NH, NKV, HD)
	b.AttentionDecode(odR, qd32, kc32, vc32, lens, B, Tmax, NH, NKV, HD)
	same32("AttentionDecode with a bf16 cache", od, odR)
	if err := b.Sync(); err != nil {
		t.Fatal(err)
	}
}
