package model

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

// archClass is the HF class name written to architectures.
var archClass = map[Arch]string{
	Qwen2: "Qwen2ForCausalLM", Qwen3: "Qwen3ForCausalLM", Llama: "LlamaForCausalLM", Qwen3MoE: "Qwen3MoeForCausalLM",
}

// supportedArchs lists the model_type values, for error messages.
const supportedArchs = "llama, qwen2, qwen3, qwen3_moe"

// defaultRopeTheta is the rope_theta transformers' config class of each
// model_type uses when config.json states none (LlamaConfig, Qwen2Config and
// Qwen3Config, Qwen3MoeConfig, v4 and v5: 10000).
var defaultRopeTheta = map[Arch]float32{Qwen2: 10000, Qwen3: 10000, Llama: 10000, Qwen3MoE: 10000}

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

	// MoE is a sparse model's experts and router (qwen3_moe); zero for a
	// dense model.
	MoE MoE

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

// RopeScaling is a scaled RoPE: Type "llama3" (Llama 3.1/3.2/3.3) with
// transformers' _compute_llama3_parameters fields, or Type "" for none.
type RopeScaling struct {
	Type                          string
	Factor                        float64 // factor
	LowFreqFactor                 float64 // low_freq_factor
	HighFreqFactor                float64 // high_freq_factor
	OriginalMaxPositionEmbeddings int     // original_max_position_embeddings
}

// RopeLlama3 is the RopeScaling.Type of Llama 3.x.
const RopeLlama3 = "llama3"

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
}

// MoE describes a sparse model's MLP layers as transformers'
// Qwen3MoeConfig states them. A sparse layer holds a router (mlp.gate, a
// Linear from C to E without bias) and E SwiGLU experts of width
// IntermediateSize; each token goes to the TopK experts with the largest
// router probabilities (softmax over all E in fp32), and its output is
// their outputs weighted by those probabilities, renormalised over the K
// when NormTopKProb. Layer l is sparse unless it is in MLPOnlyLayers or
// (l+1) is not a multiple of DecoderSparseStep; a dense layer has the dense
// MLP of width Config.IntermediateSize.
//
// The load-balancing loss is transformers' load_balancing_loss_func (the
// Switch Transformer loss over every sparse layer's rows at once); it is
// part of the training loss when OutputRouterLogits, weighted by
// RouterAuxLossCoef, and always reported (Model.RouterLoss).
type MoE struct {
	NumExperts         int     // num_experts (or num_local_experts): E
	TopK               int     // num_experts_per_tok: K
	IntermediateSize   int     // moe_intermediate_size: an expert's width
	NormTopKProb       bool    // norm_topk_prob
	DecoderSparseStep  int     // decoder_sparse_step
	MLPOnlyLayers      []int   // mlp_only_layers
	RouterAuxLossCoef  float64 // router_aux_loss_coef
	OutputRouterLogits bool    // output_router_logits
}

// Sparse reports whether the model has sparse (mixture-of-experts) layers.
func (c Config) Sparse() bool { return c.Arch == Qwen3MoE && c.MoE.NumExperts > 0 }

// SparseLayer reports whether decoder layer l is sparse (transformers'
// Qwen3MoeDecoderLayer: not in mlp_only_layers, and (l+1) a multiple of
// decoder_sparse_step).
func (c Config) SparseLayer(l int) bool {
	m := c.MoE
	if !c.Sparse() || m.DecoderSparseStep <= 0 || (l+1)%m.DecoderSparseStep != 0 {
		return false
	}
	for _, d := range m.MLPOnlyLayers {
		if d == l {
			return false
		}
	}
	return true
}

// SparseLayers is the number of sparse layers.
func (c Config) SparseLayers() int {
	n := 0
	for l := 0; l < c.NumHiddenLayers; l++ {
		if c.SparseLayer(l) {
			n++
		}
	}
	return n
}

// QKNorm reports whether attention has Qwen3's per-head q_norm/k_norm.
func (c Config) QKNorm() bool { return c.Arch == Qwen3 || c.Arch == Qwen3MoE }

// QKVBias reports whether the q, k and v projections carry a bias (Qwen2).
func (c Config) QKVBias() bool { return c.Arch == Qwen2 }

