package cpu

// The float32 Backend against the float64 reference on random inputs (odd
// shapes included), bit-identical results for every thread count, no
// allocations after warm-up, and the memory/sticky-error contract.

import (
	"fmt"
	"math"
	"math/rand/v2"
	"testing"

	"github.com/google/go-cmp/cmp"
	"github.com/tracegrpo/tracegrpo/kernels"
)

// opRun runs one op (forward and backward where there is one) on a Backend
// with fixed random inputs and returns every output, by name, as float32.
// check compares them with the float64 reference (nil to skip).
type opCase struct {
	name string
	run  func(e *env, r *rand.Rand, check bool) map[string][]float32
}

func outputs(e *env, named ...any) map[string][]float32 {
	m := map[string][]float32{}
	for i := 0; i < len(named); i += 2 {
		m[named[i].(string)] = append([]float32(nil), e.b.F32(named[i+1].(kernels.Buf))...)
	}
	return m
}

func opCases(scale int) []opCase {
	// scale multiplies sizes so the same cases can exercise many grains.
	return []opCase{
		{"rmsnorm", func(e *env, r *rand.Rand, check bool) map[string][]float32 {
			N, C := 67*scale, 37
			inp, w, dout := round32(randVec(r, N*C, 2)), round32(randVec(r, C, 1.5)), round32(randVec(r, N*C, 1))
			out, rstd, dinp, dw := e.zeros(N*C), e.zeros(N), e.f32(round32(randVec(r, N*C, 1))), e.zeros(C)
			dinp0 := e.get(dinp)
			e.b.RMSNorm(out, rstd, e.f32(inp), e.f32(w), N, C, 1e-6)
			e.b.RMSNormBackward(dinp, dw, e.f32(dout), e.f32(inp), e.f32(w), rstd, N, C)
			e.sync()
			if check {
				wout, wrstd := rmsnorm64(inp, w, N, C, 1e-6)
				wdinp, wdw := rmsnormBwd64(dout, inp, w, wrstd, N, C)
				for i := range wdinp {
					wdinp[i] += dinp0[i] // += semantics
				}
				checkClose(e.t, "out", e.get(out), wout, f32Atol, f32Rtol)
				checkClose(e.t, "rstd", e.get(rstd), wrstd, f32Atol, f32Rtol)
				checkClose(e.t, "dinp", e.get(dinp), wdinp, f32Atol, f32Rtol)
				checkClose(e.t, "dweight", e.get(dw), wdw, f32Atol*float64(N)/8, f32Rtol)
			}
			return outputs(e, "out", out, "rstd", rstd, "dinp", dinp, "dweight", dw)
		}},
		{"matmul", func(e *env, r *rand.Rand, check bool) map[string][]float32 {
			// Several output tiles in both directions (tileM 192, tileN 256) and
			// two K blocks (gemmKC 256): the shared pre-packed op(B) path.
			T, C, OC := 200*scale+3, 270, 37*scale+260
			inp, w, dout := round32(randVec(r, T*C, 1)), round32(randVec(r, OC*C, 1)), round32(randVec(r, T*OC, 1))
			out, dinp, dw := e.zeros(T*OC), e.f32(round32(randVec(r, T*C, 1))), e.f32(round32(randVec(r, OC*C, 1)))
			dinp0, dw0 := e.get(dinp), e.get(dw)
			e.b.Matmul(out, e.f32(inp), e.f32(w), T, C, OC)
			e.b.MatmulBackward(dinp, dw, e.f32(dout), e.f32(inp), e.f32(w), T, C, OC)
			e.sync()
			if check {
				wdinp, wdw := matmulBwd64(dout, inp, w, T, C, OC)
				for i := range wdinp {
					wdinp[i] += dinp0[i]
				}
				for i := range wdw {
					wdw[i] += dw0[i]
				}
				checkClose(e.t, "out", e.get(out), matmul64(inp, w, T, C, OC), f32Atol*4, f32Rtol)
				checkClose(e.t, "dinp", e.get(dinp), wdinp, f32Atol*4, f32Rtol)
				checkClose(e.t, "dweight", e.get(dw), wdw, f32Atol*float64(T)/16, f32Rtol)
			}
			return outputs(e, "out", out, "dinp", dinp, "dweight", dw)
		}},
		{"matmul_wide", func(e *env, r *rand.Rand, check bool) map[string][]float32 {
			// One row of output tiles, several columns: op(A) pre-packed alone.
			T, C, OC := 50, 300, 600*scale
			inp, w, dout := round32(randVec(r, T*C, 1)), round32(randVec(r, OC*C, 1)), round32(randVec(r, T*OC, 1))
			out, dinp, dw := e.zeros(T*OC), e.f32(round32(randVec(r, T*C, 1))), e.f32(round32(randVec(r, OC*C, 1)))
			dinp0, dw0 := e.get(dinp), e.get(dw)
			e.b.Matmul(out, e.f32(inp), e.f32(w), T, C, OC)
			e.b.MatmulBackward(dinp, dw, e.f32(dout), e.f32(inp), e.f32(w), T, C, OC)
			e.sync()
			if check {
				wdinp, wdw := matmulBwd64(dout, inp, w, T, C, OC)
				for i := range wdinp {
					wdinp[i] += dinp0[i]
				}
				for i := range wdw {
					wdw[i] += dw0[i]
				}
				checkClose(e.t, "out", e.get(out), matmul64(inp, w, T, C, OC), f32Atol*4, f32Rtol)
				checkClose(e.t, "dinp", e.get(dinp), wdinp, f32Atol*4, f32Rtol)
				checkClose(e.t, "dweight", e.get(dw), wdw, f32Atol*float64(T)/16, f32Rtol)
			}
			return outputs(e, "out", out, "dinp", dinp, "dweight", dw)
		}},
		{"bias", func(e *env, r *rand.Rand, check bool) map[string][]float32 {
			// Several row blocks (biasRows 256) and column groups (biasCols 64).
			T, OC := 300*scale+7, 131
			out0, bias, dout := round32(randVec(r, T*OC, 1)), round32(randVec(r, OC, 1)), round32(randVec(r, T*OC, 1))
			db0 := round32(randVec(r, OC, 1))
			out, db := e.f32(out0), e.f32(db0)
			e.b.AddBias(out, e.f32(bias), T, OC)
			e.b.BiasBackward(db, e.f32(dout), T, OC)
			e.sync()
			if check {
				wout, wdb := append([]float64(nil), out0...), append([]float64(nil), db0...)
				for t := 0; t < T; t++ {
					for j := 0; j < OC; j++ {
						wout[t*OC+j] += bias[j]
						wdb[j] += dout[t*OC+j]
					}
				}
				checkClose(e.t, "out", e.get(out), wout, f32Atol, f32Rtol)
				checkClose(e.t, "dbias", e.get(db), wdb, f32Atol*float64(T)/16, f32Rtol)
			}
			return outputs(e, "out", out, "dbias", db)
		}},
		{"rope", func(e *env, r *rand.Rand, check bool) map[string][]float32 {
			T, H, HD := 29*scale, 3, 10
			x := round32(randVec(r, T*H*HD, 1))
			pos := make([]int32, T)
			for i := range pos {
				pos[i] = int32(r.IntN(40))
			}
			xb, db := e.f32(x), e.f32(x)
			pb := e.i32(pos)
			cb, sb := e.ropeTables(40, HD, 10000)
			e.b.Rope(xb, pb, cb, sb, T, H, HD)
			e.b.RopeBackward(db, pb, cb, sb, T, H, HD)
			e.sync()
			if check {
				checkClose(e.t, "rope", e.get(xb), rope64(x, pos, T, H, HD, 10000, false), f32Atol, f32Rtol)
				checkClose(e.t, "rope backward", e.get(db), rope64(x, pos, T, H, HD, 10000, true), f32Atol, f32Rtol)
			}
			return outputs(e, "x", xb, "dx", db)
		}},
		{"attention", func(e *env, r *rand.Rand, check bool) map[string][]float32 {
			lens := []int{1, 9 * scale, 0, 3, 17, 2, 1, 5 * scale}
			NH, NKV, HD := 4, 2, 12
			T := sum(lens)
			q, k, v := round32(randVec(r, T*NH*HD, 1)), round32(randVec(r, T*NKV*HD, 1)), round32(randVec(r, T*NKV*HD, 1))
			dout := round32(randVec(r, T*NH*HD, 1))
			seqs := e.seqs(lens)
			out, lse := e.zeros(T*NH*HD), e.zeros(T*NH)
			dq, dk, dv := e.f32(randVec(r, T*NH*HD, 1)), e.f32(randVec(r, T*NKV*HD, 1)), e.f32(randVec(r, T*NKV*HD, 1))
			qb, kb, vb := e.f32(q), e.f32(k), e.f32(v)
			e.b.Attention(out, lse, qb, kb, vb, seqs, NH, NKV, HD)
			e.b.AttentionBackward(dq, dk, dv, e.f32(dout), out, lse, qb, kb, vb, seqs, NH, NKV, HD)
			e.sync()
			if check {
				wout, wlse := attn64(q, k, v, lens, NH, NKV, HD)
				wdq, wdk, wdv := attnBwd64(dout, wout, wlse, q, k, v, lens, NH, NKV, HD)
				checkClose(e.t, "out", e.get(out), wout, f32Atol, f32Rtol)
				checkClose(e.t, "lse", e.get(lse), wlse, f32Atol, f32Rtol)
				checkClose(e.t, "dq", e.get(dq), wdq, f32Atol, f32Rtol)
				checkClose(e.t, "dk", e.get(dk), wdk, f32Atol, f32Rtol)
				checkClose(e.t, "dv", e.get(dv), wdv, f32Atol, f32Rtol)
			}
			return outputs(e, "out", out, "lse", lse, "dq", dq, "dk", dk, "dv", dv)
		}},
		{"tree attention", func(e *env, r *rand.Rand, check bool) map[string][]float32 {
			// Segments longer than a query block, shared by several
			// descendants, at depth 3.
			tr := testTree{offs: []int32{0, int32(50 * scale), int32(50*scale + 7), int32(50*scale + 70), int32(50*scale + 75), int32(50*scale + 75 + 9*scale)},
				parent: []int32{-1, 0, 1, 0, -1}}
			tr.ends = []int32{tr.offs[4], tr.offs[3], tr.offs[3], tr.offs[4], tr.offs[5]}
			tr.maxLen, tr.maxCtx = max(63, 50*scale), 50*scale+70
			NH, NKV, HD := 4, 2, 12
			T := tr.T()
			q, k, v := round32(randVec(r, T*NH*HD, 1)), round32(randVec(r, T*NKV*HD, 1)), round32(randVec(r, T*NKV*HD, 1))
			dout := round32(randVec(r, T*NH*HD, 1))
			tree := tr.upload(e)
			out, lse := e.zeros(T*NH*HD), e.zeros(T*NH)
			dq, dk, dv := e.f32(randVec(r, T*NH*HD, 1)), e.f32(randVec(r, T*NKV*HD, 1)), e.f32(randVec(r, T*NKV*HD, 1))
			qb, kb, vb := e.f32(q), e.f32(k), e.f32(v)
			e.b.TreeAttention(out, lse, qb, kb, vb, tree, NH, NKV, HD)
			e.b.TreeAttentionBackward(dq, dk, dv, e.f32(dout), out, lse, qb, kb, vb, tree, NH, NKV, HD)
			e.sync()
			if check {
				wout, wlse := treeAttn64(tr, q, k, v, NH, NKV, HD)
				wdq, wdk, wdv, _, _ := treeAttnBwd64(tr, dout, wout, wlse, q, k, v, NH, NKV, HD)
				checkClose(e.t, "out", e.get(out), wout, f32Atol, f32Rtol)
				checkClose(e.t, "lse", e.get(lse), wlse, f32Atol, f32Rtol)
				checkClose(e.t, "dq", e.get(dq), wdq, f32Atol, f32Rtol)
				checkClose(e.t, "dk", e.get(dk), wdk, f32Atol*4, f32Rtol)
				checkClose(e.t, "dv", e.get(dv), wdv, f32Atol*4, f32Rtol)
			}
			return outputs(e, "out", out, "lse", lse, "dq", dq, "dk", dk, "dv", dv)
		}},
		{"swiglu", func(e *env, r *rand.Rand, check bool) map[string][]float32 {
			N := 20000*scale + 7
			g, u, d := round32(randVec(r, N, 8)), round32(randVec(r, N, 2)), round32(randVec(r, N, 1))
			out, dg, du := e.zeros(N), e.zeros(N), e.zeros(N)
			e.b.SwiGLU(out, e.f32(g), e.f32(u), N)
			e.b.SwiGLUBackward(dg, du, e.f32(d), e.f32(g), e.f32(u), N)
			e.sync()
			if check {
				wdg, wdu := swigluBwd64(d, g, u)
				checkClose(e.t, "out", e.get(out), swiglu64(g, u), f32Atol, f32Rtol)
				checkClose(e.t, "dgate", e.get(dg), wdg, f32Atol, f32Rtol)
				checkClose(e.t, "dup", e.get(du), wdu, f32Atol, f32Rtol)
			}
			return outputs(e, "out", out, "dgate", dg, "dup", du)
		}},
		{"token_logprob", func(e *env, r *rand.Rand, check bool) map[string][]float32 {
			T, C, V := 37*scale, 24, 700
			saved := tlpBudget
			tlpBudget = T * 100 // several vocabulary chunks, the last one partial
			defer func() { tlpBudget = saved }()
			h, w := round32(randVec(r, T*C, 1)), round32(randVec(r, V*C, 1))
			tg := tlpTargets(r, T, V)
			dlp := round32(randVec(r, T, 1))
			const invTemp = float32(1 / 0.8)
			lp, ent, lse := e.zeros(T), e.zeros(T), e.zeros(T)
			dh, dw := e.f32(round32(randVec(r, T*C, 1))), e.f32(round32(randVec(r, V*C, 1)))
			dh0, dw0 := e.get(dh), e.get(dw)
			hb, wb, tb := e.f32(h), e.f32(w), e.i32(tg)
			e.b.TokenLogprob(lp, ent, lse, hb, wb, tb, T, C, V, invTemp)
			e.b.TokenLogprobBackward(dh, dw, e.f32(dlp), hb, wb, tb, lse, T, C, V, invTemp)
			e.sync()
			if check {
				wlp, went, wlse := tlp64(h, w, tg, T, C, V, float64(invTemp))
				wdh, wdw := tlpBwd64(dlp, h, w, wlse, tg, T, C, V, float64(invTemp), 128)
				for i := range wdh {
					wdh[i] += dh0[i]
				}
				for i := range wdw {
					wdw[i] += dw0[i]
				}
				checkClose(e.t, "logprob", e.get(lp), wlp, f32Atol*4, f32Rtol)
				checkClose(e.t, "entropy", e.get(ent), went, f32Atol*4, f32Rtol)
				checkClose(e.t, "lse", e.get(lse), wlse, f32Atol*4, f32Rtol)
				checkClose(e.t, "dhidden", e.get(dh), wdh, f32Atol, f32Rtol)
				checkClose(e.t, "dweight", e.get(dw), wdw, f32Atol, f32Rtol)
			}
			return outputs(e, "logprob", lp, "entropy", ent, "lse", lse, "dhidden", dh, "dweight", dw)
		}},
		{"embedding", func(e *env, r *rand.Rand, check bool) map[string][]float32 {
			T, C, V := 300*scale, 70, 13
			wte, dout := round32(randVec(r, V*C, 1)), round32(randVec(r, T*C, 1))
			tok := make([]int32, T)
			for i := range tok {
				tok[i] = int32(r.IntN(V))
			}
			out, dwte := e.zeros(T*C), e.zeros(V*C)
			tb := e.i32(tok)
			e.b.Embedding(out, e.f32(wte), tb, T, C)
			e.b.EmbeddingBackward(dwte, e.f32(dout), tb, T, C)
			e.sync()
			if check {
				wout := make([]float64, T*C)
				embeddingRows(wout, wte, tok, 0, T, C)
				wd := make([]float64, V*C)
				embeddingBackwardCols(wd, dout, tok, T, C, 0, C)
				checkClose(e.t, "out", e.get(out), wout, 0, 0)
				checkClose(e.t, "dwte", e.get(dwte), wd, f32Atol*float64(T)/float64(V), f32Rtol)
			}
			return outputs(e, "out", out, "dwte", dwte)
		}},
		{"elementwise", func(e *env, r *rand.Rand, check bool) map[string][]float32 {
			N := 40000*scale + 3
			a, b := round32(randVec(r, N, 1)), round32(randVec(r, N, 1))
			ab, bb, sum, acc, sq := e.f32(a), e.f32(b), e.zeros(N), e.f32(a), e.zeros(1)
			e.b.Add(sum, ab, bb, N)
			e.b.Accumulate(acc, bb, N)
			e.b.Scale(acc, 0.5)
			e.b.SumSquares(sq, ab)
			e.sync()
			if check {
				ws, wacc := make([]float64, N), make([]float64, N)
				var ss float64
				for i := range a {
					ws[i] = float64(float32(a[i] + b[i]))
					wacc[i] = float64(float32(a[i]+b[i]) * 0.5)
					ss += a[i] * a[i]
				}
				checkClose(e.t, "add", e.get(sum), ws, 0, 0)
				checkClose(e.t, "accumulate·scale", e.get(acc), wacc, 0, 0)
				checkClose(e.t, "sumsquares", e.get(sq), []float64{ss}, 0, 1e-7)
			}
			return outputs(e, "add", sum, "acc", acc, "sumsq", sq)
		}},
	}
}

