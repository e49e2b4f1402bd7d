package kerneltest

// Conformance of Nemotron-H's ops (kernels.Mamba) and of the sigmoid
// router (kernels.Router.Sigmoid): the conv and the scan over packed
// sequences and random trees (segments of one token, chains of short
// segments, lengths the chunk does not divide), at toy shapes and at
// Nemotron-3-Nano's head shapes (MP 64, DS 128, 8 groups); the decoding
// forms; the gated norm and the squared ReLU, with bf16 outputs; the
// router with a selection bias, groups and a scale.
//
// A backend without kernels.Mamba skips these cases, saying so: it cannot
// run Nemotron-H, and package model refuses the family on it by name.

import (
	"fmt"
	"math"

	"github.com/tracegrpo/tracegrpo/kernels"
)

// The tolerances of the Mamba ops, against kernels/cpu (fp32 chunked SSD
// in chunks of the config's length, per-head sums in a fixed order).
var (
	// TolConv: KW ≤ 4 products and a silu per element; the backward's
	// weight and bias gradients sum over the T tokens (a few hundred here)
	// in another order.
	TolConv     = Tol{Atol: 1e-5, Rtol: 1e-5}
	TolConvGrad = TolReduce
	// TolScan: y and the final states, fp32 on both sides: a state is a
	// sum of up to a chunk of terms per chunk, carried across the chunks
	// of a context (a few hundred tokens here), each side blocking the
	// chunk's products (C·Bᵀ over DS, M·X over the chunk) in its own order.
	TolScan = Tol{Atol: 5e-5, Rtol: 1e-4}
	// TolScanGrad: the backward's dx, dB, dC, ddt (sums over the chunk and
	// the state's DS·MP), and ddtBias, daLog, dd (sums over every token).
	TolScanGrad = Tol{Atol: 2e-4, Rtol: 2e-4}
	// TolScanBF16: y and the final states from bf16 x, B, C (rounded
	// exactly on both sides). kernels/cuda's chunked SSD on tensor cores
	// (csrc/ssd_fwd.cu) takes its fp32 operands (the decay-masked C·Bᵀ,
	// the decay-weighted X, the chunk's start state) as two bf16 parts
	// each, 16 bits: measured on the emulator (kernels/cuda's
	// TestSSDForwardEmu: lengths to 758 tokens, trees, DS 5 to 128) its
	// worst |err|/(|want|+1) is 9.8e-5 against kernels/cpu and against the
	// sequential recurrence; this is 10 times that. (Rounding them once, as
	// mamba_ssm's Triton kernels do, measured 4.9e-2 there at DS 128.)
	TolScanBF16     = Tol{Atol: 1e-3, Rtol: 1e-3}
	TolScanBF16Grad = Tol{Atol: 6e-2, Rtol: 4e-2}
)

func init() { cases = append(cases, mambaCases...) }

// dutMamba returns the backend under test's Mamba ops, or skips.
func (s *suite) dutMamba() kernels.Mamba {
	s.t.Helper()
	x, ok := s.dut.(kernels.Mamba)
	if !ok {
		s.t.Skipf("%s does not implement kernels.Mamba: it cannot run Nemotron-H (not checked)", s.dut.Name())
	}
	return x
}

// bothMamba is both for the Mamba ops.
func bothMamba(s *suite, f func(x kernels.Mamba, v func(*pairBuf) kernels.Buf)) {
	x := s.dutMamba()
	f(s.ref.(kernels.Mamba), func(p *pairBuf) kernels.Buf { return p.r })
	f(x, func(p *pairBuf) kernels.Buf { return p.d })
}

// seqForest is a forest of roots alone: packed sequences of these lengths.
func seqForest(lens ...int) randomTree {
	tr := randomTree{offs: []int32{0}}
	for _, l := range lens {
		tr.parent = append(tr.parent, -1)
		tr.offs = append(tr.offs, tr.offs[len(tr.offs)-1]+int32(l))
		tr.ends = append(tr.ends, tr.offs[len(tr.offs)-1])
		tr.maxLen, tr.maxCtx = max(tr.maxLen, l), max(tr.maxCtx, l)
	}
	return tr
}

// mambaTrees are the conv's and the scan's packings: sequences (one token;
// lengths the chunk does not divide; many short) and random trees (deep
// chains of one-token segments; wide ones).
func (s *suite) mambaTrees(maxT int) []randomTree {
	trees := []randomTree{
		seqForest(1),
		seqForest(37),
		seqForest(5, 1, 17, 33, 2),
		newRandomTree(s.rng, 6, 2, 1, maxT), // chains of one-token segments
		newRandomTree(s.rng, 3, 4, 9, maxT),
	}
	if !s.reduced {
		trees = append(trees, seqForest(300, 70), newRandomTree(s.rng, 4, 3, 60, 2*maxT))
	}
	return trees
}

