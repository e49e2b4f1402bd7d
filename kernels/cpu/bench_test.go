package cpu

// Op benchmarks on the shapes of the Qwen3-shaped model (hidden 512,
// 8 heads, 4 KV heads, head_dim 64, intermediate 1536, vocab 8192, 8×256
// packed tokens) on 2 threads. scripts/bench_ops_torch.py times the same
// shapes in PyTorch with torch.set_num_threads(2).

import (
	"fmt"
	"math/rand/v2"
	"testing"

	"github.com/tracegrpo/tracegrpo/kernels"
)

const benchThreads = 2

type benchEnv struct {
	b *Backend
	r *rand.Rand
}

func newBenchEnv(b *testing.B) *benchEnv {
	be := New(benchThreads)
	b.Cleanup(be.Close)
	return &benchEnv{b: be, r: rand.New(rand.NewPCG(1, 2))}
}

func (e *benchEnv) rnd(n int, scale float32) kernels.Buf {
	buf, err := e.b.Alloc(kernels.F32, n)
	if err != nil {
		panic(err)
	}
	x := e.b.F32(buf)
	for i := range x {
		x[i] = scale * (2*e.r.Float32() - 1)
	}
	return buf
}

func (e *benchEnv) ints(x []int32) kernels.Buf {
	buf, err := e.b.Alloc(kernels.I32, len(x))
	if err != nil {
		panic(err)
	}
	e.b.UploadI32(buf, x)
	return buf
}

var matmulShapes = []struct{ T, C, OC int }{
	{2048, 512, 1536}, // gate/up
	{2048, 1536, 512}, // down
	{2048, 512, 512},  // q, o
	{2048, 512, 256},  // k, v
}

func BenchmarkMatmul(b *testing.B) {
	for _, s := range matmulShapes {
		for _, half := range []string{"fwd", "bwd_dinp", "bwd_dweight"} {
			b.Run(fmt.Sprintf("%s/T%d_C%d_OC%d", half, s.T, s.C, s.OC), func(b *testing.B) {
				e := newBenchEnv(b)
				inp, w, out := e.rnd(s.T*s.C, 1), e.rnd(s.OC*s.C, 0.05), e.rnd(s.T*s.OC, 1)
				dinp, dw := e.rnd(s.T*s.C, 0), e.rnd(s.OC*s.C, 0)
				var none kernels.Buf
				f := func() {
					switch half {
					case "fwd":
						e.b.Matmul(out, inp, w, s.T, s.C, s.OC)
					case "bwd_dinp":
						e.b.MatmulBackward(dinp, none, out, inp, w, s.T, s.C, s.OC)
					default:
						e.b.MatmulBackward(none, dw, out, inp, w, s.T, s.C, s.OC)
					}
				}
				f()
				b.ResetTimer()
				for i := 0; i < b.N; i++ {
					f()
				}
				b.ReportMetric(2*float64(s.T)*float64(s.C)*float64(s.OC)*float64(b.N)/b.Elapsed().Seconds()/1e9, "GFLOP/s")
			})
		}
	}
}

// attnBench sets up 8 sequences of 256 tokens, 8 query heads, 4 KV heads,
// head_dim 64.
func attnBench(b *testing.B) (e *benchEnv, q, k, v, out, lse, dq, dk, dv kernels.Buf, seqs kernels.Seqs) {
	const S, L, NH, NKV, HD = 8, 256, 8, 4, 64
	e = newBenchEnv(b)
	T := S * L
	q, k, v = e.rnd(T*NH*HD, 1), e.rnd(T*NKV*HD, 1), e.rnd(T*NKV*HD, 1)
	out, lse = e.rnd(T*NH*HD, 0), e.rnd(T*NH, 0)
	dq, dk, dv = e.rnd(T*NH*HD, 0), e.rnd(T*NKV*HD, 0), e.rnd(T*NKV*HD, 0)
	cu := make([]int32, S+1)
	for s := range cu {
		cu[s] = int32(s * L)
	}
	seqs = kernels.Seqs{CuSeqlens: e.ints(cu), S: S, MaxLen: L}
	return
}

