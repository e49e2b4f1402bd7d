package model

import (
	"encoding/json"
	"fmt"
	"math"
	"os"
	"slices"
	"testing"

	"github.com/google/go-cmp/cmp"
)

// ropeTableAtol: the tables hold float32 cos/sin of the same float32 angle
// as PyTorch's; float64 cos rounded once and torch's float32 cos differ by
// at most an ulp (6e-8 at magnitude 1).
const ropeTableAtol = 1.2e-7

// invFreqMaxUlps: transformers' theta**x runs torch's vectorized float32
// pow, which is not always correctly rounded; Go's is (a float64 pow
// rounded once). They differ by one ulp in rare cases (theta 1e6, HD 128,
// i = 37: 2942.7271 vs 2942.7273 for 2942.72718), an angle error below
// 4e-6 rad at position 131071. Every other step is bit-exact.
const invFreqMaxUlps = 1

type ropeGolden struct {
	Metadata map[string]any `json:"metadata"`
	Cases    []struct {
		Theta       float64         `json:"theta"`
		HeadDim     int             `json:"head_dim"`
		RopeScaling json.RawMessage `json:"rope_scaling"`
		Positions   []int           `json:"positions"`
		InvFreq     []float64       `json:"inv_freq"`
		InvDefault  []float64       `json:"inv_freq_default"`
		Cos, Sin    []float64
	} `json:"cases"`
}

// TestRopeTablesMatchPyTorch: RopeInvFreq equals transformers' float32
// inverse frequencies bit for bit (plain RoPE and Llama 3.1/3.2 scaling at
// their published head sizes, and an odd scaling), and the tables hold
// their cosines and sines at positions up to 131071.
func TestRopeTablesMatchPyTorch(t *testing.T) {
	const path = "testdata/golden_rope.json"
	data, err := os.ReadFile(path)
	if err != nil {
		t.Fatalf("%v (regenerate with /usr/bin/python3 scripts/golden_model.py)", err)
	}
	var g ropeGolden
	if err := json.Unmarshal(data, &g); err != nil {
		t.Fatalf("%s: %v", path, err)
	}
	if g.Metadata["script"] != "scripts/golden_model.py" || len(g.Cases) < 5 {
		t.Fatalf("%s: script %v, %d cases: want scripts/golden_model.py and at least 5", path, g.Metadata["script"], len(g.Cases))
	}
	scaled := 0
	for i, c := range g.Cases {
		t.Run(fmt.Sprintf("%d_theta%g_HD%d", i, c.Theta, c.HeadDim), func(t *testing.T) {
			cfgJSON := fmt.Sprintf(`{"model_type":"llama","hidden_size":%d,"intermediate_size":8,"num_hidden_layers":1,
				"num_attention_heads":1,"vocab_size":8,"rope_theta":%g,"rope_scaling":%s}`, c.HeadDim, c.Theta, c.RopeScaling)
			cfg, err := ParseConfig([]byte(cfgJSON), "case")
			if err != nil {
				t.Fatal(err)
			}
			if cfg.RopeScaling.Type != "" {
				scaled++
			}
			want := make([]float32, len(c.InvFreq))
			for j, x := range c.InvFreq {
				want[j] = float32(x)
			}
			inv := RopeInvFreq(cfg)
			if len(inv) != len(want) {
				t.Fatalf("%d inverse frequencies, want %d", len(inv), len(want))
			}
			off := 0
			for j := range want {
				if u := ulps(inv[j], want[j]); u > invFreqMaxUlps {
					t.Errorf("inv_freq[%d] = %g, PyTorch %g: %d ulps apart", j, inv[j], want[j], u)
				} else if u > 0 {
					off++
				}
			}
			if off > 0 {
				t.Logf("%d of %d inverse frequencies one ulp from PyTorch's", off, len(want))
			}
			// From PyTorch's own default frequencies, the llama3 rescaling
			// is exact: every float32 step in torch's order.
			if cfg.RopeScaling.Type == RopeLlama3 {
				got := to32(c.InvDefault)
				llama3Scale(got, cfg.RopeScaling)
				if d := cmp.Diff(want, got); d != "" {
					t.Errorf("llama3 rescaling of PyTorch's default frequencies (-pytorch +go):\n%s", d)
				}
			}
			// The angles and their cos/sin, from PyTorch's frequencies.
			half := c.HeadDim / 2
			cos, sin := make([]float32, half), make([]float32, half)
			for k, p := range c.Positions {
				ropeRow(cos, sin, want, p)
				compareClose(t, fmt.Sprintf("cos at position %d", p), cos, to32(c.Cos[k*half:(k+1)*half]), ropeTableAtol, 0)
				compareClose(t, fmt.Sprintf("sin at position %d", p), sin, to32(c.Sin[k*half:(k+1)*half]), ropeTableAtol, 0)
			}
			// The tables the model uploads, from its own frequencies, hold
			// PyTorch's cos/sin at every golden position, within the same
			// atol plus what a frequency off by Δ (one ulp at most, checked
			// above) moves an angle at position p: p·Δ.
			var dInv float64
			for j := range want {
				dInv = max(dInv, math.Abs(float64(inv[j])-float64(want[j])))
			}
			tc, ts := RopeTables(cfg, slices.Max(c.Positions)+1)
			for k, p := range c.Positions {
				tol := ropeTableAtol + float64(p)*dInv
				compareClose(t, fmt.Sprintf("RopeTables cos at position %d", p), tc[p*half:(p+1)*half], to32(c.Cos[k*half:(k+1)*half]), tol, 0)
				compareClose(t, fmt.Sprintf("RopeTables sin at position %d", p), ts[p*half:(p+1)*half], to32(c.Sin[k*half:(k+1)*half]), tol, 0)
			}
		})
	}
	if scaled < 4 {
		t.Errorf("%d llama3-scaled cases, want at least 4", scaled)
	}
}

func to32(x []float64) []float32 {
	y := make([]float32, len(x))
	for i, v := range x {
		y[i] = float32(v)
	}
	return y
}

// ulps is the distance between two finite float32s of the same sign in
// units in the last place.
func ulps(a, b float32) int64 {
	d := int64(math.Float32bits(a)) - int64(math.Float32bits(b))
	if d < 0 {
		d = -d
	}
	return d
}
