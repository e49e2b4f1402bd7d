package model

import (
	"errors"
	"fmt"
	"math"

	"github.com/tracegrpo/tracegrpo/kernels"
)

// ErrNoForward is returned by Backward without a preceding Forward.
var ErrNoForward = errors.New("model: Backward without a preceding Forward")

// Forward runs the packed micro-batch tokens (T) whose sequence s is
// tokens[cuSeqlens[s]:cuSeqlens[s+1]] (each attends only within itself, with
// positions restarting at 0) and returns, for every token t,
//
//	logprob[t] = log p(tokens[t] | earlier tokens of its sequence)
//	entropy[t] = entropy of that next-token distribution
//
// at the given sampling temperature (logits ÷ temperature), with 0 at each
// sequence's first token. The returned slices belong to the model and are
// overwritten by the next Forward. Activations are kept for Backward.
func (m *Model) Forward(tokens []int32, cuSeqlens []int32, temperature float32) (logprob, entropy []float32, err error) {
	return m.ForwardMasked(tokens, cuSeqlens, temperature, nil)
}

// ForwardMasked is Forward computing logprob[t] and entropy[t] only where
// need[t] is true (len(need) = len(tokens); nil means everywhere): the LM
// head, the costliest op per token, skips every other position, which get 0.
// Backward then ignores dlogprob at those positions. Use it to skip prompt
// and tool-output tokens that carry no loss.
func (m *Model) ForwardMasked(tokens []int32, cuSeqlens []int32, temperature float32, need []bool) (logprob, entropy []float32, err error) {
	return m.forwardMasked(tokens, cuSeqlens, temperature, need, false)
}

// forwardMasked is ForwardMasked, running the multi-token prediction
// depths too when withMTP (ForwardMTP).
func (m *Model) forwardMasked(tokens []int32, cuSeqlens []int32, temperature float32, need []bool, withMTP bool) (logprob, entropy []float32, err error) {
	T := len(tokens)
	if need != nil && len(need) != T {
		m.haveForward = false
		return nil, nil, fmt.Errorf("model: forward: need has %d entries for %d tokens", len(need), T)
	}
	if err := m.stage(tokens, cuSeqlens, temperature); err != nil {
		return nil, nil, err
	}
	if need != nil {
		// Row t of the head predicts token t+1.
		for s := 0; s < m.lastS; s++ {
			for t := cuSeqlens[s]; t+1 < cuSeqlens[s+1]; t++ {
				if !need[t+1] {
					m.hTarget[t] = -1
				}
			}
		}
		m.b.UploadI32(m.target.Slice(0, T), m.hTarget[:T])
	}
	if withMTP {
		m.stageMTP(tokens, cuSeqlens, need)
	}
	m.forward()
	b := m.b
	if withMTP {
		m.queueMTPDownloads(T)
	}
	if T > 0 {
		b.DownloadF32(m.hLp[:T], m.lp.Slice(0, T))
		b.DownloadF32(m.hEnt[:T], m.ent.Slice(0, T))
		if m.headFull() {
			b.DownloadF32(m.hLpFull[:T], m.lpFull.Slice(0, T))
		}
		if m.auxStats() {
			m.queueRouterStats()
		}
	}
	if err := m.commErr(); err != nil {
		m.haveForward = false
		return nil, nil, fmt.Errorf("model: forward: %w", err)
	}
	if err := b.Sync(); err != nil {
		m.haveForward = false
		return nil, nil, fmt.Errorf("model: forward: %w", err)
	}
	if m.auxStats() {
		m.finishRouterStats()
	}
	lp, ent := m.outLp[:T], m.outEnt[:T]
	// Row t of the head predicts token t+1: shift right by one within each
	// sequence.
	for s := 0; s < m.lastS; s++ {
		lo, hi := int(cuSeqlens[s]), int(cuSeqlens[s+1])
		if lo == hi {
			continue
		}
		lp[lo], ent[lo] = 0, 0
		copy(lp[lo+1:hi], m.hLp[lo:hi-1])
		copy(ent[lo+1:hi], m.hEnt[lo:hi-1])
		if m.headFull() {
			m.outFull[lo] = 0
			copy(m.outFull[lo+1:hi], m.hLpFull[lo:hi-1])
		}
	}
	if m.headFull() {
		m.lastFull = m.outFull[:T]
	}
	return lp, ent, nil
}

