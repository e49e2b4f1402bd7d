package model

import (
	"bytes"
	"encoding/json"
	"fmt"
	"math"
	"os"
	"path/filepath"
	"sort"
)

// Arch is a supported architecture.
type Arch string

// The supported architectures (HF model_type values).
const (
	Qwen3 Arch = "qwen3"
	Llama Arch = "llama"
)

// archClass is the HF class name written to architectures.
var archClass = map[Arch]string{Qwen3: "Qwen3ForCausalLM", Llama: "LlamaForCausalLM"}

// Config is the subset of an HF config.json that defines the network.
// Fields the model does not use are kept in Extra and written back by SaveHF.
type Config struct {
	Arch                  Arch
	HiddenSize            int     // C
	IntermediateSize      int     // I
	NumHiddenLayers       int     // L
	NumAttentionHeads     int     // NH
	NumKeyValueHeads      int     // NKV
	HeadDim               int     // HD (default C/NH)
	RMSNormEps            float32 // rms_norm_eps
	RopeTheta             float32 // rope_theta
	VocabSize             int     // V
	TieWordEmbeddings     bool
	MaxPositionEmbeddings int
	TorchDType            string // torch_dtype (or dtype), e.g. "bfloat16"
	EOSTokenIDs           []int32

	// Extra holds every other key of the config.json it came from.
	Extra map[string]json.RawMessage
}

// configKeys are the keys Config reads; SaveHF writes them from the fields.
var configKeys = []string{
	"model_type", "architectures", "hidden_size", "intermediate_size", "num_hidden_layers",
	"num_attention_heads", "num_key_value_heads", "head_dim", "rms_norm_eps", "rope_theta",
	"vocab_size", "tie_word_embeddings", "max_position_embeddings", "torch_dtype", "dtype",
	"eos_token_id", "attention_bias", "mlp_bias", "hidden_act", "rope_scaling", "use_sliding_window",
}

// LoadConfig reads an HF config.json.
func LoadConfig(path string) (Config, error) {
	data, err := os.ReadFile(path)
	if err != nil {
		return Config{}, fmt.Errorf("model: %w", err)
	}
	return ParseConfig(data, path)
}

