package cpu

// Attention: causal grouped-query attention over packed sequences
// (FlashAttention varlen semantics), scale 1/sqrt(HD).
//
// Sequence s holds tokens [cu[s], cu[s+1]) of q (T,NH,HD), k, v (T,NKV,HD)
// and attends only within itself; query head h reads key/value head
// h/(NH/NKV). For query token t of sequence s and key tokens j ∈ [cu[s], t]:
//
//	forward:  S_j  = q_t·k_j / sqrt(HD)
//	          lse (T,NH) = log Σ_j exp S_j                               =
//	          out (T,NH,HD) = Σ_j exp(S_j − lse) · v_j                   =
//	backward: P_j = exp(S_j − lse), D_t = dout_t·out_t,
//	          dS_j = P_j · (dout_t·v_j − D_t)
//	          dq (T,NH,HD)  = Σ_j dS_j · k_j / sqrt(HD)                 =
//	          dk (T,NKV,HD) = Σ_{t,h in group} dS_j · q_t / sqrt(HD)    =
//	          dv (T,NKV,HD) = Σ_{t,h in group} P_j · dout_t             =
//
// The Backend's float32 path works in blocks of attnQBlock query rows of one
// head: S = Q·Kᵀ over keys [0, end of block) by the packed gemm, a masked,
// max-subtracted softmax per row (the whole row of scores is held, at most
// MaxLen floats, so no online rescaling is needed), lse saved, O = P·V by
// gemm. The backward recomputes P from lse block by block and splits work by
// (sequence, key/value head), so every dk/dv element is summed by one grain in
// a fixed order. Both are thread-count invariant. The keys and values of a
// (sequence, key/value head) are packed for the gemm once per worker and
// reused by every query block and head of its group (attnPacks; packing
// never changes a sum's order, so neither bits nor invariances change).
// Scratch per worker is 2·attnQBlock·MaxLen floats and three packed copies
// of one sequence's keys or values.
//
// attnForwardRow and attnBackwardGroup are the generic row-by-row reference
// (float64 instantiation finite-difference checked; the float32 path is
// compared against it).

import (
	"fmt"
	"math"

	"github.com/tracegrpo/tracegrpo/kernels"
)

// dotF is Σ a[i]·b[i] with four interleaved partial sums (i mod 4) added
// as (s0+s1)+(s2+s3), then the tail: a fixed order for a given length.
func dotF[F Float](a, b []F) F {
	b = b[:len(a)]
	var s0, s1, s2, s3 F
	i := 0
	for ; i+4 <= len(a); i += 4 {
		s0 += a[i] * b[i]
		s1 += a[i+1] * b[i+1]
		s2 += a[i+2] * b[i+2]
		s3 += a[i+3] * b[i+3]
	}
	s := (s0 + s1) + (s2 + s3)
	for ; i < len(a); i++ {
		s += a[i] * b[i]
	}
	return s
}

func axpyF[F Float](y []F, a F, x []F) {
	x = x[:len(y)]
	for i := range y {
		y[i] += a * x[i]
	}
}

// attnForwardRow computes out and lse for query token t, head h, whose
// sequence starts at s0. sc holds at least t−s0+1 scores.
func attnForwardRow[F Float](out, lse, q, k, v []F, t, h, s0, NH, NKV, HD int, sc []F) {
	kvh := h / (NH / NKV)
	scale := 1 / sqrtF(F(HD))
	qt := q[(t*NH+h)*HD : (t*NH+h+1)*HD]
	n := t - s0 + 1
	sc = sc[:n]
	m := F(math.Inf(-1))
	for j := range sc {
		kj := k[((s0+j)*NKV+kvh)*HD : ((s0+j)*NKV+kvh+1)*HD]
		s := dotF(qt, kj) * scale
		sc[j] = s
		m = max(m, s)
	}
	var sum F
	for j, s := range sc {
		p := expF(s - m)
		sc[j] = p
		sum += p
	}
	o := out[(t*NH+h)*HD : (t*NH+h+1)*HD]
	clear(o)
	for j, p := range sc {
		axpyF(o, p, v[((s0+j)*NKV+kvh)*HD:((s0+j)*NKV+kvh+1)*HD])
	}
	inv := 1 / sum
	for i := range o {
		o[i] *= inv
	}
	lse[t*NH+h] = m + logF(sum)
}

