//go:build cgo

package cuda

// ExpertCombine and ExpertCombineBackward: csrc/expert_combine.cu.

import "github.com/tracegrpo/tracegrpo/kernels"

// ExpertCombine implements kernels.Experts: out (T,C) = each token's K
// expert outputs y (N,C), weighted, in j order.
func (b *Backend) ExpertCombine(out, y, weights, slot kernels.Buf, T, K, C int) {
	N := T * K
	want(out, kernels.F32, T*C, "ExpertCombine out")
	want(y, kernels.F32, N*C, "ExpertCombine y")
	want(weights, kernels.F32, T*K, "ExpertCombine weights")
	want(slot, kernels.I32, N, "ExpertCombine slot")
	if T == 0 || C == 0 {
		return
	}
	defer b.lock()()
	b.launch("expert_combine", rw(reads(y, weights, slot), out).with(2*int64(N)*int64(C), 0), b.rowBlocks(T), 1, 1, normThreads(C*8), 0, pa(out), pa(y), pa(weights), pa(slot), ia(T), ia(K), ia(C))
}

// ExpertCombineBackward implements kernels.Experts: dy (N,C) = (F32|BF16)
// and dweights (T,K) = from dout (T,C).
func (b *Backend) ExpertCombineBackward(dy, dweights, dout, y, weights, order, slot kernels.Buf, T, K, C int) {
	N := T * K
	operands("ExpertCombineBackward dy", dy)
	want(dy, dy.DType, N*C, "ExpertCombineBackward dy")
	want(dweights, kernels.F32, T*K, "ExpertCombineBackward dweights")
	want(dout, kernels.F32, T*C, "ExpertCombineBackward dout")
	want(y, kernels.F32, N*C, "ExpertCombineBackward y")
	want(weights, kernels.F32, T*K, "ExpertCombineBackward weights")
	want(order, kernels.I32, N, "ExpertCombineBackward order")
	want(slot, kernels.I32, N, "ExpertCombineBackward slot")
	if T == 0 {
		return
	}
	name := "expert_combine_bwd_dy"
	if dy.DType == kernels.BF16 {
		name = "expert_combine_bwd_dy_bf16"
	}
	defer b.lock()()
	if C > 0 {
		b.launch(name, rw(reads(weights, order), dy).plus(int64(N)*int64(C)*4, 0).with(int64(N)*int64(C), 0), b.rowBlocks(N), 1, 1, normThreads(C*8), 0, pa(dy), pa(dout), pa(weights), pa(order), ia(T), ia(K), ia(C))
	}
	b.launch("expert_combine_bwd_dw", rw(reads(y, slot), dweights).plus(int64(N)*int64(C)*4, 0).with(2*int64(N)*int64(C), 0), b.rowBlocks(T), 1, 1, normThreads(C*8), 0, pa(dweights), pa(dout), pa(y), pa(slot), ia(T), ia(K), ia(C))
}
