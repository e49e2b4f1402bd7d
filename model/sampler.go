package model

import (
	"fmt"
	"math"
	"math/rand/v2"

	"github.com/tracegrpo/tracegrpo/internal/checked"
	"github.com/tracegrpo/tracegrpo/kernels"
)

// SampleOptions control one call of Sampler.Sample.
type SampleOptions struct {
	// Temperature divides the logits; 0 means greedy decoding (argmax, with
	// logprob 0 under that point-mass distribution).
	Temperature float32
	// TopK and TopP filter the temperature-scaled logits as NeMo RL and
	// vLLM do (kernels.TopKTopP: top-k keeps every logit equal to the
	// TopK-th largest; top-p keeps the smallest set of most likely tokens
	// reaching TopP after top-k). TopK 0 and TopP 0 or 1 disable them.
	TopP float64
	TopK int
	// MaxNewTokens bounds the generated tokens per prompt (> 0).
	MaxNewTokens int
	// StopTokens end a sequence when sampled (the stop token is returned).
	StopTokens []int32
	// Refill accepts more prompts than the sampler's batch: the first
	// maxBatch are decoded together and each slot a finished sequence
	// frees takes the next waiting prompt (prefilled into it), so the batch
	// stays full. Without it, more prompts than slots is an error.
	Refill bool
}

// Sample is one prompt's generation.
type Sample struct {
	Tokens []int32 // generated tokens, the stop token included
	// Logprobs[i] is log q(Tokens[i]) under the distribution actually sampled
	// from: softmax(logits/Temperature) restricted to the TopK/TopP set and
	// renormalised (the training head's filtered logprob under the same
	// filter). With neither, it equals Model.Forward's logprob at the
	// same temperature.
	Logprobs []float32
	Stopped  bool // a stop token ended the sequence (else MaxNewTokens or the cache length)
}

// Sampler decodes a batch of prompts incrementally with a KV cache. Prompts
// are prefilled through the model's packed forward (so a Sample call
// overwrites the activations of a pending Forward), then every step runs
// one token per unfinished sequence. A finished sequence's slot takes the
// next waiting prompt (SampleOptions.Refill) or leaves the batch, the last
// active sequence's cache moving into it.
//
// The KV cache and the decode GEMMs' inputs are in the model's precision:
// under mixed precision a bf16 cache and the bf16 weight copy, as the
// training forward computes (its keys and values are rounded to bf16 for
// attention too). On a backend that implements kernels.TokenSampler the
// tokens are drawn there: only each row's uniform (drawn here, from the
// row's own stream) goes to the device, and only token ids and logprobs
// come back, never the logits.
type Sampler struct {
	m                *Model
	maxBatch, maxLen int
	wdt              kernels.DType        // the cache's and the GEMM inputs' dtype: the model's precision
	device           kernels.TokenSampler // the backend's sampler, or nil: draw on the host

	cache  kernels.Buf   // every layer's K and V caches (wdt)
	kc, vc []kernels.Buf // per layer (maxBatch, maxLen, NKV, HD)
	acts   kernels.Buf   // F32 decode buffers
	actsW  kernels.Buf   // BF16 GEMM inputs (mixed precision only)
	ints   kernels.Buf

	// Decode activations, maxBatch rows. Under F32, qW, attW are q, att.
	x, xmid        kernels.Buf // (B,C)
	ln             kernels.Buf // (B,C) wdt: the GEMMs' input
	rstd           kernels.Buf // (B)
	qraw, q, att   kernels.Buf // (B,NH,HD)
	qW, attW       kernels.Buf // (B,NH,HD) wdt: attention's q, the o projection's input
	qrstd          kernels.Buf // (B,NH)
	kraw, k, v     kernels.Buf // (B,NKV,HD)
	krstd          kernels.Buf // (B,NKV)
	gate, up       kernels.Buf // (B,I)
	h              kernels.Buf // (B,I) wdt
	moe            moeBufs     // a sparse layer's, for B rows (B·K assignments)
	logits         kernels.Buf // (B,V)
	lp             kernels.Buf // (B) sampled tokens' logprobs
	tok, pos, lens kernels.Buf // (B) I32
	sampled        kernels.Buf // (B) I32 sampled tokens
	u              kernels.Buf // (2B) I32 each row's uniform, float64 bits
	idx            kernels.Buf // (max(MaxTokens, B)) I32 cache row of each token
	hTok, hPos     []int32
	hLens, hIdx    []int32
	hU, hSampled   []int32
	hUniform       []float64 // (B) each slot's uniform this step
	hLp            []float32
	hLogits        []float32             // (B,V), the host draw only
	zs             []float32             // (V) scaled logits, the host draw only
	fsc            kernels.FilterScratch // the host draw's filter histograms
	slotRow        []int                 // prompt index held by each cache slot
	fill           []int                 // tokens in each slot's cache
	pending        []bool                // a refilled slot not prefilled yet
	stop           map[int32]bool
	prefillTokens  []int32
	prefillCu      []int32
	prefillSlots   []int
	prefillPrompts [][]int32
	hy             *hybridDecode // a hybrid model's windows, states and caches (sampler_hybrid.go)
	decCu          []int32       // a hybrid decode step's one-token sequences
}