// attnBackwardGroup computes dq for the query heads of key/value head kvh and
// dk, dv of kvh over the sequence [s0, s1).
func attnBackwardGroup[F Float](dq, dk, dv, dout, out, lse, q, k, v []F, s0, s1, kvh, NH, NKV, HD int) {
	scale := 1 / sqrtF(F(HD))
	g := NH / NKV
	for j := s0; j < s1; j++ {
		clear(dk[(j*NKV+kvh)*HD : (j*NKV+kvh+1)*HD])
		clear(dv[(j*NKV+kvh)*HD : (j*NKV+kvh+1)*HD])
	}
	for h := kvh * g; h < (kvh+1)*g; h++ {
		for t := s0; t < s1; t++ {
			row := (t*NH + h) * HD
			qt, dot, ot := q[row:row+HD], dout[row:row+HD], out[row:row+HD]
			dqt := dq[row : row+HD]
			clear(dqt)
			D := dotF(dot, ot)
			l := lse[t*NH+h]
			for j := s0; j <= t; j++ {
				kv := (j*NKV + kvh) * HD
				kj, vj := k[kv:kv+HD], v[kv:kv+HD]
				p := expF(dotF(qt, kj)*scale - l)
				ds := p * (dotF(dot, vj) - D)
				axpyF(dqt, ds*scale, kj)
				axpyF(dk[kv:kv+HD], ds*scale, qt)
				axpyF(dv[kv:kv+HD], p, dot)
			}
		}
	}
}

// attnQBlock is the number of query rows the float32 path processes per
// gemm (a multiple of the micro-kernel's 12 rows).
const attnQBlock = 48

// attnForwardBlock32 is the float32 fast path of the forward for query rows
// [i0, i1) of head h in sequence s, tokens [s0, s0+L): S = Q·Kᵀ by gemm
// over keys [0, i1), a masked softmax per row (saving lse), O = P·V by gemm,
// with the sequence's keys and values packed once (attnPacks) for call gen.
func attnForwardBlock32(ws *wscratch, gen uint64, out, lse, q, k, v []float32, s, s0, L, i0, i1, h, NH, NKV, HD int) {
	kvh := h / (NH / NKV)
	krow, vrow := k[(s0*NKV+kvh)*HD:], v[(s0*NKV+kvh)*HD:]
	pk, pv := ws.attnPacks(attnPackKey{gen, s, kvh}, krow, vrow, NKV*HD, L, HD)
	attnRowsForward(ws, out[((s0+i0)*NH+h)*HD:], lse[(s0+i0)*NH+h:], q[((s0+i0)*NH+h)*HD:],
		krow, vrow, NKV*HD, i0, i1-i0, NH, HD, pk, pv)
}

// attnPackKey names what a worker's attention packs hold: the keys and
// values of sequence s's key/value head kvh in the call gen (every
// Attention call has its own, so a pack never outlives its buffers).
type attnPackKey struct {
	gen    uint64
	s, kvh int
}

// attnPacks returns the L keys (rows ld apart from krow) packed as op(B) of
// S = Q·Kᵀ and the values as op(B) of O = P·V over any prefix of them,
// packing them unless this worker's packs already hold key's.
func (ws *wscratch) attnPacks(key attnPackKey, krow, vrow []float32, ld, L, HD int) (pk, pv *prepacked) {
	if ws.attnKey != key {
		kt := ws.get(slotAttnKT, packedBSize(L, HD))
		vp := ws.get(slotAttnV, packedBSize(HD, L))
		packBWhole(kt, true, krow, ld, L, HD)
		packBWhole(vp, false, vrow, ld, HD, L)
		ws.attnKT = prepacked{pb: kt, npad: (L + gemmNR - 1) / gemmNR * gemmNR}
		ws.attnV = prepacked{pb: vp, npad: (HD + gemmNR - 1) / gemmNR * gemmNR, kb: L}
		ws.attnKey = key
	}
	return &ws.attnKT, &ws.attnV
}

