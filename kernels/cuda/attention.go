//go:build cgo

package cuda

// Attention and AttentionBackward: csrc/attention.cu. F32 buffers run the
// fp32 kernels; BF16 buffers with HD 64 or 128 and 16-byte aligned q, k, v
// (and dout) run the tensor-core kernels; other BF16 calls run the fp32
// kernels' bf16 instantiations, which widen as they load (correct, not
// fast, and without scratch).

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

// The ledger's counts of the attention kernels. The host knows T, the
// number of sequences and the longest, not each length: the counts take
// every sequence MaxLen long (T/MaxLen of them), exact for equal lengths
// and an upper bound otherwise (a sum of squared lengths is at most MaxLen
// times their sum).

// rowTiles is the (query tile, key tile) pairs a causal pass over one
// sequence of L tokens visits with R query rows and K keys a tile: query
// tile i sees the key tiles up to its last row.
func rowTiles(L, R, K int) int64 {
	var n int64
	for i := 0; i*R < L; i++ {
		n += int64(ceilDiv(min(L, (i+1)*R), K))
	}
	return n
}

// keyTiles is the (key tile, query tile) pairs of a causal pass that walks,
// for each tile of MK keys, the query tiles of NQ from its first key on.
func keyTiles(L, MK, NQ int) int64 {
	var n int64
	for j := 0; j*MK < L; j++ {
		n += int64(ceilDiv(L-j*MK, NQ))
	}
	return n
}

// attnFLOPs is the matrix operations of a pass over T tokens in sequences
// of maxLen: tiles pairs per sequence of R×K tiles, gemms products of
// (R,HD)·(HD,K) size per pair, for each of NH heads.
func attnFLOPs(T, maxLen, NH, HD int, tiles int64, R, K, gemms int) int64 {
	if maxLen <= 0 {
		return 0
	}
	seqs := float64(T) / float64(maxLen)
	return int64(seqs * float64(tiles) * float64(NH) * float64(gemms) * 2 * float64(R) * float64(K) * float64(HD))
}

// Tiles of the tensor-core kernels (csrc/attention.cu's TC_ROWS and the
// key/query tiles of each head dimension) and their shared memory: tiles of
// rows × (HD+8) bf16.
const (
	tcRows  = 64
	log2e   = 1.4426950408889634
	tcAlign = 16 // cp.async and ldmatrix move 16-byte chunks
)

// tcTiles returns the dq kernel's key tile and the dkdv kernel's query tile.
func tcTiles(HD int) (dqKeys, dkdvQueries int) {
	if HD == 128 {
		return 32, 32
	}
	return 64, 64
}

// tcSmem returns the dynamic shared memory of the forward, dq and dkdv
// tensor-core kernels for head dimension HD.
func tcSmem(HD int) (fwd, dq, dkdv int) {
	nk, nq := tcTiles(HD)
	row := 2 * (HD + 8)
	return 3 * tcRows * row, (2*tcRows + 4*nk) * row, (2*tcRows+4*nq)*row + 2*2*nq*4
}

// tcSmemDqDS is the dynamic shared memory of the packed backward's dq
// kernel (attention_bwd_dq_ds_tc): two buffers of a dS tile (64 rows of 64
// keys, padded to 72) and a K tile.
func tcSmemDqDS(HD int) int { return 2 * (tcRows*(64+8) + 64*(HD+8)) * 2 }

// useTC reports whether the tensor-core kernels run for these operands:
// BF16, HD 64 or 128, every base address 16-byte aligned (the rows of a
// head then are too, HD·2 bytes being a multiple of 16).
func useTC(HD int, bufs ...kernels.Buf) bool {
	if HD != 64 && HD != 128 {
		return false
	}
	for _, x := range bufs {
		if x.DType != kernels.BF16 || ptr(x)%tcAlign != 0 {
			return false
		}
	}
	return true
}

