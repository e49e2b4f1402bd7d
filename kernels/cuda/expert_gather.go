//go:build cgo

package cuda

// ExpertGather and ExpertGatherBackward: csrc/expert_gather.cu.

import "github.com/tracegrpo/tracegrpo/kernels"

// ExpertGather implements kernels.Experts: dst (N,C) = src (T,C) rows in
// expert order; dst and src F32|BF16 (converted).
func (b *Backend) ExpertGather(dst, src, order kernels.Buf, T, K, C int) {
	N := T * K
	operands("ExpertGather dst", dst)
	operands("ExpertGather src", src)
	want(dst, dst.DType, N*C, "ExpertGather dst")
	want(src, src.DType, T*C, "ExpertGather src")
	want(order, kernels.I32, N, "ExpertGather order")
	if N == 0 || C == 0 {
		return
	}
	name := gatherKernels[[2]kernels.DType{dst.DType, src.DType}]
	defer b.lock()()
	b.launch(name, rw(reads(order), dst).plus(int64(N)*int64(C)*int64(src.DType.Size()), 0), b.rowBlocks(N), 1, 1, normThreads(C*8), 0, pa(dst), pa(src), pa(order), ia(T), ia(K), ia(C))
}

// gatherKernels names ExpertGather's kernel by (dst, src) dtype.
var gatherKernels = map[[2]kernels.DType]string{
	{kernels.F32, kernels.F32}: "expert_gather", {kernels.BF16, kernels.F32}: "expert_gather_bf16_f32",
	{kernels.BF16, kernels.BF16}: "expert_gather_bf16_bf16", {kernels.F32, kernels.BF16}: "expert_gather_f32_bf16",
}

// ExpertGatherBackward implements kernels.Experts: dsrc (T,C) += each
// token's K rows of ddst (N,C), in j order.
func (b *Backend) ExpertGatherBackward(dsrc, ddst, slot kernels.Buf, T, K, C int) {
	N := T * K
	want(dsrc, kernels.F32, T*C, "ExpertGatherBackward dsrc")
	want(ddst, kernels.F32, N*C, "ExpertGatherBackward ddst")
	want(slot, kernels.I32, N, "ExpertGatherBackward slot")
	if T == 0 || C == 0 {
		return
	}
	defer b.lock()()
	b.launch("expert_gather_bwd", rw(reads(ddst, slot), dsrc).with(int64(N)*int64(C), 0), b.rowBlocks(T), 1, 1, normThreads(C*8), 0, pa(dsrc), pa(ddst), pa(slot), ia(T), ia(K), ia(C))
}
