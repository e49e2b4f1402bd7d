package cpu

// The float32 Backend against op-level PyTorch goldens
// (testdata/golden_ops.json, written by scripts/golden_cpu_ops.py from
// Hugging Face transformers' eager code in float32).

import (
	"encoding/json"
	"fmt"
	"os"
	"testing"
)

// Golden tolerances: both sides are float32 with different summation orders
// (and expf vs libm exp), on O(1) inputs with reductions of at most a few
// hundred terms.
const (
	goldAtol = 5e-6
	goldRtol = 1e-5
	// goldRopeAtol: RoPE has no reduction; the only difference is libm cosf/sinf
	// against float64 cos/sin of the same float32 angle, each within an ulp.
	goldRopeAtol = 5e-7
)

type goldenOps struct {
	Metadata map[string]any `json:"metadata"`
	Rope     []struct {
		T, H, HD int
		Theta    float64 `json:"theta"`
		Pos      []int32 `json:"pos"`
		X, Out   []float64
	} `json:"rope"`
	RMSNorm []struct {
		N, C                                 int
		Eps                                  float64 `json:"eps"`
		X, W, Dout, Out, Rstd, Dinp, Dweight []float64
	} `json:"rmsnorm"`
	Attention []struct {
		Lens                                []int `json:"lens"`
		NH, NKV, HD                         int
		Q, K, V, Dout, Out, Lse, Dq, Dk, Dv []float64
	} `json:"attention"`
	SwiGLU []struct {
		N                               int
		Gate, Up, Dout, Out, Dgate, Dup []float64
	} `json:"swiglu"`
	TokenLogprob []struct {
		T, C, V                                                           int
		Temperature                                                       float64 `json:"temperature"`
		Targets                                                           []int32 `json:"targets"`
		Hidden, Weight, Dlogprob, Logprob, Entropy, Lse, Dhidden, Dweight []float64
	} `json:"token_logprob"`
	Bias []struct {
		T, OC                     int
		X, Bias, Dout, Out, Dbias []float64
	} `json:"bias"`
}

func loadGoldenOps(t *testing.T) *goldenOps {
	t.Helper()
	const path = "testdata/golden_ops.json"
	data, err := os.ReadFile(path)
	if err != nil {
		t.Fatalf("%v (regenerate with /usr/bin/python3 scripts/golden_cpu_ops.py)", err)
	}
	var g goldenOps
	if err := json.Unmarshal(data, &g); err != nil {
		t.Fatalf("%s: %v", path, err)
	}
	if g.Metadata["script"] != "scripts/golden_cpu_ops.py" {
		t.Fatalf("%s: metadata.script = %v, want scripts/golden_cpu_ops.py", path, g.Metadata["script"])
	}
	// Which BLAS computed the goldens: regenerating them with another one
	// moves matmul-based values in their last bits (up to ~1e-6), which is
	// not a regression of the Go code.
	if b, _ := g.Metadata["blas"].(string); b == "" {
		t.Fatalf("%s: metadata.blas is missing: regenerate with /usr/bin/python3 scripts/golden_cpu_ops.py, which records the BLAS torch used", path)
	} else {
		t.Logf("goldens computed by torch %v with BLAS %s", g.Metadata["torch"], b)
	}
	return &g
}

// minGoldenOps is the least number of cases per op the golden must hold, so
// that an empty or truncated golden file fails instead of passing vacuously
// (scripts/golden_cpu_ops.py writes 3 rope, 2 rmsnorm, 3 attention,
// 1 swiglu, 2 token_logprob and 2 bias cases).
var minGoldenOps = map[string]int{"rope": 3, "rmsnorm": 2, "attention": 3, "swiglu": 1, "token_logprob": 2, "bias": 2}

