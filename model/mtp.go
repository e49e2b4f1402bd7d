package model

// Multi-token prediction (config_mtp.go for the keys) as Megatron-Core's
// MultiTokenPredictionBlock computes it for a hybrid model
// (megatron/core/transformer/multi_token_prediction.py at Megatron-LM
// d98e8a64ddf34856e74b24714e3bedb2f5a39553; line numbers below are that
// file's). With h⁰ the main model's final normed hidden states (the
// decoder's output after norm_f, hybrid_model.py:558), depth d = 1..D of a
// packed sequence x_0..x_{n−1} computes at every position i
//
//	e^d_i = Emb(x_{i+d})            ids rolled left by d within the
//	                                sequence, 0 past its end (roll_tensor,
//	                                _get_embeddings :1279)
//	u^d   = [enorm(e^d) | hnorm(h^{d−1})] · W_ehᵀ      (_concat_embeddings :1331)
//	x     = u^d, then x = x + mixer_b(norm_b(x)) for each block b of the
//	        pattern (mtp_hybrid_override_pattern)
//	h^d   = final_layernorm(x)      (_postprocess :1433)
//	lp^d_i = log softmax(h^d_i · W_headᵀ)[x_{i+d+1}]    the shared LM head,
//	                                at temperature 1 (process_mtp_loss :1013)
//
// so depth d predicts the token d+1 places ahead of each position. With
// mtp_use_repeated_layer one block's weights serve every depth
// (_build_layers :1951); without it depth d has its own. With
// mtp_detach_heads h⁰ is detached (:2041), e^d is detached (:1317) and
// the LM head's weight is detached (:990): the MTP loss trains the MTP
// blocks only — gradients still flow from depth d+1 into depth d's block.
//
// # The model's share
//
// Each depth runs as a sub-model: a *Model whose blocks are the depth's
// MTP blocks (Config.Layers the pattern), whose norm is the depth's
// final_layernorm and whose LM head is the shared one, over the parent's
// arenas, staged sequences and scratch (its own block inputs, block
// activations unless Recompute, and head outputs). The hybrid blocks' code
// runs it unchanged. ForwardMTP runs the depths after the main head and
// returns their log-probabilities; BackwardMTP takes their gradients (the
// caller's loss: NeMo RL's is −Σ w·lp, see trainer) and back-propagates
// them before the main head's. The depths never run in Forward,
// ForwardMasked or ForwardTree, nor in a forward-only model.

import (
	"errors"
	"fmt"

	"github.com/tracegrpo/tracegrpo/kernels"
)

// mtpTable are the table indices of the MTP blocks' parameters.
type mtpTable struct {
	blocks []layerIdx // the blocks, depth-major: block b of depth j at j·P+b
	heads  []mtpHead  // per depth block: its own parameters
}

// mtpHead are one MTP depth's parameters beyond its blocks': enorm, hnorm
// and eh_proj (on its first block, mtp.layers.{j·P}.*) and
// final_layernorm (on its last, mtp.layers.{j·P+P−1}.*), where
// Megatron-Bridge puts them (nemotron_h_bridge.py:455-475).
type mtpHead struct{ enorm, hnorm, eh, fnorm int }

