package model

// Hybrid models (Nemotron-H): a stack of blocks, each a pre-RMSNorm, one
// mixer and a residual (transformers' NemotronHBlock):
//
//	x_{l+1} = x_l + mixer_l(RMSNorm(x_l))
//
// where the mixer is a Mamba-2 mixer, GQA attention without positional
// embeddings or q/k norms, an MLP (up, squared ReLU, down), or a sparse
// block (hybrid_moe.go). The embedding, the final norm (norm_f) and the LM
// head are the other families'; so are trees, sharding, checkpointing and
// mixed precision: the blocks plug into layerBody, layerTail and
// backwardLayer (hybridBody, hybridTail, hybridBackward).
//
// Parameter names are the Hub's (backbone.*, one tensor per expert), the
// layout NVIDIA's checkpoints and transformers' save_pretrained use; LoadHF
// also reads transformers' in-memory names (model.*) and its stacked
// experts. The tensors the kernels read in fp32 whatever the precision (the
// conv weights, the routers, and every 1-D parameter) are in the vector
// flats, gathered in fp32 when sharded.

import (
	"fmt"

	"github.com/tracegrpo/tracegrpo/kernels"
)

// newHybridTable lays out a hybrid model's parameters with the Hub's names.
func newHybridTable(cfg Config) (ParamTable, tableIdx, []layerIdx) {
	C, V := cfg.HiddenSize, cfg.VocabSize
	t := ParamTable{byName: map[string]int{}}
	var ti tableIdx
	t.beginGroup("embed", -1)
	ti.wte = t.add("backbone.embeddings.weight", true, V, C)
	layers := make([]layerIdx, cfg.NumHiddenLayers)
	for l := range layers {
		t.beginGroup(fmt.Sprintf("layers.%d", l), l)
		layers[l] = addHybridBlock(&t, cfg, fmt.Sprintf("backbone.layers.%d.", l), cfg.Layers[l])
		if li := layers[l]; li.q >= 0 && (li.k != li.q+1 || li.v != li.k+1) {
			panic(fmt.Sprintf("model: layer %d: q, k and v must be adjacent in the parameter table", l))
		}
	}
	ti.mtp = addMTPTable(&t, cfg)
	t.beginGroup("head", -1)
	ti.norm = t.add("backbone.norm_f.weight", false, C)
	ti.lmHead = -1
	if !cfg.TieWordEmbeddings {
		ti.lmHead = t.add("lm_head.weight", true, V, C)
	}
	return t, ti, layers
}

// addHybridBlock declares one block of kind k under the prefix p
// ("backbone.layers.N." or an MTP block's "mtp.layers.N.") in the group
// begun last: its norm and its mixer's parameters, with the Hub's names.
func addHybridBlock(t *ParamTable, cfg Config, p string, k LayerKind) layerIdx {
	C := cfg.HiddenSize
	NH, NKV, HD := cfg.NumAttentionHeads, cfg.NumKeyValueHeads, cfg.HeadDim
	mc, e := cfg.Mamba, cfg.MoE
	li := noLayer()
	li.ln1 = t.add(p+"norm.weight", false, C)
	m := p + "mixer."
	switch k {
	case LayerMamba:
		li.inProj = t.add(m+"in_proj.weight", true, mc.InProj(), C)
		li.conv = t.addFlat(m+"conv1d.weight", true, FlatVector, mc.CD(), 1, mc.ConvKernel)
		t.Params[li.conv].Init = InitConv
		if mc.ConvBias {
			li.convBias = t.addBias(m+"conv1d.bias", mc.CD())
		}
		li.dtBias = t.add(m+"dt_bias", false, mc.Heads)
		t.Params[li.dtBias].Init = InitDtBias
		li.aLog = t.add(m+"A_log", false, mc.Heads)
		t.Params[li.aLog].Init = InitALog
		li.dD = t.add(m+"D", false, mc.Heads)
		li.mnorm = t.add(m+"norm.weight", false, mc.DI())
		li.outProj = t.add(m+"out_proj.weight", true, C, mc.DI())
	case LayerAttention:
		li.q = t.add(m+"q_proj.weight", true, NH*HD, C)
		li.k = t.add(m+"k_proj.weight", true, NKV*HD, C)
		li.v = t.add(m+"v_proj.weight", true, NKV*HD, C)
		li.o = t.add(m+"o_proj.weight", true, C, NH*HD)
	case LayerMLP:
		li.up = t.add(m+"up_proj.weight", true, cfg.IntermediateSize, C)
		li.down = t.add(m+"down_proj.weight", true, C, cfg.IntermediateSize)
	case LayerMoE:
		li.router = t.addFlat(m+"gate.weight", true, FlatVector, e.NumExperts, C)
		t.Params[li.router].Router = true
		li.ebias = t.add(m+"gate.e_score_correction_bias", false, e.NumExperts)
		t.Params[li.ebias].Buffer = true
		in := C
		if e.LatentSize > 0 {
			in = e.LatentSize
			li.fc1 = t.add(m+"fc1_latent_proj.weight", true, in, C)
			li.fc2 = t.add(m+"fc2_latent_proj.weight", true, C, in)
		}
		for x := range e.NumExperts {
			i := t.add(fmt.Sprintf("%sexperts.%d.up_proj.weight", m, x), true, e.IntermediateSize, in)
			if x == 0 {
				li.eguFirst = i
			}
		}
		li.eguLast = len(t.Params) - 1
		for x := range e.NumExperts {
			i := t.add(fmt.Sprintf("%sexperts.%d.down_proj.weight", m, x), true, in, e.IntermediateSize)
			if x == 0 {
				li.edownFirst = i
			}
		}
		li.edownLast = len(t.Params) - 1
		li.shUp = t.add(m+"shared_experts.up_proj.weight", true, e.SharedSize, C)
		li.shDown = t.add(m+"shared_experts.down_proj.weight", true, C, e.SharedSize)
	}
	return li
}