// NewSampler allocates KV caches for maxBatch sequences of at most maxLen
// tokens (prompt plus generation).
func NewSampler(m *Model, maxBatch, maxLen int) (*Sampler, error) {
	if err := checkSamplerShape(maxBatch, maxLen); err != nil {
		return nil, err
	}
	c := m.cfg
	V, B := c.VocabSize, maxBatch
	if err := m.ensureRope(maxLen); err != nil {
		return nil, fmt.Errorf("model: sampler: %w", err)
	}
	if c.Hybrid() {
		if err := checkHybridSampler(m, maxBatch); err != nil {
			return nil, err
		}
	}
	s := &Sampler{m: m, maxBatch: maxBatch, maxLen: maxLen, wdt: m.wdt}
	s.device, _ = m.b.(kernels.TokenSampler)
	cp, ap, wp, ip := s.layout(c, m.opt)
	if cp.over || ap.over || wp.over || ip.over {
		return nil, errSamplerOverflow(c, maxBatch, maxLen)
	}
	var err error
	if s.cache, err = m.b.Alloc(s.wdt, cp.n); err != nil {
		return nil, fmt.Errorf("model: sampler: KV cache of %d %s elements: %w", cp.n, s.wdt, err)
	}
	cp.cut(s.cache)
	if s.acts, err = m.b.Alloc(kernels.F32, ap.n); err != nil {
		s.Close()
		return nil, fmt.Errorf("model: sampler: activations: %w", err)
	}
	ap.cut(s.acts)
	if wp.n > 0 {
		if s.actsW, err = m.b.Alloc(s.wdt, wp.n); err != nil {
			s.Close()
			return nil, fmt.Errorf("model: sampler: %s activations: %w", s.wdt, err)
		}
		wp.cut(s.actsW)
	}
	if s.wdt == kernels.F32 {
		s.qW, s.attW = s.q, s.att
	}
	if s.ints, err = m.b.Alloc(kernels.I32, ip.n); err != nil {
		s.Close()
		return nil, fmt.Errorf("model: sampler: %w", err)
	}
	ip.cut(s.ints)
	nIdx := max(m.opt.MaxTokens, B)
	s.hTok, s.hPos, s.hLens, s.hIdx = make([]int32, B), make([]int32, B), make([]int32, B), make([]int32, nIdx)
	s.hU, s.hSampled, s.hLp, s.hUniform = make([]int32, 2*B), make([]int32, B), make([]float32, B), make([]float64, B)
	if s.device == nil {
		s.hLogits = make([]float32, B*V)
		s.zs = make([]float32, V)
	}
	s.slotRow, s.fill, s.pending = make([]int, B), make([]int, B), make([]bool, B)
	s.stop = map[int32]bool{}
	return s, nil
}

