package model

import (
	"bytes"
	"math"
	"os"
	"path/filepath"
	"strings"
	"testing"

	"github.com/google/go-cmp/cmp"
)

// nhBase is a small nemotron_h config's keys (no braces): one block of each kind.
const nhBase = `"model_type":"nemotron_h","hidden_size":16,"vocab_size":50,"hybrid_override_pattern":"M*-E",
"num_attention_heads":2,"num_key_value_heads":1,"head_dim":8,"intermediate_size":12,
"mamba_num_heads":4,"mamba_head_dim":4,"n_groups":2,"ssm_state_size":5,"conv_kernel":4,"chunk_size":3,
"n_routed_experts":6,"num_experts_per_tok":2,"moe_intermediate_size":7,"moe_shared_expert_intermediate_size":9`

// TestNemotronHPublished loads NVIDIA-Nemotron-3-Nano-30B-A3B's config.json
// (testdata/published/PROVENANCE.md) into its blocks and sizes.
func TestNemotronHPublished(t *testing.T) {
	c, err := LoadConfig("testdata/published/nemotron-3-nano-30b-a3b.config.json")
	if err != nil {
		t.Fatal(err)
	}
	got := map[string]int{
		"mamba": c.CountLayers(LayerMamba), "moe": c.CountLayers(LayerMoE), "attention": c.CountLayers(LayerAttention),
		"mlp": c.CountLayers(LayerMLP), "layers": c.NumHiddenLayers,
		"d_inner": c.Mamba.DI(), "conv": c.Mamba.CD(), "in_proj": c.Mamba.InProj(),
		"experts": c.MoE.NumExperts, "topk": c.MoE.TopK, "shared": c.MoE.SharedSize,
	}
	want := map[string]int{
		"mamba": 23, "moe": 23, "attention": 6, "mlp": 0, "layers": 52,
		"d_inner": 4096, "conv": 4096 + 2*8*128, "in_proj": 4096 + 6144 + 64,
		"experts": 128, "topk": 6, "shared": 3712,
	}
	if d := cmp.Diff(want, got); d != "" {
		t.Errorf("Nemotron-3-Nano's shapes (-want +got):\n%s", d)
	}
	if !c.MoE.Sigmoid || c.MoE.RoutedScaling != 2.5 || !c.MoE.NormTopKProb || c.MoE.Groups != 1 || c.MoE.LatentSize != 0 {
		t.Errorf("router: %+v", c.MoE)
	}
	if c.Mamba.DtMin != 0 || !math.IsInf(c.Mamba.DtMax, 1) || !c.Mamba.ConvBias || c.RMSNormEps != 1e-5 {
		t.Errorf("mixer: %+v, eps %g", c.Mamba, c.RMSNormEps)
	}
	// The model cards: "31.6B" parameters in all.
	if n := NewParamTable(c).Total; math.Abs(float64(n)-31.6e9) > 0.05e9 {
		t.Errorf("%d parameters, the cards say 31.6B", n)
	}
	if len(c.Notes) != 1 || !strings.Contains(c.Notes[0], "rope_theta") || !strings.Contains(c.Notes[0], "n_shared_experts") {
		t.Errorf("notes %q: want one listing the keys transformers does not use (rope_theta, n_shared_experts, ...)", c.Notes)
	}
}

// TestNemotronHPythonJSON: a config.json as Python's json writes it
// (time_step_limit: [0.0, Infinity]) is read as transformers reads it, and
// written back with the bare word, a fixed point of parse and write.
func TestNemotronHPythonJSON(t *testing.T) {
	for _, limit := range []string{`[0.0, Infinity]`, `[0.001, 0.1]`, `[0, 1e309]`} {
		data := []byte(`{` + nhBase + `,"time_step_limit":` + limit + `,"some_future_key":[NaN, -Infinity, "Infinity"]}`)
		c, err := ParseConfig(data, "cfg.json")
		if limit == `[0, 1e309]` { // not a float64: Python reads inf, encoding/json refuses: so do we, naming the file
			if err == nil || !strings.Contains(err.Error(), "cfg.json") {
				t.Errorf("%s: %v", limit, err)
			}
			continue
		}
		if err != nil {
			t.Fatal(err)
		}
		out, err := c.JSON("float32")
		if err != nil {
			t.Fatal(err)
		}
		if !bytes.Contains(out, []byte(`[NaN,-Infinity,"Infinity"]`)) {
			t.Errorf("%s: an unknown key's non-finite floats are not written back as Python writes them:\n%s", limit, out)
		}
		c2, err := ParseConfig(out, "rewritten")
		if err != nil {
			t.Fatalf("%s: rewritten config: %v\n%s", limit, err, out)
		}
		if c2.Mamba.DtMax != c.Mamba.DtMax || c2.Mamba.DtMin != c.Mamba.DtMin {
			t.Errorf("%s: limit [%g, %g] rewritten as [%g, %g]", limit, c.Mamba.DtMin, c.Mamba.DtMax, c2.Mamba.DtMin, c2.Mamba.DtMax)
		}
		out2, _ := c2.JSON("float32")
		if !bytes.Equal(out, out2) {
			t.Errorf("%s: not a fixed point:\n%s\n%s", limit, out, out2)
		}
		if limit == `[0.0, Infinity]` && !bytes.Contains(out, []byte("Infinity]")) {
			t.Errorf("time_step_limit's Infinity is not written back bare:\n%s", out)
		}
	}
}

