package cpu

// SSMScan: the Mamba-2 selective scan as the chunked SSD algorithm
// (kernels.Mamba), over a packed tree. For one head h (group g), with
// a_t = dt_t·A (A = −exp(aLog) < 0, so every decay below is ≤ 1):
//
//	S_t = exp(a_t)·S_{t−1} + dt_t·x_t ⊗ B_t          (MP,DS)
//	y_t = S_t·C_t + D·x_t                                                 =
//
// Chunks are aligned to context positions: chunk k of a root's context
// holds positions [k·L, (k+1)·L), L = s.Chunk, whatever the segments. In a
// chunk of l rows with Λ_i = Σ_{j≤i} a_j and S0 the state at its start
// (a boundary):
//
//	intra:   Y  = (G ⊙ L ⊙ dt_j) · X,  G = C·Bᵀ (l,l), L_ij = exp(Λ_i − Λ_j), j ≤ i
//	inter:   Y += diag(exp Λ) · C · S0ᵀ,   then Y += D·X
//	state:   S1 = exp(Λ_last)·S0 + Xᵀ · diag(w)·B,  w_j = exp(Λ_last − Λ_j)·dt_j
//
// A segment that starts inside a chunk (its context position A is not a
// multiple of L) runs that chunk again from its boundary ⌊A/L⌋·L: the rows
// before A are its ancestors' last tokens (gathered up the parent chain),
// whose outputs it does not write, and the chunk starts from the state at
// that boundary, which the ancestor that holds it keeps (Sb: each segment
// with children keeps the state at the last boundary at or before its
// end). Every chunk is therefore the same computation, on the same rows
// and start state, as in the packed sequence of its root-to-segment path:
// a tree's outputs equal its paths' as sequences bit for bit
// (TestSSMScanTreeMatchesPaths), the property model.TestTreeMatchesUnshared
// rests on. The state at a segment's end (the final output) is its last
// chunk's end state.
//
// The backward runs each segment's chunks in reverse with the gradient of
// their boundary states: a chunk's dS0 (dYᵀ·diag(exp Λ)·C + exp(Λ_last)·dS1)
// is the gradient of the boundary before it; the gradient of a segment's
// Sb sums its children's (in reverse preorder), and reaches the chunk that
// starts or ends at that boundary; the gradient of the first boundary goes
// to the parent's Sb. X, B, C and dt get the gradients of the same
// matmuls (dY·Xᵀ, Mᵀ·dY, …) and Λ's through the decays (dΛ, reverse-summed
// into da_j, then ddt_j += da_j·A and dA += da_j·dt_j); an ancestor's rows
// in a re-run chunk receive that chunk's gradients beside their own.
//
// Work splits by head: each head walks the tree's segments (the forward in
// preorder with the open path's Sb on a stack; the backward computes every
// Sb first, then walks segments in reverse preorder, recomputing each
// one's chunk states). A chunk's rows are gathered into contiguous scratch.
// A head owns its columns of y, of dxbc's x and of ddtRaw, and its ddtBias,
// daLog and dd; B and C are shared by the heads of a group, so each head
// accumulates its dB, dC into a (T,MH,2,DS) scratch that a second pass sums
// over the group's heads in head order. Every sum runs in an order fixed
// by the shapes and the tree: deterministic, thread-count invariant. The
// float64 instantiation (the tests) is checked against the sequential
// recurrence and finite differences.

import (
	"fmt"
	"math"

	"github.com/tracegrpo/tracegrpo/kernels"
)

// ssmArgs are one scan's buffers, in F.
type ssmArgs[F Float] struct {
	xbc, dtRaw, dtBias, aLog, d []F // (T,CD), (T,MH), (MH), (MH), (MH)
	y, final                    []F // (T,MH,MP) or nil (states only), (NS,MH,MP,DS) or nil
	// backward
	dy, dxbc, ddtRaw, ddtBias, daLog, dd []F
	dBC                                  []F // (T,MH,2,DS) per-head dB, dC
	offs, parent, ends, anc              []int32
	T                                    int
	s                                    kernels.Scan
}

