//go:build cgo

package cuda

// SampleTokens: csrc/sample.cu (kernels.TokenSampler).

import (
	"fmt"

	"github.com/tracegrpo/tracegrpo/kernels"
)

// sampleThreads is SMP_THREADS of csrc/sample.cu.
const sampleThreads = 512

// SampleTokens implements kernels.TokenSampler: tokens (B) I32 =,
// logprobs (B) F32 = drawn from logits (B,V) F32 with the uniforms u (2B)
// I32 (float64 bits), one block per row, without scratch.
func (b *Backend) SampleTokens(tokens, logprobs, logits, u kernels.Buf, B, V int, p kernels.SampleParams) {
	if B < 0 || V <= 0 || B > maxGridX {
		panic(fmt.Sprintf("cuda: SampleTokens: B %d V %d", B, V))
	}
	if !(p.Temperature >= 0) || p.TopK < 0 || !(p.TopP >= 0 && p.TopP <= 1) {
		panic(fmt.Sprintf("cuda: SampleTokens: %+v", p))
	}
	want(tokens, kernels.I32, B, "SampleTokens tokens")
	want(logprobs, kernels.F32, B, "SampleTokens logprobs")
	want(logits, kernels.F32, B*V, "SampleTokens logits")
	want(u, kernels.I32, 2*B, "SampleTokens u")
	if B == 0 {
		return
	}
	defer b.lock()()
	// Each row's logits, read a few times (max, sums, the top-k/top-p
	// passes): counted once.
	b.launch("sample_tokens", rw(reads(logits, u), tokens, logprobs).with(8*int64(B)*int64(V), 0), B, 1, 1, sampleThreads, 0,
		pa(tokens), pa(logprobs), pa(logits), pa(u), ia(V), fa(p.Temperature), ia(p.TopK), fa(p.TopP))
}

// maxGridX is the largest grid x a launch may ask for.
const maxGridX = 1<<31 - 1

var _ kernels.TokenSampler = (*Backend)(nil)