// attnRowsForward computes qb query rows of one head whose context starts at
// krow, vrow (rows ldkv apart): query r sees keys [0, c0+r] (c0 is the first
// query's position in the context). S = Q·Kᵀ by gemm over keys [0, c0+qb),
// a masked softmax per row (saving lse), O = P·V by gemm. qrow and o are the
// first query's rows (NH·HD apart), lse its entry (NH apart). Attention and
// TreeAttention both run it, so a query's sums are the same terms in the
// same order whichever packs it. pk and pv, when set, hold the keys and
// values packed (attnPacks); else each gemm packs its own.
func attnRowsForward(ws *wscratch, o, lse, qrow, krow, vrow []float32, ldkv, c0, qb, NH, HD int, pk, pv *prepacked) {
	nk := c0 + qb
	scale := 1 / float32(sqrtF(float64(HD)))
	S := ws.get(slotAttnS, qb*nk)
	gemmWith(ws, pk, false, true, qb, nk, HD, qrow, NH*HD, krow, ldkv, S, nk, false)
	inv := ws.get(slotAttnAux, qb)
	for r := 0; r < qb; r++ {
		row := S[r*nk : (r+1)*nk]
		valid := row[:c0+r+1]
		m := maxF32(valid) * scale
		sum := expScaleShift(valid, scale, m)
		clear(row[c0+r+1:])
		inv[r] = 1 / sum
		lse[r*NH] = m + float32(logF(float64(sum)))
	}
	gemmWith(ws, pv, false, false, qb, HD, nk, S, nk, vrow, ldkv, o, NH*HD, false)
	for r := 0; r < qb; r++ {
		scaleRange(o[r*NH*HD:r*NH*HD+HD], inv[r])
	}
}

// gemmWith is gemm with op(B) prepacked in pre (nil: gemm packs it).
func gemmWith(ws *wscratch, pre *prepacked, transA, transB bool, M, N, K int, A []float32, lda int, B []float32, ldb int, C []float32, ldc int, acc bool) {
	if pre == nil || M <= 0 || N <= 0 || K <= 0 {
		gemm(ws, transA, transB, M, N, K, A, lda, B, ldb, C, ldc, acc)
		return
	}
	gemmPacked(ws, transA, transB, M, N, K, A, lda, B, ldb, pre, 0, 0, C, ldc, acc)
}

// attnBackwardGroup32 is the float32 fast path of the backward for key/value
// head kvh over the sequence [s0, s1), query blocks of attnQBlock rows.
func attnBackwardGroup32(ws *wscratch, dq, dk, dv, dout, out, lse, q, k, v []float32, s0, s1, kvh, NH, NKV, HD int) {
	g := NH / NKV
	scale := 1 / float32(sqrtF(float64(HD)))
	L := s1 - s0
	for j := s0; j < s1; j++ {
		clear(dk[(j*NKV+kvh)*HD : (j*NKV+kvh+1)*HD])
		clear(dv[(j*NKV+kvh)*HD : (j*NKV+kvh+1)*HD])
	}
	krow := k[(s0*NKV+kvh)*HD:]
	vrow := v[(s0*NKV+kvh)*HD:]
	dkrow := dk[(s0*NKV+kvh)*HD:]
	dvrow := dv[(s0*NKV+kvh)*HD:]
	// The keys and values packed once for every head and query block: K
	// as op(B) of Q·Kᵀ and of dS·K, V as op(B) of dO·Vᵀ. They overwrite the
	// forward's packs, so those are marked stale.
	ws.attnKey = attnPackKey{}
	kt, vt, kn := ws.get(slotAttnKT, packedBSize(L, HD)), ws.get(slotAttnV, packedBSize(L, HD)), ws.get(slotAttnK, packedBSize(HD, L))
	packBWhole(kt, true, krow, NKV*HD, L, HD)
	packBWhole(vt, true, vrow, NKV*HD, L, HD)
	packBWhole(kn, false, krow, NKV*HD, HD, L)
	npadL, npadHD := (L+gemmNR-1)/gemmNR*gemmNR, (HD+gemmNR-1)/gemmNR*gemmNR
	pkt, pvt, pkn := prepacked{pb: kt, npad: npadL}, prepacked{pb: vt, npad: npadL}, prepacked{pb: kn, npad: npadHD, kb: L}
	for h := kvh * g; h < (kvh+1)*g; h++ {
		for i0 := 0; i0 < L; i0 += attnQBlock {
			i1 := min(i0+attnQBlock, L)
			qb, nk := i1-i0, i1
			P := ws.get(slotAttnS, qb*nk)
			dP := ws.get(slotAttnP, qb*nk)
			Dv := ws.get(slotAttnAux, qb)
			off := ((s0+i0)*NH + h) * HD
			qrow, dorow, orow, dqrow := q[off:], dout[off:], out[off:], dq[off:]
			gemmWith(ws, &pkt, false, true, qb, nk, HD, qrow, NH*HD, krow, NKV*HD, P, nk, false)
			for r := 0; r < qb; r++ {
				i := i0 + r
				row := P[r*nk : (r+1)*nk]
				expScaleShift(row[:i+1], scale, lse[(s0+i)*NH+h])
				clear(row[i+1:])
				Dv[r] = dotF(dorow[r*NH*HD:r*NH*HD+HD], orow[r*NH*HD:r*NH*HD+HD])
			}
			// dV += Pᵀ·dO
			gemm(ws, true, false, nk, HD, qb, P, nk, dorow, NH*HD, dvrow, NKV*HD, true)
			// dP = dO·Vᵀ, then dS = P ⊙ (dP − D)·scale in place.
			gemmWith(ws, &pvt, false, true, qb, nk, HD, dorow, NH*HD, vrow, NKV*HD, dP, nk, false)
			for r := 0; r < qb; r++ {
				pr, dr := P[r*nk:(r+1)*nk], dP[r*nk:(r+1)*nk]
				d := Dv[r]
				for j := range dr {
					dr[j] = pr[j] * (dr[j] - d) * scale
				}
			}
			// dQ = dS·K; dK += dSᵀ·Q
			gemmWith(ws, &pkn, false, false, qb, HD, nk, dP, nk, krow, NKV*HD, dqrow, NH*HD, false)
			gemm(ws, true, false, nk, HD, qb, dP, nk, qrow, NH*HD, dkrow, NKV*HD, true)
		}
	}
}

