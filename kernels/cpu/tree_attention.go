package cpu

// TreeAttention: causal grouped-query attention over a packed token tree
// (kernels.Tree), scale 1/sqrt(HD).
//
// Segment s holds tokens [Offs[s], Offs[s+1]) of q (T,NH,HD), k, v
// (T,NKV,HD); query head h reads key/value head h/(NH/NKV). The context of
// segment s is its ancestors' tokens, root first (A_s of them), then its own:
// query i of s sits at context position c = A_s + i and sees context keys
// 0..c. With S_j = q·k_j / sqrt(HD) over those keys:
//
//	forward:  lse (T,NH)    = log Σ_j exp S_j                           =
//	          out (T,NH,HD) = Σ_j exp(S_j − lse)·v_j                     =
//	backward: P_j = exp(S_j − lse), D = dout·out, dS_j = P_j·(dout·v_j − D)
//	          dq (T,NH,HD)  = Σ_j dS_j·k_j / sqrt(HD)                    =
//	          dk (T,NKV,HD) = Σ_{queries seeing k, h in group} dS·q / sqrt(HD)  =
//	          dv (T,NKV,HD) = Σ_{queries seeing k, h in group} P·dout   =
//
// A key of segment s is seen by the queries of s at or after it and by every
// query of s's descendants: the tokens [Offs[s+1], Ends[s]).
//
// The float32 path: the forward and dq work by (segment, key/value head,
// block of attnQBlock queries of the segment). The context's keys and values
// are gathered root first into contiguous scratch (a root's are used in
// place), and each query head of the group runs Attention's block routine
// (attnRowsForward: gemm, masked softmax, gemm) over them; dq recomputes P
// from lse as Attention's backward does. A query's sums are therefore the
// terms, in the order, of Attention over its root-to-segment path packed as
// one sequence: out, lse and dq are bit-identical to that
// (TestTreeAttentionMatchesPaths). dk and dv work by (segment, key/value
// head, block of attnQBlock keys): each block owns its rows and sums, for
// each query head of the group in turn, the queries that see it in token
// order in blocks of attnQBlock (the segment's own from the key block's
// start, then its descendants'): every element is summed by one grain in a
// fixed order, so the backward is deterministic and thread-count invariant,
// with no atomics. D = rowsum(dout∘out) is computed once into shared
// scratch. Scratch per worker: the gathered context (2·MaxCtx·HD floats) and
// the score blocks (2·attnQBlock·MaxCtx).
//
// treeAttnRef64 and treeAttnBwdRef64 in the tests are the row-by-row
// reference (finite-difference checked).

import (
	"fmt"

	"github.com/tracegrpo/tracegrpo/kernels"
)

type treeItem struct{ seg, kvh, i0, i1 int32 }

type treeTask struct {
	ws                 []wscratch
	out, lse, q, k, v  []float32 // (T,NH,HD), (T,NH), (T,NH,HD), (T,NKV,HD), (T,NKV,HD)
	dq, dk, dv, dout   []float32 // (T,NH,HD), (T,NKV,HD), (T,NKV,HD), (T,NH,HD)
	D                  []float32 // (T,NH) rowsum(dout∘out)
	offs, parent, ends []int32   // the tree
	anc                []int32   // (NS) each segment's ancestors' tokens: its first token's context position
	pos                []int32   // (T) each token's context position (backward)
	chain              [][]int32 // per worker: a segment's ancestors, root first
	NH, NKV, HD        int
	phase              int // 0 forward, 1 dq, 2 dk and dv, 3 D
	items              []treeItem
}

// Phases of treeTask.
const (
	treeForward = iota
	treeDq
	treeDkDv
	treeD
)

func (t *treeTask) run(w, lo, hi int) {
	if t.phase == treeD {
		for r := lo; r < hi; r++ {
			t.D[r] = dotF(t.dout[r*t.HD:(r+1)*t.HD], t.out[r*t.HD:(r+1)*t.HD])
		}
		return
	}
	for it := lo; it < hi; it++ {
		switch t.phase {
		case treeForward:
			t.forward(w, t.items[it])
		case treeDq:
			t.backwardDq(w, t.items[it])
		case treeDkDv:
			t.backwardDkDv(w, t.items[it])
		}
	}
}