// configKeys are the keys Config reads; JSON writes them from the fields.
var configKeys = []string{
	"model_type", "architectures", "hidden_size", "intermediate_size", "num_hidden_layers",
	"num_attention_heads", "num_key_value_heads", "head_dim", "rms_norm_eps", "rope_theta",
	"vocab_size", "tie_word_embeddings", "max_position_embeddings", "torch_dtype", "dtype",
	"eos_token_id", "mlp_bias", "hidden_act", "rope_scaling", "rope_parameters", "use_sliding_window",
}

// moeKeys are the qwen3_moe keys Config.MoE reads; JSON writes them from it.
var moeKeys = []string{
	"num_experts", "num_local_experts", "num_experts_per_tok", "moe_intermediate_size", "norm_topk_prob",
	"decoder_sparse_step", "mlp_only_layers", "router_aux_loss_coef", "output_router_logits",
}

// ropeKeys are the keys of a RoPE block that tracegrpo interprets.
var ropeKeys = map[string]bool{
	"rope_type": true, "type": true, "rope_theta": true, "factor": true, "low_freq_factor": true,
	"high_freq_factor": true, "original_max_position_embeddings": true, "partial_rotary_factor": true,
}

// The RoPE types tracegrpo implements.
const supportedRopeTypes = `"default", "llama3"`

// LoadConfig reads an HF config.json.
func LoadConfig(path string) (Config, error) {
	data, err := inputfile.ReadFile(path, inputfile.ModelConfig)
	if err != nil {
		return Config{}, fmt.Errorf("model: %w", err)
	}
	return ParseConfig(data, path)
}

// configReader reads typed fields of one JSON object, naming the file and
// the field (with its block prefix) in errors.
type configReader struct {
	name, prefix string
	raw          map[string]json.RawMessage
}

func (r configReader) bad(field, expected string, found any) error {
	return fmt.Errorf("model: %s: field %s%s: expected %s, found %v", r.name, r.prefix, field, expected, found)
}

func (r configReader) has(k string) bool {
	v, ok := r.raw[k]
	return ok && string(v) != "null"
}

func (r configReader) str(k string) (string, bool, error) {
	if !r.has(k) {
		return "", false, nil
	}
	var s string
	if err := json.Unmarshal(r.raw[k], &s); err != nil {
		return "", false, r.bad(k, "a string", string(r.raw[k]))
	}
	return s, true, nil
}

func (r configReader) intf(k string, required bool, dst *int) (bool, error) {
	if !r.has(k) {
		if required {
			return false, r.bad(k, "an integer", "nothing")
		}
		return false, nil
	}
	var f float64
	if err := json.Unmarshal(r.raw[k], &f); err != nil || f != math.Trunc(f) || f < 0 || f > 1<<40 {
		return false, r.bad(k, "a non-negative integer", string(r.raw[k]))
	}
	*dst = int(f)
	return true, nil
}

// num reads a positive number within float32 range.
func (r configReader) num(k string, required bool, dst *float64) (bool, error) {
	if !r.has(k) {
		if required {
			return false, r.bad(k, "a positive number", "nothing")
		}
		return false, nil
	}
	var f float64
	if err := json.Unmarshal(r.raw[k], &f); err != nil || !(float32(f) > 0) || math.IsInf(float64(float32(f)), 0) {
		return false, r.bad(k, "a positive number within float32 range", string(r.raw[k]))
	}
	*dst = f
	return true, nil
}

func (r configReader) boolf(k string, dst *bool) error {
	if !r.has(k) {
		return nil
	}
	if err := json.Unmarshal(r.raw[k], dst); err != nil {
		return r.bad(k, "true or false", string(r.raw[k]))
	}
	return nil
}

// ropeBlock is what one RoPE statement (top-level keys, rope_scaling or
// rope_parameters) says.
type ropeBlock struct {
	where    string // "rope_scaling", "rope_parameters" or "" (top level)
	theta    float64
	hasTheta bool
	scaling  RopeScaling
	hasType  bool // states a RoPE type ("default" and rope_scaling null count)
	null     bool // rope_scaling: null
	ignored  []string
}

