package model

// nemotron_h's keys in config.json, read as transformers' NemotronHConfig
// reads them (src/transformers/models/nemotron_h/configuration_nemotron_h.py
// at cfeb552ef0cb77b59ff08da07698ecaad5f7b5ba) and NVIDIA's published
// configs state them: the blocks (hybrid_override_pattern or
// layers_block_type), the Mamba-2 mixers, the attention and MLP blocks, and
// the sparse blocks' sigmoid router, shared expert and latent projection.
// A key NemotronHConfig names in its __init__ (mamba_n_groups, mamba_d_conv,
// …) and the attribute it stores (n_groups, conv_kernel, …, the names
// NVIDIA's configs and transformers' save_pretrained write) are the same
// key; JSON writes each under the name it was read by. The keys that must
// be off (the biases, dropout, sliding_window) or hold the one value
// supported (the activations) are checked and kept as read, in Extra.
// Every key either
// changes the computation as transformers' NemotronHForCausalLM does, is
// refused by name, or is listed in a note as having no effect.

import (
	"encoding/json"
	"fmt"
	"math"
	"slices"
	"strings"
)

// NemotronH is Nemotron-H (NVIDIA-Nemotron-3-Nano-30B-A3B,
// Nemotron-3-Super-120B-A12B, Nemotron-Nano-9B/12B-v2): a hybrid of
// Mamba-2, attention, MLP and mixture-of-experts blocks (Config.Layers).
const NemotronH Arch = "nemotron_h"

// LayerKind is one block of a hybrid model: a pre-RMSNorm, one mixer of
// this kind, and a residual.
type LayerKind uint8

// The blocks of a hybrid model, and their pattern characters.
const (
	LayerMamba     LayerKind = iota + 1 // 'M', "mamba": a Mamba-2 mixer
	LayerAttention                      // '*', "attention": GQA without positional embeddings
	LayerMLP                            // '-', "mlp": up, squared ReLU, down
	LayerMoE                            // 'E', "moe": routed experts and a shared expert
)

var layerKinds = []struct {
	kind LayerKind
	char byte
	name string
}{{LayerMamba, 'M', "mamba"}, {LayerAttention, '*', "attention"}, {LayerMLP, '-', "mlp"}, {LayerMoE, 'E', "moe"}}

func (k LayerKind) String() string {
	for _, x := range layerKinds {
		if x.kind == k {
			return x.name
		}
	}
	return fmt.Sprintf("LayerKind(%d)", uint8(k))
}

// Pattern is the layers as hybrid_override_pattern spells them.
func Pattern(layers []LayerKind) string {
	var b strings.Builder
	for _, k := range layers {
		for _, x := range layerKinds {
			if x.kind == k {
				b.WriteByte(x.char)
			}
		}
	}
	return b.String()
}

// MambaConfig is a hybrid model's Mamba-2 mixers (transformers'
// NemotronHMamba2Mixer): in_proj from C to z (DI) | xBC (CD) | dt (MH),
// the causal depthwise conv over xBC (with a bias when ConvBias), dt =
// softplus(dt + dt_bias) clamped to [DtMin, DtMax], A = −exp(A_log), the
// scan with the D skip, the gated RMSNorm over groups of DI/Groups, and
// out_proj from DI to C. DI = Heads·HeadDim, CD = DI + 2·Groups·StateSize.
type MambaConfig struct {
	Heads      int  // mamba_num_heads: MH
	HeadDim    int  // mamba_head_dim: MP
	Groups     int  // n_groups: G, each group's B and C shared by MH/G heads
	StateSize  int  // ssm_state_size: DS
	ConvKernel int  // conv_kernel: KW
	ChunkSize  int  // chunk_size: the SSD chunk length
	ConvBias   bool // use_conv_bias
	// DtMin and DtMax are time_step_limit, the clamp of mamba_ssm's kernels
	// (the path transformers takes on a GPU, and Megatron's): dt after the
	// softplus is kept in [DtMin, DtMax]; (0, +Inf) is no clamp.
	DtMin, DtMax float64
	// TimeStepMin, TimeStepMax and TimeStepFloor shape dt_bias at random
	// initialisation only (transformers' _init_weights).
	TimeStepMin, TimeStepMax, TimeStepFloor float64
}

// DI is d_inner, Heads·HeadDim.
func (m MambaConfig) DI() int { return m.Heads * m.HeadDim }

