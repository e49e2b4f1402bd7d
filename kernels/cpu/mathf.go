package cpu

import "math"

// expf is a float32 exp accurate to about 2 ulp (Cephes expf: round to the
// nearest power of two, a two-constant ln 2 reduction, a degree-6 polynomial,
// then scale by 2ⁿ through the exponent bits). It is ~5× faster than
// float32(math.Exp(x)) and is what every float32 kernel uses.
func expf(x float32) float32 {
	switch {
	case x != x:
		return x
	case x > 88.72283:
		return float32(math.Inf(1))
	case x < -103.97208:
		return 0
	}
	fn := x*1.44269504088896341 + 0.5
	n := int32(fn)
	if fn < 0 && float32(n) != fn {
		n-- // floor
	}
	nf := float32(n)
	r := float32(x - nf*0.693359375)
	r = float32(r + nf*2.12194440e-4)
	p := float32(1.9875691500e-4)
	p = float32(p*r + 1.3981999507e-3)
	p = float32(p*r + 8.3334519073e-3)
	p = float32(p*r + 4.1665795894e-2)
	p = float32(p*r + 1.6666665459e-1)
	p = float32(p*r + 5.0000001201e-1)
	p = float32(float32(p*float32(r*r)) + r)
	p = float32(p + 1)
	if n < -126 {
		// 2ⁿ is subnormal: scale in two steps.
		return p * math.Float32frombits(uint32(n+126+127)<<23) * math.Float32frombits(uint32(1)<<23)
	}
	if n > 127 {
		return p * 2 * math.Float32frombits(uint32(n-1+127)<<23)
	}
	return p * math.Float32frombits(uint32(n+127)<<23)
}

// expF is exp in the kernels' element type: expf for float32, math.Exp for
// float64.
func expF[F Float](x F) F {
	if isF32[F]() {
		return F(expf(float32(x)))
	}
	return F(math.Exp(float64(x)))
}

// logF is log in F, computed in float64 and rounded once.
func logF[F Float](x F) F { return F(math.Log(float64(x))) }

// sqrtF is sqrt in F, computed in float64 and rounded once (correctly rounded
// for float32).
func sqrtF[F Float](x F) F { return F(math.Sqrt(float64(x))) }