// ssmWork is one worker's scratch for one head, in F.
type ssmWork[F Float] struct {
	ws   *wscratch
	rows []int32 // (L) the packed token of each of a chunk's rows
	// A chunk's gathered rows and their results.
	gx, gy, gdy, gdx   []F // (L,MP)
	gB, gC, gdB, gdC   []F // (L,DS)
	raw, sp, dt, lam   []F // (L)
	ddt, dl, gddt      []F // (L)
	G, M, dM           []F // (L,L)
	tmpP, tmpP2        []F // (L,MP)
	tmpN, tmpN2, bw    []F // (L,DS)
	s1, ds0, ds1, last []F // (MP,DS)
	zero               []F // (MP,DS) zeros
	// The boundary states: the forward's open path (stack, by depth); the
	// backward's per segment with children (sb, dsb by slot) and a
	// segment's chunk start states (chunks).
	stack, sb, dsb, chunks []F
	slot                   []int32
	path                   []int32
}

func newSSMWork[F Float](ws *wscratch, s kernels.Scan) *ssmWork[F] {
	L, P, N := s.Chunk, s.MP, s.DS
	w := &ssmWork[F]{ws: ws, rows: make([]int32, L)}
	for _, b := range []*[]F{&w.gx, &w.gy, &w.gdy, &w.gdx, &w.tmpP, &w.tmpP2} {
		*b = make([]F, L*P)
	}
	for _, b := range []*[]F{&w.gB, &w.gC, &w.gdB, &w.gdC, &w.tmpN, &w.tmpN2, &w.bw} {
		*b = make([]F, L*N)
	}
	for _, b := range []*[]F{&w.raw, &w.sp, &w.dt, &w.lam, &w.ddt, &w.dl, &w.gddt} {
		*b = make([]F, L)
	}
	for _, b := range []*[]F{&w.G, &w.M, &w.dM} {
		*b = make([]F, L*L)
	}
	for _, b := range []*[]F{&w.s1, &w.ds0, &w.ds1, &w.last, &w.zero} {
		*b = make([]F, P*N)
	}
	return w
}

// grow returns buf resized to n elements, its contents kept.
func grow[F Float](buf []F, n int) []F {
	if cap(buf) < n {
		b := make([]F, n, n+n/4)
		copy(b, buf)
		return b
	}
	return buf[:n]
}

// chunkRows fills w.rows with the packed tokens of the chunk of segment seg
// that starts at context position cb (a boundary) and returns its row
// count and the first row that is the segment's own (the rows before are
// its ancestors' last tokens).
func chunkRows[F Float](a *ssmArgs[F], w *ssmWork[F], seg int, cb int) (l, own int) {
	L := a.s.Chunk
	A := int(a.anc[seg])
	E := A + int(a.offs[seg+1]-a.offs[seg])
	end := min(cb+L, E)
	l = end - cb
	own = max(A-cb, 0)
	for i := own; i < l; i++ {
		w.rows[i] = a.offs[seg] + int32(cb+i-A)
	}
	// The ancestors' tokens at context positions [cb, A), from the last.
	p := a.parent[seg]
	for i := own - 1; i >= 0; i-- {
		pos := int32(cb + i)
		for pos < a.anc[p] {
			p = a.parent[p]
		}
		w.rows[i] = a.offs[p] + pos - a.anc[p]
	}
	return l, own
}

// gather copies head h's rows of a chunk (w.rows[:l]) into contiguous
// scratch: x (l,MP), B and C (l,DS), and dt (softplus, clamp, its
// cumulative decay Λ).
func gather[F Float](a *ssmArgs[F], w *ssmWork[F], h, l int, A F) {
	s := a.s
	P, N, CD, MH := s.MP, s.DS, s.CD(), s.MH
	g := h / (MH / s.G)
	xo, bo, co := h*P, s.DI()+g*N, s.DI()+(s.G+g)*N
	lo, hi := F(s.DtMin), F(s.DtMax)
	var acc F
	for i, t := range w.rows[:l] {
		r := a.xbc[int(t)*CD:]
		copy(w.gx[i*P:(i+1)*P], r[xo:xo+P])
		copy(w.gB[i*N:(i+1)*N], r[bo:bo+N])
		copy(w.gC[i*N:(i+1)*N], r[co:co+N])
		v := a.dtRaw[int(t)*MH+h] + a.dtBias[h]
		sp := F(kernels.Softplus(float64(v)))
		dt := min(max(sp, lo), hi)
		w.raw[i], w.sp[i], w.dt[i] = v, sp, dt
		acc += dt * A
		w.lam[i] = acc
	}
}