// context returns the keys and values that queries [0, i1) of segment s see
// for key/value head kvh, rows ld apart: the packed tensors themselves for a
// root, else its ancestors' rows root first and then its own, gathered into
// worker w's scratch.
func (t *treeTask) context(w, s, kvh, i1 int) (kc, vc []float32, ld int) {
	NKV, HD := t.NKV, t.HD
	s0 := int(t.offs[s])
	if t.parent[s] < 0 {
		return t.k[(s0*NKV+kvh)*HD:], t.v[(s0*NKV+kvh)*HD:], NKV * HD
	}
	ws := &t.ws[w]
	n := int(t.anc[s]) + i1
	kc, vc = ws.get(slotTreeK, n*HD), ws.get(slotTreeV, n*HD)
	chain := t.chain[w][:0]
	for p := t.parent[s]; p >= 0; p = t.parent[p] {
		chain = append(chain, p)
	}
	t.chain[w] = chain
	row := 0
	copyRows := func(from, to int) {
		for j := from; j < to; j++ {
			src := (j*NKV + kvh) * HD
			copy(kc[row*HD:(row+1)*HD], t.k[src:src+HD])
			copy(vc[row*HD:(row+1)*HD], t.v[src:src+HD])
			row++
		}
	}
	for i := len(chain) - 1; i >= 0; i-- {
		a := chain[i]
		copyRows(int(t.offs[a]), int(t.offs[a+1]))
	}
	copyRows(s0, s0+i1)
	return kc, vc, HD
}

// forward computes queries [i0, i1) of segment s for the query heads of
// key/value head kvh.
func (t *treeTask) forward(w int, it treeItem) {
	s, kvh, i0, i1 := int(it.seg), int(it.kvh), int(it.i0), int(it.i1)
	NH, HD, g := t.NH, t.HD, t.NH/t.NKV
	kc, vc, ld := t.context(w, s, kvh, i1)
	c0 := int(t.anc[s]) + i0
	row := int(t.offs[s]) + i0
	for h := kvh * g; h < (kvh+1)*g; h++ {
		off := (row*NH + h) * HD
		attnRowsForward(&t.ws[w], t.out[off:], t.lse[row*NH+h:], t.q[off:], kc, vc, ld, c0, i1-i0, NH, HD, nil, nil)
	}
}

// backwardDq computes dq of queries [i0, i1) of segment s for the query
// heads of key/value head kvh: P from lse, dP = dO·Vᵀ, dS = P∘(dP − D),
// dQ = dS·K, as Attention's backward computes them.
func (t *treeTask) backwardDq(w int, it treeItem) {
	s, kvh, i0, i1 := int(it.seg), int(it.kvh), int(it.i0), int(it.i1)
	NH, HD, g := t.NH, t.HD, t.NH/t.NKV
	ws := &t.ws[w]
	scale := 1 / float32(sqrtF(float64(HD)))
	kc, vc, ld := t.context(w, s, kvh, i1)
	c0 := int(t.anc[s]) + i0
	qb, nk := i1-i0, c0+i1-i0
	row0 := int(t.offs[s]) + i0
	for h := kvh * g; h < (kvh+1)*g; h++ {
		off := (row0*NH + h) * HD
		qrow, dorow, dqrow := t.q[off:], t.dout[off:], t.dq[off:]
		P := ws.get(slotAttnS, qb*nk)
		dP := ws.get(slotAttnP, qb*nk)
		gemm(ws, false, true, qb, nk, HD, qrow, NH*HD, kc, ld, P, nk, false)
		for r := 0; r < qb; r++ {
			row := P[r*nk : (r+1)*nk]
			expScaleShift(row[:c0+r+1], scale, t.lse[(row0+r)*NH+h])
			clear(row[c0+r+1:])
		}
		gemm(ws, false, true, qb, nk, HD, dorow, NH*HD, vc, ld, dP, nk, false)
		for r := 0; r < qb; r++ {
			pr, dr := P[r*nk:(r+1)*nk], dP[r*nk:(r+1)*nk]
			d := t.D[(row0+r)*NH+h]
			for j := range dr {
				dr[j] = pr[j] * (dr[j] - d) * scale
			}
		}
		gemm(ws, false, false, qb, HD, nk, dP, nk, kc, ld, dqrow, NH*HD, false)
	}
}