// TestBackendMatchesFloat64: every op on every SIMD path this CPU runs
// agrees with the float64 reference within the named tolerances.
func TestBackendMatchesFloat64(t *testing.T) {
	for _, path := range simdPaths() {
		for _, oc := range opCases(1) {
			t.Run(path+"/"+oc.name, func(t *testing.T) {
				usePath(t, path)
				oc.run(newEnv(t, 2), rand.New(rand.NewPCG(20, 20)), true)
			})
		}
	}
}

// TestThreadCountInvariance: every op on every SIMD path this CPU runs
// gives bit-identical outputs on 1, 2, 3 and 5 threads (sizes span many
// grains).
func TestThreadCountInvariance(t *testing.T) {
	for _, path := range simdPaths() {
		for _, oc := range opCases(3) {
			t.Run(path+"/"+oc.name, func(t *testing.T) {
				usePath(t, path)
				threadCountInvariance(t, oc)
			})
		}
	}
}

func threadCountInvariance(t *testing.T, oc opCase) {
	want := oc.run(newEnv(t, 1), rand.New(rand.NewPCG(21, 21)), false)
	for _, th := range []int{2, 3, 5} {
		got := oc.run(newEnv(t, th), rand.New(rand.NewPCG(21, 21)), false)
		for name, w := range want {
			g := got[name]
			for i := range w {
				if math.Float32bits(g[i]) != math.Float32bits(w[i]) {
					t.Errorf("%d threads: %s[%d] = %v, 1 thread gave %v", th, name, i, g[i], w[i])
					break
				}
			}
		}
	}
}

