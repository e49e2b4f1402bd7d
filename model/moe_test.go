package model

import (
	"encoding/json"
	"fmt"
	"math/rand/v2"
	"os"
	"path/filepath"
	"slices"
	"strings"
	"testing"

	"github.com/google/go-cmp/cmp"
	"github.com/tracegrpo/tracegrpo/internal/safetensors"
	"github.com/tracegrpo/tracegrpo/kernels/cpu"
)

// TestMoEParamTable: a sparse layer's parameters are the Hub's tensors
// (router, then per expert gate, up, down) with their shapes, laid out so
// that every expert's gate|up and every expert's down are one run each,
// the router a Router parameter with weight decay; dense layers of a sparse
// model keep the dense MLP.
func TestMoEParamTable(t *testing.T) {
	for _, v := range []string{"moe_k2_norm", "moe_k8_interleaved", "moe_k8_step2"} {
		t.Run(v, func(t *testing.T) {
			cfg := testConfig(t, v)
			f, err := safetensors.Open(filepath.Join("testdata", v, "model.safetensors"))
			if err != nil {
				t.Fatal(err)
			}
			defer f.Close()
			want := map[string][]int{}
			for _, ti := range f.Tensors() {
				want[ti.Name] = ti.Shape
			}
			tab, _, lidx := newTable(cfg)
			got := map[string][]int{}
			for _, p := range tab.Params {
				got[p.Name] = p.Shape
				if p.Router != strings.HasSuffix(p.Name, "mlp.gate.weight") {
					t.Errorf("%s: Router %v", p.Name, p.Router)
				}
			}
			if d := cmp.Diff(want, got); d != "" {
				t.Errorf("parameters (-pytorch +table):\n%s", d)
			}
			E, Im, C := cfg.MoE.NumExperts, cfg.MoE.IntermediateSize, cfg.HiddenSize
			for l, li := range lidx {
				if cfg.SparseLayer(l) != (li.router >= 0) {
					t.Fatalf("layer %d: sparse %v, router index %d", l, cfg.SparseLayer(l), li.router)
				}
				if li.router < 0 {
					continue
				}
				gu0, guN := tab.Params[li.eguFirst], tab.Params[li.eguLast]
				d0, dN := tab.Params[li.edownFirst], tab.Params[li.edownLast]
				if guN.Offset+guN.N-gu0.Offset != E*2*Im*C || dN.Offset+dN.N-d0.Offset != E*C*Im {
					t.Errorf("layer %d: expert runs of %d and %d floats, want %d and %d", l,
						guN.Offset+guN.N-gu0.Offset, dN.Offset+dN.N-d0.Offset, E*2*Im*C, E*C*Im)
				}
				for e := 0; e < E; e++ {
					g, u := tab.Params[li.eguFirst+2*e], tab.Params[li.eguFirst+2*e+1]
					if g.Name != fmt.Sprintf("model.layers.%d.mlp.experts.%d.gate_proj.weight", l, e) ||
						u.Name != fmt.Sprintf("model.layers.%d.mlp.experts.%d.up_proj.weight", l, e) ||
						tab.Params[li.edownFirst+e].Name != fmt.Sprintf("model.layers.%d.mlp.experts.%d.down_proj.weight", l, e) {
						t.Errorf("layer %d expert %d: run holds %s, %s, %s", l, e, g.Name, u.Name, tab.Params[li.edownFirst+e].Name)
					}
				}
			}
		})
	}
}

