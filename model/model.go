package model

import (
	"errors"
	"fmt"
	"math"

	"github.com/tracegrpo/tracegrpo/internal/checked"
	"github.com/tracegrpo/tracegrpo/kernels"
)

// Options size a Model's activations once.
type Options struct {
	MaxTokens int // most tokens of one packed micro-batch (T)
	MaxSeqs   int // most sequences in one micro-batch (S); 0 means MaxTokens
	// MaxSeqLen is the longest sequence Forward accepts: the RoPE cos/sin
	// tables cover positions [0, MaxSeqLen). 0 means MaxTokens.
	MaxSeqLen int
	// Recompute keeps only each layer's input across the forward pass and
	// recomputes the layer's other activations in the backward pass
	// (activation checkpointing): about one extra forward of the decoder
	// layers per step for activation memory of C floats per token per layer
	// plus one layer's worth. Results are bit-identical.
	Recompute bool
	// Precision is how the GEMM and attention operands are stored: F32 (the
	// default; 0 means F32) or BF16, mixed precision. Under BF16 the fp32
	// master weights get a bf16 copy, made once after every change to them
	// (once per optimizer step, see ParamsChanged), and the operands of
	// every GEMM and of attention are bf16: the normed hidden states, q, k,
	// v, the attention output, the MLP's gate, up and their product, and the
	// gradients flowing into the GEMMs' and attention's backward. Everything
	// that accumulates stays fp32: the residual stream, the norms'
	// statistics, RoPE, the softmax and log-sum-exp of attention and of the
	// LM head, log-probabilities, and every gradient of a weight.
	Precision kernels.DType
	// ForwardOnly builds a model for Forward alone (scoring): no gradient
	// arena and no backward buffers, one layer's activations at a time.
	ForwardOnly bool
	// FreezeRouter leaves the sparse layers' routers untrained: Backward
	// computes no gradient for mlp.gate.weight (it stays zero, and the
	// optimizer skips those parameters: Param.Router), while the gradient
	// still flows through the routing weights into the hidden states, as
	// Megatron's freeze_moe_router does (requires_grad = False on the
	// router weight).
	FreezeRouter bool
	// Tree sizes the buffers ForwardTree needs beyond Forward's: the final
	// layer's output gathered for the LM head's pairs (MaxTokens rows of
	// C floats) and the tree's parents, subtree ends and pair rows (I32).
	// MaxSeqs then bounds a tree's segments, or MaxTreeSegs when smaller.
	Tree bool
	// MaxTreeSegs, when positive and below MaxSeqs, is the most segments
	// of a tree ForwardTree takes (0: MaxSeqs). A hybrid model's Mamba
	// scan holds a state of every head for each segment of its tree
	// (scanPieces), so a trainer packs its trees smaller.
	MaxTreeSegs int
	// HeadFilter makes the LM head's distribution NeMo RL's top-k/top-p
	// filtered one (policy.generation.top_k and top_p, kernels.TopKTopP):
	// Forward's logprob is log p_K(token), −Inf where the token is
	// filtered out, its entropy the filtered distribution's, and Backward
	// masks the gradient of filtered logits. The backend must implement
	// kernels.FilteredHead. HeadFull also keeps the unfiltered logprobs
	// (LogprobsFull) with their gradient (BackwardFull): NeMo RL's KL term
	// reads them. A reference model (NewReference) is never filtered.
	HeadFilter kernels.TopKTopP
	HeadFull   bool
}

// MaxTokens is the most tokens a micro-batch (Options.MaxTokens), a
// sequence (MaxSeqLen) or a sampler's context may hold: token positions
// and sequence offsets are int32 on every backend.
const MaxTokens = math.MaxInt32

// normalized fills Options' defaults and checks them.
func (o Options) normalized() (Options, error) {
	if o.MaxTokens <= 0 || o.MaxTokens > MaxTokens {
		return o, fmt.Errorf("model: Options.MaxTokens: expected a number in [1, %d] (token offsets are int32), found %d", MaxTokens, o.MaxTokens)
	}
	if o.MaxSeqs <= 0 {
		o.MaxSeqs = o.MaxTokens
	}
	if o.MaxTreeSegs <= 0 || o.MaxTreeSegs > o.MaxSeqs {
		o.MaxTreeSegs = o.MaxSeqs
	}
	if o.MaxSeqLen <= 0 {
		o.MaxSeqLen = o.MaxTokens
	}
	if o.MaxSeqs > MaxTokens || o.MaxSeqLen > MaxTokens {
		return o, fmt.Errorf("model: Options.MaxSeqs %d, MaxSeqLen %d: expected at most %d (positions and offsets are int32)", o.MaxSeqs, o.MaxSeqLen, MaxTokens)
	}
	switch o.Precision {
	case 0:
		o.Precision = kernels.F32
	case kernels.F32, kernels.BF16:
	default:
		return o, fmt.Errorf("model: Options.Precision: expected F32 or BF16, found %s", o.Precision)
	}
	return o, nil
}

// layerView holds one decoder layer's parameter views (or gradient views)
// in the fp32 arena. qkv, qkvBias and gu are the fused views: q, k and v
// (and their biases) are adjacent in the arena, and so are gate and up
// (NewParamTable's layout), so one GEMM computes each group.
type layerView struct {
	ln1, qBias, kBias, vBias, o, qNorm, kNorm, ln2, down kernels.Buf
	qkv, qkvBias, gu                                     kernels.Buf
	// A sparse layer's router (E,C), its experts' gate|up (E,2·Im,C) and
	// down (E,C,Im) runs (a hybrid MoE block's: up (E,Im,In), down
	// (E,In,Im)).
	router, egu, edown kernels.Buf
	// A hybrid model's blocks: a Mamba-2 mixer's, an MLP's up, and a
	// sparse block's selection bias, latent projections and shared expert.
	inProj, conv, convBias, dtBias, aLog, dD, mnorm, outProj kernels.Buf
	up, ebias, fc1, fc2, shUp, shDown                        kernels.Buf
}

