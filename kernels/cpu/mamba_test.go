package cpu

// The Mamba-2 ops against independent float64 references: the scan as the
// plain sequential recurrence run along each segment's root-to-segment
// context (the chunked algorithm must equal it to rounding, on lengths the
// chunk does not divide, over random trees), the conv as a sum over each
// token's context, and every backward against finite differences of the
// references.

import (
	"fmt"
	"math"
	"math/rand/v2"
	"slices"
	"sort"
	"testing"

	"github.com/tracegrpo/tracegrpo/kernels"
)

// scanCase is one scan shape over one tree.
type scanCase struct {
	name string
	tr   testTree
	s    kernels.Scan
}

func seqTree(lens ...int) testTree {
	tr := testTree{offs: []int32{0}}
	for _, l := range lens {
		tr.parent = append(tr.parent, -1)
		tr.offs = append(tr.offs, tr.offs[len(tr.offs)-1]+int32(l))
		tr.ends = append(tr.ends, tr.offs[len(tr.offs)-1])
		tr.maxLen, tr.maxCtx = max(tr.maxLen, l), max(tr.maxCtx, l)
	}
	return tr
}

func scanCases(r *rand.Rand) []scanCase {
	sc := func(MH, MP, G, DS, L int) kernels.Scan {
		return kernels.Scan{MH: MH, MP: MP, G: G, DS: DS, Chunk: L, DtMax: float32(math.Inf(1))}
	}
	cl := sc(4, 3, 2, 5, 4)
	cl.DtMin, cl.DtMax = 0.05, 0.6 // the time_step_limit clamp, active on some tokens
	return []scanCase{
		{"one_token", seqTree(1), sc(1, 2, 1, 3, 4)},
		{"seq_len_not_multiple", seqTree(11), sc(2, 3, 1, 4, 4)},
		{"packed_groups", seqTree(5, 1, 9, 3), sc(4, 2, 2, 3, 3)},
		{"chunk_one", seqTree(6, 2), sc(2, 2, 2, 2, 1)},
		{"chunk_longer_than_seq", seqTree(3, 7), sc(3, 4, 1, 2, 16)},
		{"clamped_dt", seqTree(13), cl},
		{"tree", randTree(r, 4, 3, 5), sc(4, 3, 2, 4, 3)},
		{"tree_short_segments", randTree(r, 5, 2, 2), sc(2, 2, 1, 3, 2)},
	}
}

// scanInputs draws xbc, dtRaw, dtBias, aLog, d for T tokens.
func scanInputs(r *rand.Rand, T int, s kernels.Scan) (xbc, dtRaw, dtBias, aLog, d []float64) {
	xbc = round32(randVec(r, T*s.CD(), 1))
	dtRaw = round32(randVec(r, T*s.MH, 1.5))
	dtBias = round32(randVec(r, s.MH, 1))
	aLog = make([]float64, s.MH)
	for h := range aLog {
		aLog[h] = float64(float32(math.Log(float64(1+h)) + 0.3*(2*r.Float64()-1)))
	}
	d = round32(randVec(r, s.MH, 1))
	return
}

// scanSeq64 is the reference: for every segment, the sequential recurrence
// from a zero state along its context (ancestors root first, then itself),
// keeping y at its own tokens and its final state.
func scanSeq64(tr testTree, xbc, dtRaw, dtBias, aLog, d []float64, s kernels.Scan) (y, final []float64) {
	T, MH, P, N, G, CD := tr.T(), s.MH, s.MP, s.DS, s.G, s.CD()
	y = make([]float64, T*MH*P)
	final = make([]float64, tr.NS()*MH*P*N)
	for seg := range tr.NS() {
		ctx := tr.context(seg)
		for h := range MH {
			g := h / (MH / G)
			A := -math.Exp(aLog[h])
			S := make([]float64, P*N)
			for _, t := range ctx {
				dt := kernels.Softplus(dtRaw[t*MH+h] + dtBias[h])
				dt = math.Min(math.Max(dt, float64(s.DtMin)), float64(s.DtMax))
				e := math.Exp(dt * A)
				for p := range P {
					x := xbc[t*CD+h*P+p]
					var acc float64
					for n := range N {
						B := xbc[t*CD+s.DI()+g*N+n]
						C := xbc[t*CD+s.DI()+(G+g)*N+n]
						S[p*N+n] = e*S[p*N+n] + dt*x*B
						acc += S[p*N+n] * C
					}
					if int32(t) >= tr.offs[seg] {
						y[(t*MH+h)*P+p] = acc + d[h]*x
					}
				}
			}
			copy(final[(seg*MH+h)*P*N:], S)
		}
	}
	return y, final
}

