package cpu

// AttentionDecode: one query per sequence against a KV cache (sampling).
//
//	out (B,NH,HD) = Σ_{j<lens[b]} softmax_j(q_b·kc[b,j] / sqrt(HD)) · vc[b,j]   =
//
// q (B,NH,HD); kc, vc (B,Tmax,NKV,HD); lens (B) I32 with 1 ≤ lens[b] ≤ Tmax
// (a length outside that range is a data error: zero output and a sticky
// error). Query head h reads cache head h/(NH/NKV). Each (b,h) row is one
// item: thread-count invariant.

import (
	"math"

	"github.com/tracegrpo/tracegrpo/kernels"
)

func attnDecodeRow[F Float](out, q, kc, vc []F, n, b, h, Tmax, NH, NKV, HD int, sc []F) {
	kvh := h / (NH / NKV)
	scale := 1 / sqrtF(F(HD))
	row := (b*NH + h) * HD
	qb := q[row : row+HD]
	sc = sc[:n]
	m := F(math.Inf(-1))
	for j := range sc {
		off := ((b*Tmax+j)*NKV + kvh) * HD
		s := dotF(qb, kc[off:off+HD]) * scale
		sc[j] = s
		m = max(m, s)
	}
	var sum F
	for j, s := range sc {
		p := expF(s - m)
		sc[j] = p
		sum += p
	}
	o := out[row : row+HD]
	clear(o)
	for j, p := range sc {
		off := ((b*Tmax+j)*NKV + kvh) * HD
		axpyF(o, p, vc[off:off+HD])
	}
	inv := 1 / sum
	for i := range o {
		o[i] *= inv
	}
}

type decodeTask struct {
	ws                []wscratch
	out, q, kc, vc    []float32 // (B,NH,HD), (B,NH,HD), (B,Tmax,NKV,HD) ×2
	lens              []int32   // (B)
	Tmax, NH, NKV, HD int
}

func (t *decodeTask) run(w, lo, hi int) {
	sc := t.ws[w].get(slotAttnS, t.Tmax)
	for it := lo; it < hi; it++ {
		bb, h := it/t.NH, it%t.NH
		n := int(t.lens[bb])
		if n < 1 || n > t.Tmax {
			clear(t.out[(bb*t.NH+h)*t.HD : (bb*t.NH+h+1)*t.HD])
			continue
		}
		attnDecodeRow(t.out, t.q, t.kc, t.vc, n, bb, h, t.Tmax, t.NH, t.NKV, t.HD, sc)
	}
}

// AttentionDecode implements kernels.Ops.
// Shapes: out, q (B,NH,HD); kc, vc (B,Tmax,NKV,HD); lens (B) I32.
func (b *Backend) AttentionDecode(out, q, kc, vc, lens kernels.Buf, B, Tmax, NH, NKV, HD int) {
	if NH <= 0 || NKV <= 0 || NH%NKV != 0 {
		panic("cpu: AttentionDecode: NH must be a positive multiple of NKV")
	}
	same("AttentionDecode q, kc, vc", q, kc, vc)
	t := &b.tasks.decode
	*t = decodeTask{
		ws: b.scratch.w, out: b.f32n(out, B*NH*HD, "AttentionDecode out"), q: b.in(q, B*NH*HD, "AttentionDecode q"),
		kc: b.in(kc, B*Tmax*NKV*HD, "AttentionDecode kc"), vc: b.in(vc, B*Tmax*NKV*HD, "AttentionDecode vc"),
		lens: b.i32n(lens, B, "AttentionDecode lens"), Tmax: Tmax, NH: NH, NKV: NKV, HD: HD,
	}
	for i, n := range t.lens {
		if n < 1 || int(n) > Tmax {
			b.fail("AttentionDecode: lens[%d] = %d, want 1..Tmax=%d", i, n, Tmax)
			break
		}
	}
	b.pool.parallel(t, B*NH, 1)
	*t = decodeTask{}
}