// TestNoAllocsAfterWarmup: a warmed-up op sequence allocates nothing.
func TestNoAllocsAfterWarmup(t *testing.T) {
	e := newEnv(t, 2)
	r := rand.New(rand.NewPCG(22, 22))
	const T, C, OC, NH, NKV, HD, V = 40, 32, 48, 4, 2, 8, 100
	x, w, o := e.f32(randVec(r, T*C, 1)), e.f32(randVec(r, OC*C, 1)), e.zeros(T*OC)
	dx, dw := e.zeros(T*C), e.zeros(OC*C)
	q, k, v := e.f32(randVec(r, T*NH*HD, 1)), e.f32(randVec(r, T*NKV*HD, 1)), e.f32(randVec(r, T*NKV*HD, 1))
	ao, lse, dq, dk, dv := e.zeros(T*NH*HD), e.zeros(T*NH), e.zeros(T*NH*HD), e.zeros(T*NKV*HD), e.zeros(T*NKV*HD)
	seqs := e.seqs([]int{10, 30})
	tree := testTree{offs: []int32{0, 10, 25, 40}, parent: []int32{-1, 0, 0}, ends: []int32{40, 25, 40}, maxLen: 15, maxCtx: 25}.upload(e)
	pos := e.i32(make([]int32, T))
	rc, rs := e.ropeTables(1, HD, 1e4)
	rstd, wn := e.zeros(T), e.f32(randVec(r, C, 1))
	wv := e.f32(randVec(r, V*C, 1))
	tg := make([]int32, T)
	for i := range tg {
		tg[i] = int32(i % V)
	}
	tb := e.i32(tg)
	lp, ent, lse2, dwv := e.zeros(T), e.zeros(T), e.zeros(T), e.zeros(V*C)
	sq, mom, vel := e.zeros(1), e.zeros(OC*C), e.zeros(OC*C)
	step := func() {
		e.b.Matmul(o, x, w, T, C, OC)
		e.b.MatmulBackward(dx, dw, o, x, w, T, C, OC)
		e.b.RMSNorm(dx, rstd, x, wn, T, C, 1e-6)
		e.b.RMSNormBackward(dx, wn, x, x, wn, rstd, T, C)
		e.b.Rope(q, pos, rc, rs, T, NH, HD)
		e.b.AddBias(o, wn.Slice(0, OC/2), 2*T, OC/2)
		e.b.BiasBackward(wn.Slice(0, OC/2), o, 2*T, OC/2)
		e.b.Attention(ao, lse, q, k, v, seqs, NH, NKV, HD)
		e.b.AttentionBackward(dq, dk, dv, ao, ao, lse, q, k, v, seqs, NH, NKV, HD)
		e.b.TreeAttention(ao, lse, q, k, v, tree, NH, NKV, HD)
		e.b.TreeAttentionBackward(dq, dk, dv, ao, ao, lse, q, k, v, tree, NH, NKV, HD)
		e.b.SwiGLU(ao, q, q, T*NH*HD)
		e.b.TokenLogprob(lp, ent, lse2, x, wv, tb, T, C, V, 1)
		e.b.TokenLogprobBackward(dx, dwv, lp, x, wv, tb, lse2, T, C, V, 1)
		e.b.AdamW(w, dw, mom, vel, kernels.NewAdamWStep(kernels.TorchAdamW, 1e-3, 0.9, 0.999, 1e-8, 0, 1, 1))
		e.b.SumSquares(sq, dw)
		e.b.Fill(dw, 0)
	}
	step()
	// The least of three measurements: under load the runtime may allocate a
	// sudog when a parked worker blocks (counted as a malloc, then reused); an
	// allocation an op makes shows up in every measurement.
	n := testing.AllocsPerRun(5, step)
	for i := 0; i < 2 && n != 0; i++ {
		n = min(n, testing.AllocsPerRun(5, step))
	}
	if n != 0 {
		t.Errorf("warmed-up op sequence allocates %v times per run, want 0", n)
	}
}

