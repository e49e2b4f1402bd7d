package model

import (
	"encoding/json"
	"os"
	"path/filepath"
	"strings"
	"testing"

	"github.com/google/go-cmp/cmp"
	"github.com/google/go-cmp/cmp/cmpopts"
	"github.com/tracegrpo/tracegrpo/kernels/cpu"
)

// v5Config rewrites a v4 config.json the way transformers v5 writes it:
// rope_theta and rope_scaling move into a rope_parameters block (rope_type
// "default" when unscaled) and torch_dtype becomes dtype.
func v5Config(t testing.TB, v4 []byte) []byte {
	t.Helper()
	var m map[string]any
	if err := json.Unmarshal(v4, &m); err != nil {
		t.Fatal(err)
	}
	rp := map[string]any{"rope_type": "default"}
	if sc, ok := m["rope_scaling"].(map[string]any); ok {
		rp = sc
	}
	if th, ok := m["rope_theta"]; ok {
		rp["rope_theta"] = th
	}
	m["rope_parameters"] = rp
	delete(m, "rope_theta")
	delete(m, "rope_scaling")
	if d, ok := m["torch_dtype"]; ok {
		m["dtype"] = d
		delete(m, "torch_dtype")
	}
	if n, ok := m["num_experts"]; ok { // transformers 5.7's Qwen3MoeConfig writes num_local_experts
		m["num_local_experts"] = n
		delete(m, "num_experts")
	}
	out, err := json.MarshalIndent(m, "", "  ")
	if err != nil {
		t.Fatal(err)
	}
	return out
}

const cfgBase = `"hidden_size":64,"intermediate_size":128,"num_hidden_layers":2,"num_attention_heads":4,"vocab_size":512`

var llama31Block = `{"factor":8.0,"high_freq_factor":4.0,"low_freq_factor":1.0,"original_max_position_embeddings":8192,"rope_type":"llama3"}`

