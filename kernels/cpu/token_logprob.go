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
// The forward keeps, per row, a running max m, s1 = Σ exp(z−m) and
// s2 = Σ exp(z−m)·(z−m) in float64 across chunks of tlpVChunk logits, so that
// entropy = log s1 − s2/s1 has no cancellation. The backward walks the
// vocabulary in chunks of at most tlpBwdBudget/T columns: for each chunk it
// recomputes the logits and dz of every row (rows split across threads, dhidden
// rows disjoint), then adds dzᵀ·hidden into that chunk of dweight (output tiles
// split across threads). Both are thread-count invariant.

import (
	"math"

	"github.com/tracegrpo/tracegrpo/kernels"
)

const (
	tlpRowBlock  = 96      // rows per grain (amortises packing each weight chunk)
	tlpVChunk    = 256     // logits per forward chunk
	tlpBwdBudget = 1 << 22 // dz elements held by the backward (16 MiB)
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
				if isF32[F]() && ws != nil {
					// d = z − m, then e = exp(d) by the vector exp into a
					// copy, then Σ e·d.
					d := asF32(zr)
					for i := range d {
						d[i] -= float32(mf)
					}
					e := ws.get(slotRow, len(d))
					copy(e, d)
					a1 = F(expScaleShift(e, 1, 0))
					a2 = F(dotF(e, d))
				} else {
					for _, v := range zr {
						d := v - mf
						e := expF(d)
						a1 += e
						a2 += e * d
					}
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
		if isF32[F]() && ws != nil {
			z32 := asF32(zr)
			expScaleShift(z32, float32(invTemp), float32(l))
			scaleRange(z32, float32(-g))
		} else {
			for i, v := range zr {
				zr[i] = -g * expF(v*invTemp-l)
			}
		}
		if tg >= v0 && tg < v0+vc {
			zr[tg-v0] += g
		}
	}
	if dhidden != nil {
		gemm(ws, false, false, n, C, vc, dz, vc, weight[v0*C:], C, dhidden[lo*C:], C, true)
	}
}

type tlpTask struct {
	ws                              []wscratch
	logprob, entropy, lse, dlogprob []float32 // (T) each
	hidden, weight, dhidden, dz     []float32 // (T,C), (V,C), (T,C), (T,vc)
	targets                         []int32   // (T)
	C, V, v0, vc                    int
	invTemp                         float32
	bwd                             bool
	bad                             []int
}

func (t *tlpTask) run(w, lo, hi int) {
	ws := &t.ws[w]
	if t.bwd {
		tokenLogprobBackwardRows(ws, t.dz[lo*t.vc:hi*t.vc], t.dhidden, t.hidden, t.weight, t.dlogprob, t.lse, t.targets, lo, hi, t.v0, t.vc, t.C, t.V, t.invTemp)
		return
	}
	if bad := tokenLogprobRows(ws, t.logprob, t.entropy, t.lse, t.hidden, t.weight, t.targets, lo, hi, t.C, t.V, t.invTemp); bad >= 0 && (t.bad[w] < 0 || bad < t.bad[w]) {
		t.bad[w] = bad
	}
}

// TokenLogprob implements kernels.Ops.
func (b *Backend) TokenLogprob(logprob, entropy, lse, hidden, weight, targets kernels.Buf, T, C, V int, invTemp float32) {
	t := &b.tasks.tlp
	*t = tlpTask{
		ws: b.scratch.w, logprob: b.f32n(logprob, T, "TokenLogprob logprob"), entropy: b.f32n(entropy, T, "TokenLogprob entropy"),
		lse: b.f32n(lse, T, "TokenLogprob lse"), hidden: b.f32n(hidden, T*C, "TokenLogprob hidden"),
		weight: b.f32n(weight, V*C, "TokenLogprob weight"), targets: b.i32n(targets, T, "TokenLogprob targets"),
		C: C, V: V, invTemp: invTemp, bad: b.badRows(),
	}
	b.pool.parallel(t, T, tlpRowBlock)
	b.reportBad("TokenLogprob", t.bad, t.targets, V)
	*t = tlpTask{}
}

// TokenLogprobBackward implements kernels.Ops.
func (b *Backend) TokenLogprobBackward(dhidden, dweight, dlogprob, hidden, weight, targets, lse kernels.Buf, T, C, V int, invTemp float32) {
	if T == 0 {
		return
	}
	t := &b.tasks.tlp
	*t = tlpTask{
		ws: b.scratch.w, dhidden: b.f32opt(dhidden, T*C, "TokenLogprobBackward dhidden"),
		dlogprob: b.f32n(dlogprob, T, "TokenLogprobBackward dlogprob"), hidden: b.f32n(hidden, T*C, "TokenLogprobBackward hidden"),
		weight: b.f32n(weight, V*C, "TokenLogprobBackward weight"), targets: b.i32n(targets, T, "TokenLogprobBackward targets"),
		lse: b.f32n(lse, T, "TokenLogprobBackward lse"), C: C, V: V, invTemp: invTemp, bwd: true,
	}
	dw := b.f32opt(dweight, V*C, "TokenLogprobBackward dweight")
	chunk := min(V, max(32, tlpBwdBudget/T/32*32))
	for v0 := 0; v0 < V; v0 += chunk {
		vc := min(chunk, V-v0)
		t.v0, t.vc = v0, vc
		t.dz = b.scratch.getShared(sharedDZ, T*vc)
		b.pool.parallel(t, T, tlpRowBlock)
		if dw != nil {
			b.parallelGemm(true, false, vc, C, T, t.dz, vc, t.hidden, C, dw[v0*C:], C, true)
		}
	}
	*t = tlpTask{}
}