// ancOf is each segment's context start (kernels.CheckTree's ancestors'
// token counts).
func ancOf(tr testTree) []int32 {
	anc := make([]int32, tr.NS())
	if err := kernels.CheckTree(tr.offs, tr.parent, tr.ends, tr.T(), tr.maxLen, tr.maxCtx, anc); err != nil {
		panic(err)
	}
	return anc
}

// scanChunked64 runs the CPU backend's chunked algorithm in float64.
func scanChunked64(tr testTree, xbc, dtRaw, dtBias, aLog, d []float64, s kernels.Scan) (y, final []float64) {
	a := ssmArgs[float64]{xbc: xbc, dtRaw: dtRaw, dtBias: dtBias, aLog: aLog, d: d, offs: tr.offs, parent: tr.parent, ends: tr.ends, anc: ancOf(tr), T: tr.T(), s: s}
	a.y = make([]float64, tr.T()*s.DI())
	a.final = make([]float64, tr.NS()*s.DI()*s.DS)
	w := newSSMWork[float64](nil, s)
	for h := range s.MH {
		headForward(&a, w, h)
	}
	return a.y, a.final
}

// scanChunkedBwd64 is the chunked backward in float64.
func scanChunkedBwd64(tr testTree, dy, xbc, dtRaw, dtBias, aLog, d []float64, s kernels.Scan) (dxbc, ddt, ddtBias, daLog, dd []float64) {
	T := tr.T()
	a := ssmArgs[float64]{xbc: xbc, dtRaw: dtRaw, dtBias: dtBias, aLog: aLog, d: d, offs: tr.offs, parent: tr.parent, ends: tr.ends, anc: ancOf(tr), T: T, s: s}
	a.dy = dy
	a.dxbc, a.ddtRaw = make([]float64, T*s.CD()), make([]float64, T*s.MH)
	a.ddtBias, a.daLog, a.dd = make([]float64, s.MH), make([]float64, s.MH), make([]float64, s.MH)
	a.dBC = make([]float64, T*s.MH*2*s.DS)
	w := newSSMWork[float64](nil, s)
	for h := range s.MH {
		headBackward(&a, w, h)
	}
	sumGroupBC(&a, 0, T)
	return a.dxbc, a.ddtRaw, a.ddtBias, a.daLog, a.dd
}

func TestSSMScanChunkedMatchesSequential(t *testing.T) {
	r := rand.New(rand.NewPCG(35, 1))
	for _, c := range scanCases(r) {
		t.Run(c.name, func(t *testing.T) {
			xbc, dtRaw, dtBias, aLog, d := scanInputs(r, c.tr.T(), c.s)
			wantY, wantF := scanSeq64(c.tr, xbc, dtRaw, dtBias, aLog, d, c.s)
			gotY, gotF := scanChunked64(c.tr, xbc, dtRaw, dtBias, aLog, d, c.s)
			checkClose(t, "y (chunked float64)", gotY, wantY, refAtol, refRtol)
			checkClose(t, "final (chunked float64)", gotF, wantF, refAtol, refRtol)

			e := newEnv(t, 2)
			T := c.tr.T()
			y, final := e.zeros(T*c.s.DI()), e.zeros(c.tr.NS()*c.s.DI()*c.s.DS)
			e.b.SSMScan(y, final, e.f32(xbc), e.f32(dtRaw), e.f32(dtBias), e.f32(aLog), e.f32(d), c.tr.upload(e), T, c.s)
			e.sync()
			checkClose(t, "y (float32 backend)", e.get(y), wantY, scanF32Atol, scanF32Rtol)
			checkClose(t, "final (float32 backend)", e.get(final), wantF, scanF32Atol, scanF32Rtol)
			t.Logf("%d tokens, chunk %d: max |Δ| against the sequential recurrence: chunked float64 y %.3g, final %.3g; backend float32 y %.3g, final %.3g",
				T, c.s.Chunk, maxAbs64(gotY, wantY), maxAbs64(gotF, wantF), maxAbs64(e.get(y), wantY), maxAbs64(e.get(final), wantF))
		})
	}
}

