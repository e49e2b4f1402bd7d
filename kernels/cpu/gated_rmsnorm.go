package cpu

// GatedRMSNorm: transformers' Zamba2RMSNormGated, the Mamba-2 mixer's norm
// with the gate applied before it (kernels.Mamba), over rows of D in groups
// of GS.
//
//	forward:  u = y·silu(z); rstd (N, D/GS) = 1/sqrt(mean_group(u²) + eps)   =
//	          out (N,D) = weight ⊙ u·rstd                                   =
//	backward: û = u·rstd, dû = dout ⊙ weight
//	          du = rstd·(dû − û·mean_group(dû ⊙ û))
//	          dy (N,D) = du·silu(z)                                         =
//	          dz (N,D) = du·y·σ(z)·(1 + z·(1 − σ(z)))                        =
//	          dweight (D) += Σ_rows dout ⊙ û
//
// The forward and dy, dz split by row; dweight by blocks of gnColBlock
// columns, each summing its rows in order (û recomputed from rstd): every
// element is produced by one grain in a fixed order, thread-count
// invariant.

import (
	"fmt"

	"github.com/tracegrpo/tracegrpo/kernels"
)

const (
	gnRowGrain = 8
	gnColBlock = 64
)

type gatedNormTask struct {
	out, rstd, y, z, weight []float32
	dy, dz, dweight, dout   []float32
	D, GS                   int
	eps                     float32
	phase                   int // 0 forward, 1 dy and dz, 2 dweight
}

// gated returns u = y·silu(z) and σ(z).
func gated(y, z float32) (u, s float32) {
	s = 1 / (1 + expf(-z))
	return y * z * s, s
}

func (t *gatedNormTask) run(_, lo, hi int) {
	D, GS := t.D, t.GS
	ng := D / GS
	switch t.phase {
	case 0:
		for r := lo; r < hi; r++ {
			for g := range ng {
				base := r*D + g*GS
				var ss float32
				for i := base; i < base+GS; i++ {
					u, _ := gated(t.y[i], t.z[i])
					ss += u * u
				}
				rs := 1 / sqrtF(ss/float32(GS)+t.eps)
				t.rstd[r*ng+g] = rs
				for i := base; i < base+GS; i++ {
					u, _ := gated(t.y[i], t.z[i])
					t.out[i] = t.weight[i-r*D] * (u * rs)
				}
			}
		}
	case 1:
		for r := lo; r < hi; r++ {
			for g := range ng {
				base := r*D + g*GS
				rs := t.rstd[r*ng+g]
				var dot float32
				for i := base; i < base+GS; i++ {
					u, _ := gated(t.y[i], t.z[i])
					dot += t.dout[i] * t.weight[i-r*D] * (u * rs)
				}
				mean := dot / float32(GS)
				for i := base; i < base+GS; i++ {
					u, s := gated(t.y[i], t.z[i])
					du := rs * (t.dout[i]*t.weight[i-r*D] - u*rs*mean)
					z := t.z[i]
					t.dy[i] = du * z * s
					t.dz[i] = du * t.y[i] * (s * (1 + z*(1-s)))
				}
			}
		}
	case 2:
		N := len(t.rstd) / ng
		// Each column is summed over the rows first and then added to
		// dweight (micro-batches accumulated or summed apart: the same bits).
		for blk := lo; blk < hi; blk++ {
			c0, c1 := blk*gnColBlock, min((blk+1)*gnColBlock, D)
			var acc [gnColBlock]float32
			for r := range N {
				for c := c0; c < c1; c++ {
					i := r*D + c
					u, _ := gated(t.y[i], t.z[i])
					acc[c-c0] += t.dout[i] * (u * t.rstd[r*ng+c/GS])
				}
			}
			for c := c0; c < c1; c++ {
				t.dweight[c] += acc[c-c0]
			}
		}
	}
}

func checkGatedNorm(op string, N, D, GS int) {
	if N < 0 || D <= 0 || GS <= 0 || D%GS != 0 {
		panic(fmt.Sprintf("cpu: %s: N=%d D=%d GS=%d (GS must divide D)", op, N, D, GS))
	}
}

// GatedRMSNorm implements kernels.Mamba.
// Shapes: out (N,D) F32|BF16, rstd (N,D/GS), y, z (N,D), weight (D).
func (b *Backend) GatedRMSNorm(out, rstd, y, z, weight kernels.Buf, N, D, GS int, eps float32) {
	checkGatedNorm("GatedRMSNorm", N, D, GS)
	o := b.out(out, N*D, "GatedRMSNorm out")
	t := &b.tasks.gatedNorm
	*t = gatedNormTask{out: o, rstd: b.f32n(rstd, N*(D/GS), "GatedRMSNorm rstd"), y: b.f32n(y, N*D, "GatedRMSNorm y"),
		z: b.f32n(z, N*D, "GatedRMSNorm z"), weight: b.f32n(weight, D, "GatedRMSNorm weight"), D: D, GS: GS, eps: eps}
	b.pool.parallel(t, N, gnRowGrain)
	*t = gatedNormTask{}
	b.done(out, o)
}

// GatedRMSNormBackward implements kernels.Mamba.
// Shapes: dy, dz, dout, y, z (N,D); dweight, weight (D); rstd (N,D/GS).
func (b *Backend) GatedRMSNormBackward(dy, dz, dweight, dout, y, z, weight, rstd kernels.Buf, N, D, GS int) {
	checkGatedNorm("GatedRMSNormBackward", N, D, GS)
	t := &b.tasks.gatedNorm
	*t = gatedNormTask{dy: b.f32n(dy, N*D, "GatedRMSNormBackward dy"), dz: b.f32n(dz, N*D, "GatedRMSNormBackward dz"),
		dweight: b.f32n(dweight, D, "GatedRMSNormBackward dweight"), dout: b.f32n(dout, N*D, "GatedRMSNormBackward dout"),
		y: b.f32n(y, N*D, "GatedRMSNormBackward y"), z: b.f32n(z, N*D, "GatedRMSNormBackward z"),
		weight: b.f32n(weight, D, "GatedRMSNormBackward weight"), rstd: b.f32n(rstd, N*(D/GS), "GatedRMSNormBackward rstd"),
		D: D, GS: GS, phase: 1}
	b.pool.parallel(t, N, gnRowGrain)
	t.phase = 2
	b.pool.parallel(t, (D+gnColBlock-1)/gnColBlock, 1)
	*t = gatedNormTask{}
}
