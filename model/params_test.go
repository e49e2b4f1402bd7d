package model

import (
	"fmt"
	"path/filepath"
	"slices"
	"strings"
	"testing"

	"github.com/google/go-cmp/cmp"
)

// TestParamGroups: the table's groups are the units of sharding: embed,
// one per decoder layer, head, in table order; together they cover every
// parameter exactly once, each a contiguous run of the table and of the
// arena; a layer's group holds exactly the parameters named
// model.layers.<N>.*; and each parameter sits in its group's matrix or
// vector flat by its rank, contiguous in table order, so the fused q|k|v
// and gate|up runs (and the q/k/v biases) stay adjacent there too.
func TestParamGroups(t *testing.T) {
	var cfgs []Config
	var names []string
	for _, v := range append(slices.Clone(goldenVariants), moeVariants...) {
		cfgs = append(cfgs, testConfig(t, v))
		names = append(names, v)
	}
	for _, p := range publishedConfigs {
		c, err := LoadConfig(filepath.Join("testdata", "published", p.file))
		if err != nil {
			t.Fatal(err)
		}
		cfgs, names = append(cfgs, c), append(names, p.file)
	}
	for i, cfg := range cfgs {
		t.Run(names[i], func(t *testing.T) {
			tab := NewParamTable(cfg)
			var wantNames []string
			wantNames = append(wantNames, "embed")
			for l := range cfg.NumHiddenLayers {
				wantNames = append(wantNames, fmt.Sprintf("layers.%d", l))
			}
			wantNames = append(wantNames, "head")
			var gotNames []string
			next, off := 0, 0
			for gi, g := range tab.Groups {
				gotNames = append(gotNames, g.Name)
				if g.First != next || g.Offset != off || g.End <= g.First {
					t.Errorf("group %s: params [%d, %d) at %d, want a non-empty run from param %d at offset %d", g.Name, g.First, g.End, g.Offset, next, off)
				}
				var flatN [NumFlats]int
				n := 0
				for pi := g.First; pi < g.End; pi++ {
					p := tab.Params[pi]
					if p.Group != gi {
						t.Errorf("%s: Group %d, want %d", p.Name, p.Group, gi)
					}
					wantFlat := FlatMatrix
					if len(p.Shape) < 2 {
						wantFlat = FlatVector
					}
					if p.Flat != wantFlat || p.FlatOffset != flatN[p.Flat] {
						t.Errorf("%s: flat %v at %d, want %v at %d", p.Name, p.Flat, p.FlatOffset, wantFlat, flatN[wantFlat])
					}
					flatN[p.Flat] += p.N
					n += p.N
					inLayer := strings.HasPrefix(p.Name, fmt.Sprintf("model.layers.%d.", g.Layer))
					if (g.Layer >= 0) != inLayer {
						t.Errorf("%s is in group %s (layer %d)", p.Name, g.Name, g.Layer)
					}
				}
				if flatN != g.FlatN || n != g.N {
					t.Errorf("group %s: FlatN %v N %d, the parameters sum to %v and %d", g.Name, g.FlatN, g.N, flatN, n)
				}
				next, off = g.End, off+g.N
			}
			if next != len(tab.Params) || off != tab.Total {
				t.Errorf("groups cover %d params and %d elements of %d and %d", next, off, len(tab.Params), tab.Total)
			}
			if d := cmp.Diff(wantNames, gotNames); d != "" {
				t.Errorf("group names (-want +got):\n%s", d)
			}
			// The fused runs are adjacent in their flat.
			for l := range cfg.NumHiddenLayers {
				runs := [][]string{{"self_attn.q_proj.weight", "self_attn.k_proj.weight", "self_attn.v_proj.weight"},
					{"mlp.gate_proj.weight", "mlp.up_proj.weight"}}
				if cfg.SparseLayer(l) {
					// The experts' gate|up run and down run (the grouped
					// GEMMs' weights), in the layer's matrix flat with its
					// router.
					var gu, down []string
					for e := range cfg.MoE.NumExperts {
						gu = append(gu, fmt.Sprintf("mlp.experts.%d.gate_proj.weight", e), fmt.Sprintf("mlp.experts.%d.up_proj.weight", e))
						down = append(down, fmt.Sprintf("mlp.experts.%d.down_proj.weight", e))
					}
					runs = [][]string{runs[0], gu, down}
					for _, n := range []string{"mlp.gate.weight", gu[0], down[0]} {
						g, ok := tab.GroupOf(fmt.Sprintf("model.layers.%d.%s", l, n))
						if !ok || g.Layer != l {
							t.Errorf("layer %d: %s in group %q (%v)", l, n, g.Name, ok)
						}
					}
				}
				if cfg.QKVBias() {
					runs = append(runs, []string{"self_attn.q_proj.bias", "self_attn.k_proj.bias", "self_attn.v_proj.bias"})
				}
				for _, run := range runs {
					prev, ok := tab.Lookup(fmt.Sprintf("model.layers.%d.%s", l, run[0]))
					if !ok {
						t.Fatalf("layer %d has no %s", l, run[0])
					}
					for _, n := range run[1:] {
						p, ok := tab.Lookup(fmt.Sprintf("model.layers.%d.%s", l, n))
						if !ok {
							t.Fatalf("layer %d has no %s", l, n)
						}
						if p.Flat != prev.Flat || p.FlatOffset != prev.FlatOffset+prev.N {
							t.Errorf("layer %d: %s at %v %d, want right after %s", l, n, p.Flat, p.FlatOffset, prev.Name)
						}
						prev = p
					}
				}
			}
			g, ok := tab.GroupOf("model.norm.weight")
			if !ok || g.Name != "head" {
				t.Errorf("model.norm.weight in group %q", g.Name)
			}
		})
	}
}