// chunkOutput writes gy (l,MP) for a gathered chunk from its start state
// s0 (nil: zero).
func chunkOutput[F Float](a *ssmArgs[F], w *ssmWork[F], h, l int, s0 []F) {
	P, N := a.s.MP, a.s.DS
	X, Bm, Cm, Y := w.gx[:l*P], w.gB[:l*N], w.gC[:l*N], w.gy[:l*P]
	lam, dt := w.lam[:l], w.dt[:l]
	// Intra-chunk: M = (C·Bᵀ) ⊙ L ⊙ dt_j, Y = M·X.
	G, M := w.G[:l*l], w.M[:l*l]
	gemm(w.ws, false, true, l, l, N, Cm, N, Bm, N, G, l, false)
	for i := range l {
		for j := range l {
			if j <= i {
				M[i*l+j] = G[i*l+j] * expF(lam[i]-lam[j]) * dt[j]
			} else {
				M[i*l+j] = 0
			}
		}
	}
	gemm(w.ws, false, false, l, P, l, M, l, X, P, Y, P, false)
	// Inter-chunk and the skip: Y += exp(Λ_i)·(C·S0ᵀ) + D·X.
	dh := a.d[h]
	if s0 != nil {
		tmp := w.tmpP[:l*P]
		gemm(w.ws, false, true, l, P, N, Cm, N, s0, N, tmp, P, false)
		for i := range l {
			e := expF(lam[i])
			for p := range P {
				Y[i*P+p] += e*tmp[i*P+p] + dh*X[i*P+p]
			}
		}
		return
	}
	for i := range l {
		for p := range P {
			Y[i*P+p] += dh * X[i*P+p]
		}
	}
}

// chunkEndState writes the state after a gathered chunk into s1 from s0 at
// its start (nil: zero): S1 = exp(Λ_last)·S0 + Xᵀ·diag(w)·B.
func chunkEndState[F Float](w *ssmWork[F], P, N, l int, s0, s1 []F) {
	X, Bm := w.gx[:l*P], w.gB[:l*N]
	lam, dt := w.lam[:l], w.dt[:l]
	last := lam[l-1]
	bw := w.bw[:l*N]
	for j := range l {
		wj := expF(last-lam[j]) * dt[j]
		for n := range N {
			bw[j*N+n] = wj * Bm[j*N+n]
		}
	}
	if s0 != nil {
		e := expF(last)
		for i := range s1 {
			s1[i] = e * s0[i]
		}
		gemm(w.ws, true, false, P, N, l, X, P, bw, N, s1, N, true)
		return
	}
	gemm(w.ws, true, false, P, N, l, X, P, bw, N, s1, N, false)
}

// segmentForward runs segment seg of head h from init, the state at the
// boundary ⌊A/L⌋·L before its first token (nil: zero). It writes y at its
// own tokens (unless a.y is nil), its final state into out (unless nil),
// its Sb (the state at the last boundary at or before its end) into sb
// (unless nil: init when no boundary lies inside), and, with chunks
// non-nil, each chunk's start state (zeros for a zero one).
func segmentForward[F Float](a *ssmArgs[F], w *ssmWork[F], h, seg int, A F, init, out, sb, chunks []F) {
	s := a.s
	L, P, N, MHP := s.Chunk, s.MP, s.DS, s.DI()
	PN := P * N
	start := int(a.anc[seg])
	E := start + int(a.offs[seg+1]-a.offs[seg])
	cur := init
	wroteSb := false
	for c, cb := 0, start/L*L; cb < E; c, cb = c+1, cb+L {
		l, own := chunkRows(a, w, seg, cb)
		gather(a, w, h, l, A)
		if chunks != nil {
			if cur == nil {
				clear(chunks[c*PN : (c+1)*PN])
			} else {
				copy(chunks[c*PN:(c+1)*PN], cur)
			}
		}
		if a.y != nil {
			chunkOutput(a, w, h, l, cur)
			for i := own; i < l; i++ {
				copy(a.y[int(w.rows[i])*MHP+h*P:][:P], w.gy[i*P:(i+1)*P])
			}
		}
		onBoundary := cb+l == cb+L // the chunk ends on a boundary
		if !onBoundary && out == nil {
			break // the state inside the last chunk is wanted by no one
		}
		next := w.s1
		if onBoundary && sb != nil && cb+L+L > E { // the last boundary at or before the end
			next = sb
			wroteSb = true
		} else if !onBoundary {
			next = out
		}
		chunkEndState(w, P, N, l, cur, next)
		if onBoundary && cb+L == E && out != nil {
			copy(out, next)
		}
		if onBoundary {
			if &next[0] == &w.s1[0] {
				copy(w.last, w.s1)
				cur = w.last
			} else {
				cur = next
			}
		}
	}
	if sb != nil && !wroteSb {
		if init == nil {
			clear(sb)
		} else {
			copy(sb, init)
		}
	}
}

