package cpu

import (
	"fmt"
	"math"
	"math/rand/v2"
	"testing"
)

// expRtol: expf and the AVX2 vector exp are accurate to a few ulp (2⁻²³ ≈
// 1.2e-7 each) on normal results.
const expRtol = 4e-7

func TestExpf(t *testing.T) {
	r := rand.New(rand.NewPCG(30, 30))
	var got, want []float64
	for i := 0; i < 100000; i++ {
		x := float32(-87 + 175*r.Float64())
		got = append(got, float64(expf(x)))
		want = append(want, math.Exp(float64(x)))
	}
	checkClose(t, "expf", got, want, 0, expRtol)
	// Subnormal results, overflow and NaN.
	for _, x := range []float32{-95, -103, -104, -200, 88.8, 100} {
		w := float64(float32(math.Exp(float64(x))))
		if g := float64(expf(x)); math.Abs(g-w) > 1e-44+expRtol*w {
			t.Errorf("expf(%v) = %g, want %g", x, g, w)
		}
	}
	if g := expf(float32(math.NaN())); g == g {
		t.Errorf("expf(NaN) = %v, want NaN", g)
	}
}

func TestExpScaleShift(t *testing.T) {
	saved := useVecExp
	defer func() { useVecExp = saved }()
	for _, vec := range []bool{false, saved} {
		useVecExp = vec
		for _, n := range []int{1, 7, 8, 9, 33, 1000} {
			t.Run(fmt.Sprintf("vec%v_n%d", vec, n), func(t *testing.T) {
				r := rand.New(rand.NewPCG(31, uint64(n)))
				x := make([]float32, n)
				want := make([]float64, n)
				var wsum float64
				const scale, shift = 0.7, 1.3
				for i := range x {
					x[i] = float32(-40 + 45*r.Float64())
					arg := float64(float32(x[i]*scale) - shift)
					want[i] = math.Exp(arg)
					wsum += want[i]
				}
				s := expScaleShift(x, scale, shift)
				// The argument x·scale−shift is rounded differently (FMA or
				// not), so allow one float32 ulp of the argument (|arg| ≤ 30).
				checkClose(t, "exp", to64(x), want, 0, expRtol+30*6e-8)
				checkClose(t, "sum", []float64{float64(s)}, []float64{wsum}, 0, 1e-5)
			})
		}
	}
}