// gemmWeights are one layer's GEMM weights in the precision of the GEMMs:
// views of the fp32 arena, or of its bf16 copy under mixed precision.
type gemmWeights struct {
	qkv, o, gu, down   kernels.Buf
	router, egu, edown kernels.Buf // sparse layers
	// hybrid blocks
	inProj, outProj, up, fc1, fc2, shUp, shDown kernels.Buf
}

// layerActs are the activations of one layer saved for the backward pass,
// each sized for MaxTokens rows. "w" marks the GEMM precision
// (Options.Precision); everything else is F32.
type layerActs struct {
	x     kernels.Buf // (T,C) layer input (residual stream)
	ln1   kernels.Buf // (T,C) w
	rstd1 kernels.Buf // (T)
	qraw  kernels.Buf // (T,NH,HD) q projection before q_norm (Qwen3 only)
	qrstd kernels.Buf // (T,NH) (Qwen3 only)
	kraw  kernels.Buf // (T,NKV,HD) (Qwen3 only)
	krstd kernels.Buf // (T,NKV) (Qwen3 only)
	// q32, k32: q and k in fp32 before RoPE (after the q/k norms): the
	// attention operands under F32 (the same buffers as q, k, rotated in
	// place), one layer's scratch under BF16 (RoPE then writes q, k).
	q32, k32 kernels.Buf
	q        kernels.Buf // (T,NH,HD) w
	k        kernels.Buf // (T,NKV,HD) w
	v        kernels.Buf // (T,NKV,HD) w
	att      kernels.Buf // (T,NH,HD) w
	lse      kernels.Buf // (T,NH)
	xmid     kernels.Buf // (T,C) residual after attention
	ln2      kernels.Buf // (T,C) w
	rstd2    kernels.Buf // (T)
	gu       kernels.Buf // (T,2I) w the gate|up GEMM's output: row t's gate, then its up
	h        kernels.Buf // (T,I) w silu(gate)·up
	moe      moeActs     // sparse layers, in place of gu and h
}

// moeActs are a sparse layer's activations saved for the backward pass
// (N = T·K assignments). Its offsets are per layer and never shared
// (Model.offsets): the router's statistics read them after the forward.
type moeActs struct {
	probs       kernels.Buf // (T,E) router probabilities
	rw          kernels.Buf // (T,K) routing weights
	rexp        kernels.Buf // (T,K) I32 chosen experts
	order, slot kernels.Buf // (N) I32 the permutation (kernels.Experts)
	egate, eup  kernels.Buf // (N,Im) w
	eh          kernels.Buf // (N,Im) w silu(gate)·up
	ey          kernels.Buf // (N,C) the experts' outputs, before the weighted sum
}

// workspace is the activation memory one or more models run in: a policy
// and its forward-only reference share one. last is the model whose
// Forward the activations now hold, so a Backward after another model's
// Forward is refused instead of reading the other model's activations.
type workspace struct {
	acts, actsW, ints kernels.Buf // F32 activations, GEMM-precision activations (BF16 only), I32 inputs
	last              *Model
}