// LogprobsFull returns the unfiltered logprobs of the last Forward or
// ForwardTree (aligned as its logprob), or nil unless the model was built
// with Options.HeadFilter and HeadFull: NeMo RL's KL term reads these
// while its actor loss reads the filtered ones. The slice belongs to the
// model and is overwritten by the next Forward.
func (m *Model) LogprobsFull() []float32 {
	if !m.headFull() || !m.haveForward {
		return nil
	}
	return m.lastFull
}

// stage checks a micro-batch and uploads tokens, positions, targets and
// sequence offsets.
func (m *Model) stage(tokens []int32, cu []int32, temperature float32) error {
	T := len(tokens)
	m.haveForward = false
	if T > m.opt.MaxTokens {
		return fmt.Errorf("model: forward: %d tokens exceed Options.MaxTokens %d", T, m.opt.MaxTokens)
	}
	if len(cu) < 1 {
		return fmt.Errorf("model: forward: cu_seqlens: expected at least [0], found none")
	}
	S := len(cu) - 1
	if S > m.opt.MaxSeqs {
		return fmt.Errorf("model: forward: %d sequences exceed Options.MaxSeqs %d", S, m.opt.MaxSeqs)
	}
	if cu[0] != 0 || int(cu[S]) != T {
		return fmt.Errorf("model: forward: cu_seqlens: expected to run from 0 to %d tokens, found %d to %d", T, cu[0], cu[S])
	}
	if !(temperature > 0) || math.IsInf(float64(temperature), 0) {
		return fmt.Errorf("model: forward: temperature: expected a positive number, found %g", temperature)
	}
	maxLen := 0
	for s := 0; s < S; s++ {
		lo, hi := cu[s], cu[s+1]
		if hi < lo {
			return fmt.Errorf("model: forward: cu_seqlens[%d] = %d is below cu_seqlens[%d] = %d", s+1, hi, s, lo)
		}
		maxLen = max(maxLen, int(hi-lo))
		if _, _, P := m.ropeTables(); int(hi-lo) > P {
			return fmt.Errorf("model: forward: sequence %d has %d tokens, more than Options.MaxSeqLen %d", s, hi-lo, P)
		}
		for t := lo; t < hi; t++ {
			m.hPos[t] = t - lo
			if t+1 < hi {
				m.hTarget[t] = tokens[t+1]
			} else {
				m.hTarget[t] = -1
			}
		}
	}
	V := int32(m.cfg.VocabSize)
	for t, x := range tokens {
		if x < 0 || x >= V {
			return fmt.Errorf("model: forward: token %d: id %d outside the vocabulary [0, %d)", t, x, V)
		}
	}
	m.lastT, m.lastS, m.lastMaxLen, m.lastInvTemp = T, S, maxLen, 1/temperature
	m.lastTree = false
	if m.mtp != nil {
		m.mtp.active, m.mtp.grads = false, false
	}
	m.ws.last = m // the staged inputs and, next, the activations are this model's
	copy(m.hTokens, tokens)
	copy(m.hCu, cu)
	if T > 0 {
		m.b.UploadI32(m.tokens.Slice(0, T), m.hTokens[:T])
		m.b.UploadI32(m.pos.Slice(0, T), m.hPos[:T])
		m.b.UploadI32(m.target.Slice(0, T), m.hTarget[:T])
	}
	m.b.UploadI32(m.cu.Slice(0, S+1), m.hCu[:S+1])
	m.stageForest(m.hCu[:S+1])
	m.syncWeights()
	return nil
}

func (m *Model) seqs() kernels.Seqs {
	return kernels.Seqs{CuSeqlens: m.cu.Slice(0, m.lastS+1), S: m.lastS, MaxLen: m.lastMaxLen}
}

// forward queues the forward pass of the staged micro-batch.
func (m *Model) forward() {
	if m.fs != nil {
		m.shardedForward()
		m.haveForward = true
		return
	}
	if m.lastT == 0 {
		m.haveForward = true
		return
	}
	m.forwardBody(nil)
	m.head()
	m.mtpForward()
	m.haveForward = true
}

// forwardBody queues the decoder layers and the final norm of the staged
// micro-batch (T > 0), leaving the normed hidden states in lnf. after, if
// not nil, runs once each layer's activations are ready (with
// Options.Recompute they are overwritten by the next layer).
func (m *Model) forwardBody(after func(l int)) {
	m.embed()
	m.mtpEmbed()
	m.norm1(0)
	for l := range m.la {
		m.layerForward(l, true)
		if after != nil {
			after(l)
		}
	}
}

