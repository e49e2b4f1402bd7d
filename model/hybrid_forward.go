package model

// The forward and backward of a hybrid model's blocks (hybrid.go). Each
// block's body runs from its normed input ln1 to the last op before its
// output projection; its tail writes the mixer's output (out_proj, o_proj,
// down_proj, or the experts' sum and the shared expert) into the next
// block's input and adds the residual, fused with the next norm, as the
// uniform families' layers do.
//
//	Mamba-2:   zxbcdt = ln·Win; z, xBC, dt = its columns; xbc = Conv1D(xBC);
//	           y = SSMScan(xbc, dt); g = GatedRMSNorm(y, z); out = g·Woutᵀ
//	attention: q|k|v = ln·Wqkvᵀ; att = attention(q, k, v) (no RoPE, no
//	           q/k norm); out = att·Woᵀ
//	MLP:       u = ln·Wupᵀ; h = relu(u)²; out = h·Wdownᵀ
//
// The conv and the scan run over the staged tree, or over the forest of the
// staged sequences (mixerTree): state and window start from zero at every
// sequence and cross branch points. Under mixed precision the GEMM
// operands (ln, xbc, g, q, k, v, att, u, h) are bf16; in_proj's output is
// fp32, so z, the pre-conv rows and dt are, and so are the scan's output y,
// the norms' statistics and every gradient of a weight.

import "github.com/tracegrpo/tracegrpo/kernels"

// scanPieceSegs bounds the sequences one scan over a packed micro-batch
// runs on: a backend's scan scratch grows with its segments (the CUDA
// backend keeps each segment's final state, its initial-state gradient,
// a checkpoint and a chunk's state gradient more, kernels/cuda/workspace.go
// scanWork: 8 MiB a segment at Nemotron-3-Nano's 64 heads of 64 × 128), so a forest of more
// sequences runs as consecutive scans of at most this many. The sequences
// are independent; the results are a single scan's, but for the order in
// which dt_bias, A_log and D sum their gradients (piece by piece). A
// tree runs as one scan (its segments depend on each other).
var scanPieceSegs = 16

// scanPiece is one scan of a forest: its sequences [s0, s0+n), tokens
// [t0, t0+t), and its offsets from 0 at at in forestPieces.
type scanPiece struct{ s0, n, t0, t, at int }

// stageForest uploads the forest of the staged sequences (its non-empty
// ones, as roots) for the conv and the scan, and the offsets of each
// scan piece (scanPieceSegs) when it has more sequences than one scan
// runs.
func (m *Model) stageForest(cu []int32) {
	if m.hs.forestOffs.N == 0 {
		return
	}
	offs, parent, ends := m.hForest[:1], m.hFParent[:0], m.hFEnds[:0]
	offs[0] = 0
	for s := 0; s+1 < len(cu); s++ {
		if cu[s+1] > cu[s] {
			offs = append(offs, cu[s+1])
			parent = append(parent, -1)
			ends = append(ends, cu[s+1])
		}
	}
	n := len(parent)
	m.forestNS = n
	m.b.UploadI32(m.hs.forestOffs.Slice(0, n+1), offs)
	if n > 0 {
		m.b.UploadI32(m.hs.forestParent.Slice(0, n), parent)
		m.b.UploadI32(m.hs.forestEnds.Slice(0, n), ends)
	}
	m.pieces = m.pieces[:0]
	if n <= scanPieceSegs {
		return
	}
	po := m.hPieceOffs[:0]
	for s0 := 0; s0 < n; s0 += scanPieceSegs {
		k := min(scanPieceSegs, n-s0)
		t0 := offs[s0]
		m.pieces = append(m.pieces, scanPiece{s0: s0, n: k, t0: int(t0), t: int(offs[s0+k] - t0), at: len(po)})
		for s := s0; s <= s0+k; s++ {
			po = append(po, offs[s]-t0)
		}
	}
	m.hPieceOffs = po
	m.b.UploadI32(m.hs.pieceOffs.Slice(0, len(po)), po)
}

// pieceSlots is the offsets forestPieces holds for S sequences: each
// piece's n+1.
func pieceSlots(S int) int {
	if S <= scanPieceSegs {
		return 0
	}
	return S + (S+scanPieceSegs-1)/scanPieceSegs
}

// mixerTree is the tree the conv and the scan run over: the staged token
// tree, or the forest of the staged sequences.
func (m *Model) mixerTree() kernels.Tree {
	if m.lastTree {
		return m.tree()
	}
	n := m.forestNS
	return kernels.Tree{Offs: m.hs.forestOffs.Slice(0, n+1), Parent: m.hs.forestParent.Slice(0, n), Ends: m.hs.forestEnds.Slice(0, n),
		NS: n, MaxLen: m.lastMaxLen, MaxCtx: m.lastMaxLen}
}

