package cpu

// TokenLogprob: the fused LM head, temperature, log-softmax, gather and
// entropy, computed in vocabulary chunks so the (T,V) logits never exist.
//
//	z = hidden[t] · weight (V,C)ᵀ · invTemp                  (per chunk of V)
//	forward:  lse (T)     = log Σ_v exp z_v                            =
//	          logprob (T) = z[targets[t]] − lse                        =
//	          entropy (T) = −Σ_v p_v log p_v,  p = exp(z − lse)         =
//	backward: dz_v = dlogprob_t · (1[v = targets[t]] − p_v)  (from saved lse)
//	          dhidden (T,C) += invTemp · dz · weight                   +=
//	          dweight (V,C) += invTemp · dzᵀ · hidden                  +=
//
// hidden (T,C); targets (T) I32. Rows with targets[t] < 0 give 0 in all three
// outputs and contribute nothing to the gradients; a target ≥ V is a data error
// (sticky, the row is treated as masked).
//
// The Backend walks the vocabulary in chunks of vc ≈ tlpBudget/T columns
// (a multiple of 256): one packed gemm forms the (T, vc) logits of the chunk;
// the forward then folds them, 256 at a time, into each row's running max m
// and, in float64, s1 = Σ exp(z−m) and s2 = Σ exp(z−m)·(z−m), so
// entropy = log s1 − s2/s1 has no cancellation; the backward turns them into dz and adds dz·weight_chunk
// into dhidden and dzᵀ·hidden into the chunk's rows of dweight with two more
// gemms. Row passes own disjoint rows and the gemms are tile-deterministic:
// thread-count invariant; every per-row sum runs over the same 256-aligned
// vocabulary blocks whatever T is, so a row's outputs and dhidden do not
// depend on the other rows. invTemp must be positive.
//
// tokenLogprobRows and tokenLogprobBackwardRows are the generic reference
// (the float64 instantiation is finite-difference checked; the float32
// Backend is compared against it).

import (
	"math"

	"github.com/tracegrpo/tracegrpo/kernels"
)

const (
	tlpRowBlock = 32  // rows per grain of the row passes
	tlpVChunk   = 256 // logits per sub-chunk of the running softmax (= gemmKC)
)

// tokenLogprobRows computes rows [lo, hi). It returns the first row whose
// target is ≥ V, or −1.
func tokenLogprobRows[F Float](ws *wscratch, logprob, entropy, lse, hidden, weight []F, targets []int32, lo, hi, C, V int, invTemp F) int {
	n := hi - lo
	z := scratchOf[F](ws, slotLogits, n*tlpVChunk)
	var mBuf, s1Buf, s2Buf, ztBuf [tlpRowBlock]float64
	bad := -1
	for r0 := 0; r0 < n; r0 += tlpRowBlock {
		nr := min(tlpRowBlock, n-r0)
		m, s1, s2, zt := mBuf[:nr], s1Buf[:nr], s2Buf[:nr], ztBuf[:nr]
		for r := range m {
			m[r], s1[r], s2[r], zt[r] = math.Inf(-1), 0, 0, 0
		}
		row0 := lo + r0
		for v0 := 0; v0 < V; v0 += tlpVChunk {
			vc := min(tlpVChunk, V-v0)
			gemm(ws, false, true, nr, vc, C, hidden[row0*C:], C, weight[v0*C:], C, z, vc, false)
			for r := 0; r < nr; r++ {
				tg := int(targets[row0+r])
				if tg < 0 || tg >= V {
					continue
				}
				zr := z[r*vc : (r+1)*vc]
				cm := F(math.Inf(-1))
				for i := range zr {
					zr[i] *= invTemp
					cm = max(cm, zr[i])
				}
				if tg >= v0 && tg < v0+vc {
					zt[r] = float64(zr[tg-v0])
				}
				if float64(cm) > m[r] {
					alpha := math.Exp(m[r] - float64(cm))
					s2[r] = alpha * (s2[r] + (m[r]-float64(cm))*s1[r])
					s1[r] *= alpha
					if math.IsInf(m[r], -1) {
						s1[r], s2[r] = 0, 0
					}
					m[r] = float64(cm)
				}
				mf := F(m[r])
				var a1, a2 F
				for _, v := range zr {
					d := v - mf
					e := expF(d)
					a1 += e
					a2 += e * d
				}
				s1[r] += float64(a1)
				s2[r] += float64(a2)
			}
		}
		for r := 0; r < nr; r++ {
			t := row0 + r
			tg := int(targets[t])
			if tg < 0 || tg >= V {
				if tg >= V && bad < 0 {
					bad = t
				}
				logprob[t], entropy[t], lse[t] = 0, 0, 0
				continue
			}
			ls := m[r] + math.Log(s1[r])
			lse[t] = F(ls)
			logprob[t] = F(zt[r] - ls)
			entropy[t] = F(math.Log(s1[r]) - s2[r]/s1[r])
		}
	}
	return bad
}

