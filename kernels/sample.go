package kernels

import (
	"math"
)

// SampleRow draws one row's token from its logits z with the uniform u, as
// TokenSampler.SampleTokens defines the draw, and returns it with its
// logprob. zs (len(z)) is scratch. It is the CPU backend's sampler and the
// host draw of callers whose backend has no TokenSampler.
func SampleRow(z []float32, u float64, sp SampleParams, zs []float32, sc *FilterScratch) (int32, float32) {
	if sp.Temperature == 0 {
		best := 0
		for i, x := range z {
			if x > z[best] {
				best = i
			}
		}
		return int32(best), 0
	}
	inv := 1 / sp.Temperature
	zs = zs[:len(z)]
	maxKey := uint32(0)
	for i, x := range z {
		zs[i] = x * inv
		maxKey = max(maxKey, Key(zs[i]))
	}
	cut := FilterCut(zs, sp.Filter(), sc)
	zmax := KeyValue(maxKey)
	var S uint64
	var sum float64
	for i, x := range zs {
		if cut.Keeps(i, x) {
			S += FixedWeight(x, zmax)
			sum += math.Exp(float64(x) - float64(zmax))
		}
	}
	target := uint64(u * float64(S)) // an integer sum exceeds u·S exactly when it exceeds this
	var acc uint64
	last := -1
	for i, x := range zs {
		if !cut.Keeps(i, x) {
			continue
		}
		acc += FixedWeight(x, zmax)
		last = i
		if acc > target {
			break
		}
	}
	return int32(last), float32(float64(zs[last]) - float64(zmax) - math.Log(sum))
}