// Model is a Qwen2, Qwen3 or Llama decoder on a kernels.Backend: one fp32
// parameter arena (plus its bf16 copy under mixed precision), one gradient
// arena and activations sized once for Options. A Model is driven by one
// goroutine.
type Model struct {
	b     kernels.Backend
	cfg   Config
	opt   Options
	table ParamTable
	tidx  tableIdx
	lidx  []layerIdx
	wdt   kernels.DType // Options.Precision

	// The backend's optional fused paths (nil: the core ops).
	addNorm   kernels.AddRMSNormer
	ropeConv  kernels.RopeConverter
	freshMM   kernels.FreshMatmulBackward
	matAdd    kernels.MatmulAdder // the residual adds as GEMM epilogues
	qkRope    kernels.QKNormRoper
	qkRopeBwd kernels.QKNormRopeBackwarder
	// experts runs the sparse layers (nil on a backend without them, which
	// New refuses for a sparse config); router is the layers' routing.
	experts kernels.Experts
	router  kernels.Router
	// mamba runs a hybrid model's Mamba-2 mixers and squared ReLUs (nil
	// on a backend without them, which New refuses for a hybrid config).
	mamba kernels.Mamba
	// dec is set while a Sampler prefills or decodes a hybrid model
	// (sampler_hybrid.go).
	dec *hybridDecode

	params, grads kernels.Buf // the arenas; a sharded model's shard arenas (fs.sh)
	paramsW       kernels.Buf // bf16 copy of params (BF16 only, not sharded)
	fs            *fsdp       // sharding state; nil when every parameter is here
	stale         bool        // paramsW is older than params
	forwardOnly   bool        // no gradients or backward buffers (a reference, or Options.ForwardOnly)
	ws            *workspace
	owner         *Model // the model whose workspace and RoPE tables this one borrows; nil if its own

	// RoPE tables for positions [0, ropeP), computed from the config once.
	rope             kernels.Buf // both tables
	ropeCos, ropeSin kernels.Buf // (ropeP, HD/2) each
	ropeP            int

	// Parameter and gradient views.
	wte, norm, lmHead    kernels.Buf
	dwte, dnorm, dlmHead kernels.Buf
	layers, dlayers      []layerView
	gw                   []gemmWeights // per layer
	lmHeadW              kernels.Buf   // lm_head (or the tied embedding) in GEMM precision

	// Activations.
	la               []layerActs
	hy               []hybridActs  // a hybrid model's blocks (hybrid.go)
	hs               hybridScratch // a hybrid model's shared buffers
	mtp              *mtpState     // a training model's multi-token prediction depths (mtp.go)
	qkvOut           kernels.Buf   // (T, q|k|v) F32: the fused projection's output
	fused            kernels.Buf   // (T, max(q|k|v, 2I)) w: gate|up output; packed q|k|v and gate|up gradients
	xf               kernels.Buf   // (T,C) output of the last layer
	lnf              kernels.Buf   // (T,C) w
	rstdf            kernels.Buf   // (T)
	lp, ent, lseHead kernels.Buf   // (T) logprob of targets, entropy, lse
	dlp              kernels.Buf   // (T)
	// The filtered head (Options.HeadFilter): the unfiltered logprob and
	// lse, each row's cut, and the unfiltered logprob's gradient.
	lpFull, lseFull     kernels.Buf // (T)
	cut                 kernels.Buf // (2T) I32
	dlpFull             kernels.Buf // (T) (HeadFull, with a backward)
	filtered            kernels.FilteredHead
	dx, dln, dlnf       kernels.Buf // (T,C)
	dxW                 kernels.Buf // (T,C) w: dx rounded for the GEMMs (BF16 only)
	datt, dq            kernels.Buf // (T,NH,HD)
	dattW               kernels.Buf // (T,NH,HD) w (BF16 only)
	dk, dv, dkraw       kernels.Buf // (T,NKV,HD)
	dh                  kernels.Buf // (T,I)
	tokens, pos, target kernels.Buf // (T) I32; target holds a tree's pair labels (P)
	cu                  kernels.Buf // (S+1) I32: sequence offsets, or a tree's segment offsets
	// Packed trees (Options.Tree): the pairs' final-layer rows, the tree.
	xfP                  kernels.Buf // (T,C) F32: xf's rows of the pairs (P ≤ T)
	treeParent, treeEnds kernels.Buf // (S) I32
	pairIdx              kernels.Buf // (T) I32: the pairs' rows (P ≤ T)

	// Sparse layers' scratch (N = T·K): the router's logits, the gathered
	// input rows, the experts' gate|up output (and packed gradients), and
	// the backward's gradients.
	rlogits           kernels.Buf   // (T,E)
	xp                kernels.Buf   // (N,C) w
	efused            kernels.Buf   // (N,2·Im) w
	dey               kernels.Buf   // (N,C) w
	deh, degate, deup kernels.Buf   // (N,Im)
	dxp               kernels.Buf   // (N,C)
	drw               kernels.Buf   // (T,K)
	dlogits           kernels.Buf   // (T,E) w
	offsets           []kernels.Buf // per layer (sparse only): (E+1) I32
	psum              []kernels.Buf // per layer (sparse only): (E) Σ_t probs
	auxGrad           []kernels.Buf // per layer (sparse only): (E) ∂L/∂probs of the load-balancing loss
	hOffsets          []int32       // (L·(E+1)) host staging
	hPsum             []float32     // (L·E)
	hAux, hAuxW       []float32     // (E) ∂aux/∂probs, and times the weight
	hF, hP            []float64     // (E) the loss's F and P
	routerLoss        float64       // the last Forward's load-balancing loss
	routerLossWeight  float32       // its weight in the loss Backward differentiates
	// The selection biases' expert load (expertbias.go), shared with the
	// MTP depths' sub-models, and a staged tree's Traces (T).
	eload   *expertLoad
	hTraces []int32

	// Host staging, sized once.
	hTokens, hPos, hTarget, hCu []int32
	hParent, hEnds, hAnc, hIdx  []int32     // trees only
	hForest, hFParent, hFEnds   []int32     // a hybrid model's forest of sequences (S+1, S, S)
	forestNS                    int         // the staged forest's segments
	pieces                      []scanPiece // the staged forest's scans, when more than one (scanPieces)
	hPieceOffs                  []int32     // their offsets (pieceSlots)
	hStack                      []int32
	hLp, hEnt, hDlp             []float32
	outLp, outEnt               []float32
	hLpFull, hDlpFull, outFull  []float32 // HeadFull only
	lastFull                    []float32 // the last Forward's unfiltered logprobs (HeadFull)

	// State of the last Forward, for Backward.
	lastT, lastS, lastMaxLen int
	lastInvTemp              float32
	haveForward              bool
	lastTree                 bool // the last forward was ForwardTree
	lastP, lastMaxCtx        int  // its pairs and longest context
}

// ErrForwardOnly is returned by Backward on a forward-only model.
var ErrForwardOnly = errors.New("model: Backward on a forward-only model (a reference, or Options.ForwardOnly: it has no gradients)")

// shell returns a Model with its configuration, options and parameter
// layout but no memory: New allocates from it, and PlanModel sizes with it.
func shell(cfg Config, opt Options) (*Model, error) {
	if err := cfg.Validate(); err != nil {
		return nil, fmt.Errorf("model: %w", err)
	}
	opt, err := opt.normalized()
	if err != nil {
		return nil, err
	}
	m := &Model{cfg: cfg, opt: opt, wdt: opt.Precision, forwardOnly: opt.ForwardOnly}
	m.table, m.tidx, m.lidx = newTable(cfg)
	m.router = kernels.Router{K: cfg.MoE.TopK, Norm: cfg.MoE.NormTopKProb}
	if cfg.Hybrid() {
		m.router = cfg.hybridRouter()
	}
	return m, nil
}

