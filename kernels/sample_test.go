package kernels

import (
	"math"
	"math/rand/v2"
	"slices"
	"sort"
	"testing"
)

// TestKeptSetMatchesFullSort: the pruned top-k/top-p selection equals
// sorting the whole vocabulary, on random distributions from flat to peaked
// and with ties.
func TestKeptSetMatchesFullSort(t *testing.T) {
	const V = 3000
	scratch := make([]int32, V)
	r := rand.New(rand.NewPCG(21, 22))
	ref := func(p []float64, topK int, topP float64) []int32 {
		order := make([]int32, len(p))
		for i := range order {
			order[i] = int32(i)
		}
		sort.SliceStable(order, func(a, b int) bool { return p[order[a]] > p[order[b]] })
		keep := len(p)
		if topK > 0 && topK < keep {
			keep = topK
		}
		var mass float64
		for _, i := range order[:keep] {
			mass += p[i]
		}
		if topP > 0 && topP < 1 {
			acc := 0.0
			for j, i := range order[:keep] {
				acc += p[i]
				if acc >= topP*mass {
					keep = j + 1
					break
				}
			}
		}
		return order[:keep]
	}
	p := make([]float64, V)
	for it := range 300 {
		scale := math.Exp(r.NormFloat64() * 2.5)
		for i := range p {
			z := r.NormFloat64() * scale
			if it%5 == 0 {
				z = math.Round(z) // ties
			}
			p[i] = z
		}
		zmax := slices.Max(p)
		for i := range p {
			p[i] = math.Exp(p[i] - zmax)
		}
		topK := []int{0, 1, 5, 50, 2999, 3000, 5000}[r.IntN(7)]
		topP := []float64{0, 0.1, 0.5, 0.9, 0.999, 1}[r.IntN(6)]
		k, q := topK, float64(float32(topP))
		if k <= 0 || k > V {
			k = V
		}
		if q <= 0 {
			q = 1
		}
		got := KeptSet(p, k, q, scratch[:0])
		want := ref(p, topK, float64(float32(topP)))
		if !slices.Equal(got, want) {
			t.Fatalf("iteration %d (scale %g, topK %d, topP %g): kept %d tokens, full sort keeps %d", it, scale, topK, topP, len(got), len(want))
		}
	}
}