// tokenLogprobBackwardRows recomputes the logits of rows [lo, hi) for the
// vocabulary chunk [v0, v0+vc), writes dz (already scaled by invTemp) into dz
// (hi−lo, vc), and adds dz · weight[v0:v0+vc] into dhidden (if non-nil).
func tokenLogprobBackwardRows[F Float](ws *wscratch, dz, dhidden, hidden, weight, dlogprob, lse []F, targets []int32, lo, hi, v0, vc, C, V int, invTemp F) {
	n := hi - lo
	gemm(ws, false, true, n, vc, C, hidden[lo*C:], C, weight[v0*C:], C, dz, vc, false)
	for r := 0; r < n; r++ {
		t := lo + r
		zr := dz[r*vc : (r+1)*vc]
		tg := int(targets[t])
		if tg < 0 || tg >= V {
			clear(zr)
			continue
		}
		g := dlogprob[t] * invTemp
		l := lse[t]
		for i, v := range zr {
			zr[i] = -g * expF(v*invTemp-l)
		}
		if tg >= v0 && tg < v0+vc {
			zr[tg-v0] += g
		}
	}
	if dhidden != nil {
		gemm(ws, false, false, n, C, vc, dz, vc, weight[v0*C:], C, dhidden[lo*C:], C, true)
	}
}

// The float32 Backend path: per vocabulary chunk of vc = tlpBudget/T
// columns, the (T, vc) logits come from one parallelGemm, then a row pass
// updates each row's running max and sums (forward) or turns the logits into
// dz (backward), and the backward's two gradient products are parallelGemm
// calls too. Row passes write disjoint rows; parallelGemm is tile-deterministic.

// tlpBudget is the number of logits held per chunk (16 MiB); a variable so
// tests can force many chunks on small shapes.
var tlpBudget = 1 << 22

type tlpTask struct {
	ws                              []wscratch
	logprob, entropy, lse, dlogprob []float32 // (T) each
	z                               []float32 // (T, vc) logits of the chunk, then dz
	state                           []float64 // (T, 4): m, s1, s2, z[target]
	targets                         []int32   // (T)
	V, v0, vc                       int
	invTemp                         float32
	phase                           int // 0 forward update, 1 forward finish, 2 backward dz
	bad                             []int
}

func (t *tlpTask) run(w, lo, hi int) {
	for r := lo; r < hi; r++ {
		tg := int(t.targets[r])
		valid := tg >= 0 && tg < t.V
		switch t.phase {
		case 0:
			if valid {
				t.update(w, r, tg)
			}
		case 1:
			if !valid {
				if tg >= t.V && (t.bad[w] < 0 || r < t.bad[w]) {
					t.bad[w] = r
				}
				t.logprob[r], t.entropy[r], t.lse[r] = 0, 0, 0
				continue
			}
			st := t.state[4*r : 4*r+4]
			ls := st[0] + math.Log(st[1])
			t.lse[r] = float32(ls)
			t.logprob[r] = float32(st[3] - ls)
			t.entropy[r] = float32(math.Log(st[1]) - st[2]/st[1])
		case 2:
			zr := t.z[r*t.vc : (r+1)*t.vc]
			if !valid {
				clear(zr)
				continue
			}
			g := t.dlogprob[r] * t.invTemp
			expScaleShift(zr, t.invTemp, t.lse[r])
			scaleRange(zr, -g)
			if tg >= t.v0 && tg < t.v0+t.vc {
				zr[tg-t.v0] += g
			}
		}
	}
}

// update folds row r's logits of the current chunk into its running state,
// tlpVChunk logits at a time (sub-chunks aligned to multiples of tlpVChunk
// in the vocabulary), so the order of every sum depends only on V, never on
// the chunk size tlpChunk picked from T.
func (t *tlpTask) update(w, r, tg int) {
	st := t.state[4*r : 4*r+4]
	row := t.z[r*t.vc : (r+1)*t.vc]
	scaleRange(row, t.invTemp)
	if tg >= t.v0 && tg < t.v0+t.vc {
		st[3] = float64(row[tg-t.v0])
	}
	e := t.ws[w].get(slotRow, tlpVChunk)
	for c0 := 0; c0 < len(row); c0 += tlpVChunk {
		zr := row[c0:min(c0+tlpVChunk, len(row))]
		cm := float64(maxF32(zr))
		if cm > st[0] {
			if math.IsInf(st[0], -1) {
				st[1], st[2] = 0, 0
			} else {
				alpha := math.Exp(st[0] - cm)
				st[2] = alpha * (st[2] + (st[0]-cm)*st[1])
				st[1] *= alpha
			}
			st[0] = cm
		}
		m := float32(st[0])
		for i := range zr {
			zr[i] -= m
		}
		e = e[:len(zr)]
		copy(e, zr)
		st[1] += float64(expScaleShift(e, 1, 0))
		st[2] += float64(dotF(e, zr))
	}
}

