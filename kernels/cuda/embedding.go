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
	b.elementwise("embedding_fwd", T*C, pa(out), pa(wte), pa(tokens), ia(T), ia(C), ia(V), pu(b.flags))
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
	b.launch("embedding_bwd", (C+threads-1)/threads, min(V, embedBwdBuckets), 1, threads, 0,
		pa(dwte), pa(dout), pa(tokens), ia(T), ia(C), ia(V))
}
