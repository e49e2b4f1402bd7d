package model

// A hybrid model's sparse blocks: transformers' NemotronHMoE (and
// Nemotron-3-Super's latent MoE) on the backend's kernels.Experts.
//
//	logits (T,E) = lnF · Wgᵀ                 fp32 (transformers'
//	                                          NemotronHTopkRouter casts to
//	                                          fp32; Megatron's
//	                                          moe_router_dtype fp32)
//	experts, weights = RouterTopK            σ(logits); the choice adds
//	                                          e_score_correction_bias,
//	                                          by group; the weights are the
//	                                          unbiased scores, renormalised
//	                                          (norm_topk_prob), × routed_scaling_factor
//	xin = ln, or ln · Wfc1ᵀ (latent)          fc1_latent_proj
//	u = xin rows · Wup[e]ᵀ, h = relu(u)², y = h · Wdown[e]ᵀ
//	routed = Σ_j weights[t,j] · y             ExpertCombine (in the latent
//	                                          space, then · Wfc2ᵀ)
//	out = routed + relu(ln·Wsupᵀ)²·Wsdownᵀ    the shared expert, on ln
//
// with N = T·K assignments. The router's GEMM runs in fp32 from the
// block's normed input (widened from bf16 under mixed precision, as
// transformers widens its bf16 hidden states); the experts' and the shared
// expert's GEMM operands are in the compute precision.

import "github.com/tracegrpo/tracegrpo/kernels"

// blockRouter is block l's router: the model's, with the block's
// selection bias (its fp32 e_score_correction_bias).
func (m *Model) blockRouter(l int) kernels.Router {
	r := m.router
	r.Bias = m.layers[l].ebias
	return r
}

// routerInput is block l's normed input in fp32 for the router GEMM: ln1
// itself under F32, else widened into lnF.
func (m *Model) routerInput(l int) kernels.Buf {
	T, C := m.lastT, m.cfg.HiddenSize
	ln := m.la[l].ln1.Slice(0, T*C)
	if m.wdt == kernels.F32 {
		return ln
	}
	lnF := m.hs.lnF.Slice(0, T*C)
	m.b.Convert(lnF, ln)
	return lnF
}

// hybridMoEBody queues a sparse block up to its experts' outputs (their
// latent sum too, fc2's input) and the shared expert's activation.
func (m *Model) hybridMoEBody(l int) {
	b, x, c := m.b, m.experts, m.cfg
	e := c.MoE
	T, C := m.lastT, c.HiddenSize
	E, K, Im, Ish, Lat, In := e.NumExperts, e.TopK, e.IntermediateSize, e.SharedSize, e.LatentSize, c.expertIn()
	N := T * K
	a, h, w, gw := &m.la[l], &m.hy[l], &m.layers[l], &m.gw[l]
	mo := &a.moe
	tc := func(buf kernels.Buf, n int) kernels.Buf { return buf.Slice(0, T*n) }
	nc := func(buf kernels.Buf, n int) kernels.Buf { return buf.Slice(0, N*n) }
	ln := tc(a.ln1, C)
	logits := tc(m.rlogits, E)
	b.Matmul(logits, m.routerInput(l), w.router, T, C, E)
	x.RouterTopK(tc(mo.probs, E), tc(mo.rw, K), tc(mo.rexp, K), logits, T, E, m.blockRouter(l))
	x.ExpertRoute(m.offsets[l], nc(mo.order, 1), nc(mo.slot, 1), tc(mo.rexp, K), T, K, E)
	xin := ln
	if Lat > 0 {
		xin = tc(h.lat, Lat)
		b.Matmul(xin, ln, gw.fc1, T, C, Lat)
	}
	xp := nc(m.hs.xp, In)
	x.ExpertGather(xp, xin, nc(mo.order, 1), T, K, In)
	x.GroupedMatmul(nc(h.eup, Im), xp, gw.egu, m.offsets[l], N, In, Im, E)
	m.mamba.ReLU2(nc(h.eh, Im), nc(h.eup, Im), N*Im)
	x.GroupedMatmul(nc(h.ey, In), nc(h.eh, Im), gw.edown, m.offsets[l], N, Im, In, E)
	if Lat > 0 { // the latent sum, fc2's input (kept for its backward)
		comb := tc(m.hs.comb, Lat)
		x.ExpertCombine(comb, nc(h.ey, In), tc(mo.rw, K), nc(mo.slot, 1), T, K, Lat)
		combW := tc(h.combW, Lat)
		if combW.DType != comb.DType {
			b.Convert(combW, comb)
		} else {
			b.Copy(combW, comb)
		}
	}
	b.Matmul(tc(h.sup, Ish), ln, gw.shUp, T, C, Ish)
	m.mamba.ReLU2(tc(h.sh, Ish), tc(h.sup, Ish), T*Ish)
}

// hybridMoEOut queues a sparse block's output into out (T,C) F32: the
// routed experts' weighted sum (through fc2_latent_proj when latent) plus
// the shared expert's down projection.
func (m *Model) hybridMoEOut(l int, out kernels.Buf) {
	b, x, c := m.b, m.experts, m.cfg
	e := c.MoE
	T, C := m.lastT, c.HiddenSize
	K, Ish, Lat, In := e.TopK, e.SharedSize, e.LatentSize, c.expertIn()
	N := T * K
	a, h, gw := &m.la[l], &m.hy[l], &m.gw[l]
	ey, rw, slot := h.ey.Slice(0, N*In), a.moe.rw.Slice(0, T*K), a.moe.slot.Slice(0, N)
	if Lat > 0 {
		b.Matmul(out, h.combW.Slice(0, T*Lat), gw.fc2, T, Lat, C)
	} else {
		x.ExpertCombine(out, ey, rw, slot, T, K, C)
	}
	tmp := m.hs.tmpC.Slice(0, T*C)
	b.Matmul(tmp, h.sh.Slice(0, T*Ish), gw.shDown, T, Ish, C)
	b.Add(out, out, tmp, T*C)
}