// addMTPTable declares the MTP blocks cfg trains (Config.MTPBlocks), each
// a group "mtp.layers.<i>" numbered after the main layers: the flattened
// Hub names mtp.layers.{j·P+b}.* of Megatron-Bridge's _MTPFlatteningMapping
// (nemotron_h_bridge.py:49-160). A block's mixer has the main layers'
// names (norm.weight, mixer.*); the MTP router is trained even under
// freeze_moe_router, which freezes decoder.layers' routers only (NeMo RL
// nemo_rl/models/megatron/setup.py:1737-1739 at
// 7ea279abfbeb698b092856d0dab61e7cf39bc909).
func addMTPTable(t *ParamTable, cfg Config) mtpTable {
	var mt mtpTable
	C, P := cfg.HiddenSize, len(cfg.MTP.Pattern)
	for j := range cfg.MTPBlocks() {
		var h mtpHead
		for b, k := range cfg.MTP.Pattern {
			i := j*P + b
			p := fmt.Sprintf("mtp.layers.%d.", i)
			t.beginGroup(fmt.Sprintf("mtp.layers.%d", i), cfg.NumHiddenLayers+i)
			if b == 0 {
				h.enorm = t.add(p+"enorm.weight", false, C)
				h.hnorm = t.add(p+"hnorm.weight", false, C)
				h.eh = t.add(p+"eh_proj.weight", true, C, 2*C)
			}
			li := addHybridBlock(t, cfg, p, k)
			if li.router >= 0 {
				t.Params[li.router].Router = false
			}
			if li.q >= 0 && (li.k != li.q+1 || li.v != li.k+1) {
				panic(fmt.Sprintf("model: MTP block %d: q, k and v must be adjacent in the parameter table", i))
			}
			mt.blocks = append(mt.blocks, li)
			if b == P-1 {
				h.fnorm = t.add(p+"final_layernorm.weight", false, C)
			}
		}
		mt.heads = append(mt.heads, h)
	}
	return mt
}

// mtpState is a training model's multi-token prediction.
type mtpState struct {
	depth []*Model // depth d+1's sub-model
	// Per depth: the rolled ids' embeddings (T,C), the eh_proj input
	// [enorm | hnorm] (T,2C) w, the previous depth's output in fp32 (T,C;
	// BF16 only, else the output itself), the two norms' rstd (T), and,
	// unless detached, the embeddings' gradient (T,C) for backwardEmbed.
	emb, cat, hin, rstdE, rstdH, de []kernels.Buf
	// Scratch: an enorm/hnorm output (T,C) w; the eh_proj input's
	// gradient (T,2C) and its halves (T,C); the gradients of two depths'
	// outputs (T,C), alternating; the main hidden states' gradient (T,C;
	// not detached); a discarded input gradient (T,C).
	en, dcat, den, dhn kernels.Buf
	dout               [2]kernels.Buf
	dh0, sink          kernels.Buf
	// Per depth, weights: enorm, hnorm, eh_proj (fp32, and eh_proj in the
	// GEMM precision) and their gradients.
	w, dw []mtpHeadView
	// Host staging per depth: rolled ids, targets, log-probabilities and
	// their gradients.
	hTok, hTgt      [][]int32
	hLp, hDlp, hOut [][]float32
	active          bool // the last forward ran the depths
	grads           bool // BackwardMTP staged their gradients
}

// mtpBack reports whether the backward runs the depths: the last forward
// ran them and BackwardMTP gave their gradients (a plain Backward after
// ForwardMTP leaves them out).
func (m *Model) mtpBack() bool { return m.mtp != nil && m.mtp.active && m.mtp.grads }

// mtpHeadView holds one depth's enorm, hnorm and eh_proj views.
type mtpHeadView struct{ enorm, hnorm, eh, ehW kernels.Buf }

// mtpPhys returns depth d's block of weights (0 when repeated).
func (m *Model) mtpPhys(d int) int {
	if m.cfg.MTP.Repeated {
		return 0
	}
	return d
}

// newMTPDepth returns depth d's sub-model shell: the pattern as its
// blocks, the depth's final_layernorm as its norm, the shared embedding
// and LM head. Its arenas, views and scratch are the parent's (mtpViews,
// the layout's after).
func (m *Model) newMTPDepth(d int) *Model {
	c := m.cfg
	sc := c
	sc.Layers = c.MTP.Pattern
	sc.NumHiddenLayers = len(c.MTP.Pattern)
	sc.MTP = MTP{}
	P, j := len(c.MTP.Pattern), m.mtpPhys(d)
	opt := m.opt
	opt.FreezeRouter = false // decoder.layers' routers only (addMTPTable)
	s := &Model{b: m.b, cfg: sc, opt: opt, wdt: m.wdt, table: m.table,
		tidx: tableIdx{wte: m.tidx.wte, norm: m.tidx.mtp.heads[j].fnorm, lmHead: m.tidx.lmHead},
		lidx: m.tidx.mtp.blocks[j*P : (j+1)*P], router: m.router}
	s.addNorm, s.ropeConv, s.experts, s.mamba = m.addNorm, m.ropeConv, m.experts, m.mamba
	s.eload = m.load() // the depths' routers count into the parent's expert load
	return s
}

