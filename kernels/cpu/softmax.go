package cpu

// Row helpers shared by the float32 attention and token-logprob fast paths.

// expScaleShift sets x[i] = exp(x[i]·scale − shift) and returns Σ x[i].
// With AVX2 the first len(x)/8·8 elements go through the vector exp and sum
// (8 lane sums combined in a fixed order), the tail through expf; otherwise
// all through expf, summed left to right. Either way the order depends only
// on len(x).
func expScaleShift(x []float32, scale, shift float32) float32 {
	var s float32
	if useVecExp && len(x) >= 8 {
		n8 := len(x) &^ 7
		s = expScaleShiftAVX2(&x[0], n8, scale, shift)
		x = x[n8:]
	}
	for i, v := range x {
		e := expf(v*scale - shift)
		x[i] = e
		s += e
	}
	return s
}

// maxF32 returns the largest element of a non-empty x.
func maxF32(x []float32) float32 {
	m := x[0]
	for _, v := range x[1:] {
		if v > m {
			m = v
		}
	}
	return m
}
