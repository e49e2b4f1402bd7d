package model

// Packed token trees: the model's side of shared-prefix training.
//
// A micro-batch packed as a token trie (grpo.PackedTree builds one) holds
// each shared prefix once. Segment s's tokens continue its parent's: their
// RoPE positions continue from the end of the parent's context, and their
// queries see every ancestor's keys (kernels.TreeAttention). The decoder
// layers run over the T packed tokens as over any micro-batch.
//
// The LM head does not run over packed positions: the last token of a
// shared segment predicts a different token in each child, so ForwardTree
// scores (row, label) pairs: pair p's log-probability is
// log p(Labels[p] | the context that ends at packed position Rows[p]). The
// final norm's input rows of the pairs are gathered (Embedding, with the
// final layer's output as the table), normed, and scored; Backward
// scatter-adds the pairs' gradients back onto their rows (EmbeddingBackward,
// in pair order: deterministic), so a row scored for several children sums
// their gradients.

import (
	"fmt"
	"math"

	"github.com/tracegrpo/tracegrpo/kernels"
)

// Tree is a micro-batch packed as a token tree, with the LM head's pairs.
// Segments are in depth-first preorder: segment s is
// Tokens[Segs[s]:Segs[s+1]] (at least one token), Parent[s] < s or −1 for a
// root, and a segment's descendants directly follow it.
type Tree struct {
	Tokens []int32 // (T)
	Segs   []int32 // (NS+1) segment offsets, Segs[0] = 0, Segs[NS] = T
	Parent []int32 // (NS) parent segment, −1 for a root
	Rows   []int32 // (P) the packed position whose hidden state predicts Labels[p]
	Labels []int32 // (P) token ids
	// Traces[t] is the number of traces that hold packed position t (the
	// rows through it: a shared prefix's tokens count once per trace), by
	// which a training pass counts the tokens routed to each expert for
	// the selection biases (expertbias.go). nil counts every position once.
	Traces []int32 // (T)
}

// ForwardTree runs the packed tree tr and returns, for every pair p,
//
//	logprob[p] = log p(Labels[p] | the context ending at packed position Rows[p])
//	entropy[p] = entropy of that next-token distribution
//
// at the given sampling temperature. The context of a packed position is its
// ancestors' tokens, root first, then its segment's up to and including it.
// The model must be built with Options.Tree; T ≤ MaxTokens, NS ≤ MaxSeqs,
// P ≤ MaxTokens and every context ≤ MaxSeqLen tokens. The returned slices
// belong to the model and are overwritten by the next Forward. Backward
// then takes dL/dlogprob per pair.
func (m *Model) ForwardTree(tr Tree, temperature float32) (logprob, entropy []float32, err error) {
	if err := m.stageTree(tr, temperature); err != nil {
		return nil, nil, err
	}
	m.forward()
	P := m.lastP
	if P > 0 {
		m.b.DownloadF32(m.outLp[:P], m.lp.Slice(0, P))
		m.b.DownloadF32(m.outEnt[:P], m.ent.Slice(0, P))
		if m.headFull() {
			m.b.DownloadF32(m.outFull[:P], m.lpFull.Slice(0, P))
		}
	}
	if err := m.commErr(); err != nil {
		m.haveForward = false
		return nil, nil, fmt.Errorf("model: forward tree: %w", err)
	}
	if err := m.b.Sync(); err != nil {
		m.haveForward = false
		return nil, nil, fmt.Errorf("model: forward tree: %w", err)
	}
	if m.headFull() {
		m.lastFull = m.outFull[:P]
	}
	return m.outLp[:P], m.outEnt[:P], nil
}