func TestMemoryAndStickyError(t *testing.T) {
	e := newEnv(t, 2)
	buf, err := e.b.Alloc(kernels.F32, 10)
	if err != nil {
		t.Fatal(err)
	}
	src := []float32{0, 1, 2, 3, 4, 5, 6, 7, 8, 9}
	e.b.UploadF32(buf, src)
	got := make([]float32, 4)
	e.b.DownloadF32(got, buf.Slice(3, 4))
	if diff := cmp.Diff([]float32{3, 4, 5, 6}, got); diff != "" {
		t.Errorf("download of a view (-want +got):\n%s", diff)
	}
	e.b.Free(buf)
	b2, _ := e.b.Alloc(kernels.F32, 3)
	if diff := cmp.Diff([]float32{0, 0, 0}, e.b.F32(b2)); diff != "" {
		t.Errorf("reused allocation is not zeroed (-want +got):\n%s", diff)
	}

	// A token id out of range is a data error: sticky until Sync, then cleared.
	wte, out := e.f32(randVec(rand.New(rand.NewPCG(1, 1)), 4*3, 1)), e.zeros(2*3)
	e.b.Embedding(out, wte, e.i32([]int32{1, 7}), 2, 3)
	e.b.Fill(b2, 1)
	err = e.b.Sync()
	if err == nil || !contains(err.Error(), "index 7 at row 1") {
		t.Errorf("Sync after a bad token = %v, want an error naming index 7 at row 1", err)
	}
	if err := e.b.Sync(); err != nil {
		t.Errorf("second Sync = %v, want nil", err)
	}
	for _, bad := range [][]int32{{0, 3, 2}, {0, 6, 5}} {
		cu := e.i32(bad)
		e.b.Attention(e.zeros(5*4), e.zeros(5), e.zeros(5*4), e.zeros(5*4), e.zeros(5*4), kernels.Seqs{CuSeqlens: cu, S: 2, MaxLen: 6}, 1, 1, 4)
		if err := e.b.Sync(); err == nil {
			t.Errorf("cu_seqlens %v accepted for T=5", bad)
		}
	}
}

