package cpu

import (
	"fmt"
	"math"
	"math/rand/v2"
	"testing"

	"github.com/tracegrpo/tracegrpo/kernels"
	"github.com/tracegrpo/tracegrpo/kernels/internal/nemorlgolden"
)

// Tolerances of the filtered head against NeMo RL's golden: float32
// logits against torch's float32 log_softmax (lse and logprob are O(10)
// sums of up to 4099 exps, 6e-8 each), and our z = raw·float32(1/T)
// against torch's raw/T (a float32 ulp apart).
const (
	filterAtol = 2e-5
	filterRtol = 2e-5
)

// headOut allocates a FilteredHead's outputs for T rows.
func headOut(t *testing.T, b *Backend, T int) kernels.HeadOut {
	t.Helper()
	a := func(dt kernels.DType, n int) kernels.Buf {
		x, err := b.Alloc(dt, n)
		if err != nil {
			t.Fatal(err)
		}
		return x
	}
	return kernels.HeadOut{Logprob: a(kernels.F32, T), Entropy: a(kernels.F32, T), LSE: a(kernels.F32, T),
		LogprobFull: a(kernels.F32, T), LSEFull: a(kernels.F32, T), Cut: a(kernels.I32, 2*T)}
}

func upload(t *testing.T, b *Backend, x []float32) kernels.Buf {
	t.Helper()
	buf, err := b.Alloc(kernels.F32, len(x))
	if err != nil {
		t.Fatal(err)
	}
	b.UploadF32(buf, x)
	return buf
}

func uploadI(t *testing.T, b *Backend, x []int32) kernels.Buf {
	t.Helper()
	buf, err := b.Alloc(kernels.I32, len(x))
	if err != nil {
		t.Fatal(err)
	}
	b.UploadI32(buf, x)
	return buf
}

// TestFilteredHeadMatchesNeMoRL runs the golden's rows through the backend
// as hidden = logits and weight = I (so z = logits·invTemp exactly) and
// compares with NeMo RL's keep mask (exactly), its filtered lse, logprob
// (−Inf where the target is filtered out) and entropy, and its autograd
// d logprob/d logits through the backward.
func TestFilteredHeadMatchesNeMoRL(t *testing.T) {
	g := nemorlgolden.Load(t, "../testdata/nemorl_topk_topp.json")
	b := New(2)
	defer b.Close()
	defer func(v int) { tlpBudget = v }(tlpBudget)
	var maxErr float64
	where := ""
	note := func(name string, r int, what string, got, want float64) {
		d := math.Abs(got - want)
		if math.IsInf(want, -1) && math.IsInf(got, -1) {
			d = 0
		}
		if d > maxErr {
			maxErr, where = d, fmt.Sprintf("%s row %d %s", name, r, what)
		}
		if !(d <= filterAtol+filterRtol*math.Abs(want)) {
			t.Errorf("%s row %d: %s = %.9g, NeMo RL %.9g", name, r, what, got, want)
		}
	}
	cases := 0
	for ci, c := range g.Cases {
		if c.Error != "" {
			continue
		}
		cases++
		tlpBudget = []int{1, 3 * c.V, 1 << 22}[ci%3] // one row, three rows, every row in a block
		k := 0
		if c.TopK != nil {
			k = *c.TopK
		}
		V, T := c.V, c.Rows
		hid := make([]float32, T*V)
		for r := range T {
			copy(hid[r*V:], c.Raw(r))
		}
		eye := make([]float32, V*V)
		for i := range V {
			eye[i*V+i] = 1
		}
		hidden, weight, targets := upload(t, b, hid), upload(t, b, eye), uploadI(t, b, c.Targets)
		o := headOut(t, b, T)
		invTemp := float32(1) / float32(c.Temperature)
		b.TokenLogprobFiltered(o, hidden, weight, targets, T, V, V, invTemp, kernels.TopKTopP{TopK: k, TopP: c.TopP})
		ones := make([]float32, T)
		for i := range ones {
			ones[i] = 1
		}
		dlp, dh := upload(t, b, ones), upload(t, b, make([]float32, T*V))
		b.TokenLogprobFilteredBackward(dh, kernels.Buf{}, dlp, kernels.Buf{}, hidden, weight, targets, o, T, V, V, invTemp)
		if err := b.Sync(); err != nil {
			t.Fatal(err)
		}
		lp, ent, lse, cut, dz := b.F32(o.Logprob), b.F32(o.Entropy), b.F32(o.LSE), b.I32(o.Cut), b.F32(dh)
		for r := range T {
			cu := kernels.Cut{Key: uint32(cut[2*r]), ID: cut[2*r+1]}
			for i, x := range c.Raw(r) {
				if got, want := cu.Keeps(i, x*invTemp), c.Keep(r, i); got != want {
					t.Fatalf("%s row %d: token %d kept %v, NeMo RL %v", c.Name, r, i, got, want)
				}
			}
			note(c.Name, r, "lse", float64(lse[r]), float64(c.LSE[r]))
			note(c.Name, r, "logprob", float64(lp[r]), float64(c.LP[r]))
			note(c.Name, r, "entropy", float64(ent[r]), float64(c.Ent[r]))
			for i, want := range c.Dz(r) {
				note(c.Name, r, fmt.Sprintf("dz[%d]", i), float64(dz[r*V+i]), float64(want))
			}
		}
	}
	t.Logf("%d cases against NeMo RL %s: max |error| %.3g (%s)", cases, g.Meta.NeMoRLCommit[:12], maxErr, where)
}