// scanF32Atol/Rtol: the float32 chunked scan against the float64
// sequential recurrence: the states sum up to a chunk of terms then carry
// across chunks, so errors grow with the context (tens of tokens here).
const (
	scanF32Atol = 1e-5
	scanF32Rtol = 1e-4
)

func TestSSMScanGradFD(t *testing.T) {
	r := rand.New(rand.NewPCG(35, 2))
	for _, c := range scanCases(r) {
		t.Run(c.name, func(t *testing.T) {
			T, s := c.tr.T(), c.s
			xbc, dtRaw, dtBias, aLog, d := scanInputs(r, T, s)
			wo := randVec(r, T*s.DI(), 1)
			loss := func() float64 {
				y, _ := scanSeq64(c.tr, xbc, dtRaw, dtBias, aLog, d, s)
				return dot64(y, wo)
			}
			dxbc, ddt, ddtBias, daLog, dd := scanChunkedBwd64(c.tr, wo, xbc, dtRaw, dtBias, aLog, d, s)
			checkClose(t, "dxbc", dxbc, fdGrad(xbc, loss), fdAtol, fdRtol)
			checkClose(t, "ddtRaw", ddt, fdGrad(dtRaw, loss), fdAtol, fdRtol)
			checkClose(t, "ddtBias", ddtBias, fdGrad(dtBias, loss), fdAtol, fdRtol)
			checkClose(t, "daLog", daLog, fdGrad(aLog, loss), fdAtol, fdRtol)
			checkClose(t, "dd", dd, fdGrad(d, loss), fdAtol, fdRtol)

			// The float32 backend (accumulating into random ddtBias, daLog, dd).
			e := newEnv(t, 3)
			acc := randVec(r, 3*s.MH, 1)
			dxb, ddtb := e.f32(randVec(r, T*s.CD(), 1)), e.f32(randVec(r, T*s.MH, 1))
			db, dal, ddb := e.f32(acc[:s.MH]), e.f32(acc[s.MH:2*s.MH]), e.f32(acc[2*s.MH:])
			e.b.SSMScanBackward(dxb, ddtb, db, dal, ddb, e.f32(wo), e.f32(xbc), e.f32(dtRaw), e.f32(dtBias), e.f32(aLog), e.f32(d), c.tr.upload(e), T, s)
			e.sync()
			add := func(x, y []float64) []float64 {
				out := slices.Clone(x)
				for i := range out {
					out[i] += y[i]
				}
				return out
			}
			checkClose(t, "dxbc (float32)", e.get(dxb), dxbc, scanF32Atol*10, scanF32Rtol*10)
			checkClose(t, "ddtRaw (float32)", e.get(ddtb), ddt, scanF32Atol*10, scanF32Rtol*10)
			checkClose(t, "ddtBias += (float32)", e.get(db), add(round32(acc[:s.MH]), ddtBias), scanF32Atol*10, scanF32Rtol*10)
			checkClose(t, "daLog += (float32)", e.get(dal), add(round32(acc[s.MH:2*s.MH]), daLog), scanF32Atol*10, scanF32Rtol*10)
			checkClose(t, "dd += (float32)", e.get(ddb), add(round32(acc[2*s.MH:]), dd), scanF32Atol*10, scanF32Rtol*10)
		})
	}
}

