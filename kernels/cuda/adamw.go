//go:build cgo

package cuda

// AdamW: csrc/adamw.cu.

import (
	"fmt"

	"github.com/tracegrpo/tracegrpo/kernels"
)

// AdamW implements kernels.Ops: param, m, v (N) updated in place from grad,
// under the step's rule (m and v F32, or BF16 under FusedAdam).
func (b *Backend) AdamW(param, grad, m, v kernels.Buf, s kernels.AdamWStep) {
	N := param.N
	want(param, kernels.F32, N, "AdamW param")
	want(grad, kernels.F32, N, "AdamW grad")
	kernels.CheckMoments("cuda", m, v, N, s.Rule)
	defer b.lock()()
	// param, m, v read and written, grad read; about 16 operations an element.
	c := rw(reads(param, grad, m, v), param, m, v).with(16*int64(N), 16)
	if s.Rule == kernels.FusedAdam {
		kernel := "fused_adam"
		if m.DType == kernels.BF16 {
			kernel = "fused_adam_bf16"
		}
		b.elementwise(kernel, c, N, pa(param), pa(grad), pa(m), pa(v), la(N),
			fa(s.LR), fa(s.Beta1), fa(s.Beta2), fa(s.OneMinusBeta1), fa(s.OneMinusBeta2), fa(s.Eps),
			fa(s.WeightDecay), fa(s.BiasCorrection1), fa(s.BiasCorrection2), fa(s.GradScale))
		return
	}
	b.elementwise("adamw", c, N, pa(param), pa(grad), pa(m), pa(v), la(N),
		fa(s.LR), fa(s.Beta1), fa(s.Beta2), fa(s.OneMinusBeta1), fa(s.OneMinusBeta2), fa(s.Eps),
		fa(s.WeightDecay), fa(s.BiasCorrection1), fa(s.BiasCorrection2), fa(s.GradScale))
}

// AdamWMulti implements kernels.MultiAdamW: csrc/adamw.cu's
// adamw_multi_prep (the clip factor and the non-finite gradient check, on
// the device) then one adamw_multi_* block per chunk of the table.
func (b *Backend) AdamWMulti(param, grad, m, v, sums, table, flags kernels.Buf, nsums, nchunks int, s kernels.AdamWStep, maxNorm float64) {
	N := param.N
	want(param, kernels.F32, N, "AdamWMulti param")
	want(grad, kernels.F32, N, "AdamWMulti grad")
	want(sums, kernels.F32, nsums, "AdamWMulti sums")
	want(table, kernels.I32, kernels.AdamChunkWords*nchunks, "AdamWMulti table")
	if flags.DType != kernels.I32 || flags.N < 3 {
		panic(fmt.Sprintf("cuda: AdamWMulti flags: %d %s, want at least 3 I32", flags.N, flags.DType))
	}
	kernels.CheckMoments("cuda", m, v, N, s.Rule)
	defer b.lock()()
	groups := flags.N - 2
	b.launch("adamw_multi_prep", cost{read: 4 * int64(nsums), write: 4 * int64(flags.N)}, b.gridBlocks(max(1, min((groups+threads-1)/threads, 64))), 1, 1, threads, 0,
		pa(flags), pa(sums), ia(nsums), ia(groups), da(maxNorm))
	kernel := "adamw_multi_torch"
	if s.Rule == kernels.FusedAdam {
		kernel = "adamw_multi_fused"
		if m.DType == kernels.BF16 {
			kernel = "adamw_multi_fused_bf16"
		}
	}
	if nchunks == 0 {
		return
	}
	// As AdamW over the chunks' elements (at most N), plus the table.
	c := rw(reads(param, grad, m, v, table), param, m, v).with(16*int64(N), 16)
	b.launch(kernel, c, b.gridBlocks(min(nchunks, 64*b.d.info.SMs)), 1, 1, threads, 0,
		pa(param), pa(grad), pa(m), pa(v), pa(table), ia(nchunks), pa(flags),
		fa(s.LR), fa(s.Beta1), fa(s.Beta2), fa(s.OneMinusBeta1), fa(s.OneMinusBeta2), fa(s.Eps),
		fa(s.WeightDecay), fa(s.BiasCorrection1), fa(s.BiasCorrection2))
}

var _ kernels.MultiAdamW = (*Backend)(nil)
