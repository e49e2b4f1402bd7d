package trainer

// Aux-loss-free load balancing (model/expertbias.go for the model's share):
// a Nemotron-H model's selection biases move once per optimizer step by
// policy.megatron_cfg.moe_router_bias_update_rate · sign(mean − count),
// from the tokens routed to each expert by the step's training passes on
// every rank (Megatron's finalize_model_grads → _update_router_expert_bias,
// whose all-reduce spans the data-parallel ranks).
//
// freeze_moe_router (the nano-v3 recipe's) freezes the decoder layers'
// router weights only (NeMo RL nemo_rl/models/megatron/setup.py:1715-1742 at
// 7ea279abfbeb: requires_grad = False on decoder.layers[*].mlp.router.weight,
// the MTP blocks' routers untouched); the biases are buffers, not
// parameters, and keep updating (Megatron's frozen_expert_bias stays False:
// megatron/core/transformer/moe/router.py:178, checked by
// finalize_model_grads.py:354).

import "fmt"

// expertBiasSettings sets biasRate and says what the run does with the
// selection biases.
func (t *Trainer) expertBiasSettings() {
	t.biasRate = 0
	mc := &t.cfg.Policy.MegatronCfg
	if !t.modelCfg.Hybrid() || !t.modelCfg.Sparse() {
		return
	}
	if mc.Enabled {
		t.biasRate = mc.MoERouterBiasUpdateRate
	}
	if t.biasRate != 0 {
		t.logf("note: %s: the routers' selection biases (e_score_correction_bias) move by %g · sign(mean − count) each step, from the tokens routed to each expert on every rank (policy.megatron_cfg.moe_router_bias_update_rate; Megatron's aux-loss-free load balancing)",
			t.modelCfg.Arch, t.biasRate)
	} else {
		t.logf("note: %s: the routers' selection biases (e_score_correction_bias) stay as loaded (policy.megatron_cfg.moe_router_bias_update_rate 0, or megatron_cfg not enabled)", t.modelCfg.Arch)
	}
}

// updateExpertBias takes the step's expert load from the model (the
// training passes' counts, which restart whatever the rate), sums it over
// the ranks in rank order, keeps its violation for the metrics, and moves
// the selection biases by biasRate. Every rank calls it once per step.
func (t *Trainer) updateExpertBias() error {
	t.loadViolation = nil
	if len(t.model.ExpertBiases()) == 0 {
		return nil
	}
	load := t.model.TakeExpertLoad()
	all, err := gather(t, load)
	if err != nil {
		return fmt.Errorf("expert load: %w", err)
	}
	sum := all[0]
	for _, other := range all[1:] {
		for j := range sum {
			for e := range sum[j] {
				sum[j][e] += other[j][e]
			}
		}
	}
	t.loadViolation = maxViolation(sum)
	if t.biasRate == 0 {
		return nil
	}
	if err := t.model.UpdateExpertBias(sum, t.biasRate); err != nil {
		return fmt.Errorf("expert bias: %w", err)
	}
	return nil
}

// maxViolation is max over routers of max_e load_e / mean − 1 (nil when no
// router routed a token).
func maxViolation(load [][]int64) *float64 {
	var worst *float64
	for _, c := range load {
		var total, most int64
		for _, n := range c {
			total += n
			most = max(most, n)
		}
		if total == 0 {
			continue
		}
		v := float64(most)*float64(len(c))/float64(total) - 1
		if worst == nil || v > *worst {
			worst = &v
		}
	}
	return worst
}