// scanShapes: toy shapes, and Nemotron-3-Nano's head shapes (one group's
// worth of heads under Options.Reduced).
func (s *suite) scanShapes() []kernels.Scan {
	inf := float32(math.Inf(1))
	out := []kernels.Scan{
		{MH: 2, MP: 3, G: 1, DS: 5, Chunk: 4, DtMax: inf},
		{MH: 4, MP: 8, G: 2, DS: 16, Chunk: 16, DtMin: 0.05, DtMax: 0.6},
		{MH: 2, MP: 64, G: 1, DS: 128, Chunk: 128, DtMax: inf},
	}
	if !s.reduced {
		out = append(out, kernels.Scan{MH: 16, MP: 64, G: 8, DS: 128, Chunk: 128, DtMax: inf})
	}
	return out
}

// scanInputs are random scan inputs for T tokens: xbc (F32 or BF16),
// dtRaw, dtBias, aLog and d.
func (s *suite) scanInputs(T int, sc kernels.Scan, bf16 bool) (xbc, dtRaw, dtBias, aLog, d *pairBuf) {
	if bf16 {
		xbc = s.randnBF16(T*sc.CD(), 1)
	} else {
		xbc = s.randn(T*sc.CD(), 1)
	}
	dtRaw = s.randn(T*sc.MH, 1.5)
	dtBias = s.randn(sc.MH, 1)
	al := make([]float32, sc.MH)
	for h := range al {
		al[h] = float32(math.Log(float64(1+h)) + 0.3*s.rng.NormFloat64())
	}
	return xbc, dtRaw, dtBias, s.f32(al), s.randn(sc.MH, 1)
}