// stageTree checks a packed tree and uploads its tokens, positions, segment
// offsets, parents and subtree ends, and its pairs' rows and labels.
func (m *Model) stageTree(tr Tree, temperature float32) error {
	m.haveForward = false
	if !m.opt.Tree {
		return fmt.Errorf("model: forward tree: the model was built without Options.Tree")
	}
	T, NS, P := len(tr.Tokens), len(tr.Parent), len(tr.Rows)
	switch {
	case T > m.opt.MaxTokens:
		return fmt.Errorf("model: forward tree: %d tokens exceed Options.MaxTokens %d", T, m.opt.MaxTokens)
	case NS > m.opt.MaxTreeSegs:
		return fmt.Errorf("model: forward tree: %d segments exceed Options.MaxSeqs %d or MaxTreeSegs %d", NS, m.opt.MaxSeqs, m.opt.MaxTreeSegs)
	case P > m.opt.MaxTokens:
		return fmt.Errorf("model: forward tree: %d pairs exceed Options.MaxTokens %d", P, m.opt.MaxTokens)
	case len(tr.Labels) != P:
		return fmt.Errorf("model: forward tree: %d pair rows and %d labels", P, len(tr.Labels))
	case len(tr.Segs) != NS+1:
		return fmt.Errorf("model: forward tree: %d segment offsets for %d segments, want %d", len(tr.Segs), NS, NS+1)
	case tr.Segs[0] != 0 || int(tr.Segs[NS]) != T:
		return fmt.Errorf("model: forward tree: segment offsets run from %d to %d, want 0 to %d tokens", tr.Segs[0], tr.Segs[NS], T)
	}
	if !(temperature > 0) || math.IsInf(float64(temperature), 0) {
		return fmt.Errorf("model: forward tree: temperature: expected a positive number, found %g", temperature)
	}
	// Subtree ends (and the check of the depth-first preorder): the stack
	// holds the open path; a segment's parent must be on it.
	ends, anc := m.hEnds[:NS], m.hAnc[:NS]
	stack := m.hStack[:0]
	_, _, maxPos := m.ropeTables()
	maxLen, maxCtx := 0, 0
	for s := range NS {
		n := int(tr.Segs[s+1]) - int(tr.Segs[s])
		if n < 1 {
			return fmt.Errorf("model: forward tree: segment %d spans [%d, %d), want at least one token", s, tr.Segs[s], tr.Segs[s+1])
		}
		p := tr.Parent[s]
		for len(stack) > 0 && stack[len(stack)-1] != p {
			ends[stack[len(stack)-1]] = tr.Segs[s]
			stack = stack[:len(stack)-1]
		}
		if p >= 0 && len(stack) == 0 {
			return fmt.Errorf("model: forward tree: segment %d has parent %d, which is not on the path before it (segments must be in depth-first preorder)", s, p)
		}
		anc[s] = 0
		if p >= 0 {
			anc[s] = anc[p] + tr.Segs[p+1] - tr.Segs[p]
		}
		ctx := int(anc[s]) + n
		if ctx > maxPos {
			return fmt.Errorf("model: forward tree: segment %d's context has %d tokens, more than Options.MaxSeqLen %d", s, ctx, maxPos)
		}
		maxLen, maxCtx = max(maxLen, n), max(maxCtx, ctx)
		stack = append(stack, int32(s))
		for t := tr.Segs[s]; t < tr.Segs[s+1]; t++ {
			m.hPos[t] = anc[s] + t - tr.Segs[s]
		}
	}
	for _, s := range stack {
		ends[s] = int32(T)
	}
	m.hStack = stack
	V := int32(m.cfg.VocabSize)
	for t, x := range tr.Tokens {
		if x < 0 || x >= V {
			return fmt.Errorf("model: forward tree: token %d: id %d outside the vocabulary [0, %d)", t, x, V)
		}
	}
	for p := range P {
		if r := tr.Rows[p]; r < 0 || int(r) >= T {
			return fmt.Errorf("model: forward tree: pair %d: row %d outside the %d packed tokens", p, r, T)
		}
		if x := tr.Labels[p]; x < 0 || x >= V {
			return fmt.Errorf("model: forward tree: pair %d: label %d outside the vocabulary [0, %d)", p, x, V)
		}
	}
	m.hTraces = m.hTraces[:0]
	if tr.Traces != nil {
		if len(tr.Traces) != T {
			return fmt.Errorf("model: forward tree: %d trace counts for %d packed tokens", len(tr.Traces), T)
		}
		for t, n := range tr.Traces {
			if n < 1 {
				return fmt.Errorf("model: forward tree: token %d is held by %d traces, want at least 1", t, n)
			}
		}
		m.hTraces = append(m.hTraces, tr.Traces...)
	} else {
		m.hTraces = nil
	}
	m.lastT, m.lastS, m.lastMaxLen, m.lastInvTemp = T, NS, maxLen, 1/temperature
	m.lastTree, m.lastP, m.lastMaxCtx = true, P, maxCtx
	m.ws.last = m
	b := m.b
	if T > 0 {
		copy(m.hTokens, tr.Tokens)
		b.UploadI32(m.tokens.Slice(0, T), m.hTokens[:T])
		b.UploadI32(m.pos.Slice(0, T), m.hPos[:T])
	}
	copy(m.hCu, tr.Segs)
	b.UploadI32(m.cu.Slice(0, NS+1), m.hCu[:NS+1])
	if NS > 0 {
		copy(m.hParent, tr.Parent)
		b.UploadI32(m.treeParent.Slice(0, NS), m.hParent[:NS])
		b.UploadI32(m.treeEnds.Slice(0, NS), ends)
	}
	if P > 0 {
		copy(m.hIdx, tr.Rows)
		copy(m.hTarget, tr.Labels)
		b.UploadI32(m.pairIdx.Slice(0, P), m.hIdx[:P])
		b.UploadI32(m.target.Slice(0, P), m.hTarget[:P])
	}
	m.syncWeights()
	return nil
}