// scanPieces calls f for each scan the mixers run: the whole mixerTree
// (piece {0, NS, 0, T}), or each piece of a forest of more than
// scanPieceSegs sequences, as a forest of its own from token 0.
func (m *Model) scanPieces(f func(tree kernels.Tree, p scanPiece)) {
	if m.lastTree || len(m.pieces) == 0 {
		f(m.mixerTree(), scanPiece{n: m.forestNS, t: m.lastT})
		return
	}
	for _, p := range m.pieces {
		offs := m.hs.pieceOffs.Slice(p.at, p.n+1)
		f(kernels.Tree{Offs: offs, Parent: m.hs.forestParent.Slice(0, p.n), Ends: m.hs.pieceOffs.Slice(p.at+1, p.n),
			NS: p.n, MaxLen: m.lastMaxLen, MaxCtx: m.lastMaxLen}, p)
	}
}

// hybridBody queues block l from its normed input la[l].ln1 up to the op
// before its output projection.
func (m *Model) hybridBody(l int) {
	switch m.cfg.Layers[l] {
	case LayerMamba:
		m.mambaBody(l)
	case LayerAttention:
		m.hybridAttnBody(l)
	case LayerMLP:
		m.mlpBody(l)
	case LayerMoE:
		m.hybridMoEBody(l)
	}
}

// hybridTail queues the end of block l's forward: the mixer's output and,
// fused with the residual add, the next block's norm (or the final norm).
func (m *Model) hybridTail(l int) {
	T, C := m.lastT, m.cfg.HiddenSize
	x := m.la[l].x.Slice(0, T*C)
	if l+1 < len(m.la) {
		n := &m.la[l+1]
		next := n.x.Slice(0, T*C)
		m.mixerOut(l, next)
		m.addThenNorm(next, n.ln1.Slice(0, T*C), n.rstd1.Slice(0, T), next, x, m.layers[l+1].ln1, T, C)
		return
	}
	xf := m.xf.Slice(0, T*C)
	m.mixerOut(l, xf)
	m.finalNorm(xf, x)
}

// mixerOut queues block l's output projection into out (T,C) F32.
func (m *Model) mixerOut(l int, out kernels.Buf) {
	c := m.cfg
	T := m.lastT
	h, gw := &m.hy[l], &m.gw[l]
	switch c.Layers[l] {
	case LayerMamba:
		DI := c.Mamba.DI()
		m.b.Matmul(out, h.g.Slice(0, T*DI), gw.outProj, T, DI, c.HiddenSize)
	case LayerAttention:
		qn := c.NumAttentionHeads * c.HeadDim
		m.b.Matmul(out, m.la[l].att.Slice(0, T*qn), gw.o, T, qn, c.HiddenSize)
	case LayerMLP:
		I := c.IntermediateSize
		m.b.Matmul(out, h.h.Slice(0, T*I), gw.down, T, I, c.HiddenSize)
	case LayerMoE:
		m.hybridMoEOut(l, out)
	}
}

// mambaBody queues a Mamba-2 mixer up to its gated norm.
func (m *Model) mambaBody(l int) {
	b, mb, c := m.b, m.mamba, m.cfg
	mc := c.Mamba
	T, C := m.lastT, c.HiddenSize
	DI, CD, MH, P, G := mc.DI(), mc.CD(), mc.Heads, mc.InProj(), mc.Groups
	a, h, w, gw := &m.la[l], &m.hy[l], &m.layers[l], &m.gw[l]
	proj := m.hs.proj.Slice(0, T*P)
	b.Matmul(proj, a.ln1.Slice(0, T*C), gw.inProj, T, C, P)
	z, xpre, dt := h.z.Slice(0, T*DI), h.xpre.Slice(0, T*CD), h.dt.Slice(0, T*MH)
	b.CopyCols(z, proj, T, DI, DI, P)
	b.CopyCols(xpre, proj.Slice(DI, T*P-DI), T, CD, CD, P)
	b.CopyCols(dt, proj.Slice(DI+CD, T*P-DI-CD), T, MH, MH, P)
	xbc, y := h.xbc.Slice(0, T*CD), h.y.Slice(0, T*DI)
	final := kernels.Buf{}
	switch {
	case m.dec != nil && !m.dec.prefill:
		m.mambaDecode(l, xbc, xpre, dt, y)
	case m.dec != nil:
		final = m.dec.final.Slice(0, m.forestNS*c.ssmState()) // the sampler keeps each prompt's
		fallthrough
	default:
		mb.Conv1D(xbc, xpre, w.conv, w.convBias, m.mixerTree(), T, CD, mc.ConvKernel)
		SS := c.ssmState()
		m.scanPieces(func(tree kernels.Tree, p scanPiece) {
			fin := final
			if fin.N > 0 {
				fin = final.Slice(p.s0*SS, p.n*SS)
			}
			mb.SSMScan(y.Slice(p.t0*DI, p.t*DI), fin, xbc.Slice(p.t0*CD, p.t*CD), dt.Slice(p.t0*MH, p.t*MH), w.dtBias, w.aLog, w.dD, tree, p.t, c.scan())
		})
	}
	mb.GatedRMSNorm(h.g.Slice(0, T*DI), h.grs.Slice(0, T*G), y, z, w.mnorm, T, DI, DI/G, c.RMSNormEps)
}

