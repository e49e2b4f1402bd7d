package model

import (
	"math"
	"math/rand/v2"
	"testing"

	"github.com/tracegrpo/tracegrpo/kernels"
	"github.com/tracegrpo/tracegrpo/kernels/cpu"
)

// TestHeadFilterModel: a model built with Options.HeadFilter and HeadFull
// returns NeMo RL's filtered logprobs (under top_k V/2: −Inf for a token
// outside the filter, above the unfiltered logprob inside it), its
// LogprobsFull are the unfiltered
// model's logprobs bit for bit, BackwardFull with only the unfiltered
// gradient is the unfiltered model's Backward (within float32 rounding),
// and its reference (NewReference) is unfiltered. A filter on a top_k
// above the vocabulary is refused.
func TestHeadFilterModel(t *testing.T) {
	b := cpu.New(2)
	defer b.Close()
	opt := Options{MaxTokens: 64, MaxSeqs: 4}
	plain := loadTestModel(t, "llama_untied", b, opt)
	defer plain.Close()
	fopt := opt
	V := plain.Config().VocabSize
	fopt.HeadFilter, fopt.HeadFull = kernels.TopKTopP{TopK: V / 2}, true
	filt := loadTestModel(t, "llama_untied", b, fopt)
	defer filt.Close()
	r := rand.New(rand.NewPCG(5, 6))
	toks := make([]int32, 40)
	for i := range toks {
		toks[i] = int32(r.IntN(V))
	}
	cu := []int32{0, 17, 40}
	lpU, _, err := plain.Forward(toks, cu, 0.8)
	if err != nil {
		t.Fatal(err)
	}
	lpU = append([]float32(nil), lpU...)
	lpF, _, err := filt.Forward(toks, cu, 0.8)
	if err != nil {
		t.Fatal(err)
	}
	full := filt.LogprobsFull()
	inf := 0
	for i := range lpU {
		if math.Float32bits(full[i]) != math.Float32bits(lpU[i]) {
			t.Fatalf("token %d: unfiltered logprob %g, the plain model's %g", i, full[i], lpU[i])
		}
		switch {
		case math.IsInf(float64(lpF[i]), -1):
			inf++
		case i != 0 && i != 17 && !(lpF[i] >= lpU[i]):
			t.Fatalf("token %d: top-k %d logprob %g, want -Inf or at least the unfiltered %g", i, V/2, lpF[i], lpU[i])
		}
	}
	if inf == 0 || inf == len(lpF)-2 {
		t.Fatalf("%d of %d tokens filtered out: want some, not all", inf, len(lpF)-2)
	}
	g := make([]float32, len(toks))
	zero := make([]float32, len(toks))
	for i := range g {
		g[i] = float32(r.NormFloat64())
	}
	plain.ZeroGrad()
	if err := plain.Backward(g); err != nil {
		t.Fatal(err)
	}
	want := make([]float32, plain.Grads().N)
	b.DownloadF32(want, plain.Grads())
	if _, _, err := filt.Forward(toks, cu, 0.8); err != nil {
		t.Fatal(err)
	}
	filt.ZeroGrad()
	if err := filt.BackwardFull(zero, g); err != nil {
		t.Fatal(err)
	}
	got := make([]float32, filt.Grads().N)
	b.DownloadF32(got, filt.Grads())
	// The two heads round dz differently (exp(fl(z·invTemp) − lse) against
	// exp(z·invTemp − lse), kernels/cpu's TestFilteredHeadOffIsTokenLogprob:
	// within 1e-6 there); the decoder's backward carries that into weight
	// gradients of O(1e-2) as up to 2e-5.
	compareClose(t, "BackwardFull(0, g) against Backward(g)", got, want, 5e-5, 1e-4)

	ref, err := NewReference(filt)
	if err != nil {
		t.Fatal(err)
	}
	defer ref.Close()
	lpR, _, err := ref.Forward(toks, cu, 0.8)
	if err != nil {
		t.Fatal(err)
	}
	for i := range lpR {
		if math.Float32bits(lpR[i]) != math.Float32bits(lpU[i]) {
			t.Fatalf("reference token %d: %g, the unfiltered %g", i, lpR[i], lpU[i])
		}
	}
	if err := plain.BackwardFull(g, g); err == nil {
		t.Error("BackwardFull with an unfiltered gradient on a model that keeps none: no error")
	}
	bad := opt
	bad.HeadFilter = kernels.TopKTopP{TopK: V + 1}
	if m, err := New(b, plain.Config(), bad); err == nil {
		m.Close()
		t.Errorf("top_k %d above a vocabulary of %d: no error", V+1, V)
	}
}