// embed queues the embedding lookup into layer 0's input.
func (m *Model) embed() {
	T, C := m.lastT, m.cfg.HiddenSize
	m.b.Embedding(m.la[0].x.Slice(0, T*C), m.wte, m.tokens.Slice(0, T), T, C)
}

// head queues the LM head over the final normed hidden states (a tree's:
// over its pairs, headTree).
func (m *Model) head() {
	if m.lastTree {
		m.headTree()
		return
	}
	m.headRows(m.lastT)
}

// headRows queues the LM head over the first n rows of lnf against their
// targets: TokenLogprob, or under Options.HeadFilter the filtered head.
func (m *Model) headRows(n int) {
	C, V := m.cfg.HiddenSize, m.cfg.VocabSize
	hidden, targets := m.lnf.Slice(0, n*C), m.target.Slice(0, n)
	if m.headFiltered() {
		m.filtered.TokenLogprobFiltered(m.headOut(n), hidden, m.lmHeadW, targets, n, C, V, m.lastInvTemp, m.opt.HeadFilter)
		return
	}
	m.b.TokenLogprob(m.lp.Slice(0, n), m.ent.Slice(0, n), m.lseHead.Slice(0, n), hidden, m.lmHeadW, targets, n, C, V, m.lastInvTemp)
}

// headOut is the filtered head's outputs for n rows.
func (m *Model) headOut(n int) kernels.HeadOut {
	return kernels.HeadOut{Logprob: m.lp.Slice(0, n), Entropy: m.ent.Slice(0, n), LSE: m.lseHead.Slice(0, n),
		LogprobFull: m.lpFull.Slice(0, n), LSEFull: m.lseFull.Slice(0, n), Cut: m.cut.Slice(0, 2*n)}
}

// headRowsBackward queues headRows' backward from dlp (and, HeadFull,
// dlpFull) into dlnf (n,C), which it accumulates, and the head's weight
// gradient.
func (m *Model) headRowsBackward(n int) {
	C, V := m.cfg.HiddenSize, m.cfg.VocabSize
	dlnf, hidden, targets := m.dlnf.Slice(0, n*C), m.lnf.Slice(0, n*C), m.target.Slice(0, n)
	if m.headFiltered() {
		var dfull kernels.Buf
		if m.headFull() {
			dfull = m.dlpFull.Slice(0, n)
		}
		m.filtered.TokenLogprobFilteredBackward(dlnf, m.dlmHead, m.dlp.Slice(0, n), dfull, hidden, m.lmHeadW, targets, m.headOut(n), n, C, V, m.lastInvTemp)
		return
	}
	m.b.TokenLogprobBackward(dlnf, m.dlmHead, m.dlp.Slice(0, n), hidden, m.lmHeadW, targets, m.lseHead.Slice(0, n), n, C, V, m.lastInvTemp)
}

// norm1 queues layer l's input norm: ln1 of la[l].x.
func (m *Model) norm1(l int) {
	T, C := m.lastT, m.cfg.HiddenSize
	a := &m.la[l]
	m.b.RMSNorm(a.ln1.Slice(0, T*C), a.rstd1.Slice(0, T), a.x.Slice(0, T*C), m.layers[l].ln1, T, C, m.cfg.RMSNormEps)
}

// addThenNorm queues sum = a + b, then out, rstd = RMSNorm(sum): one fused op
// where the backend has it, the same results either way.
func (m *Model) addThenNorm(sum, out, rstd, a, b, weight kernels.Buf, N, C int) {
	if m.addNorm != nil {
		m.addNorm.AddRMSNorm(sum, out, rstd, a, b, weight, N, C, m.cfg.RMSNormEps)
		return
	}
	m.b.Add(sum, a, b, N*C)
	m.b.RMSNorm(out, rstd, sum, weight, N, C, m.cfg.RMSNormEps)
}

