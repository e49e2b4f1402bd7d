package model

import "github.com/tracegrpo/tracegrpo/kernels"

// PlanWorkload returns the ops a model built with cfg and opt runs on a
// full micro-batch (forward and, unless forward-only, backward), for a
// backend to size its own scratch with.
func PlanWorkload(cfg Config, opt Options) (kernels.Workload, error) {
	m, err := shell(cfg, opt)
	if err != nil {
		return kernels.Workload{}, err
	}
	return m.workload(!opt.ForwardOnly), nil
}

// workload lists the model's op shapes at MaxTokens tokens.
func (m *Model) workload(backward bool) kernels.Workload {
	c := m.cfg
	T := m.opt.MaxTokens
	C, I, HD, NH, NKV, V := c.HiddenSize, c.IntermediateSize, c.HeadDim, c.NumAttentionHeads, c.NumKeyValueHeads, c.VocabSize
	qn, kn := NH*HD, NKV*HD
	w := kernels.Workload{
		GEMMs: []kernels.GEMM{
			{T: T, C: C, OC: qn + 2*kn, Backward: backward},
			{T: T, C: qn, OC: C, Backward: backward},
		},
		Heads:     []kernels.Head{{T: T, C: C, V: V, Backward: backward, Filtered: m.headFiltered(), BF16: m.wdt == kernels.BF16}},
		RowNorms:  []kernels.RowNorm{{N: T, C: C, Backward: backward}},
		Attention: []kernels.Attn{{T: T, NH: NH, NKV: NKV, HD: HD, MaxLen: min(T, m.opt.MaxSeqLen), Backward: backward}},
	}
	if m.opt.Tree {
		// A context may run to MaxSeqLen tokens.
		w.Trees = []kernels.TreeAttn{{T: T, NH: NH, NKV: NKV, HD: HD, MaxLen: min(T, m.opt.MaxSeqLen), MaxCtx: m.opt.MaxSeqLen, Backward: backward}}
	}
	if c.SparseLayers() < c.NumHiddenLayers {
		w.GEMMs = append(w.GEMMs, kernels.GEMM{T: T, C: C, OC: 2 * I, Backward: backward},
			kernels.GEMM{T: T, C: I, OC: C, Backward: backward})
	}
	if c.Sparse() && c.SparseLayers() > 0 {
		addSparse(&w, c, T, backward)
	}
	if c.QKNorm() {
		w.RowNorms = append(w.RowNorms, kernels.RowNorm{N: T * NH, C: HD, Backward: backward},
			kernels.RowNorm{N: T * NKV, C: HD, Backward: backward})
	}
	if backward && !c.Hybrid() && !c.QKVBias() && HD <= kernels.QKNormRopeBackwardMaxHD { // backwardLayer's fused path
		w.QKRopes = []kernels.QKRope{{T: T, NH: NH, NKV: NKV, HD: HD, Norm: c.QKNorm()}}
	}
	if c.QKVBias() && backward {
		w.Biases = []kernels.GEMM{{T: T, OC: qn}, {T: T, OC: kn}}
	}
	if c.MTP.Depths > 0 && backward { // the MTP depths' eh_proj (the rest are the main layers' shapes)
		w.GEMMs = append(w.GEMMs, kernels.GEMM{T: T, C: 2 * C, OC: C, Backward: backward})
	}
	return w
}

// addSparse adds a sparse layer's ops on T rows to w: the router's GEMM,
// the routing, and the experts' grouped GEMMs over T·K rows.
func addSparse(w *kernels.Workload, c Config, T int, backward bool) {
	C, E, K, Im := c.HiddenSize, c.MoE.NumExperts, c.MoE.TopK, c.MoE.IntermediateSize
	w.GEMMs = append(w.GEMMs, kernels.GEMM{T: T, C: C, OC: E, Backward: backward})
	w.Grouped = append(w.Grouped, kernels.GroupedGEMM{N: T * K, C: C, OC: 2 * Im, E: E, Backward: backward},
		kernels.GroupedGEMM{N: T * K, C: Im, OC: C, E: E, Backward: backward})
	w.Routes = append(w.Routes, kernels.Route{T: T, K: K, E: E})
	w.Biases = append(w.Biases, kernels.GEMM{T: T, OC: E}) // the load-balancing loss's Σ_t probs
}
