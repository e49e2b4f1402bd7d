package model

// config.json: the keys every family shares (sizes, norms, the vocabulary,
// the dtype, the end-of-sequence ids), the refusals common to all, the
// checks of Validate and the writer JSON. RoPE is config_rope.go; each
// family's own keys are its row of families (config_family.go).

import (
	"bytes"
	"encoding/json"
	"fmt"
	"math"
	"sort"
	"strings"

	"github.com/tracegrpo/tracegrpo/internal/inputfile"
)

// Arch is a supported architecture.
type Arch string

// The supported architectures (HF model_type values).
const (
	Qwen2 Arch = "qwen2" // Qwen2, Qwen2.5, Qwen2.5-Math, DeepSeek-R1-Distill-Qwen
	Qwen3 Arch = "qwen3"
	Llama Arch = "llama" // Llama 2, Llama 3.x (with llama3 RoPE scaling)
	// Qwen3MoE is Qwen3's attention with sparse MLP layers (Qwen3-30B-A3B,
	// Qwen3-235B-A22B): see MoE.
	Qwen3MoE Arch = "qwen3_moe"
)

// Config is the subset of an HF config.json that defines the network.
// Fields the model does not use are kept in Extra and written back by JSON.
type Config struct {
	Arch                  Arch
	HiddenSize            int     // C
	IntermediateSize      int     // I
	NumHiddenLayers       int     // L
	NumAttentionHeads     int     // NH
	NumKeyValueHeads      int     // NKV
	HeadDim               int     // HD (default C/NH)
	RMSNormEps            float32 // rms_norm_eps
	RopeTheta             float32 // rope_theta, or rope_parameters.rope_theta (transformers v5)
	RopeScaling           RopeScaling
	VocabSize             int // V
	TieWordEmbeddings     bool
	MaxPositionEmbeddings int
	TorchDType            string // torch_dtype (or dtype), e.g. "bfloat16"
	EOSTokenIDs           []int32

	// MoE is a sparse model's experts and router (qwen3_moe, nemotron_h);
	// zero for a dense model.
	MoE MoE

	// Layers is a hybrid model's blocks in order (nemotron_h: Mamba-2,
	// attention, MLP, MoE); nil for the other families, whose every layer
	// is attention then an MLP (dense or sparse). Mamba is its Mamba-2
	// mixers.
	Layers []LayerKind
	Mamba  MambaConfig
	// MTP is a hybrid model's multi-token prediction (config_mtp.go).
	MTP MTP

	// Form records how config.json stated RoPE and the dtype, so that JSON
	// writes them back the same way.
	Form ConfigForm

	// Notes are things to tell the user once when the config is loaded: a
	// default that filled a value config.json did not state, keys that are
	// read but have no effect.
	Notes []string

	// Extra holds every other key of the config.json it came from.
	Extra map[string]json.RawMessage
}

// ConfigForm is how a config.json stated RoPE and the weights' dtype:
// transformers v4 writes rope_theta and rope_scaling at the top level and
// torch_dtype; v5 writes a rope_parameters block and dtype. A config may
// hold both forms, which must then agree.
type ConfigForm struct {
	RopeV4 bool // rope_theta or rope_scaling at the top level
	RopeV5 bool // rope_parameters
	// RopeScaling and RopeParameters are the keys of the rope_scaling and
	// rope_parameters objects as read (nil when absent or null). JSON writes
	// them back with the keys tracegrpo interprets set from the Config and
	// every other key unchanged.
	RopeScaling    map[string]json.RawMessage
	RopeParameters map[string]json.RawMessage
	TorchDType     bool // the dtype was stated as torch_dtype
	DType          bool // the dtype was stated as dtype
	// NumLocalExperts: the expert count was stated as num_local_experts
	// (transformers v5's Qwen3MoeConfig writes that name).
	NumLocalExperts bool
	// A nemotron_h config's spellings: Names maps each key read to the
	// name it was read by (NemotronHConfig's attribute or its __init__
	// argument); Pattern, BlockTypes and NumLayers record whether the
	// blocks were stated as hybrid_override_pattern, layers_block_type (or
	// both) and num_hidden_layers.
	Names                          map[string]string
	Pattern, BlockTypes, NumLayers bool
}

