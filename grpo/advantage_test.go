package grpo

import (
	"math"
	"math/rand/v2"
	"testing"
)

// TestAdvantageTiedPeers: a member whose voting peers all have the same
// reward gets std 0, so its advantage is r − b unscaled. With rewards that
// are not binary fractions the one-pass variance leaves rounding noise
// (~1e-9) that ε = 1e-6 would divide, giving |A| ≈ 1e5.
func TestAdvantageTiedPeers(t *testing.T) {
	rng := rand.New(rand.NewPCG(3, 4))
	opt := AdvantageOptions{NormalizeRewards: true, LeaveOneOut: true}
	for trial := 0; trial < 500; trial++ {
		k := 3 + rng.IntN(14)
		tie := math.Round(rng.Float64()*100) / 100 // 0.58, 0.07, ...
		rewards := make([]float64, k)
		for i := range rewards {
			rewards[i] = tie
		}
		odd := rng.IntN(k)
		rewards[odd] = math.Round(rng.Float64()*100) / 100
		groups := make([]int64, k)
		valid := make([]bool, k)
		for i := range valid {
			valid[i] = true
		}
		res, err := Advantages(groups, rewards, valid, opt)
		if err != nil {
			t.Fatal(err)
		}
		if res.Std[odd] != 0 {
			t.Fatalf("rewards %v: member %d's peers all tie at %v but std = %g", rewards, odd, tie, res.Std[odd])
		}
		if want := rewards[odd] - res.Baseline[odd]; res.Advantage[odd] != want {
			t.Fatalf("rewards %v: A[%d] = %g, want the unscaled %g", rewards, odd, res.Advantage[odd], want)
		}
		for i, a := range res.Advantage {
			if math.Abs(a) > 10 {
				t.Fatalf("rewards %v: |A[%d]| = %g: rounding noise was normalized", rewards, i, a)
			}
		}
	}
}
