//go:build cgo

package cuda

// RMSNorm and RMSNormBackward: csrc/rmsnorm.cu.

import "github.com/tracegrpo/tracegrpo/kernels"

// normThreads is the block of a one-block-per-row norm over C columns:
// enough warps for C/8 threads (the 16-byte path's 8 elements each), at
// most 256.
func normThreads(C int) int { return min(threads, max(32, (C/8+31)/32*32)) }

// normVec is the vec argument of the norm kernels: 1 when C is a multiple of
// 8 and every buffer starts 16-byte aligned (so does every row then).
func normVec(C int, bufs ...kernels.Buf) uint64 {
	if C%8 != 0 {
		return 0
	}
	for _, x := range bufs {
		if ptr(x)%16 != 0 {
			return 0
		}
	}
	return 1
}

// normInflight is the bytes of loads a thread of a row kernel keeps in
// flight: two 16-byte loads (ld8) on the vector path, one 4-byte load
// otherwise.
func normInflight(C int, bufs ...kernels.Buf) int {
	if normVec(C, bufs...) == 1 {
		return 32
	}
	return 4
}

// RMSNorm implements kernels.Ops: out (N,C) =, rstd (N) =; out F32|BF16
// (the cast to the next GEMM's input fused into the norm).
func (b *Backend) RMSNorm(out, rstd, inp, weight kernels.Buf, N, C int, eps float32) {
	operands("RMSNorm out", out)
	want(out, out.DType, N*C, "RMSNorm out")
	want(rstd, kernels.F32, N, "RMSNorm rstd")
	want(inp, kernels.F32, N*C, "RMSNorm inp")
	want(weight, kernels.F32, C, "RMSNorm weight")
	if N == 0 {
		return
	}
	name := "rmsnorm_fwd"
	if out.DType == kernels.BF16 {
		name = "rmsnorm_fwd_bf16"
	}
	defer b.lock()()
	c := rw(reads(inp, weight), out, rstd).with(4*int64(N)*int64(C), normInflight(C, out, inp, weight))
	b.launch(name, c, b.rowBlocks(N), 1, 1, normThreads(C), 0,
		pa(out), pa(rstd), pa(inp), pa(weight), ia(N), ia(C), fa(eps), normVec(C, out, inp, weight))
}

// rmsnormBwdKernels names the group kernels of csrc/rmsnorm.cu by
// (threads a row, column chunks a thread).
var rmsnormBwdKernels = map[[2]int]string{
	{8, 1}: "rmsnorm_bwd_g8_c1", {16, 1}: "rmsnorm_bwd_g16_c1", {32, 1}: "rmsnorm_bwd_g32_c1", {64, 1}: "rmsnorm_bwd_g64_c1",
	{128, 1}: "rmsnorm_bwd_g128_c1", {256, 1}: "rmsnorm_bwd_g256_c1", {256, 2}: "rmsnorm_bwd_g256_c2", {256, 4}: "rmsnorm_bwd_g256_c4",
}

// RMSNormBackward implements kernels.Ops: dinp (N,C) +=, dweight (C) +=.
// Each block writes its rows' dweight sums into a row of partials (G of
// them, normBwdGrid: a function of N and C), which rmsnorm_dw_reduce adds
// in block order: deterministic on every device.
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
	G, R := normBwdGrid(N, C)
	if b.opt.maxBlocks > 0 && G > b.opt.maxBlocks { // tests: fewer blocks, more rows each
		G = b.opt.maxBlocks
		R = ceilDiv(N, G)
		G = ceilDiv(N, R)
	}
	defer b.lock()()
	partial := b.work(workNorm, normWork(N, C))
	if partial == 0 {
		return
	}
	pb := int64(G) * int64(C) * 4
	c := rw(reads(dinp, dout, inp, weight, rstd), dinp).plus(0, pb).with(8*int64(N)*int64(C), 0)
	if T, nch, ok := normBwdShape(C); ok {
		c.inflight = 64 * nch // a row's dout and inp columns, 8 of each per chunk
		b.launch(rmsnormBwdKernels[[2]int{T, nch}], c, G, 1, 1, normBwdThreads, 0,
			pa(dinp), pu(partial), pa(dout), pa(inp), pa(weight), pa(rstd), ia(N), ia(C), ia(R), normVec(C, dinp, dout, inp, weight))
	} else {
		b.launch("rmsnorm_bwd", c, G, 1, 1, normThreads(C), 0,
			pa(dinp), pu(partial), pa(dout), pa(inp), pa(weight), pa(rstd), ia(N), ia(C), ia(R))
	}
	b.launch("rmsnorm_dw_reduce", rw(reads(dweight), dweight).plus(pb, 0).with(pb/4, 16), ceilDiv(C, 32), 1, 1, normBwdThreads, 0,
		pa(dweight), pu(partial), ia(G), ia(C))
}
