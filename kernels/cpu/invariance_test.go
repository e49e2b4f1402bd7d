package cpu

// Pack invariance: a row's (or a sequence's) outputs are bit-identical
// whether it is computed alone or packed with other rows, so splitting or
// merging micro-batches cannot change per-token results.

import (
	"math"
	"math/rand/v2"
	"testing"

	"github.com/tracegrpo/tracegrpo/kernels"
)

func sameBits(t *testing.T, name string, got, want []float32) {
	t.Helper()
	if len(got) != len(want) {
		t.Fatalf("%s: %d values, want %d", name, len(got), len(want))
	}
	for i := range want {
		if math.Float32bits(got[i]) != math.Float32bits(want[i]) {
			t.Errorf("%s[%d] = %v packed, %v alone", name, i, got[i], want[i])
			return
		}
	}
}

func copyOf(e *env, b kernels.Buf) []float32 { return append([]float32(nil), e.b.F32(b)...) }

func TestMatmulRowInvariance(t *testing.T) {
	r := rand.New(rand.NewPCG(50, 50))
	const small, big, C, OC = 7, 301, 300, 290
	inp, w, dout := randVec(r, big*C, 1), randVec(r, OC*C, 1), randVec(r, big*OC, 1)
	run := func(T int) (out, dinp []float32) {
		e := newEnv(t, 2)
		ob, db := e.zeros(T*OC), e.zeros(T*C)
		wb := e.f32(w)
		e.b.Matmul(ob, e.f32(inp[:T*C]), wb, T, C, OC)
		e.b.MatmulBackward(db, kernels.Buf{}, e.f32(dout[:T*OC]), kernels.Buf{}, wb, T, C, OC)
		e.sync()
		return copyOf(e, ob), copyOf(e, db)
	}
	out1, dinp1 := run(small)
	out2, dinp2 := run(big)
	sameBits(t, "out", out2[:small*OC], out1)
	sameBits(t, "dinp", dinp2[:small*C], dinp1)
}

func TestAttentionSequenceInvariance(t *testing.T) {
	r := rand.New(rand.NewPCG(51, 51))
	const NH, NKV, HD = 4, 2, 16
	lens := []int{30, 100, 7} // the middle sequence spans three query blocks
	T := sum(lens)
	q, k, v, dout := randVec(r, T*NH*HD, 1), randVec(r, T*NKV*HD, 1), randVec(r, T*NKV*HD, 1), randVec(r, T*NH*HD, 1)
	run := func(lens []int, t0 int) map[string][]float32 {
		n := sum(lens)
		e := newEnv(t, 2)
		qb, kb, vb := e.f32(q[t0*NH*HD:(t0+n)*NH*HD]), e.f32(k[t0*NKV*HD:(t0+n)*NKV*HD]), e.f32(v[t0*NKV*HD:(t0+n)*NKV*HD])
		out, lse := e.zeros(n*NH*HD), e.zeros(n*NH)
		dq, dk, dv := e.zeros(n*NH*HD), e.zeros(n*NKV*HD), e.zeros(n*NKV*HD)
		seqs := e.seqs(lens)
		e.b.Attention(out, lse, qb, kb, vb, seqs, NH, NKV, HD)
		e.b.AttentionBackward(dq, dk, dv, e.f32(dout[t0*NH*HD:(t0+n)*NH*HD]), out, lse, qb, kb, vb, seqs, NH, NKV, HD)
		e.sync()
		return map[string][]float32{"out": copyOf(e, out), "lse": copyOf(e, lse), "dq": copyOf(e, dq), "dk": copyOf(e, dk), "dv": copyOf(e, dv)}
	}
	packed := run(lens, 0)
	alone := run(lens[1:2], lens[0])
	a, b := lens[0], lens[0]+lens[1]
	sameBits(t, "out", packed["out"][a*NH*HD:b*NH*HD], alone["out"])
	sameBits(t, "lse", packed["lse"][a*NH:b*NH], alone["lse"])
	sameBits(t, "dq", packed["dq"][a*NH*HD:b*NH*HD], alone["dq"])
	sameBits(t, "dk", packed["dk"][a*NKV*HD:b*NKV*HD], alone["dk"])
	sameBits(t, "dv", packed["dv"][a*NKV*HD:b*NKV*HD], alone["dv"])
}

// TestTokenLogprobRowInvariance: the vocabulary chunk the Backend picks
// depends on T, but a row's results do not.
func TestTokenLogprobRowInvariance(t *testing.T) {
	r := rand.New(rand.NewPCG(52, 52))
	const small, big, C, V = 5, 300, 40, 1300
	saved := tlpBudget
	tlpBudget = big * 256 // one 256-wide chunk at T=big, the whole vocabulary at T=small
	defer func() { tlpBudget = saved }()
	h, w, dlp := randVec(r, big*C, 1), randVec(r, V*C, 1), randVec(r, big, 1)
	tg := tlpTargets(r, big, V)
	run := func(T int) map[string][]float32 {
		e := newEnv(t, 2)
		hb, wb, tb := e.f32(h[:T*C]), e.f32(w), e.i32(tg[:T])
		lp, ent, lse, dh := e.zeros(T), e.zeros(T), e.zeros(T), e.zeros(T*C)
		e.b.TokenLogprob(lp, ent, lse, hb, wb, tb, T, C, V, 1.25)
		e.b.TokenLogprobBackward(dh, kernels.Buf{}, e.f32(dlp[:T]), hb, wb, tb, lse, T, C, V, 1.25)
		e.sync()
		return map[string][]float32{"logprob": copyOf(e, lp), "entropy": copyOf(e, ent), "lse": copyOf(e, lse), "dhidden": copyOf(e, dh)}
	}
	if tlpChunk(small, V) == tlpChunk(big, V) {
		t.Fatalf("chunk sizes coincide (%d); the test would not vary them", tlpChunk(small, V))
	}
	alone, packed := run(small), run(big)
	for _, name := range []string{"logprob", "entropy", "lse"} {
		sameBits(t, name, packed[name][:small], alone[name])
	}
	sameBits(t, "dhidden", packed["dhidden"][:small*C], alone["dhidden"])
}