// matmulThenNorm queues sum (N,C) = res + inp (N,K)·weightᵀ and
// RMSNorm(out, rstd, sum, normW): the residual add as the GEMM's epilogue
// where the backend has it (then a plain norm), else Matmul then
// addThenNorm (the same values: the product added to res, then normed).
func (m *Model) matmulThenNorm(sum, out, rstd, res, inp, weight, normW kernels.Buf, N, K, C int) {
	if m.matAdd != nil {
		m.matAdd.MatmulAdd(sum, res, inp, weight, N, K, C)
		m.b.RMSNorm(out, rstd, sum, normW, N, C, m.cfg.RMSNormEps)
		return
	}
	m.b.Matmul(sum, inp, weight, N, K, C)
	m.addThenNorm(sum, out, rstd, sum, res, normW, N, C)
}

// ropeTo rotates x32 (T,H,HD) F32 into the attention operand dst: in place
// under F32 (dst is x32), else rotated and rounded into dst in one pass
// where the backend fuses it, leaving x32 unrotated.
func (m *Model) ropeTo(dst, x32, pos, cos, sin kernels.Buf, T, H, HD int) {
	switch {
	case m.wdt == kernels.F32:
		m.b.Rope(x32, pos, cos, sin, T, H, HD)
	case m.ropeConv != nil:
		m.ropeConv.RopeConvert(dst, x32, pos, cos, sin, T, H, HD)
	default:
		m.b.Rope(x32, pos, cos, sin, T, H, HD)
		m.b.Convert(dst, x32)
	}
}

// layerForward queues decoder layer l from its input la[l].x. With full it
// also writes the layer's output: the next layer's input and, fused with
// the residual add, its input norm (or xf and the final norm lnf); layer
// l's own input norm is then already done (norm1), except for layer 0.
// Without full (recomputation in the backward pass) it norms its input
// itself and stops once every activation the layer's backward needs is
// ready.
//
// q, k and v come from one GEMM (the fused q|k|v weight) into qkvOut, fp32
// for the bias, q/k norms and RoPE, then split apart (v straight into its
// attention operand, rounded to bf16 under mixed precision); gate and up
// come from one GEMM into the layer's gu, read as it lies (SwiGLURows),
// and their gradients are written packed, for the GEMM's backward.
func (m *Model) layerForward(l int, full bool) {
	if !full {
		m.norm1(l)
	}
	m.layerBody(l)
	if full {
		m.layerTail(l)
	}
}

// layerBody queues decoder layer l from its normed input la[l].ln1 up to
// the MLP's activation h: everything but the down projection (a sparse
// layer: up to its experts' outputs, everything but their weighted sum).
func (m *Model) layerBody(l int) {
	if m.cfg.Hybrid() {
		m.hybridBody(l)
		return
	}
	m.layerAttention(l)
	m.layerMLP(l)
}

// layerAttention queues decoder layer l's attention from its normed input
// la[l].ln1 to its output la[l].att: the q|k|v GEMM, then, for Qwen3's q/k
// norms, one QKNormRope pass where the backend has it, else the split
// path (CopyCols, RMSNorm, RoPE and the casts).
func (m *Model) layerAttention(l int) {
	b, c := m.b, m.cfg
	T := m.lastT
	C, HD, NH, NKV := c.HiddenSize, c.HeadDim, c.NumAttentionHeads, c.NumKeyValueHeads
	qn, kn := NH*HD, NKV*HD
	qkvN := qn + 2*kn
	eps := c.RMSNormEps
	tc := func(x kernels.Buf, w int) kernels.Buf { return x.Slice(0, T*w) }
	cos, sin, _ := m.ropeTables()
	pos := m.pos.Slice(0, T)
	a, w, gw := &m.la[l], &m.layers[l], &m.gw[l]
	qkv := tc(m.qkvOut, qkvN)
	b.Matmul(qkv, tc(a.ln1, C), gw.qkv, T, C, qkvN)
	if c.QKVBias() {
		b.AddBias(qkv, w.qkvBias, T, qkvN)
	}
	q32, k32 := tc(a.q32, qn), tc(a.k32, kn)
	q, k, v := tc(a.q, qn), tc(a.k, kn), tc(a.v, kn)
	if c.QKNorm() && m.qkRope != nil {
		m.qkRope.QKNormRope(q, k, v, tc(a.qraw, qn), tc(a.kraw, kn), a.qrstd.Slice(0, T*NH), a.krstd.Slice(0, T*NKV),
			qkv, w.qNorm, w.kNorm, pos, cos, sin, T, NH, NKV, HD, eps)
		m.attend(tc(a.att, qn), a.lse.Slice(0, T*NH), q, k, v)
		return
	}
	if c.QKNorm() {
		b.CopyCols(tc(a.qraw, qn), qkv, T, qn, qn, qkvN)
		b.CopyCols(tc(a.kraw, kn), qkv.Slice(qn, T*qkvN-qn), T, kn, kn, qkvN)
		b.RMSNorm(q32, a.qrstd.Slice(0, T*NH), tc(a.qraw, qn), w.qNorm, T*NH, HD, eps)
		b.RMSNorm(k32, a.krstd.Slice(0, T*NKV), tc(a.kraw, kn), w.kNorm, T*NKV, HD, eps)
	} else {
		b.CopyCols(q32, qkv, T, qn, qn, qkvN)
		b.CopyCols(k32, qkv.Slice(qn, T*qkvN-qn), T, kn, kn, qkvN)
	}
	b.CopyCols(v, qkv.Slice(qn+kn, T*qkvN-qn-kn), T, kn, kn, qkvN)
	m.ropeTo(q, q32, pos, cos, sin, T, NH, HD)
	m.ropeTo(k, k32, pos, cos, sin, T, NKV, HD)
	m.attend(tc(a.att, qn), a.lse.Slice(0, T*NH), q, k, v)
}

