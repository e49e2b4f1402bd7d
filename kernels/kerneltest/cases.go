package kerneltest

import (
	"fmt"
	"math"

	"github.com/tracegrpo/tracegrpo/kernels"
)

type testCase struct {
	name string
	run  func(s *suite)
}

// Shapes shared by the cases.
var (
	rowShapes = []struct{ N, C int }{{1, 8}, {37, 33}, {64, 128}, {5, 300}, {3, 12300}} // 12300: wider than a block's shared memory
	mmShapes  = []struct{ T, C, OC int }{{1, 8, 5}, {37, 33, 65}, {64, 128, 96}, {3, 300, 7}}
	// Packed micro-batches: sequence lengths.
	seqShapes = [][]int{
		{1},
		{37},
		{5, 1, 17, 33, 2},
		{3, 1, 2, 4, 1, 1, 3, 2, 4, 1, 2, 3, 1, 4, 2, 1, 3, 1, 2, 2}, // many short
		{70, 3},
	}
	headShapes = []struct{ NH, NKV, HD int }{{4, 4, 16}, {4, 2, 40}, {6, 1, 8}, {2, 1, 128}}
)

func (s *suite) randTokens(n, V int) []int32 {
	v := make([]int32, n)
	for i := range v {
		v[i] = int32(s.rng.IntN(V))
	}
	return v
}

func seqs(s *suite, lens []int) (kernels.Seqs, *pairBuf, int) {
	cu := []int32{0}
	maxLen := 0
	for _, l := range lens {
		cu = append(cu, cu[len(cu)-1]+int32(l))
		maxLen = max(maxLen, l)
	}
	p := s.i32(cu)
	T := int(cu[len(cu)-1])
	return kernels.Seqs{S: len(lens), MaxLen: maxLen}, p, T
}

// both runs f on the reference's and the backend's views.
func both(s *suite, f func(b kernels.Backend, view func(*pairBuf) kernels.Buf)) {
	f(s.ref, func(p *pairBuf) kernels.Buf { return p.r })
	f(s.dut, func(p *pairBuf) kernels.Buf { return p.d })
}

