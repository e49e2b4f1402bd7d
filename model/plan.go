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
	if m.cfg.Hybrid() {
		return m.hybridWorkload(backward)
	}
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
		Attention: []kernels.Attn{{T: T, NH: NH, NKV: NKV, HD: HD, MaxLen: min(T, m.opt.MaxSeqLen), Backward: backward, BF16: m.wdt == kernels.BF16}},
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

// hybridWorkload lists a hybrid model's op shapes at MaxTokens tokens:
// the head and the norms of every model, then each block kind's ops
// (hybrid_forward.go, hybrid_moe.go), once for each kind the pattern has.
func (m *Model) hybridWorkload(backward bool) kernels.Workload {
	c := m.cfg
	T, S := m.opt.MaxTokens, m.opt.MaxSeqs
	C, V := c.HiddenSize, c.VocabSize
	maxLen := min(T, m.opt.MaxSeqLen)
	w := kernels.Workload{
		Heads:    []kernels.Head{{T: T, C: C, V: V, Backward: backward, Filtered: m.headFiltered(), BF16: m.wdt == kernels.BF16}},
		RowNorms: []kernels.RowNorm{{N: T, C: C, Backward: backward}},
	}
	gemm := func(C, OC int) { w.GEMMs = append(w.GEMMs, kernels.GEMM{T: T, C: C, OC: OC, Backward: backward}) }
	if c.CountLayers(LayerMamba) > 0 {
		mc := c.Mamba
		gemm(C, mc.InProj())
		gemm(mc.DI(), C)
		w.Convs = []kernels.ConvShape{{T: T, CD: mc.CD(), KW: mc.ConvKernel, Backward: backward}}
		// The conv runs over the staged sequences' forest or the staged
		// tree: at most MaxSeqs segments (sequences or tree segments). The
		// scan runs over a tree whole (at most MaxTreeSegs segments), over
		// a forest in pieces of at most scanPieceSegs sequences (any piece
		// may hold every token).
		segs := min(S, scanPieceSegs)
		if m.opt.Tree {
			segs = max(segs, m.opt.MaxTreeSegs)
		}
		w.Scans = []kernels.ScanShape{{T: T, MaxSegs: segs, MaxLen: maxLen, MaxCtx: maxLen, Scan: c.scan(), Backward: backward}}
	}
	if c.CountLayers(LayerAttention) > 0 {
		NH, NKV, HD := c.NumAttentionHeads, c.NumKeyValueHeads, c.HeadDim
		qn, kn := NH*HD, NKV*HD
		gemm(C, qn+2*kn)
		gemm(qn, C)
		w.Attention = []kernels.Attn{{T: T, NH: NH, NKV: NKV, HD: HD, MaxLen: maxLen, Backward: backward}}
		if m.opt.Tree {
			w.Trees = []kernels.TreeAttn{{T: T, NH: NH, NKV: NKV, HD: HD, MaxLen: maxLen, MaxCtx: m.opt.MaxSeqLen, Backward: backward}}
		}
	}
	if c.CountLayers(LayerMLP) > 0 { // up, squared ReLU, down: no gate
		gemm(C, c.IntermediateSize)
		gemm(c.IntermediateSize, C)
	}
	if c.CountLayers(LayerMoE) > 0 {
		e := c.MoE
		E, K, Im, In := e.NumExperts, e.TopK, e.IntermediateSize, c.expertIn()
		gemm(C, E) // the router, in fp32
		w.Routes = []kernels.Route{{T: T, K: K, E: E}}
		if e.LatentSize > 0 {
			gemm(C, e.LatentSize)
			gemm(e.LatentSize, C)
		}
		w.Grouped = []kernels.GroupedGEMM{{N: T * K, C: In, OC: Im, E: E, Backward: backward},
			{N: T * K, C: Im, OC: In, E: E, Backward: backward}}
		gemm(C, e.SharedSize)
		gemm(e.SharedSize, C)
	}
	if c.MTP.Depths > 0 && backward { // the MTP depths' eh_proj (their blocks are the main layers' kinds)
		gemm(2*C, C)
	}
	return w
}
