package cpu

// Finite-difference checks of every backward, in float64, on random inputs,
// and naive independent forwards.

import (
	"fmt"
	"math/rand/v2"
	"testing"
)

func TestRMSNormGradFD(t *testing.T) {
	for _, tc := range []struct{ N, C int }{{1, 1}, {3, 7}, {5, 16}, {2, 33}} {
		t.Run(fmt.Sprintf("N%d_C%d", tc.N, tc.C), func(t *testing.T) {
			r := rand.New(rand.NewPCG(1, uint64(tc.N*100+tc.C)))
			inp, w, wo := randVec(r, tc.N*tc.C, 2), randVec(r, tc.C, 1.5), randVec(r, tc.N*tc.C, 1)
			const eps = 1e-5
			loss := func() float64 { out, _ := rmsnorm64(inp, w, tc.N, tc.C, eps); return dot64(out, wo) }
			_, rstd := rmsnorm64(inp, w, tc.N, tc.C, eps)
			dinp, dw := rmsnormBwd64(wo, inp, w, rstd, tc.N, tc.C)
			checkClose(t, "dinp", dinp, fdGrad(inp, loss), fdAtol, fdRtol)
			checkClose(t, "dweight", dw, fdGrad(w, loss), fdAtol, fdRtol)
		})
	}
}

func TestMatmulGradFD(t *testing.T) {
	for _, tc := range []struct{ T, C, OC int }{{1, 1, 1}, {3, 5, 7}, {9, 17, 4}, {13, 2, 33}} {
		t.Run(fmt.Sprintf("T%d_C%d_OC%d", tc.T, tc.C, tc.OC), func(t *testing.T) {
			r := rand.New(rand.NewPCG(2, uint64(tc.T*10000+tc.C*100+tc.OC)))
			inp, w, wo := randVec(r, tc.T*tc.C, 1), randVec(r, tc.OC*tc.C, 1), randVec(r, tc.T*tc.OC, 1)
			loss := func() float64 { return dot64(matmul64(inp, w, tc.T, tc.C, tc.OC), wo) }
			dinp, dw := matmulBwd64(wo, inp, w, tc.T, tc.C, tc.OC)
			checkClose(t, "dinp", dinp, fdGrad(inp, loss), fdAtol, fdRtol)
			checkClose(t, "dweight", dw, fdGrad(w, loss), fdAtol, fdRtol)
		})
	}
}

func TestRopeGradFD(t *testing.T) {
	for _, tc := range []struct{ T, H, HD int }{{1, 1, 2}, {4, 3, 6}, {7, 2, 16}} {
		t.Run(fmt.Sprintf("T%d_H%d_HD%d", tc.T, tc.H, tc.HD), func(t *testing.T) {
			r := rand.New(rand.NewPCG(3, uint64(tc.T*100+tc.HD)))
			x, wo := randVec(r, tc.T*tc.H*tc.HD, 1), randVec(r, tc.T*tc.H*tc.HD, 1)
			pos := make([]int32, tc.T)
			for i := range pos {
				pos[i] = int32(r.IntN(50))
			}
			loss := func() float64 { return dot64(rope64(x, pos, tc.T, tc.H, tc.HD, 10000, false), wo) }
			checkClose(t, "dx", rope64(wo, pos, tc.T, tc.H, tc.HD, 10000, true), fdGrad(x, loss), fdAtol, fdRtol)
		})
	}
}

// TestRopeRelative checks the defining property of rotary embeddings: the
// dot product of a rotated query and key depends only on their distance.
func TestRopeRelative(t *testing.T) {
	r := rand.New(rand.NewPCG(4, 4))
	const HD = 8
	q, k := randVec(r, HD, 1), randVec(r, HD, 1)
	for _, d := range []int32{0, 1, 5, 17} {
		a := dot64(rope64(q, []int32{3 + d}, 1, 1, HD, 10000, false), rope64(k, []int32{1 + d}, 1, 1, HD, 10000, false))
		b := dot64(rope64(q, []int32{12}, 1, 1, HD, 10000, false), rope64(k, []int32{10}, 1, 1, HD, 10000, false))
		checkClose(t, fmt.Sprintf("shift %d", d), []float64{a}, []float64{b}, refAtol, 1e-9)
	}
	// Position 0 is the identity; the inverse undoes the forward.
	checkClose(t, "pos 0", rope64(q, []int32{0}, 1, 1, HD, 10000, false), q, 0, 0)
	checkClose(t, "inverse", rope64(rope64(q, []int32{7}, 1, 1, HD, 1e6, false), []int32{7}, 1, 1, HD, 1e6, true), q, refAtol, refRtol)
}

