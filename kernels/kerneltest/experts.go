package kerneltest

// Conformance of the sparse-layer ops (kernels.Experts). Expert loads are
// random and uneven: some experts get most assignments, some none (their
// logits are pushed down by 30, so they are never chosen), and some rows
// tie exactly (two experts with the same logit).

import (
	"fmt"
	"slices"

	"github.com/tracegrpo/tracegrpo/kernels"
)

func init() { cases = append(cases, expertCases...) }

// expertShapes: T tokens routed to K of E experts, hidden width C, expert
// width OC. The first has a single token; the others leave experts empty.
var expertShapes = []struct{ T, E, K, C, OC int }{
	{1, 4, 2, 8, 5},
	{37, 16, 2, 33, 24},
	{64, 16, 8, 64, 96},
	{20, 8, 1, 24, 40},
	{50, 16, 16, 16, 8}, // K = E: every expert takes every token
}

// shapes returns expertShapes, less the largest (512 assignments) under
// Options.Reduced except where keep says so (the emulator runs every
// thread as a fiber).
func (s *suite) expertShapes(keep bool) []struct{ T, E, K, C, OC int } {
	if !s.reduced || keep {
		return expertShapes
	}
	return append(slices.Clone(expertShapes[:2]), expertShapes[3:]...)
}

// dutExperts returns the backend under test's sparse ops.
func (s *suite) dutExperts() kernels.Experts {
	s.t.Helper()
	x, ok := s.dut.(kernels.Experts)
	if !ok {
		s.t.Fatalf("%s does not implement kernels.Experts: it cannot run sparse layers", s.dut.Name())
	}
	return x
}

// bothExperts is both for the sparse ops.
func bothExperts(s *suite, f func(x kernels.Experts, v func(*pairBuf) kernels.Buf)) {
	x := s.dutExperts()
	f(s.ref.(kernels.Experts), func(p *pairBuf) kernels.Buf { return p.r })
	f(x, func(p *pairBuf) kernels.Buf { return p.d })
}

// routerLogits returns T×E logits with uneven loads: a per-expert offset
// (N(0,1)), a third of the experts (never all) pushed down by 30 so that
// they stay empty unless K forces them in, and every fifth row with an
// exact tie between two experts.
func (s *suite) routerLogits(T, E int) []float32 {
	bias := make([]float64, E)
	for e := range bias {
		bias[e] = s.rng.NormFloat64()
		if e%3 == 1 {
			bias[e] -= 30
		}
	}
	z := make([]float32, T*E)
	for t := 0; t < T; t++ {
		for e := 0; e < E; e++ {
			z[t*E+e] = float32(2*s.rng.NormFloat64() + bias[e])
		}
		if t%5 == 0 && E > 2 {
			a, b := s.rng.IntN(E), s.rng.IntN(E)
			z[t*E+b] = z[t*E+a]
		}
	}
	return z
}

// hostRoute is ExpertRoute computed here: offsets, order and slot.
func hostRoute(experts []int32, E int) (off, order, slot []int32) {
	off = make([]int32, E+1)
	for _, e := range experts {
		off[e+1]++
	}
	for e := 0; e < E; e++ {
		off[e+1] += off[e]
	}
	cur := slices.Clone(off[:E])
	order, slot = make([]int32, len(experts)), make([]int32, len(experts))
	for i, e := range experts {
		order[cur[e]], slot[i] = int32(i), cur[e]
		cur[e]++
	}
	return off, order, slot
}

// randomExperts draws K distinct experts per token from a skewed
// distribution that leaves some experts empty (unless K forces them in).
func (s *suite) randomExperts(T, E, K int) []int32 {
	w := make([]float64, E)
	for e := range w {
		w[e] = float64(e%5) * s.rng.Float64() // experts 0, 5, 10, ... weigh 0
	}
	ex := make([]int32, 0, T*K)
	for t := 0; t < T; t++ {
		row := make([]int32, 0, K)
		for len(row) < K {
			var e int
			if left := E - len(row); left <= K-len(row) || s.rng.IntN(8) == 0 {
				e = s.rng.IntN(E) // sometimes anyone, and always when forced
			} else {
				e = s.pick(w)
			}
			if !slices.Contains(row, int32(e)) {
				row = append(row, int32(e))
			}
		}
		ex = append(ex, row...)
	}
	return ex
}

