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

// TokenLogprobFiltered and TokenLogprobFilteredBackward: the LM head under
// NeMo RL's top-k/top-p filter (kernels.FilteredHead). The logits are
// formed a block of tlpRows(V) whole rows at a time, the forward then runs
// per row:
//
//	cut     = kernels.FilterCut(z)                       (radix select)
//	s1, s2  = Σ_K e, Σ_K e·(z−m), e = exp(z−m)           (float64 sums)
//	LSE     = m + log s1,  Entropy = log s1 − s2/s1
//	Logprob = z[tg] − LSE if tg survives, else −Inf
//	LSEFull, LogprobFull: the unfiltered row, folded exactly as
//	          TokenLogprob folds it (the same bits)
//
// and the backward forms the same blocks and turns each row into
//
//	dz_v = invTemp·(dlogprob·k_v·(1[v=tg] − e^{z_v−LSE}) + dlogprobFull·(1[v=tg] − e^{z_v−LSEFull}))
//
// then dhidden (rows,C) += dz·weight and dweight (V,C) += dzᵀ·hidden
// (two parallelGemm calls per block). Rows are independent and the gemms
// tile-deterministic: thread-count invariant.

// tlpRows is the rows of a block of the filtered head: about tlpBudget
// logits, at least one row.
func tlpRows(V int) int { return max(1, tlpBudget/max(V, 1)) }

type tlpFilterTask struct {
	ws      []wscratch
	sc      []kernels.FilterScratch // per worker
	z       []float32               // (rows, V) logits of the block, then dz
	r0      int                     // the block's first row
	V       int
	invTemp float32
	f       kernels.TopKTopP
	targets []int32 // (T)
	// forward outputs (T) and cut (2T); backward reads lse, lseFull, cut
	logprob, entropy, lse, logprobFull, lseFull []float32
	cut                                         []int32
	dlogprob, dlogprobFull                      []float32 // (T); dlogprobFull may be nil
	backward                                    bool
	bad                                         []int
}

func (t *tlpFilterTask) run(w, lo, hi int) {
	for r := lo; r < hi; r++ {
		row := t.z[r*t.V : (r+1)*t.V]
		tr := t.r0 + r
		tg := int(t.targets[tr])
		if tg < 0 || tg >= t.V {
			if t.backward {
				clear(row)
				continue
			}
			if tg >= t.V && (t.bad[w] < 0 || tr < t.bad[w]) {
				t.bad[w] = tr
			}
			t.logprob[tr], t.entropy[tr], t.lse[tr], t.logprobFull[tr], t.lseFull[tr] = 0, 0, 0, 0, 0
			t.cut[2*tr], t.cut[2*tr+1] = 0, 0
			continue
		}
		scaleRange(row, t.invTemp)
		if t.backward {
			t.backwardRow(w, row, tr, tg)
		} else {
			t.forwardRow(w, row, tr, tg)
		}
	}
}

func (t *tlpFilterTask) forwardRow(w int, row []float32, tr, tg int) {
	cut := kernels.FilterCut(row, t.f, &t.sc[w])
	m := maxF32(row)
	e := t.ws[w].get(slotRow, tlpVChunk)
	var s1, s2 float64
	for c0 := 0; c0 < len(row); c0 += tlpVChunk {
		zr := row[c0:min(c0+tlpVChunk, len(row))]
		e = e[:len(zr)]
		copy(e, zr)
		expScaleShift(e, 1, m)
		for i, x := range e {
			if cut.Keeps(c0+i, zr[i]) {
				s1 += float64(x)
				s2 += float64(x) * float64(zr[i]-m)
			}
		}
	}
	ls := float64(m) + math.Log(s1)
	t.lse[tr] = float32(ls)
	t.entropy[tr] = float32(math.Log(s1) - s2/s1)
	t.logprob[tr] = float32(math.Inf(-1))
	if cut.Keeps(tg, row[tg]) {
		t.logprob[tr] = float32(float64(row[tg]) - ls)
	}
	t.cut[2*tr], t.cut[2*tr+1] = int32(cut.Key), cut.ID
	// The unfiltered row, folded as TokenLogprob folds it (update, which
	// rewrites row): the same lse and logprob bits.
	st := [4]float64{math.Inf(-1), 0, 0, 0}
	u := tlpTask{ws: t.ws, z: row, state: st[:], targets: []int32{int32(tg)}, V: t.V, v0: 0, vc: t.V, invTemp: 1}
	u.update(w, 0, tg)
	lsu := st[0] + math.Log(st[1])
	t.lseFull[tr] = float32(lsu)
	t.logprobFull[tr] = float32(st[3] - lsu)
}

func (t *tlpFilterTask) backwardRow(w int, row []float32, tr, tg int) {
	cut := kernels.Cut{Key: uint32(t.cut[2*tr]), ID: t.cut[2*tr+1]}
	ef := t.ws[w].get(slotRow, t.V)
	copy(ef, row)
	expScaleShift(ef, 1, t.lse[tr])
	g := t.dlogprob[tr]
	var gu float32
	var eu []float32
	if t.dlogprobFull != nil {
		gu = t.dlogprobFull[tr]
		eu = t.ws[w].get(slotLogits, t.V)
		copy(eu, row)
		expScaleShift(eu, 1, t.lseFull[tr])
	}
	keptTarget := cut.Keeps(tg, row[tg])
	for v, x := range row {
		var d float32
		if cut.Keeps(v, x) {
			d = -g * ef[v]
		}
		if eu != nil {
			d -= gu * eu[v]
		}
		row[v] = d
	}
	if keptTarget {
		row[tg] += g
	}
	if eu != nil {
		row[tg] += gu
	}
	scaleRange(row, t.invTemp)
}