// layoutMTP plans a training model's MTP activations into p (layoutHybrid
// calls it last): per depth its block inputs, its blocks' activations
// (unless Recompute: then the main layers' shared ones, recomputed in the
// backward), its inputs and outputs; and the MTP scratch.
func (m *Model) layoutMTP(p *actPlan) {
	c := m.cfg
	m.mtp = nil
	if c.MTP.Depths == 0 || m.forwardOnly {
		return
	}
	T, C, D, P := m.opt.MaxTokens, c.HiddenSize, c.MTP.Depths, len(c.MTP.Pattern)
	bf16 := m.wdt == kernels.BF16
	f, w := &p.f, &p.f
	if bf16 {
		w = &p.w
	}
	st := &mtpState{depth: make([]*Model, D)}
	for _, x := range []*[]kernels.Buf{&st.emb, &st.cat, &st.hin, &st.rstdE, &st.rstdH, &st.de} {
		*x = make([]kernels.Buf, D)
	}
	share := m.opt.Recompute
	offsets := make([][]kernels.Buf, D)
	rexp := make([][]kernels.Buf, D)
	for d := range D {
		s := m.newMTPDepth(d)
		st.depth[d] = s
		s.la, s.hy = make([]layerActs, P), make([]hybridActs, P)
		offsets[d], rexp[d] = make([]kernels.Buf, P), make([]kernels.Buf, P)
		// With Recompute a depth keeps its output, its head's statistics
		// and its inputs; the rest is one depth's, shared, remade in the
		// backward (mtpRecompute).
		if !share || d == 0 {
			for b, k := range c.MTP.Pattern {
				f.add(&s.la[b].x, T*C)
				if !share {
					m.layoutBlock(p, &s.la[b], &s.hy[b], k)
				}
				if k == LayerMoE {
					p.i.add(&offsets[d][b], c.MoE.NumExperts+1)
					p.i.add(&rexp[d][b], T*c.MoE.TopK)
				}
			}
			w.add(&st.cat[d], T*2*C)
			if bf16 {
				f.add(&st.hin[d], T*C)
			}
			f.add(&st.rstdE[d], T)
			f.add(&st.rstdH[d], T)
			f.add(&s.xf, T*C)
			f.add(&s.rstdf, T)
		}
		f.add(&st.emb[d], T*C) // mtpEmbed writes them all at the start
		if !c.MTP.Detach {
			f.add(&st.de[d], T*C)
		}
		w.add(&s.lnf, T*C)
		for _, x := range []*kernels.Buf{&s.lp, &s.ent, &s.lseHead, &s.dlp} {
			f.add(x, T)
		}
		p.i.add(&s.tokens, T)
		p.i.add(&s.target, T)
	}
	w.add(&st.en, T*C)
	f.add(&st.dcat, T*2*C)
	for _, x := range []*kernels.Buf{&st.den, &st.dhn, &st.dout[0], &st.dout[1], &st.sink} {
		f.add(x, T*C)
	}
	if !c.MTP.Detach {
		f.add(&st.dh0, T*C)
	}
	st.hTok, st.hTgt = make([][]int32, D), make([][]int32, D)
	st.hLp, st.hDlp, st.hOut = make([][]float32, D), make([][]float32, D), make([][]float32, D)
	m.mtp = st
	prev := p.after
	p.after = func() {
		prev()
		// A kind's shared activations (Recompute): any main layer's of it.
		kindLayer := map[LayerKind]int{}
		for l := len(c.Layers) - 1; l >= 0; l-- {
			kindLayer[c.Layers[l]] = l
		}
		for d, s := range st.depth {
			m.shareScratch(s)
			if share && d > 0 {
				d0 := st.depth[0]
				for b := range s.la {
					s.la[b].x = d0.la[b].x
				}
				offsets[d], rexp[d] = offsets[0], rexp[0]
				st.cat[d], st.hin[d], st.rstdE[d], st.rstdH[d] = st.cat[0], st.hin[0], st.rstdE[0], st.rstdH[0]
				s.xf, s.rstdf = d0.xf, d0.rstdf
			}
			s.offsets = offsets[d]
			for b, k := range c.MTP.Pattern {
				if share {
					x := s.la[b].x
					s.la[b], s.hy[b] = m.la[kindLayer[k]], m.hy[kindLayer[k]]
					s.la[b].x = x
				}
				s.la[b].moe.rexp = rexp[d][b]
				s.la[b].q32, s.la[b].k32 = s.la[b].q, s.la[b].k
			}
		}
	}
}