// New allocates a model's arenas on b. Parameters start at zero; call
// InitRandom or LoadHF.
func New(b kernels.Backend, cfg Config, opt Options) (*Model, error) {
	m, err := shell(cfg, opt)
	if err != nil {
		return nil, err
	}
	m.setBackend(b)
	if err := m.checkBackend(); err != nil {
		return nil, err
	}
	if err := m.checkFilter(); err != nil {
		return nil, err
	}
	sz, p, err := m.sizes()
	if err != nil {
		return nil, err
	}
	if err := m.allocWeights(sz); err != nil {
		return nil, err
	}
	if sz.grads > 0 {
		if m.grads, err = b.Alloc(kernels.F32, sz.grads); err != nil {
			m.Close()
			return nil, fmt.Errorf("model: gradient arena of %d floats: %w", sz.grads, err)
		}
	}
	m.views()
	ws := &workspace{}
	m.ws = ws
	if ws.acts, err = b.Alloc(kernels.F32, sz.acts); err != nil {
		m.Close()
		return nil, fmt.Errorf("model: activations of %d floats for %d tokens: %w", sz.acts, m.opt.MaxTokens, err)
	}
	if sz.actsW > 0 {
		if ws.actsW, err = b.Alloc(m.wdt, sz.actsW); err != nil {
			m.Close()
			return nil, fmt.Errorf("model: %s activations of %d elements for %d tokens: %w", m.wdt, sz.actsW, m.opt.MaxTokens, err)
		}
	}
	if ws.ints, err = b.Alloc(kernels.I32, sz.ints); err != nil {
		m.Close()
		return nil, fmt.Errorf("model: token buffers: %w", err)
	}
	p.cut(m, ws)
	if err := m.ensureRope(m.opt.MaxSeqLen); err != nil {
		m.Close()
		return nil, err
	}
	m.hostStaging()
	return m, nil
}

// NewReference returns a forward-only copy of policy with its current
// weights, frozen: the KL penalty's reference policy. It allocates its
// weights (and their bf16 copy under mixed precision) and nothing else: no
// gradient arena, no activations of its own. It runs in the policy's
// activation memory and RoPE tables, so a reference Forward between the
// policy's Forward and Backward makes that Backward fail (ErrNoForward):
// run the reference before the policy's training forward, as the trainer
// does. policy must stay open while the reference is used.
func NewReference(policy *Model) (*Model, error) {
	if policy.forwardOnly {
		return nil, errors.New("model: NewReference of a reference model")
	}
	if policy.fs != nil {
		return newShardedReference(policy)
	}
	m, err := shell(policy.cfg, unfiltered(policy.opt))
	if err != nil {
		return nil, err
	}
	m.setBackend(policy.b)
	m.forwardOnly, m.owner = true, policy
	sz, p, err := m.sizes()
	if err != nil {
		return nil, err
	}
	if sz.acts > policy.ws.acts.N || sz.actsW > policy.ws.actsW.N || sz.ints > policy.ws.ints.N {
		return nil, fmt.Errorf("model: reference activations (%d, %d, %d elements) exceed the policy's workspace (%d, %d, %d)",
			sz.acts, sz.actsW, sz.ints, policy.ws.acts.N, policy.ws.actsW.N, policy.ws.ints.N)
	}
	if err := m.allocWeights(sz); err != nil {
		return nil, err
	}
	m.b.Copy(m.params, policy.params)
	m.stale = true
	m.views()
	m.ws = policy.ws
	p.cut(m, policy.ws)
	m.hostStaging()
	return m, nil
}

// setBackend sets the backend and finds its optional fused paths.
func (m *Model) setBackend(b kernels.Backend) {
	m.b = b
	m.addNorm, _ = b.(kernels.AddRMSNormer)
	m.ropeConv, _ = b.(kernels.RopeConverter)
	m.freshMM, _ = b.(kernels.FreshMatmulBackward)
	m.matAdd, _ = b.(kernels.MatmulAdder)
	m.qkRope, _ = b.(kernels.QKNormRoper)
	m.qkRopeBwd, _ = b.(kernels.QKNormRopeBackwarder)
	m.experts, _ = b.(kernels.Experts)
	m.filtered, _ = b.(kernels.FilteredHead)
	m.mamba, _ = b.(kernels.Mamba)
}

// headFiltered reports whether the LM head runs under a top-k/top-p
// filter; headFull whether it also keeps the unfiltered logprobs.
func (m *Model) headFiltered() bool { return m.opt.HeadFilter.On(m.cfg.VocabSize) }
func (m *Model) headFull() bool     { return m.headFiltered() && m.opt.HeadFull }

// checkFilter refuses a filtered head on a backend without one, and a
// top_k above the vocabulary (NeMo RL's torch.topk raises there).
func (m *Model) checkFilter() error {
	f := m.opt.HeadFilter
	if f.TopK > m.cfg.VocabSize {
		return fmt.Errorf("model: top-k %d exceeds the vocabulary of %d tokens (NeMo RL's torch.topk raises on it)", f.TopK, m.cfg.VocabSize)
	}
	if m.headFiltered() && m.filtered == nil {
		return fmt.Errorf("model: the %s backend has no filtered LM head (kernels.FilteredHead): it cannot compute NeMo RL's top-k/top-p log-probabilities", m.b.Name())
	}
	return nil
}

// unfiltered is opt without the head's filter: a reference model's
// (NeMo RL computes the reference policy's logprobs unfiltered,
// dtensor_policy_worker.py use_reference_model, lines 1775-1815).
func unfiltered(opt Options) Options {
	opt.HeadFilter, opt.HeadFull = kernels.TopKTopP{}, false
	return opt
}

// checkBackend refuses, naming the backend and the family, a config whose
// layers need ops the backend lacks.
func (m *Model) checkBackend() error {
	if m.cfg.Sparse() && m.experts == nil {
		return fmt.Errorf("model: the %s backend has no sparse-layer ops (kernels.Experts): it cannot run %s", m.b.Name(), m.cfg.Arch)
	}
	if m.cfg.Hybrid() && m.mamba == nil {
		return fmt.Errorf("model: the %s backend has no Mamba-2 ops (kernels.Mamba: the conv, the scan, the gated norm, the squared ReLU, the sigmoid router): it cannot run %s (Nemotron-H); run it on the CPU backend (--backend cpu)",
			m.b.Name(), m.cfg.Arch)
	}
	return nil
}

