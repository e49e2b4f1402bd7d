//go:build cgo

package cuda

// Attention and AttentionBackward: csrc/attention.cu.

import (
	"fmt"
	"math"

	"github.com/tracegrpo/tracegrpo/kernels"
)

// Tile sizes of csrc/attention.cu.
const (
	attFwdRows  = 16
	attDqRows   = 8
	attDkRows   = 8
	attKeyTile  = 32
	attMaxHD    = 128
	attMaxGridY = 65535
	attThreads  = 128 // ATT_THREADS
)

func checkAttention(op string, seqs kernels.Seqs, NH, NKV, HD int) {
	if NH <= 0 || NKV <= 0 || NH%NKV != 0 {
		panic(fmt.Sprintf("cuda: %s: NH %d is not a multiple of NKV %d", op, NH, NKV))
	}
	if HD <= 0 || HD > attMaxHD {
		panic(fmt.Sprintf("cuda: %s: head dimension %d outside [1, %d]", op, HD, attMaxHD))
	}
	want(seqs.CuSeqlens, kernels.I32, seqs.S+1, op+" CuSeqlens")
	if seqs.S > attMaxGridY {
		panic(fmt.Sprintf("cuda: %s: %d sequences in one micro-batch (at most %d)", op, seqs.S, attMaxGridY))
	}
	if seqs.MaxLen < 0 {
		panic(fmt.Sprintf("cuda: %s: Seqs.MaxLen %d", op, seqs.MaxLen))
	}
}

func ceilDiv(a, b int) int { return (a + b - 1) / b }

// Attention implements kernels.Ops: out (T,NH,HD) =, lse (T,NH) =.
func (b *Backend) Attention(out, lse, q, k, v kernels.Buf, seqs kernels.Seqs, NH, NKV, HD int) {
	T := q.N / max(1, NH*HD)
	checkAttention("Attention", seqs, NH, NKV, HD)
	want(q, kernels.F32, T*NH*HD, "Attention q")
	want(k, kernels.F32, T*NKV*HD, "Attention k")
	want(v, kernels.F32, T*NKV*HD, "Attention v")
	want(out, kernels.F32, T*NH*HD, "Attention out")
	want(lse, kernels.F32, T*NH, "Attention lse")
	if T == 0 || seqs.S == 0 {
		return
	}
	scale := float32(1 / math.Sqrt(float64(HD)))
	smem := 4 * (attFwdRows*HD + attKeyTile*(HD+1) + attKeyTile*HD)
	defer b.lock()()
	b.launch("attention_fwd", ceilDiv(seqs.MaxLen, attFwdRows), seqs.S, NH, attThreads, smem,
		pa(out), pa(lse), pa(q), pa(k), pa(v), pa(seqs.CuSeqlens), ia(seqs.S), ia(T), ia(seqs.MaxLen), ia(NH), ia(NKV), ia(HD), fa(scale), pu(b.flags))
}

// AttentionBackward implements kernels.Ops: dq (T,NH,HD) =, dk, dv (T,NKV,HD) =.
func (b *Backend) AttentionBackward(dq, dk, dv, dout, out, lse, q, k, v kernels.Buf, seqs kernels.Seqs, NH, NKV, HD int) {
	T := q.N / max(1, NH*HD)
	checkAttention("AttentionBackward", seqs, NH, NKV, HD)
	for _, c := range []struct {
		b    kernels.Buf
		n    int
		name string
	}{{dq, T * NH * HD, "dq"}, {dk, T * NKV * HD, "dk"}, {dv, T * NKV * HD, "dv"}, {dout, T * NH * HD, "dout"},
		{out, T * NH * HD, "out"}, {lse, T * NH, "lse"}, {q, T * NH * HD, "q"}, {k, T * NKV * HD, "k"}, {v, T * NKV * HD, "v"}} {
		want(c.b, kernels.F32, c.n, "AttentionBackward "+c.name)
	}
	if T == 0 || seqs.S == 0 {
		return
	}
	scale := float32(1 / math.Sqrt(float64(HD)))
	defer b.lock()()
	D := b.work(workAttnD, attnDWork(T, NH))
	if D == 0 {
		return
	}
	rows := T * NH
	b.launch("attention_bwd_dot", max(1, min(ceilDiv(rows, threads/32), 32*b.d.info.SMs)), 1, 1, threads, 0,
		pu(D), pa(dout), pa(out), la(rows), ia(HD))
	smemDq := 4 * (2*attDqRows*HD + 2*attKeyTile*(HD+1))
	b.launch("attention_bwd_dq", ceilDiv(seqs.MaxLen, attDqRows), seqs.S, NH, attThreads, smemDq,
		pa(dq), pa(dout), pa(lse), pu(D), pa(q), pa(k), pa(v), pa(seqs.CuSeqlens), ia(seqs.S), ia(T), ia(seqs.MaxLen), ia(NH), ia(NKV), ia(HD), fa(scale), pu(b.flags))
	smemDk := 4 * (2*attDkRows*HD + 2*attKeyTile*(HD+1) + 2*attKeyTile)
	b.launch("attention_bwd_dkdv", ceilDiv(seqs.MaxLen, attDkRows), seqs.S, NKV, attThreads, smemDk,
		pa(dk), pa(dv), pa(dout), pa(lse), pu(D), pa(q), pa(k), pa(v), pa(seqs.CuSeqlens), ia(seqs.S), ia(T), ia(seqs.MaxLen), ia(NH), ia(NKV), ia(HD), fa(scale), pu(b.flags))
}