// ParseConfig parses config.json bytes; name is used in error messages.
func ParseConfig(data []byte, name string) (Config, error) {
	var raw map[string]json.RawMessage
	if err := json.Unmarshal(data, &raw); err != nil {
		return Config{}, fmt.Errorf("model: %s: %w", name, err)
	}
	var c Config
	bad := func(field, expected string, found any) error {
		return fmt.Errorf("model: %s: field %s: expected %s, found %v", name, field, expected, found)
	}
	str := func(k string) (string, bool, error) {
		v, ok := raw[k]
		if !ok || string(v) == "null" {
			return "", false, nil
		}
		var s string
		if err := json.Unmarshal(v, &s); err != nil {
			return "", false, bad(k, "a string", string(v))
		}
		return s, true, nil
	}
	intf := func(k string, required bool, dst *int) error {
		v, ok := raw[k]
		if !ok || string(v) == "null" {
			if required {
				return bad(k, "an integer", "nothing")
			}
			return nil
		}
		var f float64
		if err := json.Unmarshal(v, &f); err != nil || f != math.Trunc(f) || f < 0 || f > 1<<40 {
			return bad(k, "a non-negative integer", string(v))
		}
		*dst = int(f)
		return nil
	}
	floatf := func(k string, def float64, dst *float32) error {
		v, ok := raw[k]
		if !ok || string(v) == "null" {
			*dst = float32(def)
			return nil
		}
		var f float64
		if err := json.Unmarshal(v, &f); err != nil || !(float32(f) > 0) || math.IsInf(float64(float32(f)), 0) {
			return bad(k, "a positive number within float32 range", string(v))
		}
		*dst = float32(f)
		return nil
	}
	boolf := func(k string, dst *bool) error {
		v, ok := raw[k]
		if !ok || string(v) == "null" {
			return nil
		}
		if err := json.Unmarshal(v, dst); err != nil {
			return bad(k, "true or false", string(v))
		}
		return nil
	}

	mt, _, err := str("model_type")
	if err != nil {
		return c, err
	}
	c.Arch = Arch(mt)
	if _, ok := archClass[c.Arch]; !ok {
		return c, bad("model_type", `"qwen3" or "llama"`, fmt.Sprintf("%q", mt))
	}
	if v, ok := raw["architectures"]; ok {
		var archs []string
		if err := json.Unmarshal(v, &archs); err != nil || len(archs) != 1 || archs[0] != archClass[c.Arch] {
			return c, bad("architectures", fmt.Sprintf(`["%s"]`, archClass[c.Arch]), string(v))
		}
	}
	for _, f := range []struct {
		k   string
		dst *int
	}{
		{"hidden_size", &c.HiddenSize}, {"intermediate_size", &c.IntermediateSize},
		{"num_hidden_layers", &c.NumHiddenLayers}, {"num_attention_heads", &c.NumAttentionHeads},
		{"vocab_size", &c.VocabSize},
	} {
		if err := intf(f.k, true, f.dst); err != nil {
			return c, err
		}
	}
	c.NumKeyValueHeads = c.NumAttentionHeads
	if err := intf("num_key_value_heads", false, &c.NumKeyValueHeads); err != nil {
		return c, err
	}
	if c.NumAttentionHeads > 0 {
		c.HeadDim = c.HiddenSize / c.NumAttentionHeads
	}
	if err := intf("head_dim", false, &c.HeadDim); err != nil {
		return c, err
	}
	if err := intf("max_position_embeddings", false, &c.MaxPositionEmbeddings); err != nil {
		return c, err
	}
	if err := floatf("rms_norm_eps", 1e-6, &c.RMSNormEps); err != nil {
		return c, err
	}
	if err := floatf("rope_theta", 10000, &c.RopeTheta); err != nil {
		return c, err
	}
	if err := boolf("tie_word_embeddings", &c.TieWordEmbeddings); err != nil {
		return c, err
	}
	if s, ok, err := str("torch_dtype"); err != nil {
		return c, err
	} else if ok {
		c.TorchDType = s
	} else if s, _, err := str("dtype"); err != nil {
		return c, err
	} else {
		c.TorchDType = s
	}
	if v, ok := raw["eos_token_id"]; ok && string(v) != "null" {
		var one int32
		if err := json.Unmarshal(v, &one); err == nil {
			c.EOSTokenIDs = []int32{one}
		} else if err := json.Unmarshal(v, &c.EOSTokenIDs); err != nil {
			return c, bad("eos_token_id", "an integer or a list of integers", string(v))
		}
	}
	// Features this implementation does not have must be off, not ignored.
	for _, k := range []string{"attention_bias", "mlp_bias", "use_sliding_window"} {
		var on bool
		if err := boolf(k, &on); err != nil {
			return c, err
		}
		if on {
			return c, bad(k, "false (not supported)", true)
		}
	}
	if v, ok := raw["rope_scaling"]; ok && string(v) != "null" {
		return c, bad("rope_scaling", "null (scaled RoPE is not supported)", string(v))
	}
	if s, ok, err := str("hidden_act"); err != nil {
		return c, err
	} else if ok && s != "silu" {
		return c, bad("hidden_act", `"silu"`, fmt.Sprintf("%q", s))
	}
	c.Extra = map[string]json.RawMessage{}
	for k, v := range raw {
		c.Extra[k] = v
	}
	for _, k := range configKeys {
		delete(c.Extra, k)
	}
	if err := c.Validate(); err != nil {
		return c, fmt.Errorf("model: %s: %w", name, err)
	}
	return c, nil
}

// maxDim bounds every size in a config so that products of two sizes (a
// weight matrix) cannot overflow.
const maxDim = 1 << 24