// headForward runs head h over the whole tree, in preorder, the open
// path's Sb on a stack.
func headForward[F Float](a *ssmArgs[F], w *ssmWork[F], h int) {
	PN := a.s.MP * a.s.DS
	A := -F(math.Exp(float64(a.aLog[h])))
	w.path = w.path[:0]
	w.stack = w.stack[:0]
	for seg := range len(a.parent) {
		p := a.parent[seg]
		for len(w.path) > 0 && w.path[len(w.path)-1] != p {
			w.path = w.path[:len(w.path)-1]
			w.stack = w.stack[:len(w.path)*PN]
		}
		var init []F
		if p >= 0 && len(w.path) > 0 && a.anc[seg] >= int32(a.s.Chunk) {
			init = w.stack[(len(w.path)-1)*PN : len(w.path)*PN]
		}
		var sb []F
		if a.ends[seg] > a.offs[seg+1] { // it has children: keep its Sb on the path
			n := len(w.path) * PN
			w.stack = grow(w.stack, n+PN)
			if init != nil {
				init = w.stack[n-PN : n] // grow may have moved the stack
			}
			sb = w.stack[n : n+PN]
			w.path = append(w.path, int32(seg))
		}
		var out []F
		if a.final != nil {
			out = a.final[(seg*a.s.MH+h)*PN : (seg*a.s.MH+h+1)*PN]
		}
		segmentForward(a, w, h, seg, A, init, out, sb, nil)
	}
}

// headBackward runs head h's backward over the whole tree: every
// segment's Sb first (preorder), then the segments in reverse preorder,
// each one's chunk states recomputed, its chunks run backwards.
func headBackward[F Float](a *ssmArgs[F], w *ssmWork[F], h int) {
	s := a.s
	L, P, N, NS := s.Chunk, s.MP, s.DS, len(a.parent)
	PN, CD, MH := P*N, s.CD(), s.MH
	A := -F(math.Exp(float64(a.aLog[h])))
	// Head h's gradients are accumulated: clear them first.
	for t := range a.T {
		clear(a.dxbc[t*CD+h*P : t*CD+(h+1)*P])
		clear(a.dBC[(t*MH+h)*2*N : (t*MH+h+1)*2*N])
		a.ddtRaw[t*MH+h] = 0
	}
	w.slot = w.slot[:0]
	nb := 0
	for seg := range NS {
		if a.ends[seg] > a.offs[seg+1] {
			w.slot = append(w.slot, int32(nb))
			nb++
		} else {
			w.slot = append(w.slot, -1)
		}
	}
	w.sb, w.dsb = grow(w.sb, nb*PN), grow(w.dsb, nb*PN)
	clear(w.dsb)
	view := func(buf []F, seg int32) []F {
		if seg < 0 || w.slot[seg] < 0 {
			return nil
		}
		k := int(w.slot[seg])
		return buf[k*PN : (k+1)*PN]
	}
	initOf := func(seg int) []F {
		if a.anc[seg] < int32(L) {
			return nil // the boundary at position 0: a zero state
		}
		return view(w.sb, a.parent[seg])
	}
	y := a.y
	a.y = nil // states only
	for seg := range NS {
		if sb := view(w.sb, int32(seg)); sb != nil {
			segmentForward(a, w, h, seg, A, initOf(seg), nil, sb, nil)
		}
	}
	var dA, dD, dBias F
	for seg := NS - 1; seg >= 0; seg-- {
		start := int(a.anc[seg])
		E := start + int(a.offs[seg+1]-a.offs[seg])
		B0 := start / L * L
		nc := (E - B0 + L - 1) / L
		init := initOf(seg)
		w.chunks = grow(w.chunks, nc*PN)
		segmentForward(a, w, h, seg, A, init, nil, nil, w.chunks)
		dsb := view(w.dsb, int32(seg)) // the gradient of Sb, the state at boundary sbAt
		sbAt := E / L * L
		var carried []F // the gradient of the state at the current chunk's end
		for c := nc - 1; c >= 0; c-- {
			cb := B0 + c*L
			end := min(cb+L, E)
			dS1 := carried
			if end == sbAt && dsb != nil {
				if dS1 == nil {
					copy(w.ds1, dsb)
				} else {
					for i, v := range dsb {
						w.ds1[i] += v
					}
				}
				dS1 = w.ds1
			}
			s0 := w.chunks[c*PN : (c+1)*PN]
			if c == 0 && init == nil {
				s0 = nil
			}
			da, dd, db := chunkBackward(a, w, h, seg, cb, A, s0, dS1)
			dA, dD, dBias = dA+da, dD+dd, dBias+db
			copy(w.ds1, w.ds0)
			carried = w.ds1
		}
		if B0 == sbAt && dsb != nil { // no boundary inside: Sb is the state the segment starts from
			for i, v := range dsb {
				carried[i] += v
			}
		}
		// carried is the gradient of the boundary state before the first
		// chunk: the parent's Sb (or the zero state at position 0).
		if d := view(w.dsb, a.parent[seg]); d != nil && init != nil {
			for i, v := range carried {
				d[i] += v
			}
		}
	}
	a.y = y
	a.ddtBias[h] += dBias
	a.daLog[h] += dA * A // A = −exp(aLog): ∂A/∂aLog = A
	a.dd[h] += dD
}

