//go:build cgo

package cuda

// RMSNorm and RMSNormBackward: csrc/rmsnorm.cu.

import "github.com/tracegrpo/tracegrpo/kernels"

func normThreads(C int) int { return min(threads, max(32, (C+31)/32*32)) }

// RMSNorm implements kernels.Ops: out (N,C) =, rstd (N) =.
func (b *Backend) RMSNorm(out, rstd, inp, weight kernels.Buf, N, C int, eps float32) {
	want(out, kernels.F32, N*C, "RMSNorm out")
	want(rstd, kernels.F32, N, "RMSNorm rstd")
	want(inp, kernels.F32, N*C, "RMSNorm inp")
	want(weight, kernels.F32, C, "RMSNorm weight")
	if N == 0 {
		return
	}
	defer b.lock()()
	b.launch("rmsnorm_fwd", min(N, 64*b.d.info.SMs), 1, 1, normThreads(C), 0,
		pa(out), pa(rstd), pa(inp), pa(weight), ia(N), ia(C), fa(eps))
}

// RMSNormBackward implements kernels.Ops: dinp (N,C) +=, dweight (C) +=.
func (b *Backend) RMSNormBackward(dinp, dweight, dout, inp, weight, rstd kernels.Buf, N, C int) {
	want(dinp, kernels.F32, N*C, "RMSNormBackward dinp")
	want(dweight, kernels.F32, C, "RMSNormBackward dweight")
	want(dout, kernels.F32, N*C, "RMSNormBackward dout")
	want(inp, kernels.F32, N*C, "RMSNormBackward inp")
	want(weight, kernels.F32, C, "RMSNormBackward weight")
	want(rstd, kernels.F32, N, "RMSNormBackward rstd")
	if N == 0 {
		return
	}
	G := min(N, normBwdBlocks)
	defer b.lock()()
	partial := b.work(workNorm, normWork(N, C))
	if partial == 0 {
		return
	}
	b.launch("rmsnorm_bwd", G, 1, 1, normThreads(C), 0,
		pa(dinp), pu(partial), pa(dout), pa(inp), pa(weight), pa(rstd), ia(N), ia(C))
	b.elementwise("rmsnorm_dw_reduce", C, pa(dweight), pu(partial), ia(G), ia(C))
}