// TestNemotronHSpellings: NemotronHConfig's __init__ names are read as the
// attribute names, and written back under the name read.
func TestNemotronHSpellings(t *testing.T) {
	data := []byte(strings.NewReplacer(`"n_groups"`, `"mamba_n_groups"`, `"conv_kernel"`, `"mamba_d_conv"`, `"chunk_size"`, `"mamba_chunk_size"`).
		Replace(`{` + nhBase + `}`))
	c, err := ParseConfig(data, "cfg.json")
	if err != nil {
		t.Fatal(err)
	}
	if c.Mamba.Groups != 2 || c.Mamba.ConvKernel != 4 || c.Mamba.ChunkSize != 3 {
		t.Fatalf("aliases not read: %+v", c.Mamba)
	}
	out, _ := c.JSON("float32")
	for _, k := range []string{`"mamba_n_groups"`, `"mamba_d_conv"`, `"mamba_chunk_size"`} {
		if !bytes.Contains(out, []byte(k)) {
			t.Errorf("%s not written back under the name it was read by:\n%s", k, out)
		}
	}
	if bytes.Contains(out, []byte(`"n_groups"`)) {
		t.Errorf("both spellings written:\n%s", out)
	}
}

// TestNemotronHBlocks: the pattern, the list and num_hidden_layers.
func TestNemotronHBlocks(t *testing.T) {
	base := strings.Replace(nhBase, `"hybrid_override_pattern":"M*-E",`, ``, 1)
	for _, c := range []struct {
		name, keys, want string
		note             string
	}{
		{"pattern", `"hybrid_override_pattern":"ME*-M"`, "ME*-M", ""},
		{"list", `"layers_block_type":["mamba","moe","attention","mlp"]`, "ME*-", ""},
		{"both", `"hybrid_override_pattern":"M*","layers_block_type":["mamba","attention"]`, "M*", ""},
		{"default", ``, "ME*E", "layers_block_type"},
		{"count mismatch", `"hybrid_override_pattern":"M*","num_hidden_layers":3`, "M*", "num_hidden_layers 3 does not match the 2 blocks"},
	} {
		t.Run(c.name, func(t *testing.T) {
			keys := base
			if c.keys != "" {
				keys += "," + c.keys
			}
			cfg, err := ParseConfig([]byte(`{`+keys+`}`), "cfg.json")
			if err != nil {
				t.Fatal(err)
			}
			if got := Pattern(cfg.Layers); got != c.want || cfg.NumHiddenLayers != len(c.want) {
				t.Errorf("blocks %q (%d layers), want %q", got, cfg.NumHiddenLayers, c.want)
			}
			if c.note != "" && !strings.Contains(strings.Join(cfg.Notes, "\n"), c.note) {
				t.Errorf("notes %q: want one containing %q", cfg.Notes, c.note)
			}
		})
	}
}