// Validate checks the sizes for consistency.
func (c Config) Validate() error {
	if _, ok := archClass[c.Arch]; !ok {
		return fmt.Errorf("model_type: expected qwen3 or llama, found %q", c.Arch)
	}
	for _, f := range []struct {
		k string
		v int
	}{
		{"hidden_size", c.HiddenSize}, {"intermediate_size", c.IntermediateSize},
		{"num_hidden_layers", c.NumHiddenLayers}, {"num_attention_heads", c.NumAttentionHeads},
		{"num_key_value_heads", c.NumKeyValueHeads}, {"head_dim", c.HeadDim}, {"vocab_size", c.VocabSize},
	} {
		if f.v <= 0 || f.v > maxDim {
			return fmt.Errorf("field %s: expected an integer in [1, %d], found %d", f.k, maxDim, f.v)
		}
	}
	if c.NumAttentionHeads%c.NumKeyValueHeads != 0 {
		return fmt.Errorf("field num_key_value_heads: expected a divisor of num_attention_heads %d, found %d", c.NumAttentionHeads, c.NumKeyValueHeads)
	}
	if c.HeadDim%2 != 0 {
		return fmt.Errorf("field head_dim: expected an even number (rotary pairs), found %d", c.HeadDim)
	}
	if !(c.RMSNormEps > 0) || !(c.RopeTheta > 0) {
		return fmt.Errorf("fields rms_norm_eps, rope_theta: expected positive numbers, found %g, %g", c.RMSNormEps, c.RopeTheta)
	}
	return nil
}

// JSON renders the config as an HF config.json for weights stored in dtype
// (a torch dtype name such as "float32"). Extra keys are kept.
func (c Config) JSON(dtype string) ([]byte, error) {
	out := map[string]any{}
	for k, v := range c.Extra {
		out[k] = v
	}
	out["model_type"] = string(c.Arch)
	out["architectures"] = []string{archClass[c.Arch]}
	out["hidden_size"] = c.HiddenSize
	out["intermediate_size"] = c.IntermediateSize
	out["num_hidden_layers"] = c.NumHiddenLayers
	out["num_attention_heads"] = c.NumAttentionHeads
	out["num_key_value_heads"] = c.NumKeyValueHeads
	out["head_dim"] = c.HeadDim
	out["rms_norm_eps"] = c.RMSNormEps
	out["rope_theta"] = c.RopeTheta
	out["vocab_size"] = c.VocabSize
	out["tie_word_embeddings"] = c.TieWordEmbeddings
	if c.MaxPositionEmbeddings > 0 {
		out["max_position_embeddings"] = c.MaxPositionEmbeddings
	}
	out["torch_dtype"] = dtype
	out["attention_bias"] = false
	out["hidden_act"] = "silu"
	out["rope_scaling"] = nil
	if c.Arch == Llama {
		out["mlp_bias"] = false
	}
	if c.Arch == Qwen3 {
		out["use_sliding_window"] = false
	}
	switch len(c.EOSTokenIDs) {
	case 0:
	case 1:
		out["eos_token_id"] = c.EOSTokenIDs[0]
	default:
		out["eos_token_id"] = c.EOSTokenIDs
	}
	if _, ok := out["initializer_range"]; !ok {
		out["initializer_range"] = InitStd
	}
	keys := make([]string, 0, len(out))
	for k := range out {
		keys = append(keys, k)
	}
	sort.Strings(keys)
	var b bytes.Buffer
	b.WriteString("{\n")
	for i, k := range keys {
		kb, _ := json.Marshal(k)
		vb, err := json.Marshal(out[k])
		if err != nil {
			return nil, fmt.Errorf("model: config key %s: %w", k, err)
		}
		fmt.Fprintf(&b, "  %s: %s", kb, vb)
		if i < len(keys)-1 {
			b.WriteByte(',')
		}
		b.WriteByte('\n')
	}
	b.WriteString("}\n")
	return b.Bytes(), nil
}

// writeFileAtomic writes data to path through a synced temporary file.
func writeFileAtomic(path string, data []byte) error {
	tmp, err := os.CreateTemp(filepath.Dir(path), "."+filepath.Base(path)+".tmp*")
	if err != nil {
		return fmt.Errorf("model: %w", err)
	}
	if _, err := tmp.Write(data); err != nil {
		tmp.Close()
		os.Remove(tmp.Name())
		return fmt.Errorf("model: write %s: %w", path, err)
	}
	if err := tmp.Sync(); err != nil {
		tmp.Close()
		os.Remove(tmp.Name())
		return fmt.Errorf("model: write %s: %w", path, err)
	}
	if err := tmp.Close(); err != nil {
		os.Remove(tmp.Name())
		return fmt.Errorf("model: write %s: %w", path, err)
	}
	if err := os.Rename(tmp.Name(), path); err != nil {
		return fmt.Errorf("model: write %s: %w", path, err)
	}
	return nil
}
