//go:build cgo

package cuda

// TokenLogprob and TokenLogprobBackward: csrc/token_logprob.cu with cuBLAS
// forming one (T, Vc) fp32 logits chunk at a time. BF16 hidden and weight
// (the LM head of mixed precision) multiply on bf16 tensor cores with fp32
// accumulation (cublasGemmEx; see doc.go for why not cuBLASLt), and the
// backward's dz chunk is rounded to bf16 for its two GEMMs.

import (
	"fmt"

	"github.com/tracegrpo/tracegrpo/kernels"
)

// vocabChunk is the vocabulary chunk width for T rows (workspace.go).
func (b *Backend) vocabChunk(T, V int) int { return vocabChunk(b.opt.LogitsScratch, T, V) }

// checkLogprob checks the shapes and returns the operands' dtype.
func checkLogprob(op string, hidden, weight, targets kernels.Buf, T, C, V int) kernels.DType {
	if T < 0 || C <= 0 || V <= 0 {
		panic(fmt.Sprintf("cuda: %s: T %d C %d V %d", op, T, C, V))
	}
	dt := operands(op+" hidden, weight", hidden, weight)
	want(hidden, dt, T*C, op+" hidden")
	want(weight, dt, V*C, op+" weight")
	want(targets, kernels.I32, T, op+" targets")
	return dt
}

// rowBlocks is the grid of a one-block-per-row kernel over T rows.
func (b *Backend) rowBlocks(T int) int { return b.gridBlocks(max(1, min(T, 64*b.d.info.SMs))) }

// TokenLogprob implements kernels.Ops: logprob, entropy, lse (T) =.
func (b *Backend) TokenLogprob(logprob, entropy, lse, hidden, weight, targets kernels.Buf, T, C, V int, invTemp float32) {
	dt := checkLogprob("TokenLogprob", hidden, weight, targets, T, C, V)
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
	b.elementwise("logprob_init", cost{write: 16 * int64(T)}, T, pu(state), ia(T))
	for v0 := 0; v0 < V; v0 += Vc {
		vc := min(Vc, V-v0)
		wc := ptr(weight) + uintptr(dt.Size()*v0*C)
		b.gemm(true, false, vc, T, C, invTemp, dt, wc, C, vc*C, ptr(hidden), C, T*C, 0, kernels.F32, logits, vc)
		// The chunk's logits, the targets and each row's running state.
		c := rw(reads(targets)).plus(4*int64(T)*int64(vc)+16*int64(T), 16*int64(T)).with(6*int64(T)*int64(vc), 0)
		b.launch("logprob_chunk", c, b.rowBlocks(T), 1, 1, threads, 0,
			pu(state), pu(logits), pa(targets), ia(T), ia(vc), ia(v0), ia(V))
	}
	b.elementwise("logprob_finish", rw(reads(targets), logprob, entropy, lse).plus(16*int64(T), 0), T, pa(logprob), pa(entropy), pa(lse), pu(state), pa(targets), ia(T), ia(V), pu(b.flags))
}