// seqOf returns the sequence holding token t: the s with cu[s] ≤ t < cu[s+1].
func seqOf(cu []int32, t int) int {
	lo, hi := 0, len(cu)-2
	for lo < hi {
		mid := (lo + hi + 1) / 2
		if int(cu[mid]) <= t {
			lo = mid
		} else {
			hi = mid - 1
		}
	}
	return lo
}

type attnTask struct {
	ws                  []wscratch
	out, lse, q, k, v   []float32 // (T,NH,HD), (T,NH), (T,NH,HD), (T,NKV,HD), (T,NKV,HD)
	dq, dk, dv, dout    []float32 // (T,NH,HD), (T,NKV,HD), (T,NKV,HD), (T,NH,HD)
	cu                  []int32   // (S+1)
	NH, NKV, HD, maxLen int
	bwd                 bool
	blocks              []attnBlock
	gen                 uint64 // this call, for the workers' packs (attnPackKey)
}

func (t *attnTask) run(w, lo, hi int) {
	ws := &t.ws[w]
	if t.bwd {
		for it := lo; it < hi; it++ {
			s, kvh := it/t.NKV, it%t.NKV
			attnBackwardGroup32(ws, t.dq, t.dk, t.dv, t.dout, t.out, t.lse, t.q, t.k, t.v,
				int(t.cu[s]), int(t.cu[s+1]), kvh, t.NH, t.NKV, t.HD)
		}
		return
	}
	for it := lo; it < hi; it++ {
		blk := t.blocks[it]
		s0, s1 := int(t.cu[blk.seq]), int(t.cu[blk.seq+1])
		attnForwardBlock32(ws, t.gen, t.out, t.lse, t.q, t.k, t.v, int(blk.seq), s0, s1-s0, int(blk.i0), int(blk.i1), int(blk.h), t.NH, t.NKV, t.HD)
	}
}

// attnBlock is one forward work item: query rows [i0, i1) of head h of
// sequence seq.
type attnBlock struct {
	seq, h, i0, i1 int32
}

// checkSeqs validates cu_seqlens against T and returns it; on bad data it
// records a sticky error and returns nil.
func (b *Backend) checkSeqs(op string, seqs kernels.Seqs, T int) []int32 {
	cu := b.I32(seqs.CuSeqlens)
	if len(cu) != seqs.S+1 {
		panic(fmt.Sprintf("cpu: %s: cu_seqlens has %d elements, want S+1 = %d", op, len(cu), seqs.S+1))
	}
	if cu[0] != 0 || int(cu[seqs.S]) != T {
		b.fail("%s: cu_seqlens runs from %d to %d, want 0 to T=%d", op, cu[0], cu[seqs.S], T)
		return nil
	}
	for s := 0; s < seqs.S; s++ {
		if cu[s+1] < cu[s] || int(cu[s+1]-cu[s]) > seqs.MaxLen {
			b.fail("%s: sequence %d spans [%d, %d), want a non-negative length of at most MaxLen=%d", op, s, cu[s], cu[s+1], seqs.MaxLen)
			return nil
		}
	}
	return cu
}