// CD is the conv's channels, DI + 2·Groups·StateSize.
func (m MambaConfig) CD() int { return m.DI() + 2*m.Groups*m.StateSize }

// InProj is in_proj's output width: z, xBC and dt.
func (m MambaConfig) InProj() int { return m.DI() + m.CD() + m.Heads }

// Hybrid reports whether the model is a hybrid of block kinds (Layers).
func (c Config) Hybrid() bool { return c.Arch == NemotronH }

// LayerKindOf returns layer l's block kind: Layers[l] for a hybrid model,
// attention-then-MLP (LayerAttention) for the others.
func (c Config) LayerKindOf(l int) LayerKind {
	if c.Hybrid() {
		return c.Layers[l]
	}
	return LayerAttention
}

// CountLayers returns how many layers are of kind k.
func (c Config) CountLayers(k LayerKind) int {
	n := 0
	for _, x := range c.Layers {
		if x == k {
			n++
		}
	}
	return n
}

// nhKey is one interpreted nemotron_h key: its name in NVIDIA's configs and
// transformers' saved ones, and NemotronHConfig's __init__ spelling where
// it differs.
type nhKey struct{ name, alias string }

var nhKeys = []nhKey{
	{"num_attention_heads", ""}, {"num_key_value_heads", ""}, {"head_dim", ""}, {"intermediate_size", ""},
	{"layer_norm_epsilon", ""}, {"hybrid_override_pattern", ""}, {"layers_block_type", ""}, {"num_hidden_layers", ""},
	{"ssm_state_size", ""}, {"mamba_num_heads", ""}, {"n_groups", "mamba_n_groups"}, {"mamba_head_dim", ""},
	{"conv_kernel", "mamba_d_conv"}, {"chunk_size", "mamba_chunk_size"}, {"time_step_limit", "mamba_dt_limit"},
	{"use_conv_bias", "mamba_conv_bias"}, {"time_step_min", "mamba_dt_min"},
	{"time_step_max", "mamba_dt_max"}, {"time_step_floor", "mamba_dt_init_floor"},
	{"n_routed_experts", ""}, {"num_experts_per_tok", ""}, {"moe_intermediate_size", ""},
	{"moe_shared_expert_intermediate_size", ""}, {"moe_latent_size", ""}, {"routed_scaling_factor", ""},
	{"n_group", ""}, {"topk_group", ""}, {"norm_topk_prob", ""},
}

// nemotronHKeys lists every spelling of the interpreted keys (kept out of
// Config.Extra).
var nemotronHKeys = func() []string {
	var out []string
	for _, k := range nhKeys {
		out = append(out, k.name)
		if k.alias != "" {
			out = append(out, k.alias)
		}
	}
	return out
}()

// NemotronHConfig's defaults for keys a config.json leaves out.
var nhDefaults = Config{
	NumAttentionHeads: 32, NumKeyValueHeads: 8, HeadDim: 128, IntermediateSize: 21504, RMSNormEps: 1e-5,
	Mamba: MambaConfig{Heads: 128, HeadDim: 64, Groups: 8, StateSize: 128, ConvKernel: 4, ChunkSize: 128, ConvBias: true,
		DtMin: 0, DtMax: math.Inf(1), TimeStepMin: 0.001, TimeStepMax: 0.1, TimeStepFloor: 1e-4},
	MoE: MoE{NumExperts: 8, TopK: 2, IntermediateSize: 7688, SharedSize: 7688, RoutedScaling: 1, Groups: 1, TopGroups: 1, NormTopKProb: true},
}

// nhDefaultBlocks is NemotronHConfig's layers_block_type when a config
// states no blocks.
var nhDefaultBlocks = []LayerKind{LayerMamba, LayerMoE, LayerAttention, LayerMoE}

// nhReader reads nemotron_h keys under either spelling, recording which.
type nhReader struct {
	configReader
	names   map[string]string // canonical → the spelling read
	missing []string          // defaults used
}

// key returns the spelling of k present in the file (k's own when neither).
func (r *nhReader) key(k string) string {
	for _, x := range nhKeys {
		if x.name == k {
			if !r.has(k) && x.alias != "" && r.has(x.alias) {
				r.names[k] = x.alias
				return x.alias
			}
			break
		}
	}
	if r.has(k) {
		r.names[k] = k
	}
	return k
}