// layout plans the sampler's KV cache (cp, in the model's precision), F32
// decode buffers (ap), BF16 GEMM inputs (wp, empty under F32, where they
// are F32 buffers of ap) and I32 inputs (ip): NewSampler allocates them
// and PlanSampler reports them.
func (s *Sampler) layout(c Config, opt Options) (cp, ap, wp, ip arenaPlan) {
	if c.Hybrid() {
		return s.layoutHybrid(c, opt)
	}
	C, I, HD, NH, NKV, V := c.HiddenSize, c.IntermediateSize, c.HeadDim, c.NumAttentionHeads, c.NumKeyValueHeads, c.VocabSize
	qn, kn, B, maxLen := NH*HD, NKV*HD, s.maxBatch, s.maxLen
	w := &ap
	if opt.Precision == kernels.BF16 {
		w = &wp
		cp.elem, wp.elem = 2, 2
	}
	s.kc = make([]kernels.Buf, c.NumHiddenLayers)
	s.vc = make([]kernels.Buf, c.NumHiddenLayers)
	for l := range s.kc {
		cp.addProduct(&s.kc[l], B, maxLen, kn)
		cp.addProduct(&s.vc[l], B, maxLen, kn)
	}
	ap.add(&s.x, B*C)
	ap.add(&s.xmid, B*C)
	w.add(&s.ln, B*C)
	ap.add(&s.rstd, B)
	for _, x := range []*kernels.Buf{&s.qraw, &s.q, &s.att} {
		ap.add(x, B*qn)
	}
	if opt.Precision == kernels.BF16 {
		wp.add(&s.qW, B*qn)
		wp.add(&s.attW, B*qn)
	}
	ap.add(&s.qrstd, B*NH)
	for _, x := range []*kernels.Buf{&s.kraw, &s.k, &s.v} {
		ap.add(x, B*kn)
	}
	ap.add(&s.krstd, B*NKV)
	ap.add(&s.gate, B*I)
	ap.add(&s.up, B*I)
	w.add(&s.h, B*I)
	if c.Sparse() {
		E, K, Im := c.MoE.NumExperts, c.MoE.TopK, c.MoE.IntermediateSize
		N := B * K
		mb := &s.moe
		ap.add(&mb.logits, B*E)
		ap.add(&mb.probs, B*E)
		ap.add(&mb.rw, B*K)
		ip.add(&mb.rexp, B*K)
		ip.add(&mb.offsets, E+1)
		ip.add(&mb.order, N)
		ip.add(&mb.slot, N)
		w.add(&mb.xp, N*C)
		w.add(&mb.efused, N*2*Im)
		w.add(&mb.egate, N*Im)
		w.add(&mb.eup, N*Im)
		w.add(&mb.eh, N*Im)
		ap.add(&mb.ey, N*C)
	}
	ap.add(&s.logits, B*V)
	ap.add(&s.lp, B)
	ip.add(&s.tok, B)
	ip.add(&s.pos, B)
	ip.add(&s.lens, B)
	ip.add(&s.sampled, B)
	ip.add(&s.u, 2*B)
	ip.add(&s.idx, max(opt.MaxTokens, B))
	return cp, ap, wp, ip
}

// SamplerFootprint is the memory a Sampler allocates, in bytes.
type SamplerFootprint struct {
	KVCache int64 // every layer's keys and values
	Buffers int64 // decode activations, logits and inputs
	Rope    int64 // RoPE tables grown to cover maxLen (beyond the model's)
}

// MaxSamplerBatch bounds a Sampler's batch (its KV cache's sequences).
const MaxSamplerBatch = 1 << 16

// checkSamplerShape refuses a sampler batch or context that is not
// positive or beyond what the model's int32 positions and the batch cap
// allow.
func checkSamplerShape(maxBatch, maxLen int) error {
	if maxBatch <= 0 || maxBatch > MaxSamplerBatch || maxLen <= 0 || maxLen > MaxTokens {
		return fmt.Errorf("model: sampler: maxBatch %d and maxLen %d: expected [1, %d] and [1, %d]", maxBatch, maxLen, MaxSamplerBatch, MaxTokens)
	}
	return nil
}

func errSamplerOverflow(c Config, maxBatch, maxLen int) error {
	return checked.Overflow("model: sampler: the KV cache of %d layers for %d sequences of %d tokens exceeds %d elements", c.NumHiddenLayers, maxBatch, maxLen, int64(maxArena))
}

