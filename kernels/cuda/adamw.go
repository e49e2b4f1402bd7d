//go:build cgo

package cuda

// AdamW: csrc/adamw.cu.

import "github.com/tracegrpo/tracegrpo/kernels"

// AdamW implements kernels.Ops: param, m, v (N) updated in place from grad.
func (b *Backend) AdamW(param, grad, m, v kernels.Buf, s kernels.AdamWStep) {
	N := param.N
	want(param, kernels.F32, N, "AdamW param")
	want(grad, kernels.F32, N, "AdamW grad")
	want(m, kernels.F32, N, "AdamW m")
	want(v, kernels.F32, N, "AdamW v")
	defer b.lock()()
	// param, m, v read and written, grad read; about 16 operations an element.
	c := rw(reads(param, grad, m, v), param, m, v).with(16*int64(N), 16)
	b.elementwise("adamw", c, N, pa(param), pa(grad), pa(m), pa(v), la(N),
		fa(s.LR), fa(s.Beta1), fa(s.Beta2), fa(s.OneMinusBeta1), fa(s.OneMinusBeta2), fa(s.Eps),
		fa(s.WeightDecay), fa(s.BiasCorrection1), fa(s.BiasCorrection2), fa(s.GradScale))
}