// TokenLogprobBackward implements kernels.Ops: dhidden (T,C) +=, dweight (V,C) +=.
// A zero-length dhidden or dweight is skipped.
func (b *Backend) TokenLogprobBackward(dhidden, dweight, dlogprob, hidden, weight, targets, lse kernels.Buf, T, C, V int, invTemp float32) {
	dt := checkLogprob("TokenLogprobBackward", hidden, weight, targets, T, C, V)
	want(dlogprob, kernels.F32, T, "TokenLogprobBackward dlogprob")
	want(lse, kernels.F32, T, "TokenLogprobBackward lse")
	if dhidden.N != 0 {
		want(dhidden, kernels.F32, T*C, "TokenLogprobBackward dhidden")
	}
	if dweight.N != 0 {
		want(dweight, kernels.F32, V*C, "TokenLogprobBackward dweight")
	}
	if T == 0 || V == 1 { // one token: logprob ≡ 0, no gradient
		return
	}
	defer b.lock()()
	Vc := b.vocabChunk(T, V)
	logits := b.work(workLogits, 4*T*Vc)
	if logits == 0 {
		return
	}
	dz, kernel := logits, "logprob_bwd_chunk" // fp32: dz over the logits
	if dt == kernels.BF16 {
		// The bf16 dz chunk shares the logits scratch: chunks of Vc' with
		// 4·T·Vc' bytes of logits and 2·T·Vc' of dz after them, within the
		// 4·T·Vc bytes the memory plan counts.
		Vc = bf16DzChunk(Vc)
		dz, kernel = logits+uintptr(4*T*Vc), "logprob_bwd_chunk_bf16"
	}
	for v0 := 0; v0 < V; v0 += Vc {
		vc := min(Vc, V-v0)
		wc := ptr(weight) + uintptr(dt.Size()*v0*C)
		b.gemm(true, false, vc, T, C, invTemp, dt, wc, C, vc*C, ptr(hidden), C, T*C, 0, kernels.F32, logits, vc)
		// The chunk's logits read, dz written (fp32 in place, or bf16).
		c := rw(reads(lse, dlogprob, targets)).plus(4*int64(T)*int64(vc), int64(T)*int64(vc)*int64(dt.Size())).with(4*int64(T)*int64(vc), 0)
		b.launch(kernel, c, b.rowBlocks(T), 1, 1, threads, 0,
			pu(dz), pu(logits), pa(lse), pa(dlogprob), pa(targets), ia(T), ia(vc), ia(v0), ia(V), fa(invTemp))
		if dhidden.N != 0 {
			b.gemm(false, false, C, T, vc, 1, dt, wc, C, vc*C, dz, vc, T*vc, 1, kernels.F32, ptr(dhidden), C)
		}
		if dweight.N != 0 {
			b.gemm(false, true, C, vc, T, 1, dt, ptr(hidden), C, T*C, dz, vc, T*vc, 1, kernels.F32, ptr(dweight)+uintptr(4*v0*C), C)
		}
	}
}

// TokenLogprobFiltered implements kernels.FilteredHead: o's buffers (T) =,
// o.Cut (2T) =. The logits are formed filterRows(T, V) whole rows at a
// time (workspace.go), one block per row runs the filter and the sums.
func (b *Backend) TokenLogprobFiltered(o kernels.HeadOut, hidden, weight, targets kernels.Buf, T, C, V int, invTemp float32, f kernels.TopKTopP) {
	dt := checkLogprob("TokenLogprobFiltered", hidden, weight, targets, T, C, V)
	for _, x := range []struct {
		b    kernels.Buf
		name string
	}{{o.Logprob, "logprob"}, {o.Entropy, "entropy"}, {o.LSE, "lse"}, {o.LogprobFull, "logprobFull"}, {o.LSEFull, "lseFull"}} {
		want(x.b, kernels.F32, T, "TokenLogprobFiltered "+x.name)
	}
	want(o.Cut, kernels.I32, 2*T, "TokenLogprobFiltered cut")
	if T == 0 {
		return
	}
	defer b.lock()()
	Tr := filterRows(b.opt.LogitsScratch, T, V, dt)
	logits := b.work(workLogits, filterWork(Tr, V, dt))
	if logits == 0 {
		return
	}
	onP := 0
	if f.TopP > 0 && f.TopP < 1 {
		onP = 1
	}
	for r0 := 0; r0 < T; r0 += Tr {
		n := min(Tr, T-r0)
		b.gemm(true, false, V, n, C, invTemp, dt, ptr(weight), C, V*C, ptr(hidden)+uintptr(dt.Size()*r0*C), C, n*C, 0, kernels.F32, logits, V)
		// Each row's logits (read by the selection's passes: counted once),
		// its target, and the row's seven results.
		c := cost{read: 4*int64(n)*int64(V) + 4*int64(n), write: 28 * int64(n), flops: 8 * int64(n) * int64(V)}
		b.launch("logprob_filter_fwd", c, n, 1, 1, filterThreads, 0,
			pa(o.Logprob), pa(o.Entropy), pa(o.LSE), pa(o.LogprobFull), pa(o.LSEFull), pa(o.Cut),
			pu(logits), pa(targets), ia(r0), ia(V), ia(f.TopK), ia(onP), fa(f.Threshold()), pu(b.flags))
	}
}