func (r *nhReader) int(k string, dst *int, def int) error {
	name := r.key(k)
	ok, err := r.intf(name, false, dst)
	if err != nil {
		return err
	}
	if !ok {
		*dst = def
		r.missing = append(r.missing, fmt.Sprintf("%s %d", k, def))
	}
	return nil
}

func (r *nhReader) float(k string, dst *float64, def float64) error {
	name := r.key(k)
	if !r.has(name) {
		*dst = def
		r.missing = append(r.missing, fmt.Sprintf("%s %g", k, def))
		return nil
	}
	f, ok := pyNumber(r.raw[name])
	if !ok || math.IsNaN(f) || math.IsInf(f, 0) {
		return r.bad(name, "a finite number", string(r.raw[name]))
	}
	*dst = f
	return nil
}

func (r *nhReader) bool(k string, dst *bool, def bool) error {
	name := r.key(k)
	*dst = def
	return r.boolf(name, dst)
}

// refuse fails unless key k, if stated, is off (false, 0, null, or want).
func (r *nhReader) refuse(k, what string, want any) error {
	name := r.key(k)
	if !r.has(name) {
		return nil
	}
	var v any
	if err := json.Unmarshal(r.raw[name], &v); err != nil {
		return r.bad(name, what, string(r.raw[name]))
	}
	switch x := v.(type) {
	case bool:
		if !x {
			return nil
		}
	case float64:
		if x == 0 {
			return nil
		}
	case string:
		if w, ok := want.(string); ok && x == w {
			return nil
		}
	}
	return r.bad(name, what, string(r.raw[name]))
}

