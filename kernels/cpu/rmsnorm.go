package cpu

// RMSNorm over rows (Llama/Qwen3; also Qwen3's per-head q/k norm with
// N = T·NH, C = HD):
//
//	forward:  rstd (N)   = 1 / sqrt(mean_c inp² + eps)             =
//	          out (N,C)  = (inp · rstd) · weight (C)                =
//	backward: x̂ = inp·rstd, g = dout·weight
//	          dinp (N,C) += rstd · (g − x̂ · mean_c(g·x̂))           +=
//	          dweight (C) += Σ_n dout · x̂                          +=
//
// Rows are independent. dweight is summed in fixed blocks of rmsBlock rows
// whose partial sums are added in block order: thread-count invariant.

import "github.com/tracegrpo/tracegrpo/kernels"

const rmsBlock = 64

func rmsnormRows[F Float](out, rstd, inp, weight []F, lo, hi, C int, eps F) {
	w := weight[:C]
	for r := lo; r < hi; r++ {
		x := inp[r*C : (r+1)*C]
		o := out[r*C : (r+1)*C]
		ss := dotF(x, x)
		rs := 1 / sqrtF(ss/F(C)+eps)
		rstd[r] = rs
		for i, v := range x {
			o[i] = (v * rs) * w[i]
		}
	}
}

// rmsnormBackwardRows adds rows [lo, hi) into dinp and their dweight
// contribution into dwpart (C), which the caller zeroes. fresh: dinp is
// assigned 0 + its row's gradient instead (the bits of a zeroed dinp added
// to), and may be dout itself.
func rmsnormBackwardRows[F Float](dinp, dwpart, dout, inp, weight, rstd []F, lo, hi, C int, fresh bool) {
	w := weight[:C]
	dwpart = dwpart[:C]
	for r := lo; r < hi; r++ {
		x := inp[r*C : (r+1)*C]
		d := dout[r*C : (r+1)*C]
		rs := rstd[r]
		var d0, d1 F
		i := 0
		for ; i+2 <= len(x); i += 2 {
			xh0, xh1 := x[i]*rs, x[i+1]*rs
			dw0, dw1 := d[i]*w[i], d[i+1]*w[i+1]
			dwpart[i] += d[i] * xh0
			dwpart[i+1] += d[i+1] * xh1
			d0 += dw0 * xh0
			d1 += dw1 * xh1
		}
		dot := d0 + d1
		for ; i < len(x); i++ {
			xh := x[i] * rs
			dwpart[i] += d[i] * xh
			dot += d[i] * w[i] * xh
		}
		mean := dot / F(C)
		if dinp == nil {
			continue
		}
		di := dinp[r*C : (r+1)*C]
		if fresh {
			var zero F
			for i := range x {
				di[i] = zero + rs*(d[i]*w[i]-x[i]*rs*mean)
			}
			continue
		}
		for i := range x {
			di[i] += rs * (d[i]*w[i] - x[i]*rs*mean)
		}
	}
}

type rmsnormTask struct {
	out, rstd, inp, weight []float32 // (N,C), (N), (N,C), (C)
	dinp, dout, dwpart     []float32 // (N,C), (N,C), (nblocks,C)
	C                      int
	eps                    float32
	bwd, fresh             bool
}

func (t *rmsnormTask) run(_, lo, hi int) {
	if !t.bwd {
		rmsnormRows(t.out, t.rstd, t.inp, t.weight, lo, hi, t.C, t.eps)
		return
	}
	blk := lo / rmsBlock
	p := t.dwpart[blk*t.C : (blk+1)*t.C]
	clear(p)
	rmsnormBackwardRows(t.dinp, p, t.dout, t.inp, t.weight, t.rstd, lo, hi, t.C, t.fresh)
}

// RMSNorm implements kernels.Ops.
// Shapes: out (N,C), rstd (N), inp (N,C), weight (C).
func (b *Backend) RMSNorm(out, rstd, inp, weight kernels.Buf, N, C int, eps float32) {
	o := b.out(out, N*C, "RMSNorm out") // F32|BF16
	t := &b.tasks.rmsnorm
	*t = rmsnormTask{
		out: o, rstd: b.f32n(rstd, N, "RMSNorm rstd"),
		inp: b.f32n(inp, N*C, "RMSNorm inp"), weight: b.f32n(weight, C, "RMSNorm weight"),
		C: C, eps: eps,
	}
	b.pool.parallel(t, N, rmsBlock)
	*t = rmsnormTask{}
	b.done(out, o)
}

// RMSNormBackward implements kernels.Ops.
// Shapes: dinp (N,C) or empty, dweight (C) or empty, dout (N,C), inp (N,C), weight (C), rstd (N).
func (b *Backend) RMSNormBackward(dinp, dweight, dout, inp, weight, rstd kernels.Buf, N, C int) {
	b.rmsnormBackwardOn(b.f32opt(dinp, N*C, "RMSNormBackward dinp"), b.f32opt(dweight, C, "RMSNormBackward dweight"),
		b.f32n(dout, N*C, "RMSNormBackward dout"), b.f32n(inp, N*C, "RMSNormBackward inp"),
		b.f32n(weight, C, "RMSNormBackward weight"), b.f32n(rstd, N, "RMSNormBackward rstd"), N, C, false)
}

// rmsnormBackwardOn is RMSNormBackward on slices (dinp, dw nil: not
// wanted); fresh: dinp is assigned (rmsnormBackwardRows) and may be dout.
func (b *Backend) rmsnormBackwardOn(dinp, dw, dout, inp, weight, rstd []float32, N, C int, fresh bool) {
	nb := (N + rmsBlock - 1) / rmsBlock
	t := &b.tasks.rmsnorm
	*t = rmsnormTask{
		dinp: dinp, dout: dout, inp: inp, weight: weight, rstd: rstd,
		dwpart: b.scratch.getShared(sharedRMS, nb*C), C: C, bwd: true, fresh: fresh,
	}
	b.pool.parallel(t, N, rmsBlock)
	if dw != nil {
		for blk := 0; blk < nb; blk++ {
			p := t.dwpart[blk*C : (blk+1)*C]
			for i := range dw {
				dw[i] += p[i]
			}
		}
	}
	*t = rmsnormTask{}
}