// Attention implements kernels.Ops: out (T,NH,HD) =, lse (T,NH) =.
// q, k, v F32|BF16 (same), out F32|BF16, lse F32.
func (b *Backend) Attention(out, lse, q, k, v kernels.Buf, seqs kernels.Seqs, NH, NKV, HD int) {
	T := q.N / max(1, NH*HD)
	checkAttention("Attention", seqs, NH, NKV, HD)
	dt := operands("Attention q, k, v", q, k, v)
	operands("Attention out", out)
	want(q, dt, T*NH*HD, "Attention q")
	want(k, dt, T*NKV*HD, "Attention k")
	want(v, dt, T*NKV*HD, "Attention v")
	want(out, out.DType, T*NH*HD, "Attention out")
	want(lse, kernels.F32, T*NH, "Attention lse")
	if T == 0 || seqs.S == 0 {
		return
	}
	scale := float32(1 / math.Sqrt(float64(HD)))
	defer b.lock()()
	if dt == kernels.BF16 && useTC(HD, q, k, v) {
		name := tcKernel(HD, "attention_fwd_tc_hd64_f32out", "attention_fwd_tc_hd128_f32out")
		if out.DType == kernels.BF16 {
			name = tcKernel(HD, "attention_fwd_tc_hd64_bf16out", "attention_fwd_tc_hd128_bf16out")
		}
		smem, _, _ := tcSmem(HD)
		c := rw(reads(q, k, v, seqs.CuSeqlens), out, lse).with(attnFLOPs(T, seqs.MaxLen, NH, HD, rowTiles(seqs.MaxLen, tcRows, 64), tcRows, 64, 2), 0)
		b.launch(name, c, ceilDiv(seqs.MaxLen, tcRows), seqs.S, NH, attThreads, smem,
			pa(out), pa(lse), pa(q), pa(k), pa(v), pa(seqs.CuSeqlens), ia(seqs.S), ia(T), ia(seqs.MaxLen), ia(NH), ia(NKV), fa(scale*log2e), pu(b.flags))
		return
	}
	name := "attention_fwd" // fp32, or bf16 of another head dimension or an unaligned view
	switch {
	case dt == kernels.BF16 && out.DType == kernels.BF16:
		name = "attention_fwd_bf16"
	case dt == kernels.BF16:
		name = "attention_fwd_bf16_f32out"
	case out.DType == kernels.BF16:
		name = "attention_fwd_bf16out"
	}
	smem := 4 * (attFwdRows*HD + attKeyTile*(HD+1) + attKeyTile*HD)
	c := rw(reads(q, k, v, seqs.CuSeqlens), out, lse).with(attnFLOPs(T, seqs.MaxLen, NH, HD, rowTiles(seqs.MaxLen, attFwdRows, attKeyTile), attFwdRows, attKeyTile, 2), 0)
	b.launch(name, c, ceilDiv(seqs.MaxLen, attFwdRows), seqs.S, NH, attThreads, smem,
		pa(out), pa(lse), pa(q), pa(k), pa(v), pa(seqs.CuSeqlens), ia(seqs.S), ia(T), ia(seqs.MaxLen), ia(NH), ia(NKV), ia(HD), fa(scale), pu(b.flags))
}