// parseNemotronH reads a nemotron_h config.json's own keys.
func (c *Config) parseNemotronH(cr configReader) error {
	r := &nhReader{configReader: cr, names: map[string]string{}}
	d := nhDefaults
	if err := c.parseBlocks(r); err != nil {
		return err
	}
	for _, f := range []struct {
		k   string
		dst *int
		def int
	}{
		{"num_attention_heads", &c.NumAttentionHeads, d.NumAttentionHeads},
		{"num_key_value_heads", &c.NumKeyValueHeads, d.NumKeyValueHeads},
		{"head_dim", &c.HeadDim, d.HeadDim},
		{"intermediate_size", &c.IntermediateSize, d.IntermediateSize},
		{"ssm_state_size", &c.Mamba.StateSize, d.Mamba.StateSize},
		{"mamba_num_heads", &c.Mamba.Heads, d.Mamba.Heads},
		{"n_groups", &c.Mamba.Groups, d.Mamba.Groups},
		{"mamba_head_dim", &c.Mamba.HeadDim, d.Mamba.HeadDim},
		{"conv_kernel", &c.Mamba.ConvKernel, d.Mamba.ConvKernel},
		{"chunk_size", &c.Mamba.ChunkSize, d.Mamba.ChunkSize},
		{"n_routed_experts", &c.MoE.NumExperts, d.MoE.NumExperts},
		{"num_experts_per_tok", &c.MoE.TopK, d.MoE.TopK},
		{"moe_intermediate_size", &c.MoE.IntermediateSize, d.MoE.IntermediateSize},
		{"moe_shared_expert_intermediate_size", &c.MoE.SharedSize, d.MoE.SharedSize},
		{"n_group", &c.MoE.Groups, d.MoE.Groups},
		{"topk_group", &c.MoE.TopGroups, d.MoE.TopGroups},
	} {
		if err := r.int(f.k, f.dst, f.def); err != nil {
			return err
		}
	}
	if name := r.key("moe_latent_size"); r.has(name) {
		if _, err := r.intf(name, false, &c.MoE.LatentSize); err != nil {
			return err
		}
		if c.MoE.LatentSize == 0 {
			return r.bad(name, "a positive integer or null", 0)
		}
	}
	eps := 0.0
	for _, f := range []struct {
		k   string
		dst *float64
		def float64
	}{
		{"layer_norm_epsilon", &eps, 1e-5},
		{"time_step_min", &c.Mamba.TimeStepMin, d.Mamba.TimeStepMin},
		{"time_step_max", &c.Mamba.TimeStepMax, d.Mamba.TimeStepMax},
		{"time_step_floor", &c.Mamba.TimeStepFloor, d.Mamba.TimeStepFloor},
		{"routed_scaling_factor", &c.MoE.RoutedScaling, d.MoE.RoutedScaling},
	} {
		if err := r.float(f.k, f.dst, f.def); err != nil {
			return err
		}
	}
	c.RMSNormEps = float32(eps)
	if err := r.bool("use_conv_bias", &c.Mamba.ConvBias, d.Mamba.ConvBias); err != nil {
		return err
	}
	if err := r.bool("norm_topk_prob", &c.MoE.NormTopKProb, d.MoE.NormTopKProb); err != nil {
		return err
	}
	if err := c.parseDtLimit(r); err != nil {
		return err
	}
	for _, x := range []struct{ k, what, want string }{
		{"mlp_hidden_act", `"relu2" (the squared ReLU; other activations are not supported)`, "relu2"},
		{"mamba_hidden_act", `"silu" (the conv's activation; others are not supported)`, "silu"},
		{"attention_bias", "false (attention projections with a bias are not supported)", ""},
		{"mlp_bias", "false (MLP and expert projections with a bias are not supported)", ""},
		{"use_bias", "false (in_proj and out_proj with a bias are not supported)", ""},
		{"mamba_proj_bias", "false (Mamba projections with a bias are not supported)", ""},
		{"attention_dropout", "0 (dropout is not supported)", ""},
		{"hidden_dropout", "0 (dropout is not supported)", ""},
		{"sliding_window", "null (sliding-window attention is not supported)", ""},
	} {
		if err := r.refuse(x.k, x.what, x.want); err != nil {
			return err
		}
	}
	if err := c.parseMTP(r.configReader); err != nil {
		return err
	}
	if c.MoE.Groups > 1 && c.MoE.TopGroups > 0 && c.MoE.TopK/c.MoE.TopGroups != 2 {
		c.Notes = append(c.Notes, fmt.Sprintf("%s: n_group %d, topk_group %d: a group scores the sum of its top 2 experts, as transformers' NemotronHMoE does; Megatron-Core's group_limited_topk sums the top num_experts_per_tok/topk_group = %d and masks with −inf, not 0",
			r.name, c.MoE.Groups, c.MoE.TopGroups, c.MoE.TopK/c.MoE.TopGroups))
	}
	var ignored []string
	for _, k := range []string{"n_shared_experts", "moe_shared_expert_overlap", "expand", "residual_in_fp32", "rope_theta", "partial_rotary_factor", "norm_eps"} {
		if r.has(k) {
			ignored = append(ignored, k)
		}
	}
	if len(ignored) > 0 {
		c.Notes = append(c.Notes, fmt.Sprintf("%s: %s not used by transformers' NemotronHForCausalLM (one shared expert of moe_shared_expert_intermediate_size; d_inner = mamba_num_heads·mamba_head_dim; no positional embedding; layer_norm_epsilon for every norm) (kept in saved configs)",
			r.name, strings.Join(ignored, ", ")))
	}
	if len(r.missing) > 0 {
		c.Notes = append(c.Notes, fmt.Sprintf("%s states no %s: using transformers' NemotronHConfig defaults", r.name, strings.Join(r.missing, ", ")))
	}
	c.MoE.Sigmoid = true
	c.Form.Names = r.names
	return nil
}

