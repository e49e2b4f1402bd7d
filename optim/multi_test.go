package optim

import (
	"errors"
	"fmt"
	"math"
	"math/rand/v2"
	"testing"

	"github.com/tracegrpo/tracegrpo/kernels"
	"github.com/tracegrpo/tracegrpo/kernels/cpu"
)

// perRun hides a backend's kernels.MultiAdamW: the optimizer then runs
// one AdamW op per run of groups and checks the new weights by their sums
// of squares.
type perRun struct{ Backend }

// TestMultiAdamWIsPerRunAdamW: the multi-tensor step (the clip factor and
// the skip on the backend, the weights checked in the same pass) gives
// the per-run step's parameters, moments and results bit for bit, under
// both rules and both moment dtypes, with and without clipping, through a
// skipped non-finite step, on groups larger than a chunk; and a weight
// the update overflows is reported as the same group's WeightsError.
func TestMultiAdamWIsPerRunAdamW(t *testing.T) {
	r := rand.New(rand.NewPCG(36, 6))
	var groups []Group
	n := 0
	for i, sz := range []int{5, multiChunk + 17, 300, 2*multiChunk + 1, 9} {
		groups = append(groups, Group{Off: n, N: sz, Decay: i%2 == 0})
		n += sz + 3 // elements between groups are never touched
	}
	p0 := make([]float32, n)
	for i := range p0 {
		p0[i] = float32(r.NormFloat64())
	}
	grads := make([][]float32, 4)
	for s := range grads {
		grads[s] = make([]float32, n)
		for i := range grads[s] {
			grads[s][i] = float32(r.NormFloat64() * 0.3)
		}
	}
	grads[2][groups[3].Off+7] = float32(math.NaN())
	for _, c := range []struct {
		rule kernels.AdamRule
		mdt  kernels.DType
		clip float64
	}{{kernels.TorchAdamW, kernels.F32, 1}, {kernels.FusedAdam, kernels.F32, 0}, {kernels.FusedAdam, kernels.BF16, 1}, {kernels.FusedAdam, kernels.BF16, 1e9}} {
		t.Run(fmt.Sprintf("%v/%v/clip=%g", c.rule, c.mdt, c.clip), func(t *testing.T) {
			be := cpu.New(3)
			defer be.Close()
			type run struct {
				o            *AdamW
				param, grad  kernels.Buf
				results      []Result
				final, m, vv []float32
			}
			var runs [2]run
			for k, wrap := range []func(Backend) Backend{func(b Backend) Backend { return b }, func(b Backend) Backend { return perRun{b} }} {
				x := &runs[k]
				x.param, x.grad = allocF32(t, be, n), allocF32(t, be, n)
				be.UploadF32(x.param, p0)
				o, err := New(wrap(be), x.param, x.grad, groups, Config{Rule: c.rule, Moments: c.mdt, Beta1: 0.9, Beta2: 0.95, Eps: 1e-8, MaxGradNorm: c.clip})
				if err != nil {
					t.Fatal(err)
				}
				if (o.multi != nil) != (k == 0) {
					t.Fatalf("run %d: multi-tensor step %v", k, o.multi != nil)
				}
				for s, g := range grads {
					be.UploadF32(x.grad, g)
					res, err := o.Step(1e-2*float64(s+1), 0.1)
					if err != nil {
						t.Fatalf("run %d step %d: %v", k, s, err)
					}
					x.results = append(x.results, res)
				}
				x.final = append([]float32(nil), be.F32(x.param)...)
				m, v := o.Moments()
				tmp := allocF32(t, be, n)
				be.Convert(tmp, m)
				x.m = append([]float32(nil), be.F32(tmp)...)
				be.Convert(tmp, v)
				x.vv = append([]float32(nil), be.F32(tmp)...)
				x.o = o
			}
			for s := range grads {
				a, b := runs[0].results[s], runs[1].results[s]
				if a.GradNorm != b.GradNorm && !(math.IsNaN(a.GradNorm) && math.IsNaN(b.GradNorm)) || a.ClipScale != b.ClipScale || a.Skipped != b.Skipped || a.Step != b.Step {
					t.Errorf("step %d: multi %+v, per run %+v", s, a, b)
				}
			}
			if !runs[0].results[2].Skipped {
				t.Error("the NaN step was not skipped")
			}
			for _, x := range []struct {
				name string
				a, b []float32
			}{{"params", runs[0].final, runs[1].final}, {"m", runs[0].m, runs[1].m}, {"v", runs[0].vv, runs[1].vv}} {
				for i := range x.a {
					if math.Float32bits(x.a[i]) != math.Float32bits(x.b[i]) {
						t.Fatalf("%s[%d]: multi %v, per run %v", x.name, i, x.a[i], x.b[i])
					}
				}
			}
			if runs[0].o.State() != runs[1].o.State() {
				t.Errorf("state: multi %+v, per run %+v", runs[0].o.State(), runs[1].o.State())
			}
			// A learning rate that overflows group 3's weights.
			for k := range runs {
				x := &runs[k]
				be.UploadF32(x.grad, grads[0])
				_, err := x.o.Step(3e38, 0)
				var we *WeightsError
				if !errors.As(err, &we) || we.Group != 0 {
					t.Errorf("run %d: %v, want a WeightsError for group 0", k, err)
				}
				x.o.Close()
			}
		})
	}
}
