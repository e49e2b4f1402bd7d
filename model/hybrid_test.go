package model

import (
	"fmt"
	"math/rand/v2"
	"path/filepath"
	"slices"
	"strings"
	"testing"

	"github.com/tracegrpo/tracegrpo/internal/safetensors"
	"github.com/tracegrpo/tracegrpo/kernels"
	"github.com/tracegrpo/tracegrpo/kernels/cpu"
)

// TestHybridSaveLoadLayouts: a Nemotron-H model saved in BF16 keeps its
// selection biases in fp32; it loads back from the Hub's layout, from
// transformers' in-memory names (model.*) with stacked experts, and with
// multi-token prediction tensors beside it (skipped, as transformers skips
// them); a block with both expert layouts is refused.
func TestHybridSaveLoadLayouts(t *testing.T) {
	b := cpu.New(2)
	defer b.Close()
	cfg, err := LoadConfig("testdata/nh_groups/config.json")
	if err != nil {
		t.Fatal(err)
	}
	m, err := New(b, cfg, Options{MaxTokens: 8})
	if err != nil {
		t.Fatal(err)
	}
	defer m.Close()
	if err := m.LoadHF("testdata/nh_groups"); err != nil {
		t.Fatal(err)
	}
	want := m.ParamsHost()
	dir := t.TempDir()
	if err := m.SaveHFAs(dir, safetensors.BF16); err != nil {
		t.Fatal(err)
	}
	f, err := safetensors.Open(filepath.Join(dir, "model.safetensors"))
	if err != nil {
		t.Fatal(err)
	}
	biases := 0
	for _, ti := range f.Tensors() {
		isBias := strings.HasSuffix(ti.Name, "e_score_correction_bias")
		if isBias {
			biases++
		}
		if wantDT := map[bool]safetensors.DType{true: safetensors.F32, false: safetensors.BF16}[isBias]; ti.DType != wantDT {
			t.Errorf("%s saved as %s, want %s", ti.Name, ti.DType, wantDT)
		}
	}
	f.Close()
	if biases != cfg.CountLayers(LayerMoE) {
		t.Errorf("%d selection biases saved, want %d", biases, cfg.CountLayers(LayerMoE))
	}
	m2, err := New(b, cfg, Options{MaxTokens: 8})
	if err != nil {
		t.Fatal(err)
	}
	defer m2.Close()
	if err := m2.LoadHF(dir); err != nil {
		t.Fatal(err)
	}
	got := m2.ParamsHost()
	for _, p := range m.Table().Params {
		for i := p.Offset; i < p.Offset+p.N; i++ {
			w := want[i]
			if !p.Buffer {
				w = cpu.BF16ToF32(cpu.F32ToBF16(w))
			}
			if got[i] != w {
				t.Fatalf("%s element %d: loaded %g, saved %g (bf16 %g)", p.Name, i-p.Offset, got[i], want[i], w)
			}
		}
	}

	// transformers' in-memory names and stacked experts, plus mtp.* tensors.
	E, Im, In := cfg.MoE.NumExperts, cfg.MoE.IntermediateSize, cfg.expertIn()
	tensors, shapes := map[string][]float32{}, map[string][]int{}
	for _, p := range m.Table().Params {
		vals := want[p.Offset : p.Offset+p.N]
		name := "model." + strings.TrimPrefix(p.Name, "backbone.")
		if l, ok := expertLayer(m.lidx, m.Table().byName[p.Name]); ok {
			li := m.lidx[l]
			i := m.Table().byName[p.Name]
			up := fmt.Sprintf("model.layers.%d.mixer.experts.up_proj", l)
			dn := fmt.Sprintf("model.layers.%d.mixer.experts.down_proj", l)
			if tensors[up] == nil {
				tensors[up], shapes[up] = make([]float32, E*Im*In), []int{E, Im, In}
				tensors[dn], shapes[dn] = make([]float32, E*In*Im), []int{E, In, Im}
			}
			if i <= li.eguLast {
				copy(tensors[up][(i-li.eguFirst)*Im*In:], vals)
			} else {
				copy(tensors[dn][(i-li.edownFirst)*In*Im:], vals)
			}
			continue
		}
		if p.Name == "lm_head.weight" {
			name = p.Name
		}
		tensors[name], shapes[name] = slices.Clone(vals), p.Shape
	}
	tensors["mtp.layers.0.enorm.weight"], shapes["mtp.layers.0.enorm.weight"] = make([]float32, cfg.HiddenSize), []int{cfg.HiddenSize}
	sdir := t.TempDir()
	writeTensors(t, filepath.Join(sdir, "model.safetensors"), tensors, shapes)
	m3, err := New(b, cfg, Options{MaxTokens: 8})
	if err != nil {
		t.Fatal(err)
	}
	defer m3.Close()
	if err := m3.LoadHF(sdir); err != nil {
		t.Fatal(err)
	}
	if got := m3.ParamsHost(); !slices.Equal(got, want) {
		t.Error("transformers' stacked layout loads other values than the Hub's")
	}

	// Both layouts in one block.
	first := m.Table().Params[m.lidx[1].eguFirst]
	tensors[first.Name], shapes[first.Name] = make([]float32, first.N), first.Shape
	writeTensors(t, filepath.Join(sdir, "model.safetensors"), tensors, shapes)
	if err := m3.LoadHF(sdir); err == nil || !strings.Contains(err.Error(), "both per expert") {
		t.Errorf("LoadHF of both expert layouts: %v", err)
	}
}