// parseRopeBlock reads a rope_scaling or rope_parameters object.
func parseRopeBlock(name, where string, raw map[string]json.RawMessage) (ropeBlock, error) {
	r := configReader{name: name, prefix: where + ".", raw: raw}
	b := ropeBlock{where: where}
	for k, v := range raw {
		if len(v) > 0 && v[0] == '{' {
			return b, r.bad(k, "a number or a string (per-layer RoPE parameters are not supported)", string(v))
		}
		if !ropeKeys[k] {
			b.ignored = append(b.ignored, where+"."+k)
		}
	}
	sort.Strings(b.ignored)
	var err error
	if b.hasTheta, err = r.num("rope_theta", false, &b.theta); err != nil {
		return b, err
	}
	var prf float64
	if ok, err := r.num("partial_rotary_factor", false, &prf); err != nil {
		return b, err
	} else if ok && prf != 1 {
		return b, r.bad("partial_rotary_factor", "1 (partial rotary embeddings are not supported)", string(raw["partial_rotary_factor"]))
	}
	typeKey := "rope_type"
	typ, ok, err := r.str("rope_type")
	if err != nil {
		return b, err
	}
	if !ok {
		typeKey = "type" // transformers' older name
		if typ, ok, err = r.str("type"); err != nil {
			return b, err
		}
	}
	if !ok {
		if where == "rope_scaling" {
			return b, r.bad("rope_type", "a RoPE type ("+supportedRopeTypes+")", "nothing")
		}
		typ = "default" // transformers v5 fills rope_type "default"
	} else {
		b.hasType = true
	}
	switch typ {
	case "default":
		for _, k := range []string{"factor", "low_freq_factor", "high_freq_factor", "original_max_position_embeddings"} {
			if _, ok := raw[k]; ok {
				b.ignored = append(b.ignored, where+"."+k)
			}
		}
	case RopeLlama3:
		s := RopeScaling{Type: RopeLlama3}
		if _, err := r.num("factor", true, &s.Factor); err != nil {
			return b, err
		}
		if s.Factor < 1 {
			return b, r.bad("factor", "a number ≥ 1", string(raw["factor"]))
		}
		if _, err := r.num("low_freq_factor", true, &s.LowFreqFactor); err != nil {
			return b, err
		}
		if _, err := r.num("high_freq_factor", true, &s.HighFreqFactor); err != nil {
			return b, err
		}
		if !(s.HighFreqFactor > s.LowFreqFactor) {
			return b, r.bad("high_freq_factor", fmt.Sprintf("a number above low_freq_factor %g", s.LowFreqFactor), string(raw["high_freq_factor"]))
		}
		if _, err := r.intf("original_max_position_embeddings", true, &s.OriginalMaxPositionEmbeddings); err != nil {
			return b, err
		}
		if s.OriginalMaxPositionEmbeddings == 0 {
			return b, r.bad("original_max_position_embeddings", "a positive integer", 0)
		}
		b.scaling = s
	default:
		return b, r.bad(typeKey, "a supported RoPE type ("+supportedRopeTypes+")", fmt.Sprintf("%q, which tracegrpo does not implement", typ))
	}
	return b, nil
}

