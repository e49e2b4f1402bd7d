//go:build cgo

package cuda

// Embedding and EmbeddingBackward: csrc/embedding.cu.

import (
	"fmt"

	"github.com/tracegrpo/tracegrpo/kernels"
)

func vocab(wte kernels.Buf, C int, op string) int {
	if C <= 0 || wte.N%C != 0 || wte.DType != kernels.F32 {
		panic(fmt.Sprintf("cuda: %s: table of %d × %s is not (V, %d) F32", op, wte.N, wte.DType, C))
	}
	return wte.N / C
}

// Embedding implements kernels.Ops: out (T,C) = wte (V,C) [tokens (T)].
func (b *Backend) Embedding(out, wte, tokens kernels.Buf, T, C int) {
	V := vocab(wte, C, "Embedding")
	want(out, kernels.F32, T*C, "Embedding out")
	want(tokens, kernels.I32, T, "Embedding tokens")
	defer b.lock()()
	// The rows of wte the tokens name (at most T of them) and the tokens.
	c := rw(reads(tokens), out).plus(int64(T)*int64(C)*4, 0)
	b.elementwise("embedding_fwd", c, T*C, pa(out), pa(wte), pa(tokens), ia(T), ia(C), ia(V), pu(b.flags))
}

// embedBwdBuckets is the number of vocabulary buckets (v mod K) the
// deterministic backward spreads over the grid's y dimension.
const embedBwdBuckets = 64

// EmbeddingBackward implements kernels.Ops: dwte (V,C) += scatter-add of
// dout (T,C), each element summed in token order (bitwise equal to the CPU).
func (b *Backend) EmbeddingBackward(dwte, dout, tokens kernels.Buf, T, C int) {
	V := vocab(dwte, C, "EmbeddingBackward")
	want(dout, kernels.F32, T*C, "EmbeddingBackward dout")
	want(tokens, kernels.I32, T, "EmbeddingBackward tokens")
	if T == 0 {
		return
	}
	defer b.lock()()
	// Each block scans the tokens; dout is read once, and the rows of dwte
	// the tokens name (at most T) read and written.
	bx, by := (C+threads-1)/threads, min(V, embedBwdBuckets)
	rows := int64(min(T, V)) * int64(C) * 4
	c := rw(reads(dout)).plus(int64(bx*by)*int64(T)*4+rows, rows).with(int64(T)*int64(C), 0)
	b.launch("embedding_bwd", c, bx, by, 1, threads, 0,
		pa(dwte), pa(dout), pa(tokens), ia(T), ia(C), ia(V))
}
