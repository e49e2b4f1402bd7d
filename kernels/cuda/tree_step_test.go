//go:build cgo

package cuda_test

import (
	"math/rand/v2"
	"testing"

	"github.com/tracegrpo/tracegrpo/grpo"
	"github.com/tracegrpo/tracegrpo/kernels"
	"github.com/tracegrpo/tracegrpo/kernels/cpu"
	"github.com/tracegrpo/tracegrpo/kernels/cuda"
	"github.com/tracegrpo/tracegrpo/model"
)

// treeBatch is a step's rows sharing prefixes: a task group (a prompt and
// four generations, one of them twice) and an agentic rollout of three
// turns with a branch at each (its tool outputs masked, its generations
// eligible).
func treeBatch(V int) *grpo.Batch {
	r := rand.New(rand.NewPCG(9, 10))
	toks := func(n int) []int32 {
		t := make([]int32, n)
		for i := range t {
			t[i] = int32(r.IntN(V))
		}
		return t
	}
	b := &grpo.Batch{}
	add := func(seq []int32, from int) {
		row := grpo.Row{TokenIDs: seq, TokenMask: make([]int8, len(seq)), GenLogprobs: make([]float64, len(seq)), SampleMask: 1, Valid: true}
		for i := from; i < len(seq); i++ {
			row.TokenMask[i] = 1
		}
		b.Rows = append(b.Rows, row)
	}
	prompt := toks(21)
	for k := range 4 {
		gen := append(append([]int32(nil), prompt...), toks(5+3*k)...)
		add(gen, len(prompt))
		if k == 2 {
			add(gen, len(prompt)) // an identical generation
		}
	}
	var turn func(ctx []int32, depth int)
	turn = func(ctx []int32, depth int) {
		for range 2 {
			seq := append(append(append([]int32(nil), ctx...), toks(3)...), toks(4)...) // tool output, then a generation
			add(seq, len(seq)-4)
			if depth < 3 {
				turn(seq, depth+1)
			}
		}
	}
	turn(toks(9), 1)
	return b
}

// treeStep is one training step of the tiny model over treeBatch packed as
// one tree: ForwardTree, loss = −mean over loss positions, Backward, AdamW.
func treeStep(t *testing.T, be kernels.Backend, variant string, prec kernels.DType) stepResult {
	t.Helper()
	dir := "../../model/testdata/" + variant
	cfg, err := model.LoadConfig(dir + "/config.json")
	if err != nil {
		t.Fatal(err)
	}
	m, err := model.New(be, cfg, model.Options{MaxTokens: 300, MaxSeqs: 40, Precision: prec, Tree: true})
	if err != nil {
		t.Fatal(err)
	}
	defer m.Close()
	m.InitRandom(13)
	b := treeBatch(cfg.VocabSize)
	rows := make([]int, len(b.Rows))
	for i := range rows {
		rows[i] = i
	}
	pt := grpo.BuildTree(b, rows)
	if len(pt.Tokens) >= pt.TraceTokens {
		t.Fatalf("the batch shares nothing: %d tokens computed for %d", len(pt.Tokens), pt.TraceTokens)
	}
	m.ZeroGrad()
	lp, ent, err := m.ForwardTree(model.Tree{Tokens: pt.Tokens, Segs: pt.Segs, Parent: pt.Parent, Rows: pt.PairRows, Labels: pt.PairLabels}, 0.8)
	if err != nil {
		t.Fatal(err)
	}
	res := stepResult{logprob: append([]float32(nil), lp...), entropy: append([]float32(nil), ent...)}
	dl := make([]float32, len(lp))
	n := 0
	for _, pair := range pt.Pair {
		for _, p := range pair {
			if p >= 0 {
				n++
			}
		}
	}
	for _, pair := range pt.Pair {
		for _, p := range pair {
			if p >= 0 {
				res.loss -= float64(lp[p]) / float64(n)
				dl[p] -= 1 / float32(n)
			}
		}
	}
	if err := m.Backward(dl); err != nil {
		t.Fatal(err)
	}
	total := m.Table().Total
	res.grads = make([]float32, total)
	be.DownloadF32(res.grads, m.Grads())
	mom, err := be.Alloc(kernels.F32, 2*total)
	if err != nil {
		t.Fatal(err)
	}
	defer be.Free(mom)
	be.AdamW(m.Params(), m.Grads(), mom.Slice(0, total), mom.Slice(total, total), kernels.NewAdamWStep(kernels.TorchAdamW, 1e-3, 0.9, 0.999, 1e-6, 0.01, 1, 1))
	res.params = m.ParamsHost()
	if err := be.Sync(); err != nil {
		t.Fatal(err)
	}
	return res
}

// TestTreeStepEmu: a tree step through the emulated CUDA backend (tree_check,
// the tree attention kernels, the pairs' gather and scatter) equals the CPU
// backend's within the step tolerances, in fp32 (Qwen3, and Qwen2 with its
// biases); under bf16 mixed precision within the bf16 step tolerances,
// against the CPU's bf16 step and the emulator's own fp32 step. Two runs of
// each are the same bits: the backward sums a shared prefix's dk and dv over
// its descendants in a fixed order, with no atomics.
func TestTreeStepEmu(t *testing.T) {
	ref := cpu.New(2)
	defer ref.Close()
	emu := cuda.EmuBackend(t, cuda.Options{})
	const v = "qwen3_tied"
	f32 := treeStep(t, emu, v, kernels.F32)
	compareSteps(t, treeStep(t, ref, v, kernels.F32), f32, false)
	stepsEqual(t, f32, treeStep(t, emu, v, kernels.F32))
	cfg, err := model.LoadConfig("../../model/testdata/" + v + "/config.json")
	if err != nil {
		t.Fatal(err)
	}
	table := model.NewParamTable(cfg)
	bf16 := treeStep(t, emu, v, kernels.BF16)
	compareBF16Steps(t, table, treeStep(t, ref, v, kernels.BF16), bf16, tolBF16Step)
	compareBF16Steps(t, table, f32, bf16, tolBF16VsFP32)
	stepsEqual(t, bf16, treeStep(t, emu, v, kernels.BF16))
	compareSteps(t, treeStep(t, ref, "qwen2_untied", kernels.F32), treeStep(t, emu, "qwen2_untied", kernels.F32), false)
}

// TestTreeStepGPU: TestTreeStepEmu on CUDA device 0 (skips without one,
// unless TRACEGRPO_REQUIRE_GPU=1).
func TestTreeStepGPU(t *testing.T) {
	be := gpuBackend(t)
	ref := cpu.New(2)
	defer ref.Close()
	for _, v := range []string{"qwen3_tied", "qwen2_untied"} {
		t.Run(v, func(t *testing.T) {
			compareSteps(t, treeStep(t, ref, v, kernels.F32), treeStep(t, be, v, kernels.F32), false)
			cfg, err := model.LoadConfig("../../model/testdata/" + v + "/config.json")
			if err != nil {
				t.Fatal(err)
			}
			bf16 := treeStep(t, be, v, kernels.BF16)
			compareBF16Steps(t, model.NewParamTable(cfg), treeStep(t, ref, v, kernels.BF16), bf16, tolBF16Step)
			stepsEqual(t, bf16, treeStep(t, be, v, kernels.BF16))
		})
	}
}