// allocWeights allocates the fp32 parameter arena and, under BF16, its copy.
func (m *Model) allocWeights(sz arenaSizes) error {
	var err error
	if m.params, err = m.b.Alloc(kernels.F32, sz.params); err != nil {
		return fmt.Errorf("model: parameter arena of %d floats: %w", sz.params, err)
	}
	if sz.paramsW > 0 {
		if m.paramsW, err = m.b.Alloc(kernels.BF16, sz.paramsW); err != nil {
			m.Close()
			return fmt.Errorf("model: bf16 copy of the weights, %d elements: %w", sz.paramsW, err)
		}
	}
	m.stale = true
	return nil
}

func (m *Model) hostStaging() {
	T, S := m.opt.MaxTokens, m.opt.MaxSeqs
	m.hTokens, m.hPos, m.hTarget, m.hCu = make([]int32, T), make([]int32, T), make([]int32, T), make([]int32, S+1)
	if E := m.cfg.MoE.NumExperts; m.cfg.Sparse() && !m.cfg.Hybrid() {
		L := m.cfg.NumHiddenLayers
		m.hOffsets, m.hPsum = make([]int32, L*(E+1)), make([]float32, L*E)
		m.hAux, m.hAuxW, m.hF, m.hP = make([]float32, E), make([]float32, E), make([]float64, E), make([]float64, E)
	}
	if m.hs.forestOffs.N > 0 {
		m.hForest, m.hFParent, m.hFEnds = make([]int32, 1, S+1), make([]int32, 0, S), make([]int32, 0, S)
		m.hPieceOffs = make([]int32, 0, pieceSlots(S))
	}
	m.hLp, m.hEnt, m.hDlp = make([]float32, T), make([]float32, T), make([]float32, T)
	m.outLp, m.outEnt = make([]float32, T), make([]float32, T)
	if m.headFull() {
		m.hLpFull, m.hDlpFull, m.outFull = make([]float32, T), make([]float32, T), make([]float32, T)
	}
	if m.opt.Tree {
		m.hParent, m.hEnds, m.hAnc, m.hIdx = make([]int32, S), make([]int32, S), make([]int32, S), make([]int32, T)
		m.hStack = make([]int32, 0, S)
	}
}

// views cuts the parameter (and gradient) views out of the arenas, or of
// a sharded model's gathered and gradient slots (paramBase).
func (m *Model) views() {
	// view is parameter i's view of kind (paramBase); run the fused view
	// of parameters first..last, adjacent in the arena and in their flat.
	view := func(i, kind int) kernels.Buf {
		if i < 0 {
			return kernels.Buf{}
		}
		buf, off := m.paramBase(i, kind)
		if buf.N == 0 {
			return kernels.Buf{}
		}
		return buf.Slice(off, m.table.Params[i].N)
	}
	run := func(first, last, kind int) kernels.Buf {
		if first < 0 {
			return kernels.Buf{}
		}
		buf, lo := m.paramBase(first, kind)
		if buf.N == 0 {
			return kernels.Buf{}
		}
		_, hi := m.paramBase(last, kind)
		return buf.Slice(lo, hi+m.table.Params[last].N-lo)
	}
	const w32, wW, grad = 0, 1, 2
	m.wte, m.dwte = view(m.tidx.wte, w32), view(m.tidx.wte, grad)
	m.norm, m.dnorm = view(m.tidx.norm, w32), view(m.tidx.norm, grad)
	if m.cfg.TieWordEmbeddings {
		m.lmHead, m.dlmHead = m.wte, m.dwte
		m.lmHeadW = view(m.tidx.wte, wW)
	} else {
		m.lmHead, m.dlmHead = view(m.tidx.lmHead, w32), view(m.tidx.lmHead, grad)
		m.lmHeadW = view(m.tidx.lmHead, wW)
	}
	m.layers, m.dlayers, m.gw = nil, nil, nil
	for _, li := range m.lidx {
		for _, kind := range []int{w32, grad} {
			lv := layerView{
				ln1:   view(li.ln1, kind),
				qBias: view(li.qBias, kind), kBias: view(li.kBias, kind), vBias: view(li.vBias, kind),
				o: view(li.o, kind), qNorm: view(li.qNorm, kind), kNorm: view(li.kNorm, kind),
				ln2: view(li.ln2, kind), down: view(li.down, kind),
				qkv: run(li.q, li.v, kind), qkvBias: run(li.qBias, li.vBias, kind), gu: run(li.gate, li.up, kind),
				router: view(li.router, kind), egu: run(li.eguFirst, li.eguLast, kind), edown: run(li.edownFirst, li.edownLast, kind),
				inProj: view(li.inProj, kind), conv: view(li.conv, kind), convBias: view(li.convBias, kind),
				dtBias: view(li.dtBias, kind), aLog: view(li.aLog, kind), dD: view(li.dD, kind), mnorm: view(li.mnorm, kind),
				outProj: view(li.outProj, kind), up: view(li.up, kind), ebias: view(li.ebias, kind),
				fc1: view(li.fc1, kind), fc2: view(li.fc2, kind), shUp: view(li.shUp, kind), shDown: view(li.shDown, kind),
			}
			if kind == w32 {
				m.layers = append(m.layers, lv)
			} else {
				m.dlayers = append(m.dlayers, lv)
			}
		}
		m.gw = append(m.gw, gemmWeights{
			qkv: run(li.q, li.v, wW), o: view(li.o, wW), gu: run(li.gate, li.up, wW), down: view(li.down, wW),
			router: view(li.router, wW), egu: run(li.eguFirst, li.eguLast, wW), edown: run(li.edownFirst, li.edownLast, wW),
			inProj: view(li.inProj, wW), outProj: view(li.outProj, wW), up: view(li.up, wW),
			fc1: view(li.fc1, wW), fc2: view(li.fc2, wW), shUp: view(li.shUp, wW), shDown: view(li.shDown, wW),
		})
	}
	m.mtpViews()
}