// configCases are configs that must be refused, each naming its field.
var configCases = []struct{ name, json, want string }{
	{"unknown arch", `{"model_type":"gpt2"}`, `model_type "gpt2" is not supported; supported: llama, nemotron_h, qwen2, qwen3, qwen3_moe`},
	{"moe k above experts", `{"model_type":"qwen3_moe",` + cfgBase + `,"num_experts":4,"num_experts_per_tok":5}`, "field num_experts_per_tok: expected an integer in [1, num_experts 4], found 5"},
	{"moe k zero", `{"model_type":"qwen3_moe",` + cfgBase + `,"num_experts":4,"num_experts_per_tok":0}`, "field num_experts_per_tok"},
	{"moe sparse step zero", `{"model_type":"qwen3_moe",` + cfgBase + `,"decoder_sparse_step":0}`, "field decoder_sparse_step: expected a positive integer, found 0"},
	{"moe mlp_only_layers out of range", `{"model_type":"qwen3_moe",` + cfgBase + `,"mlp_only_layers":[0,2]}`, "field mlp_only_layers[1]: expected a layer index in [0, 2), found 2"},
	{"moe mlp_only_layers not a list", `{"model_type":"qwen3_moe",` + cfgBase + `,"mlp_only_layers":3}`, "field mlp_only_layers"},
	{"moe expert counts disagree", `{"model_type":"qwen3_moe",` + cfgBase + `,"num_experts":8,"num_local_experts":16}`, "fields num_experts and num_local_experts disagree: 8 and 16"},
	{"moe aux coef negative", `{"model_type":"qwen3_moe",` + cfgBase + `,"router_aux_loss_coef":-0.1}`, "field router_aux_loss_coef"},
	{"moe norm not a bool", `{"model_type":"qwen3_moe",` + cfgBase + `,"norm_topk_prob":"yes"}`, "field norm_topk_prob"},
	{"moe architectures", `{"model_type":"qwen3_moe","architectures":["Qwen3ForCausalLM"],` + cfgBase + `}`, "field architectures"},
	{"gemma3", `{"model_type":"gemma3",` + cfgBase + `}`, `model_type "gemma3" is not supported; supported: llama, nemotron_h, qwen2, qwen3, qwen3_moe`},
	{"nemotron_h without sizes", `{"model_type":"nemotron_h"}`, `field hidden_size: expected an integer, found nothing`},
	{"deepseek_v3", `{"model_type":"deepseek_v3"}`, `model_type "deepseek_v3" is not supported; supported: llama, nemotron_h, qwen2, qwen3, qwen3_moe`},
	{"architectures mismatch", `{"model_type":"qwen3",` + cfgBase + `,"architectures":["LlamaForCausalLM"]}`, "field architectures"},
	{"qwen2 class", `{"model_type":"qwen2",` + cfgBase + `,"architectures":["Qwen2MoeForCausalLM"]}`, "field architectures"},
	{"llama3 without factor", `{"model_type":"llama",` + cfgBase + `,"rope_scaling":{"rope_type":"llama3","low_freq_factor":1,"high_freq_factor":4,"original_max_position_embeddings":8192}}`, "field rope_scaling.factor"},
	{"llama3 without original", `{"model_type":"llama",` + cfgBase + `,"rope_parameters":{"rope_type":"llama3","factor":8,"low_freq_factor":1,"high_freq_factor":4}}`, "field rope_parameters.original_max_position_embeddings"},
	{"llama3 high below low", `{"model_type":"llama",` + cfgBase + `,"rope_scaling":{"rope_type":"llama3","factor":8,"low_freq_factor":4,"high_freq_factor":1,"original_max_position_embeddings":8192}}`, "field rope_scaling.high_freq_factor"},
	{"llama3 factor below 1", `{"model_type":"llama",` + cfgBase + `,"rope_scaling":{"rope_type":"llama3","factor":0.5,"low_freq_factor":1,"high_freq_factor":4,"original_max_position_embeddings":8192}}`, "field rope_scaling.factor"},
	{"linear", `{"model_type":"llama",` + cfgBase + `,"rope_scaling":{"rope_type":"linear","factor":2.0}}`, `field rope_scaling.rope_type: expected a supported RoPE type ("default", "llama3"), found "linear"`},
	{"dynamic (old type key)", `{"model_type":"llama",` + cfgBase + `,"rope_scaling":{"type":"dynamic","factor":2.0}}`, `field rope_scaling.type: expected a supported RoPE type ("default", "llama3"), found "dynamic"`},
	{"yarn v5", `{"model_type":"qwen2",` + cfgBase + `,"rope_parameters":{"rope_type":"yarn","factor":4.0,"rope_theta":1e6}}`, `field rope_parameters.rope_type: expected a supported RoPE type ("default", "llama3"), found "yarn"`},
	{"longrope", `{"model_type":"llama",` + cfgBase + `,"rope_scaling":{"rope_type":"longrope","short_factor":[1],"long_factor":[2]}}`, `found "longrope"`},
	{"rope_scaling without type", `{"model_type":"llama",` + cfgBase + `,"rope_scaling":{"factor":2.0}}`, "field rope_scaling.rope_type"},
	{"rope_scaling not an object", `{"model_type":"llama",` + cfgBase + `,"rope_scaling":"llama3"}`, "field rope_scaling"},
	{"per-layer rope_parameters", `{"model_type":"qwen3",` + cfgBase + `,"rope_parameters":{"full_attention":{"rope_type":"default","rope_theta":1e6}}}`, "field rope_parameters.full_attention"},
	{"partial rotary", `{"model_type":"llama",` + cfgBase + `,"partial_rotary_factor":0.5}`, "field partial_rotary_factor"},
	{"partial rotary v5", `{"model_type":"llama",` + cfgBase + `,"rope_parameters":{"rope_type":"default","rope_theta":1e4,"partial_rotary_factor":0.25}}`, "field rope_parameters.partial_rotary_factor"},
	{"theta disagrees", `{"model_type":"llama",` + cfgBase + `,"rope_theta":10000,"rope_parameters":{"rope_type":"default","rope_theta":500000}}`, "fields rope_theta and rope_parameters.rope_theta disagree: 10000 and 500000"},
	{"factor disagrees", `{"model_type":"llama",` + cfgBase + `,"rope_theta":500000,"rope_scaling":` + llama31Block + `,"rope_parameters":{"rope_type":"llama3","factor":32.0,"high_freq_factor":4.0,"low_freq_factor":1.0,"original_max_position_embeddings":8192,"rope_theta":500000}}`, "fields rope_scaling.factor and rope_parameters.factor disagree: 8 and 32"},
	{"scaling null vs llama3", `{"model_type":"llama",` + cfgBase + `,"rope_scaling":null,"rope_parameters":` + llama31Block + `}`, "fields rope_scaling and rope_parameters disagree: null (no scaling) and RoPE type \"llama3\""},
	{"default vs llama3", `{"model_type":"llama",` + cfgBase + `,"rope_scaling":` + llama31Block + `,"rope_parameters":{"rope_type":"default","rope_theta":500000}}`, "fields rope_scaling and rope_parameters disagree"},
	{"dtype disagrees", `{"model_type":"llama",` + cfgBase + `,"torch_dtype":"bfloat16","dtype":"float32"}`, `fields torch_dtype and dtype disagree: "bfloat16" and "float32"`},
	{"qwen2 sliding window", `{"model_type":"qwen2",` + cfgBase + `,"use_sliding_window":true,"sliding_window":4096}`, "field use_sliding_window: expected false"},
	{"sliding layer_types", `{"model_type":"qwen2",` + cfgBase + `,"layer_types":["full_attention","sliding_attention"]}`, "field layer_types[1]"},
	{"mrope", `{"model_type":"qwen2",` + cfgBase + `,"use_mrope":true}`, "field use_mrope"},
	{"attention bias", `{"model_type":"qwen3",` + cfgBase + `,"attention_bias":true}`, "field attention_bias"},
	{"llama mlp bias", `{"model_type":"llama",` + cfgBase + `,"mlp_bias":true}`, "field mlp_bias"},
	{"act", `{"model_type":"qwen2",` + cfgBase + `,"hidden_act":"gelu"}`, "field hidden_act"},
}

