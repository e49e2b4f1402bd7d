package model

import (
	"fmt"

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
}

// layerView holds one decoder layer's parameter views (or gradient views).
type layerView struct {
	ln1, q, k, v, qBias, kBias, vBias, o, qNorm, kNorm, ln2, gate, up, down kernels.Buf
}

// layerActs are the activations of one layer saved for the backward pass,
// each sized for MaxTokens rows.
type layerActs struct {
	x     kernels.Buf // (T,C) layer input (residual stream)
	ln1   kernels.Buf // (T,C)
	rstd1 kernels.Buf // (T)
	qraw  kernels.Buf // (T,NH,HD) q projection before q_norm (Qwen3 only)
	qrstd kernels.Buf // (T,NH) (Qwen3 only)
	kraw  kernels.Buf // (T,NKV,HD) (Qwen3 only)
	krstd kernels.Buf // (T,NKV) (Qwen3 only)
	q     kernels.Buf // (T,NH,HD) after norm and rope
	k     kernels.Buf // (T,NKV,HD) after norm and rope
	v     kernels.Buf // (T,NKV,HD)
	att   kernels.Buf // (T,NH,HD)
	lse   kernels.Buf // (T,NH)
	xmid  kernels.Buf // (T,C) residual after attention
	ln2   kernels.Buf // (T,C)
	rstd2 kernels.Buf // (T)
	gate  kernels.Buf // (T,I)
	up    kernels.Buf // (T,I)
	h     kernels.Buf // (T,I) silu(gate)·up
}

// Model is a Qwen2, Qwen3 or Llama decoder on a kernels.Backend: one parameter
// arena, one gradient arena and activations sized once for Options.
// A Model is driven by one goroutine.
type Model struct {
	b     kernels.Backend
	cfg   Config
	opt   Options
	table ParamTable
	tidx  tableIdx
	lidx  []layerIdx

	params, grads kernels.Buf
	acts          kernels.Buf // every activation and scratch buffer
	ints          kernels.Buf // tokens, positions, targets, cu_seqlens

	// RoPE tables for positions [0, ropeP), computed from the config once.
	rope             kernels.Buf // both tables
	ropeCos, ropeSin kernels.Buf // (ropeP, HD/2) each
	ropeP            int

	// Parameter and gradient views.
	wte, norm, lmHead    kernels.Buf
	dwte, dnorm, dlmHead kernels.Buf
	layers, dlayers      []layerView

	// Activations.
	la                  []layerActs
	xf                  kernels.Buf // (T,C) output of the last layer
	lnf                 kernels.Buf // (T,C)
	rstdf               kernels.Buf // (T)
	lp, ent, lseHead    kernels.Buf // (T) logprob of targets, entropy, lse
	dlp                 kernels.Buf // (T)
	dx, dln, dlnf       kernels.Buf // (T,C)
	datt, dq, dqraw     kernels.Buf // (T,NH,HD)
	dk, dv, dkraw       kernels.Buf // (T,NKV,HD)
	dgate, dup, dh      kernels.Buf // (T,I)
	tokens, pos, target kernels.Buf // (T) I32
	cu                  kernels.Buf // (S+1) I32

	// Host staging, sized once.
	hTokens, hPos, hTarget, hCu []int32
	hLp, hEnt, hDlp             []float32
	outLp, outEnt               []float32

	// State of the last Forward, for Backward.
	lastT, lastS, lastMaxLen int
	lastInvTemp              float32
	haveForward              bool
}

