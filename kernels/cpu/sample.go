package cpu

// SampleTokens: the next token of each row drawn from its logits
// (kernels.TokenSampler), the reference of the device samplers:
//
//	p_i = exp((z_i − max z)/T) in float64                     (T = Temperature)
//	K   = top-k by (p desc, id asc), then the shortest top-p prefix
//	tok = first i ∈ K in id order with Σ_{j∈K, j≤i} p_j > u·Σ_K p   =
//	logprob = log(p_tok / Σ_K p)                               =
//
// logits (B,V) F32; u (2B) I32, row b's uniform as float64 bits (low word
// first); tokens (B) I32; logprobs (B) F32. Temperature 0 is the argmax
// (lowest id among equal maxima) with logprob 0. Rows are independent;
// the kept set is found by sorting only the tokens above a threshold low
// enough to hold it (model's sampler does the same on the host).

import (
	"fmt"
	"math"

	"github.com/tracegrpo/tracegrpo/kernels"
)

// SampleTokens implements kernels.TokenSampler.
func (b *Backend) SampleTokens(tokens, logprobs, logits, u kernels.Buf, B, V int, sp kernels.SampleParams) {
	if B < 0 || V <= 0 {
		panic(fmt.Sprintf("cpu: SampleTokens: B %d V %d", B, V))
	}
	z := b.f32n(logits, B*V, "SampleTokens logits")
	uu := b.i32n(u, 2*B, "SampleTokens u")
	tok := b.i32n(tokens, B, "SampleTokens tokens")
	lp := b.f32n(logprobs, B, "SampleTokens logprobs")
	if cap(b.sampleZ) < V {
		b.sampleZ = make([]float32, V)
	}
	if len(b.filterScratch) != b.threads {
		b.filterScratch = make([]kernels.FilterScratch, b.threads)
	}
	for r := 0; r < B; r++ {
		bits := uint64(uint32(uu[2*r])) | uint64(uint32(uu[2*r+1]))<<32
		tok[r], lp[r] = kernels.SampleRow(z[r*V:(r+1)*V], math.Float64frombits(bits), sp, b.sampleZ[:V], &b.filterScratch[0])
	}
}

var _ kernels.TokenSampler = (*Backend)(nil)