// layerMLP queues decoder layer l from its attention output la[l].att up
// to the MLP's activation h: the o projection, the residual add with the
// post-attention norm, the gate|up GEMM and SwiGLU (a sparse layer: its
// experts).
func (m *Model) layerMLP(l int) {
	b, c := m.b, m.cfg
	T := m.lastT
	C, I, NH, HD := c.HiddenSize, c.IntermediateSize, c.NumAttentionHeads, c.HeadDim
	qn := NH * HD
	tc := func(x kernels.Buf, w int) kernels.Buf { return x.Slice(0, T*w) }
	a, w, gw := &m.la[l], &m.layers[l], &m.gw[l]
	x := tc(a.x, C)
	xmid := tc(a.xmid, C)
	m.matmulThenNorm(xmid, tc(a.ln2, C), a.rstd2.Slice(0, T), x, tc(a.att, qn), gw.o, w.ln2, T, qn, C)
	if c.SparseLayer(l) {
		m.moeForward(l, T, tc(a.ln2, C), m.layerMoE(l))
		return
	}
	gu := tc(a.gu, 2*I)
	b.Matmul(gu, tc(a.ln2, C), gw.gu, T, C, 2*I)
	b.SwiGLURows(tc(a.h, I), gu, T, I)
}

// layerTail queues the end of decoder layer l's full forward: the down
// projection (a sparse layer: its router statistics and the weighted sum
// of its experts' outputs) and, fused with the residual add, the next
// layer's input norm (layer l+1's ln1 weight) or the final norm (the
// head's).
func (m *Model) layerTail(l int) {
	if m.cfg.Hybrid() {
		m.hybridTail(l)
		return
	}
	b := m.b
	T, C, I := m.lastT, m.cfg.HiddenSize, m.cfg.IntermediateSize
	tc := func(x kernels.Buf, w int) kernels.Buf { return x.Slice(0, T*w) }
	a, gw := &m.la[l], &m.gw[l]
	xmid := tc(a.xmid, C)
	sparse := m.cfg.SparseLayer(l)
	if sparse {
		m.moeStats(l, T)
	}
	// mlpOut writes the layer's MLP output into out (T,C).
	mlpOut := func(out kernels.Buf) {
		if sparse {
			m.moeCombine(T, out, m.layerMoE(l))
			return
		}
		b.Matmul(out, tc(a.h, I), gw.down, T, I, C)
	}
	if l+1 < len(m.la) {
		n := &m.la[l+1]
		next := tc(n.x, C)
		if !sparse {
			m.matmulThenNorm(next, tc(n.ln1, C), n.rstd1.Slice(0, T), xmid, tc(a.h, I), gw.down, m.layers[l+1].ln1, T, I, C)
			return
		}
		mlpOut(next)
		m.addThenNorm(next, tc(n.ln1, C), n.rstd1.Slice(0, T), next, xmid, m.layers[l+1].ln1, T, C)
		return
	}
	xf := tc(m.xf, C)
	if !sparse && m.matAdd != nil {
		m.matAdd.MatmulAdd(xf, xmid, tc(a.h, I), gw.down, T, I, C)
		m.finalNormAdded(xf)
		return
	}
	mlpOut(xf)
	m.finalNorm(xf, xmid)
}