// TestHybridBackendWithoutMamba: a Nemotron-H config on a backend without
// kernels.Mamba is refused by name, never run.
func TestHybridBackendWithoutMamba(t *testing.T) {
	b := cpu.New(1)
	defer b.Close()
	cfg, err := LoadConfig("testdata/nh_blocks/config.json")
	if err != nil {
		t.Fatal(err)
	}
	_, err = New(noMamba{b, b}, cfg, Options{MaxTokens: 8})
	if err == nil || !strings.Contains(err.Error(), "kernels.Mamba") || !strings.Contains(err.Error(), "nemotron_h") {
		t.Fatalf("New on a backend without the Mamba ops: %v", err)
	}
}

// noMamba hides the CPU backend's kernels.Mamba (and keeps its
// kernels.Experts), as a backend without the Mamba ops is.
type noMamba struct {
	kernels.Backend
	kernels.Experts
}

// TestHybridSamplerMatchesForward: a Nemotron-H model's sampler (prefill
// keeping each prompt's SSM states, conv windows and keys and values;
// decode steps in the Mamba blocks' decoding forms) gives every sampled
// token the training forward's logprob at the same temperature, for every
// golden variant, in fp32 and bf16, with slots retired, moved and refilled
// (maxLen 14 ends the long prompt at the cache's end; 6 prompts on 4 slots).
func TestHybridSamplerMatchesForward(t *testing.T) {
	prompts := [][]int32{{5, 17, 30, 2}, {42}, {7, 7, 7, 10, 20, 31, 12, 9}, {50, 1}, {3, 9, 27}, {11}}
	for _, v := range nhVariants {
		for _, prec := range []kernels.DType{kernels.F32, kernels.BF16} {
			t.Run(v+"/"+prec.String(), func(t *testing.T) {
				b := cpu.New(2)
				defer b.Close()
				m := loadTestModel(t, v, b, Options{MaxTokens: 64, MaxSeqs: 8, Precision: prec})
				defer m.Close()
				s, err := NewSampler(m, 4, 14)
				if err != nil {
					t.Fatal(err)
				}
				defer s.Close()
				const temp = 1.3
				out, err := s.Sample(prompts, SampleOptions{Temperature: temp, MaxNewTokens: 9, StopTokens: []int32{3, 4}, Refill: true},
					[]*rand.Rand{rand.New(rand.NewPCG(1, 2))})
				if err != nil {
					t.Fatal(err)
				}
				lengths := map[int]bool{}
				worst := 0.0
				for i, o := range out {
					p := prompts[i]
					lengths[len(o.Tokens)] = true
					if len(o.Tokens) == 0 || len(o.Tokens) != len(o.Logprobs) {
						t.Fatalf("prompt %d: %d tokens, %d logprobs", i, len(o.Tokens), len(o.Logprobs))
					}
					seq := append(slices.Clone(p), o.Tokens...)
					lp, _, err := m.Forward(seq, []int32{0, int32(len(seq))}, temp)
					if err != nil {
						t.Fatal(err)
					}
					compareClose(t, fmt.Sprintf("prompt %d: sampler vs forward logprobs", i), o.Logprobs, lp[len(p):], hybridSamplerTol, 0)
					worst = max(worst, maxAbsDiff(o.Logprobs, lp[len(p):]))
				}
				if len(lengths) < 2 {
					t.Errorf("every sequence generated the same number of tokens %v: slot retirement not exercised", lengths)
				}
				t.Logf("largest |Δ logprob| against the forward: %.3g", worst)
			})
		}
	}
}

// hybridSamplerTol: the decoding forms sum the scan's state token by
// token where the forward's chunked scan sums within chunks first (float32
// rounding of a few terms); measured up to 4.5e-6 (fp32 and bf16 alike).
const hybridSamplerTol = 1e-5
