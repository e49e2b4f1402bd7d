package cpu

// SSMScan: the Mamba-2 selective scan as the chunked SSD algorithm
// (kernels.Mamba), over a packed tree. For one head h (group g), with
// a_t = dt_t·A (A = −exp(aLog) < 0, so every decay below is ≤ 1):
//
//	S_t = exp(a_t)·S_{t−1} + dt_t·x_t ⊗ B_t          (MP,DS)
//	y_t = S_t·C_t + D·x_t                                                 =
//
// Each segment is cut into chunks of s.Chunk tokens from its start (the
// last shorter); in a chunk of l tokens with Λ_i = Σ_{j≤i} a_j, state S0 at
// its start:
//
//	intra:   Y  = (G ⊙ L ⊙ dt_j) · X,  G = C·Bᵀ (l,l), L_ij = exp(Λ_i − Λ_j), j ≤ i
//	inter:   Y += diag(exp Λ) · C · S0ᵀ,   then Y += D·X
//	state:   S1 = exp(Λ_last)·S0 + Xᵀ · diag(w)·B,  w_j = exp(Λ_last − Λ_j)·dt_j
//
// and S1 starts the next chunk, or, at a segment's end, every child of the
// segment. The backward runs the chunks in reverse with the state's gradient
// dS (dS0 = Yᵀ-side terms + exp(Λ_last)·dS1): the gradients of X, B, C, dt
// through the same matmuls, and of Λ through the decays (dΛ, reverse-summed
// into da_j, then ddt_j += da_j·A and dA += da_j·dt_j). At a branch point
// the parent's final-state gradient sums its children's dS0.
//
// Work splits by head: each head walks the tree's segments in preorder
// (the forward keeps the open path's final states on a stack; the backward
// first stores the final state of each segment with children, then walks
// segments in reverse preorder, recomputing each one's chunk states). A head
// owns its columns of y, dxbc's x, ddtRaw and its ddtBias, daLog, dd; B and
// C are shared by the heads of a group, so each head writes its dB, dC into
// a (T,MH,2,DS) scratch that a second pass sums over the group's heads in
// head order. Every sum runs in an order fixed by the shapes and the tree:
// deterministic and thread-count invariant. The float64 instantiation (the
// tests) is checked against the sequential recurrence and finite
// differences.

import (
	"fmt"
	"math"

	"github.com/tracegrpo/tracegrpo/kernels"
)

// ssmArgs are one scan's buffers, in F.
type ssmArgs[F Float] struct {
	xbc, dtRaw, dtBias, aLog, d []F // (T,CD), (T,MH), (MH), (MH), (MH)
	y, final                    []F // (T,MH,MP), (NS,MH,MP,DS) or nil
	// backward
	dy, dxbc, ddtRaw, ddtBias, daLog, dd []F
	dBC                                  []F // (T,MH,2,DS) per-head dB, dC
	offs, parent, ends                   []int32
	T                                    int
	s                                    kernels.Scan
}

// ssmWork is one worker's scratch for one head, in F: the chunk's decay
// and time-step vectors, its l×l matrices, l×MP and l×DS temporaries, the
// state pair, and the stacks of states (the forward's open path, the
// backward's per-segment final states and their gradients, a segment's
// chunk states).
type ssmWork[F Float] struct {
	ws                   *wscratch
	dt, lam, sp, ddt, dl []F // (L) each
	raw                  []F // (L) dtRaw + dtBias
	G, M, dM             []F // (L,L)
	tmpP, tmpP2          []F // (L,MP)
	tmpN, tmpN2, bw      []F // (L,DS)
	s0, s1, ds0, ds1     []F // (MP,DS)
	leaf                 []F // (MP,DS) a leaf segment's final state
	stack                []F // forward: open path's states; backward: chunk states
	fin, dfin            []F // backward: (segments with children) final states and their gradients
	slot                 []int32
}

