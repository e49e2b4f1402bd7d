package grpo

import (
	"fmt"
	"math"
)

// AdvantageEpsilon is added to a positive std before dividing (spec §5.2).
const AdvantageEpsilon = 1e-6

// AdvantageOptions configures the GRPO estimator (grpo.adv_estimator) and the
// optional clipping (grpo.advantage_clip_low/high).
type AdvantageOptions struct {
	NormalizeRewards bool
	LeaveOneOut      bool
	// ClipLow and ClipHigh bound the advantage when non-nil.
	ClipLow, ClipHigh *float64
}

// AdvantageResult holds, per logical rollout, the advantage and the
// diagnostics it came from.
type AdvantageResult struct {
	Advantage []float64
	Baseline  []float64
	Std       []float64
}

// Advantages computes one GRPO advantage per logical rollout (spec §5.1–§5.2).
//
// Rollouts are grouped by groups[i]. Only valid rollouts vote: with n_v valid
// members in a group, a group with n_v <= 1 has baseline b_i = r_i and std 0 for
// every member (advantage 0). Otherwise, with N = n_v − L (L = 1 for
// leave-one-out) and the sums over valid members j of the group (excluding
// j = i when leave-one-out):
//
//	b_i = Σ r_j / N,   q_i = Σ r_j² / N,   std_i = sqrt((q_i − b_i²)·N/(N−1)),
//
// a NaN std (0·∞ when N = 1, or a rounding-negative variance) becoming 0.
//
// One rule is added to NeMo RL's formula: when the rewards that enter a
// member's sums are all identical, its std is exactly 0 ("no variation"). In
// exact arithmetic q − b² is 0 there anyway, but the one-pass float sum
// leaves rounding noise (std ≈ 3e-9 for rewards such as 0.58), and since ε =
// 1e-6 is only added when std > 0, a member whose peers all tie got |A| ≈
// 1e5: the built-in job hit a loss of 3718 that way (TestAdvantageTiedPeers,
// and the golden script applies the same rule).
func Advantages(groups []int64, rewards []float64, valid []bool, opt AdvantageOptions) (AdvantageResult, error) {
	n := len(groups)
	if len(rewards) != n || len(valid) != n {
		return AdvantageResult{}, fmt.Errorf("grpo: advantages: %d groups, %d rewards, %d validity flags; want equal lengths", n, len(rewards), len(valid))
	}
	for i, r := range rewards {
		if math.IsNaN(r) || math.IsInf(r, 0) {
			return AdvantageResult{}, fmt.Errorf("grpo: advantages: reward %d is %v, want a finite number", i, r)
		}
	}
	if opt.ClipLow != nil && opt.ClipHigh != nil && *opt.ClipLow > *opt.ClipHigh {
		return AdvantageResult{}, fmt.Errorf("grpo: advantages: advantage_clip_low %g > advantage_clip_high %g", *opt.ClipLow, *opt.ClipHigh)
	}
	res := AdvantageResult{Advantage: make([]float64, n), Baseline: make([]float64, n), Std: make([]float64, n)}
	members := map[int64][]int{}
	var order []int64
	for i, g := range groups {
		if _, ok := members[g]; !ok {
			order = append(order, g)
		}
		members[g] = append(members[g], i)
	}
	loo := 0.0
	if opt.LeaveOneOut {
		loo = 1
	}
	for _, g := range order {
		idx := members[g]
		nv := 0
		for _, j := range idx {
			if valid[j] {
				nv++
			}
		}
		if nv <= 1 {
			for _, i := range idx {
				res.Baseline[i] = rewards[i]
				res.Std[i] = 0
			}
			continue
		}
		N := float64(nv) - loo
		for _, i := range idx {
			var s, q float64
			tied, first, seen := true, 0.0, false
			for _, j := range idx {
				if !valid[j] || (opt.LeaveOneOut && j == i) {
					continue
				}
				s += rewards[j]
				q += rewards[j] * rewards[j]
				if !seen {
					first, seen = rewards[j], true
				} else if rewards[j] != first {
					tied = false
				}
			}
			b := s / N
			q /= N
			std := math.Sqrt((q - b*b) * (N / (N - 1)))
			if math.IsNaN(std) || tied {
				std = 0
			}
			res.Baseline[i], res.Std[i] = b, std
		}
	}
	for i := range rewards {
		a := rewards[i] - res.Baseline[i]
		if opt.NormalizeRewards && res.Std[i] > 0 {
			a /= res.Std[i] + AdvantageEpsilon
		}
		if opt.ClipLow != nil && a < *opt.ClipLow {
			a = *opt.ClipLow
		}
		if opt.ClipHigh != nil && a > *opt.ClipHigh {
			a = *opt.ClipHigh
		}
		res.Advantage[i] = a
	}
	return res, nil
}