// chunkBackward runs the backward of the chunk of segment seg that starts
// at context position cb, of head h, from its start state s0 (nil: zero)
// and the gradient dS1 of its end state (nil: zero): it adds the chunk's
// gradients to dxbc's x columns of head h, to the head's dB and dC in dBC
// and to ddtRaw at the chunk's rows, writes the gradient of s0 into w.ds0,
// and returns the chunk's terms of ∂L/∂A, ∂L/∂D and ∂L/∂dtBias.
func chunkBackward[F Float](a *ssmArgs[F], w *ssmWork[F], h, seg, cb int, A F, s0, dS1 []F) (dA, dD, dBias F) {
	s := a.s
	P, N, CD, MH := s.MP, s.DS, s.CD(), s.MH
	MHP := MH * P
	l, own := chunkRows(a, w, seg, cb)
	gather(a, w, h, l, A)
	X, Bm, Cm := w.gx[:l*P], w.gB[:l*N], w.gC[:l*N]
	dY, dX, dB, dC := w.gdy[:l*P], w.gdx[:l*P], w.gdB[:l*N], w.gdC[:l*N]
	clear(dY[:own*P]) // the ancestors' rows: their outputs are theirs
	for i := own; i < l; i++ {
		copy(dY[i*P:(i+1)*P], a.dy[int(w.rows[i])*MHP+h*P:][:P])
	}
	lam, dt, ddt, dl := w.lam[:l], w.dt[:l], w.ddt[:l], w.dl[:l]
	clear(ddt)
	clear(dl)
	last := lam[l-1]
	// Intra-chunk: M = G ⊙ L ⊙ dt_j with G = C·Bᵀ, dM = dY·Xᵀ; dG = dM ⊙ L ⊙ dt_j.
	G, M, dM := w.G[:l*l], w.M[:l*l], w.dM[:l*l]
	gemm(w.ws, false, true, l, l, N, Cm, N, Bm, N, G, l, false)
	gemm(w.ws, false, true, l, l, P, dY, P, X, P, dM, l, false)
	for i := range l {
		for j := range l {
			k := i*l + j
			if j > i {
				M[k], dM[k] = 0, 0
				continue
			}
			e := expF(lam[i] - lam[j])
			m := G[k] * e * dt[j]
			r := dM[k] * m
			ddt[j] += dM[k] * G[k] * e
			dl[i] += r
			dl[j] -= r
			M[k] = m
			dM[k] *= e * dt[j] // dG
		}
	}
	// dX = Mᵀ·dY + D·dY (+ the end state's term below); dD = Σ dY·X.
	gemm(w.ws, true, false, l, P, l, M, l, dY, P, dX, P, false)
	dh := a.d[h]
	for i := range l {
		for p := range P {
			dX[i*P+p] += dh * dY[i*P+p]
			dD += dY[i*P+p] * X[i*P+p]
		}
	}
	// dC = dG·B (+ exp(Λ_i)·dY·S0), dB = dGᵀ·C (+ the end state's term).
	gemm(w.ws, false, false, l, N, l, dM, l, Bm, N, dC, N, false)
	gemm(w.ws, true, false, l, N, l, dM, l, Cm, N, dB, N, false)
	if s0 != nil {
		tmpN, tmpP := w.tmpN[:l*N], w.tmpP[:l*P]
		gemm(w.ws, false, false, l, N, P, dY, P, s0, N, tmpN, N, false)
		gemm(w.ws, false, true, l, P, N, Cm, N, s0, N, tmpP, P, false)
		for i := range l {
			e := expF(lam[i])
			for n := range N {
				dC[i*N+n] += e * tmpN[i*N+n]
			}
			var dot F
			for p := range P {
				dot += dY[i*P+p] * tmpP[i*P+p]
			}
			dl[i] += e * dot
		}
	}
	if dS1 != nil {
		// S1 = exp(Λ_last)·S0 + Σ_j exp(Λ_last − Λ_j)·dt_j·x_j ⊗ B_j.
		xs, bs := w.tmpN2[:l*N], w.tmpP2[:l*P]
		gemm(w.ws, false, false, l, N, P, X, P, dS1, N, xs, N, false) // X·dS1
		gemm(w.ws, false, true, l, P, N, Bm, N, dS1, N, bs, P, false) // B·dS1ᵀ
		for j := range l {
			e := expF(last - lam[j])
			wj := e * dt[j]
			var q F
			for n := range N {
				q += xs[j*N+n] * Bm[j*N+n]
				dB[j*N+n] += wj * xs[j*N+n]
			}
			for p := range P {
				dX[j*P+p] += wj * bs[j*P+p]
			}
			ddt[j] += e * q
			v := wj * q
			dl[l-1] += v
			dl[j] -= v
		}
		if s0 != nil {
			var dot F
			for i, v := range dS1 {
				dot += v * s0[i]
			}
			dl[l-1] += expF(last) * dot
		}
	}
	// dS0 = exp(Λ_last)·dS1 + dYᵀ·diag(exp Λ)·C.
	ce := w.bw[:l*N]
	for i := range l {
		e := expF(lam[i])
		for n := range N {
			ce[i*N+n] = e * Cm[i*N+n]
		}
	}
	ds0 := w.ds0
	if dS1 != nil {
		e := expF(last)
		for i, v := range dS1 {
			ds0[i] = e * v
		}
		gemm(w.ws, true, false, P, N, l, dY, P, ce, N, ds0, N, true)
	} else {
		gemm(w.ws, true, false, P, N, l, dY, P, ce, N, ds0, N, false)
	}
	// Λ = cumsum(dt·A): da_j = Σ_{i≥j} dΛ_i; then through the clamp and the
	// softplus to dtRaw. Scatter the rows' gradients.
	var da F
	lo, hi := F(s.DtMin), F(s.DtMax)
	for j := l - 1; j >= 0; j-- {
		da += dl[j]
		dA += da * dt[j]
		gr := ddt[j] + da*A
		if sp := w.sp[j]; sp < lo || sp > hi {
			gr = 0
		} else if v := w.raw[j]; v <= 20 {
			gr *= 1 / (1 + expF(-v))
		}
		t := int(w.rows[j])
		a.ddtRaw[t*MH+h] += gr
		dBias += gr
	}
	for i := range l {
		t := int(w.rows[i])
		dx := a.dxbc[t*CD+h*P:][:P]
		for p, v := range dX[i*P : (i+1)*P] {
			dx[p] += v
		}
		bc := a.dBC[(t*MH+h)*2*N:][:2*N]
		for n := range N {
			bc[n] += dB[i*N+n]
			bc[N+n] += dC[i*N+n]
		}
	}
	return dA, dD, dBias
}