// QKNorm reports whether attention has Qwen3's per-head q_norm/k_norm.
func (c Config) QKNorm() bool { return c.Arch == Qwen3 || c.Arch == Qwen3MoE }

// QKVBias reports whether the q, k and v projections carry a bias (Qwen2).
func (c Config) QKVBias() bool { return c.Arch == Qwen2 }

// sharedKeys are the keys Config reads for every family; uniformKeys
// those of the families whose every layer is attention then an MLP. JSON
// writes them from the fields.
var (
	sharedKeys = []string{
		"model_type", "architectures", "hidden_size", "vocab_size", "tie_word_embeddings", "max_position_embeddings",
		"torch_dtype", "dtype", "eos_token_id",
	}
	uniformKeys = []string{
		"intermediate_size", "num_hidden_layers", "num_attention_heads", "num_key_value_heads", "head_dim", "rms_norm_eps",
		"rope_theta", "mlp_bias", "hidden_act", "rope_scaling", "rope_parameters", "use_sliding_window",
	}
)

// LoadConfig reads an HF config.json.
func LoadConfig(path string) (Config, error) {
	data, err := inputfile.ReadFile(path, inputfile.ModelConfig)
	if err != nil {
		return Config{}, fmt.Errorf("model: %w", err)
	}
	return ParseConfig(data, path)
}

// ParseConfig parses config.json bytes; name is used in error messages.
func ParseConfig(data []byte, name string) (Config, error) {
	var raw map[string]json.RawMessage
	if err := json.Unmarshal(StrictJSON(data), &raw); err != nil {
		return Config{}, fmt.Errorf("model: %s: %w", name, err)
	}
	var c Config
	r := configReader{name: name, raw: raw}

	mt, _, err := r.str("model_type")
	if err != nil {
		return c, err
	}
	c.Arch = Arch(mt)
	fam, ok := families[c.Arch]
	if !ok {
		return c, fmt.Errorf("model: %s: model_type %q is not supported; supported: %s", name, mt, supportedArchs)
	}
	if v, ok := raw["architectures"]; ok {
		var archs []string
		if err := json.Unmarshal(v, &archs); err != nil || len(archs) != 1 || archs[0] != fam.class {
			return c, r.bad("architectures", fmt.Sprintf(`["%s"]`, fam.class), string(v))
		}
	}
	required := []struct {
		k   string
		dst *int
	}{{"hidden_size", &c.HiddenSize}}
	if !fam.own {
		required = append(required, []struct {
			k   string
			dst *int
		}{{"intermediate_size", &c.IntermediateSize}, {"num_hidden_layers", &c.NumHiddenLayers}, {"num_attention_heads", &c.NumAttentionHeads}}...)
	}
	for _, f := range append(required, struct {
		k   string
		dst *int
	}{"vocab_size", &c.VocabSize}) {
		if _, err := r.intf(f.k, true, f.dst); err != nil {
			return c, err
		}
	}
	if _, err := r.intf("max_position_embeddings", false, &c.MaxPositionEmbeddings); err != nil {
		return c, err
	}
	if err := r.boolf("tie_word_embeddings", &c.TieWordEmbeddings); err != nil {
		return c, err
	}
	if err := c.parseDType(r); err != nil {
		return c, err
	}
	if v, ok := raw["eos_token_id"]; ok && string(v) != "null" {
		var one int32
		if err := json.Unmarshal(v, &one); err == nil {
			c.EOSTokenIDs = []int32{one}
		} else if err := json.Unmarshal(v, &c.EOSTokenIDs); err != nil {
			return c, r.bad("eos_token_id", "an integer or a list of integers", string(v))
		}
	}
	if !fam.own {
		if err := c.parseUniform(r); err != nil {
			return c, err
		}
	}
	if fam.parse != nil {
		if err := fam.parse(&c, r); err != nil {
			return c, err
		}
	}
	c.Extra = compactExtra(raw, fam)
	if !fam.own && c.Arch != Qwen2 {
		delete(c.Extra, "attention_bias") // interpreted (must be false) and written back
	}
	if err := c.Validate(); err != nil {
		return c, fmt.Errorf("model: %s: %w", name, err)
	}
	return c, nil
}

