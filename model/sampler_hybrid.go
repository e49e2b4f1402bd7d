package model

// The Sampler of a hybrid model (Nemotron-H): its prompts are prefilled
// through the model's packed forward, as the uniform families' are, each
// Mamba block keeping its sequences' final SSM states and last
// conv_kernel − 1 pre-conv rows, each attention block its keys and values;
// a decode step then runs the model's own blocks on one token a slot,
// whose Mamba blocks take the decoding forms (kernels.Mamba's
// Conv1DDecode and SSMDecode, against the slots' windows and states) and
// whose attention blocks write their keys and values into the cache and
// attend over it (AttentionDecode). The MLP and sparse blocks are the
// forward's, on the slots' rows.

import (
	"fmt"

	"github.com/tracegrpo/tracegrpo/kernels"
)

// hybridDecode is what a hybrid model's blocks read while its Sampler runs
// them (Model.dec): per block, the Mamba windows and states or the
// attention caches of every slot, and the decode step's inputs.
type hybridDecode struct {
	prefill       bool
	window, state []kernels.Buf // per Mamba block: (B, KW−1, CD), (B, MH·MP·DS) F32
	kc, vc        []kernels.Buf // per attention block: (B, maxLen, NKV·HD), the model's precision
	final         kernels.Buf   // (MaxSeqs, MH·MP·DS) F32: a prefill's sequences' final states
	att32         kernels.Buf   // (B, NH·HD) F32: AttentionDecode's output under bf16
	lens, idx     kernels.Buf   // the decode step's contexts and cache rows (B) I32: the Sampler's
	maxLen        int
}

// ssmState is the elements of one sequence's Mamba-2 state.
func (c Config) ssmState() int { return c.Mamba.Heads * c.Mamba.HeadDim * c.Mamba.StateSize }

// layoutHybrid plans a hybrid model's sampler: the attention blocks'
// caches in cp, the Mamba blocks' windows and states and the decode
// buffers in ap, the GEMM input of the prefill's last rows in w, the
// inputs in ip.
func (s *Sampler) layoutHybrid(c Config, opt Options) (cp, ap, wp, ip arenaPlan) {
	C, HD, NH, NKV, V := c.HiddenSize, c.HeadDim, c.NumAttentionHeads, c.NumKeyValueHeads, c.VocabSize
	qn, kn, B, maxLen := NH*HD, NKV*HD, s.maxBatch, s.maxLen
	w := &ap
	if opt.Precision == kernels.BF16 {
		w = &wp
		cp.elem, wp.elem = 2, 2
	}
	L := c.NumHiddenLayers
	d := &hybridDecode{maxLen: maxLen, window: make([]kernels.Buf, L), state: make([]kernels.Buf, L), kc: make([]kernels.Buf, L), vc: make([]kernels.Buf, L)}
	s.hy = d
	s.kc, s.vc = d.kc, d.vc
	SS, KW1, CD := c.ssmState(), c.Mamba.ConvKernel-1, c.Mamba.CD()
	for l, k := range c.Layers {
		switch k {
		case LayerAttention:
			cp.addProduct(&d.kc[l], B, maxLen, kn)
			cp.addProduct(&d.vc[l], B, maxLen, kn)
		case LayerMamba:
			ap.addProduct(&d.window[l], B, KW1, CD)
			ap.addProduct(&d.state[l], B, SS)
		}
	}
	if c.CountLayers(LayerMamba) > 0 {
		ap.addProduct(&d.final, opt.MaxSeqs, SS)
	}
	if c.CountLayers(LayerAttention) > 0 && opt.Precision == kernels.BF16 {
		ap.add(&d.att32, B*qn)
	}
	w.add(&s.ln, B*C)
	ap.add(&s.logits, B*V)
	ap.add(&s.lp, B)
	ip.add(&s.lens, B)
	ip.add(&s.sampled, B)
	ip.add(&s.u, 2*B)
	ip.add(&s.idx, max(opt.MaxTokens, B))
	return cp, ap, wp, ip
}

// checkHybridSampler refuses a batch the model cannot run as one decode
// step (one sequence of one token a slot).
func checkHybridSampler(m *Model, maxBatch int) error {
	if maxBatch > m.opt.MaxTokens || maxBatch > m.opt.MaxSeqs {
		return fmt.Errorf("model: sampler: a batch of %d: a Nemotron-H model decodes its slots as one forward of %d one-token sequences, over its Options.MaxTokens %d or MaxSeqs %d",
			maxBatch, maxBatch, m.opt.MaxTokens, m.opt.MaxSeqs)
	}
	return nil
}