// TestSSMScanTreeMatchesPaths checks the hand-off at branch points on the
// backend itself: every segment's outputs in a tree equal those of its
// root-to-segment context run alone as one sequence, and each segment's
// backward gradients sum over its descendants' paths.
func TestSSMScanTreeMatchesPaths(t *testing.T) {
	r := rand.New(rand.NewPCG(35, 3))
	s := kernels.Scan{MH: 2, MP: 3, G: 1, DS: 4, Chunk: 3, DtMax: float32(math.Inf(1))}
	tr := randTree(r, 4, 3, 4)
	T := tr.T()
	xbc, dtRaw, dtBias, aLog, d := scanInputs(r, T, s)
	e := newEnv(t, 2)
	y := e.zeros(T * s.DI())
	e.b.SSMScan(y, kernels.Buf{}, e.f32(xbc), e.f32(dtRaw), e.f32(dtBias), e.f32(aLog), e.f32(d), tr.upload(e), T, s)
	e.sync()
	got := e.get(y)
	for seg := range tr.NS() {
		ctx := tr.context(seg)
		gather := func(x []float64, w int) []float64 {
			var out []float64
			for _, tk := range ctx {
				out = append(out, x[tk*w:(tk+1)*w]...)
			}
			return out
		}
		path := seqTree(len(ctx))
		py := e.zeros(len(ctx) * s.DI())
		e.b.SSMScan(py, kernels.Buf{}, e.f32(gather(xbc, s.CD())), e.f32(gather(dtRaw, s.MH)), e.f32(dtBias), e.f32(aLog), e.f32(d), path.upload(e), len(ctx), s)
		e.sync()
		want := e.get(py)
		own := int(tr.offs[seg+1] - tr.offs[seg])
		// Chunks aligned to context positions: the same computation as the
		// path's, bit for bit.
		checkClose(t, fmt.Sprintf("segment %d y", seg), got[int(tr.offs[seg])*s.DI():int(tr.offs[seg+1])*s.DI()],
			want[(len(ctx)-own)*s.DI():], 0, 0)
	}
}

// TestSSMDecodeMatchesScan runs a sequence one token at a time through
// SSMDecode and checks y and the state against SSMScan's.
func TestSSMDecodeMatchesScan(t *testing.T) {
	r := rand.New(rand.NewPCG(35, 4))
	s := kernels.Scan{MH: 4, MP: 2, G: 2, DS: 3, Chunk: 4, DtMin: 0.01, DtMax: 2}
	const T = 9
	xbc, dtRaw, dtBias, aLog, d := scanInputs(r, T, s)
	wantY, wantF := scanSeq64(seqTree(T), xbc, dtRaw, dtBias, aLog, d, s)
	e := newEnv(t, 1)
	state := e.zeros(s.DI() * s.DS)
	y := e.zeros(s.DI())
	var got []float64
	for tk := range T {
		e.b.SSMDecode(y, state, e.f32(xbc[tk*s.CD():(tk+1)*s.CD()]), e.f32(dtRaw[tk*s.MH:(tk+1)*s.MH]), e.f32(dtBias), e.f32(aLog), e.f32(d), 1, s)
		e.sync()
		got = append(got, e.get(y)...)
	}
	checkClose(t, "y", got, wantY, scanF32Atol, scanF32Rtol)
	checkClose(t, "state", e.get(state), wantF, scanF32Atol, scanF32Rtol)
}

// conv64 is the conv reference: each token's taps read from its context.
func conv64(tr testTree, inp, w, bias []float64, CD, KW int) (out []float64) {
	T := tr.T()
	out = make([]float64, T*CD)
	for seg := range tr.NS() {
		ctx := tr.context(seg)
		own := int(tr.offs[seg+1] - tr.offs[seg])
		for i := len(ctx) - own; i < len(ctx); i++ {
			t := ctx[i]
			for c := range CD {
				u := 0.0
				if bias != nil {
					u = bias[c]
				}
				for k := range KW {
					if j := i - (KW - 1) + k; j >= 0 {
						u += w[c*KW+k] * inp[ctx[j]*CD+c]
					}
				}
				out[t*CD+c] = u / (1 + math.Exp(-u))
			}
		}
	}
	return out
}