// parseUniform reads the keys of the families whose every layer is
// attention then an MLP (the heads, the norms' eps, RoPE; ParseConfig
// reads their required sizes) and refuses what their math does not
// implement.
func (c *Config) parseUniform(r configReader) error {
	c.NumKeyValueHeads = c.NumAttentionHeads
	if _, err := r.intf("num_key_value_heads", false, &c.NumKeyValueHeads); err != nil {
		return err
	}
	if c.NumAttentionHeads > 0 {
		c.HeadDim = c.HiddenSize / c.NumAttentionHeads
	}
	if _, err := r.intf("head_dim", false, &c.HeadDim); err != nil {
		return err
	}
	eps := 1e-6
	if _, err := r.num("rms_norm_eps", false, &eps); err != nil {
		return err
	}
	c.RMSNormEps = float32(eps)
	if err := c.parseRope(r); err != nil {
		return err
	}
	return c.checkUnsupported(r)
}

// parseDType reads torch_dtype and dtype (transformers v5's name for it).
func (c *Config) parseDType(r configReader) error {
	td, tok, err := r.str("torch_dtype")
	if err != nil {
		return err
	}
	d, dok, err := r.str("dtype")
	if err != nil {
		return err
	}
	if tok && dok && td != d {
		return fmt.Errorf("model: %s: fields torch_dtype and dtype disagree: %q and %q", r.name, td, d)
	}
	c.Form.TorchDType, c.Form.DType = r.has("torch_dtype"), r.has("dtype")
	c.TorchDType = td
	if !tok {
		c.TorchDType = d
	}
	return nil
}

// checkUnsupported refuses, by name, features the math does not implement,
// and notes keys that are read but have no effect.
func (c *Config) checkUnsupported(r configReader) error {
	off := []string{"mlp_bias", "use_sliding_window", "use_mrope"}
	if c.Arch != Qwen2 {
		off = append(off, "attention_bias") // Qwen2's q/k/v biases need no key
	}
	for _, k := range off {
		var on bool
		if err := r.boolf(k, &on); err != nil {
			return err
		}
		if on {
			return r.bad(k, "false (not supported)", true)
		}
	}
	if s, ok, err := r.str("hidden_act"); err != nil {
		return err
	} else if ok && s != "silu" {
		return r.bad("hidden_act", `"silu"`, fmt.Sprintf("%q", s))
	}
	if v, ok := r.raw["layer_types"]; ok && string(v) != "null" {
		var lt []string
		if err := json.Unmarshal(v, &lt); err != nil {
			return r.bad("layer_types", `a list of "full_attention"`, string(v))
		}
		for i, t := range lt {
			if t != "full_attention" {
				return r.bad(fmt.Sprintf("layer_types[%d]", i), `"full_attention" (sliding-window layers are not supported)`, fmt.Sprintf("%q", t))
			}
		}
	}
	var ignored []string
	for _, k := range []string{"sliding_window", "max_window_layers"} {
		if r.has(k) {
			ignored = append(ignored, k)
		}
	}
	if len(ignored) > 0 {
		c.Notes = append(c.Notes, fmt.Sprintf("%s: %s ignored: use_sliding_window is false (kept in saved configs)", r.name, strings.Join(ignored, ", ")))
	}
	return nil
}

// The largest sizes a config may state: what a model can be, with room to
// spare (the largest published dense models have about 130 layers, hidden
// size 16384, intermediate size 53248, 128 heads of 128 or 256 dimensions and
// vocabularies of 256k). With these caps the product of any two sizes, or
// of one with the tokens of a micro-batch (at most 2^31), fits an int64,
// and a parameter table is built in milliseconds: a million layers took
// minutes to plan, and sizes of 2^24 ran out of memory in the table.
const (
	MaxLayers           = 1024
	MaxHiddenSize       = 1 << 16
	MaxIntermediateSize = 1 << 19
	MaxHeads            = 1024
	MaxHeadDim          = 1024
	MaxVocabSize        = 1 << 22
	// MaxExperts caps num_experts, and MaxExpertMLPs the experts of all
	// sparse layers together (each is three tensors of the parameter
	// table): the largest published sparse models have 512 experts a layer
	// and about 24k in all.
	MaxExperts    = 1024
	MaxExpertMLPs = 1 << 16
)