// shareScratch points sub-model s's scratch, staged sequences and
// gradient buffers at the parent's.
func (m *Model) shareScratch(s *Model) {
	s.hs, s.rlogits = m.hs, m.rlogits
	s.dx, s.dln, s.dxW = m.dx, m.dln, m.dxW
	s.datt, s.dq, s.dk, s.dv, s.dattW = m.datt, m.dq, m.dk, m.dv, m.dattW
	s.drw, s.dlogits = m.drw, m.dlogits
	s.cu, s.pos = m.cu, m.pos
}

// mtpViews cuts the depths' parameter views (views calls it last).
func (m *Model) mtpViews() {
	st := m.mtp
	if st == nil {
		return
	}
	D := len(st.depth)
	st.w, st.dw = make([]mtpHeadView, D), make([]mtpHeadView, D)
	for d, s := range st.depth {
		s.params, s.grads, s.paramsW, s.fs, s.stale = m.params, m.grads, m.paramsW, m.fs, false
		s.views()
		h := m.tidx.mtp.heads[m.mtpPhys(d)]
		view := func(i, kind int) kernels.Buf {
			buf, off := s.paramBase(i, kind)
			if buf.N == 0 {
				return kernels.Buf{}
			}
			return buf.Slice(off, m.table.Params[i].N)
		}
		st.w[d] = mtpHeadView{enorm: view(h.enorm, 0), hnorm: view(h.hnorm, 0), eh: view(h.eh, 0), ehW: view(h.eh, 1)}
		st.dw[d] = mtpHeadView{enorm: view(h.enorm, 2), hnorm: view(h.hnorm, 2), eh: view(h.eh, 2)}
	}
}

// stageMTP uploads every depth's rolled ids and targets for the staged
// micro-batch (tokens, cu; need as ForwardMasked's) and copies the
// parent's staged state into the sub-models.
func (m *Model) stageMTP(tokens, cu []int32, need []bool) {
	st := m.mtp
	T := len(tokens)
	for d, s := range st.depth {
		k := d + 1 // depth k embeds x_{i+k} and predicts x_{i+k+1}
		st.hTok[d] = grow32(st.hTok[d], T)
		st.hTgt[d] = grow32(st.hTgt[d], T)
		tok, tgt := st.hTok[d], st.hTgt[d]
		for q := 0; q+1 < len(cu); q++ {
			lo, hi := int(cu[q]), int(cu[q+1])
			for i := lo; i < hi; i++ {
				tok[i], tgt[i] = 0, -1
				if i+k < hi {
					tok[i] = tokens[i+k]
				}
				if t := i + k + 1; t < hi && (need == nil || need[t]) {
					tgt[i] = tokens[t]
				}
			}
		}
		s.lastT, s.lastS, s.lastMaxLen, s.lastInvTemp = m.lastT, m.lastS, m.lastMaxLen, 1
		s.lastTree, s.forestNS, s.pieces = false, m.forestNS, m.pieces
		if T > 0 {
			m.b.UploadI32(s.tokens.Slice(0, T), tok)
			m.b.UploadI32(s.target.Slice(0, T), tgt)
		}
	}
	st.active = true
}