// hybridAttnBody queues an attention block up to its attention output.
func (m *Model) hybridAttnBody(l int) {
	b, c := m.b, m.cfg
	T, C := m.lastT, c.HiddenSize
	qn, kn := c.NumAttentionHeads*c.HeadDim, c.NumKeyValueHeads*c.HeadDim
	qkvN := qn + 2*kn
	a, gw := &m.la[l], &m.gw[l]
	qkv := m.hs.projA.Slice(0, T*qkvN)
	b.Matmul(qkv, a.ln1.Slice(0, T*C), gw.qkv, T, C, qkvN)
	q, k, v := a.q.Slice(0, T*qn), a.k.Slice(0, T*kn), a.v.Slice(0, T*kn)
	b.CopyCols(q, qkv, T, qn, qn, qkvN)
	b.CopyCols(k, qkv.Slice(qn, T*qkvN-qn), T, kn, kn, qkvN)
	b.CopyCols(v, qkv.Slice(qn+kn, T*qkvN-qn-kn), T, kn, kn, qkvN)
	if m.dec != nil && !m.dec.prefill {
		m.attnDecode(l, a.att.Slice(0, T*qn), q, k, v)
		return
	}
	m.attend(a.att.Slice(0, T*qn), a.lse.Slice(0, T*c.NumAttentionHeads), q, k, v)
}

// mlpBody queues an MLP block up to its squared ReLU.
func (m *Model) mlpBody(l int) {
	T, C, I := m.lastT, m.cfg.HiddenSize, m.cfg.IntermediateSize
	h := &m.hy[l]
	m.b.Matmul(h.up.Slice(0, T*I), m.la[l].ln1.Slice(0, T*C), m.gw[l].up, T, C, I)
	m.mamba.ReLU2(h.h.Slice(0, T*I), h.up.Slice(0, T*I), T*I)
}

// hybridBackward queues block l's backward (recomputing its activations
// first with Options.Recompute): dx holds the gradient of its output on
// entry and of its input on return.
func (m *Model) hybridBackward(l int) {
	if m.opt.Recompute {
		m.layerForward(l, false)
	}
	T, C := m.lastT, m.cfg.HiddenSize
	switch m.cfg.Layers[l] {
	case LayerMamba:
		m.mambaBackward(l)
	case LayerAttention:
		m.hybridAttnBackward(l)
	case LayerMLP:
		m.mlpBackward(l)
	case LayerMoE:
		m.hybridMoEBackward(l)
	}
	a, w, dw := &m.la[l], &m.layers[l], &m.dlayers[l]
	m.b.RMSNormBackward(m.dx.Slice(0, T*C), dw.ln1, m.dln.Slice(0, T*C), a.x.Slice(0, T*C), w.ln1, a.rstd1.Slice(0, T), T, C)
}

// gradW returns the gradient g in the GEMMs' precision for a backward
// GEMM: g itself under F32, else rounded into the shared scratch.
func (m *Model) gradW(g kernels.Buf) kernels.Buf {
	return m.gemmGrad(g, m.hs.gradW)
}