// TestConfigRefusals: every unsupported or contradictory config fails with
// one line naming the file and the field.
func TestConfigRefusals(t *testing.T) {
	for _, c := range configCases {
		t.Run(c.name, func(t *testing.T) {
			_, err := ParseConfig([]byte(c.json), "cfg.json")
			if err == nil || !strings.Contains(err.Error(), c.want) || !strings.Contains(err.Error(), "cfg.json") {
				t.Fatalf("error %v: want one naming cfg.json and containing %q", err, c.want)
			}
			if strings.Contains(err.Error(), "\n") {
				t.Errorf("error spans several lines: %q", err)
			}
		})
	}
}

// TestConfigRoPE: what each way of stating RoPE loads as.
func TestConfigRoPE(t *testing.T) {
	llama31 := RopeScaling{Type: RopeLlama3, Factor: 8, LowFreqFactor: 1, HighFreqFactor: 4, OriginalMaxPositionEmbeddings: 8192}
	for _, c := range []struct {
		name, json string
		theta      float32
		scaling    RopeScaling
		v4, v5     bool
		notes      int
	}{
		{"v4 plain", `"rope_theta":1e6`, 1e6, RopeScaling{}, true, false, 0},
		{"v4 null scaling", `"rope_theta":1e6,"rope_scaling":null`, 1e6, RopeScaling{}, true, false, 0},
		{"v4 default type", `"rope_theta":1e6,"rope_scaling":{"rope_type":"default"}`, 1e6, RopeScaling{}, true, false, 0},
		{"v4 llama3", `"rope_theta":500000,"rope_scaling":` + llama31Block, 500000, llama31, true, false, 0},
		{"v4 llama3 old type key", `"rope_theta":500000,"rope_scaling":{"type":"llama3","factor":8,"high_freq_factor":4,"low_freq_factor":1,"original_max_position_embeddings":8192}`, 500000, llama31, true, false, 0},
		{"v5 plain", `"rope_parameters":{"rope_theta":1e6,"rope_type":"default"}`, 1e6, RopeScaling{}, false, true, 0},
		{"v5 without type", `"rope_parameters":{"rope_theta":1e6}`, 1e6, RopeScaling{}, false, true, 0},
		{"v5 llama3", `"rope_parameters":{"factor":8.0,"high_freq_factor":4.0,"low_freq_factor":1.0,"original_max_position_embeddings":8192,"rope_theta":500000.0,"rope_type":"llama3"}`, 500000, llama31, false, true, 0},
		{"both agree", `"rope_theta":500000,"rope_scaling":` + llama31Block + `,"rope_parameters":{"factor":8,"high_freq_factor":4,"low_freq_factor":1,"original_max_position_embeddings":8192,"rope_theta":5e5,"rope_type":"llama3"}`, 500000, llama31, true, true, 0},
		{"v5 theta, v4 scaling", `"rope_scaling":` + llama31Block + `,"rope_parameters":{"rope_theta":500000}`, 500000, llama31, true, true, 0},
		{"no theta", `"max_position_embeddings":4096`, 10000, RopeScaling{}, false, false, 1},
		{"no theta, v5 block", `"rope_parameters":{"rope_type":"default"}`, 10000, RopeScaling{}, false, true, 1},
		{"unused key kept", `"rope_theta":500000,"rope_scaling":{"factor":8.0,"high_freq_factor":4.0,"low_freq_factor":1.0,"original_max_position_embeddings":8192,"rope_type":"llama3","attention_factor":1.0}`, 500000, llama31, true, false, 1},
	} {
		t.Run(c.name, func(t *testing.T) {
			cfg, err := ParseConfig([]byte(`{"model_type":"llama",`+cfgBase+`,`+c.json+`}`), "cfg.json")
			if err != nil {
				t.Fatal(err)
			}
			if cfg.RopeTheta != c.theta || cfg.RopeScaling != c.scaling {
				t.Errorf("theta %g scaling %+v, want %g %+v", cfg.RopeTheta, cfg.RopeScaling, c.theta, c.scaling)
			}
			if cfg.Form.RopeV4 != c.v4 || cfg.Form.RopeV5 != c.v5 {
				t.Errorf("form v4 %v v5 %v, want %v %v", cfg.Form.RopeV4, cfg.Form.RopeV5, c.v4, c.v5)
			}
			if len(cfg.Notes) != c.notes {
				t.Errorf("notes %q, want %d", cfg.Notes, c.notes)
			}
			// Written and read back: the same RoPE in the same form, and
			// the written file is a fixed point.
			out, err := cfg.JSON("float32")
			if err != nil {
				t.Fatal(err)
			}
			back, err := ParseConfig(out, "written")
			if err != nil {
				t.Fatalf("%v\n%s", err, out)
			}
			if back.RopeTheta != cfg.RopeTheta || back.RopeScaling != cfg.RopeScaling {
				t.Errorf("written config states theta %g scaling %+v", back.RopeTheta, back.RopeScaling)
			}
			if back.Form.RopeV5 != c.v5 || back.Form.RopeV4 != (c.v4 || !c.v5) {
				t.Errorf("written form v4 %v v5 %v, read v4 %v v5 %v:\n%s", back.Form.RopeV4, back.Form.RopeV5, c.v4, c.v5, out)
			}
			if len(back.Notes) != strings.Count(c.json, "attention_factor") {
				t.Errorf("written config still needs notes %q:\n%s", back.Notes, out)
			}
		})
	}
}

