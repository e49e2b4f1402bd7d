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
			{T: T, C: C, OC: 2 * I, Backward: backward},
			{T: T, C: I, OC: C, Backward: backward},
		},
		Heads:     []kernels.Head{{T: T, C: C, V: V, Backward: backward}},
		RowNorms:  []kernels.RowNorm{{N: T, C: C, Backward: backward}},
		Attention: []kernels.Attn{{T: T, NH: NH, NKV: NKV, HD: HD, MaxLen: min(T, m.opt.MaxSeqLen), Backward: backward}},
	}
	if c.Arch == Qwen3 {
		w.RowNorms = append(w.RowNorms, kernels.RowNorm{N: T * NH, C: HD, Backward: backward},
			kernels.RowNorm{N: T * NKV, C: HD, Backward: backward})
	}
	if c.QKVBias() && backward {
		w.Biases = []kernels.GEMM{{T: T, OC: qn}, {T: T, OC: kn}}
	}
	return w
}