// arenaPlan cuts named views out of one allocation. Every view starts on a
// 16-byte boundary, so the GPU kernels' 16-byte loads and tensor-core tiles
// apply to every view whatever the lengths before it.
type arenaPlan struct {
	n    int
	elem int  // bytes per element; 0 means 4
	over bool // a view or the arena exceeded maxArena elements
	dsts []*kernels.Buf
	offs []int
	lens []int
}

// maxArena bounds the elements of one arena (2^56: 256 PiB of fp32,
// beyond any machine), so that an arena's size in bytes, and a sum of a
// few of them, is exact in an int64. A layout past it is refused as an
// overflow, not wrapped.
const maxArena = 1 << 56

// viewAlign is the byte boundary every view starts on.
const viewAlign = 16

func (p *arenaPlan) add(dst *kernels.Buf, n int) {
	elem := p.elem
	if elem == 0 {
		elem = 4
	}
	a := viewAlign / elem
	if p.over || n < 0 || n > maxArena || p.n > maxArena-n-a {
		p.over = true
		return
	}
	off := (p.n + a - 1) / a * a
	p.dsts = append(p.dsts, dst)
	p.offs = append(p.offs, off)
	p.lens = append(p.lens, n)
	p.n = off + n
}

// addProduct adds a view of the product of dims elements, checked: a
// product past maxArena marks the plan overflowed.
func (p *arenaPlan) addProduct(dst *kernels.Buf, dims ...int) {
	n := int64(1)
	for _, d := range dims {
		var ok bool
		if n, ok = checked.Mul(n, int64(d)); !ok || n > maxArena {
			p.over = true
			return
		}
	}
	p.add(dst, int(n))
}

func (p *arenaPlan) cut(arena kernels.Buf) {
	for i, d := range p.dsts {
		*d = arena.Slice(p.offs[i], p.lens[i])
	}
}

// actPlan lays out the activation arenas: f holds F32, w the GEMM
// precision's buffers under BF16 (under F32 they go to f), i the I32 inputs.
type actPlan struct {
	f, w, i arenaPlan
	after   func() // aliases set once the views are cut
}

// union lays out alternatives that are never live at once from the same
// start of each arena, so that they share memory: each arena then ends at
// the largest alternative's end.
func (p *actPlan) union(alts ...func()) {
	f0, w0, i0 := p.f.n, p.w.n, p.i.n
	f1, w1, i1 := f0, w0, i0
	for _, alt := range alts {
		p.f.n, p.w.n, p.i.n = f0, w0, i0
		alt()
		f1, w1, i1 = max(f1, p.f.n), max(w1, p.w.n), max(i1, p.i.n)
	}
	p.f.n, p.w.n, p.i.n = f1, w1, i1
}

// arenaSizes are the element counts of every allocation a model makes.
type arenaSizes struct {
	params, paramsW, grads int
	acts, actsW, ints      int
	rope                   int
}

// errArenaOverflow is the error of a layout past maxArena elements.
func errArenaOverflow(cfg Config, opt Options) error {
	return checked.Overflow("model: the activations of %d layers of hidden size %d for %d tokens per micro-batch exceed %d elements per arena",
		cfg.NumHiddenLayers, cfg.HiddenSize, opt.MaxTokens, int64(maxArena))
}

// sizes lays out the model's activations and returns every allocation's
// size: New and NewReference allocate exactly these, and PlanModel and
// PlanReference report them.
func (m *Model) sizes() (arenaSizes, *actPlan, error) {
	p := m.layoutActs()
	if p.f.over || p.w.over || p.i.over {
		return arenaSizes{}, nil, errArenaOverflow(m.cfg, m.opt)
	}
	sz := arenaSizes{params: m.table.Total, acts: p.f.n, actsW: p.w.n, ints: p.i.n}
	if m.wdt == kernels.BF16 {
		sz.paramsW = m.table.Total
	}
	if !m.forwardOnly {
		sz.grads = m.table.Total
	}
	if m.owner == nil {
		sz.rope = ropeElems(m.cfg, m.opt.MaxSeqLen)
	}
	return sz, p, nil
}

func (p *actPlan) cut(m *Model, ws *workspace) {
	p.f.cut(ws.acts)
	if p.w.n > 0 {
		p.w.cut(ws.actsW)
	}
	p.i.cut(ws.ints)
	p.after()
}