var mambaCases = []testCase{
	{"Conv1D", func(s *suite) {
		s.dutMamba()
		for _, tr := range s.mambaTrees(120) {
			for _, sh := range []struct {
				CD, KW int
				bias   bool
			}{{5, 4, true}, {70, 2, false}, {136, 4, true}} {
				T, CD, KW := tr.T(), sh.CD, sh.KW
				tree := treeBufs(s, tr)
				inp, w := s.randn(T*CD, 1), s.randn(CD*KW, 0.5)
				var bias, dbias *pairBuf
				if sh.bias {
					bias, dbias = s.randn(CD, 0.5), s.randn(CD, 1)
				}
				out, out16 := s.out(T*CD), s.randnBF16(T*CD, 1)
				dout := s.randn(T*CD, 1)
				dinp, dw := s.out(T*CD), s.randn(CD*KW, 1)
				opt := func(p *pairBuf, v func(*pairBuf) kernels.Buf) kernels.Buf {
					if p == nil {
						return kernels.Buf{}
					}
					return v(p)
				}
				bothMamba(s, func(x kernels.Mamba, v func(*pairBuf) kernels.Buf) {
					x.Conv1D(v(out), v(inp), v(w), opt(bias, v), tree(v), T, CD, KW)
					x.Conv1D(v(out16), v(inp), v(w), opt(bias, v), tree(v), T, CD, KW)
					x.Conv1DBackward(v(dinp), v(dw), opt(dbias, v), v(dout), v(inp), v(w), opt(bias, v), tree(v), T, CD, KW)
				})
				tag := fmt.Sprintf("%s CD=%d KW=%d bias=%v", tr, CD, KW, sh.bias)
				s.check("Conv1D out "+tag, out, TolConv)
				s.check("Conv1D bf16 out "+tag, out16, TolBF16Out)
				s.check("Conv1DBackward dinp "+tag, dinp, TolConvGrad)
				s.check("Conv1DBackward dweight += "+tag, dw, TolConvGrad)
				if sh.bias {
					s.check("Conv1DBackward dbias += "+tag, dbias, TolConvGrad)
				}
			}
		}
	}},
	{"SSMScan", func(s *suite) {
		s.dutMamba()
		for si, sc := range s.scanShapes() {
			maxT := 120
			if sc.DS >= 128 {
				maxT = 300
			}
			for ti, tr := range s.mambaTrees(maxT) {
				if sc.MH >= 16 && ti%2 == 1 {
					continue // the largest heads on every other packing
				}
				for _, bf16 := range []bool{false, true} {
					if bf16 && si == 0 {
						continue
					}
					T := tr.T()
					tree := treeBufs(s, tr)
					xbc, dtRaw, dtBias, aLog, d := s.scanInputs(T, sc, bf16)
					y, final := s.out(T*sc.DI()), s.out(len(tr.parent)*sc.DI()*sc.DS)
					dy := s.randn(T*sc.DI(), 1)
					dxbc, ddt := s.out(T*sc.CD()), s.out(T*sc.MH)
					ddtBias, daLog, dd := s.randn(sc.MH, 1), s.randn(sc.MH, 1), s.randn(sc.MH, 1)
					bothMamba(s, func(x kernels.Mamba, v func(*pairBuf) kernels.Buf) {
						x.SSMScan(v(y), v(final), v(xbc), v(dtRaw), v(dtBias), v(aLog), v(d), tree(v), T, sc)
						x.SSMScanBackward(v(dxbc), v(ddt), v(ddtBias), v(daLog), v(dd), v(dy), v(xbc), v(dtRaw), v(dtBias), v(aLog), v(d), tree(v), T, sc)
					})
					tag := fmt.Sprintf("%s %+v bf16=%v", tr, sc, bf16)
					tol, gtol := TolScan, TolScanGrad
					if bf16 {
						tol, gtol = TolScanBF16, TolScanBF16Grad
					}
					s.check("SSMScan y "+tag, y, tol)
					s.check("SSMScan final "+tag, final, tol)
					s.check("SSMScanBackward dxbc "+tag, dxbc, gtol)
					s.check("SSMScanBackward ddtRaw "+tag, ddt, gtol)
					s.check("SSMScanBackward ddtBias += "+tag, ddtBias, gtol)
					s.check("SSMScanBackward daLog += "+tag, daLog, gtol)
					s.check("SSMScanBackward dd += "+tag, dd, gtol)
				}
			}
		}
	}},
	{"MambaDecode", func(s *suite) {
		s.dutMamba()
		for _, sc := range s.scanShapes()[:2] {
			for _, B := range []int{1, 5} {
				const KW = 4
				CD := sc.CD()
				win, inp := s.randn(B*(KW-1)*CD, 1), s.randn(B*CD, 1)
				w, bias := s.randn(CD*KW, 0.5), s.randn(CD, 0.5)
				xbc, xbc16 := s.out(B*CD), s.randnBF16(B*CD, 1)
				state := s.randn(B*sc.DI()*sc.DS, 1)
				_, dtRaw, dtBias, aLog, d := s.scanInputs(B, sc, false)
				y := s.out(B * sc.DI())
				bothMamba(s, func(x kernels.Mamba, v func(*pairBuf) kernels.Buf) {
					x.Conv1DDecode(v(xbc), v(win), v(inp), v(w), v(bias), B, CD, KW)
					x.Conv1DDecode(v(xbc16), v(win), v(inp), v(w), v(bias), B, CD, KW) // the window shifted once more
					x.SSMDecode(v(y), v(state), v(xbc), v(dtRaw), v(dtBias), v(aLog), v(d), B, sc)
				})
				tag := fmt.Sprintf("B=%d %+v", B, sc)
				s.check("Conv1DDecode out "+tag, xbc, TolConv)
				s.check("Conv1DDecode bf16 out (second token) "+tag, xbc16, TolBF16Out)
				s.check("Conv1DDecode window "+tag, win, TolExact)
				s.check("SSMDecode y "+tag, y, TolReduce)
				s.check("SSMDecode state "+tag, state, TolReduce)
			}
		}
	}},
	{"GatedRMSNorm", func(s *suite) {
		s.dutMamba()
		for _, sh := range []struct{ N, D, GS int }{{1, 8, 8}, {37, 96, 32}, {5, 4096, 512}, {3, 130, 65}} {
			y, z, w := s.randn(sh.N*sh.D, 1), s.randn(sh.N*sh.D, 2), s.randn(sh.D, 1)
			out, out16, rstd := s.out(sh.N*sh.D), s.randnBF16(sh.N*sh.D, 1), s.out(sh.N*sh.D/sh.GS)
			dout := s.randn(sh.N*sh.D, 1)
			dy, dz, dw := s.out(sh.N*sh.D), s.out(sh.N*sh.D), s.randn(sh.D, 1)
			bothMamba(s, func(x kernels.Mamba, v func(*pairBuf) kernels.Buf) {
				x.GatedRMSNorm(v(out16), v(rstd), v(y), v(z), v(w), sh.N, sh.D, sh.GS, 1e-5)
				x.GatedRMSNorm(v(out), v(rstd), v(y), v(z), v(w), sh.N, sh.D, sh.GS, 1e-5)
				x.GatedRMSNormBackward(v(dy), v(dz), v(dw), v(dout), v(y), v(z), v(w), v(rstd), sh.N, sh.D, sh.GS)
			})
			tag := fmt.Sprintf("N=%d D=%d GS=%d", sh.N, sh.D, sh.GS)
			s.check("GatedRMSNorm out "+tag, out, TolElementwise)
			s.check("GatedRMSNorm bf16 out "+tag, out16, TolBF16Out)
			s.check("GatedRMSNorm rstd "+tag, rstd, TolElementwise)
			s.check("GatedRMSNormBackward dy "+tag, dy, TolReduce)
			s.check("GatedRMSNormBackward dz "+tag, dz, TolReduce)
			s.check("GatedRMSNormBackward dweight += "+tag, dw, TolReduce)
		}
	}},
	{"ReLU2", func(s *suite) {
		s.dutMamba()
		for _, n := range []int{1, 37, 5000} {
			inp, inp16 := s.randn(n, 1), s.randnBF16(n, 1)
			out, out16 := s.out(n), s.randnBF16(n, 1)
			dout := s.randn(n, 1)
			dinp, dinp16 := s.out(n), s.out(n)
			bothMamba(s, func(x kernels.Mamba, v func(*pairBuf) kernels.Buf) {
				x.ReLU2(v(out), v(inp), n)
				x.ReLU2(v(out16), v(inp16), n)
				x.ReLU2Backward(v(dinp), v(dout), v(inp), n)
				x.ReLU2Backward(v(dinp16), v(dout), v(inp16), n)
			})
			tag := fmt.Sprintf("N=%d", n)
			s.check("ReLU2 out "+tag, out, TolExact)
			s.check("ReLU2 bf16 "+tag, out16, TolExact)
			s.check("ReLU2Backward dinp "+tag, dinp, TolExact)
			s.check("ReLU2Backward dinp of bf16 "+tag, dinp16, TolExact)
		}
	}},
	{"RouterTopKSigmoid", func(s *suite) {
		// The sigmoid router ships with Nemotron-H's ops: a backend
		// without kernels.Mamba skips it with them.
		s.dutMamba()
		for _, sh := range []struct {
			T, E, K, Groups, TopGroups int
			bias, norm                 bool
			scale                      float32
		}{
			{1, 4, 2, 0, 0, false, true, 0},
			{37, 16, 4, 0, 0, true, true, 2.5},
			{20, 8, 1, 0, 0, true, false, 1.5},
			{64, 128, 6, 0, 0, true, true, 2.5}, // Nemotron-3-Nano's router
			{40, 16, 4, 4, 2, true, true, 2.5},  // group-limited
			{25, 12, 2, 3, 1, false, false, 0},
		} {
			z := s.routerLogits(sh.T, sh.E)
			logits := s.f32(z)
			probs, weights := s.out(sh.T*sh.E), s.out(sh.T*sh.K)
			experts := s.i32(make([]int32, sh.T*sh.K))
			dweights, dprobs := s.randn(sh.T*sh.K, 1), s.randn(sh.E, 0.1)
			dl, dl16 := s.out(sh.T*sh.E), s.randnBF16(sh.T*sh.E, 1)
			var bias *pairBuf
			if sh.bias {
				bias = s.randn(sh.E, 0.3)
			}
			bothExperts(s, func(x kernels.Experts, v func(*pairBuf) kernels.Buf) {
				r := kernels.Router{K: sh.K, Norm: sh.norm, Sigmoid: true, Groups: sh.Groups, TopGroups: sh.TopGroups, Scale: sh.scale}
				if bias != nil {
					r.Bias = v(bias)
				}
				x.RouterTopK(v(probs), v(weights), v(experts), v(logits), sh.T, sh.E, r)
				x.RouterTopKBackward(v(dl), v(dweights), v(probs), v(weights), v(experts), v(dprobs), sh.T, sh.E, r)
				x.RouterTopKBackward(v(dl16), v(dweights), v(probs), v(weights), v(experts), kernels.Buf{}, sh.T, sh.E, r)
			})
			tag := fmt.Sprintf("T=%d E=%d K=%d groups=%d/%d bias=%v norm=%v scale=%g", sh.T, sh.E, sh.K, sh.TopGroups, sh.Groups, sh.bias, sh.norm, sh.scale)
			s.check("RouterTopK sigmoid probs "+tag, probs, TolElementwise)
			s.checkI32("RouterTopK sigmoid experts "+tag, experts)
			s.check("RouterTopK sigmoid weights "+tag, weights, TolElementwise)
			s.check("RouterTopKBackward sigmoid dlogits "+tag, dl, TolReduce)
			s.check("RouterTopKBackward sigmoid bf16 dlogits "+tag, dl16, TolBF16Out)
		}
	}},
}
