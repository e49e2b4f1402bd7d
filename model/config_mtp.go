package model

// Multi-token prediction (MTP) as Megatron-Core builds it for a hybrid
// model (megatron/core/transformer/multi_token_prediction.py and
// megatron/core/models/hybrid/hybrid_model.py at Megatron-LM
// d98e8a64ddf34856e74b24714e3bedb2f5a39553), with the layout of
// Nemotron-3-Super's Hugging Face checkpoints (Megatron-Bridge's
// NemotronHBridge at 067f987df03b8355b03192d88d70f1709fedf51a). The
// config.json keys:
//
//	num_nextn_predict_layers     the MTP blocks the checkpoint holds (Super: 1)
//	mtp_hybrid_override_pattern  each block's layers ("*E": attention, then MoE),
//	  or mtp_layers_block_type   the same as a list (["attention", "moe"])
//	mtp_use_repeated_layer       Bridge's default for the recipe key (else true)
//	mtp_loss_scaling_factor      Bridge's default for the recipe key (else 0.3)
//
// They stay in Config.Extra and are written back unchanged: transformers'
// NemotronHForCausalLM ignores them and the mtp.* weights. How many depths
// are trained, repeated or not, and whether detached, is the recipe's
// (policy.megatron_cfg.mtp_*), set with Config.WithMTP; the model holds the
// MTP blocks' parameters only then.

import (
	"encoding/json"
	"fmt"
	"slices"
	"strings"
)

// MTP is a hybrid model's multi-token prediction: what config.json says
// of the checkpoint's MTP blocks, and the training shape WithMTP sets.
type MTP struct {
	// Pattern is one MTP block's layers (mtp_hybrid_override_pattern or
	// mtp_layers_block_type); nil when config.json states none.
	Pattern []LayerKind
	// Blocks is num_nextn_predict_layers: the blocks the checkpoint holds
	// (Hub names mtp.layers.{j·len(Pattern)+b}.*).
	Blocks int
	// RepeatedDefault and ScaleDefault are what Megatron-Bridge's
	// provider_bridge takes from config.json for mtp_use_repeated_layer and
	// mtp_loss_scaling_factor (getattr with defaults true and 0.3,
	// nemotron_h_bridge.py:327-330) when the recipe does not state them.
	RepeatedDefault bool
	ScaleDefault    float64

	// Depths is the number of prediction depths trained (the recipe's
	// mtp_num_layers, D): depth d (1..D) predicts the token d+1 places
	// ahead. 0: no MTP (the model has no MTP parameters).
	Depths int
	// Repeated runs one block at every depth (mtp_use_repeated_layer):
	// its weights are shared; else each depth has a block of its own.
	Repeated bool
	// Detach is mtp_detach_heads: the MTP loss trains only the MTP
	// blocks. The main model's hidden states, the shared embedding and the
	// shared LM head get none of its gradient.
	Detach bool
}

// MTPTraining is the training shape of Config.WithMTP: the recipe's
// policy.megatron_cfg.mtp_num_layers, mtp_use_repeated_layer and
// mtp_detach_heads.
type MTPTraining struct {
	Depths   int
	Repeated bool
	Detach   bool
}

// MaxMTPDepths caps mtp_num_layers.
const MaxMTPDepths = 64

// MTPBlocks is the MTP blocks the model holds parameters for: none
// without MTP, one when Repeated, else one per depth.
func (c Config) MTPBlocks() int {
	switch {
	case c.MTP.Depths == 0:
		return 0
	case c.MTP.Repeated:
		return 1
	}
	return c.MTP.Depths
}

// WithMTP returns c training t.Depths depths of multi-token prediction
// (t.Depths 0: none), or an error naming what the checkpoint lacks.
func (c Config) WithMTP(t MTPTraining) (Config, error) {
	c.MTP.Depths, c.MTP.Repeated, c.MTP.Detach = t.Depths, t.Repeated, t.Detach
	if t.Depths == 0 {
		c.MTP.Repeated, c.MTP.Detach = false, false
		return c, nil
	}
	if err := c.validateMTP(); err != nil {
		return Config{}, fmt.Errorf("model: multi-token prediction: %w", err)
	}
	return c, nil
}

// validateMTP checks the training shape against the checkpoint's blocks.
func (c Config) validateMTP() error {
	m := c.MTP
	if m.Depths == 0 {
		return nil
	}
	if m.Depths < 0 || m.Depths > MaxMTPDepths {
		return fmt.Errorf("policy.megatron_cfg.mtp_num_layers: expected an integer in [0, %d], found %d", MaxMTPDepths, m.Depths)
	}
	if !c.Hybrid() {
		return fmt.Errorf("policy.megatron_cfg.mtp_num_layers %d: a %s model has no multi-token prediction layers (Nemotron-H's num_nextn_predict_layers and mtp_hybrid_override_pattern in config.json); training new ones is not supported", m.Depths, c.Arch)
	}
	if m.Blocks == 0 || len(m.Pattern) == 0 {
		return fmt.Errorf("policy.megatron_cfg.mtp_num_layers %d: config.json states no MTP layers (num_nextn_predict_layers %d, mtp_hybrid_override_pattern %q): the checkpoint has none to train", m.Depths, m.Blocks, Pattern(m.Pattern))
	}
	if need := c.MTPBlocks(); need != m.Blocks {
		if m.Repeated {
			return fmt.Errorf("policy.megatron_cfg.mtp_use_repeated_layer runs one MTP block at every depth, and config.json's num_nextn_predict_layers is %d: training one of %d blocks (and dropping the rest, as Megatron does) is not supported", m.Blocks, m.Blocks)
		}
		return fmt.Errorf("policy.megatron_cfg.mtp_num_layers %d without mtp_use_repeated_layer needs a block per depth; config.json's num_nextn_predict_layers is %d", m.Depths, m.Blocks)
	}
	for i, k := range m.Pattern {
		if c.CountLayers(k) == 0 {
			return fmt.Errorf("mtp_hybrid_override_pattern %q: block %d is %s, a kind the main layers (%q) have none of: not supported", Pattern(m.Pattern), i, k, Pattern(c.Layers))
		}
	}
	if len(m.Pattern)*m.Blocks+c.NumHiddenLayers > MaxLayers {
		return fmt.Errorf("num_nextn_predict_layers %d of %d layers each and %d main layers: more than %d layers", m.Blocks, len(m.Pattern), c.NumHiddenLayers, MaxLayers)
	}
	return nil
}