func grow32(b []int32, n int) []int32 {
	if cap(b) < n {
		return make([]int32, n)
	}
	return b[:n]
}

func growF32(b []float32, n int) []float32 {
	if cap(b) < n {
		return make([]float32, n)
	}
	return b[:n]
}

// mtpEmbed queues every depth's embedding of its rolled ids (forwardBody
// and shardedForward call it with the embedding at hand).
func (m *Model) mtpEmbed() {
	if m.mtp == nil || !m.mtp.active || m.lastT == 0 {
		return
	}
	T, C := m.lastT, m.cfg.HiddenSize
	for d, s := range m.mtp.depth {
		m.b.Embedding(m.mtp.emb[d].Slice(0, T*C), m.wte, s.tokens.Slice(0, T), T, C)
	}
}

// mtpForwardDepth queues depth d from the previous depth's output (the
// main model's lnf for d = 0) to its log-probabilities. block, unless nil,
// runs before each block's forward (a sharded model gathers there; with
// run false nothing else is queued). Without head it stops before the LM
// head (mtpRecompute).
func (m *Model) mtpForwardDepth(d int, run bool, block func(b int), head bool) {
	if !run {
		for l := range m.mtp.depth[d].la {
			block(l)
		}
		return
	}
	st, s, b, c := m.mtp, m.mtp.depth[d], m.b, m.cfg
	T, C := m.lastT, c.HiddenSize
	eps := c.RMSNormEps
	if block != nil {
		block(0) // enorm, hnorm and eh_proj are the first block's
	}
	tc := func(x kernels.Buf, n int) kernels.Buf { return x.Slice(0, T*n) }
	w := st.w[d]
	prev := m.lnf
	if d > 0 {
		prev = st.depth[d-1].lnf
	}
	hin := tc(prev, C)
	if m.wdt != kernels.F32 {
		hin = tc(st.hin[d], C)
		b.Convert(hin, tc(prev, C))
	}
	cat, en := tc(st.cat[d], 2*C), tc(st.en, C)
	b.RMSNorm(en, st.rstdE[d].Slice(0, T), tc(st.emb[d], C), w.enorm, T, C, eps)
	b.CopyCols(cat, en, T, C, 2*C, C)
	b.RMSNorm(en, st.rstdH[d].Slice(0, T), hin, w.hnorm, T, C, eps)
	b.CopyCols(cat.Slice(C, T*2*C-C), en, T, C, 2*C, C)
	b.Matmul(tc(s.la[0].x, C), cat, w.ehW, T, 2*C, C)
	s.norm1(0)
	for l := range s.la {
		if block != nil && l > 0 {
			block(l)
		}
		s.layerForward(l, true)
	}
	if !head {
		return
	}
	b.TokenLogprob(s.lp.Slice(0, T), s.ent.Slice(0, T), s.lseHead.Slice(0, T), tc(s.lnf, C), s.lmHeadW,
		s.target.Slice(0, T), T, C, c.VocabSize, 1)
}

// mtpForward queues every depth (forward calls it after the main head).
func (m *Model) mtpForward() {
	if m.mtp == nil || !m.mtp.active || m.lastT == 0 {
		return
	}
	for d := range m.mtp.depth {
		m.mtpForwardDepth(d, true, nil, true)
	}
}

// mtpGroups returns depth d's blocks' parameter groups.
func (m *Model) mtpGroups(d int) []int {
	P := len(m.cfg.MTP.Pattern)
	base := m.cfg.NumHiddenLayers + 1 + m.mtpPhys(d)*P
	gs := make([]int, P)
	for b := range gs {
		gs[b] = base + b
	}
	return gs
}

// mtpShardedForward is mtpForward of a sharded model: before each block
// its group and the next one's (whose norm its tail reads) are gathered
// (a repeated block's stay in their slots while they fit them); with no
// tokens only the collectives run.
func (m *Model) mtpShardedForward(run bool) {
	if m.mtp == nil || !m.mtp.active {
		return
	}
	for d := range m.mtp.depth {
		m.mtpForwardDepth(d, run, m.mtpGatherHook(d), true)
	}
}