// Backward accumulates into Grads the gradient of L with respect to every
// parameter, given dlogprob[t] = ∂L/∂logprob[t] for the logprobs of the last
// Forward (same alignment; entries at each sequence's first token are
// ignored). Entropy is treated as a metric and receives no gradient.
func (m *Model) Backward(dlogprob []float32) error { return m.BackwardFull(dlogprob, nil) }

// BackwardFull is Backward with dlogprobFull = ∂L/∂LogprobsFull too (nil
// means zero), for a model built with Options.HeadFilter and HeadFull.
func (m *Model) BackwardFull(dlogprob, dlogprobFull []float32) error {
	if dlogprobFull != nil && !m.headFull() {
		return errors.New("model: backward: a gradient of the unfiltered logprobs, but the model keeps none (Options.HeadFilter with HeadFull)")
	}
	if dlogprobFull != nil && len(dlogprobFull) != len(dlogprob) {
		return fmt.Errorf("model: backward: dlogprobFull has %d entries, dlogprob %d", len(dlogprobFull), len(dlogprob))
	}
	if m.forwardOnly {
		return ErrForwardOnly
	}
	if !m.haveForward || m.ws.last != m {
		return ErrNoForward
	}
	T := m.lastT
	if m.lastTree {
		// One gradient per pair, as ForwardTree returned them.
		if len(dlogprob) != m.lastP {
			return fmt.Errorf("model: backward: dlogprob has %d entries, the tree forward had %d pairs", len(dlogprob), m.lastP)
		}
		if T == 0 && m.fs == nil {
			return nil
		}
		if m.lastP > 0 {
			m.b.UploadF32(m.dlp.Slice(0, m.lastP), dlogprob)
			if m.headFull() {
				if dlogprobFull != nil {
					m.b.UploadF32(m.dlpFull.Slice(0, m.lastP), dlogprobFull)
				} else {
					m.b.Fill(m.dlpFull.Slice(0, m.lastP), 0)
				}
			}
		}
		return m.runBackward()
	}
	if len(dlogprob) != T {
		return fmt.Errorf("model: backward: dlogprob has %d entries, the forward had %d tokens", len(dlogprob), T)
	}
	if T == 0 && m.fs == nil {
		return nil
	}
	for s := 0; s < m.lastS; s++ {
		lo, hi := int(m.hCu[s]), int(m.hCu[s+1])
		if lo == hi {
			continue
		}
		copy(m.hDlp[lo:hi-1], dlogprob[lo+1:hi])
		m.hDlp[hi-1] = 0
		if m.headFull() {
			m.hDlpFull[hi-1] = 0
			if dlogprobFull != nil {
				copy(m.hDlpFull[lo:hi-1], dlogprobFull[lo+1:hi])
			} else {
				clear(m.hDlpFull[lo : hi-1])
			}
		}
	}
	m.b.UploadF32(m.dlp.Slice(0, T), m.hDlp[:T])
	if m.headFull() {
		m.b.UploadF32(m.dlpFull.Slice(0, T), m.hDlpFull[:T])
	}
	return m.runBackward()
}

// runBackward queues the backward pass from the uploaded dlp (and the
// sparse layers' auxiliary loss gradient) and waits for it.
func (m *Model) runBackward() error {
	m.uploadAuxGrad()
	m.backward()
	if err := m.commErr(); err != nil {
		return fmt.Errorf("model: backward: %w", err)
	}
	if err := m.b.Sync(); err != nil {
		return fmt.Errorf("model: backward: %w", err)
	}
	return nil
}

// backward queues the backward pass from dlp (T). Under mixed precision
// each gradient that feeds a GEMM's or attention's backward is rounded to
// bf16 first (dxW, dattW, the packed q|k|v and gate|up gradients); the
// gradients themselves accumulate in fp32.
func (m *Model) backward() {
	if m.fs != nil {
		m.shardedBackward()
		return
	}
	m.mtpBackward()
	m.backwardHead()
	for l := len(m.la) - 1; l >= 0; l-- {
		m.backwardLayer(l)
	}
	m.backwardEmbed()
}

// gemmGrad returns g in the GEMMs' precision: g itself, or rounded into
// the scratch w.
func (m *Model) gemmGrad(g, w kernels.Buf) kernels.Buf {
	if m.wdt == kernels.F32 {
		return g
	}
	w = w.Slice(0, g.N)
	m.b.Convert(w, g)
	return w
}