// ParseConfig parses config.json bytes; name is used in error messages.
func ParseConfig(data []byte, name string) (Config, error) {
	var raw map[string]json.RawMessage
	if err := json.Unmarshal(data, &raw); err != nil {
		return Config{}, fmt.Errorf("model: %s: %w", name, err)
	}
	var c Config
	r := configReader{name: name, raw: raw}

	mt, _, err := r.str("model_type")
	if err != nil {
		return c, err
	}
	c.Arch = Arch(mt)
	if _, ok := archClass[c.Arch]; !ok {
		return c, fmt.Errorf("model: %s: model_type %q is not supported; supported: %s", name, mt, supportedArchs)
	}
	if v, ok := raw["architectures"]; ok {
		var archs []string
		if err := json.Unmarshal(v, &archs); err != nil || len(archs) != 1 || archs[0] != archClass[c.Arch] {
			return c, r.bad("architectures", fmt.Sprintf(`["%s"]`, archClass[c.Arch]), string(v))
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
		if _, err := r.intf(f.k, true, f.dst); err != nil {
			return c, err
		}
	}
	c.NumKeyValueHeads = c.NumAttentionHeads
	if _, err := r.intf("num_key_value_heads", false, &c.NumKeyValueHeads); err != nil {
		return c, err
	}
	if c.NumAttentionHeads > 0 {
		c.HeadDim = c.HiddenSize / c.NumAttentionHeads
	}
	if _, err := r.intf("head_dim", false, &c.HeadDim); err != nil {
		return c, err
	}
	if _, err := r.intf("max_position_embeddings", false, &c.MaxPositionEmbeddings); err != nil {
		return c, err
	}
	eps := 1e-6
	if _, err := r.num("rms_norm_eps", false, &eps); err != nil {
		return c, err
	}
	c.RMSNormEps = float32(eps)
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
	if err := c.parseRope(r); err != nil {
		return c, err
	}
	if err := c.checkUnsupported(r); err != nil {
		return c, err
	}
	if c.Arch == Qwen3MoE {
		if err := c.parseMoE(r); err != nil {
			return c, err
		}
	}
	c.Extra = map[string]json.RawMessage{}
	for k, v := range raw {
		var buf bytes.Buffer
		if json.Compact(&buf, v) == nil {
			v = buf.Bytes()
		}
		c.Extra[k] = v
	}
	for _, k := range configKeys {
		delete(c.Extra, k)
	}
	if c.Arch == Qwen3MoE {
		for _, k := range moeKeys {
			delete(c.Extra, k)
		}
	}
	if c.Arch != Qwen2 {
		delete(c.Extra, "attention_bias") // interpreted (must be false) and written back
	}
	if err := c.Validate(); err != nil {
		return c, fmt.Errorf("model: %s: %w", name, err)
	}
	return c, nil
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

// Qwen3MoeConfig's defaults (transformers v4.51 and v5), for keys a
// qwen3_moe config.json leaves out.
const (
	defaultNumExperts        = 128
	defaultNumExpertsPerTok  = 8
	defaultMoEIntermediate   = 768
	defaultRouterAuxLossCoef = 0.001
)

// parseMoE reads the sparse layers' keys of a qwen3_moe config.json; a
// size it does not state takes transformers' default, and a note says so.
func (c *Config) parseMoE(r configReader) error {
	m := MoE{DecoderSparseStep: 1, RouterAuxLossCoef: defaultRouterAuxLossCoef}
	var missing []string
	var ne, nle int
	hasNE, err := r.intf("num_experts", false, &ne)
	if err != nil {
		return err
	}
	hasNLE, err := r.intf("num_local_experts", false, &nle)
	if err != nil {
		return err
	}
	switch {
	case hasNE && hasNLE && ne != nle:
		return fmt.Errorf("model: %s: fields num_experts and num_local_experts disagree: %d and %d", r.name, ne, nle)
	case hasNE:
		m.NumExperts = ne
	case hasNLE:
		m.NumExperts = nle
		c.Form.NumLocalExperts = true
	default:
		m.NumExperts = defaultNumExperts
		missing = append(missing, fmt.Sprintf("num_experts %d", defaultNumExperts))
	}
	for _, f := range []struct {
		k   string
		dst *int
		def int
	}{
		{"num_experts_per_tok", &m.TopK, defaultNumExpertsPerTok},
		{"moe_intermediate_size", &m.IntermediateSize, defaultMoEIntermediate},
	} {
		ok, err := r.intf(f.k, false, f.dst)
		if err != nil {
			return err
		}
		if !ok {
			*f.dst = f.def
			missing = append(missing, fmt.Sprintf("%s %d", f.k, f.def))
		}
	}
	if _, err := r.intf("decoder_sparse_step", false, &m.DecoderSparseStep); err != nil {
		return err
	}
	if err := r.boolf("norm_topk_prob", &m.NormTopKProb); err != nil {
		return err
	}
	if err := r.boolf("output_router_logits", &m.OutputRouterLogits); err != nil {
		return err
	}
	if r.has("router_aux_loss_coef") {
		if err := json.Unmarshal(r.raw["router_aux_loss_coef"], &m.RouterAuxLossCoef); err != nil ||
			m.RouterAuxLossCoef < 0 || math.IsInf(m.RouterAuxLossCoef, 0) {
			return r.bad("router_aux_loss_coef", "a non-negative number", string(r.raw["router_aux_loss_coef"]))
		}
	}
	if v, ok := r.raw["mlp_only_layers"]; ok && string(v) != "null" {
		if err := json.Unmarshal(v, &m.MLPOnlyLayers); err != nil {
			return r.bad("mlp_only_layers", "a list of layer indices", string(v))
		}
	}
	if len(missing) > 0 {
		c.Notes = append(c.Notes, fmt.Sprintf("%s states no %s: using transformers' Qwen3MoeConfig defaults", r.name, strings.Join(missing, ", ")))
	}
	c.MoE = m
	return nil
}

// parseRope reads RoPE from the v4 keys (rope_theta, rope_scaling), the v5
// rope_parameters block, or both, which must then agree; with neither theta,
// transformers' default for the model_type applies and a note says so.
func (c *Config) parseRope(r configReader) error {
	var blocks []ropeBlock
	var top ropeBlock
	var err error
	if top.hasTheta, err = r.num("rope_theta", false, &top.theta); err != nil {
		return err
	}
	c.Form.RopeV4 = top.hasTheta
	blocks = append(blocks, top)
	var prf float64
	if ok, err := r.num("partial_rotary_factor", false, &prf); err != nil {
		return err
	} else if ok && prf != 1 {
		return r.bad("partial_rotary_factor", "1 (partial rotary embeddings are not supported)", string(r.raw["partial_rotary_factor"]))
	}
	for _, where := range []string{"rope_scaling", "rope_parameters"} {
		v, ok := r.raw[where]
		if !ok {
			continue
		}
		if where == "rope_scaling" {
			c.Form.RopeV4 = true
		} else {
			c.Form.RopeV5 = true
		}
		if string(v) == "null" {
			if where == "rope_scaling" {
				blocks = append(blocks, ropeBlock{where: where, hasType: true, null: true}) // states "no scaling"
			}
			continue
		}
		var obj map[string]json.RawMessage
		if err := json.Unmarshal(v, &obj); err != nil || obj == nil {
			return r.bad(where, "an object or null", string(v))
		}
		for k, x := range obj {
			var buf bytes.Buffer
			if err := json.Compact(&buf, x); err == nil {
				obj[k] = buf.Bytes()
			}
		}
		b, err := parseRopeBlock(r.name, where, obj)
		if err != nil {
			return err
		}
		if len(b.ignored) > 0 {
			c.Notes = append(c.Notes, fmt.Sprintf("%s: %s not used by %q RoPE (kept in saved configs)", r.name, strings.Join(b.ignored, ", "), ropeTypeName(b.scaling.Type)))
		}
		blocks = append(blocks, b)
		if where == "rope_scaling" {
			c.Form.RopeScaling = obj
		} else {
			c.Form.RopeParameters = obj
		}
	}
	// Every statement of theta and of the scaling must agree.
	field := func(b ropeBlock, k string) string {
		if b.where == "" {
			return k
		}
		return b.where + "." + k
	}
	var theta *ropeBlock
	var scaling *ropeBlock
	for i := range blocks {
		b := &blocks[i]
		if b.hasTheta {
			if theta != nil && float32(theta.theta) != float32(b.theta) {
				return fmt.Errorf("model: %s: fields %s and %s disagree: %g and %g", r.name, field(*theta, "rope_theta"), field(*b, "rope_theta"), theta.theta, b.theta)
			}
			if theta == nil {
				theta = b
			}
		}
		if b.hasType || b.scaling.Type != "" {
			if scaling != nil {
				if err := sameScaling(r.name, *scaling, *b); err != nil {
					return err
				}
			} else {
				scaling = b
			}
		}
	}
	if theta != nil {
		c.RopeTheta = float32(theta.theta)
	} else {
		c.RopeTheta = defaultRopeTheta[c.Arch]
		c.Notes = append(c.Notes, fmt.Sprintf("%s states no rope_theta (nor rope_parameters.rope_theta): using %g, transformers' default for model_type %s",
			r.name, c.RopeTheta, c.Arch))
	}
	if scaling != nil {
		c.RopeScaling = scaling.scaling
	}
	return nil
}

// sameScaling checks that two RoPE statements give the same scaling.
func sameScaling(name string, a, b ropeBlock) error {
	fa := func(k string) string { return a.where + "." + k }
	fb := func(k string) string { return b.where + "." + k }
	if a.scaling.Type != b.scaling.Type {
		describe := func(x ropeBlock) string {
			if x.null {
				return "null (no scaling)"
			}
			return fmt.Sprintf("RoPE type %q", ropeTypeName(x.scaling.Type))
		}
		return fmt.Errorf("model: %s: fields %s and %s disagree: %s and %s", name, a.where, b.where, describe(a), describe(b))
	}
	sa, sb := a.scaling, b.scaling
	for _, f := range []struct {
		k    string
		x, y float64
	}{
		{"factor", sa.Factor, sb.Factor}, {"low_freq_factor", sa.LowFreqFactor, sb.LowFreqFactor},
		{"high_freq_factor", sa.HighFreqFactor, sb.HighFreqFactor},
		{"original_max_position_embeddings", float64(sa.OriginalMaxPositionEmbeddings), float64(sb.OriginalMaxPositionEmbeddings)},
	} {
		if f.x != f.y {
			return fmt.Errorf("model: %s: fields %s and %s disagree: %g and %g", name, fa(f.k), fb(f.k), f.x, f.y)
		}
	}
	return nil
}

func ropeTypeName(t string) string {
	if t == "" {
		return "default"
	}
	return t
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
	if _, ok := archClass[c.Arch]; !ok {
		return fmt.Errorf("model_type %q is not supported; supported: %s", c.Arch, supportedArchs)
	}
	for _, f := range []struct {
		k      string
		v, max int
	}{
		{"hidden_size", c.HiddenSize, MaxHiddenSize}, {"intermediate_size", c.IntermediateSize, MaxIntermediateSize},
		{"num_hidden_layers", c.NumHiddenLayers, MaxLayers}, {"num_attention_heads", c.NumAttentionHeads, MaxHeads},
		{"num_key_value_heads", c.NumKeyValueHeads, MaxHeads}, {"head_dim", c.HeadDim, MaxHeadDim}, {"vocab_size", c.VocabSize, MaxVocabSize},
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
	if c.Arch == Qwen3MoE {
		if err := c.MoE.validate(c.NumHiddenLayers); err != nil {
			return err
		}
	}
	switch s := c.RopeScaling; s.Type {
	case "":
	case RopeLlama3:
		if !(s.Factor >= 1) || !(s.LowFreqFactor > 0) || !(s.HighFreqFactor > s.LowFreqFactor) || s.OriginalMaxPositionEmbeddings <= 0 ||
			math.IsInf(s.Factor, 0) || math.IsInf(s.HighFreqFactor, 0) {
			return fmt.Errorf("RoPE scaling llama3: expected factor ≥ 1, 0 < low_freq_factor < high_freq_factor and original_max_position_embeddings > 0, found %+v", s)
		}
	default:
		return fmt.Errorf("RoPE type %q is not supported; supported: %s", s.Type, supportedRopeTypes)
	}
	return nil
}

// validate checks the sparse layers' sizes for L decoder layers.
func (m MoE) validate(L int) error {
	if m.NumExperts < 0 || m.NumExperts > MaxExperts {
		return fmt.Errorf("field num_experts: expected an integer in [0, %d], found %d", MaxExperts, m.NumExperts)
	}
	if m.NumExperts == 0 {
		return nil // transformers builds every layer dense
	}
	if m.TopK < 1 || m.TopK > m.NumExperts {
		return fmt.Errorf("field num_experts_per_tok: expected an integer in [1, num_experts %d], found %d", m.NumExperts, m.TopK)
	}
	if m.IntermediateSize <= 0 || m.IntermediateSize > MaxIntermediateSize {
		return fmt.Errorf("field moe_intermediate_size: expected an integer in [1, %d], found %d", MaxIntermediateSize, m.IntermediateSize)
	}
	if m.DecoderSparseStep < 1 {
		return fmt.Errorf("field decoder_sparse_step: expected a positive integer, found %d", m.DecoderSparseStep)
	}
	for i, l := range m.MLPOnlyLayers {
		if l < 0 || l >= L {
			return fmt.Errorf("field mlp_only_layers[%d]: expected a layer index in [0, %d), found %d", i, L, l)
		}
	}
	if n := L / m.DecoderSparseStep * m.NumExperts; n > MaxExpertMLPs {
		return fmt.Errorf("fields num_experts, num_hidden_layers, decoder_sparse_step: up to %d experts in all, expected at most %d", n, MaxExpertMLPs)
	}
	return nil
}

// pyFloat renders f as JSON the way Python's json writes a float (a decimal
// point even for whole numbers), so transformers reads back a float.
func pyFloat(f float64) json.RawMessage {
	b, _ := json.Marshal(f)
	if !bytes.ContainsAny(b, ".eE") {
		b = append(b, '.', '0')
	}
	return b
}

// setRopeKey sets block[k] to v unless the block already holds that value
// (then its original spelling, such as 8.0 or 8, is kept).
func setRopeKey(block map[string]json.RawMessage, k string, v json.RawMessage) {
	if old, ok := block[k]; ok {
		var a, b any
		if json.Unmarshal(old, &a) == nil && json.Unmarshal(v, &b) == nil && a == b {
			return
		}
	}
	block[k] = v
}

// ropeBlockJSON renders a rope_scaling (withTheta false) or rope_parameters
// block: the block as read with the interpreted keys set from c.
func (c Config) ropeBlockJSON(read map[string]json.RawMessage, withTheta bool) map[string]json.RawMessage {
	block := map[string]json.RawMessage{}
	for k, v := range read {
		block[k] = v
	}
	typeKey := "rope_type"
	if _, ok := block["rope_type"]; !ok {
		if _, ok := block["type"]; ok {
			typeKey = "type"
		}
	}
	typ, _ := json.Marshal(ropeTypeName(c.RopeScaling.Type))
	setRopeKey(block, typeKey, typ)
	if withTheta || block["rope_theta"] != nil {
		setRopeKey(block, "rope_theta", pyFloat(float64(c.RopeTheta)))
	}
	if s := c.RopeScaling; s.Type == RopeLlama3 {
		setRopeKey(block, "factor", pyFloat(s.Factor))
		setRopeKey(block, "low_freq_factor", pyFloat(s.LowFreqFactor))
		setRopeKey(block, "high_freq_factor", pyFloat(s.HighFreqFactor))
		om, _ := json.Marshal(s.OriginalMaxPositionEmbeddings)
		setRopeKey(block, "original_max_position_embeddings", om)
	}
	return block
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
	out["model_type"] = string(c.Arch)
	out["architectures"] = []string{archClass[c.Arch]}
	out["hidden_size"] = c.HiddenSize
	out["intermediate_size"] = c.IntermediateSize
	out["num_hidden_layers"] = c.NumHiddenLayers
	out["num_attention_heads"] = c.NumAttentionHeads
	out["num_key_value_heads"] = c.NumKeyValueHeads
	out["head_dim"] = c.HeadDim
	out["rms_norm_eps"] = c.RMSNormEps
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
	if c.Form.RopeV4 || !c.Form.RopeV5 {
		out["rope_theta"] = c.RopeTheta
		if c.RopeScaling.Type == "" && c.Form.RopeScaling == nil {
			out["rope_scaling"] = nil
		} else {
			out["rope_scaling"] = c.ropeBlockJSON(c.Form.RopeScaling, false)
		}
	}
	if c.Form.RopeV5 {
		out["rope_parameters"] = c.ropeBlockJSON(c.Form.RopeParameters, true)
	}
	out["hidden_act"] = "silu"
	switch c.Arch {
	case Qwen3:
		out["attention_bias"] = false
		out["use_sliding_window"] = false
	case Qwen3MoE:
		out["attention_bias"] = false
		out["use_sliding_window"] = false
		m := c.MoE
		if c.Form.NumLocalExperts {
			out["num_local_experts"] = m.NumExperts
		} else {
			out["num_experts"] = m.NumExperts
		}
		out["num_experts_per_tok"] = m.TopK
		out["moe_intermediate_size"] = m.IntermediateSize
		out["norm_topk_prob"] = m.NormTopKProb
		out["decoder_sparse_step"] = m.DecoderSparseStep
		out["mlp_only_layers"] = append([]int{}, m.MLPOnlyLayers...)
		out["router_aux_loss_coef"] = pyFloat(m.RouterAuxLossCoef)
		out["output_router_logits"] = m.OutputRouterLogits
	case Qwen2:
		out["use_sliding_window"] = false
	case Llama:
		out["attention_bias"] = false
		out["mlp_bias"] = false
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