// PlanSampler returns what NewSampler(m, maxBatch, maxLen) allocates for a
// model built with cfg and opt, from the same layout.
func PlanSampler(cfg Config, opt Options, maxBatch, maxLen int) (SamplerFootprint, error) {
	m, err := shell(cfg, opt)
	if err != nil {
		return SamplerFootprint{}, err
	}
	if err := checkSamplerShape(maxBatch, maxLen); err != nil {
		return SamplerFootprint{}, err
	}
	s := &Sampler{maxBatch: maxBatch, maxLen: maxLen}
	cp, ap, wp, ip := s.layout(cfg, m.opt)
	if cp.over || ap.over || wp.over || ip.over {
		return SamplerFootprint{}, errSamplerOverflow(cfg, maxBatch, maxLen)
	}
	es := int64(m.opt.Precision.Size())
	f := SamplerFootprint{KVCache: int64(cp.n) * es, Buffers: int64(ap.n)*4 + int64(wp.n)*es + int64(ip.n)*4}
	if maxLen > m.opt.MaxSeqLen {
		f.Rope = int64(ropeElems(cfg, maxLen)-ropeElems(cfg, m.opt.MaxSeqLen)) * 4
	}
	return f, nil
}

// SamplerWorkload returns the ops a Sampler runs, for a backend to size
// its scratch: the prefill runs the model's forward, then decoding runs
// unfused per-layer GEMMs over at most maxBatch rows and the LM head.
func SamplerWorkload(cfg Config, opt Options, maxBatch, maxLen int) (kernels.Workload, error) {
	m, err := shell(cfg, opt)
	if err != nil {
		return kernels.Workload{}, err
	}
	w := m.workload(false)
	C, I, HD, NH, NKV, V := cfg.HiddenSize, cfg.IntermediateSize, cfg.HeadDim, cfg.NumAttentionHeads, cfg.NumKeyValueHeads, cfg.VocabSize
	B := maxBatch
	if cfg.Hybrid() {
		// A decode step runs the model's own blocks on one row a slot
		// (decodeHybrid): their GEMMs, norms and experts at B rows, the
		// Mamba blocks' decoding forms (no scratch) for conv and scan.
		d := *m
		d.opt.MaxTokens, d.opt.MaxSeqs, d.opt.MaxSeqLen = B, B, 1
		dw := d.hybridWorkload(false)
		w.GEMMs = append(append(w.GEMMs, dw.GEMMs...), kernels.GEMM{T: B, C: C, OC: V})
		w.RowNorms = append(w.RowNorms, dw.RowNorms...)
		w.Grouped = append(w.Grouped, dw.Grouped...)
		w.Routes = append(w.Routes, dw.Routes...)
		if cfg.CountLayers(LayerAttention) > 0 {
			w.Decode = []kernels.Decode{{B: B, Tmax: maxLen, NH: NH, NKV: NKV, HD: HD}}
		}
		return w, nil
	}
	w.GEMMs = append(w.GEMMs, kernels.GEMM{T: B, C: C, OC: NH * HD}, kernels.GEMM{T: B, C: C, OC: NKV * HD},
		kernels.GEMM{T: B, C: NH * HD, OC: C}, kernels.GEMM{T: B, C: C, OC: I}, kernels.GEMM{T: B, C: I, OC: C},
		kernels.GEMM{T: B, C: C, OC: V})
	if cfg.Sparse() && cfg.SparseLayers() > 0 {
		addSparse(&w, cfg, B, false)
	}
	w.RowNorms = append(w.RowNorms, kernels.RowNorm{N: B, C: C})
	w.Decode = []kernels.Decode{{B: B, Tmax: maxLen, NH: NH, NKV: NKV, HD: HD}}
	return w, nil
}

// Close frees the sampler's buffers.
func (s *Sampler) Close() {
	for _, b := range []kernels.Buf{s.cache, s.acts, s.actsW, s.ints} {
		if b.N > 0 {
			s.m.b.Free(b)
		}
	}
	s.cache, s.acts, s.actsW, s.ints = kernels.Buf{}, kernels.Buf{}, kernels.Buf{}, kernels.Buf{}
}

