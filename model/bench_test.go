package model

import (
	"math/rand/v2"
	"testing"

	"github.com/tracegrpo/tracegrpo/kernels/cpu"
)

// benchConfig is the Qwen3 shape scripts/bench_torch.py times.
var benchConfig = Config{
	Arch: Qwen3, HiddenSize: 512, IntermediateSize: 1536, NumHiddenLayers: 8, NumAttentionHeads: 8,
	NumKeyValueHeads: 4, HeadDim: 64, RMSNormEps: 1e-6, RopeTheta: 1e6, VocabSize: 8192,
}

// BenchmarkForwardBackward times one forward + backward of the bench shape
// (8 sequences × 256 tokens) on 2 threads; compare with
// scripts/bench_torch.py run at the same time (scripts/bench_compare.sh).
func BenchmarkForwardBackward(b *testing.B) {
	const rows, seq = 8, 256
	be := cpu.New(2)
	defer be.Close()
	m, err := New(be, benchConfig, Options{MaxTokens: rows * seq, MaxSeqs: rows})
	if err != nil {
		b.Fatal(err)
	}
	defer m.Close()
	m.InitRandom(1)
	r := rand.New(rand.NewPCG(1, 2))
	tokens := make([]int32, rows*seq)
	dl := make([]float32, rows*seq)
	for i := range tokens {
		tokens[i] = int32(r.IntN(benchConfig.VocabSize))
		dl[i] = float32(r.NormFloat64()) / float32(len(tokens))
	}
	cu := make([]int32, rows+1)
	for s := range cu {
		cu[s] = int32(s * seq)
	}
	step := func() {
		m.ZeroGrad()
		if _, _, err := m.Forward(tokens, cu, 1); err != nil {
			b.Fatal(err)
		}
		if err := m.Backward(dl); err != nil {
			b.Fatal(err)
		}
	}
	step() // warm-up: the backend sizes its scratch once
	b.ReportAllocs()
	for b.Loop() {
		step()
	}
	b.ReportMetric(float64(rows*seq)*float64(b.N)/b.Elapsed().Seconds(), "tokens/s")
}

// BenchmarkSample times incremental decoding of the bench shape: 8 prompts of
// 32 tokens, 64 new tokens each, top-p 0.95, on 2 threads.
func BenchmarkSample(b *testing.B) {
	const batch, promptLen, newTokens = 8, 32, 64
	be := cpu.New(2)
	defer be.Close()
	m, err := New(be, benchConfig, Options{MaxTokens: batch * promptLen, MaxSeqs: batch})
	if err != nil {
		b.Fatal(err)
	}
	defer m.Close()
	m.InitRandom(1)
	s, err := NewSampler(m, batch, promptLen+newTokens)
	if err != nil {
		b.Fatal(err)
	}
	defer s.Close()
	r := rand.New(rand.NewPCG(1, 2))
	prompts := make([][]int32, batch)
	for i := range prompts {
		for range promptLen {
			prompts[i] = append(prompts[i], int32(r.IntN(benchConfig.VocabSize)))
		}
	}
	opt := SampleOptions{Temperature: 1, TopP: 0.95, MaxNewTokens: newTokens}
	for b.Loop() {
		if _, err := s.Sample(prompts, opt, []*rand.Rand{r}); err != nil {
			b.Fatal(err)
		}
	}
	b.ReportMetric(float64(batch*newTokens)*float64(b.N)/b.Elapsed().Seconds(), "new_tokens/s")
}