// mtpGatherHook gathers block b's group and the next block's (whose norm
// b's tail reads) before b runs.
func (m *Model) mtpGatherHook(d int) func(b int) {
	gs := m.mtpGroups(d)
	return func(b int) {
		m.gather(gs[b])
		if b+1 < len(gs) {
			m.gather(gs[b+1])
		}
		m.join(gs[b])
		if b+1 < len(gs) {
			m.join(gs[b+1])
		}
	}
}

// mtpResults downloads each depth's log-probabilities after the forward's
// Sync, aligned by the token predicted: out[d][t] is depth d+1's
// log-probability of tokens[t] (0 where no target).
func (m *Model) mtpResults(T int) [][]float32 {
	st := m.mtp
	out := make([][]float32, len(st.depth))
	for d := range st.depth {
		st.hOut[d] = growF32(st.hOut[d], T)
		o := st.hOut[d]
		clear(o)
		lp := st.hLp[d][:T]
		for i, tg := range st.hTgt[d][:T] {
			if tg >= 0 {
				o[i+d+2] = lp[i]
			}
		}
		out[d] = o
	}
	return out
}

// queueMTPDownloads queues the depths' log-probabilities' downloads.
func (m *Model) queueMTPDownloads(T int) {
	st := m.mtp
	for d, s := range st.depth {
		st.hLp[d] = growF32(st.hLp[d], T)
		if T > 0 {
			m.b.DownloadF32(st.hLp[d], s.lp.Slice(0, T))
		}
	}
}

// stageMTPGrads uploads each depth's dlogprob from dmtp (aligned as
// mtpResults' output).
func (m *Model) stageMTPGrads(dmtp [][]float32) error {
	st := m.mtp
	T := m.lastT
	if len(dmtp) != len(st.depth) {
		return fmt.Errorf("model: backward: %d MTP gradients for %d depths", len(dmtp), len(st.depth))
	}
	for d, s := range st.depth {
		if len(dmtp[d]) != T {
			return fmt.Errorf("model: backward: depth %d's gradient has %d entries, the forward had %d tokens", d+1, len(dmtp[d]), T)
		}
		st.hDlp[d] = growF32(st.hDlp[d], T)
		g := st.hDlp[d]
		for i, tg := range st.hTgt[d][:T] {
			g[i] = 0
			if tg >= 0 {
				g[i] = dmtp[d][i+d+2]
			}
		}
		if T > 0 {
			m.b.UploadF32(s.dlp.Slice(0, T), g)
		}
	}
	st.grads = true
	return nil
}