// New allocates a model's arenas on b. Parameters start at zero; call
// InitRandom or LoadHF.
func New(b kernels.Backend, cfg Config, opt Options) (*Model, error) {
	if err := cfg.Validate(); err != nil {
		return nil, fmt.Errorf("model: %w", err)
	}
	if opt.MaxTokens <= 0 {
		return nil, fmt.Errorf("model: Options.MaxTokens: expected a positive number, found %d", opt.MaxTokens)
	}
	if opt.MaxSeqs <= 0 {
		opt.MaxSeqs = opt.MaxTokens
	}
	if opt.MaxSeqLen <= 0 {
		opt.MaxSeqLen = opt.MaxTokens
	}
	m := &Model{b: b, cfg: cfg, opt: opt}
	m.table, m.tidx, m.lidx = newTable(cfg)
	var err error
	if m.params, err = b.Alloc(kernels.F32, m.table.Total); err != nil {
		return nil, fmt.Errorf("model: parameter arena of %d floats: %w", m.table.Total, err)
	}
	if m.grads, err = b.Alloc(kernels.F32, m.table.Total); err != nil {
		b.Free(m.params)
		return nil, fmt.Errorf("model: gradient arena of %d floats: %w", m.table.Total, err)
	}
	view := func(arena kernels.Buf, i int) kernels.Buf {
		if i < 0 {
			return kernels.Buf{}
		}
		p := m.table.Params[i]
		return arena.Slice(p.Offset, p.N)
	}
	m.wte, m.dwte = view(m.params, m.tidx.wte), view(m.grads, m.tidx.wte)
	m.norm, m.dnorm = view(m.params, m.tidx.norm), view(m.grads, m.tidx.norm)
	if cfg.TieWordEmbeddings {
		m.lmHead, m.dlmHead = m.wte, m.dwte
	} else {
		m.lmHead, m.dlmHead = view(m.params, m.tidx.lmHead), view(m.grads, m.tidx.lmHead)
	}
	for _, li := range m.lidx {
		for _, arena := range []kernels.Buf{m.params, m.grads} {
			lv := layerView{
				ln1: view(arena, li.ln1), q: view(arena, li.q), k: view(arena, li.k), v: view(arena, li.v),
				qBias: view(arena, li.qBias), kBias: view(arena, li.kBias), vBias: view(arena, li.vBias),
				o: view(arena, li.o), qNorm: view(arena, li.qNorm), kNorm: view(arena, li.kNorm),
				ln2: view(arena, li.ln2), gate: view(arena, li.gate), up: view(arena, li.up), down: view(arena, li.down),
			}
			if arena == m.params {
				m.layers = append(m.layers, lv)
			} else {
				m.dlayers = append(m.dlayers, lv)
			}
		}
	}
	if err := m.allocActs(); err != nil {
		b.Free(m.params)
		b.Free(m.grads)
		return nil, err
	}
	if err := m.ensureRope(opt.MaxSeqLen); err != nil {
		m.Close()
		return nil, err
	}
	T, S := opt.MaxTokens, opt.MaxSeqs
	m.hTokens, m.hPos, m.hTarget, m.hCu = make([]int32, T), make([]int32, T), make([]int32, T), make([]int32, S+1)
	m.hLp, m.hEnt, m.hDlp = make([]float32, T), make([]float32, T), make([]float32, T)
	m.outLp, m.outEnt = make([]float32, T), make([]float32, T)
	return m, nil
}

// arenaPlan cuts named views out of one allocation.
type arenaPlan struct {
	n    int
	dsts []*kernels.Buf
	lens []int
}

func (p *arenaPlan) add(dst *kernels.Buf, n int) {
	p.dsts = append(p.dsts, dst)
	p.lens = append(p.lens, n)
	p.n += n
}

func (p *arenaPlan) cut(arena kernels.Buf) {
	off := 0
	for i, d := range p.dsts {
		*d = arena.Slice(off, p.lens[i])
		off += p.lens[i]
	}
}