// Sample generates a continuation of every prompt. rngs holds one random
// stream per prompt: prompt i's tokens are drawn from rngs[i] alone, one
// draw per generated token, so its sample does not depend on which other
// prompts share the batch or in which order (each row's logits are
// computed independently of the others), nor on refills. A single stream
// (len(rngs) == 1) is shared by every prompt, drawn step by step, cache
// slot by slot: the same seed, prompts and options still give the same
// samples.
func (s *Sampler) Sample(prompts [][]int32, opt SampleOptions, rngs []*rand.Rand) ([]Sample, error) {
	m := s.m
	V := m.cfg.VocabSize
	if len(rngs) != 1 && len(rngs) != len(prompts) {
		return nil, fmt.Errorf("model: sample: %d random streams for %d prompts: expected one per prompt, or one shared", len(rngs), len(prompts))
	}
	rngOf := func(row int) *rand.Rand {
		if len(rngs) == 1 {
			return rngs[0]
		}
		return rngs[row]
	}
	if len(prompts) > s.maxBatch && !opt.Refill {
		return nil, fmt.Errorf("model: sample: %d prompts exceed the sampler's batch of %d (SampleOptions.Refill decodes them in turn)", len(prompts), s.maxBatch)
	}
	if opt.MaxNewTokens <= 0 {
		return nil, fmt.Errorf("model: sample: MaxNewTokens: expected a positive number, found %d", opt.MaxNewTokens)
	}
	if !(opt.Temperature >= 0) || math.IsInf(float64(opt.Temperature), 0) {
		return nil, fmt.Errorf("model: sample: Temperature: expected a non-negative number, found %g", opt.Temperature)
	}
	if !(opt.TopP >= 0 && opt.TopP <= 1) {
		return nil, fmt.Errorf("model: sample: TopP: expected a number in [0, 1], found %g", opt.TopP)
	}
	if opt.TopK < 0 {
		return nil, fmt.Errorf("model: sample: TopK: expected 0 (off) or a positive number, found %d", opt.TopK)
	}
	for i, p := range prompts {
		if len(p) == 0 || len(p) > s.maxLen || len(p) > m.opt.MaxTokens {
			return nil, fmt.Errorf("model: sample: prompt %d: length %d: expected 1 to min(sampler maxLen %d, model MaxTokens %d)", i, len(p), s.maxLen, m.opt.MaxTokens)
		}
		for j, x := range p {
			if x < 0 || int(x) >= V {
				return nil, fmt.Errorf("model: sample: prompt %d token %d: id %d outside the vocabulary [0, %d)", i, j, x, V)
			}
		}
	}
	clear(s.stop)
	for _, t := range opt.StopTokens {
		s.stop[t] = true
	}
	out := make([]Sample, len(prompts))
	n := min(len(prompts), s.maxBatch)
	if n == 0 {
		return out, nil
	}
	next := n // the next waiting prompt
	s.prefillSlots, s.prefillPrompts = s.prefillSlots[:0], s.prefillPrompts[:0]
	for i := range n {
		s.slotRow[i], s.fill[i], s.pending[i] = i, len(prompts[i]), false
		s.prefillSlots = append(s.prefillSlots, i)
		s.prefillPrompts = append(s.prefillPrompts, prompts[i])
	}
	if err := s.prefill(s.prefillSlots, s.prefillPrompts); err != nil {
		return nil, err
	}
	done := func(i int) bool {
		o := &out[s.slotRow[i]]
		return o.Stopped || len(o.Tokens) >= opt.MaxNewTokens || s.fill[i] >= s.maxLen
	}
	for {
		// Sample the next token of every active slot from its logits.
		if err := s.sampleStep(n, opt, rngOf, out); err != nil {
			return nil, err
		}
		// Refill finished slots with waiting prompts, then retire the rest,
		// moving the last active slot into each hole.
		for i := 0; i < n && next < len(prompts); i++ {
			if done(i) {
				s.slotRow[i], s.fill[i], s.pending[i] = next, len(prompts[next]), true
				next++
			}
		}
		for i := n - 1; i >= 0; i-- {
			if s.pending[i] || !done(i) {
				continue
			}
			n--
			if i != n {
				s.moveSlot(n, i)
			}
		}
		if n == 0 {
			return out, nil
		}
		s.prefillSlots, s.prefillPrompts = s.prefillSlots[:0], s.prefillPrompts[:0]
		for i := 0; i < n; i++ {
			if s.pending[i] { // a stand-in row, overwritten by its prefill below
				p := prompts[s.slotRow[i]]
				s.hTok[i], s.hPos[i], s.hIdx[i], s.hLens[i] = p[0], 0, int32(i*s.maxLen), 1
				s.prefillSlots = append(s.prefillSlots, i)
				s.prefillPrompts = append(s.prefillPrompts, p)
				s.pending[i] = false
				continue
			}
			o := &out[s.slotRow[i]]
			s.hTok[i] = o.Tokens[len(o.Tokens)-1]
			s.hPos[i] = int32(s.fill[i])
			s.hIdx[i] = int32(i*s.maxLen + s.fill[i])
			s.fill[i]++
			s.hLens[i] = int32(s.fill[i])
		}
		if s.hy != nil {
			if err := s.decodeHybrid(n); err != nil {
				return nil, err
			}
		} else {
			s.decodeStep(n)
		}
		if len(s.prefillSlots) > 0 {
			if err := s.prefill(s.prefillSlots, s.prefillPrompts); err != nil {
				return nil, err
			}
		}
	}
}