func TestConv1DAgainstReference(t *testing.T) {
	r := rand.New(rand.NewPCG(35, 5))
	for _, c := range []struct {
		name   string
		tr     testTree
		CD, KW int
		bias   bool
	}{
		{"one_token", seqTree(1), 3, 4, true},
		{"packed", seqTree(5, 1, 2, 7), 5, 4, true},
		{"no_bias_kw2", seqTree(4, 3), 70, 2, false}, // two channel blocks
		{"kw1", seqTree(3), 2, 1, true},
		{"tree", randTree(r, 4, 3, 4), 6, 4, true},
		{"tree_one_token_segments", randTree(r, 6, 2, 1), 4, 4, true},
	} {
		t.Run(c.name, func(t *testing.T) {
			T, CD, KW := c.tr.T(), c.CD, c.KW
			inp, w, wo := round32(randVec(r, T*CD, 1)), round32(randVec(r, CD*KW, 1)), randVec(r, T*CD, 1)
			var bias []float64
			if c.bias {
				bias = round32(randVec(r, CD, 1))
			}
			want := conv64(c.tr, inp, w, bias, CD, KW)
			e := newEnv(t, 2)
			out := e.zeros(T * CD)
			wb, bb := e.f32(w), kernels.Buf{}
			if c.bias {
				bb = e.f32(bias)
			}
			tree := c.tr.upload(e)
			e.b.Conv1D(out, e.f32(inp), wb, bb, tree, T, CD, KW)
			e.sync()
			checkClose(t, "out", e.get(out), want, f32Atol, f32Rtol)

			loss := func() float64 { return dot64(conv64(c.tr, inp, w, bias, CD, KW), wo) }
			dinp, dw := e.f32(randVec(r, T*CD, 1)), e.zeros(CD*KW)
			db := kernels.Buf{}
			if c.bias {
				db = e.zeros(CD)
			}
			e.b.Conv1DBackward(dinp, dw, db, e.f32(wo), e.f32(inp), wb, bb, tree, T, CD, KW)
			e.sync()
			checkClose(t, "dinp", e.get(dinp), fdGrad(inp, loss), f32Atol, 1e-4)
			checkClose(t, "dweight", e.get(dw), fdGrad(w, loss), f32Atol, 1e-4)
			if c.bias {
				checkClose(t, "dbias", e.get(db), fdGrad(bias, loss), f32Atol, 1e-4)
			}
		})
	}
}

// TestConv1DDecodeMatchesConv runs a sequence through Conv1DDecode one
// token at a time.
func TestConv1DDecodeMatchesConv(t *testing.T) {
	r := rand.New(rand.NewPCG(35, 6))
	const T, CD, KW = 7, 5, 4
	inp, w, bias := round32(randVec(r, T*CD, 1)), round32(randVec(r, CD*KW, 1)), round32(randVec(r, CD, 1))
	want := conv64(seqTree(T), inp, w, bias, CD, KW)
	e := newEnv(t, 1)
	win, out := e.zeros((KW-1)*CD), e.zeros(CD)
	wb, bb := e.f32(w), e.f32(bias)
	var got []float64
	for tk := range T {
		e.b.Conv1DDecode(out, win, e.f32(inp[tk*CD:(tk+1)*CD]), wb, bb, 1, CD, KW)
		e.sync()
		got = append(got, e.get(out)...)
	}
	checkClose(t, "out", got, want, f32Atol, f32Rtol)
	checkClose(t, "window (the last KW-1 rows)", e.get(win), inp[(T-KW+1)*CD:], 0, 0)
}