// mtpBackwardDepth queues depth d's backward: its head and blocks, then
// eh_proj and the two norms. On entry st.dout[d%2] holds the gradient of
// the depth's output from depth d+1 (zero for the last depth); on return
// the previous depth's output gradient (st.dout[(d−1)%2], or dh0 for the
// main model's hidden states) has received its share.
//
// block, unless nil, runs before (after false) and after (after true) each
// block's backward, blocks last first: a sharded model gathers and takes
// gradient slots there (with run false nothing else is queued).
func (m *Model) mtpBackwardDepth(d int, run bool, block func(b int, after bool)) {
	st, s, b, c := m.mtp, m.mtp.depth[d], m.b, m.cfg
	if !run {
		for l := len(s.la) - 1; l >= 0; l-- {
			block(l, false)
			block(l, true)
		}
		return
	}
	T, C := m.lastT, c.HiddenSize
	tc := func(x kernels.Buf, n int) kernels.Buf { return x.Slice(0, T*n) }
	w, dw := st.w[d], st.dw[d]
	detach := c.MTP.Detach
	dout := tc(st.dout[d%2], C)
	dlmHead := m.dlmHead
	if detach {
		dlmHead = kernels.Buf{}
	}
	b.TokenLogprobBackward(dout, dlmHead, s.dlp.Slice(0, T), tc(s.lnf, C), s.lmHeadW, s.target.Slice(0, T), s.lseHead.Slice(0, T), T, C, c.VocabSize, 1)
	dx := tc(s.dx, C)
	P := len(s.la)
	if block != nil {
		block(P-1, false) // final_layernorm is the last block's
	}
	b.Fill(dx, 0)
	b.RMSNormBackward(dx, s.dnorm, dout, tc(s.xf, C), s.norm, s.rstdf.Slice(0, T), T, C)
	for l := P - 1; l >= 0; l-- {
		if block != nil && l < P-1 {
			block(l, false)
		}
		s.hybridBackward(l)
		if block != nil && l > 0 {
			block(l, true)
		}
	}
	dcat := tc(st.dcat, 2*C)
	b.Fill(dcat, 0)
	b.MatmulBackward(dcat, dw.eh, s.gemmGrad(dx, s.dxW), tc(st.cat[d], 2*C), w.ehW, T, 2*C, C)
	den, dhn := tc(st.den, C), tc(st.dhn, C)
	b.CopyCols(den, dcat, T, C, C, 2*C)
	b.CopyCols(dhn, dcat.Slice(C, T*2*C-C), T, C, C, 2*C)
	de := tc(st.sink, C)
	if !detach {
		de = tc(st.de[d], C)
	}
	b.Fill(de, 0)
	b.RMSNormBackward(de, dw.enorm, den, tc(st.emb[d], C), w.enorm, st.rstdE[d].Slice(0, T), T, C)
	prev := m.lnf
	dprev := tc(st.sink, C)
	switch {
	case d > 0:
		prev = st.depth[d-1].lnf
		dprev = tc(st.dout[(d-1)%2], C)
		b.Fill(dprev, 0)
	case !detach:
		dprev = tc(st.dh0, C)
		b.Fill(dprev, 0)
	}
	hin := tc(prev, C)
	if m.wdt != kernels.F32 {
		hin = tc(st.hin[d], C)
	}
	b.RMSNormBackward(dprev, dw.hnorm, dhn, hin, w.hnorm, st.rstdH[d].Slice(0, T), T, C)
	if block != nil {
		block(0, true) // enorm, hnorm and eh_proj are the first block's
	}
}

// mtpBackward queues every depth's backward, last first (backward calls
// it before the main head's).
func (m *Model) mtpBackward() {
	if !m.mtpBack() || m.lastT == 0 {
		return
	}
	D := len(m.mtp.depth)
	m.b.Fill(m.mtp.dout[(D-1)%2].Slice(0, m.lastT*m.cfg.HiddenSize), 0)
	for d := D - 1; d >= 0; d-- {
		if m.opt.Recompute {
			m.mtpForwardDepth(d, true, nil, false)
		}
		m.mtpBackwardDepth(d, true, nil)
	}
}

// mtpShardedBackward is mtpBackward of a sharded model (shardedBackward
// calls it once the head's gradient slot is taken): each block's group is
// gathered and its gradient slot taken before the block's backward, and
// its gradients reduce-scattered after it unless the next block to use
// the slot is the same group (a repeated block whose groups fit the two
// alternating slots: its gradients then sum over every depth before one
// reduce-scatter). With no tokens only the collectives run.
func (m *Model) mtpShardedBackward(run bool) {
	if !m.mtpBack() {
		return
	}
	D := len(m.mtp.depth)
	var order []int // groups in backward order
	for d := D - 1; d >= 0; d-- {
		gs := m.mtpGroups(d)
		for b := len(gs) - 1; b >= 0; b-- {
			order = append(order, gs[b])
		}
	}
	fs := m.fs
	held := map[int]int{} // gradient slot → the group whose gradients it holds
	k := 0
	if run {
		m.b.Fill(m.mtp.dout[(D-1)%2].Slice(0, m.lastT*m.cfg.HiddenSize), 0)
	}
	for d := D - 1; d >= 0; d-- {
		gs := m.mtpGroups(d)
		if m.opt.Recompute {
			m.mtpForwardDepth(d, run, m.mtpGatherHook(d), false)
		}
		m.mtpBackwardDepth(d, run, func(b int, after bool) {
			g, r := gs[b], fs.rslotOf[gs[b]]
			if !after {
				m.need(g)
				if cur, ok := held[r]; !ok || cur != g {
					if ok {
						m.scatterGrads(cur)
					}
					m.takeGrads(g)
					held[r] = g
				}
				return
			}
			k++
			next := -1
			for _, h := range order[k:] {
				if fs.rslotOf[h] == r {
					next = h
					break
				}
			}
			if next != g {
				m.scatterGrads(g)
				delete(held, r)
			}
		})
	}
}