// sampleStep draws the next token of the n active slots from s.logits and
// appends it to their samples: each slot's uniform comes from its
// prompt's stream (none at temperature 0, where the draw is the argmax),
// then the backend draws (kernels.TokenSampler) or the host does.
func (s *Sampler) sampleStep(n int, opt SampleOptions, rngOf func(int) *rand.Rand, out []Sample) error {
	b, V := s.m.b, s.m.cfg.VocabSize
	us := s.hUniform[:n]
	for i := range n {
		us[i] = 0
		if opt.Temperature > 0 {
			us[i] = rngOf(s.slotRow[i]).Float64()
		}
	}
	if s.device != nil {
		for i, u := range us {
			bits := math.Float64bits(u)
			s.hU[2*i], s.hU[2*i+1] = int32(uint32(bits)), int32(uint32(bits>>32))
		}
		b.UploadI32(s.u.Slice(0, 2*n), s.hU[:2*n])
		s.device.SampleTokens(s.sampled.Slice(0, n), s.lp.Slice(0, n), s.logits.Slice(0, n*V), s.u.Slice(0, 2*n), n, V,
			kernels.SampleParams{Temperature: opt.Temperature, TopK: opt.TopK, TopP: opt.TopP})
		b.DownloadI32(s.hSampled[:n], s.sampled.Slice(0, n))
		b.DownloadF32(s.hLp[:n], s.lp.Slice(0, n))
	} else {
		b.DownloadF32(s.hLogits[:n*V], s.logits.Slice(0, n*V))
	}
	if err := b.Sync(); err != nil {
		return fmt.Errorf("model: sample: %w", err)
	}
	for i := range n {
		tok, lp := s.hSampled[i], s.hLp[i]
		if s.device == nil {
			tok, lp = s.draw(s.hLogits[i*V:(i+1)*V], opt, us[i])
		}
		o := &out[s.slotRow[i]]
		o.Tokens = append(o.Tokens, tok)
		o.Logprobs = append(o.Logprobs, lp)
		if s.stop[tok] {
			o.Stopped = true
		}
	}
	return nil
}

// moveSlot moves cache slot from into slot to (both below the active count).
func (s *Sampler) moveSlot(from, to int) {
	if s.hy != nil {
		s.moveHybridSlot(from, to)
		s.slotRow[to], s.fill[to], s.pending[to] = s.slotRow[from], s.fill[from], s.pending[from]
		return
	}
	kn := s.m.cfg.NumKeyValueHeads * s.m.cfg.HeadDim
	n := s.fill[from] * kn
	for l := range s.kc {
		s.m.b.Convert(s.kc[l].Slice(to*s.maxLen*kn, n), s.kc[l].Slice(from*s.maxLen*kn, n))
		s.m.b.Convert(s.vc[l].Slice(to*s.maxLen*kn, n), s.vc[l].Slice(from*s.maxLen*kn, n))
	}
	s.slotRow[to], s.fill[to], s.pending[to] = s.slotRow[from], s.fill[from], s.pending[from]
}

