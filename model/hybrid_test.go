package model

import (
	"fmt"
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