// parseBlocks reads the blocks from hybrid_override_pattern or
// layers_block_type (which must then agree); with neither,
// NemotronHConfig's default. num_hidden_layers, when stated, is
// transformers' deprecated count: a mismatch is noted, the blocks win.
func (c *Config) parseBlocks(r *nhReader) error {
	var fromPattern, fromList []LayerKind
	if name := r.key("hybrid_override_pattern"); r.has(name) {
		p, _, err := r.str(name)
		if err != nil {
			return err
		}
		// Non-nil even when empty: an empty pattern is refused below, not
		// taken for an absent one (NemotronHConfig's default blocks).
		fromPattern = make([]LayerKind, 0, len(p))
		for i := 0; i < len(p); i++ {
			k := LayerKind(0)
			for _, x := range layerKinds {
				if x.char == p[i] {
					k = x.kind
				}
			}
			if k == 0 {
				return r.bad(name, `a string of M (Mamba-2), * (attention), - (MLP) and E (MoE)`, fmt.Sprintf("%q at position %d of %q", p[i], i, p))
			}
			fromPattern = append(fromPattern, k)
		}
		c.Form.Pattern = true
	}
	if name := r.key("layers_block_type"); r.has(name) {
		var names []string
		if err := json.Unmarshal(r.raw[name], &names); err != nil {
			return r.bad(name, `a list of "mamba", "attention", "mlp" and "moe"`, string(r.raw[name]))
		}
		fromList = make([]LayerKind, 0, len(names))
		for i, n := range names {
			k := LayerKind(0)
			for _, x := range layerKinds {
				if x.name == n {
					k = x.kind
				}
			}
			if k == 0 {
				return r.bad(fmt.Sprintf("%s[%d]", name, i), `"mamba", "attention", "mlp" or "moe"`, fmt.Sprintf("%q", n))
			}
			fromList = append(fromList, k)
		}
		c.Form.BlockTypes = true
	}
	switch {
	case fromPattern != nil && fromList != nil && !slices.Equal(fromPattern, fromList):
		return fmt.Errorf("model: %s: fields hybrid_override_pattern and layers_block_type disagree: %q and %q", r.name, Pattern(fromPattern), Pattern(fromList))
	case fromList != nil:
		c.Layers = fromList
	case fromPattern != nil:
		c.Layers = fromPattern
	default:
		c.Layers = slices.Clone(nhDefaultBlocks)
		r.missing = append(r.missing, fmt.Sprintf("layers_block_type %q", Pattern(nhDefaultBlocks)))
	}
	if len(c.Layers) == 0 {
		if c.Form.BlockTypes {
			return r.bad("layers_block_type", "at least one block", "[]")
		}
		return r.bad("hybrid_override_pattern", "at least one block", `""`)
	}
	c.NumHiddenLayers = len(c.Layers)
	if name := r.key("num_hidden_layers"); r.has(name) {
		var n int
		if _, err := r.intf(name, false, &n); err != nil {
			return err
		}
		c.Form.NumLayers = true
		if n != len(c.Layers) {
			c.Notes = append(c.Notes, fmt.Sprintf("%s: num_hidden_layers %d does not match the %d blocks of %q: using the blocks, as transformers does (num_hidden_layers is deprecated)",
				r.name, n, len(c.Layers), Pattern(c.Layers)))
		}
	}
	return nil
}

// parseDtLimit reads time_step_limit, a pair [min, max] (Python's json
// writes the default as [0.0, Infinity]).
func (c *Config) parseDtLimit(r *nhReader) error {
	c.Mamba.DtMin, c.Mamba.DtMax = 0, math.Inf(1)
	name := r.key("time_step_limit")
	if !r.has(name) {
		return nil
	}
	var pair []json.RawMessage
	if err := json.Unmarshal(r.raw[name], &pair); err != nil || len(pair) != 2 {
		return r.bad(name, "a pair [min, max] of numbers", string(PythonJSON(r.raw[name])))
	}
	lo, ok1 := pyNumber(pair[0])
	hi, ok2 := pyNumber(pair[1])
	if !ok1 || !ok2 || math.IsNaN(lo) || math.IsNaN(hi) || lo < 0 || math.IsInf(lo, 0) || hi < lo || float32(lo) != float32(lo) {
		return r.bad(name, "a pair [min, max] with 0 ≤ min ≤ max (max may be Infinity)", string(PythonJSON(r.raw[name])))
	}
	c.Mamba.DtMin, c.Mamba.DtMax = lo, hi
	return nil
}

// The caps of a hybrid model's sizes beyond the uniform families'.
const (
	MaxMambaHeads   = 1024
	MaxMambaHeadDim = 1024
	MaxStateSize    = 1024
	MaxConvKernel   = 16
	MaxChunkSize    = 1024
)