func gatedNorm64(y, z, w []float64, N, D, GS int, eps float64) []float64 {
	out := make([]float64, N*D)
	for r := range N {
		for g := 0; g < D/GS; g++ {
			var ss float64
			u := make([]float64, GS)
			for i := range GS {
				k := r*D + g*GS + i
				u[i] = y[k] * z[k] / (1 + math.Exp(-z[k]))
				ss += u[i] * u[i]
			}
			rs := 1 / math.Sqrt(ss/float64(GS)+eps)
			for i := range GS {
				out[r*D+g*GS+i] = w[g*GS+i] * u[i] * rs
			}
		}
	}
	return out
}

func TestGatedRMSNormGradFD(t *testing.T) {
	r := rand.New(rand.NewPCG(35, 7))
	for _, c := range []struct{ N, D, GS int }{{1, 4, 4}, {3, 12, 4}, {5, 130, 65}, {2, 6, 1}} {
		t.Run(fmt.Sprintf("N%d_D%d_GS%d", c.N, c.D, c.GS), func(t *testing.T) {
			const eps = 1e-5
			y, z, w, wo := round32(randVec(r, c.N*c.D, 2)), round32(randVec(r, c.N*c.D, 2)), round32(randVec(r, c.D, 1)), randVec(r, c.N*c.D, 1)
			e := newEnv(t, 2)
			out, rstd := e.zeros(c.N*c.D), e.zeros(c.N*c.D/c.GS)
			yb, zb, wb := e.f32(y), e.f32(z), e.f32(w)
			e.b.GatedRMSNorm(out, rstd, yb, zb, wb, c.N, c.D, c.GS, eps)
			e.sync()
			checkClose(t, "out", e.get(out), gatedNorm64(y, z, w, c.N, c.D, c.GS, eps), f32Atol, f32Rtol)
			dy, dz, dw := e.zeros(c.N*c.D), e.zeros(c.N*c.D), e.f32(make([]float64, c.D))
			e.b.GatedRMSNormBackward(dy, dz, dw, e.f32(wo), yb, zb, wb, rstd, c.N, c.D, c.GS)
			e.sync()
			loss := func() float64 { return dot64(gatedNorm64(y, z, w, c.N, c.D, c.GS, eps), wo) }
			checkClose(t, "dy", e.get(dy), fdGrad(y, loss), f32Atol, 1e-4)
			checkClose(t, "dz", e.get(dz), fdGrad(z, loss), f32Atol, 1e-4)
			checkClose(t, "dweight", e.get(dw), fdGrad(w, loss), f32Atol, 1e-4)
		})
	}
}

func TestReLU2(t *testing.T) {
	r := rand.New(rand.NewPCG(35, 8))
	x, dout := round32(randVec(r, 1000, 2)), round32(randVec(r, 1000, 1))
	x[0], x[1] = 0, -0.5
	e := newEnv(t, 2)
	out, dinp := e.zeros(1000), e.zeros(1000)
	e.b.ReLU2(out, e.f32(x), 1000)
	e.b.ReLU2Backward(dinp, e.f32(dout), e.f32(x), 1000)
	e.sync()
	want, dwant := make([]float64, 1000), make([]float64, 1000)
	for i, v := range x {
		rl := math.Max(v, 0)
		want[i], dwant[i] = rl*rl, 2*rl*dout[i]
	}
	checkClose(t, "out", e.get(out), want, 0, 1e-7)
	checkClose(t, "dinp", e.get(dinp), dwant, 0, 1e-7)
}

