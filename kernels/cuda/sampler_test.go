//go:build cgo

package cuda_test

import (
	"fmt"
	"math/rand/v2"
	"os"
	"testing"
	"time"

	"github.com/google/go-cmp/cmp"
	"github.com/tracegrpo/tracegrpo/kernels"
	"github.com/tracegrpo/tracegrpo/kernels/cpu"
	"github.com/tracegrpo/tracegrpo/kernels/cuda"
	"github.com/tracegrpo/tracegrpo/kernels/kerneltest"
	"github.com/tracegrpo/tracegrpo/model"
)

// tolSampleLogprob: the sampled tokens' logprobs through prefill and the KV
// cache (AttentionDecode), CUDA against CPU.
var tolSampleLogprob = kerneltest.Tol{Atol: 2e-5, Rtol: 1e-4}

// sampleTiny samples from the tiny Qwen3 with the model's sampler (prefill,
// KV cache, decode steps, slots retired and moved) on be, greedily.
func sampleTiny(t *testing.T, be kernels.Backend) []model.Sample {
	t.Helper()
	return sampleTinyOpt(t, be, 4, model.SampleOptions{Temperature: 0, MaxNewTokens: 12, StopTokens: []int32{3}})
}

// sampleTinyOpt samples the tiny Qwen3 with options opt on a sampler of
// maxBatch slots, one random stream per prompt.
func sampleTinyOpt(t *testing.T, be kernels.Backend, maxBatch int, opt model.SampleOptions) []model.Sample {
	t.Helper()
	cfg, err := model.LoadConfig("../../model/testdata/qwen3_tied/config.json")
	if err != nil {
		t.Fatal(err)
	}
	m, err := model.New(be, cfg, model.Options{MaxTokens: 64, MaxSeqs: 8})
	if err != nil {
		t.Fatal(err)
	}
	defer m.Close()
	m.InitRandom(5)
	s, err := model.NewSampler(m, maxBatch, 40)
	if err != nil {
		t.Fatal(err)
	}
	defer s.Close()
	prompts := [][]int32{{5, 17, 300, 2}, {42}, {7, 7, 7, 100, 200, 311, 12, 9, 8, 1, 2, 3, 4, 5, 6, 7, 8, 9, 10, 11, 12, 13, 14, 15, 16, 17, 18, 19, 20, 21, 22, 23, 24}, {500, 1}}
	rngs := make([]*rand.Rand, len(prompts))
	for i := range rngs {
		rngs[i] = rand.New(rand.NewPCG(1, uint64(i)))
	}
	out, err := s.Sample(prompts, opt, rngs)
	if err != nil {
		t.Fatal(err)
	}
	return out
}

func compareSamples(t *testing.T, want, got []model.Sample) {
	t.Helper()
	if len(want) != len(got) {
		t.Fatalf("%d samples, want %d", len(got), len(want))
	}
	n := 0
	for _, w := range want {
		n += len(w.Tokens)
	}
	if n < 12 {
		t.Fatalf("only %d tokens sampled in all: the comparison would say little", n)
	}
	for i := range want {
		if diff := cmp.Diff(want[i].Tokens, got[i].Tokens); diff != "" {
			t.Errorf("sample %d tokens (-cpu +cuda):\n%s", i, diff)
			continue
		}
		if msg := kerneltest.Compare(want[i].Logprobs, got[i].Logprobs, tolSampleLogprob); msg != "" {
			t.Errorf("sample %d logprobs: %s", i, msg)
		}
	}
}

// TestSamplerEmu: greedy sampling through prefill and the KV cache on the
// emulated CUDA backend gives the CPU's tokens and logprobs.
func TestSamplerEmu(t *testing.T) {
	ref := cpu.New(2)
	defer ref.Close()
	want := sampleTiny(t, ref)
	got := sampleTiny(t, cuda.EmuBackend(t, cuda.Options{DecodeSplit: 32}))
	compareSamples(t, want, got)
}

// samplingOptions are the device-sampling cases: temperature with top-k,
// top-p and both, on a 2-slot sampler refilled with 4 prompts.
var samplingOptions = []model.SampleOptions{
	{Temperature: 1, TopK: 20, MaxNewTokens: 10, StopTokens: []int32{3}, Refill: true},
	{Temperature: 1.3, TopP: 0.9, MaxNewTokens: 10, StopTokens: []int32{3}, Refill: true},
	{Temperature: 0.8, TopK: 50, TopP: 0.8, MaxNewTokens: 10, StopTokens: []int32{3}, Refill: true},
}