// scan is the Mamba-2 mixers' kernels.Scan.
func (c Config) scan() kernels.Scan {
	m := c.Mamba
	return kernels.Scan{MH: m.Heads, MP: m.HeadDim, G: m.Groups, DS: m.StateSize, Chunk: m.ChunkSize,
		DtMin: float32(m.DtMin), DtMax: float32(m.DtMax)}
}

// hybridRouter is a hybrid model's sparse blocks' kernels.Router, without
// the layer's selection bias (hybridMoE sets it).
func (c Config) hybridRouter() kernels.Router {
	m := c.MoE
	return kernels.Router{K: m.TopK, Norm: m.NormTopKProb, Sigmoid: true, Groups: m.Groups, TopGroups: m.TopGroups,
		Scale: float32(m.RoutedScaling)}
}

// expertIn is the width the routed experts read and write: the latent
// size, or C.
func (c Config) expertIn() int {
	if c.MoE.LatentSize > 0 {
		return c.MoE.LatentSize
	}
	return c.HiddenSize
}

// hybridActs are one hybrid block's activations saved for the backward
// pass (beside layerActs' x, ln1 and rstd1), each for MaxTokens rows; "w"
// marks the GEMM precision, everything else F32. Only the fields of the
// block's kind are cut.
type hybridActs struct {
	// Mamba-2: in_proj's z, pre-conv xBC and dt; the conv's output; the
	// scan's output; the gated norm's output and statistics.
	z    kernels.Buf // (T,DI)
	xpre kernels.Buf // (T,CD)
	dt   kernels.Buf // (T,MH)
	xbc  kernels.Buf // (T,CD) w
	y    kernels.Buf // (T,DI)
	g    kernels.Buf // (T,DI) w
	grs  kernels.Buf // (T,G)
	// MLP: up's output and its squared ReLU.
	up, h kernels.Buf // (T,I) w
	// MoE: the latent input, the experts' up output and its squared ReLU,
	// their outputs, the shared expert's up output and its squared ReLU
	// (the router's are in layerActs.moe).
	lat     kernels.Buf // (T,Lat) w
	eup, eh kernels.Buf // (N,Im) w
	ey      kernels.Buf // (N,In)
	sup, sh kernels.Buf // (T,Ish) w
	combW   kernels.Buf // (T,Lat) w: the routed experts' sum, fc2's input
}