func (m *Model) allocActs() error {
	c := m.cfg
	T, S := m.opt.MaxTokens, m.opt.MaxSeqs
	C, I, HD, NH, NKV := c.HiddenSize, c.IntermediateSize, c.HeadDim, c.NumAttentionHeads, c.NumKeyValueHeads
	qn, kn := NH*HD, NKV*HD
	var f arenaPlan
	m.la = make([]layerActs, c.NumHiddenLayers)
	for l := range m.la {
		f.add(&m.la[l].x, T*C)
	}
	for l := range m.la {
		if m.opt.Recompute && l > 0 {
			break // every layer shares layer 0's activations
		}
		a := &m.la[l]
		f.add(&a.ln1, T*C)
		f.add(&a.rstd1, T)
		if c.Arch == Qwen3 {
			f.add(&a.qraw, T*qn)
			f.add(&a.qrstd, T*NH)
			f.add(&a.kraw, T*kn)
			f.add(&a.krstd, T*NKV)
		}
		f.add(&a.q, T*qn)
		f.add(&a.k, T*kn)
		f.add(&a.v, T*kn)
		f.add(&a.att, T*qn)
		f.add(&a.lse, T*NH)
		f.add(&a.xmid, T*C)
		f.add(&a.ln2, T*C)
		f.add(&a.rstd2, T)
		f.add(&a.gate, T*I)
		f.add(&a.up, T*I)
		f.add(&a.h, T*I)
	}
	for _, x := range []*kernels.Buf{&m.xf, &m.lnf, &m.dx, &m.dln, &m.dlnf} {
		f.add(x, T*C)
	}
	for _, x := range []*kernels.Buf{&m.rstdf, &m.lp, &m.ent, &m.lseHead, &m.dlp} {
		f.add(x, T)
	}
	for _, x := range []*kernels.Buf{&m.datt, &m.dq, &m.dqraw} {
		f.add(x, T*qn)
	}
	for _, x := range []*kernels.Buf{&m.dk, &m.dv, &m.dkraw} {
		f.add(x, T*kn)
	}
	for _, x := range []*kernels.Buf{&m.dgate, &m.dup, &m.dh} {
		f.add(x, T*I)
	}
	var err error
	if m.acts, err = m.b.Alloc(kernels.F32, f.n); err != nil {
		return fmt.Errorf("model: activations of %d floats for %d tokens: %w", f.n, T, err)
	}
	f.cut(m.acts)
	if m.opt.Recompute {
		for l := 1; l < len(m.la); l++ {
			x := m.la[l].x
			m.la[l] = m.la[0]
			m.la[l].x = x
		}
	}
	var ip arenaPlan
	ip.add(&m.tokens, T)
	ip.add(&m.pos, T)
	ip.add(&m.target, T)
	ip.add(&m.cu, S+1)
	if m.ints, err = m.b.Alloc(kernels.I32, ip.n); err != nil {
		m.b.Free(m.acts)
		return fmt.Errorf("model: token buffers: %w", err)
	}
	ip.cut(m.ints)
	return nil
}

// Close frees the model's buffers.
func (m *Model) Close() {
	for _, b := range []kernels.Buf{m.params, m.grads, m.acts, m.ints, m.rope} {
		if b.N > 0 {
			m.b.Free(b)
		}
	}
	m.params, m.grads, m.acts, m.ints, m.rope = kernels.Buf{}, kernels.Buf{}, kernels.Buf{}, kernels.Buf{}, kernels.Buf{}
	m.ropeP = 0
}

// Config returns the model's configuration.
func (m *Model) Config() Config { return m.cfg }

// Options returns the sizes the model was built for.
func (m *Model) Options() Options { return m.opt }

// Backend returns the backend the model runs on.
func (m *Model) Backend() kernels.Backend { return m.b }

// Table returns the parameter table shared by Params and Grads.
func (m *Model) Table() *ParamTable { return &m.table }

// Params is the flat parameter arena (Table().Total floats).
func (m *Model) Params() kernels.Buf { return m.params }

// Grads is the flat gradient arena, laid out like Params.
func (m *Model) Grads() kernels.Buf { return m.grads }

// ZeroGrad sets every gradient to zero.
func (m *Model) ZeroGrad() { m.b.Fill(m.grads, 0) }