// validateNemotronH checks a hybrid model's sizes.
func (c Config) validateNemotronH() error {
	if n := len(c.Layers); n == 0 || n > MaxLayers || c.NumHiddenLayers != n {
		return fmt.Errorf("fields hybrid_override_pattern, num_hidden_layers: expected 1 to %d blocks, one per layer, found %d blocks and %d layers", MaxLayers, n, c.NumHiddenLayers)
	}
	for l, k := range c.Layers {
		if k < LayerMamba || k > LayerMoE {
			return fmt.Errorf("field layers_block_type[%d]: unknown block %d", l, k)
		}
	}
	check := func(fs ...struct {
		k      string
		v, max int
	}) error {
		for _, f := range fs {
			if f.v <= 0 || f.v > f.max {
				return fmt.Errorf("field %s: expected an integer in [1, %d], found %d", f.k, f.max, f.v)
			}
		}
		return nil
	}
	type f = struct {
		k      string
		v, max int
	}
	if !(c.RMSNormEps > 0) {
		return fmt.Errorf("field layer_norm_epsilon: expected a positive number, found %g", c.RMSNormEps)
	}
	if c.CountLayers(LayerAttention) > 0 {
		if err := check(f{"num_attention_heads", c.NumAttentionHeads, MaxHeads}, f{"num_key_value_heads", c.NumKeyValueHeads, MaxHeads},
			f{"head_dim", c.HeadDim, MaxHeadDim}); err != nil {
			return err
		}
		if c.NumAttentionHeads%c.NumKeyValueHeads != 0 {
			return fmt.Errorf("field num_key_value_heads: expected a divisor of num_attention_heads %d, found %d", c.NumAttentionHeads, c.NumKeyValueHeads)
		}
	}
	if c.CountLayers(LayerMLP) > 0 {
		if err := check(f{"intermediate_size", c.IntermediateSize, MaxIntermediateSize}); err != nil {
			return err
		}
	}
	if n := c.CountLayers(LayerMamba); n > 0 {
		m := c.Mamba
		if err := check(f{"mamba_num_heads", m.Heads, MaxMambaHeads}, f{"mamba_head_dim", m.HeadDim, MaxMambaHeadDim},
			f{"n_groups", m.Groups, MaxMambaHeads}, f{"ssm_state_size", m.StateSize, MaxStateSize},
			f{"conv_kernel", m.ConvKernel, MaxConvKernel}, f{"chunk_size", m.ChunkSize, MaxChunkSize}); err != nil {
			return err
		}
		if m.Heads%m.Groups != 0 {
			return fmt.Errorf("field n_groups: expected a divisor of mamba_num_heads %d, found %d", m.Heads, m.Groups)
		}
		if m.InProj() > MaxIntermediateSize {
			return fmt.Errorf("fields mamba_num_heads, mamba_head_dim, n_groups, ssm_state_size: in_proj's %d outputs exceed %d", m.InProj(), MaxIntermediateSize)
		}
		if !(m.DtMin >= 0) || !(m.DtMax >= m.DtMin) {
			return fmt.Errorf("field time_step_limit: expected 0 ≤ min ≤ max, found [%g, %g]", m.DtMin, m.DtMax)
		}
		if !(m.TimeStepMin > 0) || !(m.TimeStepMax >= m.TimeStepMin) || math.IsInf(m.TimeStepMax, 0) || !(m.TimeStepFloor >= 0) {
			return fmt.Errorf("fields time_step_min, time_step_max, time_step_floor: expected 0 < min ≤ max and floor ≥ 0, found %g, %g, %g", m.TimeStepMin, m.TimeStepMax, m.TimeStepFloor)
		}
	}
	if n := c.CountLayers(LayerMoE); n > 0 {
		m := c.MoE
		if err := check(f{"n_routed_experts", m.NumExperts, MaxExperts}, f{"moe_intermediate_size", m.IntermediateSize, MaxIntermediateSize},
			f{"moe_shared_expert_intermediate_size", m.SharedSize, MaxIntermediateSize}, f{"n_group", m.Groups, 64},
			f{"topk_group", m.TopGroups, m.Groups}); err != nil {
			return err
		}
		if m.TopK < 1 || m.TopK > m.NumExperts {
			return fmt.Errorf("field num_experts_per_tok: expected an integer in [1, n_routed_experts %d], found %d", m.NumExperts, m.TopK)
		}
		if m.NumExperts%m.Groups != 0 || (m.Groups > 1 && (m.NumExperts/m.Groups < 2 || m.TopK > m.TopGroups*(m.NumExperts/m.Groups))) {
			return fmt.Errorf("fields n_routed_experts %d, n_group %d, topk_group %d, num_experts_per_tok %d: expected groups of at least 2 experts dividing the experts, and at most topk_group·(experts per group) experts per token",
				m.NumExperts, m.Groups, m.TopGroups, m.TopK)
		}
		if m.LatentSize < 0 || m.LatentSize > MaxHiddenSize {
			return fmt.Errorf("field moe_latent_size: expected null or an integer in [1, %d], found %d", MaxHiddenSize, m.LatentSize)
		}
		if !(m.RoutedScaling > 0) || math.IsInf(m.RoutedScaling, 0) {
			return fmt.Errorf("field routed_scaling_factor: expected a positive number, found %g", m.RoutedScaling)
		}
		if t := n * m.NumExperts; t > MaxExpertMLPs {
			return fmt.Errorf("fields n_routed_experts, hybrid_override_pattern: %d experts in all, expected at most %d", t, MaxExpertMLPs)
		}
	}
	return nil
}