// matmulBackwardFresh queues dinp = dout·weight, dweight += doutᵀ·inp:
// one beta = 0 product where the backend has it, else Fill then
// MatmulBackward (the same values).
func (m *Model) matmulBackwardFresh(dinp, dweight, dout, inp, weight kernels.Buf, T, C, OC int) {
	if m.freshMM != nil {
		m.freshMM.MatmulBackwardFresh(dinp, dweight, dout, inp, weight, T, C, OC)
		return
	}
	m.b.Fill(dinp, 0)
	m.b.MatmulBackward(dinp, dweight, dout, inp, weight, T, C, OC)
}

// backwardHead queues the LM head's and the final norm's backward, leaving
// the gradient of the last layer's output in dx (a tree's: from its pairs,
// backwardHeadTree).
func (m *Model) backwardHead() {
	if m.lastTree {
		m.backwardHeadTree()
		return
	}
	b, c := m.b, m.cfg
	T, C := m.lastT, c.HiddenSize
	tc := func(x kernels.Buf, w int) kernels.Buf { return x.Slice(0, T*w) }
	dx := tc(m.dx, C)
	b.Fill(tc(m.dlnf, C), 0)
	m.headRowsBackward(T)
	m.mtpHiddenGrad(tc(m.dlnf, C))
	b.Fill(dx, 0)
	b.RMSNormBackward(dx, m.dnorm, tc(m.dlnf, C), tc(m.xf, C), m.norm, m.rstdf.Slice(0, T), T, C)
}

// backwardLayer queues decoder layer l's backward (recomputing its
// activations first with Options.Recompute): dx holds the gradient of its
// output on entry and of its input on return.
func (m *Model) backwardLayer(l int) {
	if m.cfg.Hybrid() {
		m.hybridBackward(l)
		return
	}
	b, c := m.b, m.cfg
	T := m.lastT
	C, I, HD, NH, NKV := c.HiddenSize, c.IntermediateSize, c.HeadDim, c.NumAttentionHeads, c.NumKeyValueHeads
	qn, kn := NH*HD, NKV*HD
	qkvN := qn + 2*kn
	tc := func(x kernels.Buf, w int) kernels.Buf { return x.Slice(0, T*w) }
	cos, sin, _ := m.ropeTables()
	pos := m.pos.Slice(0, T)
	dx, dln := tc(m.dx, C), tc(m.dln, C)
	a, w, dw, gw := &m.la[l], &m.layers[l], &m.dlayers[l], &m.gw[l]
	if m.opt.Recompute {
		m.layerForward(l, false)
	}
	// MLP: x_{l+1} = xmid + down(silu(gate)·up), gate|up = ln2·Wguᵀ (a
	// sparse layer: its experts', moe.go).
	if c.SparseLayer(l) {
		m.moeBackward(l, dx, dln)
	} else {
		dh := tc(m.dh, I)
		m.matmulBackwardFresh(dh, dw.down, m.gemmGrad(dx, m.dxW), tc(a.h, I), gw.down, T, I, C)
		dgu := tc(m.fused, 2*I)
		b.SwiGLURowsBackward(dgu, dh, tc(a.gu, 2*I), T, I)
		m.matmulBackwardFresh(dln, dw.gu, dgu, tc(a.ln2, C), gw.gu, T, C, 2*I)
	}
	b.RMSNormBackward(dx, dw.ln2, dln, tc(a.xmid, C), w.ln2, a.rstd2.Slice(0, T), T, C)
	// Attention: xmid = x + o(attn(rope(norm(q)), rope(norm(k)), v)), with
	// q|k|v = ln1·Wqkvᵀ (+ bias).
	datt := tc(m.datt, qn)
	m.matmulBackwardFresh(datt, dw.o, m.gemmGrad(dx, m.dxW), tc(a.att, qn), gw.o, T, qn, C)
	dq, dk, dv := tc(m.dq, qn), tc(m.dk, kn), tc(m.dv, kn)
	m.attendBackward(dq, dk, dv, m.gemmGrad(datt, m.dattW), tc(a.att, qn), a.lse.Slice(0, T*NH),
		tc(a.q, qn), tc(a.k, kn), tc(a.v, kn))
	dqkv := tc(m.fused, qkvN)
	if m.qkRopeBwd != nil && !c.QKVBias() && HD <= kernels.QKNormRopeBackwardMaxHD {
		// One pass from dq, dk, dv into the packed gradient (q/k norms'
		// backward included for Qwen3), in the GEMM's precision.
		var qraw, kraw, qrstd, krstd, qw, kw, dqw, dkw kernels.Buf // zero-length without norms
		if c.QKNorm() {
			qraw, kraw, qrstd, krstd = tc(a.qraw, qn), tc(a.kraw, kn), a.qrstd.Slice(0, T*NH), a.krstd.Slice(0, T*NKV)
			qw, kw, dqw, dkw = w.qNorm, w.kNorm, dw.qNorm, dw.kNorm
		}
		m.qkRopeBwd.QKNormRopeBackward(dqkv, dqw, dkw, dq, dk, dv, qraw, kraw, qrstd, krstd, qw, kw, pos, cos, sin, T, NH, NKV, HD)
	} else {
		m.qkSplitBackward(l, dqkv, dq, dk, dv)
	}
	m.matmulBackwardFresh(dln, dw.qkv, dqkv, tc(a.ln1, C), gw.qkv, T, C, qkvN)
	b.RMSNormBackward(dx, dw.ln1, dln, tc(a.x, C), w.ln1, a.rstd1.Slice(0, T), T, C)
}

