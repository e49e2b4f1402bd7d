package model

// Sparse (mixture-of-experts) layers: Qwen3-MoE's MLP as transformers'
// Qwen3MoeSparseMoeBlock computes it, on the backend's kernels.Experts.
//
//	logits (T,E) = ln2 · Wgᵀ                    router (fp32 out, fp32 softmax)
//	probs, experts (T,K), weights (T,K)         RouterTopK: softmax, top K,
//	                                            renormalised (norm_topk_prob)
//	xp (N,C) = ln2 rows by expert               ExpertRoute + ExpertGather
//	gate|up (N,2Im) = xp · Wgu[e]ᵀ              GroupedMatmul
//	h = silu(gate)·up; y (N,C) = h · Wdown[e]ᵀ  SwiGLU, GroupedMatmul
//	out (T,C) = Σ_j weights[t,j] · y[slot]      ExpertCombine
//
// with N = T·K. Under mixed precision the GEMM operands (ln2, xp, gate, up,
// h and the router's and experts' weights, and the gradients entering
// their backward) are bf16, as in the dense MLP; the router's logits and
// probabilities, the routing weights, y and the weighted sum stay fp32
// (transformers rounds the routing weights and y to the model's dtype
// before the sum; the residual stream here is fp32).
//
// The load-balancing loss is transformers' load_balancing_loss_func over
// the sparse layers of one forward: with R = L_s·T rows (every sparse
// layer's tokens), F_e = (1/R)·#{(l,t,j): expert e chosen} and
// P_e = (1/R)·Σ_{l,t} probs[l,t,e],
//
//	aux = E · Σ_e F_e · P_e,   ∂aux/∂probs[l,t,e] = E · F_e / R.
//
// F is a count (no gradient), so the loss reaches the router through the
// probabilities only: RouterTopKBackward's dprobs.

import "github.com/tracegrpo/tracegrpo/kernels"

// moeBufs are the buffers one sparse layer's forward writes for T tokens.
type moeBufs struct {
	logits, offsets kernels.Buf // (T,E) scratch, (E+1) I32
	xp, efused      kernels.Buf // (N,C) w, (N,2·Im) w scratch
	moeActs
}

// layerMoE returns layer l's buffers in the model's activation arenas.
func (m *Model) layerMoE(l int) moeBufs {
	return moeBufs{logits: m.rlogits, offsets: m.offsets[l], xp: m.xp, efused: m.efused, moeActs: m.la[l].moe}
}

// moeForward queues sparse layer l's experts on T rows of ln (T,C) in the
// GEMM precision, up to their outputs y (mb.ey); ExpertCombine adds them up.
func (m *Model) moeForward(l, T int, ln kernels.Buf, mb moeBufs) {
	b, x, c := m.b, m.experts, m.cfg
	C, E, K, Im := c.HiddenSize, c.MoE.NumExperts, c.MoE.TopK, c.MoE.IntermediateSize
	N := T * K
	gw := &m.gw[l]
	tc := func(buf kernels.Buf, w int) kernels.Buf { return buf.Slice(0, T*w) }
	nc := func(buf kernels.Buf, w int) kernels.Buf { return buf.Slice(0, N*w) }
	logits := tc(mb.logits, E)
	b.Matmul(logits, ln, gw.router, T, C, E)
	x.RouterTopK(tc(mb.probs, E), tc(mb.rw, K), tc(mb.rexp, K), logits, T, E, m.router)
	x.ExpertRoute(mb.offsets, nc(mb.order, 1), nc(mb.slot, 1), tc(mb.rexp, K), T, K, E)
	xp := nc(mb.xp, C)
	x.ExpertGather(xp, ln, nc(mb.order, 1), T, K, C)
	gu := nc(mb.efused, 2*Im)
	x.GroupedMatmul(gu, xp, gw.egu, mb.offsets, N, C, 2*Im, E)
	b.CopyCols(nc(mb.egate, Im), gu, N, Im, Im, 2*Im)
	b.CopyCols(nc(mb.eup, Im), gu.Slice(Im, N*2*Im-Im), N, Im, Im, 2*Im)
	b.SwiGLU(nc(mb.eh, Im), nc(mb.egate, Im), nc(mb.eup, Im), N*Im)
	x.GroupedMatmul(nc(mb.ey, C), nc(mb.eh, Im), gw.edown, mb.offsets, N, Im, C, E)
}