// TestNemotronHRefusals: every key that would change the computation in a
// way tracegrpo does not implement is refused by name.
func TestNemotronHRefusals(t *testing.T) {
	for _, c := range []struct{ name, keys, want string }{
		{"mlp act", `"mlp_hidden_act":"silu"`, `field mlp_hidden_act: expected "relu2"`},
		{"mamba act", `"mamba_hidden_act":"gelu"`, `field mamba_hidden_act: expected "silu"`},
		{"attention bias", `"attention_bias":true`, "field attention_bias: expected false"},
		{"mlp bias", `"mlp_bias":true`, "field mlp_bias: expected false"},
		{"use bias", `"use_bias":true`, "field use_bias: expected false"},
		{"mamba proj bias", `"mamba_proj_bias":true`, "field mamba_proj_bias: expected false"},
		{"attention dropout", `"attention_dropout":0.1`, "field attention_dropout: expected 0"},
		{"hidden dropout", `"hidden_dropout":0.1`, "field hidden_dropout: expected 0"},
		{"sliding window", `"sliding_window":128`, "field sliding_window: expected null"},
		{"pattern char", `"hybrid_override_pattern":"M*X"`, `field hybrid_override_pattern: expected a string of M (Mamba-2), * (attention), - (MLP) and E (MoE), found 'X' at position 2`},
		{"block name", `"layers_block_type":["mamba","gdn"]`, `field layers_block_type[1]: expected "mamba", "attention", "mlp" or "moe", found "gdn"`},
		{"blocks disagree", `"layers_block_type":["mamba","moe","attention","moe"]`, `fields hybrid_override_pattern and layers_block_type disagree: "M*-E" and "ME*E"`},
		{"limit order", `"time_step_limit":[0.5,0.1]`, "field time_step_limit: expected a pair [min, max] with 0 ≤ min ≤ max"},
		{"limit nan", `"time_step_limit":[NaN,1.0]`, "field time_step_limit: expected a pair [min, max] with 0 ≤ min ≤ max (max may be Infinity), found [NaN,1.0]"},
		{"limit shape", `"time_step_limit":0.5`, "field time_step_limit: expected a pair [min, max] of numbers"},
		{"groups", `"n_groups":3`, "field n_groups: expected a divisor of mamba_num_heads 4, found 3"},
		{"router groups", `"n_group":4`, "n_group 4"},
		{"topk group", `"n_group":2,"topk_group":3`, "field topk_group: expected an integer in [1, 2], found 3"},
		{"k above kept", `"n_group":3,"topk_group":1,"num_experts_per_tok":3`, "at most topk_group·(experts per group) experts per token"},
		{"latent zero", `"moe_latent_size":0`, "field moe_latent_size: expected a positive integer or null"},
		{"scale", `"routed_scaling_factor":-1`, "field routed_scaling_factor: expected a positive number"},
		{"eps inf", `"layer_norm_epsilon":Infinity`, "field layer_norm_epsilon: expected a finite number"},
		{"architectures", `"architectures":["NemotronForCausalLM"]`, `field architectures: expected ["NemotronHForCausalLM"]`},
		// An explicitly empty layout was taken for an absent one: NemotronHConfig's
		// default 52 blocks were planned and trained in its place.
		{"empty pattern", `"hybrid_override_pattern":""`, `field hybrid_override_pattern: expected at least one block, found ""`},
		{"empty block list", `"hybrid_override_pattern":null,"layers_block_type":[]`, `field layers_block_type: expected at least one block, found []`},
	} {
		t.Run(c.name, func(t *testing.T) {
			base := nhBase
			if strings.Contains(c.keys, "hybrid_override_pattern") {
				base = strings.Replace(base, `"hybrid_override_pattern":"M*-E",`, "", 1)
			}
			_, err := ParseConfig([]byte(`{`+base+`,`+c.keys+`}`), "cfg.json")
			if err == nil || !strings.Contains(err.Error(), c.want) || !strings.Contains(err.Error(), "cfg.json") {
				t.Fatalf("error %v: want one naming cfg.json and containing %q", err, c.want)
			}
		})
	}
}

// TestNemotronHNotes: keys with no effect on transformers' forward are
// noted, not dropped; the multi-token prediction layers and Megatron's
// other group scoring are named.
func TestNemotronHNotes(t *testing.T) {
	for _, c := range []struct{ keys, want string }{
		{`"num_nextn_predict_layers":2`, "num_nextn_predict_layers 2: multi-token prediction layers (no mtp_hybrid_override_pattern, mtp.layers.*): trained, as Megatron-Core trains them, when policy.megatron_cfg.mtp_num_layers > 0; otherwise skipped at load"},
		{`"n_routed_experts":8,"n_group":2,"topk_group":1,"num_experts_per_tok":3`, "Megatron-Core's group_limited_topk sums the top num_experts_per_tok/topk_group = 3"},
		{`"rope_theta":10000,"n_shared_experts":1`, "n_shared_experts, rope_theta not used"},
	} {
		cfg, err := ParseConfig([]byte(`{`+nhBase+`,`+c.keys+`}`), "cfg.json")
		if err != nil {
			t.Fatal(err)
		}
		if !strings.Contains(strings.Join(cfg.Notes, "\n"), c.want) {
			t.Errorf("%s: notes %q, want one containing %q", c.keys, cfg.Notes, c.want)
		}
		out, _ := cfg.JSON("float32")
		for _, k := range strings.Split(c.keys, ",") {
			if !bytes.Contains(out, []byte(strings.SplitN(k, ":", 2)[0])) {
				t.Errorf("%s not kept in the written config", k)
			}
		}
	}
}

// TestNemotronHGoldenConfigsRoundTrip: every nh_* golden's config.json is a
// fixed point of parse and write (after the first rewrite).
func TestNemotronHGoldenConfigsRoundTrip(t *testing.T) {
	for _, v := range nhVariants {
		data, err := os.ReadFile(filepath.Join("testdata", v, "config.json"))
		if err != nil {
			t.Fatal(err)
		}
		c, err := ParseConfig(data, v)
		if err != nil {
			t.Fatal(err)
		}
		out, _ := c.JSON("float32")
		c2, err := ParseConfig(out, v+" rewritten")
		if err != nil {
			t.Fatal(err)
		}
		if d := cmp.Diff(c.Layers, c2.Layers); d != "" || c.Mamba != c2.Mamba || c.MoE.LatentSize != c2.MoE.LatentSize {
			t.Errorf("%s: round trip changed the model: %s %+v %+v", v, d, c.Mamba, c2.Mamba)
		}
	}
}