// TokenLogprobFilteredBackward implements kernels.FilteredHead: dhidden
// (T,C) +=, dweight (V,C) +=, over the forward's blocks of rows; a
// zero-length dhidden, dweight or dlogprobFull is skipped.
func (b *Backend) TokenLogprobFilteredBackward(dhidden, dweight, dlogprob, dlogprobFull, hidden, weight, targets kernels.Buf, o kernels.HeadOut, T, C, V int, invTemp float32) {
	dt := checkLogprob("TokenLogprobFilteredBackward", hidden, weight, targets, T, C, V)
	want(dlogprob, kernels.F32, T, "TokenLogprobFilteredBackward dlogprob")
	if dlogprobFull.N != 0 {
		want(dlogprobFull, kernels.F32, T, "TokenLogprobFilteredBackward dlogprobFull")
	}
	want(o.LSE, kernels.F32, T, "TokenLogprobFilteredBackward lse")
	want(o.LSEFull, kernels.F32, T, "TokenLogprobFilteredBackward lseFull")
	want(o.Cut, kernels.I32, 2*T, "TokenLogprobFilteredBackward cut")
	if dhidden.N != 0 {
		want(dhidden, kernels.F32, T*C, "TokenLogprobFilteredBackward dhidden")
	}
	if dweight.N != 0 {
		want(dweight, kernels.F32, V*C, "TokenLogprobFilteredBackward dweight")
	}
	if T == 0 {
		return
	}
	defer b.lock()()
	Tr := filterRows(b.opt.LogitsScratch, T, V, dt)
	logits := b.work(workLogits, filterWork(Tr, V, dt))
	if logits == 0 {
		return
	}
	dz, kernel := logits, "logprob_filter_bwd" // fp32: dz over the logits
	if dt == kernels.BF16 {
		dz, kernel = logits+uintptr(4*Tr*V), "logprob_filter_bwd_bf16"
	}
	var dfull uint64
	if dlogprobFull.N != 0 {
		dfull = pa(dlogprobFull)
	}
	for r0 := 0; r0 < T; r0 += Tr {
		n := min(Tr, T-r0)
		hc := ptr(hidden) + uintptr(dt.Size()*r0*C)
		b.gemm(true, false, V, n, C, invTemp, dt, ptr(weight), C, V*C, hc, C, n*C, 0, kernels.F32, logits, V)
		c := cost{read: 4*int64(n)*int64(V) + 28*int64(n), write: int64(n) * int64(V) * int64(dt.Size()), flops: 4 * int64(n) * int64(V)}
		b.launch(kernel, c, n, 1, 1, filterThreads, 0,
			pu(dz), pu(logits), pa(o.LSE), pa(o.LSEFull), pa(o.Cut), pa(dlogprob), dfull, pa(targets), ia(r0), ia(V), fa(invTemp))
		if dhidden.N != 0 {
			b.gemm(false, false, C, n, V, 1, dt, ptr(weight), C, V*C, dz, V, n*V, 1, kernels.F32, ptr(dhidden)+uintptr(4*r0*C), C)
		}
		if dweight.N != 0 {
			b.gemm(false, true, C, V, n, 1, dt, hc, C, n*C, dz, V, n*V, 1, kernels.F32, ptr(dweight), C)
		}
	}
}

// filterThreads is FLT_THREADS of csrc/filter.cuh.
const filterThreads = 512

var _ kernels.FilteredHead = (*Backend)(nil)