// TestFilteredHeadOffIsTokenLogprob: with the filter off, the filtered
// head's outputs are TokenLogprob's bit for bit (LogprobFull and LSEFull
// always are), and its backward with dlogprobFull alone is
// TokenLogprobBackward's (within float32 rounding: the exponent is formed
// as exp(z·invTemp − lse) there, exp(fl(z·invTemp) − lse) here).
func TestFilteredHeadOffIsTokenLogprob(t *testing.T) {
	r := rand.New(rand.NewPCG(7, 9))
	b := New(3)
	defer b.Close()
	defer func(v int) { tlpBudget = v }(tlpBudget)
	for _, f := range []kernels.TopKTopP{{}, {TopK: 5, TopP: 0.9}} {
		for _, sh := range []struct{ T, C, V, budget int }{{5, 8, 300, 1 << 22}, {9, 16, 700, 512}, {4, 4, 1, 64}} {
			tlpBudget = sh.budget
			T, C, V := sh.T, sh.C, sh.V
			hid, w := to32(randVec(r, T*C, 2)), to32(randVec(r, V*C, 1))
			tg := make([]int32, T)
			for i := range tg {
				tg[i] = int32(r.IntN(V))
			}
			tg[1%T] = -1
			hidden, weight, targets := upload(t, b, hid), upload(t, b, w), uploadI(t, b, tg)
			o := headOut(t, b, T)
			lp, ent, lse := upload(t, b, make([]float32, T)), upload(t, b, make([]float32, T)), upload(t, b, make([]float32, T))
			b.TokenLogprobFiltered(o, hidden, weight, targets, T, C, V, 0.7, f)
			b.TokenLogprob(lp, ent, lse, hidden, weight, targets, T, C, V, 0.7)
			pairs := [][2]kernels.Buf{{o.LogprobFull, lp}, {o.LSEFull, lse}}
			if !f.On(V) {
				pairs = append(pairs, [2]kernels.Buf{o.Logprob, lp}, [2]kernels.Buf{o.LSE, lse})
			}
			for _, p := range pairs {
				got, want := b.F32(p[0]), b.F32(p[1])
				for i := range want {
					if math.Float32bits(got[i]) != math.Float32bits(want[i]) {
						t.Fatalf("%+v T %d V %d: row %d: %g, TokenLogprob %g", f, T, V, i, got[i], want[i])
					}
				}
			}
			if !f.On(V) {
				checkClose(t, "entropy", to64(b.F32(o.Entropy)), to64(b.F32(ent)), 1e-6, 1e-6)
			}
			g := to32(randVec(r, T, 1))
			dlp := upload(t, b, g)
			zero := upload(t, b, make([]float32, T))
			dh1, dw1 := upload(t, b, make([]float32, T*C)), upload(t, b, make([]float32, V*C))
			dh2, dw2 := upload(t, b, make([]float32, T*C)), upload(t, b, make([]float32, V*C))
			b.TokenLogprobFilteredBackward(dh1, dw1, zero, dlp, hidden, weight, targets, o, T, C, V, 0.7)
			b.TokenLogprobBackward(dh2, dw2, dlp, hidden, weight, targets, lse, T, C, V, 0.7)
			checkClose(t, "dhidden", to64(b.F32(dh1)), to64(b.F32(dh2)), 1e-6, 1e-5)
			checkClose(t, "dweight", to64(b.F32(dw1)), to64(b.F32(dw2)), 1e-6, 1e-5)
			if err := b.Sync(); err != nil {
				t.Fatal(err)
			}
		}
	}
}