// hybridScratch are a hybrid model's buffers shared by every block (one
// block's worth), sized once.
type hybridScratch struct {
	proj    kernels.Buf // (T,in_proj) F32: a Mamba block's input projection's output
	projA   kernels.Buf // (T,q|k|v) F32: an attention block's
	lnF     kernels.Buf // (T,C) F32: a sparse block's normed input for the fp32 router (BF16 only)
	comb    kernels.Buf // (T,Lat) F32: the routed experts' sum in the latent space
	tmpC    kernels.Buf // (T,C) F32: the shared expert's output (dlnF's memory)
	xp      kernels.Buf // (N,In) w: the experts' gathered inputs (in the backward first their outputs' gradient)
	dproj   kernels.Buf // (T,in_proj) w: a Mamba block's packed input-projection gradient
	dprojA  kernels.Buf // (T,q|k|v) w: an attention block's
	dg, dy  kernels.Buf // (T,DI)
	dz      kernels.Buf // (T,DI)
	dxbc    kernels.Buf // (T,CD)
	dxpre   kernels.Buf // (T,CD)
	ddt     kernels.Buf // (T,MH)
	dh, dup kernels.Buf // (T,I): an MLP block's
	dsh     kernels.Buf // (T,Ish): the shared expert's (in deh's memory)
	dsup    kernels.Buf // (T,Ish)
	deh     kernels.Buf // (N,Im): deh, then deup in place (the experts' dy is in xp, their dxp in ey)
	dxin    kernels.Buf // (T,In)
	dcomb   kernels.Buf // (T,Lat)
	dlnF    kernels.Buf // (T,C) (BF16 only)
	gradW   kernels.Buf // (max(T·I, T·Ish, N·Im, T·Lat)) w: a gradient rounded for its GEMM (BF16 only)
	// The forest of a packed micro-batch of sequences for the conv and the
	// scan (its non-empty sequences as roots).
	forestOffs, forestParent, forestEnds kernels.Buf // (S+1), (S), (S) I32
	// Each scan piece's offsets from 0 (scanPieces), when S is more than
	// one scan runs.
	pieceOffs kernels.Buf // (pieceSlots(S)) I32
}

// layoutBlock plans one block's saved activations of kind k (layerActs'
// ln1 and rstd1 and the kind's hybridActs) for MaxTokens rows: f32 in
// p.f, the GEMM precision's in p.w under BF16, I32 in p.i.
func (m *Model) layoutBlock(p *actPlan, a *layerActs, h *hybridActs, k LayerKind) {
	c := m.cfg
	T := m.opt.MaxTokens
	C := c.HiddenSize
	HD, NH, NKV := c.HeadDim, c.NumAttentionHeads, c.NumKeyValueHeads
	mc, e := c.Mamba, c.MoE
	E, K, Im, Ish, Lat, In := e.NumExperts, e.TopK, e.IntermediateSize, e.SharedSize, e.LatentSize, c.expertIn()
	N := T * K
	qn, kn := NH*HD, NKV*HD
	DI, CD, MH, G := mc.DI(), mc.CD(), mc.Heads, mc.Groups
	f, w := &p.f, &p.f
	if m.wdt == kernels.BF16 {
		w = &p.w
	}
	w.add(&a.ln1, T*C)
	f.add(&a.rstd1, T)
	switch k {
	case LayerMamba:
		f.add(&h.z, T*DI)
		f.add(&h.xpre, T*CD)
		f.add(&h.dt, T*MH)
		w.add(&h.xbc, T*CD)
		f.add(&h.y, T*DI)
		w.add(&h.g, T*DI)
		f.add(&h.grs, T*G)
	case LayerAttention:
		w.add(&a.q, T*qn)
		w.add(&a.k, T*kn)
		w.add(&a.v, T*kn)
		w.add(&a.att, T*qn)
		f.add(&a.lse, T*NH)
	case LayerMLP:
		w.add(&h.up, T*c.IntermediateSize)
		w.add(&h.h, T*c.IntermediateSize)
	case LayerMoE:
		f.add(&a.moe.probs, T*E)
		f.add(&a.moe.rw, T*K)
		p.i.add(&a.moe.order, N)
		p.i.add(&a.moe.slot, N)
		if Lat > 0 {
			w.add(&h.lat, T*Lat)
			w.add(&h.combW, T*Lat)
		}
		w.add(&h.eup, N*Im)
		w.add(&h.eh, N*Im)
		f.add(&h.ey, N*In)
		w.add(&h.sup, T*Ish)
		w.add(&h.sh, T*Ish)
	}
}