// sumGroupBC writes dxbc's B and C columns of tokens [lo, hi): each
// group's dB, dC summed over its heads in head order from dBC.
func sumGroupBC[F Float](a *ssmArgs[F], lo, hi int) {
	s := a.s
	N, CD, MH, G := s.DS, s.CD(), s.MH, s.G
	hg := MH / G
	for t := lo; t < hi; t++ {
		for g := range G {
			dB := a.dxbc[t*CD+s.DI()+g*N : t*CD+s.DI()+(g+1)*N]
			dC := a.dxbc[t*CD+s.DI()+(G+g)*N : t*CD+s.DI()+(G+g+1)*N]
			for k := range hg {
				h := g*hg + k
				src := a.dBC[(t*MH+h)*2*N : (t*MH+h+1)*2*N]
				if k == 0 {
					copy(dB, src[:N])
					copy(dC, src[N:])
					continue
				}
				for n := range N {
					dB[n] += src[n]
					dC[n] += src[N+n]
				}
			}
		}
	}
}

// ssmDecode runs one token of every sequence r < B: state (B,MH,MP,DS) in
// place, y (B,MH,MP) from xbc (B,CD) and dtRaw (B,MH).
func ssmDecode[F Float](y, state, xbc, dtRaw, dtBias, aLog, d []F, B int, s kernels.Scan) {
	P, N, CD, MH := s.MP, s.DS, s.CD(), s.MH
	lo, hi := F(s.DtMin), F(s.DtMax)
	for r := range B {
		for h := range MH {
			g := h / (MH / s.G)
			A := -F(math.Exp(float64(aLog[h])))
			dt := min(max(F(kernels.Softplus(float64(dtRaw[r*MH+h]+dtBias[h]))), lo), hi)
			e := expF(dt * A)
			x := xbc[r*CD+h*P : r*CD+(h+1)*P]
			Bv := xbc[r*CD+s.DI()+g*N : r*CD+s.DI()+(g+1)*N]
			Cv := xbc[r*CD+s.DI()+(s.G+g)*N : r*CD+s.DI()+(s.G+g+1)*N]
			st := state[(r*MH+h)*P*N : (r*MH+h+1)*P*N]
			for p := range P {
				row := st[p*N : (p+1)*N]
				var acc F
				for n := range N {
					row[n] = e*row[n] + dt*x[p]*Bv[n]
					acc += row[n] * Cv[n]
				}
				y[(r*MH+h)*P+p] = acc + d[h]*x[p]
			}
		}
	}
}