// TestConfigDefaultTheta: with no theta in either form each model_type gets
// transformers' default, and the note says so (one line, naming the file).
func TestConfigDefaultTheta(t *testing.T) {
	for _, arch := range []Arch{Llama, Qwen2, Qwen3} {
		cfg, err := ParseConfig([]byte(`{"model_type":"`+string(arch)+`",`+cfgBase+`}`), "dir/config.json")
		if err != nil {
			t.Fatal(err)
		}
		if cfg.RopeTheta != 10000 {
			t.Errorf("%s: theta %g, want transformers' default 10000", arch, cfg.RopeTheta)
		}
		if len(cfg.Notes) != 1 || !strings.Contains(cfg.Notes[0], "dir/config.json") || !strings.Contains(cfg.Notes[0], "10000") ||
			!strings.Contains(cfg.Notes[0], string(arch)) {
			t.Errorf("%s: notes %q", arch, cfg.Notes)
		}
	}
}

// TestConfigWritesBackTheFormRead: a v5 config is written back as v5 (a
// rope_parameters block and dtype), a v4 one as v4, with every key
// tracegrpo does not interpret kept, inside the RoPE block too.
func TestConfigWritesBackTheFormRead(t *testing.T) {
	v4 := `{"model_type":"llama",` + cfgBase + `,"rope_theta":500000.0,"torch_dtype":"bfloat16","transformers_version":"4.45.0",
		"rope_scaling":{"factor":32.0,"high_freq_factor":4.0,"low_freq_factor":1.0,"original_max_position_embeddings":8192,"rope_type":"llama3","attention_factor":1.0}}`
	v5 := `{"model_type":"qwen2",` + cfgBase + `,"dtype":"bfloat16","transformers_version":"5.7.0","pad_token_id":null,
		"rope_parameters":{"rope_theta":1000000.0,"rope_type":"default"},"layer_types":["full_attention","full_attention"],
		"sliding_window":null,"max_window_layers":21,"use_sliding_window":false}`
	for _, c := range []struct {
		name, json    string
		want, wantNot []string
	}{
		{"v4", v4, []string{`"rope_theta": 500000`, `"torch_dtype": "float32"`, `"transformers_version": "4.45.0"`,
			`"rope_scaling": {"attention_factor":1.0,"factor":32.0,"high_freq_factor":4.0,"low_freq_factor":1.0,"original_max_position_embeddings":8192,"rope_type":"llama3"}`},
			[]string{"rope_parameters", `"dtype"`}},
		{"v5", v5, []string{`"rope_parameters": {"rope_theta":1000000.0,"rope_type":"default"}`, `"dtype": "float32"`,
			`"layer_types": ["full_attention","full_attention"]`, `"max_window_layers": 21`, `"pad_token_id": null`, `"sliding_window": null`,
			`"use_sliding_window": false`},
			[]string{`"rope_theta": `, "rope_scaling", "torch_dtype", "attention_bias", `"mlp_bias"`}},
	} {
		t.Run(c.name, func(t *testing.T) {
			cfg, err := ParseConfig([]byte(c.json), "cfg.json")
			if err != nil {
				t.Fatal(err)
			}
			out, err := cfg.JSON("float32")
			if err != nil {
				t.Fatal(err)
			}
			for _, w := range c.want {
				if !strings.Contains(string(out), w) {
					t.Errorf("written config lacks %s:\n%s", w, out)
				}
			}
			for _, w := range c.wantNot {
				if strings.Contains(string(out), w) {
					t.Errorf("written config has %s:\n%s", w, out)
				}
			}
		})
	}
}

