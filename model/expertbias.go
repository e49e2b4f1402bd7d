package model

// Aux-loss-free load balancing: the selection biases of a hybrid model's
// routers (gate.e_score_correction_bias) as Megatron-Core updates them
// (megatron/core/transformer/moe/router.py, moe_utils.py and
// distributed/finalize_model_grads.py at Megatron-LM
// d98e8a64ddf34856e74b24714e3bedb2f5a39553; line numbers are those files'):
//
//   - every training pass counts the tokens routed to each expert of each
//     router (TopKRouter._apply_expert_bias, router.py:733-744, under
//     torch.is_grad_enabled(): not the no-gradient logprob passes, once per
//     token under recomputation). Here the count is made in the sparse
//     block's backward, which only a training pass runs and which holds
//     the block's choice however the forward was recomputed: each trained
//     token once per trace that holds it (a shared prefix of a packed tree
//     counts once per trace, Tree.Traces), padding never (tracegrpo
//     computes none);
//   - once per optimizer step, the counts of every micro-batch and rank
//     are summed (get_updated_expert_bias's all-reduce, moe_utils.py:1199-
//     1226; the caller sums the ranks) and each bias moves by
//
//     bias_e ← bias_e + rate · sign(mean − count_e),  mean = Σ_e count_e / E
//
//     in fp32 (the router keeps expert_bias in fp32, router.py:262-271),
//     with no gradient, no decay and no optimizer state (ParamTable's
//     Buffer); then the counts restart (reset_model_temporary_tensors,
//     finalize_model_grads.py:316-323).
//
// Every router with a bias counts and updates, the MTP blocks' too:
// _update_router_expert_bias walks every module of the model
// (finalize_model_grads.py:334-371), and freeze_moe_router, which only
// clears decoder.layers' router weights' requires_grad (NeMo RL
// nemo_rl/models/megatron/setup.py:1737-1739 at 7ea279abfbeb), leaves every
// bias updating (frozen_expert_bias stays False, router.py:178).

import "fmt"

// expertLoad is the tokens routed to each expert of each selection bias
// since the last TakeExpertLoad, keyed by the bias's table index; the MTP
// depths' sub-models share their parent's.
type expertLoad struct {
	counts map[int][]int64
	hOff   []int32 // (E+1) host staging of a block's offsets
	hExp   []int32 // (T·K) a tree's chosen experts
}

// load returns the model's expertLoad, made on first use.
func (m *Model) load() *expertLoad {
	if m.eload == nil {
		m.eload = &expertLoad{counts: map[int][]int64{}}
	}
	return m.eload
}

// countRouted adds sparse block l's choice in the last forward to the
// expert load (hybridMoEBackward calls it): per expert, the tokens routed
// to it, each a packed tree's Traces times. It waits for the queued work
// (the block's routing) to read it.
func (m *Model) countRouted(l int) {
	T := m.lastT
	bias := m.lidx[l].ebias
	if T == 0 || bias < 0 {
		return
	}
	E, K := m.cfg.MoE.NumExperts, m.cfg.MoE.TopK
	ld := m.load()
	c := ld.counts[bias]
	if c == nil {
		c = make([]int64, E)
		ld.counts[bias] = c
	}
	if w := m.hTraces; m.lastTree && w != nil {
		if cap(ld.hExp) < T*K {
			ld.hExp = make([]int32, T*K)
		}
		ex := ld.hExp[:T*K]
		m.b.DownloadI32(ex, m.la[l].moe.rexp.Slice(0, T*K))
		for t := range T {
			for _, e := range ex[t*K : (t+1)*K] {
				c[e] += int64(w[t])
			}
		}
		return
	}
	if cap(ld.hOff) < E+1 {
		ld.hOff = make([]int32, E+1)
	}
	off := ld.hOff[:E+1]
	m.b.DownloadI32(off, m.offsets[l])
	for e := range E {
		c[e] += int64(off[e+1] - off[e])
	}
}

// ExpertBiases are the table indices of the model's selection biases (its
// routers' e_score_correction_bias, the MTP blocks' after the main
// layers'), in table order; none for a model without them.
func (m *Model) ExpertBiases() []int {
	var out []int
	for i, p := range m.table.Params {
		if p.Buffer {
			out = append(out, i)
		}
	}
	return out
}

// TakeExpertLoad returns the tokens routed to each expert of each
// selection bias (ExpertBiases' order, NumExperts each) by the training
// passes since the last call, and restarts the count.
func (m *Model) TakeExpertLoad() [][]int64 {
	ids := m.ExpertBiases()
	out := make([][]int64, len(ids))
	E := m.cfg.MoE.NumExperts
	for j, i := range ids {
		out[j] = make([]int64, E)
		if m.eload != nil {
			if c := m.eload.counts[i]; c != nil {
				copy(out[j], c)
				clear(c)
			}
		}
	}
	return out
}

// UpdateExpertBias moves every selection bias by rate · sign(mean −
// count) from load (TakeExpertLoad's layout, summed over the step's
// micro-batches and ranks: every rank must pass the same), in fp32: a
// sharded model updates the elements it owns. The model remakes what it
// derives from the weights at the next forward.
func (m *Model) UpdateExpertBias(load [][]int64, rate float64) error {
	ids := m.ExpertBiases()
	if len(load) != len(ids) {
		return fmt.Errorf("model: update expert bias: %d loads for %d selection biases", len(load), len(ids))
	}
	E := m.cfg.MoE.NumExperts
	for j, c := range load {
		if len(c) != E {
			return fmt.Errorf("model: update expert bias: %s: %d counts for %d experts", m.table.Params[ids[j]].Name, len(c), E)
		}
	}
	if len(ids) == 0 {
		return nil
	}
	of := map[int]int{}
	for j, i := range ids {
		of[i] = j
	}
	type span struct{ j, lo, hi, at int }
	var spans []span
	if sh := m.Sharding(); sh != nil {
		for _, pc := range sh.Pieces(&m.table) {
			if j, ok := of[pc.Param]; ok {
				spans = append(spans, span{j, pc.Lo, pc.Hi, pc.At})
			}
		}
	} else {
		for j, i := range ids {
			spans = append(spans, span{j, 0, E, m.table.Params[i].Offset})
		}
	}
	r := float32(rate)
	var buf []float32
	for _, s := range spans {
		n := s.hi - s.lo
		buf = growF32(buf, n)
		dst := m.params.Slice(s.at, n)
		m.b.DownloadF32(buf, dst)
		ExpertBiasStep(buf, load[s.j], s.lo, r)
		m.b.UploadF32(dst, buf)
	}
	m.ParamsChanged()
	return m.b.Sync()
}

// ExpertBiasStep applies Megatron's get_updated_expert_bias to the
// elements [lo, lo+len(bias)) of one router's bias given its experts'
// counts: bias_e + rate·sign(mean − count_e) in fp32, the mean Σ count / E
// in fp32 as torch divides the fp32 sum (exact while the step routes fewer
// than 2^24 tokens to a router; past that Megatron's fp32 sum depends on
// its reduction order, and this rounds the exact sum once).
func ExpertBiasStep(bias []float32, count []int64, lo int, rate float32) {
	var total int64
	for _, c := range count {
		total += c
	}
	mean := float32(float32(total) / float32(len(count)))
	for i := range bias {
		off := float32(mean - float32(count[lo+i]))
		var s float32 // torch.sign: 0 at 0
		if off > 0 {
			s = 1
		} else if off < 0 {
			s = -1
		}
		bias[i] = float32(bias[i] + s*rate)
	}
}