type ssmTask struct {
	a     ssmArgs[float32]
	work  []*ssmWork[float32]
	phase int // 0 forward, 1 backward by head, 2 the groups' dB, dC
}

func (t *ssmTask) run(w, lo, hi int) {
	switch t.phase {
	case 0:
		for h := lo; h < hi; h++ {
			headForward(&t.a, t.work[w], h)
		}
	case 1:
		a := t.a // each worker its own copy: headBackward sets a.y
		for h := lo; h < hi; h++ {
			headBackward(&a, t.work[w], h)
		}
	case 2:
		sumGroupBC(&t.a, lo, hi)
	}
}

func checkScan(op string, T int, s kernels.Scan) {
	if T < 0 || s.MH <= 0 || s.MP <= 0 || s.G <= 0 || s.DS <= 0 || s.Chunk <= 0 || s.MH%s.G != 0 ||
		!(s.DtMin >= 0) || !(s.DtMax >= s.DtMin) {
		panic(fmt.Sprintf("cpu: %s: T=%d %+v (want positive sizes, G dividing MH, 0 ≤ DtMin ≤ DtMax)", op, T, s))
	}
}

// ssmSetup checks the tree and readies the task and each worker's scratch.
func (b *Backend) ssmSetup(op string, tree kernels.Tree, T int, s kernels.Scan) (*ssmTask, bool) {
	checkScan(op, T, s)
	offs, parent, ends, anc, ok := b.checkTree(op, tree, T)
	if !ok {
		return nil, false
	}
	t := &b.tasks.ssm
	if len(b.ssmWork) != b.threads || b.ssmShape != s {
		b.ssmWork = make([]*ssmWork[float32], b.threads)
		for i := range b.ssmWork {
			b.ssmWork[i] = newSSMWork[float32](&b.scratch.w[i], s)
		}
		b.ssmShape = s
	}
	*t = ssmTask{work: b.ssmWork, a: ssmArgs[float32]{offs: offs, parent: parent, ends: ends, anc: anc, T: T, s: s}}
	return t, true
}