// prefill runs prompts through the model's packed forward in chunks that
// fit its Options, writes their keys and values into the cache of slots
// (prompt k into slot slots[k]) and leaves the logits of each prompt's last
// token in its slot's row of s.logits.
func (s *Sampler) prefill(slots []int, prompts [][]int32) error {
	m := s.m
	c := m.cfg
	C, kn, V := c.HiddenSize, c.NumKeyValueHeads*c.HeadDim, c.VocabSize
	for start := 0; start < len(prompts); {
		s.prefillTokens = s.prefillTokens[:0]
		s.prefillCu = append(s.prefillCu[:0], 0)
		end := start
		for end < len(prompts) && len(s.prefillTokens)+len(prompts[end]) <= m.opt.MaxTokens && end-start < m.opt.MaxSeqs {
			s.prefillTokens = append(s.prefillTokens, prompts[end]...)
			s.prefillCu = append(s.prefillCu, int32(len(s.prefillTokens)))
			end++
		}
		if err := m.stage(s.prefillTokens, s.prefillCu, 1); err != nil {
			return fmt.Errorf("model: sample: prefill: %w", err)
		}
		T := len(s.prefillTokens)
		for p := start; p < end; p++ {
			lo := int(s.prefillCu[p-start])
			for j := range prompts[p] {
				s.hIdx[lo+j] = int32(slots[p]*s.maxLen + j)
			}
		}
		m.b.UploadI32(s.idx.Slice(0, T), s.hIdx[:T])
		if s.hy != nil {
			s.hy.prefill = true
			m.dec = s.hy
			m.forwardBody(func(l int) { s.hybridPrefilled(l, slots[start:end], s.prefillCu) })
			m.dec = nil
		} else {
			m.forwardBody(func(l int) { // with Recompute the next layer overwrites k and v
				m.b.ScatterRows(s.kc[l], m.la[l].k.Slice(0, T*kn), s.idx.Slice(0, T), T, kn)
				m.b.ScatterRows(s.vc[l], m.la[l].v.Slice(0, T*kn), s.idx.Slice(0, T), T, kn)
			})
		}
		for p := start; p < end; p++ {
			last := int(s.prefillCu[p-start+1]) - 1
			m.b.Convert(s.ln.Slice(slots[p]*C, C), m.lnf.Slice(last*C, C))
		}
		start = end
	}
	m.haveForward = false
	n := len(prompts)
	if slots[n-1]-slots[0] == n-1 { // consecutive slots (a first prefill): one GEMM
		m.b.Matmul(s.logits.Slice(slots[0]*V, n*V), s.ln.Slice(slots[0]*C, n*C), m.lmHeadW, n, C, V)
		return nil
	}
	for _, i := range slots {
		m.b.Matmul(s.logits.Slice(i*V, V), s.ln.Slice(i*C, C), m.lmHeadW, 1, C, V)
	}
	return nil
}

