package cpu

// SampleTokens: the next token of each row drawn from its logits
// (kernels.TokenSampler), the reference of the device samplers:
//
//	p_i = exp((z_i − max z)/T) in float64                     (T = Temperature)
//	K   = top-k by (p desc, id asc), then the shortest top-p prefix
//	tok = first i ∈ K in id order with Σ_{j∈K, j≤i} p_j > u·Σ_K p   =
//	logprob = log(p_tok / Σ_K p)                               =
//
// logits (B,V) F32; u (2B) I32, row b's uniform as float64 bits (low word
// first); tokens (B) I32; logprobs (B) F32. Temperature 0 is the argmax
// (lowest id among equal maxima) with logprob 0. Rows are independent;
// the kept set is found by sorting only the tokens above a threshold low
// enough to hold it (model's sampler does the same on the host).

import (
	"fmt"
	"math"
	"slices"

	"github.com/tracegrpo/tracegrpo/kernels"
)

// SampleTokens implements kernels.TokenSampler.
func (b *Backend) SampleTokens(tokens, logprobs, logits, u kernels.Buf, B, V int, sp kernels.SampleParams) {
	if B < 0 || V <= 0 {
		panic(fmt.Sprintf("cpu: SampleTokens: B %d V %d", B, V))
	}
	z := b.f32n(logits, B*V, "SampleTokens logits")
	uu := b.i32n(u, 2*B, "SampleTokens u")
	tok := b.i32n(tokens, B, "SampleTokens tokens")
	lp := b.f32n(logprobs, B, "SampleTokens logprobs")
	if cap(b.sampleP) < V {
		b.sampleP, b.sampleOrder = make([]float64, V), make([]int32, 0, V)
	}
	p, order := b.sampleP[:V], b.sampleOrder[:0]
	for r := 0; r < B; r++ {
		bits := uint64(uint32(uu[2*r])) | uint64(uint32(uu[2*r+1]))<<32
		tok[r], lp[r] = sampleRow(z[r*V:(r+1)*V], math.Float64frombits(bits), sp, p, order)
	}
}

// sampleRow draws one row's token; p (V) and order are scratch.
func sampleRow(z []float32, u float64, sp kernels.SampleParams, p []float64, order []int32) (int32, float32) {
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
		kept = keptSet(p, topK, topP, order)
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

// keptSet returns the tokens top-k then top-p keep, most likely first (ties
// by id), given unnormalised probabilities p. It sorts only the tokens with
// p ≥ τ for a threshold τ lowered until that set provably holds the kept
// set: at least topK tokens, or (all tokens being candidates) at least
// topP of the mass, since every token below τ sorts after every token
// above it.
func keptSet(p []float64, topK int, topP float64, order []int32) []int32 {
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

var _ kernels.TokenSampler = (*Backend)(nil)
