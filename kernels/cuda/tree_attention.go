//go:build cgo

package cuda

// TreeAttention and TreeAttentionBackward: csrc/tree_attention.cu. Every
// call first runs tree_check (the rules of kernels.Tree, a data error when
// one breaks). F32 buffers run the fp32 kernels; BF16 buffers with HD 64 or
// 128 and 16-byte aligned q, k, v (and dout) run the tensor-core kernels;
// other BF16 calls run the fp32 kernels' bf16 instantiations, which widen as
// they load. The tiles and shared memory are attention.go's.

import (
	"fmt"
	"math"

	"github.com/tracegrpo/tracegrpo/kernels"
)

// checkTreeShape panics on a shape or dtype misuse of a tree call.
func checkTreeShape(op string, tree kernels.Tree, NH, NKV, HD int) {
	if NH <= 0 || NKV <= 0 || NH%NKV != 0 {
		panic(fmt.Sprintf("cuda: %s: NH %d is not a multiple of NKV %d", op, NH, NKV))
	}
	if HD <= 0 || HD > attMaxHD {
		panic(fmt.Sprintf("cuda: %s: head dimension %d outside [1, %d]", op, HD, attMaxHD))
	}
	want(tree.Offs, kernels.I32, tree.NS+1, op+" tree.Offs")
	want(tree.Parent, kernels.I32, tree.NS, op+" tree.Parent")
	want(tree.Ends, kernels.I32, tree.NS, op+" tree.Ends")
	if tree.NS > attMaxGridY {
		panic(fmt.Sprintf("cuda: %s: %d segments in one micro-batch (at most %d)", op, tree.NS, attMaxGridY))
	}
	if tree.MaxLen < 0 || tree.MaxCtx < 0 {
		panic(fmt.Sprintf("cuda: %s: Tree.MaxLen %d, Tree.MaxCtx %d", op, tree.MaxLen, tree.MaxCtx))
	}
}

// treeCheck queues tree_check for a stream of T tokens. The caller holds b.mu.
func (b *Backend) treeCheck(tree kernels.Tree, T int) {
	b.launch("tree_check", rw(reads(tree.Offs, tree.Parent, tree.Ends)), max(1, min(ceilDiv(tree.NS, threads), 32*b.d.info.SMs)), 1, 1, threads, 0,
		pa(tree.Offs), pa(tree.Parent), pa(tree.Ends), ia(tree.NS), ia(T), ia(tree.MaxLen), ia(tree.MaxCtx), pu(b.flags))
}

// treeFLOPs bounds the matrix operations of a tree pass over T tokens:
// every query sees at most MaxCtx keys (its ancestors' and its own
// segment's), gemms products per (query, key) pair of 2·HD each, NH heads.
func treeFLOPs(T, maxCtx, NH, HD, gemms int) int64 {
	return int64(T) * int64(maxCtx) * int64(NH) * int64(gemms) * 2 * int64(HD)
}

// TreeAttention implements kernels.Ops: out (T,NH,HD) =, lse (T,NH) =.
// q, k, v F32|BF16 (same), out F32|BF16, lse F32.
func (b *Backend) TreeAttention(out, lse, q, k, v kernels.Buf, tree kernels.Tree, NH, NKV, HD int) {
	T := q.N / max(1, NH*HD)
	checkTreeShape("TreeAttention", tree, NH, NKV, HD)
	dt := operands("TreeAttention q, k, v", q, k, v)
	operands("TreeAttention out", out)
	want(q, dt, T*NH*HD, "TreeAttention q")
	want(k, dt, T*NKV*HD, "TreeAttention k")
	want(v, dt, T*NKV*HD, "TreeAttention v")
	want(out, out.DType, T*NH*HD, "TreeAttention out")
	want(lse, kernels.F32, T*NH, "TreeAttention lse")
	scale := float32(1 / math.Sqrt(float64(HD)))
	defer b.lock()()
	b.treeCheck(tree, T)
	if T == 0 || tree.NS == 0 {
		return
	}
	if dt == kernels.BF16 && useTC(HD, q, k, v) {
		name := tcKernel(HD, "tree_fwd_tc_hd64_f32out", "tree_fwd_tc_hd128_f32out")
		if out.DType == kernels.BF16 {
			name = tcKernel(HD, "tree_fwd_tc_hd64_bf16out", "tree_fwd_tc_hd128_bf16out")
		}
		smem, _, _ := tcSmem(HD)
		c := rw(reads(q, k, v, tree.Offs, tree.Parent), out, lse).with(treeFLOPs(T, tree.MaxCtx, NH, HD, 2), 0)
		b.launch(name, c, ceilDiv(tree.MaxLen, tcRows), tree.NS, NH, attThreads, smem,
			pa(out), pa(lse), pa(q), pa(k), pa(v), pa(tree.Offs), pa(tree.Parent), ia(T), ia(NH), ia(NKV), fa(scale*log2e))
		return
	}
	name := "tree_fwd_f32" // fp32, or bf16 of another head dimension or an unaligned view
	switch {
	case dt == kernels.BF16 && out.DType == kernels.BF16:
		name = "tree_fwd_bf16"
	case dt == kernels.BF16:
		name = "tree_fwd_bf16_f32out"
	case out.DType == kernels.BF16:
		name = "tree_fwd_f32_bf16out"
	}
	smem := 4 * (attFwdRows*HD + attKeyTile*(HD+1) + attKeyTile*HD)
	c := rw(reads(q, k, v, tree.Offs, tree.Parent), out, lse).with(treeFLOPs(T, tree.MaxCtx, NH, HD, 2), 0)
	b.launch(name, c, ceilDiv(tree.MaxLen, attFwdRows), tree.NS, NH, attThreads, smem,
		pa(out), pa(lse), pa(q), pa(k), pa(v), pa(tree.Offs), pa(tree.Parent), ia(T), ia(NH), ia(NKV), ia(HD), fa(scale))
}

