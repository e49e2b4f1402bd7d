//go:build cgo

package cuda

// TokenLogprob and TokenLogprobBackward: csrc/token_logprob.cu with cuBLAS
// forming one (T, Vc) logits chunk at a time.

import (
	"fmt"

	"github.com/tracegrpo/tracegrpo/kernels"
)

// vocabChunk is the vocabulary chunk width for T rows (workspace.go).
func (b *Backend) vocabChunk(T, V int) int { return vocabChunk(b.opt.LogitsScratch, T, V) }

func checkLogprob(op string, hidden, weight, targets kernels.Buf, T, C, V int) {
	if T < 0 || C <= 0 || V <= 0 {
		panic(fmt.Sprintf("cuda: %s: T %d C %d V %d", op, T, C, V))
	}
	want(hidden, kernels.F32, T*C, op+" hidden")
	want(weight, kernels.F32, V*C, op+" weight")
	want(targets, kernels.I32, T, op+" targets")
}

// TokenLogprob implements kernels.Ops: logprob, entropy, lse (T) =.
func (b *Backend) TokenLogprob(logprob, entropy, lse, hidden, weight, targets kernels.Buf, T, C, V int, invTemp float32) {
	checkLogprob("TokenLogprob", hidden, weight, targets, T, C, V)
	want(logprob, kernels.F32, T, "TokenLogprob logprob")
	want(entropy, kernels.F32, T, "TokenLogprob entropy")
	want(lse, kernels.F32, T, "TokenLogprob lse")
	if T == 0 {
		return
	}
	defer b.lock()()
	Vc := b.vocabChunk(T, V)
	logits := b.work(workLogits, 4*T*Vc)
	state := b.work(workLogprobState, 16*T)
	if logits == 0 || state == 0 {
		return
	}
	b.elementwise("logprob_init", T, pu(state), ia(T))
	for v0 := 0; v0 < V; v0 += Vc {
		vc := min(Vc, V-v0)
		wc := ptr(weight) + uintptr(4*v0*C)
		b.gemm(true, false, vc, T, C, invTemp, kernels.F32, wc, C, vc*C, ptr(hidden), C, T*C, 0, kernels.F32, logits, vc)
		b.launch("logprob_chunk", min(T, 64*b.d.info.SMs), 1, 1, threads, 0,
			pu(state), pu(logits), pa(targets), ia(T), ia(vc), ia(v0), ia(V))
	}
	b.elementwise("logprob_finish", T, pa(logprob), pa(entropy), pa(lse), pu(state), pa(targets), ia(T), ia(V), pu(b.flags))
}

// TokenLogprobBackward implements kernels.Ops: dhidden (T,C) +=, dweight (V,C) +=.
// A zero-length dhidden or dweight is skipped.
func (b *Backend) TokenLogprobBackward(dhidden, dweight, dlogprob, hidden, weight, targets, lse kernels.Buf, T, C, V int, invTemp float32) {
	checkLogprob("TokenLogprobBackward", hidden, weight, targets, T, C, V)
	want(dlogprob, kernels.F32, T, "TokenLogprobBackward dlogprob")
	want(lse, kernels.F32, T, "TokenLogprobBackward lse")
	if dhidden.N != 0 {
		want(dhidden, kernels.F32, T*C, "TokenLogprobBackward dhidden")
	}
	if dweight.N != 0 {
		want(dweight, kernels.F32, V*C, "TokenLogprobBackward dweight")
	}
	if T == 0 {
		return
	}
	defer b.lock()()
	Vc := b.vocabChunk(T, V)
	dz := b.work(workLogits, 4*T*Vc)
	if dz == 0 {
		return
	}
	for v0 := 0; v0 < V; v0 += Vc {
		vc := min(Vc, V-v0)
		wc := ptr(weight) + uintptr(4*v0*C)
		b.gemm(true, false, vc, T, C, invTemp, kernels.F32, wc, C, vc*C, ptr(hidden), C, T*C, 0, kernels.F32, dz, vc)
		b.elementwise("logprob_bwd_chunk", T*vc, pu(dz), pa(lse), pa(dlogprob), pa(targets), ia(T), ia(vc), ia(v0), ia(V), fa(invTemp))
		if dhidden.N != 0 {
			b.gemm(false, false, C, T, vc, 1, kernels.F32, wc, C, vc*C, dz, vc, T*vc, 1, kernels.F32, ptr(dhidden), C)
		}
		if dweight.N != 0 {
			b.gemm(false, true, C, vc, T, 1, kernels.F32, ptr(hidden), C, T*C, dz, vc, T*vc, 1, kernels.F32, ptr(dweight)+uintptr(4*v0*C), C)
		}
	}
}
