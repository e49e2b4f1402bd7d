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