// TestSamplerDeviceEmu: temperature, top-k and top-p sampling on the
// emulated device (csrc/sample.cu through model.Sampler, refilling its
// slots) draws the CPU's tokens with the CPU's logprobs from the same
// per-prompt streams. The logits differ in the last bits, so a draw could
// differ only where a uniform lands within that of a boundary.
func TestSamplerDeviceEmu(t *testing.T) {
	ref := cpu.New(2)
	defer ref.Close()
	emu := cuda.EmuBackend(t, cuda.Options{DecodeSplit: 32})
	for _, opt := range samplingOptions {
		compareSamples(t, sampleTinyOpt(t, ref, 2, opt), sampleTinyOpt(t, emu, 2, opt))
	}
}

// TestSamplerGPU: the same on CUDA device 0.
func TestSamplerGPU(t *testing.T) {
	be, err := cuda.OpenBackend(cuda.Options{DecodeSplit: 32})
	if err != nil {
		if os.Getenv("TRACEGRPO_REQUIRE_GPU") == "1" {
			t.Fatalf("no CUDA device: %v", err)
		}
		t.Skipf("no CUDA device: %v", err)
	}
	defer be.Close()
	ref := cpu.New(2)
	defer ref.Close()
	compareSamples(t, sampleTiny(t, ref), sampleTiny(t, be))
	for _, opt := range samplingOptions {
		compareSamples(t, sampleTinyOpt(t, ref, 2, opt), sampleTinyOpt(t, be, 2, opt))
	}
}

// TestSamplerThroughputGPU measures model.Sampler's tokens/s on device 0
// (TRACEGRPO_PERF=1; scripts/gpu-check.sh): 256 prompts of 128 random
// tokens decoded together (top-p 0.95 at temperature 1, device sampling,
// the bf16 KV cache and weights of mixed precision) for 128 new tokens
// each, from the model config at $TRACEGRPO_PERF_MODEL with zero weights
// (the work does not depend on their values; zero logits make top-p keep
// 95% of the vocabulary, the sampler's slowest case). It prints "PERF
// sampler_tokens_per_s ..." with the prefill's share of the time.
// TRACEGRPO_PERF_SHAPES=tiny shrinks it for the emulator (gpu-check's dry
// run).
func TestSamplerThroughputGPU(t *testing.T) {
	if os.Getenv("TRACEGRPO_PERF") != "1" {
		t.Skip("set TRACEGRPO_PERF=1 to measure (scripts/gpu-check.sh does)")
	}
	path := os.Getenv("TRACEGRPO_PERF_MODEL")
	if path == "" {
		t.Fatal("TRACEGRPO_PERF_MODEL names no model config")
	}
	cfg, err := model.LoadConfig(path)
	if err != nil {
		t.Fatal(err)
	}
	B, promptLen, newTokens := 256, 128, 128
	if os.Getenv("TRACEGRPO_PERF_SHAPES") == "tiny" {
		B, promptLen, newTokens = 4, 8, 4
	}
	be, err := cuda.OpenBackend(cuda.Options{})
	if err != nil {
		t.Fatalf("no CUDA device: %v", err)
	}
	defer be.Close()
	m, err := model.New(be, cfg, model.Options{MaxTokens: min(B*promptLen, 8192), MaxSeqs: B, Precision: kernels.BF16, ForwardOnly: true})
	if err != nil {
		t.Fatal(err)
	}
	defer m.Close()
	s, err := model.NewSampler(m, B, promptLen+newTokens)
	if err != nil {
		t.Fatal(err)
	}
	defer s.Close()
	r := rand.New(rand.NewPCG(7, 7))
	prompts := make([][]int32, B)
	for i := range prompts {
		prompts[i] = make([]int32, promptLen)
		for j := range prompts[i] {
			prompts[i][j] = int32(r.IntN(cfg.VocabSize))
		}
	}
	opt := model.SampleOptions{Temperature: 1, TopP: 0.95, MaxNewTokens: 1}
	run := func(newTok int) (time.Duration, int) {
		opt.MaxNewTokens = newTok
		t0 := time.Now()
		out, err := s.Sample(prompts, opt, []*rand.Rand{rand.New(rand.NewPCG(1, 1))})
		if err != nil {
			t.Fatal(err)
		}
		n := 0
		for _, o := range out {
			n += len(o.Tokens)
		}
		return time.Since(t0), n
	}
	run(1) // warm-up
	prefill, _ := run(1)
	total, n := run(newTokens)
	tps := float64(n) / total.Seconds()
	fmt.Printf("PERF sampler_tokens_per_s %.4g tokens/s (batch %d, prompts of %d, %d new tokens each in %.2f s; the prefill %.0f%% of it) target >= 5000: %s\n",
		tps, B, promptLen, newTokens, total.Seconds(), 100*prefill.Seconds()/total.Seconds(), map[bool]string{true: "ok", false: "SHORT"}[tps >= 5000])
}