func (s *suite) pick(w []float64) int {
	var sum float64
	for _, x := range w {
		sum += x
	}
	u := s.rng.Float64() * sum
	for i, x := range w {
		if u -= x; u < 0 {
			return i
		}
	}
	return s.rng.IntN(len(w))
}

// empties counts experts with no rows.
func empties(off []int32) int {
	n := 0
	for e := 0; e+1 < len(off); e++ {
		if off[e] == off[e+1] {
			n++
		}
	}
	return n
}

var expertCases = []testCase{
	{"RouterTopK", func(s *suite) {
		sawEmpty, sawTie := false, false
		for _, sh := range s.expertShapes(true) {
			for _, norm := range []bool{true, false} {
				r := kernels.Router{K: sh.K, Norm: norm}
				z := s.routerLogits(sh.T, sh.E)
				logits := s.f32(z)
				probs, weights := s.out(sh.T*sh.E), s.out(sh.T*sh.K)
				experts := s.i32(make([]int32, sh.T*sh.K))
				dweights := s.randn(sh.T*sh.K, 1)
				dprobs := s.randn(sh.E, 0.1)
				dl, dlBias, dl16 := s.out(sh.T*sh.E), s.out(sh.T*sh.E), s.randnBF16(sh.T*sh.E, 1)
				bothExperts(s, func(x kernels.Experts, v func(*pairBuf) kernels.Buf) {
					x.RouterTopK(v(probs), v(weights), v(experts), v(logits), sh.T, sh.E, r)
					x.RouterTopKBackward(v(dl), v(dweights), v(probs), v(weights), v(experts), kernels.Buf{}, sh.T, sh.E, r)
					x.RouterTopKBackward(v(dlBias), v(dweights), v(probs), v(weights), v(experts), v(dprobs), sh.T, sh.E, r)
					x.RouterTopKBackward(v(dl16), v(dweights), v(probs), v(weights), v(experts), v(dprobs), sh.T, sh.E, r)
				})
				tag := fmt.Sprintf("T=%d E=%d K=%d norm=%v", sh.T, sh.E, sh.K, norm)
				s.check("RouterTopK probs "+tag, probs, TolElementwise)
				s.checkI32("RouterTopK experts "+tag, experts)
				s.check("RouterTopK weights "+tag, weights, TolElementwise)
				s.check("RouterTopKBackward dlogits "+tag, dl, TolReduce)
				s.check("RouterTopKBackward dlogits with dprobs "+tag, dlBias, TolReduce)
				s.check("RouterTopKBackward bf16 dlogits "+tag, dl16, TolBF16Out)

				// The reference itself: experts are the K largest probs in
				// descending order, ties to the lower id (the contract).
				ex := make([]int32, sh.T*sh.K)
				p := make([]float32, sh.T*sh.E)
				s.ref.DownloadI32(ex, experts.r)
				s.ref.DownloadF32(p, probs.r)
				for t := 0; t < sh.T; t++ {
					row := p[t*sh.E : (t+1)*sh.E]
					idx := make([]int32, sh.E)
					for e := range idx {
						idx[e] = int32(e)
					}
					slices.SortStableFunc(idx, func(a, b int32) int {
						switch {
						case row[a] > row[b]:
							return -1
						case row[a] < row[b]:
							return 1
						}
						return 0
					})
					if got := ex[t*sh.K : (t+1)*sh.K]; !slices.Equal(got, idx[:sh.K]) {
						s.t.Errorf("%s row %d: reference chose %v, want %v (the K largest, ties to the lower id)", tag, t, got, idx[:sh.K])
					}
					for j := 1; j < sh.K; j++ {
						if row[idx[j]] == row[idx[j-1]] {
							sawTie = true
						}
					}
				}
				off, _, _ := hostRoute(ex, sh.E)
				if empties(off) > 0 {
					sawEmpty = true
				}
			}
		}
		if !sawEmpty || !sawTie {
			s.t.Errorf("the router shapes exercised no empty expert (%v) or no tie inside the top k (%v)", sawEmpty, sawTie)
		}
	}},
	{"ExpertRoute", func(s *suite) {
		for _, sh := range s.expertShapes(true) {
			ex := s.randomExperts(sh.T, sh.E, sh.K)
			wantOff, wantOrder, wantSlot := hostRoute(ex, sh.E)
			experts := s.i32(ex)
			offsets := s.i32(make([]int32, sh.E+1))
			order, slot := s.i32(make([]int32, sh.T*sh.K)), s.i32(make([]int32, sh.T*sh.K))
			bothExperts(s, func(x kernels.Experts, v func(*pairBuf) kernels.Buf) {
				x.ExpertRoute(v(offsets), v(order), v(slot), v(experts), sh.T, sh.K, sh.E)
			})
			tag := fmt.Sprintf("T=%d E=%d K=%d (%d empty experts)", sh.T, sh.E, sh.K, empties(wantOff))
			s.checkI32("ExpertRoute offsets "+tag, offsets)
			s.checkI32("ExpertRoute order "+tag, order)
			s.checkI32("ExpertRoute slot "+tag, slot)
			s.wantI32("ExpertRoute offsets (host) "+tag, offsets, wantOff)
			s.wantI32("ExpertRoute order (host) "+tag, order, wantOrder)
			s.wantI32("ExpertRoute slot (host) "+tag, slot, wantSlot)
		}
	}},
	{"ExpertRouteBadExpert", func(s *suite) {
		experts := s.i32([]int32{0, 1, 2, 4, 1, 3}) // E = 4: id 4 is out of range
		offsets, order, slot := s.i32(make([]int32, 5)), s.i32(make([]int32, 6)), s.i32(make([]int32, 6))
		offsets.checkMargins, order.checkMargins, slot.checkMargins = true, true, true
		bothExperts(s, func(x kernels.Experts, v func(*pairBuf) kernels.Buf) {
			x.ExpertRoute(v(offsets), v(order), v(slot), v(experts), 3, 2, 4)
		})
		s.wantSyncError("expert id 4 of 4 experts")
	}},
	{"ExpertGatherCombine", func(s *suite) {
		for _, sh := range s.expertShapes(false) {
			N := sh.T * sh.K
			ex := s.randomExperts(sh.T, sh.E, sh.K)
			_, ord, sl := hostRoute(ex, sh.E)
			order, slot := s.i32(ord), s.i32(sl)
			src := s.randn(sh.T*sh.C, 1)
			src16 := s.randnBF16(sh.T*sh.C, 1)
			dst, dst16, dst16from32 := s.out(N*sh.C), s.randnBF16(N*sh.C, 1), s.randnBF16(N*sh.C, 1)
			ddst := s.randn(N*sh.C, 1)
			dsrc := s.randn(sh.T*sh.C, 1)
			y := s.randn(N*sh.C, 1)
			w := s.randn(N, 0.5)
			out := s.out(sh.T * sh.C)
			dout := s.randn(sh.T*sh.C, 1)
			dy, dy16, dw := s.out(N*sh.C), s.randnBF16(N*sh.C, 1), s.out(N)
			bothExperts(s, func(x kernels.Experts, v func(*pairBuf) kernels.Buf) {
				x.ExpertGather(v(dst), v(src), v(order), sh.T, sh.K, sh.C)
				x.ExpertGather(v(dst16), v(src16), v(order), sh.T, sh.K, sh.C)
				x.ExpertGather(v(dst16from32), v(src), v(order), sh.T, sh.K, sh.C)
				x.ExpertGatherBackward(v(dsrc), v(ddst), v(slot), sh.T, sh.K, sh.C)
				x.ExpertCombine(v(out), v(y), v(w), v(slot), sh.T, sh.K, sh.C)
				x.ExpertCombineBackward(v(dy), v(dw), v(dout), v(y), v(w), v(order), v(slot), sh.T, sh.K, sh.C)
				x.ExpertCombineBackward(v(dy16), v(dw), v(dout), v(y), v(w), v(order), v(slot), sh.T, sh.K, sh.C)
			})
			tag := fmt.Sprintf("T=%d E=%d K=%d C=%d", sh.T, sh.E, sh.K, sh.C)
			s.check("ExpertGather "+tag, dst, TolExact)
			s.check("ExpertGather bf16 "+tag, dst16, TolExact)
			s.check("ExpertGather f32→bf16 "+tag, dst16from32, TolExact)
			// K terms added in j order on both sides (the contract).
			s.check("ExpertGatherBackward dsrc "+tag, dsrc, TolReduce)
			s.check("ExpertCombine out "+tag, out, TolReduce)
			s.check("ExpertCombineBackward dy "+tag, dy, TolExact)
			s.check("ExpertCombineBackward bf16 dy "+tag, dy16, TolBF16Out)
			s.check("ExpertCombineBackward dweights "+tag, dw, TolReduce)
		}
	}},
	{"GroupedMatmul", func(s *suite) {
		for _, sh := range s.expertShapes(true) {
			N := sh.T * sh.K
			ex := s.randomExperts(sh.T, sh.E, sh.K)
			off, _, _ := hostRoute(ex, sh.E)
			offsets := s.i32(off)
			inp, w := s.randn(N*sh.C, 1), s.randn(sh.E*sh.OC*sh.C, 1)
			out := s.out(N * sh.OC)
			dout := s.randn(N*sh.OC, 1)
			dinp, dw, dw2 := s.randn(N*sh.C, 1), s.randn(sh.E*sh.OC*sh.C, 1), s.randn(sh.E*sh.OC*sh.C, 1)
			bothExperts(s, func(x kernels.Experts, v func(*pairBuf) kernels.Buf) {
				x.GroupedMatmul(v(out), v(inp), v(w), v(offsets), N, sh.C, sh.OC, sh.E)
				x.GroupedMatmulBackward(v(dinp), v(dw), v(dout), v(inp), v(w), v(offsets), N, sh.C, sh.OC, sh.E)
				x.GroupedMatmulBackward(kernels.Buf{}, v(dw2), v(dout), v(inp), v(w), v(offsets), N, sh.C, sh.OC, sh.E)
			})
			tag := fmt.Sprintf("N=%d E=%d C=%d OC=%d (%d empty experts)", N, sh.E, sh.C, sh.OC, empties(off))
			s.check("GroupedMatmul out "+tag, out, TolMatmul)
			s.check("GroupedMatmulBackward dinp "+tag, dinp, TolMatmul)
			// An empty expert's dweight keeps its random contents exactly.
			s.check("GroupedMatmulBackward dweight "+tag, dw, TolMatmul)
			s.check("GroupedMatmulBackward dweight (no dinp) "+tag, dw2, TolMatmul)
		}
	}},
	{"GroupedMatmulBF16", func(s *suite) {
		for _, sh := range s.expertShapes(false) {
			for _, aligned := range []bool{true, false} {
				s.aligned = aligned
				N := sh.T * sh.K
				ex := s.randomExperts(sh.T, sh.E, sh.K)
				off, _, _ := hostRoute(ex, sh.E)
				offsets := s.i32(off)
				inp, w := s.randnBF16(N*sh.C, 1), s.randnBF16(sh.E*sh.OC*sh.C, 1)
				out32, out16 := s.out(N*sh.OC), s.randnBF16(N*sh.OC, 1)
				dout := s.randnBF16(N*sh.OC, 1)
				dinp, dw := s.randn(N*sh.C, 1), s.randn(sh.E*sh.OC*sh.C, 1)
				bothExperts(s, func(x kernels.Experts, v func(*pairBuf) kernels.Buf) {
					x.GroupedMatmul(v(out32), v(inp), v(w), v(offsets), N, sh.C, sh.OC, sh.E)
					x.GroupedMatmul(v(out16), v(inp), v(w), v(offsets), N, sh.C, sh.OC, sh.E)
					x.GroupedMatmulBackward(v(dinp), v(dw), v(dout), v(inp), v(w), v(offsets), N, sh.C, sh.OC, sh.E)
				})
				tag := fmt.Sprintf("N=%d E=%d C=%d OC=%d aligned=%v", N, sh.E, sh.C, sh.OC, aligned)
				// bf16 products are exact in fp32: only the summation order
				// differs, as for Matmul.
				s.check("GroupedMatmul bf16 → f32 "+tag, out32, TolMatmul)
				s.check("GroupedMatmul bf16 → bf16 "+tag, out16, TolBF16Out)
				s.check("GroupedMatmulBackward bf16 dinp "+tag, dinp, TolMatmul)
				s.check("GroupedMatmulBackward bf16 dweight "+tag, dw, TolMatmul)
			}
		}
		s.aligned = false
	}},
}

// wantI32 compares the backend under test's I32 view with want.
func (s *suite) wantI32(name string, p *pairBuf, want []int32) {
	s.t.Helper()
	got := make([]int32, p.n)
	s.dut.DownloadI32(got, p.d)
	if !slices.Equal(got, want) {
		s.t.Errorf("%s: got %v, want %v", name, got, want)
	}
}
