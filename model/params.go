package model

import "fmt"

// Param is one named tensor of the flat parameter arena.
type Param struct {
	Name   string // HF name, e.g. "model.layers.0.self_attn.q_proj.weight"
	Shape  []int  // outermost first
	Offset int    // first element in the arena
	N      int    // element count
	Decay  bool   // weight decay applies (false for 1-D parameters: norm weights and biases)
	Bias   bool   // a Linear's bias (Qwen2's q/k/v): zero at InitRandom
	Router bool   // a sparse layer's router (mlp.gate.weight): frozen by freeze_moe_router
	// Buffer marks state that is no trained parameter: Nemotron-H's
	// e_score_correction_bias, which Model.UpdateExpertBias changes once
	// per step (Megatron's aux-loss-free balancing). It has no gradient,
	// no decay, no optimizer state, and is saved in fp32 whatever the
	// weights' dtype.
	Buffer bool
	// Init is how InitRandom draws the parameter (InitDefault: by its
	// shape, Bias and Buffer).
	Init InitKind

	// Group is the index in ParamTable.Groups of the unit the parameter is
	// sharded, gathered and reduce-scattered with (fully sharded data
	// parallel): its decoder layer, the embedding or the head.
	Group int
	// Flat says which of its group's two flats holds it, and FlatOffset
	// where: FlatMatrix for parameters of two or more dimensions (GEMM
	// weights, gathered in the compute precision), FlatVector for 1-D ones
	// (norm weights and biases, always fp32). Within a flat the group's
	// parameters keep their table order, contiguous, so the fused q|k|v
	// and gate|up runs stay adjacent there too.
	Flat       FlatKind
	FlatOffset int
}

// InitKind is a parameter's random initialisation (transformers'
// _init_weights for the model's family).
type InitKind uint8

const (
	// InitDefault: N(0, InitStd²) for a matrix, 1 for a 1-D parameter, 0
	// for a Bias or a Buffer.
	InitDefault InitKind = iota
	// InitALog: a Mamba-2 mixer's A_log, log(1..MH) by head.
	InitALog
	// InitDtBias: a Mamba-2 mixer's dt_bias, the inverse softplus of dt
	// drawn log-uniformly in [time_step_min, time_step_max], at least
	// time_step_floor.
	InitDtBias
	// InitConv: a depthwise conv's weight, PyTorch's Conv1d default
	// U(−1/√KW, 1/√KW).
	InitConv
)

// FlatKind names one of a ParamGroup's two flats.
type FlatKind uint8

const (
	// FlatMatrix holds a group's parameters of two or more dimensions.
	FlatMatrix FlatKind = iota
	// FlatVector holds a group's 1-D parameters.
	FlatVector
	// NumFlats is the number of flats per group.
	NumFlats
)

func (k FlatKind) String() string {
	switch k {
	case FlatMatrix:
		return "matrix"
	case FlatVector:
		return "vector"
	}
	return fmt.Sprintf("FlatKind(%d)", uint8(k))
}

// ParamGroup is the unit of fully sharded data parallelism: every parameter
// one decoder layer declares (whatever the architecture adds to a layer, an
// MoE layer's router and experts included), or the embedding, or the head
// (the final norm and, unless tied to the embedding, lm_head). Its
// parameters are a contiguous run of the table, and they are laid out again
// in two flats (Param.Flat): the unit a rank owns 1/W of, gathers before
// use and reduce-scatters gradients of.
type ParamGroup struct {
	Name  string // "embed", "layers.<N>" or "head"
	Layer int    // the decoder layer, or -1
	// First and End delimit the group's parameters: Params[First:End].
	First, End int
	// Offset and N are the group's run of the arena: [Offset, Offset+N).
	Offset, N int
	// FlatN is the element count of each flat (indexed by FlatKind).
	FlatN [NumFlats]int
}

// ParamTable lays out every parameter in one flat arena; the gradient arena
// has the same layout. Parameters are contiguous, with no gaps, in HF order
// except that a layer's q, k and v biases (Qwen2) follow its three
// projection weights side by side, so the q/k/v weights and the q/k/v biases
// are each one contiguous run, and so are gate and up: the model's fused
// projections read each run as one weight (q|k|v of shape (NH+2·NKV)·HD × C,
// gate|up of shape 2I × C). A sparse layer (Config.SparseLayer) has its
// router, mlp.gate.weight (E, C), then every expert's gate_proj and up_proj
// in expert order (mlp.experts.N.gate_proj.weight, up_proj: one run of
// shape (E, 2·Im, C), transformers v5's fused gate_up_proj), then every
// expert's down_proj (one run of shape (E, C, Im)), in place of the dense
// MLP's three weights. The HF tensors themselves are unchanged.
//
// Groups partition the table into the units of sharding (ParamGroup), in
// table order: "embed", then "layers.0" ... "layers.<L-1>", then "head". A
// parameter declared between beginGroup calls belongs to the group begun
// last, so a new kind of layer parameter is grouped, sharded and gathered
// with its layer without any code of its own.
type ParamTable struct {
	Params []Param
	Groups []ParamGroup
	Total  int
	byName map[string]int
}