// TestMoESaveHubLayout: a model read from transformers v5's fused experts
// is written in the Hub's per-expert layout (what vLLM and transformers
// v4 read), with the same values, a config.json in the form it was read,
// and reloads to bit-identical logprobs.
func TestMoESaveHubLayout(t *testing.T) {
	b := cpu.New(2)
	defer b.Close()
	v := "moe_k2_nonorm_v5"
	m := loadTestModel(t, v, b, Options{MaxTokens: 40, MaxSeqs: 8})
	defer m.Close()
	dir := t.TempDir()
	if err := m.SaveHF(dir); err != nil {
		t.Fatal(err)
	}
	saved, err := safetensors.Open(filepath.Join(dir, "model.safetensors"))
	if err != nil {
		t.Fatal(err)
	}
	defer saved.Close()
	src, err := safetensors.Open(filepath.Join("testdata", v, "model.safetensors"))
	if err != nil {
		t.Fatal(err)
	}
	defer src.Close()
	cfg := m.Config()
	E, Im, C := cfg.MoE.NumExperts, cfg.MoE.IntermediateSize, cfg.HiddenSize
	perExpert := 0
	for _, ti := range saved.Tensors() {
		if strings.HasSuffix(ti.Name, "gate_up_proj") || strings.HasSuffix(ti.Name, "experts.down_proj") {
			t.Errorf("saved a fused tensor %s", ti.Name)
		}
		var l, e int
		var kind string
		if n, _ := fmt.Sscanf(ti.Name, "model.layers.%d.mlp.experts.%d.%s", &l, &e, &kind); n != 3 {
			continue
		}
		perExpert++
		got := make([]float32, ti.NumElements())
		if err := saved.ReadF32(ti.Name, got); err != nil {
			t.Fatal(err)
		}
		want := make([]float32, len(got))
		p := fmt.Sprintf("model.layers.%d.mlp.experts.", l)
		var err error
		switch kind {
		case "gate_proj.weight":
			err = src.ReadF32At(p+"gate_up_proj", e*2*Im*C, want)
		case "up_proj.weight":
			err = src.ReadF32At(p+"gate_up_proj", e*2*Im*C+Im*C, want)
		case "down_proj.weight":
			err = src.ReadF32At(p+"down_proj", e*C*Im, want)
		default:
			t.Fatalf("unexpected tensor %s", ti.Name)
		}
		if err != nil {
			t.Fatal(err)
		}
		if !slices.Equal(got, want) {
			t.Errorf("%s differs from its slice of the fused tensor", ti.Name)
		}
	}
	if want := cfg.SparseLayers() * E * 3; perExpert != want {
		t.Errorf("%d per-expert tensors saved, want %d", perExpert, want)
	}
	raw, err := os.ReadFile(filepath.Join(dir, "config.json"))
	if err != nil {
		t.Fatal(err)
	}
	var keys map[string]json.RawMessage
	if err := json.Unmarshal(raw, &keys); err != nil {
		t.Fatal(err)
	}
	if _, ok := keys["num_local_experts"]; !ok || keys["num_experts"] != nil || keys["rope_parameters"] == nil {
		t.Errorf("saved config.json changed the form it was read in:\n%s", raw)
	}
	g := openGoldenFile(t, v)
	tokens, cu := g.i32(t, "tokens"), g.i32(t, "cu_seqlens")
	lp1, _, err := m.Forward(tokens, cu, 0.7)
	if err != nil {
		t.Fatal(err)
	}
	lp1 = slices.Clone(lp1)
	m2 := loadModelDir(t, dir, b, Options{MaxTokens: 40, MaxSeqs: 8})
	defer m2.Close()
	lp2, _, err := m2.Forward(tokens, cu, 0.7)
	if err != nil {
		t.Fatal(err)
	}
	if !slices.Equal(lp1, lp2) {
		t.Error("the saved Hub layout reloads to other logprobs")
	}
}

// TestMoELoadRejects: a checkpoint holding a layer's experts in both
// layouts, a fused tensor of the wrong shape, or a missing expert is
// refused naming the layer or tensor.
func TestMoELoadRejects(t *testing.T) {
	b := cpu.New(1)
	defer b.Close()
	cfg := testConfig(t, "moe_k2_norm")
	E, Im, C := cfg.MoE.NumExperts, cfg.MoE.IntermediateSize, cfg.HiddenSize
	full := map[string][]float32{}
	shapes := map[string][]int{}
	for _, p := range NewParamTable(cfg).Params {
		full[p.Name] = make([]float32, p.N)
		shapes[p.Name] = p.Shape
	}
	for _, c := range []struct {
		name string
		edit func(t map[string][]float32, s map[string][]int)
		want string
	}{
		{"both layouts", func(t map[string][]float32, s map[string][]int) {
			t["model.layers.1.mlp.experts.gate_up_proj"] = make([]float32, E*2*Im*C)
			s["model.layers.1.mlp.experts.gate_up_proj"] = []int{E, 2 * Im, C}
		}, "layer 1 stores its experts both per expert"},
		{"fused shape", func(t map[string][]float32, s map[string][]int) {
			for e := 0; e < E; e++ {
				for _, k := range []string{"gate", "up", "down"} {
					delete(t, fmt.Sprintf("model.layers.0.mlp.experts.%d.%s_proj.weight", e, k))
				}
			}
			t["model.layers.0.mlp.experts.gate_up_proj"] = make([]float32, E*2*Im*C)
			s["model.layers.0.mlp.experts.gate_up_proj"] = []int{E, 2 * Im, C}
			t["model.layers.0.mlp.experts.down_proj"] = make([]float32, E*C*Im)
			s["model.layers.0.mlp.experts.down_proj"] = []int{E, Im, C} // transposed
		}, fmt.Sprintf("tensor model.layers.0.mlp.experts.down_proj: expected shape [%d %d %d] from config.json, found [%d %d %d]", E, C, Im, E, Im, C)},
		{"missing expert", func(t map[string][]float32, s map[string][]int) {
			delete(t, "model.layers.1.mlp.experts.7.up_proj.weight")
		}, fmt.Sprintf("tensor model.layers.1.mlp.experts.7.up_proj.weight is missing (expected shape [%d %d] for this config.json; or transformers v5's fused model.layers.1.mlp.experts.gate_up_proj and model.layers.1.mlp.experts.down_proj)", Im, C)},
	} {
		t.Run(c.name, func(t *testing.T) {
			tensors, sh := map[string][]float32{}, map[string][]int{}
			for k, v := range full {
				tensors[k], sh[k] = v, shapes[k]
			}
			c.edit(tensors, sh)
			dir := t.TempDir()
			writeTensors(t, filepath.Join(dir, "model.safetensors"), tensors, sh)
			m, err := New(b, cfg, Options{MaxTokens: 8})
			if err != nil {
				t.Fatal(err)
			}
			defer m.Close()
			err = m.LoadHF(dir)
			if err == nil || !strings.Contains(err.Error(), c.want) {
				t.Fatalf("LoadHF: %v\nwant an error containing %q", err, c.want)
			}
		})
	}
}