// mtpHiddenGrad adds the depths' gradient of the main model's normed
// hidden states into dlnf (T,C) (backwardHead calls it before the final
// norm's backward; nothing when detached).
func (m *Model) mtpHiddenGrad(dlnf kernels.Buf) {
	if !m.mtpBack() || m.cfg.MTP.Detach || m.lastT == 0 {
		return
	}
	m.b.Accumulate(dlnf, m.mtp.dh0.Slice(0, dlnf.N), dlnf.N)
}

// mtpEmbedGrad adds the depths' gradients of their rolled ids'
// embeddings into the embedding's (backwardEmbed calls it after the
// main model's; nothing when detached).
func (m *Model) mtpEmbedGrad() {
	if !m.mtpBack() || m.cfg.MTP.Detach || m.lastT == 0 {
		return
	}
	T, C := m.lastT, m.cfg.HiddenSize
	for d, s := range m.mtp.depth {
		m.b.EmbeddingBackward(m.dwte, m.mtp.de[d].Slice(0, T*C), s.tokens.Slice(0, T), T, C)
	}
}

// ErrNoMTP is returned by ForwardMTP on a model without MTP depths.
var ErrNoMTP = errors.New("model: the model trains no multi-token prediction depths (Config.WithMTP), or is forward-only")

// ForwardMTP is ForwardMasked that also runs the multi-token prediction
// depths (a training model whose Config.MTP.Depths > 0) and returns, for
// depth k = 1..D, mtp[k−1][t] = log p_k(tokens[t]): the depth's
// log-probability (at temperature 1, as Megatron's MTP loss) of token t,
// predicted from position t−k−1 of its sequence, for every t ≥ k+1 of a
// sequence where need[t] (nil: everywhere), 0 elsewhere. The slices
// belong to the model and are overwritten by the next ForwardMTP. The
// next Backward or BackwardMTP back-propagates the depths too.
func (m *Model) ForwardMTP(tokens []int32, cuSeqlens []int32, temperature float32, need []bool) (logprob, entropy []float32, mtp [][]float32, err error) {
	if m.mtp == nil {
		return nil, nil, nil, ErrNoMTP
	}
	lp, ent, err := m.forwardMasked(tokens, cuSeqlens, temperature, need, true)
	if err != nil {
		return nil, nil, nil, err
	}
	return lp, ent, m.mtpResults(len(tokens)), nil
}

// SetMTPGradients gives the next Backward (or BackwardFull) after a
// ForwardMTP the gradients of the depths' log-probabilities: dmtp[k−1][t]
// = ∂L/∂mtp[k−1][t], aligned as ForwardMTP returned them (entries where it
// returned no log-probability are ignored).
func (m *Model) SetMTPGradients(dmtp [][]float32) error {
	if m.mtp == nil || !m.mtp.active {
		return fmt.Errorf("model: backward: MTP gradients without a preceding ForwardMTP")
	}
	return m.stageMTPGrads(dmtp)
}

// BackwardMTP is Backward after a ForwardMTP, given also dmtp[k−1][t] =
// ∂L/∂mtp[k−1][t] for the depths' log-probabilities (same alignment;
// entries where ForwardMTP returned no log-probability are ignored).
func (m *Model) BackwardMTP(dlogprob []float32, dmtp [][]float32) error {
	if err := m.SetMTPGradients(dmtp); err != nil {
		return err
	}
	err := m.Backward(dlogprob)
	m.mtp.grads = false
	return err
}