// attnCases cover one-token sequences, many short packed sequences, lengths
// that are not multiples of 8, and GQA ratios 1, 2 and 4.
var attnCases = []struct {
	name        string
	lens        []int
	NH, NKV, HD int
}{
	{"one_token", []int{1}, 2, 1, 4},
	{"mha_odd", []int{5, 3}, 2, 2, 6},
	{"gqa2_packed", []int{1, 4, 2, 1, 3}, 4, 2, 4},
	{"gqa4", []int{7, 2}, 4, 1, 8},
}

func TestAttentionGradFD(t *testing.T) {
	for _, tc := range attnCases {
		t.Run(tc.name, func(t *testing.T) {
			T := sum(tc.lens)
			r := rand.New(rand.NewPCG(5, uint64(T)))
			q, k, v := randVec(r, T*tc.NH*tc.HD, 1), randVec(r, T*tc.NKV*tc.HD, 1), randVec(r, T*tc.NKV*tc.HD, 1)
			wo := randVec(r, T*tc.NH*tc.HD, 1)
			loss := func() float64 { out, _ := attn64(q, k, v, tc.lens, tc.NH, tc.NKV, tc.HD); return dot64(out, wo) }
			out, lse := attn64(q, k, v, tc.lens, tc.NH, tc.NKV, tc.HD)
			dq, dk, dv := attnBwd64(wo, out, lse, q, k, v, tc.lens, tc.NH, tc.NKV, tc.HD)
			checkClose(t, "dq", dq, fdGrad(q, loss), fdAtol, fdRtol)
			checkClose(t, "dk", dk, fdGrad(k, loss), fdAtol, fdRtol)
			checkClose(t, "dv", dv, fdGrad(v, loss), fdAtol, fdRtol)
		})
	}
}

func TestAttentionForwardNaive(t *testing.T) {
	for _, tc := range attnCases {
		t.Run(tc.name, func(t *testing.T) {
			T := sum(tc.lens)
			r := rand.New(rand.NewPCG(6, uint64(T)))
			q, k, v := randVec(r, T*tc.NH*tc.HD, 2), randVec(r, T*tc.NKV*tc.HD, 2), randVec(r, T*tc.NKV*tc.HD, 1)
			out, lse := attn64(q, k, v, tc.lens, tc.NH, tc.NKV, tc.HD)
			wout, wlse := attnNaive64(q, k, v, tc.lens, tc.NH, tc.NKV, tc.HD)
			checkClose(t, "out", out, wout, refAtol, refRtol)
			checkClose(t, "lse", lse, wlse, refAtol, refRtol)
		})
	}
}

// TestAttentionDecodeMatchesPrefill: decoding the last token of each sequence
// against a cache of its keys and values gives the attention forward's row.
func TestAttentionDecodeMatchesPrefill(t *testing.T) {
	lens := []int{1, 6, 3}
	const NH, NKV, HD, Tmax = 4, 2, 8, 7
	T := sum(lens)
	r := rand.New(rand.NewPCG(7, 7))
	q, k, v := randVec(r, T*NH*HD, 2), randVec(r, T*NKV*HD, 2), randVec(r, T*NKV*HD, 1)
	want, _ := attn64(q, k, v, lens, NH, NKV, HD)
	B := len(lens)
	qb, kc, vc := make([]float64, B*NH*HD), make([]float64, B*Tmax*NKV*HD), randVec(r, B*Tmax*NKV*HD, 9)
	copy(kc, randVec(r, len(kc), 9)) // garbage beyond lens must be ignored
	cu := cuOf(lens)
	var wantRows, got []float64
	for b, L := range lens {
		last := int(cu[b]) + L - 1
		copy(qb[b*NH*HD:(b+1)*NH*HD], q[last*NH*HD:(last+1)*NH*HD])
		for j := 0; j < L; j++ {
			src := (int(cu[b]) + j) * NKV * HD
			copy(kc[(b*Tmax+j)*NKV*HD:], k[src:src+NKV*HD])
			copy(vc[(b*Tmax+j)*NKV*HD:], v[src:src+NKV*HD])
		}
		wantRows = append(wantRows, want[last*NH*HD:(last+1)*NH*HD]...)
	}
	out := make([]float64, B*NH*HD)
	sc := make([]float64, Tmax)
	for b, L := range lens {
		for h := 0; h < NH; h++ {
			attnDecodeRow(out, qb, kc, vc, L, b, h, Tmax, NH, NKV, HD, sc)
		}
	}
	got = out
	checkClose(t, "decode", got, wantRows, refAtol, refRtol)

	// The Backend's float32 decode agrees too.
	e := newEnv(t, 2)
	ob := e.zeros(B * NH * HD)
	lb := make([]int32, B)
	for i, L := range lens {
		lb[i] = int32(L)
	}
	e.b.AttentionDecode(ob, e.f32(round32(qb)), e.f32(round32(kc)), e.f32(round32(vc)), e.i32(lb), B, Tmax, NH, NKV, HD)
	e.sync()
	checkClose(t, "backend decode", e.get(ob), wantRows, f32Atol, f32Rtol)
}