func newSSMWork[F Float](ws *wscratch, s kernels.Scan) *ssmWork[F] {
	L, P, N := s.Chunk, s.MP, s.DS
	w := &ssmWork[F]{ws: ws}
	w.dt, w.lam, w.sp, w.ddt, w.dl, w.raw = make([]F, L), make([]F, L), make([]F, L), make([]F, L), make([]F, L), make([]F, L)
	w.G, w.M, w.dM = make([]F, L*L), make([]F, L*L), make([]F, L*L)
	w.tmpP, w.tmpP2 = make([]F, L*P), make([]F, L*P)
	w.tmpN, w.tmpN2, w.bw = make([]F, L*N), make([]F, L*N), make([]F, L*N)
	w.s0, w.s1, w.ds0, w.ds1, w.leaf = make([]F, P*N), make([]F, P*N), make([]F, P*N), make([]F, P*N), make([]F, P*N)
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

// chunkDt fills w.raw, w.sp, w.dt and w.lam for the l tokens from t0 of
// head h: raw = dtRaw + dtBias, sp = Softplus(raw), dt = clamp(sp), lam the
// cumulative sum of dt·A.
func chunkDt[F Float](a *ssmArgs[F], w *ssmWork[F], h, t0, l int, A F) {
	MH := a.s.MH
	lo, hi := F(a.s.DtMin), F(a.s.DtMax)
	var acc F
	for i := range l {
		v := a.dtRaw[(t0+i)*MH+h] + a.dtBias[h]
		sp := F(kernels.Softplus(float64(v)))
		dt := min(max(sp, lo), hi)
		w.raw[i], w.sp[i], w.dt[i] = v, sp, dt
		acc += dt * A
		w.lam[i] = acc
	}
}

// chunkForward runs one chunk of head h: y for tokens [t0, t0+l) from the
// state s0 (nil: zero), and the chunk's end state into s1.
func chunkForward[F Float](a *ssmArgs[F], w *ssmWork[F], h, t0, l int, A F, s0, s1 []F) {
	chunkDt(a, w, h, t0, l, A)
	if a.y != nil {
		chunkOutput(a, w, h, t0, l, s0)
	}
	chunkEndState(a, w, h, t0, l, s0, s1)
}

// chunkOutput writes y for the l tokens from t0 of head h (chunkDt done).
func chunkOutput[F Float](a *ssmArgs[F], w *ssmWork[F], h, t0, l int, s0 []F) {
	s := a.s
	P, N, CD, MHP := s.MP, s.DS, s.CD(), s.MH*s.MP
	g := h / (s.MH / s.G)
	X := a.xbc[t0*CD+h*P:]
	Bm := a.xbc[t0*CD+s.DI()+g*N:]
	Cm := a.xbc[t0*CD+s.DI()+s.G*N+g*N:]
	Y := a.y[t0*MHP+h*P:]
	lam, dt := w.lam[:l], w.dt[:l]
	// Intra-chunk: M = (C·Bᵀ) ⊙ L ⊙ dt_j, Y = M·X.
	G := w.G[:l*l]
	gemm(w.ws, false, true, l, l, N, Cm, CD, Bm, CD, G, l, false)
	M := w.M[:l*l]
	for i := range l {
		for j := range l {
			if j <= i {
				M[i*l+j] = G[i*l+j] * expF(lam[i]-lam[j]) * dt[j]
			} else {
				M[i*l+j] = 0
			}
		}
	}
	gemm(w.ws, false, false, l, P, l, M, l, X, CD, Y, MHP, false)
	// Inter-chunk and the skip: Y += exp(Λ_i)·(C·S0ᵀ) + D·X.
	dh := a.d[h]
	if s0 != nil {
		tmp := w.tmpP[:l*P]
		gemm(w.ws, false, true, l, P, N, Cm, CD, s0, N, tmp, P, false)
		for i := range l {
			e := expF(lam[i])
			for p := range P {
				Y[i*MHP+p] += e*tmp[i*P+p] + dh*X[i*CD+p]
			}
		}
	} else {
		for i := range l {
			for p := range P {
				Y[i*MHP+p] += dh * X[i*CD+p]
			}
		}
	}
}

// chunkEndState writes the state after the l tokens from t0 of head h into
// s1, from s0 at their start (nil: zero; chunkDt done): S1 = exp(Λ_last)·S0
// + Xᵀ·diag(w)·B.
func chunkEndState[F Float](a *ssmArgs[F], w *ssmWork[F], h, t0, l int, s0, s1 []F) {
	s := a.s
	P, N, CD := s.MP, s.DS, s.CD()
	g := h / (s.MH / s.G)
	X := a.xbc[t0*CD+h*P:]
	Bm := a.xbc[t0*CD+s.DI()+g*N:]
	lam, dt := w.lam[:l], w.dt[:l]
	last := lam[l-1]
	bw := w.bw[:l*N]
	for j := range l {
		wj := expF(last-lam[j]) * dt[j]
		for n := range N {
			bw[j*N+n] = wj * Bm[j*CD+n]
		}
	}
	if s0 != nil {
		e := expF(last)
		for i := range s1 {
			s1[i] = e * s0[i]
		}
		gemm(w.ws, true, false, P, N, l, X, CD, bw, N, s1, N, true)
	} else {
		gemm(w.ws, true, false, P, N, l, X, CD, bw, N, s1, N, false)
	}
}

// segmentForward runs segment seg of head h from state init (nil: zero)
// and leaves its final state in out (MP·DS). With chunks non-nil it also
// stores each chunk's start state there (nil for the first chunk of a
// root: chunks[0] is then zeros).
func segmentForward[F Float](a *ssmArgs[F], w *ssmWork[F], h, seg int, A F, init, out, chunks []F) {
	L, PN := a.s.Chunk, a.s.MP*a.s.DS
	lo, hi := int(a.offs[seg]), int(a.offs[seg+1])
	cur := init
	for c, t0 := 0, lo; t0 < hi; c, t0 = c+1, t0+L {
		l := min(L, hi-t0)
		if chunks != nil {
			if cur == nil {
				clear(chunks[c*PN : (c+1)*PN])
			} else {
				copy(chunks[c*PN:(c+1)*PN], cur)
			}
		}
		next := w.s1
		if t0+l >= hi {
			next = out
		}
		chunkForward(a, w, h, t0, l, A, cur, next)
		if t0+l < hi {
			copy(w.s0, w.s1)
			cur = w.s0
		}
	}
}

// headForward runs head h over the whole tree (preorder, the open path's
// final states on a stack).
func headForward[F Float](a *ssmArgs[F], w *ssmWork[F], h int) {
	PN := a.s.MP * a.s.DS
	A := -F(math.Exp(float64(a.aLog[h])))
	var path []int32 // segments on the stack
	w.stack = w.stack[:0]
	for seg := range len(a.parent) {
		p := a.parent[seg]
		for len(path) > 0 && path[len(path)-1] != p {
			path = path[:len(path)-1]
			w.stack = w.stack[:len(path)*PN]
		}
		var init []F
		if p >= 0 && len(path) > 0 {
			init = w.stack[(len(path)-1)*PN : len(path)*PN]
		}
		out := w.leaf                    // a leaf's final state: copied out, or not needed
		if a.ends[seg] > a.offs[seg+1] { // it has children: keep it on the path
			n := len(path) * PN
			w.stack = grow(w.stack, n+PN)
			if init != nil {
				init = w.stack[n-PN : n] // grow may have moved the stack
			}
			out = w.stack[n : n+PN]
			path = append(path, int32(seg))
		}
		segmentForward(a, w, h, seg, A, init, out, nil)
		if a.final != nil {
			copy(a.final[(seg*a.s.MH+h)*PN:(seg*a.s.MH+h+1)*PN], out)
		}
	}
}

// headBackward runs head h's backward over the whole tree: the final
// states of the segments with children first (preorder), then every
// segment in reverse preorder, its chunks recomputed then run backwards.
func headBackward[F Float](a *ssmArgs[F], w *ssmWork[F], h int) {
	s := a.s
	L, PN, NS := s.Chunk, s.MP*s.DS, len(a.parent)
	A := -F(math.Exp(float64(a.aLog[h])))
	// Slots of the segments with children.
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
	w.fin, w.dfin = grow(w.fin, nb*PN), grow(w.dfin, nb*PN)
	clear(w.dfin)
	view := func(buf []F, seg int32) []F {
		if seg < 0 || w.slot[seg] < 0 {
			return nil
		}
		k := int(w.slot[seg])
		return buf[k*PN : (k+1)*PN]
	}
	y := a.y
	a.y = nil // states only
	for seg := range NS {
		if out := view(w.fin, int32(seg)); out != nil {
			segmentForward(a, w, h, seg, A, view(w.fin, a.parent[seg]), out, nil)
		}
	}
	a.y = y
	var dA, dD, dBias F
	for seg := NS - 1; seg >= 0; seg-- {
		lo, hi := int(a.offs[seg]), int(a.offs[seg+1])
		nc := (hi - lo + L - 1) / L
		init := view(w.fin, a.parent[seg])
		w.stack = grow(w.stack, nc*PN)
		a.y = nil
		segmentForward(a, w, h, seg, A, init, w.leaf, w.stack)
		a.y = y
		var dS1 []F
		if d := view(w.dfin, int32(seg)); d != nil {
			copy(w.ds1, d)
			dS1 = w.ds1
		}
		for c := nc - 1; c >= 0; c-- {
			t0 := lo + c*L
			l := min(L, hi-t0)
			s0 := w.stack[c*PN : (c+1)*PN]
			if c == 0 && init == nil {
				s0 = nil
			}
			da, dd, db := chunkBackward(a, w, h, t0, l, A, s0, dS1, w.ds0)
			dA, dD, dBias = dA+da, dD+dd, dBias+db
			copy(w.ds1, w.ds0)
			dS1 = w.ds1
		}
		if d := view(w.dfin, a.parent[seg]); d != nil {
			for i, v := range w.ds0 {
				d[i] += v
			}
		}
	}
	a.ddtBias[h] += dBias
	a.daLog[h] += dA * A // A = −exp(aLog): ∂A/∂aLog = A
	a.dd[h] += dD
}

// chunkBackward runs the backward of the l tokens from t0 of head h, from
// their start state s0 (nil: zero) and the gradient dS1 of their end state
// (nil: zero): it writes dxbc's x columns of head h, the head's dB and dC
// into dBC and ddtRaw for these tokens, the gradient of s0 into ds0, and
// returns the chunk's terms of ∂L/∂A, ∂L/∂D and ∂L/∂dtBias.
func chunkBackward[F Float](a *ssmArgs[F], w *ssmWork[F], h, t0, l int, A F, s0, dS1, ds0 []F) (dA, dD, dBias F) {
	s := a.s
	P, N, CD, MH := s.MP, s.DS, s.CD(), s.MH
	MHP, BC := MH*P, MH*2*N
	g := h / (MH / s.G)
	X := a.xbc[t0*CD+h*P:]
	Bm := a.xbc[t0*CD+s.DI()+g*N:]
	Cm := a.xbc[t0*CD+s.DI()+s.G*N+g*N:]
	dY := a.dy[t0*MHP+h*P:]
	dX := a.dxbc[t0*CD+h*P:]
	dB := a.dBC[(t0*MH+h)*2*N:]
	dC := a.dBC[(t0*MH+h)*2*N+N:]
	chunkDt(a, w, h, t0, l, A)
	lam, dt, ddt, dl := w.lam[:l], w.dt[:l], w.ddt[:l], w.dl[:l]
	clear(ddt)
	clear(dl)
	last := lam[l-1]
	// Intra-chunk: M = G ⊙ L ⊙ dt_j with G = C·Bᵀ, dM = dY·Xᵀ; dG = dM ⊙ L ⊙ dt_j.
	G, M, dM := w.G[:l*l], w.M[:l*l], w.dM[:l*l]
	gemm(w.ws, false, true, l, l, N, Cm, CD, Bm, CD, G, l, false)
	gemm(w.ws, false, true, l, l, P, dY, MHP, X, CD, dM, l, false)
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
	gemm(w.ws, true, false, l, P, l, M, l, dY, MHP, dX, CD, false)
	dh := a.d[h]
	for i := range l {
		for p := range P {
			dX[i*CD+p] += dh * dY[i*MHP+p]
			dD += dY[i*MHP+p] * X[i*CD+p]
		}
	}
	// dC = dG·B (+ exp(Λ_i)·dY·S0), dB = dGᵀ·C (+ the end state's term).
	gemm(w.ws, false, false, l, N, l, dM, l, Bm, CD, dC, BC, false)
	gemm(w.ws, true, false, l, N, l, dM, l, Cm, CD, dB, BC, false)
	if s0 != nil {
		tmpN, tmpP := w.tmpN[:l*N], w.tmpP[:l*P]
		gemm(w.ws, false, false, l, N, P, dY, MHP, s0, N, tmpN, N, false)
		gemm(w.ws, false, true, l, P, N, Cm, CD, s0, N, tmpP, P, false)
		for i := range l {
			e := expF(lam[i])
			for n := range N {
				dC[i*BC+n] += e * tmpN[i*N+n]
			}
			var dot F
			for p := range P {
				dot += dY[i*MHP+p] * tmpP[i*P+p]
			}
			dl[i] += e * dot
		}
	}
	if dS1 != nil {
		// S1 = exp(Λ_last)·S0 + Σ_j exp(Λ_last − Λ_j)·dt_j·x_j ⊗ B_j.
		xs, bs := w.tmpN2[:l*N], w.tmpP2[:l*P]
		gemm(w.ws, false, false, l, N, P, X, CD, dS1, N, xs, N, false) // X·dS1
		gemm(w.ws, false, true, l, P, N, Bm, CD, dS1, N, bs, P, false) // B·dS1ᵀ
		for j := range l {
			e := expF(last - lam[j])
			wj := e * dt[j]
			var q F
			for n := range N {
				q += xs[j*N+n] * Bm[j*CD+n]
				dB[j*BC+n] += wj * xs[j*N+n]
			}
			for p := range P {
				dX[j*CD+p] += wj * bs[j*P+p]
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
			ce[i*N+n] = e * Cm[i*CD+n]
		}
	}
	if dS1 != nil {
		e := expF(last)
		for i, v := range dS1 {
			ds0[i] = e * v
		}
		gemm(w.ws, true, false, P, N, l, dY, MHP, ce, N, ds0, N, true)
	} else {
		gemm(w.ws, true, false, P, N, l, dY, MHP, ce, N, ds0, N, false)
	}
	// Λ = cumsum(dt·A): da_j = Σ_{i≥j} dΛ_i; then through the clamp and the
	// softplus to dtRaw.
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
		a.ddtRaw[(t0+j)*MH+h] = gr
		dBias += gr
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
		a := t.a // each worker its own copy: headBackward swaps a.y
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
	offs, parent, ends, _, ok := b.checkTree(op, tree, T)
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
	*t = ssmTask{work: b.ssmWork, a: ssmArgs[float32]{offs: offs, parent: parent, ends: ends, T: T, s: s}}
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