func TestGoldenOps(t *testing.T) {
	g := loadGoldenOps(t)
	for op, n := range map[string]int{"rope": len(g.Rope), "rmsnorm": len(g.RMSNorm), "attention": len(g.Attention),
		"swiglu": len(g.SwiGLU), "token_logprob": len(g.TokenLogprob), "bias": len(g.Bias)} {
		if n < minGoldenOps[op] {
			t.Fatalf("golden_ops.json holds %d %s cases, want >= %d (regenerate with /usr/bin/python3 scripts/golden_cpu_ops.py)", n, op, minGoldenOps[op])
		}
	}
	e := newEnv(t, 2)
	for i, c := range g.Bias {
		t.Run(fmt.Sprintf("bias%d_T%d_OC%d", i, c.T, c.OC), func(t *testing.T) {
			out, db := e.f32(c.X), e.zeros(c.OC)
			e.b.AddBias(out, e.f32(c.Bias), c.T, c.OC)
			e.b.BiasBackward(db, e.f32(c.Dout), c.T, c.OC)
			e.sync()
			checkClose(t, "out", e.get(out), c.Out, goldAtol, goldRtol)
			checkClose(t, "dbias", e.get(db), c.Dbias, goldAtol, goldRtol)
		})
	}
	for i, c := range g.Rope {
		t.Run(fmt.Sprintf("rope%d_HD%d_theta%g", i, c.HD, c.Theta), func(t *testing.T) {
			x := e.f32(c.X)
			P := 0
			for _, p := range c.Pos {
				P = max(P, int(p)+1)
			}
			cos, sin := e.ropeTables(P, c.HD, float32(c.Theta))
			e.b.Rope(x, e.i32(c.Pos), cos, sin, c.T, c.H, c.HD)
			e.sync()
			checkClose(t, "out", e.get(x), c.Out, goldRopeAtol, 0)
			// And back: the inverse rotation restores x.
			e.b.RopeBackward(x, e.i32(c.Pos), cos, sin, c.T, c.H, c.HD)
			e.sync()
			checkClose(t, "inverse", e.get(x), c.X, goldRopeAtol, 0)
		})
	}
	for i, c := range g.RMSNorm {
		t.Run(fmt.Sprintf("rmsnorm%d", i), func(t *testing.T) {
			x, w := e.f32(c.X), e.f32(c.W)
			out, rstd, dinp, dw := e.zeros(c.N*c.C), e.zeros(c.N), e.zeros(c.N*c.C), e.zeros(c.C)
			e.b.RMSNorm(out, rstd, x, w, c.N, c.C, float32(c.Eps))
			e.b.RMSNormBackward(dinp, dw, e.f32(c.Dout), x, w, rstd, c.N, c.C)
			e.sync()
			checkClose(t, "out", e.get(out), c.Out, goldAtol, goldRtol)
			checkClose(t, "rstd", e.get(rstd), c.Rstd, goldAtol, goldRtol)
			checkClose(t, "dinp", e.get(dinp), c.Dinp, goldAtol, goldRtol)
			checkClose(t, "dweight", e.get(dw), c.Dweight, goldAtol, goldRtol)
		})
	}
	for i, c := range g.Attention {
		t.Run(fmt.Sprintf("attention%d_%v_NH%d_NKV%d", i, c.Lens, c.NH, c.NKV), func(t *testing.T) {
			T := sum(c.Lens)
			q, k, v := e.f32(c.Q), e.f32(c.K), e.f32(c.V)
			out, lse := e.zeros(T*c.NH*c.HD), e.zeros(T*c.NH)
			dq, dk, dv := e.zeros(T*c.NH*c.HD), e.zeros(T*c.NKV*c.HD), e.zeros(T*c.NKV*c.HD)
			seqs := e.seqs(c.Lens)
			e.b.Attention(out, lse, q, k, v, seqs, c.NH, c.NKV, c.HD)
			e.b.AttentionBackward(dq, dk, dv, e.f32(c.Dout), out, lse, q, k, v, seqs, c.NH, c.NKV, c.HD)
			e.sync()
			checkClose(t, "out", e.get(out), c.Out, goldAtol, goldRtol)
			checkClose(t, "lse", e.get(lse), c.Lse, goldAtol, goldRtol)
			checkClose(t, "dq", e.get(dq), c.Dq, goldAtol, goldRtol)
			checkClose(t, "dk", e.get(dk), c.Dk, goldAtol, goldRtol)
			checkClose(t, "dv", e.get(dv), c.Dv, goldAtol, goldRtol)
		})
	}
	for i, c := range g.SwiGLU {
		t.Run(fmt.Sprintf("swiglu%d", i), func(t *testing.T) {
			gate, up := e.f32(c.Gate), e.f32(c.Up)
			out, dg, du := e.zeros(c.N), e.zeros(c.N), e.zeros(c.N)
			e.b.SwiGLU(out, gate, up, c.N)
			e.b.SwiGLUBackward(dg, du, e.f32(c.Dout), gate, up, c.N)
			e.sync()
			checkClose(t, "out", e.get(out), c.Out, goldAtol, goldRtol)
			checkClose(t, "dgate", e.get(dg), c.Dgate, goldAtol, goldRtol)
			checkClose(t, "dup", e.get(du), c.Dup, goldAtol, goldRtol)
		})
	}
	for i, c := range g.TokenLogprob {
		t.Run(fmt.Sprintf("token_logprob%d_V%d", i, c.V), func(t *testing.T) {
			h, w, tg := e.f32(c.Hidden), e.f32(c.Weight), e.i32(c.Targets)
			lp, ent, lse := e.zeros(c.T), e.zeros(c.T), e.zeros(c.T)
			dh, dw := e.zeros(c.T*c.C), e.zeros(c.V*c.C)
			invTemp := float32(1 / c.Temperature)
			e.b.TokenLogprob(lp, ent, lse, h, w, tg, c.T, c.C, c.V, invTemp)
			e.b.TokenLogprobBackward(dh, dw, e.f32(c.Dlogprob), h, w, tg, lse, c.T, c.C, c.V, invTemp)
			e.sync()
			checkClose(t, "logprob", e.get(lp), c.Logprob, goldAtol, goldRtol)
			checkClose(t, "entropy", e.get(ent), c.Entropy, goldAtol, goldRtol)
			checkClose(t, "lse", e.get(lse), c.Lse, goldAtol, goldRtol)
			checkClose(t, "dhidden", e.get(dh), c.Dhidden, goldAtol, goldRtol)
			checkClose(t, "dweight", e.get(dw), c.Dweight, goldAtol, goldRtol)
		})
	}
}