// nemotronHJSON sets the nemotron_h keys in out: each under the spelling it
// was read by, and a key the file did not state only when the Config's
// value differs from NemotronHConfig's default.
func (c Config) nemotronHJSON(out map[string]any) {
	d := nhDefaults
	set := func(k string, v, def any) {
		name, read := c.Form.Names[k]
		if !read {
			if fmt.Sprint(v) == fmt.Sprint(def) {
				return
			}
			name = k
		}
		out[name] = v
	}
	if c.Form.Pattern || !c.Form.BlockTypes {
		out["hybrid_override_pattern"] = Pattern(c.Layers)
	}
	if c.Form.BlockTypes {
		names := make([]string, len(c.Layers))
		for i, k := range c.Layers {
			names[i] = k.String()
		}
		out[c.formName("layers_block_type")] = names
	}
	if c.Form.NumLayers || !c.Form.BlockTypes {
		out["num_hidden_layers"] = c.NumHiddenLayers
	}
	m, e := c.Mamba, c.MoE
	set("num_attention_heads", c.NumAttentionHeads, d.NumAttentionHeads)
	set("num_key_value_heads", c.NumKeyValueHeads, d.NumKeyValueHeads)
	set("head_dim", c.HeadDim, d.HeadDim)
	set("intermediate_size", c.IntermediateSize, d.IntermediateSize)
	set("layer_norm_epsilon", c.RMSNormEps, d.RMSNormEps)
	set("ssm_state_size", m.StateSize, d.Mamba.StateSize)
	set("mamba_num_heads", m.Heads, d.Mamba.Heads)
	set("n_groups", m.Groups, d.Mamba.Groups)
	set("mamba_head_dim", m.HeadDim, d.Mamba.HeadDim)
	set("conv_kernel", m.ConvKernel, d.Mamba.ConvKernel)
	set("chunk_size", m.ChunkSize, d.Mamba.ChunkSize)
	set("use_conv_bias", m.ConvBias, d.Mamba.ConvBias)
	limit := []json.RawMessage{pyNumberJSON(m.DtMin), pyNumberJSON(m.DtMax)}
	set("time_step_limit", limit, []json.RawMessage{pyNumberJSON(d.Mamba.DtMin), pyNumberJSON(d.Mamba.DtMax)})
	set("time_step_min", pyFloat(m.TimeStepMin), pyFloat(d.Mamba.TimeStepMin))
	set("time_step_max", pyFloat(m.TimeStepMax), pyFloat(d.Mamba.TimeStepMax))
	set("time_step_floor", pyFloat(m.TimeStepFloor), pyFloat(d.Mamba.TimeStepFloor))
	set("n_routed_experts", e.NumExperts, d.MoE.NumExperts)
	set("num_experts_per_tok", e.TopK, d.MoE.TopK)
	set("moe_intermediate_size", e.IntermediateSize, d.MoE.IntermediateSize)
	set("moe_shared_expert_intermediate_size", e.SharedSize, d.MoE.SharedSize)
	var latent any
	if e.LatentSize > 0 {
		latent = e.LatentSize
	}
	set("moe_latent_size", latent, nil)
	set("routed_scaling_factor", pyFloat(e.RoutedScaling), pyFloat(d.MoE.RoutedScaling))
	set("n_group", e.Groups, d.MoE.Groups)
	set("topk_group", e.TopGroups, d.MoE.TopGroups)
	set("norm_topk_prob", e.NormTopKProb, d.MoE.NormTopKProb)
}

// formName is the spelling key k was read by, or k.
func (c Config) formName(k string) string {
	if n, ok := c.Form.Names[k]; ok {
		return n
	}
	return k
}
