package kernels

import (
	"math"
	"slices"
)

// SampleRow draws one row's token from its logits z with the uniform u, as
// TokenSampler.SampleTokens defines the draw, and returns it with its
// logprob. p (len(z)) and order (capacity len(z)) are scratch. It is the
// CPU backend's sampler and the host draw of callers whose backend has no
// TokenSampler.
func SampleRow(z []float32, u float64, sp SampleParams, p []float64, order []int32) (int32, float32) {
	V := len(z)
	if sp.Temperature == 0 {
		best := 0
		for i, x := range z {
			if x > z[best] {
				best = i
			}
		}
		return int32(best), 0
	}
	inv := 1 / float64(sp.Temperature)
	zmax := math.Inf(-1)
	for _, x := range z {
		zmax = math.Max(zmax, float64(x))
	}
	for i, x := range z {
		p[i] = math.Exp((float64(x) - zmax) * inv)
	}
	topK := sp.TopK
	if topK <= 0 || topK > V {
		topK = V
	}
	topP := float64(sp.TopP)
	if topP <= 0 || topP > 1 {
		topP = 1
	}
	var kept []int32 // nil: every token
	if topK < V || topP < 1 {
		kept = KeptSet(p, topK, topP, order)
		slices.Sort(kept) // the draw walks the kept set in id order
	}
	var sum float64
	if kept == nil {
		for _, x := range p {
			sum += x
		}
	} else {
		for _, i := range kept {
			sum += p[i]
		}
	}
	target := u * sum
	acc := 0.0
	if kept == nil {
		for i, x := range p {
			acc += x
			if target < acc {
				return int32(i), float32(math.Log(x / sum))
			}
		}
		return int32(V - 1), float32(math.Log(p[V-1] / sum))
	}
	for _, i := range kept {
		acc += p[i]
		if target < acc {
			return i, float32(math.Log(p[i] / sum))
		}
	}
	last := kept[len(kept)-1]
	return last, float32(math.Log(p[last] / sum))
}

// KeptSet returns the tokens top-k then top-p keep, most likely first (ties
// by id), given unnormalised probabilities p, topK in [1, len(p)] and topP in
// (0, 1], in order's storage. It sorts only the tokens with
// p ≥ τ for a threshold τ lowered until that set provably holds the kept
// set: at least topK tokens, or (all tokens being candidates) at least
// topP of the mass, since every token below τ sorts after every token
// above it.
func KeptSet(p []float64, topK int, topP float64, order []int32) []int32 {
	V := len(p)
	var total, pmax float64
	for _, x := range p {
		total += x
		pmax = math.Max(pmax, x)
	}
	for tau := pmax * 1e-3; ; tau *= 1e-3 {
		order = order[:0]
		var mass float64
		for i, x := range p {
			if x >= tau {
				order = append(order, int32(i))
				mass += x
			}
		}
		if len(order) == V || (topK < V && len(order) >= topK) || (topK == V && topP < 1 && mass >= topP*total) || tau == 0 {
			break
		}
	}
	slices.SortFunc(order, func(a, b int32) int {
		if p[a] != p[b] {
			if p[a] > p[b] {
				return -1
			}
			return 1
		}
		return int(a - b)
	})
	if len(order) > topK {
		order = order[:topK]
	}
	if topP < 1 {
		sum := total // the mass top-p is a fraction of: all tokens, or the top k
		if topK < V {
			sum = 0
			for _, i := range order {
				sum += p[i]
			}
		}
		acc := 0.0
		for j, i := range order {
			acc += p[i]
			if acc >= topP*sum {
				order = order[:j+1]
				break
			}
		}
	}
	return order
}
