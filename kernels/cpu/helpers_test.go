package cpu

import (
	"fmt"
	"math"
	"math/rand/v2"
	"testing"

	"github.com/tracegrpo/tracegrpo/kernels"
)

// Tolerances, |got−want| ≤ atol + rtol·|want|.
const (
	// fdAtol/fdRtol: float64 analytic gradients against central differences
	// with step fdStep; truncation error is O(fdStep²)·f‴ ≈ 1e-10 and
	// rounding ≈ 1e-16/fdStep ≈ 1e-11 on these O(1) inputs.
	fdStep = 1e-5
	fdAtol = 1e-7
	fdRtol = 1e-6
	// refAtol/refRtol: two float64 computations of the same quantity in a
	// different order (e.g. fused chunked softmax against the naive one).
	refAtol = 1e-12
	refRtol = 1e-10
	// f32Atol/f32Rtol: the float32 Backend against the float64 reference on
	// O(1) inputs with reductions of up to a few hundred terms: float32
	// rounding (6e-8 per op) grows with the reduction length, and expf is
	// accurate to ~2 ulp.
	f32Atol = 3e-5
	f32Rtol = 3e-5
)

func randVec(r *rand.Rand, n int, scale float64) []float64 {
	x := make([]float64, n)
	for i := range x {
		x[i] = scale * (2*r.Float64() - 1)
	}
	return x
}

func to32(x []float64) []float32 {
	y := make([]float32, len(x))
	for i, v := range x {
		y[i] = float32(v)
	}
	return y
}

func to64(x []float32) []float64 {
	y := make([]float64, len(x))
	for i, v := range x {
		y[i] = float64(v)
	}
	return y
}

// round32 rounds float64 inputs to float32 values so that the float64
// reference and the float32 backend see exactly the same inputs.
func round32(x []float64) []float64 { return to64(to32(x)) }

// checkClose fails t if got and want differ beyond atol + rtol·|want|,
// printing the max abs and rel errors and the first mismatches.
func checkClose(t *testing.T, name string, got, want []float64, atol, rtol float64) {
	t.Helper()
	if len(got) != len(want) {
		t.Fatalf("%s: got %d values, want %d", name, len(got), len(want))
	}
	var maxAbs, maxRel float64
	var bad []string
	for i := range want {
		d := math.Abs(got[i] - want[i])
		if math.IsNaN(got[i]) != math.IsNaN(want[i]) {
			d = math.Inf(1)
		}
		maxAbs = max(maxAbs, d)
		if want[i] != 0 {
			maxRel = max(maxRel, d/math.Abs(want[i]))
		}
		if d > atol+rtol*math.Abs(want[i]) || math.IsNaN(d) {
			if len(bad) < 5 {
				bad = append(bad, fmt.Sprintf("[%d] got %.9g want %.9g", i, got[i], want[i]))
			}
		}
	}
	if len(bad) > 0 {
		t.Errorf("%s: max abs err %.3g, max rel err %.3g (atol %g, rtol %g); first mismatches: %v", name, maxAbs, maxRel, atol, rtol, bad)
	}
}

// fdGrad returns the central-difference gradient of loss with respect to x.
func fdGrad(x []float64, loss func() float64) []float64 {
	g := make([]float64, len(x))
	for i := range x {
		old := x[i]
		x[i] = old + fdStep
		lp := loss()
		x[i] = old - fdStep
		lm := loss()
		x[i] = old
		g[i] = (lp - lm) / (2 * fdStep)
	}
	return g
}

func dot64(a, b []float64) float64 {
	var s float64
	for i := range a {
		s += a[i] * b[i]
	}
	return s
}

// env is a Backend plus helpers to move float64 test data in and out.
type env struct {
	t *testing.T
	b *Backend
}

func newEnv(t *testing.T, threads int) *env {
	b := New(threads)
	t.Cleanup(b.Close)
	return &env{t: t, b: b}
}

func (e *env) f32(x []float64) kernels.Buf {
	e.t.Helper()
	buf, err := e.b.Alloc(kernels.F32, len(x))
	if err != nil {
		e.t.Fatal(err)
	}
	e.b.UploadF32(buf, to32(x))
	return buf
}

func (e *env) zeros(n int) kernels.Buf { return e.f32(make([]float64, n)) }

func (e *env) i32(x []int32) kernels.Buf {
	e.t.Helper()
	buf, err := e.b.Alloc(kernels.I32, len(x))
	if err != nil {
		e.t.Fatal(err)
	}
	e.b.UploadI32(buf, x)
	return buf
}

func (e *env) get(buf kernels.Buf) []float64 { return to64(e.b.F32(buf)) }

// ropeTables uploads Hugging Face float32 cos/sin tables (P, HD/2) for
// positions [0, P) and base theta.
func (e *env) ropeTables(P, HD int, theta float32) (cos, sin kernels.Buf) {
	e.t.Helper()
	c, s := make([]float32, P*HD/2), make([]float32, P*HD/2)
	ropeTableHF(c, s, P, HD, theta)
	return e.f32(to64(c)), e.f32(to64(s))
}

func (e *env) sync() {
	e.t.Helper()
	if err := e.b.Sync(); err != nil {
		e.t.Fatal(err)
	}
}

func (e *env) seqs(lens []int) kernels.Seqs {
	cu := []int32{0}
	ml := 0
	for _, l := range lens {
		cu = append(cu, cu[len(cu)-1]+int32(l))
		ml = max(ml, l)
	}
	return kernels.Seqs{CuSeqlens: e.i32(cu), S: len(lens), MaxLen: ml}
}

func cuOf(lens []int) []int32 {
	cu := []int32{0}
	for _, l := range lens {
		cu = append(cu, cu[len(cu)-1]+int32(l))
	}
	return cu
}

func sum(lens []int) int {
	s := 0
	for _, l := range lens {
		s += l
	}
	return s
}