// tree is the staged tree's descriptor for the attention ops.
func (m *Model) tree() kernels.Tree {
	NS := m.lastS
	return kernels.Tree{Offs: m.cu.Slice(0, NS+1), Parent: m.treeParent.Slice(0, NS), Ends: m.treeEnds.Slice(0, NS),
		NS: NS, MaxLen: m.lastMaxLen, MaxCtx: m.lastMaxCtx}
}

// attend queues layer attention over the staged micro-batch: packed
// sequences, or the staged tree.
func (m *Model) attend(out, lse, q, k, v kernels.Buf) {
	c := m.cfg
	if m.lastTree {
		m.b.TreeAttention(out, lse, q, k, v, m.tree(), c.NumAttentionHeads, c.NumKeyValueHeads, c.HeadDim)
		return
	}
	m.b.Attention(out, lse, q, k, v, m.seqs(), c.NumAttentionHeads, c.NumKeyValueHeads, c.HeadDim)
}

// attendBackward is attend's backward.
func (m *Model) attendBackward(dq, dk, dv, dout, out, lse, q, k, v kernels.Buf) {
	c := m.cfg
	if m.lastTree {
		m.b.TreeAttentionBackward(dq, dk, dv, dout, out, lse, q, k, v, m.tree(), c.NumAttentionHeads, c.NumKeyValueHeads, c.HeadDim)
		return
	}
	m.b.AttentionBackward(dq, dk, dv, dout, out, lse, q, k, v, m.seqs(), c.NumAttentionHeads, c.NumKeyValueHeads, c.HeadDim)
}

// finalNorm queues xf = xf + xmid and the final norm of the packed rows
// into lnf; a tree's pairs are normed by headForward instead, so there it
// only adds.
func (m *Model) finalNorm(xf, xmid kernels.Buf) {
	T, C := m.lastT, m.cfg.HiddenSize
	if m.lastTree {
		m.b.Add(xf, xf, xmid, T*C)
		return
	}
	m.addThenNorm(xf, m.lnf.Slice(0, T*C), m.rstdf.Slice(0, T), xf, xmid, m.norm, T, C)
}

// finalNormAdded is finalNorm for an xf that already holds the residual
// sum (MatmulAdd wrote it).
func (m *Model) finalNormAdded(xf kernels.Buf) {
	T, C := m.lastT, m.cfg.HiddenSize
	if m.lastTree {
		return
	}
	m.b.RMSNorm(m.lnf.Slice(0, T*C), m.rstdf.Slice(0, T), xf, m.norm, T, C, m.cfg.RMSNormEps)
}

// headTree queues the LM head over a tree's pairs: their rows of xf
// gathered, normed into lnf, scored against their labels.
func (m *Model) headTree() {
	T, C := m.lastT, m.cfg.HiddenSize
	P := m.lastP
	if P == 0 {
		return
	}
	xfP := m.xfP.Slice(0, P*C)
	m.b.Embedding(xfP, m.xf.Slice(0, T*C), m.pairIdx.Slice(0, P), P, C)
	m.b.RMSNorm(m.lnf.Slice(0, P*C), m.rstdf.Slice(0, P), xfP, m.norm, P, C, m.cfg.RMSNormEps)
	m.headRows(P)
}

// backwardHeadTree queues headTree's backward from dlp (P) into dx (T,C),
// which it assigns: the pairs' final-norm gradients scatter-added back onto
// their rows in pair order.
func (m *Model) backwardHeadTree() {
	b, C := m.b, m.cfg.HiddenSize
	T, P := m.lastT, m.lastP
	dx := m.dx.Slice(0, T*C)
	b.Fill(dx, 0)
	if P == 0 {
		return
	}
	dlnf, dxfP := m.dlnf.Slice(0, P*C), m.dln.Slice(0, P*C) // dln is free until the layers' backward
	b.Fill(dlnf, 0)
	m.headRowsBackward(P)
	b.Fill(dxfP, 0)
	b.RMSNormBackward(dxfP, m.dnorm, dlnf, m.xfP.Slice(0, P*C), m.norm, m.rstdf.Slice(0, P), P, C)
	b.EmbeddingBackward(dx, dxfP, m.pairIdx.Slice(0, P), P, C)
}