// moeCombine queues out (T,C) = the weighted sum of sparse layer l's
// expert outputs (the layer's MLP output, before the residual add).
func (m *Model) moeCombine(T int, out kernels.Buf, mb moeBufs) {
	C, K := m.cfg.HiddenSize, m.cfg.MoE.TopK
	N := T * K
	m.experts.ExpertCombine(out, mb.ey.Slice(0, N*C), mb.rw.Slice(0, T*K), mb.slot.Slice(0, N), T, K, C)
}

// moeStats queues sparse layer l's router statistics for the
// load-balancing loss: psum (E) = Σ_t probs[t] (the counts are its
// offsets).
func (m *Model) moeStats(l, T int) {
	E := m.cfg.MoE.NumExperts
	m.b.Fill(m.psum[l], 0)
	if T > 0 {
		m.b.BiasBackward(m.psum[l], m.la[l].moe.probs.Slice(0, T*E), T, E)
	}
}

// moeBackward queues sparse layer l's backward: dx (T,C) = ∂L/∂(layer
// output) in, dln (T,C) = ∂L/∂ln2 out (assigned), gradients of the router
// and the experts accumulated.
func (m *Model) moeBackward(l int, dx, dln kernels.Buf) {
	b, x, c := m.b, m.experts, m.cfg
	T := m.lastT
	C, E, K, Im := c.HiddenSize, c.MoE.NumExperts, c.MoE.TopK, c.MoE.IntermediateSize
	N := T * K
	mb := m.layerMoE(l)
	dw, gw := &m.dlayers[l], &m.gw[l]
	tc := func(buf kernels.Buf, w int) kernels.Buf { return buf.Slice(0, T*w) }
	nc := func(buf kernels.Buf, w int) kernels.Buf { return buf.Slice(0, N*w) }
	// out = Σ_j w·y: dy (rounded for the down GEMM) and the weights' gradient.
	dy := nc(m.dey, C)
	x.ExpertCombineBackward(dy, tc(m.drw, K), dx, nc(mb.ey, C), tc(mb.rw, K), nc(mb.order, 1), nc(mb.slot, 1), T, K, C)
	// y = h·Wdownᵀ, h = silu(gate)·up, gate|up = xp·Wguᵀ.
	dh := nc(m.deh, Im)
	b.Fill(dh, 0)
	x.GroupedMatmulBackward(dh, dw.edown, dy, nc(mb.eh, Im), gw.edown, mb.offsets, N, Im, C, E)
	b.SwiGLUBackward(nc(m.degate, Im), nc(m.deup, Im), dh, nc(mb.egate, Im), nc(mb.eup, Im), N*Im)
	dgu := nc(m.efused, 2*Im)
	b.CopyCols(dgu, nc(m.degate, Im), N, Im, 2*Im, Im)
	b.CopyCols(dgu.Slice(Im, N*2*Im-Im), nc(m.deup, Im), N, Im, 2*Im, Im)
	ln2 := tc(m.la[l].ln2, C)
	xp := nc(m.xp, C)
	x.ExpertGather(xp, ln2, nc(mb.order, 1), T, K, C) // the rows the experts read, gathered again
	dxp := nc(m.dxp, C)
	b.Fill(dxp, 0)
	x.GroupedMatmulBackward(dxp, dw.egu, dgu, xp, gw.egu, mb.offsets, N, C, 2*Im, E)
	b.Fill(dln, 0)
	x.ExpertGatherBackward(dln, dxp, nc(mb.slot, 1), T, K, C)
	// The router: weights ← softmax ← logits = ln2·Wgᵀ.
	var aux kernels.Buf
	if m.routerLossWeight != 0 {
		aux = m.auxGrad[l]
	}
	dlogits := tc(m.dlogits, E)
	x.RouterTopKBackward(dlogits, tc(m.drw, K), tc(mb.probs, E), tc(mb.rw, K), tc(mb.rexp, K), aux, T, E, m.router)
	drouter := dw.router
	if m.opt.FreezeRouter {
		drouter = kernels.Buf{}
	}
	b.MatmulBackward(dln, drouter, dlogits, ln2, gw.router, T, C, E)
}