func attnShape(q kernels.Buf, NH, NKV, HD int) int {
	if NH <= 0 || NKV <= 0 || HD <= 0 || NH%NKV != 0 || q.N%(NH*HD) != 0 {
		panic(fmt.Sprintf("cpu: attention: bad shape NH=%d NKV=%d HD=%d for q of %d elements", NH, NKV, HD, q.N))
	}
	return q.N / (NH * HD)
}

// Attention implements kernels.Ops.
// Shapes: out (T,NH,HD), lse (T,NH), q (T,NH,HD), k (T,NKV,HD), v (T,NKV,HD), seqs.CuSeqlens (S+1) I32.
func (b *Backend) Attention(out, lse, q, k, v kernels.Buf, seqs kernels.Seqs, NH, NKV, HD int) {
	T := attnShape(q, NH, NKV, HD)
	cu := b.checkSeqs("Attention", seqs, T)
	if cu == nil {
		return
	}
	same("Attention q, k, v", q, k, v)
	o := b.out(out, T*NH*HD, "Attention out")
	defer b.done(out, o)
	t := &b.tasks.attn
	*t = attnTask{
		ws: b.scratch.w, out: o, lse: b.f32n(lse, T*NH, "Attention lse"),
		q: b.in(q, T*NH*HD, "Attention q"), k: b.in(k, T*NKV*HD, "Attention k"), v: b.in(v, T*NKV*HD, "Attention v"),
		cu: cu, NH: NH, NKV: NKV, HD: HD, maxLen: max(seqs.MaxLen, 1), gen: b.tasks.attnGen.next(),
	}
	// Work items: (sequence, head, query block), those of one (sequence,
	// key/value head) together so that a worker packs its keys and values
	// once for many (attnPacks), longest blocks first within it so the
	// pool's dynamic hand-out balances; the list depends only on the shapes.
	blocks := b.tasks.attnBlocks[:0]
	g := NH / NKV
	for s := 0; s < seqs.S; s++ {
		L := int(cu[s+1] - cu[s])
		if L == 0 {
			continue
		}
		for kvh := 0; kvh < NKV; kvh++ {
			for i0 := (L - 1) / attnQBlock * attnQBlock; i0 >= 0; i0 -= attnQBlock {
				for h := kvh * g; h < (kvh+1)*g; h++ {
					blocks = append(blocks, attnBlock{int32(s), int32(h), int32(i0), int32(min(i0+attnQBlock, L))})
				}
			}
		}
	}
	b.tasks.attnBlocks = blocks
	t.blocks = blocks
	b.pool.parallel(t, len(blocks), 1)
	*t = attnTask{}
}

// AttentionBackward implements kernels.Ops.
// Shapes: dq, dout, out (T,NH,HD); dk, dv, k, v (T,NKV,HD); lse (T,NH); q (T,NH,HD).
func (b *Backend) AttentionBackward(dq, dk, dv, dout, out, lse, q, k, v kernels.Buf, seqs kernels.Seqs, NH, NKV, HD int) {
	T := attnShape(q, NH, NKV, HD)
	cu := b.checkSeqs("AttentionBackward", seqs, T)
	if cu == nil {
		return
	}
	same("AttentionBackward dout, out, q, k, v", dout, out, q, k, v)
	t := &b.tasks.attn
	*t = attnTask{
		ws: b.scratch.w,
		dq: b.f32n(dq, T*NH*HD, "AttentionBackward dq"), dk: b.f32n(dk, T*NKV*HD, "AttentionBackward dk"),
		dv: b.f32n(dv, T*NKV*HD, "AttentionBackward dv"), dout: b.in(dout, T*NH*HD, "AttentionBackward dout"),
		out: b.in(out, T*NH*HD, "AttentionBackward out"), lse: b.f32n(lse, T*NH, "AttentionBackward lse"),
		q: b.in(q, T*NH*HD, "AttentionBackward q"), k: b.in(k, T*NKV*HD, "AttentionBackward k"), v: b.in(v, T*NKV*HD, "AttentionBackward v"),
		cu: cu, NH: NH, NKV: NKV, HD: HD, maxLen: max(seqs.MaxLen, 1), bwd: true,
	}
	b.pool.parallel(t, seqs.S*NKV, 1)
	*t = attnTask{}
}