// sigmoidRoute64 is the sigmoid router as transformers'
// NemotronHMoE.route_tokens_to_experts writes it: float32 scores and
// choice, top-2 group sums, masked_fill 0.0, then the top K; weights in
// float64.
func sigmoidRoute64(z []float32, bias []float32, E int, r kernels.Router) ([]int32, []float64) {
	s := make([]float32, E)
	c := make([]float32, E)
	for e := range E {
		s[e] = float32(1 / (1 + math.Exp(-float64(z[e]))))
		c[e] = s[e]
		if bias != nil {
			c[e] = s[e] + bias[e]
		}
	}
	if r.Groups > 1 {
		gs := E / r.Groups
		type gsc struct {
			g int
			v float32
		}
		var gl []gsc
		for g := range r.Groups {
			row := slices.Clone(c[g*gs : (g+1)*gs])
			sort.Slice(row, func(i, j int) bool { return row[i] > row[j] })
			gl = append(gl, gsc{g, row[0] + row[1]})
		}
		sort.SliceStable(gl, func(i, j int) bool { return gl[i].v > gl[j].v })
		keep := map[int]bool{}
		for _, x := range gl[:r.TopGroups] {
			keep[x.g] = true
		}
		for e := range E {
			if !keep[e/gs] {
				c[e] = 0
			}
		}
	}
	idx := make([]int32, E)
	for e := range idx {
		idx[e] = int32(e)
	}
	sort.SliceStable(idx, func(i, j int) bool { return c[idx[i]] > c[idx[j]] })
	ex := idx[:r.K]
	var sum float64
	for _, e := range ex {
		sum += float64(s[e])
	}
	scale := 1.0
	if r.Scale != 0 {
		scale = float64(r.Scale)
	}
	wts := make([]float64, r.K)
	for j, e := range ex {
		if r.Norm {
			wts[j] = scale * float64(s[e]) / (sum + 1e-20)
		} else {
			wts[j] = scale * float64(s[e])
		}
	}
	return ex, wts
}

func TestSigmoidRouter(t *testing.T) {
	rng := rand.New(rand.NewPCG(35, 9))
	for _, c := range []struct {
		name            string
		T, E, K, Gr, TG int
		norm, bias      bool
		scale           float32
	}{
		{"plain", 7, 8, 2, 0, 0, true, false, 0},
		{"bias_scale", 9, 16, 4, 0, 0, true, true, 2.5},
		{"no_norm", 5, 6, 3, 0, 0, false, true, 1.5},
		{"groups", 11, 16, 4, 4, 2, true, true, 2.5},
		{"groups_no_bias", 6, 12, 2, 3, 1, false, false, 0},
	} {
		t.Run(c.name, func(t *testing.T) {
			e := newEnv(t, 2)
			z := round32(randVec(rng, c.T*c.E, 3))
			r := kernels.Router{K: c.K, Norm: c.norm, Sigmoid: true, Groups: c.Gr, TopGroups: c.TG, Scale: c.scale}
			var bias []float32
			if c.bias {
				bias = to32(randVec(rng, c.E, 0.3))
				r.Bias = e.f32(to64(bias))
			}
			probs, weights := e.zeros(c.T*c.E), e.zeros(c.T*c.K)
			experts := e.i32(make([]int32, c.T*c.K))
			logits := e.f32(z)
			e.b.RouterTopK(probs, weights, experts, logits, c.T, c.E, r)
			e.sync()
			gotEx := e.b.I32(experts)
			z32 := to32(z)
			var wantW []float64
			for tk := range c.T {
				ex, w := sigmoidRoute64(z32[tk*c.E:(tk+1)*c.E], bias, c.E, r)
				if got := gotEx[tk*c.K : (tk+1)*c.K]; !slices.Equal(got, ex) {
					t.Errorf("token %d: experts %v, want %v", tk, got, ex)
				}
				wantW = append(wantW, w...)
			}
			checkClose(t, "weights", e.get(weights), wantW, 1e-7, 1e-6)

			// Backward against finite differences of Σ wo·weights with the
			// choice held (the chosen experts are what routing fixes).
			wo := randVec(rng, c.T*c.K, 1)
			dprobs := randVec(rng, c.E, 0.1)
			dl := e.zeros(c.T * c.E)
			e.b.RouterTopKBackward(dl, e.f32(wo), probs, weights, experts, e.f32(dprobs), c.T, c.E, r)
			e.sync()
			zz := to64(z32)
			loss := func() float64 {
				var L float64
				for tk := range c.T {
					ex := gotEx[tk*c.K : (tk+1)*c.K]
					var sum float64
					sg := func(e int32) float64 { return 1 / (1 + math.Exp(-zz[tk*c.E+int(e)])) }
					for _, x := range ex {
						sum += sg(x)
					}
					for j, x := range ex {
						w := sg(x)
						if c.norm {
							w /= sum + 1e-20
						}
						if c.scale != 0 {
							w *= float64(c.scale)
						}
						L += wo[tk*c.K+j] * w
					}
					for ei := range c.E {
						L += dprobs[ei] * sg(int32(ei))
					}
				}
				return L
			}
			checkClose(t, "dlogits", e.get(dl), fdGrad(zz, loss), 1e-6, 1e-5)
		})
	}
}