// Validate checks the sizes for consistency.
func (c Config) Validate() error {
	fam, ok := families[c.Arch]
	if !ok {
		return fmt.Errorf("model_type %q is not supported; supported: %s", c.Arch, supportedArchs)
	}
	for _, f := range []struct {
		k      string
		v, max int
	}{
		{"hidden_size", c.HiddenSize, MaxHiddenSize}, {"vocab_size", c.VocabSize, MaxVocabSize},
	} {
		if f.v <= 0 || f.v > f.max {
			return fmt.Errorf("field %s: expected an integer in [1, %d], found %d", f.k, f.max, f.v)
		}
	}
	if !fam.own {
		if err := c.validateUniform(); err != nil {
			return err
		}
	}
	if fam.validate != nil {
		if err := fam.validate(c); err != nil {
			return err
		}
	}
	return c.validateMTP()
}

// validateUniform checks the sizes of the families whose every layer is
// attention then an MLP.
func (c Config) validateUniform() error {
	for _, f := range []struct {
		k      string
		v, max int
	}{
		{"intermediate_size", c.IntermediateSize, MaxIntermediateSize},
		{"num_hidden_layers", c.NumHiddenLayers, MaxLayers}, {"num_attention_heads", c.NumAttentionHeads, MaxHeads},
		{"num_key_value_heads", c.NumKeyValueHeads, MaxHeads}, {"head_dim", c.HeadDim, MaxHeadDim},
	} {
		if f.v <= 0 || f.v > f.max {
			return fmt.Errorf("field %s: expected an integer in [1, %d], found %d", f.k, f.max, f.v)
		}
	}
	if c.NumAttentionHeads%c.NumKeyValueHeads != 0 {
		return fmt.Errorf("field num_key_value_heads: expected a divisor of num_attention_heads %d, found %d", c.NumAttentionHeads, c.NumKeyValueHeads)
	}
	if c.HeadDim%2 != 0 {
		return fmt.Errorf("field head_dim: expected an even number (rotary pairs), found %d", c.HeadDim)
	}
	if !(c.RMSNormEps > 0) || !(c.RopeTheta > 0) || math.IsInf(float64(c.RopeTheta), 0) {
		return fmt.Errorf("fields rms_norm_eps, rope_theta: expected positive numbers, found %g, %g", c.RMSNormEps, c.RopeTheta)
	}
	return c.RopeScaling.validate()
}

// JSON renders the config as an HF config.json for weights stored in dtype
// (a torch dtype name such as "float32"). Extra keys are kept; RoPE and the
// dtype are written in the form they were read (Form), the v4 keys when
// there is none.
func (c Config) JSON(dtype string) ([]byte, error) {
	out := map[string]any{}
	for k, v := range c.Extra {
		out[k] = v
	}
	fam := families[c.Arch]
	out["model_type"] = string(c.Arch)
	out["architectures"] = []string{fam.class}
	out["hidden_size"] = c.HiddenSize
	out["vocab_size"] = c.VocabSize
	out["tie_word_embeddings"] = c.TieWordEmbeddings
	if c.MaxPositionEmbeddings > 0 {
		out["max_position_embeddings"] = c.MaxPositionEmbeddings
	}
	if c.Form.DType {
		out["dtype"] = dtype
	}
	if c.Form.TorchDType || !c.Form.DType {
		out["torch_dtype"] = dtype
	}
	if !fam.own {
		out["intermediate_size"] = c.IntermediateSize
		out["num_hidden_layers"] = c.NumHiddenLayers
		out["num_attention_heads"] = c.NumAttentionHeads
		out["num_key_value_heads"] = c.NumKeyValueHeads
		out["head_dim"] = c.HeadDim
		out["rms_norm_eps"] = c.RMSNormEps
		c.ropeJSON(out)
		out["hidden_act"] = "silu"
	}
	if fam.json != nil {
		fam.json(c, out)
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
	return PythonJSON(b.Bytes()), nil
}