var cases = []testCase{
	{"Embedding", func(s *suite) {
		for _, sh := range []struct{ T, C, V int }{{1, 8, 5}, {37, 33, 50}, {100, 64, 7}, {300, 300, 130}} {
			wte := s.randn(sh.V*sh.C, 1)
			tok := s.i32(s.randTokens(sh.T, sh.V))
			out := s.out(sh.T * sh.C)
			dout := s.randn(sh.T*sh.C, 1)
			dwte := s.randn(sh.V*sh.C, 1)
			both(s, func(b kernels.Backend, v func(*pairBuf) kernels.Buf) {
				b.Embedding(v(out), v(wte), v(tok), sh.T, sh.C)
				b.EmbeddingBackward(v(dwte), v(dout), v(tok), sh.T, sh.C)
			})
			s.check(fmt.Sprintf("Embedding out T=%d C=%d", sh.T, sh.C), out, TolExact)
			// Every backend sums each dwte element over its tokens in token
			// order (a determinism requirement), so the result is exact.
			s.check(fmt.Sprintf("EmbeddingBackward dwte T=%d C=%d V=%d", sh.T, sh.C, sh.V), dwte, TolExact)
		}
	}},
	{"EmbeddingBadToken", func(s *suite) {
		wte := s.randn(5*8, 1)
		tok := s.i32([]int32{1, 7, 2})
		out := s.out(3 * 8)
		both(s, func(b kernels.Backend, v func(*pairBuf) kernels.Buf) { b.Embedding(v(out), v(wte), v(tok), 3, 8) })
		s.wantSyncError("token id 7 of a 5-row table")
		s.check("Embedding out (bad token row zeroed)", out, TolExact)
	}},
	{"RMSNorm", func(s *suite) {
		for i, sh := range rowShapes {
			sd := 2.0
			if i == 1 {
				sd = 1e-3 // mean(x²) ≈ eps: eps must be applied exactly
			}
			inp := s.randn(sh.N*sh.C, sd)
			w := s.randn(sh.C, 1)
			out, rstd := s.out(sh.N*sh.C), s.out(sh.N)
			dout := s.randn(sh.N*sh.C, 1)
			dinp, dw := s.randn(sh.N*sh.C, 1), s.randn(sh.C, 1)
			both(s, func(b kernels.Backend, v func(*pairBuf) kernels.Buf) {
				b.RMSNorm(v(out), v(rstd), v(inp), v(w), sh.N, sh.C, 1e-6)
				b.RMSNormBackward(v(dinp), v(dw), v(dout), v(inp), v(w), v(rstd), sh.N, sh.C)
			})
			tag := fmt.Sprintf("N=%d C=%d", sh.N, sh.C)
			s.check("RMSNorm out "+tag, out, TolElementwise)
			s.check("RMSNorm rstd "+tag, rstd, TolElementwise)
			s.check("RMSNormBackward dinp "+tag, dinp, TolReduce)
			s.check("RMSNormBackward dweight "+tag, dw, TolReduce)
		}
		// Aligned views (a backend's 16-byte paths) of the widths a model
		// norms, per head (64, 96, 128) and per token (2048 and wider),
		// with more rows than a block works on at once, and a width that is
		// not a multiple of 8.
		s.aligned = true
		for _, sh := range []struct{ N, C int }{{300, 128}, {61, 96}, {70, 64}, {9, 2048}, {3, 4096}, {2, 8192}, {4, 4100}} {
			inp, w := s.randn(sh.N*sh.C, 2), s.randn(sh.C, 1)
			out, rstd := s.out(sh.N*sh.C), s.out(sh.N)
			dout, dinp, dw := s.randn(sh.N*sh.C, 1), s.randn(sh.N*sh.C, 1), s.randn(sh.C, 1)
			both(s, func(b kernels.Backend, v func(*pairBuf) kernels.Buf) {
				b.RMSNorm(v(out), v(rstd), v(inp), v(w), sh.N, sh.C, 1e-6)
				b.RMSNormBackward(v(dinp), v(dw), v(dout), v(inp), v(w), v(rstd), sh.N, sh.C)
			})
			tag := fmt.Sprintf("N=%d C=%d aligned", sh.N, sh.C)
			s.check("RMSNormBackward dinp "+tag, dinp, TolReduce)
			s.check("RMSNormBackward dweight "+tag, dw, TolReduce)
		}
		s.aligned = false
	}},
	{"RMSNormBF16Fused", func(s *suite) {
		// RMSNorm's bf16 output (the cast to the next GEMM's input) and the
		// fused residual add (kernels.AddRMSNormer), on aligned views
		// (16-byte paths) and unaligned ones, C a multiple of 8 or not.
		for i, sh := range []struct{ N, C int }{{1, 8}, {37, 33}, {64, 128}, {5, 2048}, {3, 12304}, {7, 96}} {
			for _, aligned := range []bool{true, false} {
				s.aligned = aligned
				inp := s.randn(sh.N*sh.C, 2)
				w := s.randn(sh.C, 1)
				out16, rstd := s.randnBF16(sh.N*sh.C, 1), s.out(sh.N)
				a, b := s.randn(sh.N*sh.C, 1), s.randn(sh.N*sh.C, 1)
				sum, fout32, fout16, frstd := s.out(sh.N*sh.C), s.out(sh.N*sh.C), s.randnBF16(sh.N*sh.C, 1), s.out(sh.N)
				alias := s.randn(sh.N*sh.C, 1) // AddRMSNorm with sum aliasing a
				aout, arstd := s.out(sh.N*sh.C), s.out(sh.N)
				fused := 0
				both(s, func(be kernels.Backend, v func(*pairBuf) kernels.Buf) {
					be.RMSNorm(v(out16), v(rstd), v(inp), v(w), sh.N, sh.C, 1e-6)
					if f, ok := be.(kernels.AddRMSNormer); ok {
						fused++
						f.AddRMSNorm(v(sum), v(fout32), v(frstd), v(a), v(b), v(w), sh.N, sh.C, 1e-6)
						f.AddRMSNorm(v(sum), v(fout16), v(frstd), v(a), v(b), v(w), sh.N, sh.C, 1e-6)
						f.AddRMSNorm(v(alias), v(aout), v(arstd), v(alias), v(b), v(w), sh.N, sh.C, 1e-6)
					}
				})
				tag := fmt.Sprintf("N=%d C=%d aligned=%v", sh.N, sh.C, aligned)
				s.check("RMSNorm bf16 out "+tag, out16, TolBF16Out)
				s.check("RMSNorm bf16 out rstd "+tag, rstd, TolElementwise)
				if fused == 1 && i == 0 && aligned {
					s.t.Logf("%s does not implement kernels.AddRMSNormer: not checked", s.dut.Name())
				}
				if fused == 2 {
					s.check("AddRMSNorm sum "+tag, sum, TolExact)
					s.check("AddRMSNorm out "+tag, fout32, TolElementwise)
					s.check("AddRMSNorm bf16 out "+tag, fout16, TolBF16Out)
					s.check("AddRMSNorm rstd "+tag, frstd, TolElementwise)
					s.check("AddRMSNorm sum aliasing a "+tag, alias, TolExact)
					s.check("AddRMSNorm out, sum aliasing a "+tag, aout, TolElementwise)
				}
			}
		}
		s.aligned = false
	}},
	{"Matmul", func(s *suite) {
		for _, sh := range mmShapes {
			inp, w := s.randn(sh.T*sh.C, 1), s.randn(sh.OC*sh.C, 1)
			out := s.out(sh.T * sh.OC)
			dout := s.randn(sh.T*sh.OC, 1)
			dinp, dw := s.randn(sh.T*sh.C, 1), s.randn(sh.OC*sh.C, 1)
			dw2 := s.randn(sh.OC*sh.C, 1)
			both(s, func(b kernels.Backend, v func(*pairBuf) kernels.Buf) {
				b.Matmul(v(out), v(inp), v(w), sh.T, sh.C, sh.OC)
				b.MatmulBackward(v(dinp), v(dw), v(dout), v(inp), v(w), sh.T, sh.C, sh.OC)
				// dinp skipped (zero-length): only dweight accumulates.
				b.MatmulBackward(kernels.Buf{}, v(dw2), v(dout), v(inp), v(w), sh.T, sh.C, sh.OC)
			})
			tag := fmt.Sprintf("T=%d C=%d OC=%d", sh.T, sh.C, sh.OC)
			s.check("Matmul out "+tag, out, TolMatmul)
			s.check("MatmulBackward dinp "+tag, dinp, TolMatmul)
			s.check("MatmulBackward dweight "+tag, dw, TolMatmul)
			s.check("MatmulBackward dweight (no dinp) "+tag, dw2, TolMatmul)
		}
	}},
	{"MatmulBackwardFresh", func(s *suite) {
		// kernels.FreshMatmulBackward: dinp assigned over random contents
		// (what it held must not show), dweight accumulated; fp32 and
		// bf16 operands, a zero-length dinp skipped.
		for _, sh := range mmShapes {
			for _, dt := range []kernels.DType{kernels.F32, kernels.BF16} {
				inp, w, dout := s.randnOf(dt, sh.T*sh.C, 1), s.randnOf(dt, sh.OC*sh.C, 1), s.randnOf(dt, sh.T*sh.OC, 1)
				dinp, dw, dw2 := s.randn(sh.T*sh.C, 100), s.randn(sh.OC*sh.C, 1), s.randn(sh.OC*sh.C, 1)
				// A bf16 dinp: the fp32 result rounded once (the GEMM's
				// output for a bf16 consumer).
				dinp16, dw3 := s.randnBF16(sh.T*sh.C, 100), s.randn(sh.OC*sh.C, 1)
				fresh := 0
				both(s, func(b kernels.Backend, v func(*pairBuf) kernels.Buf) {
					f, ok := b.(kernels.FreshMatmulBackward)
					if !ok {
						return
					}
					fresh++
					f.MatmulBackwardFresh(v(dinp), v(dw), v(dout), v(inp), v(w), sh.T, sh.C, sh.OC)
					f.MatmulBackwardFresh(kernels.Buf{}, v(dw2), v(dout), v(inp), v(w), sh.T, sh.C, sh.OC)
					f.MatmulBackwardFresh(v(dinp16), v(dw3), v(dout), v(inp), v(w), sh.T, sh.C, sh.OC)
				})
				if fresh == 1 {
					s.t.Logf("%s does not implement kernels.FreshMatmulBackward: not checked", s.dut.Name())
					return
				}
				tag := fmt.Sprintf("%s T=%d C=%d OC=%d", dt, sh.T, sh.C, sh.OC)
				s.check("MatmulBackwardFresh dinp "+tag, dinp, TolMatmul)
				s.check("MatmulBackwardFresh dweight "+tag, dw, TolMatmul)
				s.check("MatmulBackwardFresh dweight (no dinp) "+tag, dw2, TolMatmul)
				s.check("MatmulBackwardFresh bf16 dinp "+tag, dinp16, TolMatmulBF16Out)
				s.check("MatmulBackwardFresh dweight (bf16 dinp) "+tag, dw3, TolMatmul)
			}
		}
	}},
	{"MatmulAdd", func(s *suite) {
		// kernels.MatmulAdder: out = res + inp·weightᵀ (the residual add as
		// the GEMM's epilogue), fp32 and bf16 operands, fp32 and bf16
		// out/res, out apart from res and out being res.
		for _, sh := range mmShapes {
			for _, dt := range []kernels.DType{kernels.F32, kernels.BF16} {
				for _, ot := range []kernels.DType{kernels.F32, kernels.BF16} {
					inp, w := s.randnOf(dt, sh.T*sh.C, 1), s.randnOf(dt, sh.OC*sh.C, 1)
					res, out := s.randnOf(ot, sh.T*sh.OC, 3), s.randnOf(ot, sh.T*sh.OC, 100)
					inPlace := s.randnOf(ot, sh.T*sh.OC, 3) // out is res
					fused := 0
					both(s, func(b kernels.Backend, v func(*pairBuf) kernels.Buf) {
						f, ok := b.(kernels.MatmulAdder)
						if !ok {
							return
						}
						fused++
						f.MatmulAdd(v(out), v(res), v(inp), v(w), sh.T, sh.C, sh.OC)
						f.MatmulAdd(v(inPlace), v(inPlace), v(inp), v(w), sh.T, sh.C, sh.OC)
					})
					if fused == 1 {
						s.t.Logf("%s does not implement kernels.MatmulAdder: not checked", s.dut.Name())
						return
					}
					tol := TolMatmul
					if ot == kernels.BF16 {
						tol = TolMatmulBF16Out
					}
					tag := fmt.Sprintf("%s->%s T=%d C=%d OC=%d", dt, ot, sh.T, sh.C, sh.OC)
					s.check("MatmulAdd out "+tag, out, tol)
					s.check("MatmulAdd res (unchanged) "+tag, res, TolExact)
					s.check("MatmulAdd out is res "+tag, inPlace, tol)
				}
			}
		}
	}},
	{"Convert", func(s *suite) {
		// Rounding: ties to even, carries into the exponent, overflow to
		// infinity, subnormals, signed zeros, NaN; then random values.
		vals := []float32{0, float32(math.Copysign(0, -1)), 1, -1, 1.00390625, 1.01171875, 1.0078125, 3.3895314e38,
			float32(math.Inf(1)), float32(math.Inf(-1)), float32(math.NaN()), 1e-40, -3e-39, 65504, 1.9921875, 255.5}
		for range 200 {
			vals = append(vals, float32(s.rng.NormFloat64()*math.Pow(10, float64(s.rng.IntN(20)-10))))
		}
		// Unaligned views and aligned ones (a backend's vector path).
		for _, aligned := range []bool{false, true} {
			s.aligned = aligned
			x := s.f32(vals)
			h := s.alloc(kernels.BF16, len(vals)) // each side's own rounding
			back := s.out(len(vals))
			keep := s.out(len(vals))
			both(s, func(b kernels.Backend, v func(*pairBuf) kernels.Buf) {
				b.Convert(v(h), v(x))
				b.Convert(v(back), v(h))
				b.Convert(v(keep), v(x)) // F32 → F32 copies
			})
			tag := fmt.Sprintf(" aligned=%v", aligned)
			s.check("Convert F32→BF16→F32"+tag, back, TolExact)
			s.check("Convert F32→F32"+tag, keep, TolExact)
		}
		s.aligned = false
	}},
	{"CopyCols", func(s *suite) {
		// Every dtype pair; dst is pre-filled so the elements between its
		// rows must come through untouched; the view offsets pick columns.
		for _, sh := range []struct{ R, W, ds, ss, doff, soff int }{
			{1, 1, 1, 1, 0, 0}, {7, 5, 5, 13, 0, 8}, {37, 33, 65, 99, 32, 40}, {3, 300, 900, 300, 600, 0}, {64, 128, 128, 384, 0, 256},
		} {
			dN, sN := (sh.R-1)*sh.ds+sh.W+sh.doff, (sh.R-1)*sh.ss+sh.W+sh.soff
			for _, dt := range [][2]kernels.DType{{kernels.F32, kernels.F32}, {kernels.BF16, kernels.F32}, {kernels.F32, kernels.BF16}, {kernels.BF16, kernels.BF16}} {
				var src, dst *pairBuf
				if dt[1] == kernels.F32 {
					src = s.randn(sN, 3)
				} else {
					src = s.randnBF16(sN, 3)
				}
				if dt[0] == kernels.F32 {
					dst = s.randn(dN, 1)
				} else {
					dst = s.randnBF16(dN, 1)
				}
				both(s, func(b kernels.Backend, v func(*pairBuf) kernels.Buf) {
					d, x := v(dst), v(src)
					b.CopyCols(d.Slice(sh.doff, d.N-sh.doff), x.Slice(sh.soff, x.N-sh.soff), sh.R, sh.W, sh.ds, sh.ss)
				})
				s.check(fmt.Sprintf("CopyCols %s ← %s R=%d W=%d strides %d,%d", dt[0], dt[1], sh.R, sh.W, sh.ds, sh.ss), dst, TolExact)
			}
		}
		// Rounding into bf16 (a kernel's own store, not Convert): ties to
		// even, which random values almost never meet, a carry into the
		// exponent, overflow to infinity, a subnormal tie.
		var ties []float32
		for _, u := range []uint32{0x3f808000, 0x3f818000, 0xbf808000, 0xbf818000, 0x3fff8000, 0x7f7f8000,
			0x3f808001, 0x3f807fff, 0x00008000, 0x00018000} {
			ties = append(ties, math.Float32frombits(u))
		}
		src, dst := s.f32(ties), s.randnBF16(len(ties), 1)
		both(s, func(b kernels.Backend, v func(*pairBuf) kernels.Buf) {
			b.CopyCols(v(dst), v(src), 1, len(ties), len(ties), len(ties))
		})
		s.check("CopyCols bf16 ← f32 ties", dst, TolExact)
	}},
	{"MatmulBF16", func(s *suite) {
		for _, sh := range mmShapes {
			inp, w := s.randnBF16(sh.T*sh.C, 1), s.randnBF16(sh.OC*sh.C, 1)
			out32, out16 := s.out(sh.T*sh.OC), s.randnBF16(sh.T*sh.OC, 1)
			dout := s.randnBF16(sh.T*sh.OC, 1)
			dinp, dw := s.randn(sh.T*sh.C, 1), s.randn(sh.OC*sh.C, 1)
			both(s, func(b kernels.Backend, v func(*pairBuf) kernels.Buf) {
				b.Matmul(v(out32), v(inp), v(w), sh.T, sh.C, sh.OC)
				b.Matmul(v(out16), v(inp), v(w), sh.T, sh.C, sh.OC)
				b.MatmulBackward(v(dinp), v(dw), v(dout), v(inp), v(w), sh.T, sh.C, sh.OC)
			})
			tag := fmt.Sprintf("T=%d C=%d OC=%d", sh.T, sh.C, sh.OC)
			// Products of bf16 values are exact in fp32: only the summation
			// order differs, as in the fp32 case.
			s.check("Matmul bf16 → f32 "+tag, out32, TolMatmul)
			s.check("Matmul bf16 → bf16 "+tag, out16, TolBF16Out)
			s.check("MatmulBackward bf16 dinp "+tag, dinp, TolMatmul)
			s.check("MatmulBackward bf16 dweight "+tag, dw, TolMatmul)
		}
	}},
	{"Bias", func(s *suite) {
		// 300 and 600 rows: several row chunks; 65 and 7 columns: partial
		// column tiles.
		for _, sh := range []struct{ T, OC int }{{1, 1}, {37, 33}, {300, 65}, {600, 7}, {3, 256}} {
			bias := s.randn(sh.OC, 1)
			out := s.randn(sh.T*sh.OC, 1)
			dout := s.randn(sh.T*sh.OC, 1)
			dbias := s.randn(sh.OC, 1)
			both(s, func(b kernels.Backend, v func(*pairBuf) kernels.Buf) {
				b.AddBias(v(out), v(bias), sh.T, sh.OC)
				b.BiasBackward(v(dbias), v(dout), sh.T, sh.OC)
			})
			tag := fmt.Sprintf("T=%d OC=%d", sh.T, sh.OC)
			s.check("AddBias out "+tag, out, TolExact)
			s.check("BiasBackward dbias "+tag, dbias, TolReduce)
		}
	}},
	{"Rope", func(s *suite) {
		for _, sh := range []struct {
			T, H, HD int
			theta    float64
			maxPos   int
		}{{1, 1, 2, 10000, 1}, {37, 3, 8, 10000, 100}, {20, 2, 34, 1e6, 4096}, {9, 2, 128, 1e6, 40000}} {
			pos := s.i32(s.randTokens(sh.T, sh.maxPos))
			cos, sin := s.ropeTables(sh.maxPos+s.rng.IntN(3), sh.HD, sh.theta)
			x := s.randn(sh.T*sh.H*sh.HD, 1)
			dx := s.randn(sh.T*sh.H*sh.HD, 1)
			both(s, func(b kernels.Backend, v func(*pairBuf) kernels.Buf) {
				b.Rope(v(x), v(pos), v(cos), v(sin), sh.T, sh.H, sh.HD)
				b.RopeBackward(v(dx), v(pos), v(cos), v(sin), sh.T, sh.H, sh.HD)
			})
			tag := fmt.Sprintf("T=%d H=%d HD=%d theta=%g maxpos=%d", sh.T, sh.H, sh.HD, sh.theta, sh.maxPos)
			s.check("Rope x "+tag, x, TolRope)
			s.check("RopeBackward dx "+tag, dx, TolRope)
		}
	}},
	{"RopeConvert", func(s *suite) {
		// The rotation fused with the cast to bf16 (kernels.RopeConverter),
		// and its fp32 form; x must stay as it was.
		dutR, ok := s.dut.(kernels.RopeConverter)
		if !ok {
			s.t.Skipf("%s does not implement kernels.RopeConverter", s.dut.Name())
		}
		refR := s.ref.(kernels.RopeConverter)
		for _, sh := range []struct {
			T, H, HD int
			theta    float64
			maxPos   int
		}{{1, 1, 2, 10000, 1}, {37, 3, 8, 10000, 100}, {20, 16, 128, 1e6, 4096}} {
			pos := s.i32(s.randTokens(sh.T, sh.maxPos))
			cos, sin := s.ropeTables(sh.maxPos, sh.HD, sh.theta)
			n := sh.T * sh.H * sh.HD
			x := s.randn(n, 1)
			o16, o32 := s.randnBF16(n, 1), s.out(n)
			refR.RopeConvert(o16.r, x.r, pos.r, cos.r, sin.r, sh.T, sh.H, sh.HD)
			dutR.RopeConvert(o16.d, x.d, pos.d, cos.d, sin.d, sh.T, sh.H, sh.HD)
			refR.RopeConvert(o32.r, x.r, pos.r, cos.r, sin.r, sh.T, sh.H, sh.HD)
			dutR.RopeConvert(o32.d, x.d, pos.d, cos.d, sin.d, sh.T, sh.H, sh.HD)
			tag := fmt.Sprintf("T=%d H=%d HD=%d", sh.T, sh.H, sh.HD)
			s.check("RopeConvert bf16 out "+tag, o16, TolBF16Out)
			s.check("RopeConvert f32 out "+tag, o32, TolRope)
			s.check("RopeConvert leaves x "+tag, x, TolExact)
		}
		// A position outside the tables: that row copied unrotated, reported.
		const T, H, HD = 3, 2, 8
		pos := s.i32([]int32{0, 6, 2})
		cos, sin := s.ropeTables(6, HD, 10000)
		x, o := s.randn(T*H*HD, 1), s.randnBF16(T*H*HD, 1)
		refR.RopeConvert(o.r, x.r, pos.r, cos.r, sin.r, T, H, HD)
		dutR.RopeConvert(o.d, x.d, pos.d, cos.d, sin.d, T, H, HD)
		s.wantSyncError("RopeConvert with position 6 of a 6-row table")
		s.check("RopeConvert bf16 out with a bad position", o, TolBF16Out)
	}},
	{"QKNormRope", func(s *suite) {
		// kernels.QKNormRoper against the reference, and, on the
		// reference, bit for bit the split path it stands for (CopyCols,
		// RMSNorm, RopeConvert, CopyCols). Head widths with a half under a
		// warp, one of 34 (pairs across lanes unevenly), 128 (Qwen3's).
		dutR, ok := s.dut.(kernels.QKNormRoper)
		if !ok {
			s.t.Skipf("%s does not implement kernels.QKNormRoper", s.dut.Name())
		}
		refR := s.ref.(kernels.QKNormRoper)
		for _, sh := range []struct{ T, NH, NKV, HD, maxPos int }{{1, 1, 1, 2, 1}, {37, 4, 2, 8, 100}, {9, 3, 3, 34, 4096}, {20, 4, 2, 128, 5000}} {
			for _, dt := range []kernels.DType{kernels.F32, kernels.BF16} {
				T, NH, NKV, HD := sh.T, sh.NH, sh.NKV, sh.HD
				qn, kn := NH*HD, NKV*HD
				W := qn + 2*kn
				pos := s.i32(s.randTokens(T, sh.maxPos))
				cos, sin := s.ropeTables(sh.maxPos, HD, 1e6)
				qkv := s.randn(T*W, 2)
				qw, kw := s.randn(HD, 1), s.randn(HD, 1)
				q, k, v := s.randnOf(dt, T*qn, 1), s.randnOf(dt, T*kn, 1), s.randnOf(dt, T*kn, 1)
				qraw, kraw, qrstd, krstd := s.out(T*qn), s.out(T*kn), s.out(T*NH), s.out(T*NKV)
				refR.QKNormRope(q.r, k.r, v.r, qraw.r, kraw.r, qrstd.r, krstd.r, qkv.r, qw.r, kw.r, pos.r, cos.r, sin.r, T, NH, NKV, HD, 1e-6)
				dutR.QKNormRope(q.d, k.d, v.d, qraw.d, kraw.d, qrstd.d, krstd.d, qkv.d, qw.d, kw.d, pos.d, cos.d, sin.d, T, NH, NKV, HD, 1e-6)
				tag := fmt.Sprintf("%s T=%d NH=%d NKV=%d HD=%d", dt, T, NH, NKV, HD)
				tol := TolElementwise
				if dt == kernels.BF16 {
					tol = TolBF16Out
				}
				s.check("QKNormRope q "+tag, q, tol)
				s.check("QKNormRope k "+tag, k, tol)
				s.check("QKNormRope v "+tag, v, TolExact)
				s.check("QKNormRope qraw "+tag, qraw, TolExact)
				s.check("QKNormRope kraw "+tag, kraw, TolExact)
				s.check("QKNormRope qrstd "+tag, qrstd, TolElementwise)
				s.check("QKNormRope krstd "+tag, krstd, TolElementwise)
				// The split path on the reference.
				b := s.ref
				sq, sk, sv := s.randnOf(dt, T*qn, 1), s.randnOf(dt, T*kn, 1), s.randnOf(dt, T*kn, 1)
				sqraw, skraw, sq32, sk32, sqrstd, skrstd := s.out(T*qn), s.out(T*kn), s.out(T*qn), s.out(T*kn), s.out(T*NH), s.out(T*NKV)
				b.CopyCols(sqraw.r, qkv.r, T, qn, qn, W)
				b.CopyCols(skraw.r, qkv.r.Slice(qn, T*W-qn), T, kn, kn, W)
				b.CopyCols(sv.r, qkv.r.Slice(qn+kn, T*W-qn-kn), T, kn, kn, W)
				b.RMSNorm(sq32.r, sqrstd.r, sqraw.r, qw.r, T*NH, HD, 1e-6)
				b.RMSNorm(sk32.r, skrstd.r, skraw.r, kw.r, T*NKV, HD, 1e-6)
				b.(kernels.RopeConverter).RopeConvert(sq.r, sq32.r, pos.r, cos.r, sin.r, T, NH, HD)
				b.(kernels.RopeConverter).RopeConvert(sk.r, sk32.r, pos.r, cos.r, sin.r, T, NKV, HD)
				for _, p := range [][2]*pairBuf{{q, sq}, {k, sk}, {v, sv}, {qraw, sqraw}, {kraw, skraw}, {qrstd, sqrstd}, {krstd, skrstd}} {
					s.sameBitsOn(s.ref, "QKNormRope against the split path "+tag, p[0].r, p[1].r)
				}
			}
		}
		// A position outside the tables: that row normed, unrotated, reported;
		// an eps as large as the mean square, so that the norm must add it.
		const T, NH, NKV, HD = 3, 2, 1, 8
		W := (NH + 2*NKV) * HD
		pos := s.i32([]int32{0, 6, 2})
		cos, sin := s.ropeTables(6, HD, 10000)
		qkv, qw, kw := s.randn(T*W, 1), s.randn(HD, 1), s.randn(HD, 1)
		q, k, v := s.randnBF16(T*NH*HD, 1), s.randnBF16(T*NKV*HD, 1), s.randnBF16(T*NKV*HD, 1)
		qraw, kraw, qrstd, krstd := s.out(T*NH*HD), s.out(T*NKV*HD), s.out(T*NH), s.out(T*NKV)
		refR.QKNormRope(q.r, k.r, v.r, qraw.r, kraw.r, qrstd.r, krstd.r, qkv.r, qw.r, kw.r, pos.r, cos.r, sin.r, T, NH, NKV, HD, 1)
		dutR.QKNormRope(q.d, k.d, v.d, qraw.d, kraw.d, qrstd.d, krstd.d, qkv.d, qw.d, kw.d, pos.d, cos.d, sin.d, T, NH, NKV, HD, 1)
		s.wantSyncError("QKNormRope with position 6 of a 6-row table")
		s.check("QKNormRope q with a bad position", q, TolBF16Out)
		s.check("QKNormRope k with a bad position", k, TolBF16Out)
		s.check("QKNormRope qrstd with eps 1", qrstd, TolElementwise)
	}},
	{"QKNormRopeBackward", func(s *suite) {
		// kernels.QKNormRopeBackwarder against the reference, with q/k
		// norms (Qwen3) and without (RoPE's backward and the packing
		// alone), fp32 and bf16 dqkv, unaligned and aligned views (a
		// backend's 16-byte paths); on the reference, bit for bit the
		// split path it stands for (RopeBackward, Fill, RMSNormBackward,
		// CopyCols); on the backend under test, bit for bit a rerun. Head
		// widths: 2 (a pair), 34 (not a multiple of 8), 64, 128 (Qwen3's),
		// 512 and 1024 (several chunks a thread); more rows than a block
		// works on at once.
		dutR, ok := s.dut.(kernels.QKNormRopeBackwarder)
		if !ok {
			s.t.Skipf("%s does not implement kernels.QKNormRopeBackwarder", s.dut.Name())
		}
		refR := s.ref.(kernels.QKNormRopeBackwarder)
		shapes := []struct{ T, NH, NKV, HD, maxPos int }{{3, 1, 1, 2, 4}, {37, 4, 2, 8, 100}, {9, 3, 3, 34, 4096}, {13, 2, 1, 64, 50}, {20, 4, 2, 128, 5000}, {3, 2, 1, 512, 9}, {2, 1, 1, 1024, 9}}
		for i, sh := range shapes {
			for _, norm := range []bool{true, false} {
				for _, dt := range []kernels.DType{kernels.F32, kernels.BF16} {
					s.aligned = i%2 == 0
					T, NH, NKV, HD := sh.T, sh.NH, sh.NKV, sh.HD
					qn, kn := NH*HD, NKV*HD
					W := qn + 2*kn
					pos := s.i32(s.randTokens(T, sh.maxPos))
					cos, sin := s.ropeTables(sh.maxPos, HD, 1e6)
					dq0, dk0, dv := s.randn(T*qn, 1), s.randn(T*kn, 1), s.randn(T*kn, 1)
					dq, dk := s.randn(T*qn, 1), s.randn(T*kn, 1)
					var qraw, kraw, qrstd, krstd, qw, kw, dqw, dkw *pairBuf
					v := func(p *pairBuf, r bool) kernels.Buf {
						switch {
						case p == nil:
							return kernels.Buf{}
						case r:
							return p.r
						}
						return p.d
					}
					// The weight gradients' starting values, each in three
					// buffers: the run, its rerun and the split path.
					var w0 [2][]float32
					var dw [2][3]*pairBuf
					if norm {
						qraw, kraw = s.randn(T*qn, 2), s.randn(T*kn, 2)
						rs := func(n int) *pairBuf {
							x := make([]float32, n)
							for j := range x {
								x[j] = float32(0.2 + s.rng.Float64())
							}
							return s.f32(x)
						}
						qrstd, krstd = rs(T*NH), rs(T*NKV)
						qw, kw = s.randn(HD, 1), s.randn(HD, 1)
						for j := range w0 {
							w0[j] = make([]float32, HD)
							for e := range w0[j] {
								w0[j][e] = float32(s.rng.NormFloat64())
							}
							for c := range dw[j] {
								dw[j][c] = s.f32(w0[j])
							}
						}
						dqw, dkw = dw[0][0], dw[1][0]
					}
					dqkv := s.randnOf(dt, T*W, 1)
					run := func(b kernels.Backend, x kernels.QKNormRopeBackwarder, r bool, out kernels.Buf, dqw, dkw *pairBuf) {
						b.Copy(v(dq, r), v(dq0, r))
						b.Copy(v(dk, r), v(dk0, r))
						x.QKNormRopeBackward(out, v(dqw, r), v(dkw, r), v(dq, r), v(dk, r), v(dv, r), v(qraw, r), v(kraw, r),
							v(qrstd, r), v(krstd, r), v(qw, r), v(kw, r), v(pos, r), v(cos, r), v(sin, r), T, NH, NKV, HD)
					}
					run(s.ref, refR, true, dqkv.r, dqw, dkw)
					run(s.dut, dutR, false, dqkv.d, dqw, dkw)
					tag := fmt.Sprintf("%s norm=%v T=%d NH=%d NKV=%d HD=%d aligned=%v", dt, norm, T, NH, NKV, HD, s.aligned)
					tol := TolReduce
					if dt == kernels.BF16 {
						tol = TolBF16Out
					}
					s.check("QKNormRopeBackward dqkv "+tag, dqkv, tol)
					if norm {
						s.check("QKNormRopeBackward dqw += "+tag, dqw, TolReduce)
						s.check("QKNormRopeBackward dkw += "+tag, dkw, TolReduce)
					}
					// A rerun on the backend under test: the same bits.
					again := s.randnOf(dt, T*W, 1)
					var rq, rk *pairBuf
					if norm {
						rq, rk = dw[0][1], dw[1][1]
					}
					run(s.dut, dutR, false, again.d, rq, rk)
					s.sameBitsOn(s.dut, "QKNormRopeBackward dqkv rerun "+tag, dqkv.d, again.d)
					if norm {
						s.sameBitsOn(s.dut, "QKNormRopeBackward dqw rerun "+tag, dqw.d, rq.d)
						s.sameBitsOn(s.dut, "QKNormRopeBackward dkw rerun "+tag, dkw.d, rk.d)
					}
					// The split path on the reference.
					b := s.ref
					gq, gk, sqkv := s.randn(T*qn, 1), s.randn(T*kn, 1), s.randnOf(dt, T*W, 1)
					b.Copy(gq.r, dq0.r)
					b.Copy(gk.r, dk0.r)
					b.RopeBackward(gq.r, pos.r, cos.r, sin.r, T, NH, HD)
					b.RopeBackward(gk.r, pos.r, cos.r, sin.r, T, NKV, HD)
					if norm {
						nq, nk := s.randn(T*qn, 1), s.randn(T*kn, 1)
						b.Fill(nq.r, 0)
						b.Fill(nk.r, 0)
						b.RMSNormBackward(nq.r, dw[0][2].r, gq.r, qraw.r, qw.r, qrstd.r, T*NH, HD)
						b.RMSNormBackward(nk.r, dw[1][2].r, gk.r, kraw.r, kw.r, krstd.r, T*NKV, HD)
						gq, gk = nq, nk
						s.sameBitsOn(b, "QKNormRopeBackward dqw against the split path "+tag, dqw.r, dw[0][2].r)
						s.sameBitsOn(b, "QKNormRopeBackward dkw against the split path "+tag, dkw.r, dw[1][2].r)
					}
					b.CopyCols(sqkv.r, gq.r, T, qn, W, qn)
					b.CopyCols(sqkv.r.Slice(qn, T*W-qn), gk.r, T, kn, W, kn)
					b.CopyCols(sqkv.r.Slice(qn+kn, T*W-qn-kn), dv.r, T, kn, W, kn)
					s.sameBitsOn(b, "QKNormRopeBackward dqkv against the split path "+tag, dqkv.r, sqkv.r)
				}
			}
		}
		s.aligned = false
	}},
	{"RopeBadPosition", func(s *suite) {
		// Position 6 of a 6-row table, and a negative one: those rows stay
		// as they were, the others rotate, and Sync reports the error.
		const T, H, HD = 5, 2, 8
		pos := s.i32([]int32{0, 6, 2, -1, 5})
		cos, sin := s.ropeTables(6, HD, 10000)
		x := s.randn(T*H*HD, 1)
		both(s, func(b kernels.Backend, v func(*pairBuf) kernels.Buf) {
			b.Rope(v(x), v(pos), v(cos), v(sin), T, H, HD)
		})
		s.wantSyncError("Rope with positions 6 and -1 of a 6-row table")
		s.check("Rope x with bad positions", x, TolRope)
	}},
	{"Attention", func(s *suite) {
		for i, lens := range seqShapes {
			for j, h := range headShapes {
				if (i+j)%2 == 1 && h.HD == 128 {
					continue // keep the suite fast: HD=128 on half the packings
				}
				if s.schedule && (i+j)%2 == 1 {
					continue // another schedule: half the pairs, every packing and head shape once at least
				}
				sq, cuP, T := seqs(s, lens)
				if j%2 == 1 {
					sq.MaxLen = T // a loose bound (the model may pass its configured maximum)
				}
				q := s.randn(T*h.NH*h.HD, 1)
				k := s.randn(T*h.NKV*h.HD, 1)
				v := s.randn(T*h.NKV*h.HD, 1)
				out, lse := s.out(T*h.NH*h.HD), s.out(T*h.NH)
				dout := s.randn(T*h.NH*h.HD, 1)
				dq, dk, dv := s.out(T*h.NH*h.HD), s.out(T*h.NKV*h.HD), s.out(T*h.NKV*h.HD)
				out16 := s.randnBF16(T*h.NH*h.HD, 1) // fp32 operands, a bf16 output
				both(s, func(b kernels.Backend, vw func(*pairBuf) kernels.Buf) {
					sb := sq
					sb.CuSeqlens = vw(cuP)
					b.Attention(vw(out), vw(lse), vw(q), vw(k), vw(v), sb, h.NH, h.NKV, h.HD)
					b.AttentionBackward(vw(dq), vw(dk), vw(dv), vw(dout), vw(out), vw(lse), vw(q), vw(k), vw(v), sb, h.NH, h.NKV, h.HD)
					if j == 0 {
						b.Attention(vw(out16), vw(lse), vw(q), vw(k), vw(v), sb, h.NH, h.NKV, h.HD)
					}
				})
				tag := fmt.Sprintf("lens=%v NH=%d NKV=%d HD=%d", lens, h.NH, h.NKV, h.HD)
				if j == 0 {
					s.check("Attention f32 → bf16 out "+tag, out16, TolBF16Out)
				}
				s.check("Attention out "+tag, out, TolAttention)
				s.check("Attention lse "+tag, lse, TolAttention)
				s.check("AttentionBackward dq "+tag, dq, TolAttention)
				s.check("AttentionBackward dk "+tag, dk, TolAttention)
				s.check("AttentionBackward dv "+tag, dv, TolAttention)
			}
		}
	}},
	{"AttentionBF16", func(s *suite) {
		// bf16 q, k, v at the head dimensions the tensor-core kernels
		// serve (64, 128), packings that cross their 64-row tiles, GQA; then
		// the fallbacks (another head dimension; views not 16-byte aligned).
		type shape struct {
			lens          []int
			NH, NKV, HD   int
			misaligned    bool
			long, reduced bool // a long shape; kept when Options.Reduced
			schedule      bool // kept when Options.Schedule: crosses 64-row tiles, both head dimensions
		}
		shapes := []shape{
			{lens: []int{1}, NH: 4, NKV: 2, HD: 64, reduced: true},
			{lens: []int{37}, NH: 2, NKV: 1, HD: 128, reduced: true},
			{lens: []int{5, 1, 17, 33, 2}, NH: 4, NKV: 2, HD: 64},
			{lens: []int{70, 3, 130}, NH: 2, NKV: 1, HD: 128, reduced: true, schedule: true},
			{lens: []int{64, 65, 63, 128}, NH: 6, NKV: 3, HD: 64, reduced: true, schedule: true},
			{lens: []int{3, 1, 2, 4, 1, 1, 3, 2, 4, 1, 2, 3, 1, 4, 2, 1, 3, 1, 2, 2}, NH: 4, NKV: 4, HD: 128},
			{lens: []int{37, 20}, NH: 4, NKV: 2, HD: 40, reduced: true},                   // widened: HD 40
			{lens: []int{37, 20}, NH: 4, NKV: 2, HD: 64, misaligned: true, reduced: true}, // widened: unaligned views
			{lens: []int{300, 700}, NH: 2, NKV: 1, HD: 128, reduced: true},
			// 4096 tokens: on the emulator one head of HD 64 (its fibers take
			// ~10 s for it), on a device the Qwen3 shape's head ratio.
			{lens: []int{4096}, NH: 1, NKV: 1, HD: 64, long: true, reduced: true},
			{lens: []int{1000, 3000, 96}, NH: 4, NKV: 2, HD: 64, long: true},
			{lens: []int{4096}, NH: 8, NKV: 2, HD: 128, long: true},
		}
		for _, h := range shapes {
			if s.reduced && !h.reduced || s.schedule && (h.long || !h.schedule) {
				continue
			}
			sq, cuP, T := seqs(s, h.lens)
			s.aligned = !h.misaligned
			q := s.randnBF16(T*h.NH*h.HD, 1)
			k := s.randnBF16(T*h.NKV*h.HD, 1)
			v := s.randnBF16(T*h.NKV*h.HD, 1)
			out32, lse := s.out(T*h.NH*h.HD), s.out(T*h.NH)
			out16 := s.randnBF16(T*h.NH*h.HD, 1)
			dout := s.randnBF16(T*h.NH*h.HD, 1)
			both(s, func(b kernels.Backend, vw func(*pairBuf) kernels.Buf) {
				sb := sq
				sb.CuSeqlens = vw(cuP)
				if !h.long { // an fp32 output too (the long shapes' time goes to the bf16 one)
					b.Attention(vw(out32), vw(lse), vw(q), vw(k), vw(v), sb, h.NH, h.NKV, h.HD)
				}
				b.Attention(vw(out16), vw(lse), vw(q), vw(k), vw(v), sb, h.NH, h.NKV, h.HD)
			})
			tag := fmt.Sprintf("lens=%v NH=%d NKV=%d HD=%d", h.lens, h.NH, h.NKV, h.HD)
			if len(tag) > 80 {
				tag = fmt.Sprintf("%d seqs NH=%d NKV=%d HD=%d", len(h.lens), h.NH, h.NKV, h.HD)
			}
			if h.misaligned {
				tag += " misaligned"
			}
			if !h.long {
				s.check("Attention bf16 → f32 out "+tag, out32, TolAttentionBF16Out)
			}
			s.check("Attention bf16 → bf16 out "+tag, out16, TolAttentionBF16OutBF16)
			s.check("Attention bf16 lse "+tag, lse, TolAttentionBF16LSE)
			// The backward pass of both backends from the reference's out
			// and lse, so that it is checked on its own.
			outR, lseR := s.bf16(s.download(s.ref, out16.r)), s.f32(s.download(s.ref, lse.r))
			dq, dk, dv := s.out(T*h.NH*h.HD), s.out(T*h.NKV*h.HD), s.out(T*h.NKV*h.HD)
			both(s, func(b kernels.Backend, vw func(*pairBuf) kernels.Buf) {
				sb := sq
				sb.CuSeqlens = vw(cuP)
				b.AttentionBackward(vw(dq), vw(dk), vw(dv), vw(dout), vw(outR), vw(lseR), vw(q), vw(k), vw(v), sb, h.NH, h.NKV, h.HD)
			})
			s.check("AttentionBackward bf16 dq "+tag, dq, TolAttentionBF16Grad)
			s.check("AttentionBackward bf16 dk "+tag, dk, TolAttentionBF16Grad)
			s.check("AttentionBackward bf16 dv "+tag, dv, TolAttentionBF16Grad)
			s.aligned = false
		}
	}},
	{"AttentionBadSeqs", func(s *suite) {
		const NH, NKV, HD = 2, 1, 8
		for _, c := range []struct {
			name   string
			cu     []int32
			maxLen int
			T      int
		}{
			{"a sequence longer than MaxLen", []int32{0, 5, 36}, 30, 36},
			{"offsets not ending at T", []int32{0, 5, 20}, 15, 24},
			{"offsets decreasing", []int32{0, 9, 4, 12}, 8, 12},
		} {
			cuP := s.i32(c.cu)
			q, k, v := s.randn(c.T*NH*HD, 1), s.randn(c.T*NKV*HD, 1), s.randn(c.T*NKV*HD, 1)
			out, lse := s.out(c.T*NH*HD), s.out(c.T*NH)
			both(s, func(b kernels.Backend, vw func(*pairBuf) kernels.Buf) {
				sq := kernels.Seqs{CuSeqlens: vw(cuP), S: len(c.cu) - 1, MaxLen: c.maxLen}
				b.Attention(vw(out), vw(lse), vw(q), vw(k), vw(v), sq, NH, NKV, HD)
			})
			s.wantSyncError("Attention with " + c.name)
		}
	}},
	{"AttentionDecode", func(s *suite) {
		for _, sh := range []struct {
			lens              []int32
			Tmax, NH, NKV, HD int
		}{{[]int32{1}, 1, 2, 1, 8}, {[]int32{1, 17, 40}, 40, 4, 2, 16}, {[]int32{33, 5}, 70, 6, 3, 128}} {
			B := len(sh.lens)
			q := s.randn(B*sh.NH*sh.HD, 1)
			kc := s.randn(B*sh.Tmax*sh.NKV*sh.HD, 1)
			vc := s.randn(B*sh.Tmax*sh.NKV*sh.HD, 1)
			lens := s.i32(sh.lens)
			out := s.out(B * sh.NH * sh.HD)
			both(s, func(b kernels.Backend, v func(*pairBuf) kernels.Buf) {
				b.AttentionDecode(v(out), v(q), v(kc), v(vc), v(lens), B, sh.Tmax, sh.NH, sh.NKV, sh.HD)
			})
			s.check(fmt.Sprintf("AttentionDecode out lens=%v Tmax=%d NH=%d NKV=%d HD=%d", sh.lens, sh.Tmax, sh.NH, sh.NKV, sh.HD), out, TolAttention)
		}
	}},
	{"AttentionDecodeBF16", func(s *suite) {
		// A bf16 KV cache (q, kc, vc bf16), widened exactly: the fp32
		// tolerance, at real head dimensions.
		for _, sh := range []struct {
			lens              []int32
			Tmax, NH, NKV, HD int
		}{{[]int32{1}, 1, 2, 1, 8}, {[]int32{1, 17, 40}, 40, 4, 2, 64}, {[]int32{33, 5, 300}, 301, 8, 2, 128}} {
			B := len(sh.lens)
			q := s.randnBF16(B*sh.NH*sh.HD, 1)
			kc := s.randnBF16(B*sh.Tmax*sh.NKV*sh.HD, 1)
			vc := s.randnBF16(B*sh.Tmax*sh.NKV*sh.HD, 1)
			lens := s.i32(sh.lens)
			out := s.out(B * sh.NH * sh.HD)
			both(s, func(b kernels.Backend, v func(*pairBuf) kernels.Buf) {
				b.AttentionDecode(v(out), v(q), v(kc), v(vc), v(lens), B, sh.Tmax, sh.NH, sh.NKV, sh.HD)
			})
			s.check(fmt.Sprintf("AttentionDecode bf16 cache out lens=%v Tmax=%d NH=%d NKV=%d HD=%d", sh.lens, sh.Tmax, sh.NH, sh.NKV, sh.HD), out, TolAttention)
		}
	}},
	{"SwiGLU", func(s *suite) {
		for _, N := range []int{1, 1000} {
			g, u := s.randn(N, 3), s.randn(N, 1)
			out := s.out(N)
			dout := s.randn(N, 1)
			dg, du := s.out(N), s.out(N)
			both(s, func(b kernels.Backend, v func(*pairBuf) kernels.Buf) {
				b.SwiGLU(v(out), v(g), v(u), N)
				b.SwiGLUBackward(v(dg), v(du), v(dout), v(g), v(u), N)
			})
			s.check(fmt.Sprintf("SwiGLU out N=%d", N), out, TolElementwise)
			s.check(fmt.Sprintf("SwiGLUBackward dgate N=%d", N), dg, TolElementwise)
			s.check(fmt.Sprintf("SwiGLUBackward dup N=%d", N), du, TolElementwise)
		}
	}},
	{"SwiGLURows", func(s *suite) {
		// The gate|up GEMM's output read as it lies, and its gradient
		// written packed: against the reference, and, on each backend,
		// bit for bit what splitting with CopyCols around SwiGLU and
		// SwiGLUBackward gives (the model's former path). Widths with and
		// without the 8-element vector steps, aligned views and not, every
		// dtype pairing.
		dts := []kernels.DType{kernels.F32, kernels.BF16}
		for _, sh := range []struct{ R, I int }{{1, 1}, {3, 8}, {5, 13}, {7, 64}, {33, 40}} {
			for _, aligned := range []bool{true, false} {
				for _, in := range dts {
					for _, o := range dts {
						s.aligned = aligned
						R, I := sh.R, sh.I
						gu := s.randnOf(in, 2*R*I, 3)
						g, u := s.randnOf(in, R*I, 1), s.randnOf(in, R*I, 1)
						out, split := s.randnOf(o, R*I, 1), s.randnOf(o, R*I, 1)
						dout := s.randn(R*I, 1)
						dgu, dguSplit := s.randnOf(o, 2*R*I, 1), s.randnOf(o, 2*R*I, 1)
						dg, du := s.out(R*I), s.out(R*I)
						both(s, func(b kernels.Backend, v func(*pairBuf) kernels.Buf) {
							b.SwiGLURows(v(out), v(gu), R, I)
							b.SwiGLURowsBackward(v(dgu), v(dout), v(gu), R, I)
							x := v(gu)
							b.CopyCols(v(g), x, R, I, I, 2*I)
							b.CopyCols(v(u), x.Slice(I, x.N-I), R, I, I, 2*I)
							b.SwiGLU(v(split), v(g), v(u), R*I)
							b.SwiGLUBackward(v(dg), v(du), v(dout), v(g), v(u), R*I)
							y := v(dguSplit)
							b.CopyCols(y, v(dg), R, I, 2*I, I)
							b.CopyCols(y.Slice(I, y.N-I), v(du), R, I, 2*I, I)
						})
						tag := fmt.Sprintf("%s → %s R=%d I=%d aligned=%v", in, o, R, I, aligned)
						tol := TolElementwise
						if o == kernels.BF16 {
							tol = TolBF16Out
						}
						s.check("SwiGLURows out "+tag, out, tol)
						s.check("SwiGLURowsBackward dgu "+tag, dgu, tol)
						s.sameBits("SwiGLURows out, split "+tag, out, split)
						s.sameBits("SwiGLURowsBackward dgu, split "+tag, dgu, dguSplit)
					}
				}
			}
		}
		s.aligned = false
	}},
	{"SwiGLUBF16", func(s *suite) {
		// Every dtype pairing of the contract (gate, up F32|BF16 same; out
		// F32|BF16), lengths with and without a tail past the 8-element
		// vector steps, aligned views (16-byte paths) and unaligned ones.
		for _, N := range []int{1, 1000, 4099} {
			for _, aligned := range []bool{true, false} {
				s.aligned = aligned
				g16, u16 := s.randnBF16(N, 3), s.randnBF16(N, 1)
				g32, u32 := s.randn(N, 3), s.randn(N, 1)
				o16, o16b, o32 := s.randnBF16(N, 1), s.randnBF16(N, 1), s.out(N)
				dout := s.randn(N, 1)
				dg, du := s.out(N), s.out(N)
				both(s, func(b kernels.Backend, v func(*pairBuf) kernels.Buf) {
					b.SwiGLU(v(o16), v(g16), v(u16), N)
					b.SwiGLU(v(o32), v(g16), v(u16), N)
					b.SwiGLU(v(o16b), v(g32), v(u32), N)
					b.SwiGLUBackward(v(dg), v(du), v(dout), v(g16), v(u16), N)
				})
				tag := fmt.Sprintf("N=%d aligned=%v", N, aligned)
				s.check("SwiGLU bf16 → bf16 "+tag, o16, TolBF16Out)
				s.check("SwiGLU bf16 → f32 "+tag, o32, TolElementwise)
				s.check("SwiGLU f32 → bf16 "+tag, o16b, TolBF16Out)
				s.check("SwiGLUBackward bf16 dgate "+tag, dg, TolElementwise)
				s.check("SwiGLUBackward bf16 dup "+tag, du, TolElementwise)
			}
		}
		s.aligned = false
	}},
	{"AddAccumulate", func(s *suite) {
		for i, N := range []int{1, 1001, 1001, 4096} {
			s.aligned = i >= 2 // the 16-byte path (1001: with a tail)
			a, b2 := s.randn(N, 1), s.randn(N, 1)
			out := s.out(N)
			alias := s.randn(N, 1)
			dst := s.randn(N, 1)
			both(s, func(b kernels.Backend, v func(*pairBuf) kernels.Buf) {
				b.Add(v(out), v(a), v(b2), N)
				b.Add(v(alias), v(alias), v(b2), N) // out aliases a
				b.Accumulate(v(dst), v(a), N)
			})
			s.check(fmt.Sprintf("Add N=%d", N), out, TolExact)
			s.check(fmt.Sprintf("Add aliased N=%d", N), alias, TolExact)
			s.check(fmt.Sprintf("Accumulate N=%d", N), dst, TolExact)
		}
	}},
	{"TokenLogprob", func(s *suite) {
		for _, sh := range []struct {
			T, C, V int
			invTemp float32
		}{{1, 8, 5, 1}, {37, 33, 300, 1}, {20, 64, 1000, 0.7},
			// Few rows, so that a vocabulary chunk of the CUDA test backends'
			// small logits scratch (320 columns) spans three warps of a
			// block: their merge through shared memory then carries data,
			// and with few blocks (the emulator's conformance run has 3)
			// each block merges two rows or three.
			{7, 16, 2000, 1}} {
			hidden := s.randn(sh.T*sh.C, 1)
			w := s.randn(sh.V*sh.C, 0.5)
			tg := s.randTokens(sh.T, sh.V)
			for i := range tg {
				if i%5 == 3 {
					tg[i] = -1 // masked rows
				}
			}
			// Targets on the first and last ids and on vocabulary-chunk
			// boundaries (chunks are multiples of 32 wide).
			for i, id := range []int{0, sh.V - 1, 32, 64, 96, 128, 256} {
				if i < sh.T && i%5 != 3 && id < sh.V {
					tg[i] = int32(id)
				}
			}
			targets := s.i32(tg)
			lp, ent, lse := s.out(sh.T), s.out(sh.T), s.out(sh.T)
			dlp := s.randn(sh.T, 1)
			dh, dw := s.randn(sh.T*sh.C, 1), s.randn(sh.V*sh.C, 1)
			both(s, func(b kernels.Backend, v func(*pairBuf) kernels.Buf) {
				b.TokenLogprob(v(lp), v(ent), v(lse), v(hidden), v(w), v(targets), sh.T, sh.C, sh.V, sh.invTemp)
				b.TokenLogprobBackward(v(dh), v(dw), v(dlp), v(hidden), v(w), v(targets), v(lse), sh.T, sh.C, sh.V, sh.invTemp)
			})
			tag := fmt.Sprintf("T=%d C=%d V=%d invTemp=%g", sh.T, sh.C, sh.V, sh.invTemp)
			s.check("TokenLogprob logprob "+tag, lp, TolLogprob)
			s.check("TokenLogprob entropy "+tag, ent, TolLogprob)
			s.check("TokenLogprob lse "+tag, lse, TolLogprob)
			s.check("TokenLogprobBackward dhidden "+tag, dh, TolLogprob)
			s.check("TokenLogprobBackward dweight "+tag, dw, TolLogprob)
		}
	}},
	{"TokenLogprobBF16", func(s *suite) {
		// The LM head of mixed precision: bf16 hidden and weight, fp32
		// logits, chunked over the vocabulary (the CUDA test backends use a
		// small logits scratch, so several chunks, a last partial one, and
		// chunk widths that are not multiples of 4).
		for _, sh := range []struct {
			T, C, V int
			invTemp float32
		}{{1, 8, 5, 1}, {37, 64, 300, 1}, {20, 128, 1000, 0.7}, {64, 96, 2053, 1}, {7, 16, 2000, 1}} {
			hidden := s.randnBF16(sh.T*sh.C, 1)
			w := s.randnBF16(sh.V*sh.C, 0.5)
			tg := s.randTokens(sh.T, sh.V)
			for i := range tg {
				if i%5 == 3 {
					tg[i] = -1
				}
			}
			for i, id := range []int{0, sh.V - 1, 32, 64, 96, 128, 256} {
				if i < sh.T && i%5 != 3 && id < sh.V {
					tg[i] = int32(id)
				}
			}
			targets := s.i32(tg)
			lp, ent, lse := s.out(sh.T), s.out(sh.T), s.out(sh.T)
			dlp := s.randn(sh.T, 1)
			dh, dw := s.randn(sh.T*sh.C, 1), s.randn(sh.V*sh.C, 1)
			both(s, func(b kernels.Backend, v func(*pairBuf) kernels.Buf) {
				b.TokenLogprob(v(lp), v(ent), v(lse), v(hidden), v(w), v(targets), sh.T, sh.C, sh.V, sh.invTemp)
			})
			// The backward of both from the reference's lse.
			lseR := s.f32(s.download(s.ref, lse.r))
			both(s, func(b kernels.Backend, v func(*pairBuf) kernels.Buf) {
				b.TokenLogprobBackward(v(dh), v(dw), v(dlp), v(hidden), v(w), v(targets), v(lseR), sh.T, sh.C, sh.V, sh.invTemp)
			})
			tag := fmt.Sprintf("T=%d C=%d V=%d invTemp=%g", sh.T, sh.C, sh.V, sh.invTemp)
			// bf16 products are exact in fp32: the forward differs from the
			// reference only in summation order, as the fp32 case does.
			s.check("TokenLogprob bf16 logprob "+tag, lp, TolLogprob)
			s.check("TokenLogprob bf16 entropy "+tag, ent, TolLogprob)
			s.check("TokenLogprob bf16 lse "+tag, lse, TolLogprob)
			s.check("TokenLogprobBackward bf16 dhidden "+tag, dh, TolLogprobBF16Grad)
			s.check("TokenLogprobBackward bf16 dweight "+tag, dw, TolLogprobBF16Grad)
		}
	}},
	{"TokenLogprobFiltered", func(s *suite) {
		// NeMo RL's top-k/top-p filtered head (kernels.FilteredHead) against
		// the reference. Hidden states are multiples of 1/4 and weights of
		// 1/8 (in bf16 too), so every logit is exact in any summation
		// order: both backends filter the same logits, and the kept sets
		// (their cuts) must agree exactly. Every fifth weight row repeats
		// another, so thresholds fall inside tie groups.
		dutH, ok := s.dut.(kernels.FilteredHead)
		if !ok {
			s.t.Skipf("%s does not implement kernels.FilteredHead", s.dut.Name())
		}
		refH := s.ref.(kernels.FilteredHead)
		shapes := []struct {
			T, C, V int
			invTemp float32
			bf16    bool
		}{{1, 8, 5, 1, false}, {13, 16, 300, 0.7, false}, {9, 32, 2000, 1.3, false}, {40, 8, 257, 1, true}, {11, 24, 700, 0.9, true}}
		if s.schedule {
			shapes = shapes[1:2]
		}
		for _, sh := range shapes {
			hv := make([]float32, sh.T*sh.C)
			for i := range hv {
				hv[i] = float32(s.rng.IntN(7)-3) / 4
			}
			wv := make([]float32, sh.V*sh.C)
			for i := range wv {
				wv[i] = float32(s.rng.IntN(5)-2) / 8
			}
			for v := 4; v < sh.V; v += 5 { // ties: row v repeats a lower row
				src := s.rng.IntN(v)
				copy(wv[v*sh.C:(v+1)*sh.C], wv[src*sh.C:(src+1)*sh.C])
			}
			hidden, w := s.f32(hv), s.f32(wv)
			if sh.bf16 {
				hidden, w = s.bf16(hv), s.bf16(wv)
			}
			tg := s.randTokens(sh.T, sh.V)
			for i := range tg {
				if i%5 == 3 {
					tg[i] = -1
				}
			}
			targets := s.i32(tg)
			for fi, f := range []kernels.TopKTopP{{TopP: 0.9}, {TopK: 5}, {TopK: 40, TopP: 0.8}, {TopK: sh.V}, {TopK: 1, TopP: 0.5}, {TopP: 0.05}} {
				o := struct{ lp, ent, lse, lpf, lsef, cut *pairBuf }{s.out(sh.T), s.out(sh.T), s.out(sh.T), s.out(sh.T), s.out(sh.T), s.i32(make([]int32, 2*sh.T))}
				dlp, dlpf := s.randn(sh.T, 1), s.randn(sh.T, 1)
				dh, dw := s.randn(sh.T*sh.C, 1), s.randn(sh.V*sh.C, 1)
				full := fi%2 == 0 // dlogprobFull (the KL term) on every other filter
				run := func(h kernels.FilteredHead, v func(*pairBuf) kernels.Buf) {
					out := kernels.HeadOut{Logprob: v(o.lp), Entropy: v(o.ent), LSE: v(o.lse), LogprobFull: v(o.lpf), LSEFull: v(o.lsef), Cut: v(o.cut)}
					h.TokenLogprobFiltered(out, v(hidden), v(w), v(targets), sh.T, sh.C, sh.V, sh.invTemp, f)
					var df kernels.Buf
					if full {
						df = v(dlpf)
					}
					h.TokenLogprobFilteredBackward(v(dh), v(dw), v(dlp), df, v(hidden), v(w), v(targets), out, sh.T, sh.C, sh.V, sh.invTemp)
				}
				run(refH, func(p *pairBuf) kernels.Buf { return p.r })
				run(dutH, func(p *pairBuf) kernels.Buf { return p.d })
				tag := fmt.Sprintf("T=%d C=%d V=%d invTemp=%g bf16=%v %+v", sh.T, sh.C, sh.V, sh.invTemp, sh.bf16, f)
				s.checkI32("TokenLogprobFiltered cut "+tag, o.cut)
				s.check("TokenLogprobFiltered logprob "+tag, o.lp, TolLogprob)
				s.check("TokenLogprobFiltered entropy "+tag, o.ent, TolLogprob)
				s.check("TokenLogprobFiltered lse "+tag, o.lse, TolLogprob)
				s.check("TokenLogprobFiltered logprobFull "+tag, o.lpf, TolLogprob)
				s.check("TokenLogprobFiltered lseFull "+tag, o.lsef, TolLogprob)
				tol := TolLogprob
				if sh.bf16 {
					tol = TolLogprobBF16Grad
				}
				s.check("TokenLogprobFilteredBackward dhidden "+tag, dh, tol)
				s.check("TokenLogprobFilteredBackward dweight "+tag, dw, tol)
			}
		}
	}},
	{"DataErrors", func(s *suite) {
		// ScatterRows with an index past the destination's rows.
		src := s.randn(3*5, 1)
		ix := s.i32([]int32{0, 4, 2}) // dst has 4 rows
		dst := s.randn(4*5, 1)
		both(s, func(b kernels.Backend, v func(*pairBuf) kernels.Buf) { b.ScatterRows(v(dst), v(src), v(ix), 3, 5) })
		s.wantSyncError("ScatterRows index 4 of 4 rows")
		s.check("ScatterRows dst with a bad index (the valid rows land)", dst, TolExact)
		// TokenLogprob with a target id past the vocabulary: that row is zero.
		const T, C, V = 6, 8, 40
		hidden, w := s.randn(T*C, 1), s.randn(V*C, 1)
		targets := s.i32([]int32{3, 40, -1, 0, 39, 7})
		lp, ent, lse := s.out(T), s.out(T), s.out(T)
		both(s, func(b kernels.Backend, v func(*pairBuf) kernels.Buf) {
			b.TokenLogprob(v(lp), v(ent), v(lse), v(hidden), v(w), v(targets), T, C, V, 1)
		})
		s.wantSyncError("TokenLogprob target 40 of V=40")
		s.check("TokenLogprob logprob with a bad target", lp, TolLogprob)
		s.check("TokenLogprob lse with a bad target", lse, TolLogprob)
	}},
	{"ScatterRows", func(s *suite) {
		for _, sh := range []struct{ N, W, R int }{{1, 1, 1}, {5, 33, 9}, {40, 7, 40}} {
			perm := s.rng.Perm(sh.R)[:sh.N]
			idx := make([]int32, sh.N)
			for i, p := range perm {
				idx[i] = int32(p)
			}
			src := s.randn(sh.N*sh.W, 1)
			ix := s.i32(idx)
			dst := s.randn(sh.R*sh.W, 1)
			both(s, func(b kernels.Backend, v func(*pairBuf) kernels.Buf) {
				b.ScatterRows(v(dst), v(src), v(ix), sh.N, sh.W)
			})
			s.check(fmt.Sprintf("ScatterRows N=%d W=%d R=%d", sh.N, sh.W, sh.R), dst, TolExact)
		}
	}},
	{"ScatterRowsBF16", func(s *suite) {
		// Into a bf16 cache from fp32 rows (rounded) and bf16 rows (copied),
		// and from bf16 rows into fp32 (widened): exact on both backends.
		for _, sh := range []struct{ N, W, R int }{{1, 1, 1}, {5, 33, 9}, {40, 128, 300}} {
			perm := s.rng.Perm(sh.R)[:sh.N]
			idx := make([]int32, sh.N)
			for i, p := range perm {
				idx[i] = int32(p)
			}
			ix := s.i32(idx)
			src32, src16 := s.randn(sh.N*sh.W, 1), s.randnBF16(sh.N*sh.W, 1)
			d16a, d16b, d32 := s.randnBF16(sh.R*sh.W, 1), s.randnBF16(sh.R*sh.W, 1), s.randn(sh.R*sh.W, 1)
			both(s, func(b kernels.Backend, v func(*pairBuf) kernels.Buf) {
				b.ScatterRows(v(d16a), v(src32), v(ix), sh.N, sh.W)
				b.ScatterRows(v(d16b), v(src16), v(ix), sh.N, sh.W)
				b.ScatterRows(v(d32), v(src16), v(ix), sh.N, sh.W)
			})
			tag := fmt.Sprintf("N=%d W=%d R=%d", sh.N, sh.W, sh.R)
			s.check("ScatterRows f32 → bf16 "+tag, d16a, TolExact)
			s.check("ScatterRows bf16 → bf16 "+tag, d16b, TolExact)
			s.check("ScatterRows bf16 → f32 "+tag, d32, TolExact)
		}
	}},
	{"SampleTokens", func(s *suite) {
		// Device sampling (kernels.TokenSampler) against the reference: the
		// same tokens and logprobs from the same logits and uniforms, for
		// greedy, plain temperature, top-k, top-p and both, on flat, peaked
		// and tied rows, at temperatures low enough that most probabilities
		// underflow to zero (ties the kept set must break by id).
		dutS, ok := s.dut.(kernels.TokenSampler)
		refS := s.ref.(kernels.TokenSampler)
		if !ok {
			s.t.Skipf("%s does not implement kernels.TokenSampler", s.dut.Name())
		}
		Vs, B := []int{1, 7, 1000, 3001}, 12
		if s.reduced {
			Vs, B = []int{1, 7, 1000}, 8
		}
		if s.schedule {
			Vs = []int{7, 1000} // one warp's row, and rows of many warps
		}
		for _, V := range Vs {
			z := make([]float32, B*V)
			for r := range B {
				scale := []float64{0.1, 1, 5, 1}[r%4]
				for i := range V {
					x := s.rng.NormFloat64() * scale
					if r%4 == 3 {
						x = math.Round(x * 2) // ties
					}
					z[r*V+i] = float32(x)
				}
			}
			uw := make([]int32, 2*B)
			for r := range B {
				u := s.rng.Float64()
				switch r {
				case 0, 2, 3: // u = 0: the first kept token with p > 0 (tokens of p = 0 before it)
					u = 0
				case 1:
					u = math.Nextafter(1, 0)
				}
				bits := math.Float64bits(u)
				uw[2*r], uw[2*r+1] = int32(uint32(bits)), int32(uint32(bits>>32))
			}
			logits, u := s.f32(z), s.i32(uw)
			for _, p := range []kernels.SampleParams{
				{Temperature: 0}, {Temperature: 1}, {Temperature: 0.7, TopK: 5}, {Temperature: 1.3, TopP: 0.9},
				{Temperature: 1, TopK: 50, TopP: 0.8}, {Temperature: 1, TopK: 1}, {Temperature: 1, TopK: V, TopP: 1},
				{Temperature: 0.01, TopK: V / 2}, {Temperature: 0.02, TopP: 0.5},
			} {
				tok, lp := s.i32(make([]int32, B)), s.out(B)
				refS.SampleTokens(tok.r, lp.r, logits.r, u.r, B, V, p)
				dutS.SampleTokens(tok.d, lp.d, logits.d, u.d, B, V, p)
				tag := fmt.Sprintf("V=%d %+v", V, p)
				s.checkI32("SampleTokens tokens "+tag, tok)
				s.check("SampleTokens logprobs "+tag, lp, TolSample)
			}
		}
	}},
	{"FillCopyScale", func(s *suite) {
		// Unaligned views and aligned ones (a backend's vector path, with a
		// tail).
		for _, aligned := range []bool{false, true} {
			s.aligned = aligned
			for _, N := range []int{1, 777} {
				x, y := s.out(N), s.randn(N, 1)
				c := s.out(N)
				z := s.randn(N, 1)
				both(s, func(b kernels.Backend, v func(*pairBuf) kernels.Buf) {
					b.Fill(v(x), -1.25)
					b.Copy(v(c), v(y))
					b.Scale(v(z), 0.3)
				})
				tag := fmt.Sprintf("N=%d aligned=%v", N, aligned)
				s.check("Fill "+tag, x, TolExact)
				s.check("Copy "+tag, c, TolExact)
				s.check("Scale "+tag, z, TolExact)
			}
		}
		s.aligned = false
	}},
	{"AdamW", func(s *suite) {
		for _, st := range []kernels.AdamWStep{
			// lr·wd = 1e-3: a missing decay moves p far beyond TolElementwise.
			kernels.NewAdamWStep(kernels.TorchAdamW, 1e-2, 0.9, 0.999, 1e-8, 0.1, 1, 1),
			kernels.NewAdamWStep(kernels.TorchAdamW, 3e-4, 0.9, 0.95, 1e-6, 0, 50, 0.25),
		} {
			N := 1001
			p, g := s.randn(N, 1), s.randn(N, 1)
			m := s.randn(N, 0.1)
			vv := make([]float32, N)
			for i := range vv {
				vv[i] = float32(s.rng.Float64() * 0.01)
			}
			v := s.f32(vv)
			both(s, func(b kernels.Backend, vw func(*pairBuf) kernels.Buf) { b.AdamW(vw(p), vw(g), vw(m), vw(v), st) })
			tag := fmt.Sprintf("lr=%g wd=%g", st.LR, st.WeightDecay)
			s.check("AdamW param "+tag, p, TolElementwise)
			s.check("AdamW m "+tag, m, TolElementwise)
			s.check("AdamW v "+tag, v, TolElementwise)
		}
		// TransformerEngine's FusedAdam (the decay inside the update,
		// float32 scalars), with float32 moments and with bf16 ones (a bf16
		// moment may round the other way where the CUDA kernel's fused
		// multiply-adds move the float32 value by an ulp: TolBF16Out).
		for _, bf16 := range []bool{false, true} {
			for _, st := range []kernels.AdamWStep{
				kernels.NewAdamWStep(kernels.FusedAdam, 1e-2, 0.9, 0.999, 1e-8, 0.1, 1, 1),
				kernels.NewAdamWStep(kernels.FusedAdam, 3e-4, 0.9, 0.95, 1e-6, 0.01, 50, 0.25),
			} {
				N := 1001
				p, g := s.randn(N, 1), s.randn(N, 1)
				mv, vv := make([]float32, N), make([]float32, N)
				for i := range vv {
					mv[i] = float32(s.rng.NormFloat64() * 0.1)
					vv[i] = float32(s.rng.Float64() * 0.01)
				}
				m, v := s.f32(mv), s.f32(vv)
				tol := TolElementwise
				if bf16 {
					m, v, tol = s.bf16(mv), s.bf16(vv), TolBF16Out
				}
				both(s, func(b kernels.Backend, vw func(*pairBuf) kernels.Buf) { b.AdamW(vw(p), vw(g), vw(m), vw(v), st) })
				tag := fmt.Sprintf("FusedAdam bf16=%v lr=%g wd=%g", bf16, st.LR, st.WeightDecay)
				s.check("AdamW param "+tag, p, TolElementwise)
				s.check("AdamW m "+tag, m, tol)
				s.check("AdamW v "+tag, v, tol)
			}
		}
	}},
	{"AdamWMulti", func(s *suite) {
		// The multi-tensor step (kernels.MultiAdamW): the clip factor from
		// the groups' sums on the backend, chunks of several groups (with
		// and without decay, elements between groups left alone), each
		// rule and moment dtype; a non-finite sum skips everything, and an
		// overflowing learning rate flags exactly the groups it overflows.
		dutM, ok := s.dut.(kernels.MultiAdamW)
		if !ok {
			s.t.Skipf("%s does not implement kernels.MultiAdamW", s.dut.Name())
		}
		refM := s.ref.(kernels.MultiAdamW)
		var chunks []kernels.AdamChunk
		n, groups := 0, 5
		for g := range groups {
			sz := 1 + s.rng.IntN(700)
			for off := 0; off < sz; off += 256 {
				chunks = append(chunks, kernels.AdamChunk{Off: int64(n + off), N: int32(min(256, sz-off)), Group: int32(g), Decay: g%2 == 0})
			}
			n += sz + 2
		}
		table := s.i32(kernels.EncodeAdamChunks(chunks))
		for _, c := range []struct {
			name    string
			rule    kernels.AdamRule
			bf16    bool
			sums    []float32
			lr      float64
			maxNorm float64
		}{
			{"torch clip", kernels.TorchAdamW, false, []float32{3, 4, 0.5, 9, 1}, 1e-2, 1},
			{"fused noclip", kernels.FusedAdam, false, []float32{3, 4, 0.5, 9, 1}, 1e-2, 0},
			{"fused bf16 clip", kernels.FusedAdam, true, []float32{0.1, 0.2, 0.3, 0.4, 0.5}, 3e-3, 0.5},
			{"nan sum skips", kernels.FusedAdam, false, []float32{1, float32(math.NaN()), 1, 1, 1}, 1e-2, 1},
			{"overflow flags", kernels.FusedAdam, false, []float32{1, 1, 1, 1, 1}, 3e38, 0},
		} {
			p, g := s.randn(n, 1), s.randn(n, 1)
			mv, vv := make([]float32, n), make([]float32, n)
			for i := range vv {
				mv[i] = float32(s.rng.NormFloat64() * 0.1)
				vv[i] = float32(s.rng.Float64() * 0.01)
			}
			m, v := s.f32(mv), s.f32(vv)
			tol := TolElementwise
			if c.bf16 {
				m, v, tol = s.bf16(mv), s.bf16(vv), TolBF16Out
			}
			sums := s.f32(c.sums)
			flags := s.i32(make([]int32, 2+groups))
			st := kernels.NewAdamWStep(c.rule, c.lr, 0.9, 0.999, 1e-8, 0.1, 3, 1)
			refM.AdamWMulti(p.r, g.r, m.r, v.r, sums.r, table.r, flags.r, groups, len(chunks), st, c.maxNorm)
			dutM.AdamWMulti(p.d, g.d, m.d, v.d, sums.d, table.d, flags.d, groups, len(chunks), st, c.maxNorm)
			s.check("AdamWMulti param "+c.name, p, TolElementwise)
			s.check("AdamWMulti m "+c.name, m, tol)
			s.check("AdamWMulti v "+c.name, v, tol)
			s.checkI32("AdamWMulti flags "+c.name, flags)
		}
	}},
	{"SumSquares", func(s *suite) {
		for _, N := range []int{1, 1000, 100003} {
			x := s.randn(N, 1)
			out := s.out(1)
			both(s, func(b kernels.Backend, v func(*pairBuf) kernels.Buf) { b.SumSquares(v(out), v(x)) })
			s.check(fmt.Sprintf("SumSquares N=%d", N), out, Tol{Atol: 0, Rtol: 1e-6})
		}
	}},
}
