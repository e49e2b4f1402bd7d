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

// expScaleShiftSplit sets x[i] = exp(x[i]·scale − shift) like
// expScaleShift, but chooses per element: x[:nvec] through the vector exp
// (when expScaleShift uses it) and the rest through expf, so that each
// element gets the bits expScaleShift gives it in a row where it falls in
// the vector part or in the tail. Lanes of the vector exp are independent:
// a partial group of 8 runs through tmp (at least 8 floats).
func expScaleShiftSplit(x []float32, nvec int, scale, shift float32, tmp []float32) {
	if !useVecExp {
		nvec = 0
	}
	nvec = min(max(nvec, 0), len(x))
	n8 := nvec &^ 7
	if n8 > 0 {
		expScaleShiftAVX2(&x[0], n8, scale, shift)
	}
	if rem := nvec - n8; rem > 0 {
		tmp = tmp[:8]
		clear(tmp)
		copy(tmp, x[n8:nvec])
		expScaleShiftAVX2(&tmp[0], 8, scale, shift)
		copy(x[n8:nvec], tmp[:rem])
	}
	for i := nvec; i < len(x); i++ {
		x[i] = expf(x[i]*scale - shift)
	}
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