// backwardDkDv computes dk and dv of keys [i0, i1) of segment s for
// key/value head kvh: for each query head of the group, the queries that
// see them in token order, attnQBlock at a time: the segment's own from the
// block's first key (causally masked), then its descendants' (unmasked).
func (t *treeTask) backwardDkDv(w int, it treeItem) {
	s, kvh, j0, j1 := int(it.seg), int(it.kvh), int(it.i0), int(it.i1)
	NH, NKV, HD, g := t.NH, t.NKV, t.HD, t.NH/t.NKV
	ws := &t.ws[w]
	scale := 1 / float32(sqrtF(float64(HD)))
	s0, s1, e := int(t.offs[s]), int(t.offs[s+1]), int(t.ends[s])
	kb := j1 - j0
	cbase := int(t.anc[s]) + j0 // the block's first key's context position
	kr := ((s0+j0)*NKV + kvh) * HD
	krow, vrow := t.k[kr:], t.v[kr:]
	dkrow, dvrow := t.dk[kr:], t.dv[kr:]
	for j := 0; j < kb; j++ {
		clear(dkrow[j*NKV*HD : j*NKV*HD+HD])
		clear(dvrow[j*NKV*HD : j*NKV*HD+HD])
	}
	for h := kvh * g; h < (kvh+1)*g; h++ {
		// Query blocks: the segment's own [s0+j0, s1), then [s1, e).
		for _, span := range [2][2]int{{s0 + j0, s1}, {s1, e}} {
			for q0 := span[0]; q0 < span[1]; q0 += attnQBlock {
				q1 := min(q0+attnQBlock, span[1])
				qb := q1 - q0
				off := (q0*NH + h) * HD
				qrow, dorow := t.q[off:], t.dout[off:]
				P := ws.get(slotAttnS, qb*kb)
				dP := ws.get(slotAttnP, qb*kb)
				gemm(ws, false, true, qb, kb, HD, qrow, NH*HD, krow, NKV*HD, P, kb, false)
				for r := 0; r < qb; r++ {
					row := P[r*kb : (r+1)*kb]
					tq := q0 + r
					n := kb // keys this query sees: all, or up to itself in its own segment
					if tq < s1 {
						n = min(kb, tq-s0-j0+1)
					}
					// Each probability through the exp (vector or scalar)
					// that Attention's row of this query's context uses
					// for its key: the same bits as the unshared packing.
					nvec := int(t.pos[tq]+1)&^7 - cbase
					expScaleShiftSplit(row[:n], nvec, scale, t.lse[tq*NH+h], ws.get(slotAttnAux, 8))
					clear(row[n:])
				}
				// dV += Pᵀ·dO
				gemm(ws, true, false, kb, HD, qb, P, kb, dorow, NH*HD, dvrow, NKV*HD, true)
				// dP = dO·Vᵀ, then dS = P ⊙ (dP − D)·scale in place; dK += dSᵀ·Q.
				gemm(ws, false, true, qb, kb, HD, dorow, NH*HD, vrow, NKV*HD, dP, kb, false)
				for r := 0; r < qb; r++ {
					pr, dr := P[r*kb:(r+1)*kb], dP[r*kb:(r+1)*kb]
					d := t.D[(q0+r)*NH+h]
					for j := range dr {
						dr[j] = pr[j] * (dr[j] - d) * scale
					}
				}
				gemm(ws, true, false, kb, HD, qb, dP, kb, qrow, NH*HD, dkrow, NKV*HD, true)
			}
		}
	}
}

// checkTree validates a tree against T tokens (kernels.CheckTree) and
// returns its offsets, parents, ends and each segment's ancestor token count
// (in the backend's reused scratch); on bad data it records a sticky error
// and returns ok = false.
func (b *Backend) checkTree(op string, tree kernels.Tree, T int) (offs, parent, ends, anc []int32, ok bool) {
	offs = b.I32(tree.Offs)
	parent, ends = b.I32(tree.Parent), b.I32(tree.Ends)
	if len(offs) != tree.NS+1 || len(parent) != tree.NS || len(ends) != tree.NS {
		panic(fmt.Sprintf("cpu: %s: tree of NS=%d has %d offsets, %d parents, %d ends", op, tree.NS, len(offs), len(parent), len(ends)))
	}
	if cap(b.tasks.treeAnc) < tree.NS {
		b.tasks.treeAnc = make([]int32, tree.NS)
	}
	anc = b.tasks.treeAnc[:tree.NS]
	if err := kernels.CheckTree(offs, parent, ends, T, tree.MaxLen, tree.MaxCtx, anc); err != nil {
		b.fail("%s: %v", op, err)
		return nil, nil, nil, nil, false
	}
	return offs, parent, ends, anc, true
}