// AttentionBackward implements kernels.Ops: dq (T,NH,HD) =, dk, dv (T,NKV,HD) =.
// dout, out, q, k, v F32|BF16 (same); dq, dk, dv, lse F32.
func (b *Backend) AttentionBackward(dq, dk, dv, dout, out, lse, q, k, v kernels.Buf, seqs kernels.Seqs, NH, NKV, HD int) {
	T := q.N / max(1, NH*HD)
	checkAttention("AttentionBackward", seqs, NH, NKV, HD)
	dt := operands("AttentionBackward dout, out, q, k, v", dout, out, q, k, v)
	for _, c := range []struct {
		b    kernels.Buf
		dt   kernels.DType
		n    int
		name string
	}{{dq, kernels.F32, T * NH * HD, "dq"}, {dk, kernels.F32, T * NKV * HD, "dk"}, {dv, kernels.F32, T * NKV * HD, "dv"},
		{dout, dt, T * NH * HD, "dout"}, {out, dt, T * NH * HD, "out"}, {lse, kernels.F32, T * NH, "lse"},
		{q, dt, T * NH * HD, "q"}, {k, dt, T * NKV * HD, "k"}, {v, dt, T * NKV * HD, "v"}} {
		want(c.b, c.dt, c.n, "AttentionBackward "+c.name)
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
	dotBlocks := b.gridBlocks(max(1, min(ceilDiv(rows, threads/32), 32*b.d.info.SMs)))
	suffix := "" // fp32, or bf16 of another head dimension or an unaligned view
	if dt == kernels.BF16 {
		suffix = "_bf16"
	}
	// D = rowsum(dout ∘ out), which both paths read.
	b.launch("attention_bwd_dot"+suffix, rw(reads(dout, out)).plus(0, int64(attnDWork(T, NH))).with(2*bytesOf(out)/int64(dt.Size()), 0),
		dotBlocks, 1, 1, threads, 0, pu(D), pa(dout), pa(out), la(rows), ia(HD))
	in := rw(reads(dout, lse, q, k, v, seqs.CuSeqlens)).plus(int64(attnDWork(T, NH)), 0)
	if dt == kernels.BF16 && useTC(HD, dout, q, k, v) && attnDSFits(T, NH, seqs.MaxLen) {
		// dk, dv and the dS scratch in one pass over each key block's
		// queries, then dq = dS·K from the scratch: five products a (query,
		// key) tile pair, none recomputed (FlashAttention-2's dq kernel
		// recomputes S and dP: seven).
		bt := attnDSStride(seqs.MaxLen)
		ds := b.work(workAttnDS, attnDSWork(T, NH, seqs.MaxLen))
		if ds == 0 {
			return
		}
		_, _, smemDkdv := tcSmem(HD)
		grid := ceilDiv(seqs.MaxLen, tcRows)
		_, nq := tcTiles(HD)
		dsBytes := attnDSBytes(T, NH, seqs.MaxLen)
		// In flight a thread: the dkdv kernel's next query tile (q and
		// dout, nq rows of HD bf16, in 16-byte cp.async chunks over the
		// block) is issued before it computes on this one; dq's next dS and
		// K tiles likewise.
		inDkdv, inDq := 2*nq*HD*2/attThreads, (tcRows*64+64*HD)*2/attThreads
		cdkdv := in.plus(0, bytesOf(dk, dv)+dsBytes).with(attnFLOPs(T, seqs.MaxLen, NH, HD, keyTiles(seqs.MaxLen, tcRows, nq), tcRows, nq, 4), inDkdv)
		b.launch(tcKernel(HD, "attention_bwd_dkdv_tc_hd64", "attention_bwd_dkdv_tc_hd128"), cdkdv, grid, seqs.S, NKV, attThreads, smemDkdv,
			pa(dk), pa(dv), pu(ds), la(bt), pa(dout), pa(lse), pu(D), pa(q), pa(k), pa(v), pa(seqs.CuSeqlens), ia(seqs.S), ia(T), ia(seqs.MaxLen),
			ia(NH), ia(NKV), fa(scale), fa(scale*log2e), pu(b.flags))
		cdq := rw(reads(k, seqs.CuSeqlens), dq).plus(dsBytes, 0).with(attnFLOPs(T, seqs.MaxLen, NH, HD, rowTiles(seqs.MaxLen, tcRows, 64), tcRows, 64, 1), inDq)
		b.launch(tcKernel(HD, "attention_bwd_dq_ds_tc_hd64", "attention_bwd_dq_ds_tc_hd128"), cdq, grid, seqs.S, NH, attThreads, tcSmemDqDS(HD),
			pa(dq), pu(ds), la(bt), pa(k), pa(seqs.CuSeqlens), ia(seqs.S), ia(T), ia(seqs.MaxLen), ia(NH), ia(NKV), fa(scale), pu(b.flags))
		return
	}
	// fp32, bf16 of another head dimension or an unaligned view, or a dS
	// scratch over attnDSMaxBytes: dq recomputes S and dP, no scratch.
	smemDq := 4 * (2*attDqRows*HD + 2*attKeyTile*(HD+1))
	cdq := in.plus(0, bytesOf(dq)).with(attnFLOPs(T, seqs.MaxLen, NH, HD, rowTiles(seqs.MaxLen, attDqRows, attKeyTile), attDqRows, attKeyTile, 3), 0)
	b.launch("attention_bwd_dq"+suffix, cdq, ceilDiv(seqs.MaxLen, attDqRows), seqs.S, NH, attThreads, smemDq,
		pa(dq), pa(dout), pa(lse), pu(D), pa(q), pa(k), pa(v), pa(seqs.CuSeqlens), ia(seqs.S), ia(T), ia(seqs.MaxLen), ia(NH), ia(NKV), ia(HD), fa(scale), pu(b.flags))
	smemDk := 4 * (2*attDkRows*HD + 2*attKeyTile*(HD+1) + 2*attKeyTile)
	cdkdv := in.plus(0, bytesOf(dk, dv)).with(attnFLOPs(T, seqs.MaxLen, NH, HD, keyTiles(seqs.MaxLen, attDkRows, attKeyTile), attDkRows, attKeyTile, 4), 0)
	b.launch("attention_bwd_dkdv"+suffix, cdkdv, ceilDiv(seqs.MaxLen, attDkRows), seqs.S, NKV, attThreads, smemDk,
		pa(dk), pa(dv), pa(dout), pa(lse), pu(D), pa(q), pa(k), pa(v), pa(seqs.CuSeqlens), ia(seqs.S), ia(T), ia(seqs.MaxLen), ia(NH), ia(NKV), ia(HD), fa(scale), pu(b.flags))
}

// tcKernel picks a tensor-core kernel's name by head dimension (64 or 128,
// the dimensions useTC admits) without formatting one per launch.
func tcKernel(HD int, hd64, hd128 string) string {
	if HD == 64 {
		return hd64
	}
	return hd128
}