// hybridPrefilled keeps, after block l of a prefill of prompts into slots
// (packed as cu), what the decode steps read: an attention block's keys
// and values (ScatterRows to the cache rows staged in s.idx), a Mamba
// block's final states and last KW−1 pre-conv rows (zeros before a short
// prompt's first).
func (s *Sampler) hybridPrefilled(l int, slots []int, cu []int32) {
	m, d := s.m, s.hy
	b, c := m.b, m.cfg
	T := int(cu[len(cu)-1])
	switch c.Layers[l] {
	case LayerAttention:
		kn := c.NumKeyValueHeads * c.HeadDim
		b.ScatterRows(d.kc[l], m.la[l].k.Slice(0, T*kn), s.idx.Slice(0, T), T, kn)
		b.ScatterRows(d.vc[l], m.la[l].v.Slice(0, T*kn), s.idx.Slice(0, T), T, kn)
	case LayerMamba:
		SS, KW1, CD := c.ssmState(), c.Mamba.ConvKernel-1, c.Mamba.CD()
		xpre := m.hy[l].xpre
		for k, sl := range slots {
			b.CopyCols(d.state[l].Slice(sl*SS, SS), d.final.Slice(k*SS, SS), 1, SS, SS, SS)
			if KW1 == 0 {
				continue
			}
			win := d.window[l].Slice(sl*KW1*CD, KW1*CD)
			n := min(int(cu[k+1]-cu[k]), KW1)
			if n < KW1 {
				b.Fill(win.Slice(0, (KW1-n)*CD), 0)
			}
			b.CopyCols(win.Slice((KW1-n)*CD, n*CD), xpre.Slice((int(cu[k+1])-n)*CD, n*CD), n, CD, CD, CD)
		}
	}
}

// decodeHybrid runs one token for each of the n active slots (inputs
// staged in hTok, hIdx, hLens) through the model's blocks and leaves their
// logits in s.logits.
func (s *Sampler) decodeHybrid(n int) error {
	m := s.m
	b, c := m.b, m.cfg
	C, V := c.HiddenSize, c.VocabSize
	s.decCu = s.decCu[:0]
	for i := range n + 1 {
		s.decCu = append(s.decCu, int32(i))
	}
	if err := m.stage(s.hTok[:n], s.decCu, 1); err != nil {
		return fmt.Errorf("model: sample: decode: %w", err)
	}
	b.UploadI32(s.lens.Slice(0, n), s.hLens[:n])
	b.UploadI32(s.idx.Slice(0, n), s.hIdx[:n])
	s.hy.prefill, s.hy.lens, s.hy.idx = false, s.lens, s.idx
	m.dec = s.hy
	m.forwardBody(nil)
	m.dec = nil
	m.haveForward = false
	b.Matmul(s.logits.Slice(0, n*V), m.lnf.Slice(0, n*C), m.lmHeadW, n, C, V)
	return nil
}

// moveHybridSlot moves slot from's windows, states and caches into slot to.
func (s *Sampler) moveHybridSlot(from, to int) {
	m, d := s.m, s.hy
	c := m.cfg
	SS, KW1, CD := c.ssmState(), c.Mamba.ConvKernel-1, c.Mamba.CD()
	kn := c.NumKeyValueHeads * c.HeadDim
	for l, k := range c.Layers {
		switch k {
		case LayerAttention:
			n := s.fill[from] * kn
			m.b.Convert(d.kc[l].Slice(to*s.maxLen*kn, n), d.kc[l].Slice(from*s.maxLen*kn, n))
			m.b.Convert(d.vc[l].Slice(to*s.maxLen*kn, n), d.vc[l].Slice(from*s.maxLen*kn, n))
		case LayerMamba:
			m.b.CopyCols(d.state[l].Slice(to*SS, SS), d.state[l].Slice(from*SS, SS), 1, SS, SS, SS)
			if KW1 > 0 {
				m.b.CopyCols(d.window[l].Slice(to*KW1*CD, KW1*CD), d.window[l].Slice(from*KW1*CD, KW1*CD), 1, KW1*CD, KW1*CD, KW1*CD)
			}
		}
	}
}

// mambaDecode queues a Mamba block's conv and scan in their decoding
// forms for the decode step's n rows (one token a slot).
func (m *Model) mambaDecode(l int, xbc, xpre, dt, y kernels.Buf) {
	d, c, w := m.dec, m.cfg, &m.layers[l]
	n, mc := m.lastT, c.Mamba
	KW1, CD := mc.ConvKernel-1, mc.CD()
	m.mamba.Conv1DDecode(xbc, d.window[l].Slice(0, n*KW1*CD), xpre, w.conv, w.convBias, n, CD, mc.ConvKernel)
	m.mamba.SSMDecode(y, d.state[l].Slice(0, n*c.ssmState()), xbc, dt, w.dtBias, w.aLog, w.dD, n, c.scan())
}

// attnDecode queues an attention block's decode step: the slots' keys and
// values into the cache, then attention over it into att.
func (m *Model) attnDecode(l int, att, q, k, v kernels.Buf) {
	d, c, b := m.dec, m.cfg, m.b
	n := m.lastT
	NH, NKV, HD := c.NumAttentionHeads, c.NumKeyValueHeads, c.HeadDim
	kn := NKV * HD
	idx := d.idx.Slice(0, n)
	b.ScatterRows(d.kc[l], k, idx, n, kn)
	b.ScatterRows(d.vc[l], v, idx, n, kn)
	out := att
	if d.att32.N > 0 {
		out = d.att32.Slice(0, n*NH*HD)
	}
	b.AttentionDecode(out, q, d.kc[l].Slice(0, n*d.maxLen*kn), d.vc[l].Slice(0, n*d.maxLen*kn), d.lens.Slice(0, n), n, d.maxLen, NH, NKV, HD)
	if d.att32.N > 0 {
		b.Convert(att, out)
	}
}