// qkSplitBackward queues the split path of layer l's QKNormRopeBackward
// (and the biases' gradients, which it leaves to this path): RoPE's
// backward in place on dq and dk, the q/k norms' backward, then dq, dk and
// dv packed into dqkv.
func (m *Model) qkSplitBackward(l int, dqkv, dq, dk, dv kernels.Buf) {
	b, c := m.b, m.cfg
	T := m.lastT
	HD, NH, NKV := c.HeadDim, c.NumAttentionHeads, c.NumKeyValueHeads
	qn, kn := NH*HD, NKV*HD
	qkvN := qn + 2*kn
	tc := func(x kernels.Buf, w int) kernels.Buf { return x.Slice(0, T*w) }
	cos, sin, _ := m.ropeTables()
	pos := m.pos.Slice(0, T)
	a, w, dw := &m.la[l], &m.layers[l], &m.dlayers[l]
	b.RopeBackward(dq, pos, cos, sin, T, NH, HD)
	b.RopeBackward(dk, pos, cos, sin, T, NKV, HD)
	if c.QKNorm() {
		// The norms' input gradients go into buffers dead at this point of
		// backwardLayer: datt (T,qn), read by the attention's backward
		// just queued, and dln (T,C), which the ln2 backward has read and
		// the qkv GEMM's backward writes next (dkraw only where k is wider
		// than C). Separate arenas for them were allocated for every q/k-norm
		// model and left untouched wherever the fused path runs.
		dqraw, dkraw := tc(m.datt, qn), tc(m.dln, kn)
		if m.dkraw.N > 0 {
			dkraw = tc(m.dkraw, kn)
		}
		b.Fill(dqraw, 0)
		b.Fill(dkraw, 0)
		b.RMSNormBackward(dqraw, dw.qNorm, dq, tc(a.qraw, qn), w.qNorm, a.qrstd.Slice(0, T*NH), T*NH, HD)
		b.RMSNormBackward(dkraw, dw.kNorm, dk, tc(a.kraw, kn), w.kNorm, a.krstd.Slice(0, T*NKV), T*NKV, HD)
		dq, dk = dqraw, dkraw
	}
	if c.QKVBias() {
		b.BiasBackward(dw.qBias, dq, T, qn)
		b.BiasBackward(dw.kBias, dk, T, kn)
		b.BiasBackward(dw.vBias, dv, T, kn)
	}
	b.CopyCols(dqkv, dq, T, qn, qkvN, qn)
	b.CopyCols(dqkv.Slice(qn, T*qkvN-qn), dk, T, kn, qkvN, kn)
	b.CopyCols(dqkv.Slice(qn+kn, T*qkvN-qn-kn), dv, T, kn, qkvN, kn)
}

// backwardEmbed queues the embedding's backward from dx.
func (m *Model) backwardEmbed() {
	T, C := m.lastT, m.cfg.HiddenSize
	m.b.EmbeddingBackward(m.dwte, m.dx.Slice(0, T*C), m.tokens.Slice(0, T), T, C)
	m.mtpEmbedGrad()
}
