package optim

import (
	"encoding/json"
	"fmt"
	"math"
	"os"
	"testing"

	"github.com/tracegrpo/tracegrpo/kernels"
)

// rtolBF16Moment: a bf16 moment may land one bf16 ulp (2⁻⁸ relative) from
// the golden's where the clip factor (torch's float32 norm against our
// float64 one, rtolNorm) moves the float32 moment across a rounding
// boundary of bf16.
const rtolBF16Moment = 1.0 / 256

type fusedGolden struct {
	Meta  map[string]any `json:"meta"`
	Arena struct {
		N      int `json:"n"`
		Groups []struct {
			Off   int  `json:"off"`
			N     int  `json:"n"`
			Decay bool `json:"decay"`
		} `json:"groups"`
		InitParams string `json:"init_params"`
	} `json:"arena"`
	Cases []struct {
		Name    string `json:"name"`
		Moments string `json:"moments"`
		Adam    struct {
			Beta1       float64 `json:"beta1"`
			Beta2       float64 `json:"beta2"`
			Eps         float64 `json:"eps"`
			MaxGradNorm float64 `json:"max_grad_norm"`
		} `json:"adam"`
		WeightDecay float64 `json:"weight_decay"`
		Steps       []struct {
			Grad     string  `json:"grad"`
			LR       float64 `json:"lr"`
			GradNorm float64 `json:"grad_norm"`
			Params   string  `json:"params"`
			M        string  `json:"m"`
			V        string  `json:"v"`
		} `json:"steps"`
	} `json:"cases"`
}

// TestFusedAdamGolden runs three FusedAdam steps (kernels.FusedAdam, the
// optimizer of NeMo RL's exp_avg_dtype recipes) with float32 and bfloat16
// moments against scripts/golden_fused_adam.py, TransformerEngine's
// multi_tensor_adam written in float32 torch ops. Without clipping the
// gradient reaches both untouched and the CPU backend matches bit for bit,
// parameters and moments; with clipping, to the clip factor's rounding.
func TestFusedAdamGolden(t *testing.T) {
	const path = "testdata/golden_fused_adam.json"
	b, err := os.ReadFile(path)
	if err != nil {
		t.Fatalf("%s: %v (regenerate with /usr/bin/python3 scripts/golden_fused_adam.py)", path, err)
	}
	var g fusedGolden
	if err := json.Unmarshal(b, &g); err != nil {
		t.Fatalf("%s: %v", path, err)
	}
	if len(g.Cases) != 4 {
		t.Fatalf("%s holds %d cases, want 4 (clip and no clip, float32 and bfloat16 moments)", path, len(g.Cases))
	}
	var groups []Group
	for _, x := range g.Arena.Groups {
		groups = append(groups, Group{Off: x.Off, N: x.N, Decay: x.Decay})
	}
	init := f32s(t, g.Arena.InitParams)
	for bname, newBackend := range goldenBackends(t) {
		for _, c := range g.Cases {
			t.Run(c.Name+"/"+bname, func(t *testing.T) {
				be, done := newBackend()
				defer done()
				ops, ok := be.(kernels.Ops)
				if !ok {
					t.Fatalf("%s: not a kernels.Ops", bname)
				}
				exact := c.Adam.MaxGradNorm == 0 && bname != "cuda" // the CUDA kernel contracts FMAs
				mdt := kernels.F32
				if c.Moments == "bfloat16" {
					mdt = kernels.BF16
				}
				param, grad, tmp := allocF32(t, be, g.Arena.N), allocF32(t, be, g.Arena.N), allocF32(t, be, g.Arena.N)
				defer be.Free(param)
				defer be.Free(grad)
				defer be.Free(tmp)
				be.UploadF32(param, init)
				o, err := New(be, param, grad, groups, Config{Rule: kernels.FusedAdam, Moments: mdt,
					Beta1: c.Adam.Beta1, Beta2: c.Adam.Beta2, Eps: c.Adam.Eps, MaxGradNorm: c.Adam.MaxGradNorm})
				if err != nil {
					t.Fatal(err)
				}
				defer o.Close()
				if m, _ := o.Moments(); m.DType != mdt {
					t.Fatalf("moments are %v, want %v", m.DType, mdt)
				}
				host := make([]float32, g.Arena.N)
				read := func(x kernels.Buf) []float32 {
					ops.Convert(tmp, x)
					be.DownloadF32(host, tmp)
					if err := be.Sync(); err != nil {
						t.Fatal(err)
					}
					return host
				}
				check := func(what string, got, want []float32, rtol float64) {
					t.Helper()
					if exact {
						for i := range want {
							if math.Float32bits(got[i]) != math.Float32bits(want[i]) {
								t.Fatalf("%s[%d] = %v, want %v bit for bit (no clipping: the same float32 operations)", what, i, got[i], want[i])
							}
						}
						return
					}
					compareF32(t, what, got, want, 1, rtol)
					var maxRel float64
					differ := 0
					for i := range want {
						if got[i] != want[i] {
							differ++
						}
						if want[i] != 0 {
							maxRel = math.Max(maxRel, math.Abs(float64(got[i])-float64(want[i]))/math.Abs(float64(want[i])))
						}
					}
					t.Logf("%s: %d of %d elements differ, max rel err %.3g", what, differ, len(want), maxRel)
				}
				for k, st := range c.Steps {
					be.UploadF32(grad, f32s(t, st.Grad))
					res, err := o.Step(st.LR, c.WeightDecay)
					if err != nil {
						t.Fatalf("step %d: %v", k+1, err)
					}
					if !relClose(res.GradNorm, st.GradNorm, 0, rtolNorm) {
						t.Errorf("step %d: grad norm %.9g, want %.9g", k+1, res.GradNorm, st.GradNorm)
					}
					m, v := o.Moments()
					check(fmt.Sprintf("step %d params", k+1), read(param), f32s(t, st.Params), rtolParam)
					mt := rtolParam
					if mdt == kernels.BF16 {
						mt = rtolBF16Moment
					}
					check(fmt.Sprintf("step %d m", k+1), read(m), f32s(t, st.M), mt)
					check(fmt.Sprintf("step %d v", k+1), read(v), f32s(t, st.V), mt)
					if t.Failed() {
						t.FailNow()
					}
				}
			})
		}
	}
}

// TestBF16MomentsNeedFusedAdam: torch.optim.AdamW has no exp_avg_dtype.
func TestBF16MomentsNeedFusedAdam(t *testing.T) {
	for name, newBackend := range goldenBackends(t) {
		be, done := newBackend()
		p, g := allocF32(t, be, 4), allocF32(t, be, 4)
		if o, err := New(be, p, g, []Group{{Off: 0, N: 4}}, Config{Rule: kernels.TorchAdamW, Moments: kernels.BF16, Beta1: 0.9, Beta2: 0.999}); err == nil {
			o.Close()
			t.Errorf("%s: bf16 moments under torch.optim.AdamW: no error", name)
		}
		be.Free(p)
		be.Free(g)
		done()
	}
}