func BenchmarkAttention(b *testing.B) {
	const NH, NKV, HD = 8, 4, 64
	b.Run("fwd/S8_L256_NH8_NKV4_HD64", func(b *testing.B) {
		e, q, k, v, out, lse, _, _, _, seqs := attnBench(b)
		e.b.Attention(out, lse, q, k, v, seqs, NH, NKV, HD)
		b.ResetTimer()
		for i := 0; i < b.N; i++ {
			e.b.Attention(out, lse, q, k, v, seqs, NH, NKV, HD)
		}
	})
	b.Run("bwd/S8_L256_NH8_NKV4_HD64", func(b *testing.B) {
		e, q, k, v, out, lse, dq, dk, dv, seqs := attnBench(b)
		e.b.Attention(out, lse, q, k, v, seqs, NH, NKV, HD)
		e.b.AttentionBackward(dq, dk, dv, out, out, lse, q, k, v, seqs, NH, NKV, HD)
		b.ResetTimer()
		for i := 0; i < b.N; i++ {
			e.b.AttentionBackward(dq, dk, dv, out, out, lse, q, k, v, seqs, NH, NKV, HD)
		}
	})
}

func BenchmarkTokenLogprob(b *testing.B) {
	const T, C, V = 2048, 512, 8192
	e := newBenchEnv(b)
	h, w := e.rnd(T*C, 1), e.rnd(V*C, 0.05)
	tg := make([]int32, T)
	for i := range tg {
		tg[i] = int32(e.r.IntN(V))
	}
	tb := e.ints(tg)
	lp, ent, lse, dlp := e.rnd(T, 0), e.rnd(T, 0), e.rnd(T, 0), e.rnd(T, 1)
	dh, dw := e.rnd(T*C, 0), e.rnd(V*C, 0)
	b.Run("fwd/T2048_C512_V8192", func(b *testing.B) {
		for i := 0; i < b.N; i++ {
			e.b.TokenLogprob(lp, ent, lse, h, w, tb, T, C, V, 1)
		}
	})
	b.Run("bwd/T2048_C512_V8192", func(b *testing.B) {
		e.b.TokenLogprob(lp, ent, lse, h, w, tb, T, C, V, 1)
		b.ResetTimer()
		for i := 0; i < b.N; i++ {
			e.b.TokenLogprobBackward(dh, dw, dlp, h, w, tb, lse, T, C, V, 1)
		}
	})
}

func BenchmarkElementwise(b *testing.B) {
	const N = 2048 * 1536
	e := newBenchEnv(b)
	g, u, out := e.rnd(N, 4), e.rnd(N, 1), e.rnd(N, 0)
	b.Run("swiglu_fwd/N3145728", func(b *testing.B) {
		for i := 0; i < b.N; i++ {
			e.b.SwiGLU(out, g, u, N)
		}
	})
	b.Run("swiglu_bwd/N3145728", func(b *testing.B) {
		d := e.rnd(N, 1)
		for i := 0; i < b.N; i++ {
			e.b.SwiGLUBackward(g, u, d, out, d, N)
		}
	})
	const R, C = 2048, 512
	x, wn, o, rstd := e.rnd(R*C, 1), e.rnd(C, 1), e.rnd(R*C, 0), e.rnd(R, 0)
	b.Run("rmsnorm_fwd/N2048_C512", func(b *testing.B) {
		for i := 0; i < b.N; i++ {
			e.b.RMSNorm(o, rstd, x, wn, R, C, 1e-6)
		}
	})
	dwn, dx := e.rnd(C, 0), e.rnd(R*C, 0)
	b.Run("rmsnorm_bwd/N2048_C512", func(b *testing.B) {
		for i := 0; i < b.N; i++ {
			e.b.RMSNormBackward(dx, dwn, o, x, wn, rstd, R, C)
		}
	})
}

// BenchmarkMicroKernel times one micro-kernel on L1-resident panels: the
// single-thread ceiling of the gemm.
func BenchmarkMicroKernel(b *testing.B) {
	const k = gemmKC
	a, bb, c := make([]float32, k*gemmMR), make([]float32, k*gemmNR), make([]float32, gemmMR*gemmNR)
	for name, kern := range availableKernels() {
		b.Run(name, func(b *testing.B) {
			for i := 0; i < b.N; i++ {
				kern(k, &a[0], &bb[0], &c[0], gemmNR, 1)
			}
			b.ReportMetric(2*gemmMR*gemmNR*k*float64(b.N)/b.Elapsed().Seconds()/1e9, "GFLOP/s")
		})
	}
}
