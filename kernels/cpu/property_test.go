package cpu

// Property tests over random shapes: the float32 Backend agrees with the
// float64 reference for random packings, head counts and matrix sizes.

import (
	"fmt"
	"math/rand/v2"
	"testing"
)

func TestAttentionRandomPackings(t *testing.T) {
	r := rand.New(rand.NewPCG(40, 40))
	for it := 0; it < 12; it++ {
		S := 1 + r.IntN(5)
		lens := make([]int, S)
		for i := range lens {
			lens[i] = r.IntN(70) // 0 allowed; > attnQBlock sometimes
		}
		NKV := []int{1, 2, 4}[r.IntN(3)]
		NH := NKV * []int{1, 2, 4}[r.IntN(3)]
		HD := []int{2, 6, 16, 40}[r.IntN(4)]
		T := sum(lens)
		if T == 0 {
			continue
		}
		t.Run(fmt.Sprintf("lens%v_NH%d_NKV%d_HD%d", lens, NH, NKV, HD), func(t *testing.T) {
			e := newEnv(t, 1+r.IntN(3))
			q, k, v := round32(randVec(r, T*NH*HD, 1.5)), round32(randVec(r, T*NKV*HD, 1.5)), round32(randVec(r, T*NKV*HD, 1))
			dout := round32(randVec(r, T*NH*HD, 1))
			seqs := e.seqs(lens)
			out, lse := e.zeros(T*NH*HD), e.zeros(T*NH)
			dq, dk, dv := e.zeros(T*NH*HD), e.zeros(T*NKV*HD), e.zeros(T*NKV*HD)
			qb, kb, vb := e.f32(q), e.f32(k), e.f32(v)
			e.b.Attention(out, lse, qb, kb, vb, seqs, NH, NKV, HD)
			e.b.AttentionBackward(dq, dk, dv, e.f32(dout), out, lse, qb, kb, vb, seqs, NH, NKV, HD)
			e.sync()
			wout, wlse := attnNaive64(q, k, v, lens, NH, NKV, HD)
			wdq, wdk, wdv := attnBwd64(dout, wout, wlse, q, k, v, lens, NH, NKV, HD)
			checkClose(t, "out", e.get(out), wout, f32Atol, f32Rtol)
			checkClose(t, "lse", e.get(lse), wlse, f32Atol, f32Rtol)
			checkClose(t, "dq", e.get(dq), wdq, f32Atol*2, f32Rtol)
			checkClose(t, "dk", e.get(dk), wdk, f32Atol*2, f32Rtol)
			checkClose(t, "dv", e.get(dv), wdv, f32Atol*2, f32Rtol)
		})
	}
}

func TestMatmulRandomShapes(t *testing.T) {
	r := rand.New(rand.NewPCG(41, 41))
	for it := 0; it < 10; it++ {
		T, C, OC := 1+r.IntN(300), 1+r.IntN(300), 1+r.IntN(300)
		t.Run(fmt.Sprintf("T%d_C%d_OC%d", T, C, OC), func(t *testing.T) {
			e := newEnv(t, 1+r.IntN(3))
			inp, w, dout := round32(randVec(r, T*C, 1)), round32(randVec(r, OC*C, 1)), round32(randVec(r, T*OC, 1))
			out, dinp, dw := e.zeros(T*OC), e.zeros(T*C), e.zeros(OC*C)
			e.b.Matmul(out, e.f32(inp), e.f32(w), T, C, OC)
			e.b.MatmulBackward(dinp, dw, e.f32(dout), e.f32(inp), e.f32(w), T, C, OC)
			e.sync()
			wdinp, wdw := matmulBwd64(dout, inp, w, T, C, OC)
			// Sums of up to 300 products of O(1) terms.
			checkClose(t, "out", e.get(out), matmul64(inp, w, T, C, OC), f32Atol*4, f32Rtol)
			checkClose(t, "dinp", e.get(dinp), wdinp, f32Atol*4, f32Rtol)
			checkClose(t, "dweight", e.get(dw), wdw, f32Atol*4, f32Rtol)
		})
	}
}