// parseMTP reads a nemotron_h config's MTP keys (kept in Extra). A
// pattern is required only when num_nextn_predict_layers > 0, as
// Megatron-Bridge requires it (nemotron_h_bridge.py:282-284) — and only
// once MTP is trained (WithMTP): transformers reads neither key.
func (c *Config) parseMTP(r configReader) error {
	m := MTP{RepeatedDefault: true, ScaleDefault: 0.3}
	if _, err := r.intf("num_nextn_predict_layers", false, &m.Blocks); err != nil {
		return err
	}
	if m.Blocks < 0 || m.Blocks > MaxLayers {
		return r.bad("num_nextn_predict_layers", fmt.Sprintf("an integer in [0, %d]", MaxLayers), m.Blocks)
	}
	var fromPattern, fromList []LayerKind
	if r.has("mtp_hybrid_override_pattern") {
		p, _, err := r.str("mtp_hybrid_override_pattern")
		if err != nil {
			return err
		}
		for i := 0; i < len(p); i++ {
			k := LayerKind(0)
			for _, x := range layerKinds {
				if x.char == p[i] {
					k = x.kind
				}
			}
			if k == 0 {
				return r.bad("mtp_hybrid_override_pattern", `a string of M (Mamba-2), * (attention), - (MLP) and E (MoE)`, fmt.Sprintf("%q at position %d of %q", p[i], i, p))
			}
			fromPattern = append(fromPattern, k)
		}
	}
	if r.has("mtp_layers_block_type") {
		var names []string
		if err := json.Unmarshal(r.raw["mtp_layers_block_type"], &names); err != nil {
			return r.bad("mtp_layers_block_type", `a list of "mamba", "attention", "mlp" and "moe"`, string(r.raw["mtp_layers_block_type"]))
		}
		fromList = []LayerKind{}
		for i, n := range names {
			k := LayerKind(0)
			for _, x := range layerKinds {
				if x.name == n {
					k = x.kind
				}
			}
			if k == 0 {
				return r.bad(fmt.Sprintf("mtp_layers_block_type[%d]", i), `"mamba", "attention", "mlp" or "moe"`, fmt.Sprintf("%q", n))
			}
			fromList = append(fromList, k)
		}
	}
	switch {
	case fromPattern != nil && fromList != nil && !slices.Equal(fromPattern, fromList):
		return fmt.Errorf("model: %s: fields mtp_hybrid_override_pattern and mtp_layers_block_type disagree: %q and %q", r.name, Pattern(fromPattern), Pattern(fromList))
	case fromPattern != nil:
		m.Pattern = fromPattern
	default:
		m.Pattern = fromList
	}
	if len(m.Pattern) > MaxLayers {
		return r.bad("mtp_hybrid_override_pattern", fmt.Sprintf("at most %d blocks", MaxLayers), len(m.Pattern))
	}
	if err := r.boolf("mtp_use_repeated_layer", &m.RepeatedDefault); err != nil {
		return err
	}
	if _, err := r.num("mtp_loss_scaling_factor", false, &m.ScaleDefault); err != nil {
		return err
	}
	if !(m.ScaleDefault >= 0) {
		return r.bad("mtp_loss_scaling_factor", "a number ≥ 0", m.ScaleDefault)
	}
	c.MTP = m
	if m.Blocks > 0 {
		what := fmt.Sprintf("blocks of %q", Pattern(m.Pattern))
		if len(m.Pattern) == 0 {
			what = "no mtp_hybrid_override_pattern"
		}
		c.Notes = append(c.Notes, fmt.Sprintf("%s: num_nextn_predict_layers %d: multi-token prediction layers (%s, mtp.layers.*): trained, as Megatron-Core trains them, when policy.megatron_cfg.mtp_num_layers > 0; otherwise skipped at load and not saved, as transformers' NemotronHForCausalLM does", r.name, m.Blocks, what))
	}
	return nil
}

// MTPNote says how the model trains its multi-token prediction ("" when
// it does not), for the start of a run.
func (c Config) MTPNote() string {
	m := c.MTP
	if m.Depths == 0 {
		return ""
	}
	var b strings.Builder
	fmt.Fprintf(&b, "multi-token prediction: %d depths of %q", m.Depths, Pattern(m.Pattern))
	if m.Repeated {
		b.WriteString(", one block repeated at every depth (mtp.layers.0.*)")
	} else {
		b.WriteString(", a block per depth")
	}
	if m.Detach {
		b.WriteString("; detached: the MTP loss trains the MTP blocks only")
	} else {
		b.WriteString("; not detached: the MTP loss also trains the main layers, the embedding and the LM head")
	}
	return b.String()
}