// writeTensors writes F32 tensors to a safetensors file.
func writeTensors(t *testing.T, path string, tensors map[string][]float32, shapes map[string][]int) {
	t.Helper()
	var specs []safetensors.Spec
	for name := range tensors {
		specs = append(specs, safetensors.Spec{Name: name, DType: safetensors.F32, Shape: shapes[name]})
	}
	slices.SortFunc(specs, func(a, b safetensors.Spec) int { return strings.Compare(a.Name, b.Name) })
	err := safetensors.WriteFileStream(path, specs, map[string]string{"format": "pt"}, func(w *safetensors.Writer) error {
		for _, s := range w.Tensors() {
			if err := w.WriteF32(s.Name, tensors[s.Name]); err != nil {
				return err
			}
		}
		return nil
	})
	if err != nil {
		t.Fatal(err)
	}
}

// TestMoESamplerMatchesForward: the sampler decodes a sparse model (its
// routing per decoded token) with the training forward's logprobs.
func TestMoESamplerMatchesForward(t *testing.T) {
	prompts := [][]int32{{5, 17, 100, 2}, {42}, {7, 7, 7, 100, 120, 111, 12, 9}, {127, 1}}
	for _, v := range []string{"moe_k2_norm", "moe_k8_step2"} {
		t.Run(v, func(t *testing.T) {
			b := cpu.New(2)
			defer b.Close()
			m := loadTestModel(t, v, b, Options{MaxTokens: 64, MaxSeqs: 8})
			defer m.Close()
			s, err := NewSampler(m, 4, 14)
			if err != nil {
				t.Fatal(err)
			}
			defer s.Close()
			const temp = 1.3
			out, err := s.Sample(prompts, SampleOptions{Temperature: temp, MaxNewTokens: 9, StopTokens: []int32{3, 4}},
				[]*rand.Rand{rand.New(rand.NewPCG(1, 2))})
			if err != nil {
				t.Fatal(err)
			}
			for i, o := range out {
				seq := append(slices.Clone(prompts[i]), o.Tokens...)
				lp, _, err := m.Forward(seq, []int32{0, int32(len(seq))}, temp)
				if err != nil {
					t.Fatal(err)
				}
				compareClose(t, "sampler vs forward logprobs", o.Logprobs, lp[len(prompts[i]):], samplerLogprobTol, 0)
			}
		})
	}
}

// TestMoEThreadCountInvariance: a sparse model's forward and backward are
// bit-identical on 1 and 3 threads.
func TestMoEThreadCountInvariance(t *testing.T) {
	v := "moe_k8_step2"
	g := openGoldenFile(t, v)
	tokens, cu, coef := g.i32(t, "tokens"), g.i32(t, "cu_seqlens"), g.f32(t, "coef")
	var lps, grads [2][]float32
	for i, threads := range []int{1, 3} {
		b := cpu.New(threads)
		m := loadTestModel(t, v, b, Options{MaxTokens: 40, MaxSeqs: 8})
		lp, _, err := m.Forward(tokens, cu, 0.7)
		if err != nil {
			t.Fatal(err)
		}
		lps[i] = slices.Clone(lp)
		m.SetRouterLossWeight(0.01)
		if err := m.Backward(coef); err != nil {
			t.Fatal(err)
		}
		grads[i] = make([]float32, m.Table().Total)
		b.DownloadF32(grads[i], m.Grads())
		m.Close()
		b.Close()
	}
	if !bitsEqual(lps[0], lps[1]) || !bitsEqual(grads[0], grads[1]) {
		t.Error("1 and 3 threads give different bits")
	}
}