// TreeAttentionBackward implements kernels.Ops: dq (T,NH,HD) =, dk, dv
// (T,NKV,HD) =. dout, out, q, k, v F32|BF16 (same); dq, dk, dv, lse F32.
func (b *Backend) TreeAttentionBackward(dq, dk, dv, dout, out, lse, q, k, v kernels.Buf, tree kernels.Tree, NH, NKV, HD int) {
	T := q.N / max(1, NH*HD)
	checkTreeShape("TreeAttentionBackward", tree, NH, NKV, HD)
	dt := operands("TreeAttentionBackward dout, out, q, k, v", dout, out, q, k, v)
	for _, c := range []struct {
		b    kernels.Buf
		dt   kernels.DType
		n    int
		name string
	}{{dq, kernels.F32, T * NH * HD, "dq"}, {dk, kernels.F32, T * NKV * HD, "dk"}, {dv, kernels.F32, T * NKV * HD, "dv"},
		{dout, dt, T * NH * HD, "dout"}, {out, dt, T * NH * HD, "out"}, {lse, kernels.F32, T * NH, "lse"},
		{q, dt, T * NH * HD, "q"}, {k, dt, T * NKV * HD, "k"}, {v, dt, T * NKV * HD, "v"}} {
		want(c.b, c.dt, c.n, "TreeAttentionBackward "+c.name)
	}
	scale := float32(1 / math.Sqrt(float64(HD)))
	defer b.lock()()
	b.treeCheck(tree, T)
	if T == 0 || tree.NS == 0 {
		return
	}
	D := b.work(workAttnD, attnDWork(T, NH))
	if D == 0 {
		return
	}
	rows := T * NH
	dotBlocks := max(1, min(ceilDiv(rows, threads/32), 32*b.d.info.SMs))
	suffix := "_f32" // fp32, or bf16 of another head dimension or an unaligned view
	dot := "attention_bwd_dot"
	if dt == kernels.BF16 {
		suffix, dot = "_bf16", "attention_bwd_dot_bf16"
	}
	// D = rowsum(dout ∘ out), attention.cu's kernel, which both paths read.
	b.launch(dot, rw(reads(dout, out)).plus(0, int64(attnDWork(T, NH))).with(2*bytesOf(out)/int64(dt.Size()), 0),
		dotBlocks, 1, 1, threads, 0, pu(D), pa(dout), pa(out), la(rows), ia(HD))
	in := rw(reads(dout, lse, q, k, v, tree.Offs, tree.Parent, tree.Ends)).plus(int64(attnDWork(T, NH)), 0)
	cdq := in.plus(0, bytesOf(dq)).with(treeFLOPs(T, tree.MaxCtx, NH, HD, 3), 0)
	cdkdv := in.plus(0, bytesOf(dk, dv)).with(treeFLOPs(T, tree.MaxCtx, NH, HD, 4), 0)
	treeArgs := []uint64{pa(tree.Offs), pa(tree.Parent), pa(tree.Ends), ia(T), ia(NH), ia(NKV)}
	if dt == kernels.BF16 && useTC(HD, dout, q, k, v) {
		_, smemDq, smemDkdv := tcSmem(HD)
		args := append([]uint64{pa(dout), pa(lse), pu(D), pa(q), pa(k), pa(v)}, append(treeArgs, fa(scale), fa(scale*log2e))...)
		grid := ceilDiv(tree.MaxLen, tcRows)
		b.launch(tcKernel(HD, "tree_bwd_dq_tc_hd64", "tree_bwd_dq_tc_hd128"), cdq, grid, tree.NS, NH, attThreads, smemDq, append([]uint64{pa(dq)}, args...)...)
		b.launch(tcKernel(HD, "tree_bwd_dkdv_tc_hd64", "tree_bwd_dkdv_tc_hd128"), cdkdv, grid, tree.NS, NKV, attThreads, smemDkdv, append([]uint64{pa(dk), pa(dv)}, args...)...)
		return
	}
	args := append([]uint64{pa(dout), pa(lse), pu(D), pa(q), pa(k), pa(v)}, append(treeArgs, ia(HD), fa(scale))...)
	smemDq := 4 * (2*attDqRows*HD + 2*attKeyTile*(HD+1))
	b.launch("tree_bwd_dq"+suffix, cdq, ceilDiv(tree.MaxLen, attDqRows), tree.NS, NH, attThreads, smemDq, append([]uint64{pa(dq)}, args...)...)
	smemDk := 4 * (2*attDkRows*HD + 2*attKeyTile*(HD+1) + 2*attKeyTile)
	b.launch("tree_bwd_dkdv"+suffix, cdkdv, ceilDiv(tree.MaxLen, attDkRows), tree.NS, NKV, attThreads, smemDk, append([]uint64{pa(dk), pa(dv)}, args...)...)
}