// queueRouterStats queues the downloads of the router counts (offsets) and
// summed probabilities of the Forward in progress, before its Sync.
func (m *Model) queueRouterStats() {
	E := m.cfg.MoE.NumExperts
	for l := range m.la {
		if m.cfg.SparseLayer(l) {
			m.b.DownloadI32(m.hOffsets[l*(E+1):(l+1)*(E+1)], m.offsets[l])
			m.b.DownloadF32(m.hPsum[l*E:(l+1)*E], m.psum[l])
		}
	}
}

// finishRouterStats computes the load-balancing loss of the downloaded
// statistics, and F (hAux, E) for its gradient.
func (m *Model) finishRouterStats() {
	c := m.cfg
	E := c.MoE.NumExperts
	R := float64(c.SparseLayers() * m.lastT)
	m.routerLoss = 0
	if R == 0 {
		clear(m.hAux)
		return
	}
	F, P := m.hF[:E], m.hP[:E]
	clear(F)
	clear(P)
	for l := range m.la {
		if !c.SparseLayer(l) {
			continue
		}
		off := m.hOffsets[l*(E+1) : (l+1)*(E+1)]
		for e := 0; e < E; e++ {
			F[e] += float64(off[e+1] - off[e])
			P[e] += float64(m.hPsum[l*E+e])
		}
	}
	for e := 0; e < E; e++ {
		F[e] /= R
		P[e] /= R
		m.routerLoss += F[e] * P[e]
		m.hAux[e] = float32(float64(E) * F[e] / R) // ∂aux/∂probs[l,t,e], before the weight
	}
	m.routerLoss *= float64(E)
}

// auxStats reports whether the model keeps the load-balancing loss's
// statistics: a sparse model of the uniform families (a hybrid model's
// sigmoid routers balance by their selection bias instead).
func (m *Model) auxStats() bool { return m.cfg.Sparse() && !m.cfg.Hybrid() }

// RouterLoss returns the load-balancing loss of the last Forward
// (transformers' load_balancing_loss_func over every sparse layer's
// tokens), and false for a dense or hybrid model or before any Forward.
func (m *Model) RouterLoss() (float64, bool) {
	if !m.auxStats() || m.lastT == 0 {
		return 0, false
	}
	return m.routerLoss, true
}

// SetRouterLossWeight sets the weight w of the load-balancing loss in the
// loss the next Backward calls differentiate: L = Σ_t dlogprob[t]·logprob[t]
// + w·RouterLoss(). 0 (the default) leaves the loss out; a dense model
// ignores it.
func (m *Model) SetRouterLossWeight(w float32) { m.routerLossWeight = w }

// uploadAuxGrad writes ∂(w·aux)/∂probs of the last Forward into every
// sparse layer's auxGrad (E).
func (m *Model) uploadAuxGrad() {
	if m.routerLossWeight == 0 || !m.auxStats() {
		return
	}
	for e, f := range m.hAux {
		m.hAuxW[e] = m.routerLossWeight * f
	}
	for l := range m.la {
		if m.cfg.SparseLayer(l) {
			m.b.UploadF32(m.auxGrad[l], m.hAuxW)
		}
	}
}