// layoutActs plans every activation, scratch and input buffer for
// MaxTokens tokens. A training model keeps each layer's activations for
// Backward (with Recompute only each layer's input, and one layer's
// worth); a forward-only reference keeps one layer's worth and two
// alternating layer inputs. A sparse layer keeps its router's and
// experts' activations (moeActs, K rows per token) in place of the dense
// MLP's.
func (m *Model) layoutActs() *actPlan {
	if m.cfg.Hybrid() {
		return m.layoutHybrid()
	}
	c := m.cfg
	T, S := m.opt.MaxTokens, m.opt.MaxSeqs
	C, I, HD, NH, NKV := c.HiddenSize, c.IntermediateSize, c.HeadDim, c.NumAttentionHeads, c.NumKeyValueHeads
	E, K, Im := c.MoE.NumExperts, c.MoE.TopK, c.MoE.IntermediateSize
	N := T * K
	qn, kn := NH*HD, NKV*HD
	qkvN := qn + 2*kn
	bf16 := m.wdt == kernels.BF16
	p := &actPlan{}
	p.w.elem = m.wdt.Size()
	f := &p.f
	w := &p.f
	if bf16 {
		w = &p.w
	}
	L := c.NumHiddenLayers
	m.la = make([]layerActs, L)
	var xs [2]kernels.Buf
	if m.forwardOnly {
		f.add(&xs[0], T*C)
		f.add(&xs[1], T*C)
	} else {
		for l := range m.la {
			f.add(&m.la[l].x, T*C)
		}
	}
	anyDense, anySparse := false, false
	for l := range m.la {
		if c.SparseLayer(l) {
			anySparse = true
		} else {
			anyDense = true
		}
	}
	// attn plans a layer's attention activations, mlp its dense MLP's, moe
	// its sparse MLP's.
	attn := func(a *layerActs) {
		w.add(&a.ln1, T*C)
		f.add(&a.rstd1, T)
		if c.QKNorm() {
			f.add(&a.qraw, T*qn)
			f.add(&a.qrstd, T*NH)
			f.add(&a.kraw, T*kn)
			f.add(&a.krstd, T*NKV)
		}
		w.add(&a.q, T*qn)
		w.add(&a.k, T*kn)
		w.add(&a.v, T*kn)
		w.add(&a.att, T*qn)
		f.add(&a.lse, T*NH)
		f.add(&a.xmid, T*C)
		w.add(&a.ln2, T*C)
		f.add(&a.rstd2, T)
	}
	mlp := func(a *layerActs) {
		w.add(&a.gu, T*2*I)
		w.add(&a.h, T*I)
	}
	moe := func(a *moeActs) {
		f.add(&a.probs, T*E)
		f.add(&a.rw, T*K)
		p.i.add(&a.rexp, T*K)
		p.i.add(&a.order, N)
		p.i.add(&a.slot, N)
		w.add(&a.egate, N*Im)
		w.add(&a.eup, N*Im)
		w.add(&a.eh, N*Im)
		f.add(&a.ey, N*C)
	}
	share := m.opt.Recompute || m.forwardOnly // every layer shares one layer's activations
	var shared layerActs
	if share {
		attn(&shared)
		if anyDense {
			mlp(&shared)
		}
		if anySparse {
			moe(&shared.moe)
		}
	} else {
		for l := range m.la {
			attn(&m.la[l])
			if c.SparseLayer(l) {
				moe(&m.la[l].moe)
			} else {
				mlp(&m.la[l])
			}
		}
	}
	var q32, k32 kernels.Buf
	if bf16 {
		f.add(&q32, T*qn)
		f.add(&k32, T*kn)
		f.add(&m.qkvOut, T*qkvN)
	}
	fusedW := qkvN // the q|k|v output, and the dense gate|up gradient
	if anyDense {
		fusedW = max(fusedW, 2*I)
	}
	w.add(&m.fused, T*fusedW)
	f.add(&m.xf, T*C)
	w.add(&m.lnf, T*C)
	for _, x := range []*kernels.Buf{&m.rstdf, &m.lp, &m.ent, &m.lseHead} {
		f.add(x, T)
	}
	if m.headFiltered() {
		f.add(&m.lpFull, T)
		f.add(&m.lseFull, T)
		p.i.add(&m.cut, 2*T)
		if m.headFull() && !m.forwardOnly {
			f.add(&m.dlpFull, T)
		}
	}
	m.offsets, m.psum, m.auxGrad = nil, nil, nil
	if anySparse {
		f.add(&m.rlogits, T*E)
		w.add(&m.xp, N*C)
		w.add(&m.efused, N*2*Im)
		m.offsets, m.psum, m.auxGrad = make([]kernels.Buf, L), make([]kernels.Buf, L), make([]kernels.Buf, L)
		for l := range m.la {
			if c.SparseLayer(l) {
				p.i.add(&m.offsets[l], E+1)
				f.add(&m.psum[l], E)
			}
		}
	}
	if !m.forwardOnly {
		for _, x := range []*kernels.Buf{&m.dx, &m.dln, &m.dlnf} {
			f.add(x, T*C)
		}
		f.add(&m.dlp, T)
		f.add(&m.datt, T*qn)
		f.add(&m.dq, T*qn)
		f.add(&m.dk, T*kn)
		f.add(&m.dv, T*kn)
		if c.QKNorm() && kn > C { // the split q/k backward's, where dln is too narrow (qkSplitBackward)
			f.add(&m.dkraw, T*kn)
		}
		if anyDense {
			f.add(&m.dh, T*I)
		}
		if bf16 {
			w.add(&m.dxW, T*C)
			w.add(&m.dattW, T*qn)
		}
		if anySparse {
			w.add(&m.dey, N*C)
			for _, x := range []*kernels.Buf{&m.deh, &m.degate, &m.deup} {
				f.add(x, N*Im)
			}
			f.add(&m.dxp, N*C)
			f.add(&m.drw, T*K)
			w.add(&m.dlogits, T*E)
			for l := range m.la {
				if c.SparseLayer(l) {
					f.add(&m.auxGrad[l], E)
				}
			}
		}
	}
	p.i.add(&m.tokens, T)
	p.i.add(&m.pos, T)
	p.i.add(&m.target, T)
	p.i.add(&m.cu, S+1)
	if m.opt.Tree {
		f.add(&m.xfP, T*C)
		p.i.add(&m.treeParent, S)
		p.i.add(&m.treeEnds, S)
		p.i.add(&m.pairIdx, T)
	}
	p.after = func() {
		for l := range m.la {
			if share {
				x := m.la[l].x
				m.la[l] = shared
				m.la[l].x = x
			}
			if m.forwardOnly {
				m.la[l].x = xs[l%2]
			}
			a := &m.la[l]
			if bf16 {
				a.q32, a.k32 = q32, k32
			} else {
				a.q32, a.k32 = a.q, a.k
			}
		}
		if !bf16 {
			m.qkvOut = m.fused.Slice(0, T*qkvN)
		}
	}
	return p
}