func contains(s, sub string) bool {
	return len(sub) == 0 || (len(s) >= len(sub) && (s[:len(sub)] == sub || contains(s[1:], sub)))
}

func TestAdamWMatchesFloat64(t *testing.T) {
	r := rand.New(rand.NewPCG(23, 23))
	const N = 1000
	e := newEnv(t, 2)
	p, g, m, v := round32(randVec(r, N, 1)), round32(randVec(r, N, 1)), round32(randVec(r, N, 0.1)), round32(randVec(r, N, 0.01))
	for i := range v {
		v[i] = math.Abs(v[i])
	}
	st := kernels.NewAdamWStep(kernels.TorchAdamW, 3e-3, 0.9, 0.95, 1e-8, 0.1, 7, 0.5)
	pb, gb, mb, vb := e.f32(p), e.f32(g), e.f32(m), e.f32(v)
	e.b.AdamW(pb, gb, mb, vb, st)
	e.sync()
	wp, wm, wv := make([]float64, N), make([]float64, N), make([]float64, N)
	for i := range p {
		gg := g[i] * float64(st.GradScale)
		// The exact math on the float32 scalars the step carries.
		b1, b2, lr, wd := float64(st.Beta1), float64(st.Beta2), float64(st.LR), float64(st.WeightDecay)
		omb1, omb2 := float64(st.OneMinusBeta1), float64(st.OneMinusBeta2)
		wm[i] = b1*m[i] + omb1*gg
		wv[i] = b2*v[i] + omb2*gg*gg
		den := math.Sqrt(wv[i])/math.Sqrt(float64(st.BiasCorrection2)) + float64(st.Eps)
		wp[i] = p[i]*(1-lr*wd) - lr/float64(st.BiasCorrection1)*wm[i]/den
	}
	// float32 arithmetic against float64: a few ulp.
	checkClose(t, "param", e.get(pb), wp, 1e-7, 1e-6)
	checkClose(t, "m", e.get(mb), wm, 1e-8, 1e-6)
	checkClose(t, "v", e.get(vb), wv, 1e-10, 1e-6)
}

func TestScatterRowsLastWins(t *testing.T) {
	e := newEnv(t, 2)
	dst := e.zeros(4 * 2)
	src := e.f32([]float64{1, 2, 3, 4, 5, 6})
	e.b.ScatterRows(dst, src, e.i32([]int32{2, 0, 2}), 3, 2)
	e.sync()
	if diff := cmp.Diff([]float64{3, 4, 0, 0, 5, 6, 0, 0}, e.get(dst)); diff != "" {
		t.Errorf("ScatterRows (-want +got):\n%s", diff)
	}
	_ = fmt.Sprint
}