// Lookup returns the named parameter.
func (t *ParamTable) Lookup(name string) (Param, bool) {
	i, ok := t.byName[name]
	if !ok {
		return Param{}, false
	}
	return t.Params[i], true
}

func (t *ParamTable) add(name string, decay bool, shape ...int) int {
	flat := FlatMatrix
	if len(shape) < 2 {
		flat = FlatVector
	}
	return t.addFlat(name, decay, flat, shape...)
}

// addFlat is add with the parameter's flat chosen: FlatVector for a tensor
// of two or more dimensions that the kernels read in fp32 whatever the
// compute precision (Nemotron-H's conv weights and routers).
func (t *ParamTable) addFlat(name string, decay bool, flat FlatKind, shape ...int) int {
	n := 1
	for _, d := range shape {
		n *= d
	}
	if _, dup := t.byName[name]; dup {
		panic("model: parameter declared twice: " + name)
	}
	if len(t.Groups) == 0 {
		panic("model: parameter declared before any group: " + name)
	}
	g := &t.Groups[len(t.Groups)-1]
	t.byName[name] = len(t.Params)
	t.Params = append(t.Params, Param{Name: name, Shape: shape, Offset: t.Total, N: n, Decay: decay,
		Group: len(t.Groups) - 1, Flat: flat, FlatOffset: g.FlatN[flat]})
	t.Total += n
	g.End, g.N = len(t.Params), g.N+n
	g.FlatN[flat] += n
	return len(t.Params) - 1
}

// beginGroup starts the next ParamGroup: parameters added from now on
// belong to it.
func (t *ParamTable) beginGroup(name string, layer int) {
	t.Groups = append(t.Groups, ParamGroup{Name: name, Layer: layer, First: len(t.Params), End: len(t.Params), Offset: t.Total})
}

// GroupOf returns the group of the named parameter.
func (t *ParamTable) GroupOf(name string) (ParamGroup, bool) {
	p, ok := t.Lookup(name)
	if !ok {
		return ParamGroup{}, false
	}
	return t.Groups[p.Group], true
}

// addBias declares a Linear's bias: 1-D, so exempt from weight decay like
// the norm weights (under both optimizer styles).
func (t *ParamTable) addBias(name string, n int) int {
	i := t.add(name, false, n)
	t.Params[i].Bias = true
	return i
}

// layerIdx are the table indices of one decoder layer's parameters (-1
// when the architecture has no such parameter).
type layerIdx struct {
	ln1, q, k, v, qBias, kBias, vBias, o, qNorm, kNorm, ln2, gate, up, down int
	// A sparse layer's router, and the first and last indices of its
	// experts' gate|up run and down run: -1 in a dense layer (and gate, up,
	// down are -1 in a sparse one). A hybrid MoE block's experts have no
	// gate: the run is their up projections.
	router, eguFirst, eguLast, edownFirst, edownLast int
	// A hybrid model's blocks (ln1 is the block's norm; attention uses q,
	// k, v, o; an MLP up and down): a Mamba-2 mixer's weights, and an MoE
	// block's selection bias, latent projections and shared expert.
	inProj, conv, convBias, dtBias, aLog, dD, mnorm, outProj int
	ebias, fc1, fc2, shUp, shDown                            int
}

// noLayer is a layerIdx with no parameters (every index -1).
func noLayer() layerIdx {
	return layerIdx{-1, -1, -1, -1, -1, -1, -1, -1, -1, -1, -1, -1, -1, -1, -1, -1, -1, -1, -1,
		-1, -1, -1, -1, -1, -1, -1, -1, -1, -1, -1, -1, -1}
}

// NewParamTable lays out cfg's parameters with HF names.
func NewParamTable(cfg Config) ParamTable {
	t, _, _ := newTable(cfg)
	return t
}

// tableIdx holds the indices of the non-layer parameters (-1 when absent).
type tableIdx struct {
	wte, norm, lmHead int
	mtp               mtpTable // a hybrid model's multi-token prediction blocks (mtp.go)
}