// TestFilteredHeadBlocksInvariant: the thread count changes no bit of any
// output or gradient, and the block of rows (tlpBudget) none but
// dweight's (which adds one block's dzᵀ·hidden at a time: its rounding
// follows the blocks, fixed by V and the budget).
func TestFilteredHeadBlocksInvariant(t *testing.T) {
	r := rand.New(rand.NewPCG(11, 13))
	T, C, V := 13, 12, 257
	hid, w := to32(randVec(r, T*C, 3)), to32(randVec(r, V*C, 1))
	for i := range w { // ties: a few repeated weight rows
		if (i/C)%7 == 3 {
			w[i] = w[i%C]
		}
	}
	tg := make([]int32, T)
	for i := range tg {
		tg[i] = int32(r.IntN(V))
	}
	g, gu := to32(randVec(r, T, 1)), to32(randVec(r, T, 1))
	defer func(v int) { tlpBudget = v }(tlpBudget)
	var ref [][]float32
	for _, run := range []struct{ threads, budget int }{{1, 3 * V}, {3, 3 * V}, {4, 3*V + 7}, {3, 1}, {2, 1 << 22}} {
		tlpBudget = run.budget
		b := New(run.threads)
		hidden, weight, targets := upload(t, b, hid), upload(t, b, w), uploadI(t, b, tg)
		o := headOut(t, b, T)
		b.TokenLogprobFiltered(o, hidden, weight, targets, T, C, V, 1.3, kernels.TopKTopP{TopK: 40, TopP: 0.8})
		dh, dw := upload(t, b, make([]float32, T*C)), upload(t, b, make([]float32, V*C))
		b.TokenLogprobFilteredBackward(dh, dw, upload(t, b, g), upload(t, b, gu), hidden, weight, targets, o, T, C, V, 1.3)
		if err := b.Sync(); err != nil {
			t.Fatal(err)
		}
		cut := b.I32(o.Cut)
		cutF := make([]float32, len(cut))
		for i, x := range cut {
			cutF[i] = math.Float32frombits(uint32(x))
		}
		got := [][]float32{b.F32(o.Logprob), b.F32(o.Entropy), b.F32(o.LSE), b.F32(o.LogprobFull), b.F32(o.LSEFull), cutF, b.F32(dh), b.F32(dw)}
		if ref == nil {
			ref = got
		}
		for k := range got {
			if k == 7 && run.budget/V != 3 {
				continue
			}
			for i := range got[k] {
				if math.Float32bits(got[k][i]) != math.Float32bits(ref[k][i]) {
					t.Fatalf("threads %d budget %d: output %d element %d: %g, first run %g", run.threads, run.budget, k, i, got[k][i], ref[k][i])
				}
			}
		}
		b.Close()
	}
}