// layoutHybrid plans a hybrid model's activations, scratch and inputs for
// MaxTokens tokens (layoutActs for the uniform families). A training model
// keeps each block's activations for Backward (with Recompute only each
// block's input and one block of each kind); a forward-only reference
// keeps one of each and two alternating block inputs. Each sparse block
// keeps its chosen experts (the selection bias's counts read them after
// the forward) and its offsets.
func (m *Model) layoutHybrid() *actPlan {
	c := m.cfg
	T, S := m.opt.MaxTokens, m.opt.MaxSeqs
	C := c.HiddenSize
	HD, NH, NKV := c.HeadDim, c.NumAttentionHeads, c.NumKeyValueHeads
	mc, e := c.Mamba, c.MoE
	E, K, Im, Ish, Lat, In := e.NumExperts, e.TopK, e.IntermediateSize, e.SharedSize, e.LatentSize, c.expertIn()
	N := T * K
	qn, kn := NH*HD, NKV*HD
	DI, CD, MH := mc.DI(), mc.CD(), mc.Heads
	bf16 := m.wdt == kernels.BF16
	nM, nA, nL, nE := c.CountLayers(LayerMamba), c.CountLayers(LayerAttention), c.CountLayers(LayerMLP), c.CountLayers(LayerMoE)
	p := &actPlan{}
	p.w.elem = m.wdt.Size()
	f := &p.f
	w := &p.f
	if bf16 {
		w = &p.w
	}
	L := c.NumHiddenLayers
	m.la = make([]layerActs, L)
	m.hy = make([]hybridActs, L)
	var xs [2]kernels.Buf
	if m.forwardOnly {
		f.add(&xs[0], T*C)
		f.add(&xs[1], T*C)
	} else {
		for l := range m.la {
			f.add(&m.la[l].x, T*C)
		}
	}
	block := func(a *layerActs, h *hybridActs, k LayerKind) { m.layoutBlock(p, a, h, k) }
	share := m.opt.Recompute || m.forwardOnly
	var shared [LayerMoE + 1]struct {
		a layerActs
		h hybridActs
	}
	// kinds[k] lays out what only a block of kind k uses while it runs
	// (its forward, or its recomputation and backward): its kind's shared
	// activations, when one block's worth is kept, and its own scratch.
	// No two blocks run at once (an MTP depth's blocks too: each is
	// recomputed again just before its own backward, hybridBackward), so
	// the kinds share memory (actPlan.union).
	var kinds [LayerMoE + 1][]func()
	if share {
		for _, k := range []LayerKind{LayerMamba, LayerAttention, LayerMLP, LayerMoE} {
			if c.CountLayers(k) > 0 {
				kinds[k] = append(kinds[k], func() { block(&shared[k].a, &shared[k].h, k) })
			}
		}
	} else {
		for l := range m.la {
			block(&m.la[l], &m.hy[l], c.Layers[l])
		}
	}
	// The sparse blocks' chosen experts and offsets, per block always.
	m.offsets, m.psum, m.auxGrad = nil, nil, nil
	rexp := make([]kernels.Buf, L)
	if nE > 0 {
		m.offsets = make([]kernels.Buf, L)
		for l := range m.la {
			if c.Layers[l] == LayerMoE {
				p.i.add(&m.offsets[l], E+1)
				p.i.add(&rexp[l], T*K)
			}
		}
	}
	hs := &m.hs
	*hs = hybridScratch{}
	qkvN := qn + 2*kn
	// Each kind's own scratch. A Mamba block's in_proj output is read by
	// its forward alone, its gradients by its backward alone (a
	// recomputed forward ends before the backward begins): they share
	// memory, and dg and dy are spent (by the gated norm's and the scan's
	// backward) before the conv's backward writes dxpre.
	if nM > 0 {
		P := mc.InProj()
		kinds[LayerMamba] = append(kinds[LayerMamba], func() {
			fwd := func() { f.add(&hs.proj, T*P) }
			if m.forwardOnly {
				fwd()
				return
			}
			p.union(fwd, func() {
				f.add(&hs.dz, T*DI)
				f.add(&hs.dxbc, T*CD)
				f.add(&hs.ddt, T*MH)
				p.union(func() {
					f.add(&hs.dg, T*DI)
					f.add(&hs.dy, T*DI)
				}, func() { f.add(&hs.dxpre, T*CD) })
				w.add(&hs.dproj, T*P)
			})
		})
	}
	if nA > 0 {
		kinds[LayerAttention] = append(kinds[LayerAttention], func() {
			f.add(&hs.projA, T*qkvN)
			if m.forwardOnly {
				return
			}
			f.add(&m.datt, T*qn)
			f.add(&m.dq, T*qn)
			f.add(&m.dk, T*kn)
			f.add(&m.dv, T*kn)
			if bf16 {
				w.add(&m.dattW, T*qn)
			}
			w.add(&hs.dprojA, T*qkvN)
		})
	}
	if nE > 0 {
		f.add(&m.rlogits, T*E)
		kinds[LayerMoE] = append(kinds[LayerMoE], func() {
			w.add(&hs.xp, N*In)
			// The shared expert's output (read by the forward's tail
			// alone) and the router input's gradient (the backward's
			// last) share memory.
			p.union(func() { f.add(&hs.tmpC, T*C) }, func() {
				if bf16 && !m.forwardOnly {
					f.add(&hs.dlnF, T*C)
				}
			})
			if bf16 {
				f.add(&hs.lnF, T*C)
			}
			if Lat > 0 {
				f.add(&hs.comb, T*Lat)
			}
		})
	}
	f.add(&m.xf, T*C)
	w.add(&m.lnf, T*C)
	for _, x := range []*kernels.Buf{&m.rstdf, &m.lp, &m.ent, &m.lseHead} {
		f.add(x, T)
	}
	if !m.forwardOnly {
		for _, x := range []*kernels.Buf{&m.dx, &m.dln, &m.dlnf} {
			f.add(x, T*C)
		}
		f.add(&m.dlp, T)
		if bf16 {
			w.add(&m.dxW, T*C)
		}
		if nL > 0 {
			kinds[LayerMLP] = append(kinds[LayerMLP], func() {
				f.add(&hs.dh, T*c.IntermediateSize)
				f.add(&hs.dup, T*c.IntermediateSize)
			})
		}
		if nE > 0 {
			kinds[LayerMoE] = append(kinds[LayerMoE], func() {
				// The shared expert's gradients are spent before deh
				// is first written (hybridMoEBackward).
				p.union(func() {
					f.add(&hs.dsh, T*Ish)
					f.add(&hs.dsup, T*Ish)
				}, func() { f.add(&hs.deh, N*Im) }) // deup too, in place
				f.add(&hs.dxin, T*In)
				f.add(&m.drw, T*K)
				f.add(&m.dlogits, T*E)
				if Lat > 0 {
					f.add(&hs.dcomb, T*Lat)
				}
			})
		}
		if bf16 {
			n := 0
			if nL > 0 {
				n = T * c.IntermediateSize
			}
			if nE > 0 {
				n = max(n, T*Ish, N*Im, T*Lat, T*In)
			}
			if n > 0 {
				w.add(&hs.gradW, n)
			}
		}
	}
	var alts []func()
	for _, fs := range kinds {
		if len(fs) > 0 {
			alts = append(alts, func() {
				for _, f := range fs {
					f()
				}
			})
		}
	}
	p.union(alts...)
	p.i.add(&m.tokens, T)
	p.i.add(&m.pos, T)
	p.i.add(&m.target, T)
	p.i.add(&m.cu, S+1)
	if nM > 0 {
		p.i.add(&hs.forestOffs, S+1)
		p.i.add(&hs.forestParent, S)
		p.i.add(&hs.forestEnds, S)
		if n := pieceSlots(S); n > 0 {
			p.i.add(&hs.pieceOffs, n)
		}
	}
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
				m.la[l], m.hy[l] = shared[c.Layers[l]].a, shared[c.Layers[l]].h
				m.la[l].x = x
			}
			if m.forwardOnly {
				m.la[l].x = xs[l%2]
			}
			m.la[l].moe.rexp = rexp[l]
			m.la[l].q32, m.la[l].k32 = m.la[l].q, m.la[l].k
		}
	}
	m.layoutMTP(p)
	return p
}