// TestV5ConfigsGiveIdenticalLogprobs: each golden model written as a
// transformers v5 config loads as the same model and gives bit-identical
// logprobs (the long Llama 3 models on a 9000-token sequence, past their
// original 8192 positions).
func TestV5ConfigsGiveIdenticalLogprobs(t *testing.T) {
	for _, v := range append(append([]string(nil), goldenVariants...), longVariants...) {
		t.Run(v, func(t *testing.T) {
			dir := filepath.Join("testdata", v)
			v4, err := os.ReadFile(filepath.Join(dir, "config.json"))
			if err != nil {
				t.Fatal(err)
			}
			v5dir := t.TempDir()
			if err := os.WriteFile(filepath.Join(v5dir, "config.json"), v5Config(t, v4), 0o644); err != nil {
				t.Fatal(err)
			}
			if err := os.Symlink(mustAbs(t, filepath.Join(dir, "model.safetensors")), filepath.Join(v5dir, "model.safetensors")); err != nil {
				t.Fatal(err)
			}
			c4, err := LoadConfig(filepath.Join(dir, "config.json"))
			if err != nil {
				t.Fatal(err)
			}
			c5, err := LoadConfig(filepath.Join(v5dir, "config.json"))
			if err != nil {
				t.Fatal(err)
			}
			if !c5.Form.RopeV5 || c5.Form.RopeV4 || !c5.Form.DType || c5.Form.TorchDType {
				t.Fatalf("the v5 config was not read as v5: %+v", c5.Form)
			}
			if d := cmp.Diff(c4, c5, cmpopts.IgnoreFields(Config{}, "Form", "Notes", "Extra")); d != "" {
				t.Fatalf("v4 and v5 configs load differently (-v4 +v5):\n%s", d)
			}
			b := cpu.New(2)
			defer b.Close()
			T := 34
			if c4.RopeScaling.Type != "" {
				T = 9000
			}
			tokens := make([]int32, T)
			for i := range tokens {
				tokens[i] = int32((i*7919 + 13) % c4.VocabSize)
			}
			var lps [2][]float32
			for i, d := range []string{dir, v5dir} {
				m := loadModelDir(t, d, b, Options{MaxTokens: T, MaxSeqs: 2})
				lp, _, err := m.Forward(tokens, []int32{0, int32(T - 5), int32(T)}, 0.8)
				if err != nil {
					t.Fatal(err)
				}
				lps[i] = append([]float32(nil), lp...)
				m.Close()
			}
			if d := cmp.Diff(lps[0], lps[1]); d != "" {
				t.Errorf("logprobs differ (-v4 +v5):\n%s", d)
			}
		})
	}
}