// tlpChunk is the vocabulary chunk for T rows: about tlpBudget logits, a
// whole number of tlpVChunk sub-chunks (so the gemm's 256-wide K blocks of
// dz·weight and the forward's sub-chunks fall on the same vocabulary
// boundaries for every T), at most V.
func tlpChunk(T, V int) int {
	return min(V, max(tlpVChunk, tlpBudget/max(T, 1)/tlpVChunk*tlpVChunk))
}

// TokenLogprob implements kernels.Ops.
// Shapes: logprob, entropy, lse (T); hidden (T,C); weight (V,C); targets (T) I32.
func (b *Backend) TokenLogprob(logprob, entropy, lse, hidden, weight, targets kernels.Buf, T, C, V int, invTemp float32) {
	same("TokenLogprob hidden, weight", hidden, weight)
	h := b.in(hidden, T*C, "TokenLogprob hidden") // (T,C) F32|BF16
	w := b.in(weight, V*C, "TokenLogprob weight") // (V,C) F32|BF16
	t := &b.tasks.tlp
	*t = tlpTask{
		ws: b.scratch.w, logprob: b.f32n(logprob, T, "TokenLogprob logprob"), entropy: b.f32n(entropy, T, "TokenLogprob entropy"),
		lse: b.f32n(lse, T, "TokenLogprob lse"), targets: b.i32n(targets, T, "TokenLogprob targets"),
		V: V, invTemp: invTemp, bad: b.badRows(), state: b.scratch.getPartials(4 * T),
	}
	for r := 0; r < T; r++ {
		t.state[4*r], t.state[4*r+1], t.state[4*r+2], t.state[4*r+3] = math.Inf(-1), 0, 0, 0
	}
	chunk := tlpChunk(T, V)
	for v0 := 0; v0 < V; v0 += chunk {
		t.v0, t.vc = v0, min(chunk, V-v0)
		t.z = b.scratch.getShared(sharedDZ, T*t.vc)
		b.parallelGemm(false, true, T, t.vc, C, h, C, w[v0*C:], C, t.z, t.vc, false)
		t.phase = 0
		b.pool.parallel(t, T, tlpRowBlock)
	}
	t.phase = 1
	b.pool.parallel(t, T, tlpRowBlock)
	b.reportBad("TokenLogprob", t.bad, t.targets, V)
	*t = tlpTask{}
}

// TokenLogprobBackward implements kernels.Ops.
// Shapes: dhidden (T,C) or empty, dweight (V,C) or empty, dlogprob (T), hidden (T,C), weight (V,C), targets (T) I32, lse (T).
func (b *Backend) TokenLogprobBackward(dhidden, dweight, dlogprob, hidden, weight, targets, lse kernels.Buf, T, C, V int, invTemp float32) {
	if T == 0 {
		return
	}
	dh := b.f32opt(dhidden, T*C, "TokenLogprobBackward dhidden") // (T,C)
	dw := b.f32opt(dweight, V*C, "TokenLogprobBackward dweight") // (V,C)
	same("TokenLogprobBackward hidden, weight", hidden, weight)
	h := b.in(hidden, T*C, "TokenLogprobBackward hidden") // (T,C) F32|BF16
	w := b.in(weight, V*C, "TokenLogprobBackward weight") // (V,C) F32|BF16
	t := &b.tasks.tlp
	*t = tlpTask{
		ws: b.scratch.w, dlogprob: b.f32n(dlogprob, T, "TokenLogprobBackward dlogprob"),
		targets: b.i32n(targets, T, "TokenLogprobBackward targets"), lse: b.f32n(lse, T, "TokenLogprobBackward lse"),
		V: V, invTemp: invTemp, phase: 2,
	}
	chunk := tlpChunk(T, V)
	for v0 := 0; v0 < V; v0 += chunk {
		vc := min(chunk, V-v0)
		t.v0, t.vc = v0, vc
		t.z = b.scratch.getShared(sharedDZ, T*vc)
		b.parallelGemm(false, true, T, vc, C, h, C, w[v0*C:], C, t.z, vc, false)
		b.pool.parallel(t, T, tlpRowBlock)
		if dh != nil {
			b.parallelGemm(false, false, T, C, vc, t.z, vc, w[v0*C:], C, dh, C, true)
		}
		if dw != nil {
			b.parallelGemm(true, false, vc, C, T, t.z, vc, h, C, dw[v0*C:], C, true)
		}
	}
	*t = tlpTask{}
}