// TestMambaWeightGradsAddTheirSum: Conv1DBackward and GatedRMSNormBackward
// sum each weight gradient over the tokens and then add it, so a gradient
// that starts at G ends at G + (the gradient from zero) bit for bit: a
// sharded model, which sums each micro-batch's gradients apart from the
// ones before it, then equals a whole model accumulating them in place.
func TestMambaWeightGradsAddTheirSum(t *testing.T) {
	r := rand.New(rand.NewPCG(35, 9))
	e := newEnv(t, 2)
	addExact := func(name string, start, fromZero, got []float32) {
		t.Helper()
		for i := range got {
			if want := start[i] + fromZero[i]; math.Float32bits(got[i]) != math.Float32bits(want) {
				t.Fatalf("%s[%d]: %v from %v, want %v + %v = %v", name, i, got[i], start[i], start[i], fromZero[i], want)
			}
		}
	}
	tr := seqTree(9, 5, 11)
	T, CD, KW := tr.T(), 70, 4 // two channel blocks
	inp, w, bias, dout := e.f32(randVec(r, T*CD, 1)), e.f32(randVec(r, CD*KW, 1)), e.f32(randVec(r, CD, 1)), e.f32(randVec(r, T*CD, 1))
	tree := tr.upload(e)
	g0, b0 := randVec(r, CD*KW, 1), randVec(r, CD, 1)
	dw, db, dw0, db0 := e.f32(g0), e.f32(b0), e.zeros(CD*KW), e.zeros(CD)
	e.b.Conv1DBackward(e.zeros(T*CD), dw, db, dout, inp, w, bias, tree, T, CD, KW)
	e.b.Conv1DBackward(e.zeros(T*CD), dw0, db0, dout, inp, w, bias, tree, T, CD, KW)
	e.sync()
	addExact("conv dweight", f32s(g0), f32s(e.get(dw0)), f32s(e.get(dw)))
	addExact("conv dbias", f32s(b0), f32s(e.get(db0)), f32s(e.get(db)))

	N, D, GS := 37, 130, 65
	y, z, nw := e.f32(randVec(r, N*D, 2)), e.f32(randVec(r, N*D, 2)), e.f32(randVec(r, D, 1))
	rstd := e.zeros(N * D / GS)
	e.b.GatedRMSNorm(e.zeros(N*D), rstd, y, z, nw, N, D, GS, 1e-5)
	gn := randVec(r, D, 1)
	dn, dn0 := e.f32(gn), e.zeros(D)
	gout := e.f32(randVec(r, N*D, 1))
	e.b.GatedRMSNormBackward(e.zeros(N*D), e.zeros(N*D), dn, gout, y, z, nw, rstd, N, D, GS)
	e.b.GatedRMSNormBackward(e.zeros(N*D), e.zeros(N*D), dn0, gout, y, z, nw, rstd, N, D, GS)
	e.sync()
	addExact("gated norm dweight", f32s(gn), f32s(e.get(dn0)), f32s(e.get(dn)))
}

// f32s rounds float64s to the float32s a buffer holds.
func f32s(v []float64) []float32 {
	out := make([]float32, len(v))
	for i, x := range v {
		out[i] = float32(x)
	}
	return out
}

// maxAbs64 is max |a − b|.
func maxAbs64(a, b []float64) float64 {
	m := 0.0
	for i := range a {
		m = math.Max(m, math.Abs(a[i]-b[i]))
	}
	return m
}