func mustAbs(t *testing.T, p string) string {
	t.Helper()
	a, err := filepath.Abs(p)
	if err != nil {
		t.Fatal(err)
	}
	return a
}

// TestQwen2NotesIgnoredKeys: sliding_window and max_window_layers are named
// as ignored while use_sliding_window is false, and kept for saving.
func TestQwen2NotesIgnoredKeys(t *testing.T) {
	cfg, err := ParseConfig([]byte(`{"model_type":"qwen2",`+cfgBase+`,"rope_theta":1e6,"use_sliding_window":false,"sliding_window":131072,"max_window_layers":28}`), "q.json")
	if err != nil {
		t.Fatal(err)
	}
	if !cfg.QKVBias() || cfg.HeadDim != 16 {
		t.Errorf("qwen2: QKVBias %v, head_dim %d; want true and hidden/heads = 16", cfg.QKVBias(), cfg.HeadDim)
	}
	if len(cfg.Notes) != 1 || !strings.Contains(cfg.Notes[0], "sliding_window, max_window_layers ignored") {
		t.Errorf("notes %q", cfg.Notes)
	}
	if string(cfg.Extra["sliding_window"]) != "131072" || string(cfg.Extra["max_window_layers"]) != "28" {
		t.Errorf("ignored keys not kept: %v", cfg.Extra)
	}
}