// hybridMoEBackward queues a sparse block's backward: dln = ∂L/∂ln1
// (assigned) from dx, the experts', the shared expert's, the latent
// projections' and (unless frozen) the router's gradients accumulated. The
// selection bias has none: the block's choice is counted for its update
// (countRouted) instead.
func (m *Model) hybridMoEBackward(l int) {
	m.countRouted(l)
	b, x, c := m.b, m.experts, m.cfg
	e := c.MoE
	T, C := m.lastT, c.HiddenSize
	E, K, Im, Ish, Lat, In := e.NumExperts, e.TopK, e.IntermediateSize, e.SharedSize, e.LatentSize, c.expertIn()
	N := T * K
	a, h, w, dw, gw, hs := &m.la[l], &m.hy[l], &m.layers[l], &m.dlayers[l], &m.gw[l], &m.hs
	mo := &a.moe
	tc := func(buf kernels.Buf, n int) kernels.Buf { return buf.Slice(0, T*n) }
	nc := func(buf kernels.Buf, n int) kernels.Buf { return buf.Slice(0, N*n) }
	dx, dln, ln := tc(m.dx, C), tc(m.dln, C), tc(a.ln1, C)
	dxW := m.gemmGrad(dx, m.dxW)
	b.Fill(dln, 0)
	// The shared expert: out += relu(ln·Wsupᵀ)²·Wsdownᵀ.
	dsh, dsup := tc(hs.dsh, Ish), tc(hs.dsup, Ish)
	b.Fill(dsh, 0)
	b.MatmulBackward(dsh, dw.shDown, dxW, tc(h.sh, Ish), gw.shDown, T, Ish, C)
	m.mamba.ReLU2Backward(dsup, dsh, tc(h.sup, Ish), T*Ish)
	b.MatmulBackward(dln, dw.shUp, m.gradW(dsup), ln, gw.shUp, T, C, Ish)
	// The routed experts' sum, through fc2 when latent.
	dcomb := dx
	if Lat > 0 {
		dcomb = tc(hs.dcomb, Lat)
		b.Fill(dcomb, 0)
		b.MatmulBackward(dcomb, dw.fc2, dxW, tc(h.combW, Lat), gw.fc2, T, Lat, C)
	}
	// Three buffers of N·In or N·Im rows serve twice, the first use over
	// before the second begins: the experts' outputs' gradient dy lives in
	// the gathered inputs' scratch (gathered again below, once dy is
	// spent), their up projections' gradient deup replaces deh in place
	// (elementwise), and the gathered inputs' gradient dxp takes the
	// experts' outputs ey (read only by ExpertCombineBackward).
	dy := nc(hs.xp, In)
	x.ExpertCombineBackward(dy, tc(m.drw, K), dcomb, nc(h.ey, In), tc(mo.rw, K), nc(mo.order, 1), nc(mo.slot, 1), T, K, In)
	deh := nc(hs.deh, Im)
	b.Fill(deh, 0)
	x.GroupedMatmulBackward(deh, dw.edown, dy, nc(h.eh, Im), gw.edown, m.offsets[l], N, Im, In, E)
	deup := deh
	m.mamba.ReLU2Backward(deup, deh, nc(h.eup, Im), N*Im)
	xin := ln
	if Lat > 0 {
		xin = tc(h.lat, Lat)
	}
	xp := nc(hs.xp, In)
	x.ExpertGather(xp, xin, nc(mo.order, 1), T, K, In) // the rows the experts read, gathered again
	dxp := nc(h.ey, In)
	b.Fill(dxp, 0)
	x.GroupedMatmulBackward(dxp, dw.egu, m.gradW(deup), xp, gw.egu, m.offsets[l], N, In, Im, E)
	dxin := tc(hs.dxin, In)
	b.Fill(dxin, 0)
	x.ExpertGatherBackward(dxin, dxp, nc(mo.slot, 1), T, K, In)
	if Lat > 0 {
		b.MatmulBackward(dln, dw.fc1, m.gradW(dxin), ln, gw.fc1, T, C, Lat)
	} else {
		b.Accumulate(dln, dxin, T*C)
	}
	// The router: weights ← σ ← logits = lnF·Wgᵀ, in fp32.
	dlogits := tc(m.dlogits, E)
	x.RouterTopKBackward(dlogits, tc(m.drw, K), tc(mo.probs, E), tc(mo.rw, K), tc(mo.rexp, K), kernels.Buf{}, T, E, m.blockRouter(l))
	drouter := dw.router
	if m.opt.FreezeRouter {
		drouter = kernels.Buf{}
	}
	if m.wdt == kernels.F32 {
		b.MatmulBackward(dln, drouter, dlogits, ln, w.router, T, C, E)
		return
	}
	dlnF := tc(hs.dlnF, C)
	b.Fill(dlnF, 0)
	b.MatmulBackward(dlnF, drouter, dlogits, m.routerInput(l), w.router, T, C, E)
	b.Accumulate(dln, dlnF, T*C)
}