// Footprint is the memory a Model allocates on its backend, in bytes.
type Footprint struct {
	Weights     int64 // fp32 master weights
	WeightsBF16 int64 // their bf16 copy (mixed precision)
	Grads       int64 // fp32 gradients
	Activations int64 // saved activations and scratch of forward and backward
	Inputs      int64 // token ids, positions, targets, sequence offsets
	Rope        int64 // RoPE cos/sin tables
	// A sharded model's communication buffers: the gathered groups' slots
	// (compute precision, vectors fp32) and the gradient slots with the
	// reduce-scatters' scratch (fp32). Weights, WeightsBF16 and Grads are
	// then its shards.
	Gathered, GradReduce int64
}

// Total is the sum of every part.
func (f Footprint) Total() int64 {
	return f.Weights + f.WeightsBF16 + f.Grads + f.Activations + f.Inputs + f.Rope + f.Gathered + f.GradReduce
}

func (sz arenaSizes) footprint(wdt kernels.DType) Footprint {
	return Footprint{
		Weights:     int64(sz.params) * 4,
		WeightsBF16: int64(sz.paramsW) * 2,
		Grads:       int64(sz.grads) * 4,
		Activations: int64(sz.acts)*4 + int64(sz.actsW)*int64(wdt.Size()),
		Inputs:      int64(sz.ints) * 4,
		Rope:        int64(sz.rope) * 4,
	}
}

// PlanModel returns what New(b, cfg, opt) allocates, without allocating:
// the same layout code sizes both.
func PlanModel(cfg Config, opt Options) (Footprint, error) {
	m, err := shell(cfg, opt)
	if err != nil {
		return Footprint{}, err
	}
	sz, _, err := m.sizes()
	if err != nil {
		return Footprint{}, err
	}
	return sz.footprint(m.wdt), nil
}

// PlanReference returns what NewReference allocates for a policy built
// with cfg and opt: its weights (and bf16 copy), nothing else. Its
// activations live in the policy's workspace.
func PlanReference(cfg Config, opt Options) (Footprint, error) {
	m, err := shell(cfg, opt)
	if err != nil {
		return Footprint{}, err
	}
	m.forwardOnly, m.owner = true, &Model{}
	sz, _, err := m.sizes()
	if err != nil {
		return Footprint{}, err
	}
	return Footprint{Weights: int64(sz.params) * 4, WeightsBF16: int64(sz.paramsW) * 2}, nil
}

// Footprint returns what the model allocated (its RoPE tables as they are
// now: a Sampler may have grown them). A reference reports only its
// weights.
func (m *Model) Footprint() Footprint {
	f := Footprint{Weights: int64(m.params.N) * 4, WeightsBF16: int64(m.paramsW.N) * 2, Grads: int64(m.grads.N) * 4}
	if m.fs != nil {
		z, _ := m.shardSizes(&m.fs.sh, m.fs.reshard)
		f.WeightsBF16 = 2 * int64(z.matW)
		f.Gathered, f.GradReduce = z.gathered, z.reduce
	}
	if m.owner == nil && m.ws != nil {
		f.Activations = int64(m.ws.acts.N) * 4
		if m.ws.actsW.N > 0 {
			f.Activations += int64(m.ws.actsW.N) * int64(m.ws.actsW.DType.Size())
		}
		f.Inputs = int64(m.ws.ints.N) * 4
		f.Rope = int64(m.rope.N) * 4
	}
	return f
}

// Close frees the model's buffers (a reference frees only its weights).
func (m *Model) Close() {
	bufs := []*kernels.Buf{&m.params, &m.paramsW, &m.grads, &m.rope}
	if m.ws != nil && m.owner == nil {
		bufs = append(bufs, &m.ws.acts, &m.ws.actsW, &m.ws.ints)
	}
	if m.fs != nil {
		for i := range m.fs.own {
			bufs = append(bufs, &m.fs.own[i])
		}
	}
	for _, b := range bufs {
		if b.N > 0 {
			m.b.Free(*b)
		}
		*b = kernels.Buf{}
	}
	m.ropeP = 0
	m.haveForward = false
}

// Config returns the model's configuration.
func (m *Model) Config() Config { return m.cfg }

// Options returns the sizes the model was built for.
func (m *Model) Options() Options { return m.opt }

// Backend returns the backend the model runs on.
func (m *Model) Backend() kernels.Backend { return m.b }

// Table returns the parameter table shared by Params and Grads.
func (m *Model) Table() *ParamTable { return &m.table }

// Params is the flat fp32 parameter arena (Table().Total floats). Whoever
// writes it directly (the optimizer) calls ParamsChanged afterwards.
func (m *Model) Params() kernels.Buf { return m.params }

// ParamsChanged tells the model its parameters were written behind its
// back (by the optimizer's update): under mixed precision the next Forward
// remakes the bf16 copy, once, whatever the number of micro-batches.
func (m *Model) ParamsChanged() {
	m.stale = true
	if m.fs != nil {
		m.fs.invalidate(m)
	}
}

// syncWeights remakes the bf16 copy of the weights if they changed.
func (m *Model) syncWeights() {
	if m.stale && m.paramsW.N > 0 {
		m.b.Convert(m.paramsW, m.params)
	}
	m.stale = false
}

// Grads is the flat gradient arena, laid out like Params (empty for a
// reference).
func (m *Model) Grads() kernels.Buf { return m.grads }

// ZeroGrad sets every gradient to zero.
func (m *Model) ZeroGrad() {
	if m.grads.N > 0 {
		m.b.Fill(m.grads, 0)
	}
}
