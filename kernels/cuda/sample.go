//go:build cgo

package cuda

// SampleTokens: csrc/sample.cu (kernels.TokenSampler).

import (
	"fmt"

	"github.com/tracegrpo/tracegrpo/kernels"
)

// SampleTokens implements kernels.TokenSampler: tokens (B) I32 =,
// logprobs (B) F32 = drawn from logits (B,V) F32 with the uniforms u (2B)
// I32 (float64 bits), one block per row (csrc/filter.cuh's selection),
// without scratch.
func (b *Backend) SampleTokens(tokens, logprobs, logits, u kernels.Buf, B, V int, p kernels.SampleParams) {
	if B < 0 || V <= 0 || B > maxGridX {
		panic(fmt.Sprintf("cuda: SampleTokens: B %d V %d", B, V))
	}
	if !(p.Temperature >= 0) || !(p.TopP >= 0 && p.TopP <= 1) {
		panic(fmt.Sprintf("cuda: SampleTokens: %+v", p))
	}
	want(tokens, kernels.I32, B, "SampleTokens tokens")
	want(logprobs, kernels.F32, B, "SampleTokens logprobs")
	want(logits, kernels.F32, B*V, "SampleTokens logits")
	want(u, kernels.I32, 2*B, "SampleTokens u")
	if B == 0 {
		return
	}
	f := p.Filter()
	onP, invTemp := 0, float32(0)
	if f.TopP > 0 && f.TopP < 1 {
		onP = 1
	}
	if p.Temperature > 0 {
		invTemp = 1 / p.Temperature
	}
	defer b.lock()()
	// Each row's logits, read a few times (the selection's passes):
	// counted once.
	b.launch("sample_tokens", rw(reads(logits, u), tokens, logprobs).with(8*int64(B)*int64(V), 0), B, 1, 1, filterThreads, 0,
		pa(tokens), pa(logprobs), pa(logits), pa(u), ia(V), fa(p.Temperature), fa(invTemp), ia(f.TopK), ia(onP), fa(f.Threshold()))
}

// maxGridX is the largest grid x a launch may ask for.
const maxGridX = 1<<31 - 1

var _ kernels.TokenSampler = (*Backend)(nil)