// SSMScan implements kernels.Mamba.
// Shapes: y (T,MH,MP); final (NS,MH,MP,DS) or empty; xbc (T,CD) F32|BF16; dtRaw (T,MH); dtBias, aLog, d (MH).
func (b *Backend) SSMScan(y, final, xbc, dtRaw, dtBias, aLog, d kernels.Buf, tree kernels.Tree, T int, s kernels.Scan) {
	t, ok := b.ssmSetup("SSMScan", tree, T, s)
	if !ok {
		return
	}
	a := &t.a
	a.y = b.f32n(y, T*s.DI(), "SSMScan y")
	a.xbc = b.in(xbc, T*s.CD(), "SSMScan xbc")
	a.dtRaw = b.f32n(dtRaw, T*s.MH, "SSMScan dtRaw")
	a.dtBias, a.aLog, a.d = b.f32n(dtBias, s.MH, "SSMScan dtBias"), b.f32n(aLog, s.MH, "SSMScan aLog"), b.f32n(d, s.MH, "SSMScan d")
	if final.N > 0 {
		a.final = b.f32n(final, tree.NS*s.DI()*s.DS, "SSMScan final")
	}
	b.pool.parallel(t, s.MH, 1)
	*t = ssmTask{}
}

// SSMScanBackward implements kernels.Mamba.
// Shapes: dxbc (T,CD), ddtRaw (T,MH), ddtBias, daLog, dd (MH), dy (T,MH,MP), xbc (T,CD) F32|BF16, dtRaw (T,MH), dtBias, aLog, d (MH).
func (b *Backend) SSMScanBackward(dxbc, ddtRaw, ddtBias, daLog, dd, dy, xbc, dtRaw, dtBias, aLog, d kernels.Buf, tree kernels.Tree, T int, s kernels.Scan) {
	t, ok := b.ssmSetup("SSMScanBackward", tree, T, s)
	if !ok {
		return
	}
	a := &t.a
	a.dxbc = b.f32n(dxbc, T*s.CD(), "SSMScanBackward dxbc")
	a.ddtRaw = b.f32n(ddtRaw, T*s.MH, "SSMScanBackward ddtRaw")
	a.ddtBias = b.f32n(ddtBias, s.MH, "SSMScanBackward ddtBias")
	a.daLog, a.dd = b.f32n(daLog, s.MH, "SSMScanBackward daLog"), b.f32n(dd, s.MH, "SSMScanBackward dd")
	a.dy = b.f32n(dy, T*s.DI(), "SSMScanBackward dy")
	a.xbc = b.in(xbc, T*s.CD(), "SSMScanBackward xbc")
	a.dtRaw = b.f32n(dtRaw, T*s.MH, "SSMScanBackward dtRaw")
	a.dtBias, a.aLog, a.d = b.f32n(dtBias, s.MH, "SSMScanBackward dtBias"), b.f32n(aLog, s.MH, "SSMScanBackward aLog"), b.f32n(d, s.MH, "SSMScanBackward d")
	if cap(b.ssmBC) < T*s.MH*2*s.DS {
		b.ssmBC = make([]float32, T*s.MH*2*s.DS)
	}
	a.dBC = b.ssmBC[:T*s.MH*2*s.DS]
	t.phase = 1
	b.pool.parallel(t, s.MH, 1)
	t.phase = 2
	b.pool.parallel(t, T, convRowGrain)
	*t = ssmTask{}
}

// SSMDecode implements kernels.Mamba.
// Shapes: y (B,MH,MP), state (B,MH,MP,DS), xbc (B,CD) F32|BF16, dtRaw (B,MH), dtBias, aLog, d (MH).
func (b *Backend) SSMDecode(y, state, xbc, dtRaw, dtBias, aLog, d kernels.Buf, B int, s kernels.Scan) {
	checkScan("SSMDecode", B, s)
	ssmDecode(b.f32n(y, B*s.DI(), "SSMDecode y"), b.f32n(state, B*s.DI()*s.DS, "SSMDecode state"),
		b.in(xbc, B*s.CD(), "SSMDecode xbc"), b.f32n(dtRaw, B*s.MH, "SSMDecode dtRaw"),
		b.f32n(dtBias, s.MH, "SSMDecode dtBias"), b.f32n(aLog, s.MH, "SSMDecode aLog"), b.f32n(d, s.MH, "SSMDecode d"), B, s)
}

var _ kernels.Mamba = (*Backend)(nil)
