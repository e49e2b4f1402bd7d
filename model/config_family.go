package model

// The model families: what each model_type adds to the keys every family
// shares (config.go). A family is one row of families: its class name, the
// keys it reads beyond the common ones (kept out of Config.Extra and written
// back from the Config), and the hooks that read, check and write them. A
// new family is a row here and a file of its own (config_moe.go is
// qwen3_moe's); ParseConfig, Validate and JSON call the hooks and nothing
// else changes.

import (
	"encoding/json"
	"sort"
	"strings"
)

// family is one model_type's share of config.json.
type family struct {
	class string // the HF class name written to architectures
	// own: the family reads its own sizes and norms (parse) instead of the
	// uniform families' keys (config.go's parseUniform): a hybrid model.
	own  bool
	keys []string // the family's own keys, read by parse and written by json
	// parse reads the family's keys after the common ones (nil: none).
	parse func(c *Config, r configReader) error
	// validate checks the family's sizes after the common checks (nil: none).
	validate func(c Config) error
	// json sets the family's keys in out (the common ones are already set).
	json func(c Config, out map[string]any)
}

// families lists every supported model_type.
var families = map[Arch]family{
	Qwen2: {class: "Qwen2ForCausalLM", json: func(c Config, out map[string]any) {
		out["use_sliding_window"] = false
	}},
	Qwen3: {class: "Qwen3ForCausalLM", json: func(c Config, out map[string]any) {
		out["attention_bias"] = false
		out["use_sliding_window"] = false
	}},
	Llama: {class: "LlamaForCausalLM", json: func(c Config, out map[string]any) {
		out["attention_bias"] = false
		out["mlp_bias"] = false
	}},
	Qwen3MoE: {class: "Qwen3MoeForCausalLM", keys: moeKeys, parse: (*Config).parseMoE,
		validate: func(c Config) error { return c.MoE.validate(c.NumHiddenLayers) },
		json: func(c Config, out map[string]any) {
			out["attention_bias"] = false
			out["use_sliding_window"] = false
			c.moeJSON(out)
		}},
	NemotronH: {class: "NemotronHForCausalLM", own: true, keys: nemotronHKeys, parse: (*Config).parseNemotronH,
		validate: Config.validateNemotronH, json: Config.nemotronHJSON},
}

// supportedArchs lists the model_type values, for error messages.
var supportedArchs = func() string {
	var s []string
	for a := range families {
		s = append(s, string(a))
	}
	sort.Strings(s)
	return strings.Join(s, ", ")
}()

// compactExtra returns raw's keys with their values compacted, less the
// keys the Config interprets (the common ones and the family's).
func compactExtra(raw map[string]json.RawMessage, f family) map[string]json.RawMessage {
	extra := map[string]json.RawMessage{}
	for k, v := range raw {
		extra[k] = compactJSON(v)
	}
	for _, k := range sharedKeys {
		delete(extra, k)
	}
	if !f.own {
		for _, k := range uniformKeys {
			delete(extra, k)
		}
	}
	for _, k := range f.keys {
		delete(extra, k)
	}
	return extra
}