// treeTaskFor fills the backend's tree task for a call and its work items:
// (segment, key/value head, block of attnQBlock rows), the last blocks of
// each segment (the heaviest, for the forward and dq) first. The list
// depends only on the tree's shape.
func (b *Backend) treeTaskFor(offs, parent, ends, anc []int32, NH, NKV, HD int) *treeTask {
	t := &b.tasks.tree
	if len(b.tasks.treeChains) != b.threads {
		b.tasks.treeChains = make([][]int32, b.threads)
	}
	*t = treeTask{ws: b.scratch.w, offs: offs, parent: parent, ends: ends, anc: anc, chain: b.tasks.treeChains,
		NH: NH, NKV: NKV, HD: HD}
	items := b.tasks.treeItems[:0]
	for s := range len(parent) {
		L := int(offs[s+1] - offs[s])
		for i0 := (L - 1) / attnQBlock * attnQBlock; i0 >= 0; i0 -= attnQBlock {
			for kvh := range NKV {
				items = append(items, treeItem{int32(s), int32(kvh), int32(i0), int32(min(i0+attnQBlock, L))})
			}
		}
	}
	b.tasks.treeItems = items
	t.items = items
	return t
}

// TreeAttention implements kernels.Ops.
// Shapes: out (T,NH,HD), lse (T,NH), q (T,NH,HD), k (T,NKV,HD), v (T,NKV,HD); the tree's buffers I32.
func (b *Backend) TreeAttention(out, lse, q, k, v kernels.Buf, tree kernels.Tree, NH, NKV, HD int) {
	T := attnShape(q, NH, NKV, HD)
	offs, parent, ends, anc, ok := b.checkTree("TreeAttention", tree, T)
	if !ok {
		return
	}
	same("TreeAttention q, k, v", q, k, v)
	o := b.out(out, T*NH*HD, "TreeAttention out")
	defer b.done(out, o)
	t := b.treeTaskFor(offs, parent, ends, anc, NH, NKV, HD)
	t.out, t.lse = o, b.f32n(lse, T*NH, "TreeAttention lse")
	t.q, t.k, t.v = b.in(q, T*NH*HD, "TreeAttention q"), b.in(k, T*NKV*HD, "TreeAttention k"), b.in(v, T*NKV*HD, "TreeAttention v")
	t.phase = treeForward
	b.pool.parallel(t, len(t.items), 1)
	*t = treeTask{}
}

// TreeAttentionBackward implements kernels.Ops.
// Shapes: dq, dout, out, q (T,NH,HD); dk, dv, k, v (T,NKV,HD); lse (T,NH).
func (b *Backend) TreeAttentionBackward(dq, dk, dv, dout, out, lse, q, k, v kernels.Buf, tree kernels.Tree, NH, NKV, HD int) {
	T := attnShape(q, NH, NKV, HD)
	offs, parent, ends, anc, ok := b.checkTree("TreeAttentionBackward", tree, T)
	if !ok {
		return
	}
	same("TreeAttentionBackward dout, out, q, k, v", dout, out, q, k, v)
	t := b.treeTaskFor(offs, parent, ends, anc, NH, NKV, HD)
	t.dq = b.f32n(dq, T*NH*HD, "TreeAttentionBackward dq")
	t.dk = b.f32n(dk, T*NKV*HD, "TreeAttentionBackward dk")
	t.dv = b.f32n(dv, T*NKV*HD, "TreeAttentionBackward dv")
	t.dout, t.out = b.in(dout, T*NH*HD, "TreeAttentionBackward dout"), b.in(out, T*NH*HD, "TreeAttentionBackward out")
	t.lse = b.f32n(lse, T*NH, "TreeAttentionBackward lse")
	t.q, t.k, t.v = b.in(q, T*NH*HD, "TreeAttentionBackward q"), b.in(k, T*NKV*HD, "TreeAttentionBackward k"), b.in(v, T*NKV*HD, "TreeAttentionBackward v")
	t.D = b.scratch.getShared(sharedAttnD, T*NH)
	if cap(b.tasks.treePos) < T {
		b.tasks.treePos = make([]int32, T)
	}
	t.pos = b.tasks.treePos[:T]
	for s := range tree.NS {
		for j := offs[s]; j < offs[s+1]; j++ {
			t.pos[j] = anc[s] + j - offs[s]
		}
	}
	t.phase = treeD
	b.pool.parallel(t, T*NH, elemGrain/max(HD, 1))
	t.phase = treeDq
	b.pool.parallel(t, len(t.items), 1)
	t.phase = treeDkDv
	b.pool.parallel(t, len(t.items), 1)
	*t = treeTask{}
}