// decodeStep runs one token for each of the n active slots (inputs staged in
// hTok, hPos, hIdx, hLens) and leaves their logits in s.logits. The GEMMs
// read the weights in the model's precision (its bf16 copy under mixed
// precision, in slices of the fused q|k|v and gate|up weights) and inputs
// of that dtype; the residual add and the norm after it, and under mixed
// precision q's rotation and rounding, are one op each where the backend
// fuses them (kernels.AddRMSNormer, kernels.RopeConverter).
func (s *Sampler) decodeStep(n int) {
	m := s.m
	b, c := m.b, m.cfg
	C, I, HD, NH, NKV, V := c.HiddenSize, c.IntermediateSize, c.HeadDim, c.NumAttentionHeads, c.NumKeyValueHeads, c.VocabSize
	qn, kn := NH*HD, NKV*HD
	eps := c.RMSNormEps
	r := func(x kernels.Buf, w int) kernels.Buf { return x.Slice(0, n*w) }
	b.UploadI32(s.tok.Slice(0, n), s.hTok[:n])
	b.UploadI32(s.pos.Slice(0, n), s.hPos[:n])
	b.UploadI32(s.lens.Slice(0, n), s.hLens[:n])
	b.UploadI32(s.idx.Slice(0, n), s.hIdx[:n])
	pos, idx := s.pos.Slice(0, n), s.idx.Slice(0, n)
	x, ln, xmid, rstd := r(s.x, C), r(s.ln, C), r(s.xmid, C), s.rstd.Slice(0, n)
	cos, sin, _ := m.ropeTables() // the policy's, for a reference model
	b.Embedding(x, m.wte, s.tok.Slice(0, n), n, C)
	b.RMSNorm(ln, rstd, x, m.layers[0].ln1, n, C, eps)
	for l := range m.layers {
		w, gw := &m.layers[l], &m.gw[l]
		wq, wk, wv := gw.qkv.Slice(0, qn*C), gw.qkv.Slice(qn*C, kn*C), gw.qkv.Slice((qn+kn)*C, kn*C)
		q, k, v := r(s.q, qn), r(s.k, kn), r(s.v, kn)
		if c.QKNorm() {
			b.Matmul(r(s.qraw, qn), ln, wq, n, C, qn)
			b.Matmul(r(s.kraw, kn), ln, wk, n, C, kn)
			b.RMSNorm(q, s.qrstd.Slice(0, n*NH), r(s.qraw, qn), w.qNorm, n*NH, HD, eps)
			b.RMSNorm(k, s.krstd.Slice(0, n*NKV), r(s.kraw, kn), w.kNorm, n*NKV, HD, eps)
		} else {
			b.Matmul(q, ln, wq, n, C, qn)
			b.Matmul(k, ln, wk, n, C, kn)
		}
		b.Matmul(v, ln, wv, n, C, kn)
		if c.QKVBias() {
			b.AddBias(q, w.qBias, n, qn)
			b.AddBias(k, w.kBias, n, kn)
			b.AddBias(v, w.vBias, n, kn)
		}
		qW, attW := r(s.qW, qn), r(s.attW, qn)
		m.ropeTo(qW, q, pos, cos, sin, n, NH, HD) // qW is q under F32
		b.Rope(k, pos, cos, sin, n, NKV, HD)
		b.ScatterRows(s.kc[l], k, idx, n, kn) // rounded into a bf16 cache
		b.ScatterRows(s.vc[l], v, idx, n, kn)
		b.AttentionDecode(r(s.att, qn), qW, s.kc[l].Slice(0, n*s.maxLen*kn), s.vc[l].Slice(0, n*s.maxLen*kn),
			s.lens.Slice(0, n), n, s.maxLen, NH, NKV, HD)
		if s.wdt != kernels.F32 {
			b.Convert(attW, r(s.att, qn))
		}
		b.Matmul(xmid, attW, gw.o, n, qn, C)
		m.addThenNorm(xmid, ln, rstd, xmid, x, w.ln2, n, C)
		if c.SparseLayer(l) {
			m.moeForward(l, n, ln, s.moe)
			m.moeCombine(n, x, s.moe)
		} else {
			wgate, wup := gw.gu.Slice(0, I*C), gw.gu.Slice(I*C, I*C)
			b.Matmul(r(s.gate, I), ln, wgate, n, C, I)
			b.Matmul(r(s.up, I), ln, wup, n, C, I)
			b.SwiGLU(r(s.h, I), r(s.gate, I), r(s.up, I), n*I)
			b.Matmul(x, r(s.h, I), gw.down, n, I, C)
		}
		next := m.norm
		if l+1 < len(m.layers) {
			next = m.layers[l+1].ln1
		}
		m.addThenNorm(x, ln, rstd, x, xmid, next, n, C)
	}
	b.Matmul(r(s.logits, V), ln, m.lmHeadW, n, C, V)
}

// draw samples one token from a row of logits with the uniform u, as
// kernels.TokenSampler defines the draw (kernels.SampleRow, which the CPU
// backend's sampler also runs), for backends without a sampler of their own.
func (s *Sampler) draw(logits []float32, opt SampleOptions, u float64) (int32, float32) {
	sp := kernels.SampleParams{Temperature: opt.Temperature, TopK: opt.TopK, TopP: opt.TopP}
	return kernels.SampleRow(logits, u, sp, s.zs[:len(logits)], &s.fsc)
}