// mambaBackward queues a Mamba-2 mixer's backward: dln = ∂L/∂ln1
// (assigned) from dx, its weights' gradients accumulated.
func (m *Model) mambaBackward(l int) {
	b, mb, c := m.b, m.mamba, m.cfg
	mc := c.Mamba
	T, C := m.lastT, c.HiddenSize
	DI, CD, MH, P, G := mc.DI(), mc.CD(), mc.Heads, mc.InProj(), mc.Groups
	a, h, w, dw, gw, hs := &m.la[l], &m.hy[l], &m.layers[l], &m.dlayers[l], &m.gw[l], &m.hs
	tc := func(x kernels.Buf, n int) kernels.Buf { return x.Slice(0, T*n) }
	dx, dln := tc(m.dx, C), tc(m.dln, C)
	dg := tc(hs.dg, DI)
	b.Fill(dg, 0)
	b.MatmulBackward(dg, dw.outProj, m.gemmGrad(dx, m.dxW), tc(h.g, DI), gw.outProj, T, DI, C)
	dy, dz := tc(hs.dy, DI), tc(hs.dz, DI)
	mb.GatedRMSNormBackward(dy, dz, dw.mnorm, dg, tc(h.y, DI), tc(h.z, DI), w.mnorm, tc(h.grs, G), T, DI, DI/G)
	dxbc, ddt := tc(hs.dxbc, CD), tc(hs.ddt, MH)
	m.scanPieces(func(tree kernels.Tree, p scanPiece) {
		tok := func(x kernels.Buf, n int) kernels.Buf { return x.Slice(p.t0*n, p.t*n) }
		mb.SSMScanBackward(tok(dxbc, CD), tok(ddt, MH), dw.dtBias, dw.aLog, dw.dD, tok(dy, DI), tok(h.xbc, CD), tok(h.dt, MH),
			w.dtBias, w.aLog, w.dD, tree, p.t, c.scan())
	})
	dxpre := tc(hs.dxpre, CD)
	mb.Conv1DBackward(dxpre, dw.conv, dw.convBias, dxbc, tc(h.xpre, CD), w.conv, w.convBias, m.mixerTree(), T, CD, mc.ConvKernel)
	dproj := tc(hs.dproj, P)
	b.CopyCols(dproj, dz, T, DI, P, DI)
	b.CopyCols(dproj.Slice(DI, T*P-DI), dxpre, T, CD, P, CD)
	b.CopyCols(dproj.Slice(DI+CD, T*P-DI-CD), ddt, T, MH, P, MH)
	b.Fill(dln, 0)
	b.MatmulBackward(dln, dw.inProj, dproj, tc(a.ln1, C), gw.inProj, T, C, P)
}

// hybridAttnBackward queues an attention block's backward.
func (m *Model) hybridAttnBackward(l int) {
	b, c := m.b, m.cfg
	T, C := m.lastT, c.HiddenSize
	NH := c.NumAttentionHeads
	qn, kn := NH*c.HeadDim, c.NumKeyValueHeads*c.HeadDim
	qkvN := qn + 2*kn
	a, dw, gw := &m.la[l], &m.dlayers[l], &m.gw[l]
	tc := func(x kernels.Buf, n int) kernels.Buf { return x.Slice(0, T*n) }
	dx, dln := tc(m.dx, C), tc(m.dln, C)
	datt := tc(m.datt, qn)
	b.Fill(datt, 0)
	b.MatmulBackward(datt, dw.o, m.gemmGrad(dx, m.dxW), tc(a.att, qn), gw.o, T, qn, C)
	dq, dk, dv := tc(m.dq, qn), tc(m.dk, kn), tc(m.dv, kn)
	m.attendBackward(dq, dk, dv, m.gemmGrad(datt, m.dattW), tc(a.att, qn), a.lse.Slice(0, T*NH), tc(a.q, qn), tc(a.k, kn), tc(a.v, kn))
	dqkv := tc(m.hs.dprojA, qkvN)
	b.CopyCols(dqkv, dq, T, qn, qkvN, qn)
	b.CopyCols(dqkv.Slice(qn, T*qkvN-qn), dk, T, kn, qkvN, kn)
	b.CopyCols(dqkv.Slice(qn+kn, T*qkvN-qn-kn), dv, T, kn, qkvN, kn)
	b.Fill(dln, 0)
	b.MatmulBackward(dln, dw.qkv, dqkv, tc(a.ln1, C), gw.qkv, T, C, qkvN)
}

// mlpBackward queues an MLP block's backward.
func (m *Model) mlpBackward(l int) {
	b, c := m.b, m.cfg
	T, C, I := m.lastT, c.HiddenSize, c.IntermediateSize
	a, h, dw, gw, hs := &m.la[l], &m.hy[l], &m.dlayers[l], &m.gw[l], &m.hs
	tc := func(x kernels.Buf, n int) kernels.Buf { return x.Slice(0, T*n) }
	dx, dln := tc(m.dx, C), tc(m.dln, C)
	dh, dup := tc(hs.dh, I), tc(hs.dup, I)
	b.Fill(dh, 0)
	b.MatmulBackward(dh, dw.down, m.gemmGrad(dx, m.dxW), tc(h.h, I), gw.down, T, I, C)
	m.mamba.ReLU2Backward(dup, dh, tc(h.up, I), T*I)
	b.Fill(dln, 0)
	b.MatmulBackward(dln, dw.up, m.gradW(dup), tc(a.ln1, C), gw.up, T, C, I)
}