func newTable(cfg Config) (ParamTable, tableIdx, []layerIdx) {
	if cfg.Hybrid() {
		return newHybridTable(cfg)
	}
	C, I, HD := cfg.HiddenSize, cfg.IntermediateSize, cfg.HeadDim
	NH, NKV, V := cfg.NumAttentionHeads, cfg.NumKeyValueHeads, cfg.VocabSize
	t := ParamTable{byName: map[string]int{}}
	var ti tableIdx
	t.beginGroup("embed", -1)
	ti.wte = t.add("model.embed_tokens.weight", true, V, C)
	layers := make([]layerIdx, cfg.NumHiddenLayers)
	for l := range layers {
		p := fmt.Sprintf("model.layers.%d.", l)
		t.beginGroup(fmt.Sprintf("layers.%d", l), l)
		li := &layers[l]
		*li = noLayer()
		li.ln1 = t.add(p+"input_layernorm.weight", false, C)
		li.q = t.add(p+"self_attn.q_proj.weight", true, NH*HD, C)
		li.k = t.add(p+"self_attn.k_proj.weight", true, NKV*HD, C)
		li.v = t.add(p+"self_attn.v_proj.weight", true, NKV*HD, C)
		li.qBias, li.kBias, li.vBias = -1, -1, -1
		if cfg.QKVBias() {
			li.qBias = t.addBias(p+"self_attn.q_proj.bias", NH*HD)
			li.kBias = t.addBias(p+"self_attn.k_proj.bias", NKV*HD)
			li.vBias = t.addBias(p+"self_attn.v_proj.bias", NKV*HD)
		}
		li.o = t.add(p+"self_attn.o_proj.weight", true, C, NH*HD)
		li.qNorm, li.kNorm = -1, -1
		if cfg.QKNorm() {
			li.qNorm = t.add(p+"self_attn.q_norm.weight", false, HD)
			li.kNorm = t.add(p+"self_attn.k_norm.weight", false, HD)
		}
		li.ln2 = t.add(p+"post_attention_layernorm.weight", false, C)
		li.router, li.eguFirst, li.eguLast, li.edownFirst, li.edownLast = -1, -1, -1, -1, -1
		if !cfg.SparseLayer(l) {
			li.gate = t.add(p+"mlp.gate_proj.weight", true, I, C)
			li.up = t.add(p+"mlp.up_proj.weight", true, I, C)
			li.down = t.add(p+"mlp.down_proj.weight", true, C, I)
			continue
		}
		E, Im := cfg.MoE.NumExperts, cfg.MoE.IntermediateSize
		li.gate, li.up, li.down = -1, -1, -1
		li.router = t.add(p+"mlp.gate.weight", true, E, C)
		t.Params[li.router].Router = true
		for e := 0; e < E; e++ {
			g := t.add(fmt.Sprintf("%smlp.experts.%d.gate_proj.weight", p, e), true, Im, C)
			t.add(fmt.Sprintf("%smlp.experts.%d.up_proj.weight", p, e), true, Im, C)
			if e == 0 {
				li.eguFirst = g
			}
		}
		li.eguLast = len(t.Params) - 1
		for e := 0; e < E; e++ {
			d := t.add(fmt.Sprintf("%smlp.experts.%d.down_proj.weight", p, e), true, C, Im)
			if e == 0 {
				li.edownFirst = d
			}
		}
		li.edownLast = len(t.Params) - 1
	}
	// The fused projections (one GEMM for q|k|v, one for gate|up) read
	// these runs as single weights: keep them adjacent.
	for l, li := range layers {
		if li.k != li.q+1 || li.v != li.k+1 || (li.gate >= 0 && li.up != li.gate+1) || (li.qBias >= 0 && (li.kBias != li.qBias+1 || li.vBias != li.kBias+1)) {
			panic(fmt.Sprintf("model: layer %d: q, k, v (and their biases), gate and up must be adjacent in the parameter table", l))
		}
	}
	t.beginGroup("head", -1)
	ti.norm = t.add("model.norm.weight", false, C)
	ti.lmHead = -1
	if !cfg.TieWordEmbeddings {
		ti.lmHead = t.add("lm_head.weight", true, V, C)
	}
	return t, ti, layers
}

// ActiveParams is the number of parameters one token's forward pass uses:
// every parameter, less the experts a sparse layer does not route it to
// (E − K of them, each 3·Im·C).
func ActiveParams(cfg Config) int {
	n := NewParamTable(cfg).Total
	if m := cfg.MoE; cfg.Hybrid() {
		in := cfg.HiddenSize
		if m.LatentSize > 0 {
			in = m.LatentSize
		}
		n -= cfg.SparseLayers() * (m.NumExperts - m.TopK) * 2 * m.IntermediateSize * in
	} else if cfg.Sparse() {
		n -= cfg.SparseLayers() * (m.NumExperts - m.TopK) * 3 * m.IntermediateSize * cfg.HiddenSize
	}
	return n
}