// TokenLogprobFiltered implements kernels.FilteredHead.
// Shapes: o's buffers (T), o.Cut (2T) I32; hidden (T,C); weight (V,C); targets (T) I32.
func (b *Backend) TokenLogprobFiltered(o kernels.HeadOut, hidden, weight, targets kernels.Buf, T, C, V int, invTemp float32, f kernels.TopKTopP) {
	same("TokenLogprobFiltered hidden, weight", hidden, weight)
	h := b.in(hidden, T*C, "TokenLogprobFiltered hidden") // (T,C) F32|BF16
	w := b.in(weight, V*C, "TokenLogprobFiltered weight") // (V,C) F32|BF16
	t := b.filterTask(f, V, invTemp)
	t.targets = b.i32n(targets, T, "TokenLogprobFiltered targets")
	t.logprob, t.entropy, t.lse = b.f32n(o.Logprob, T, "TokenLogprobFiltered logprob"), b.f32n(o.Entropy, T, "TokenLogprobFiltered entropy"), b.f32n(o.LSE, T, "TokenLogprobFiltered lse")
	t.logprobFull, t.lseFull = b.f32n(o.LogprobFull, T, "TokenLogprobFiltered logprobFull"), b.f32n(o.LSEFull, T, "TokenLogprobFiltered lseFull")
	t.cut = b.i32n(o.Cut, 2*T, "TokenLogprobFiltered cut")
	t.bad = b.badRows()
	rows := tlpRows(V)
	for r0 := 0; r0 < T; r0 += rows {
		n := min(rows, T-r0)
		t.r0, t.z = r0, b.scratch.getShared(sharedDZ, n*V)
		b.parallelGemm(false, true, n, V, C, h[r0*C:], C, w, C, t.z, V, false)
		b.pool.parallel(t, n, 1)
	}
	b.reportBad("TokenLogprobFiltered", t.bad, t.targets, V)
	b.tasks.tlpFilter = tlpFilterTask{}
}

// TokenLogprobFilteredBackward implements kernels.FilteredHead.
// Shapes: dhidden (T,C) or empty, dweight (V,C) or empty, dlogprob (T), dlogprobFull (T) or empty,
// hidden (T,C), weight (V,C), targets (T) I32, o.LSE, o.LSEFull (T), o.Cut (2T) I32.
func (b *Backend) TokenLogprobFilteredBackward(dhidden, dweight, dlogprob, dlogprobFull, hidden, weight, targets kernels.Buf, o kernels.HeadOut, T, C, V int, invTemp float32) {
	if T == 0 {
		return
	}
	dh := b.f32opt(dhidden, T*C, "TokenLogprobFilteredBackward dhidden") // (T,C)
	dw := b.f32opt(dweight, V*C, "TokenLogprobFilteredBackward dweight") // (V,C)
	same("TokenLogprobFilteredBackward hidden, weight", hidden, weight)
	h := b.in(hidden, T*C, "TokenLogprobFilteredBackward hidden") // (T,C) F32|BF16
	w := b.in(weight, V*C, "TokenLogprobFilteredBackward weight") // (V,C) F32|BF16
	t := b.filterTask(kernels.TopKTopP{}, V, invTemp)
	t.backward = true
	t.targets = b.i32n(targets, T, "TokenLogprobFilteredBackward targets")
	t.dlogprob = b.f32n(dlogprob, T, "TokenLogprobFilteredBackward dlogprob")
	t.dlogprobFull = b.f32opt(dlogprobFull, T, "TokenLogprobFilteredBackward dlogprobFull")
	t.lse, t.lseFull = b.f32n(o.LSE, T, "TokenLogprobFilteredBackward lse"), b.f32n(o.LSEFull, T, "TokenLogprobFilteredBackward lseFull")
	t.cut = b.i32n(o.Cut, 2*T, "TokenLogprobFilteredBackward cut")
	rows := tlpRows(V)
	for r0 := 0; r0 < T; r0 += rows {
		n := min(rows, T-r0)
		t.r0, t.z = r0, b.scratch.getShared(sharedDZ, n*V)
		b.parallelGemm(false, true, n, V, C, h[r0*C:], C, w, C, t.z, V, false)
		b.pool.parallel(t, n, 1)
		if dh != nil {
			b.parallelGemm(false, false, n, C, V, t.z, V, w, C, dh[r0*C:], C, true)
		}
		if dw != nil {
			b.parallelGemm(true, false, V, C, n, t.z, V, h[r0*C:], C, dw, C, true)
		}
	}
	b.tasks.tlpFilter = tlpFilterTask{}
}

// filterTask resets the filtered head's task with per-worker filter scratch.
func (b *Backend) filterTask(f kernels.TopKTopP, V int, invTemp float32) *tlpFilterTask {
	t := &b.tasks.tlpFilter
	if len(b.filterScratch) != b.threads {
		b.filterScratch = make([]kernels.FilterScratch, b.threads)
	}
	*t = tlpFilterTask{ws: b.scratch.w, sc: b.filterScratch, V: V, invTemp: invTemp, f: f}
	return t
}

var _ kernels.FilteredHead = (*Backend)(nil)
