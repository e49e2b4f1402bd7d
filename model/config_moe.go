package model

// qwen3_moe's keys in config.json: the sparse layers' experts and router
// (Config.MoE), with transformers' Qwen3MoeConfig defaults.

import (
	"encoding/json"
	"fmt"
	"math"
	"strings"
)

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

	// Nemotron-H's sparse blocks (nemotron_h, transformers' NemotronHMoE):
	// a sigmoid router whose choice adds e_score_correction_bias, limited
	// to TopGroups of Groups groups, weights times RoutedScaling; experts
	// of up (IntermediateSize) → relu² → down; a shared expert of
	// SharedSize on the block's input; with LatentSize > 0, the routed
	// experts run in a latent space (fc1_latent_proj C → LatentSize,
	// fc2_latent_proj back).
	Sigmoid           bool    // the sigmoid router (set for nemotron_h)
	RoutedScaling     float64 // routed_scaling_factor
	Groups, TopGroups int     // n_group, topk_group
	SharedSize        int     // moe_shared_expert_intermediate_size
	LatentSize        int     // moe_latent_size (0: none)
}

// Sparse reports whether the model has sparse (mixture-of-experts) layers.
func (c Config) Sparse() bool {
	switch c.Arch {
	case Qwen3MoE:
		return c.MoE.NumExperts > 0
	case NemotronH:
		return c.CountLayers(LayerMoE) > 0
	}
	return false
}

// SparseLayer reports whether decoder layer l is sparse (transformers'
// Qwen3MoeDecoderLayer: not in mlp_only_layers, and (l+1) a multiple of
// decoder_sparse_step; a hybrid model's MoE blocks).
func (c Config) SparseLayer(l int) bool {
	if c.Hybrid() {
		return c.Layers[l] == LayerMoE
	}
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

// moeKeys are the qwen3_moe keys Config.MoE reads; JSON writes them from it.
var moeKeys = []string{
	"num_experts", "num_local_experts", "num_experts_per_tok", "moe_intermediate_size", "norm_topk_prob",
	"decoder_sparse_step", "mlp_only_layers", "router_aux_loss_coef", "output_router_logits",
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

// moeJSON sets the qwen3_moe keys in out.
func (c Config) moeJSON(out map[string]any) {
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
}