func TestSwiGLUGradFD(t *testing.T) {
	r := rand.New(rand.NewPCG(8, 8))
	const N = 37
	gate, up, wo := randVec(r, N, 6), randVec(r, N, 2), randVec(r, N, 1)
	loss := func() float64 { return dot64(swiglu64(gate, up), wo) }
	dgate, dup := swigluBwd64(wo, gate, up)
	checkClose(t, "dgate", dgate, fdGrad(gate, loss), fdAtol, fdRtol)
	checkClose(t, "dup", dup, fdGrad(up, loss), fdAtol, fdRtol)
}

var tlpCases = []struct {
	name    string
	T, C, V int
	invTemp float64
	vchunk  int
}{
	{"one_row", 1, 3, 5, 1, 5},
	{"masked_rows_chunked", 6, 7, 300, 1 / 0.7, 64}, // V spans two forward chunks
	{"odd", 5, 9, 33, 2, 7},
}

func tlpTargets(r *rand.Rand, T, V int) []int32 {
	tg := make([]int32, T)
	for i := range tg {
		tg[i] = int32(r.IntN(V))
		if T > 1 && i%3 == 1 {
			tg[i] = -1
		}
	}
	return tg
}

func TestTokenLogprobGradFD(t *testing.T) {
	for _, tc := range tlpCases {
		t.Run(tc.name, func(t *testing.T) {
			r := rand.New(rand.NewPCG(9, uint64(tc.V)))
			h, w := randVec(r, tc.T*tc.C, 1), randVec(r, tc.V*tc.C, 1)
			tg := tlpTargets(r, tc.T, tc.V)
			wlp := randVec(r, tc.T, 1)
			loss := func() float64 { lp, _, _ := tlp64(h, w, tg, tc.T, tc.C, tc.V, tc.invTemp); return dot64(lp, wlp) }
			_, _, lse := tlp64(h, w, tg, tc.T, tc.C, tc.V, tc.invTemp)
			dh, dw := tlpBwd64(wlp, h, w, lse, tg, tc.T, tc.C, tc.V, tc.invTemp, tc.vchunk)
			checkClose(t, "dhidden", dh, fdGrad(h, loss), fdAtol, fdRtol)
			checkClose(t, "dweight", dw, fdGrad(w, loss), fdAtol, fdRtol)
		})
	}
}

func TestTokenLogprobForwardNaive(t *testing.T) {
	for _, tc := range tlpCases {
		t.Run(tc.name, func(t *testing.T) {
			r := rand.New(rand.NewPCG(10, uint64(tc.V)))
			h, w := randVec(r, tc.T*tc.C, 2), randVec(r, tc.V*tc.C, 2)
			tg := tlpTargets(r, tc.T, tc.V)
			lp, ent, lse := tlp64(h, w, tg, tc.T, tc.C, tc.V, tc.invTemp)
			wlp, went, wlse := tlpNaive64(h, w, tg, tc.T, tc.C, tc.V, tc.invTemp)
			checkClose(t, "logprob", lp, wlp, refAtol, refRtol)
			checkClose(t, "entropy", ent, went, refAtol, refRtol)
			checkClose(t, "lse", lse, wlse, refAtol, refRtol)
		})
	}
}

func TestEmbeddingGradFD(t *testing.T) {
	r := rand.New(rand.NewPCG(11, 11))
	const T, C, V = 9, 5, 4 // repeated tokens
	wte, wo := randVec(r, V*C, 1), randVec(r, T*C, 1)
	tok := make([]int32, T)
	for i := range tok {
		tok[i] = int32(r.IntN(V))
	}
	loss := func() float64 {
		out := make([]float64, T*C)
		embeddingRows(out, wte, tok, 0, T, C)
		return dot64(out, wo)
	}
	dwte := make([]float64, V*C)
	embeddingBackwardCols(dwte, wo, tok, T, C, 0, C)
	checkClose(t, "dwte", dwte, fdGrad(wte, loss), fdAtol, fdRtol)
}
