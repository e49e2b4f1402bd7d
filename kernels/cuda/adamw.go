//go:build cgo

package cuda

// AdamW: csrc/adamw.cu.

import "github.com/tracegrpo/tracegrpo/kernels"

// AdamW implements kernels.Ops: param, m, v (N) updated in place from grad,
// under the step's rule (m and v F32, or BF16 under FusedAdam).
func (b *Backend) AdamW(param, grad, m, v kernels.Buf, s kernels.AdamWStep) {
	N := param.N
	want(param, kernels.F32, N, "AdamW param")
	want(grad, kernels.F32, N, "AdamW grad")
	kernels.CheckMoments("cuda", m, v, N, s.Rule)
	defer b.lock()()
	if s.Rule == kernels.FusedAdam {
		kernel := "fused_adam"
		if m.DType == kernels.BF16 {
			kernel = "fused_adam_bf16"
		}
		b.elementwise(kernel, N, pa(param), pa(grad), pa(m), pa(v), la(N),
			fa(s.LR), fa(s.Beta1), fa(s.Beta2), fa(s.OneMinusBeta1), fa(s.OneMinusBeta2), fa(s.Eps),
			fa(s.WeightDecay), fa(s.BiasCorrection1), fa(s.BiasCorrection2), fa(s.GradScale))
		return
	}
	b.elementwise("adamw", N, pa(param), pa(grad), pa(m), pa(v), la(N),
		fa(s.LR), fa(s.Beta1), fa(s.Beta2), fa(s.OneMinusBeta1), fa(s.OneMinusBeta2), fa(s.Eps),
		fa(s.WeightDecay), fa(s.BiasCorrection1), fa(s.BiasCorrection2), fa(s.GradScale))
}
