package trainer

import (
	"math/big"
	"testing"

	"github.com/tracegrpo/tracegrpo/collective"
	"github.com/tracegrpo/tracegrpo/config"
	"github.com/tracegrpo/tracegrpo/kernels"
	"github.com/tracegrpo/tracegrpo/kernels/cpu"
	"github.com/tracegrpo/tracegrpo/kernels/cuda"
	"github.com/tracegrpo/tracegrpo/model"
)

// Fuzz flags: what else the plan is of.
const (
	fuzzBuiltin   = 1 << iota // the in-process sampler
	fuzzBF16                  // policy.precision=bfloat16
	fuzzRecompute             // activation checkpointing
	fuzzKL                    // a KL reference policy
	fuzzCUDA                  // plan for cuda (else cpu)
	fuzzResume                // a resumed run
	fuzzShard                 // one rank of a fully sharded run (--shard full) of ranks ranks
	fuzzNoReshard             // with every layer kept gathered through backward
)

// FuzzPlan: the memory plan over any sizes a user can give (config.json's
// sizes, --rows, --seq, the batch, the world size of a sharded plan and of
// bench's rows) never panics and never reports a negative byte count: it either
// refuses, or every part and the total are non-negative and the total is
// the exact sum of the parts (issue 26: sizes wrapped around int64 into
// "20.9 MiB" plans and negative byte counts).
func FuzzPlan(f *testing.F) {
	tiny, err := model.ParseConfig(builtinModelConfig, "builtin")
	if err != nil {
		f.Fatal(err)
	}
	ld, _, err := LoadRecipe(nil, nil)
	if err != nil {
		f.Fatal(err)
	}
	// The built-in job as it is, the largest sizes accepted, past them, and
	// the products that wrapped.
	c := tiny
	f.Add(int64(c.NumHiddenLayers), int64(c.HiddenSize), int64(c.IntermediateSize), int64(c.NumAttentionHeads), int64(c.NumKeyValueHeads),
		int64(c.HeadDim), int64(c.VocabSize), int64(0), int64(0), int64(8), int64(1), uint8(fuzzBuiltin))
	f.Add(int64(model.MaxLayers), int64(model.MaxHiddenSize), int64(model.MaxIntermediateSize), int64(model.MaxHeads), int64(model.MaxHeads),
		int64(model.MaxHeadDim), int64(model.MaxVocabSize), int64(1), int64(model.MaxTokens), int64(1<<40), int64(8), uint8(0x3f))
	f.Add(int64(c.NumHiddenLayers), int64(c.HiddenSize), int64(c.IntermediateSize), int64(c.NumAttentionHeads), int64(c.NumKeyValueHeads),
		int64(c.HeadDim), int64(c.VocabSize), int64(0), int64(0), int64(8), int64(1<<40), uint8(fuzzShard|fuzzBuiltin))
	f.Add(int64(c.NumHiddenLayers), int64(c.HiddenSize), int64(c.IntermediateSize), int64(c.NumAttentionHeads), int64(c.NumKeyValueHeads),
		int64(c.HeadDim), int64(c.VocabSize), int64(0), int64(0), int64(8), int64(-3), uint8(fuzzShard|fuzzNoReshard|fuzzCUDA))
	f.Add(int64(1<<24), int64(1<<24), int64(1<<24), int64(1<<24), int64(1<<24), int64(1<<24), int64(1<<24), int64(1<<62), int64(1<<62), int64(-1), int64(0), uint8(fuzzCUDA))
	f.Add(int64(2), int64(64), int64(128), int64(4), int64(2), int64(16), int64(512), int64(16), int64(1152921504606846978), int64(3), int64(3), uint8(fuzzBuiltin|fuzzCUDA))
	f.Add(int64(2), int64(64), int64(128), int64(4), int64(2), int64(16), int64(512), int64(9223372036854775807), int64(9223372036854775807), int64(2), int64(-5), uint8(0))
	f.Fuzz(func(t *testing.T, layers, hidden, inter, heads, kvHeads, headDim, vocab, rows, seq, batch, ranks int64, flags uint8) {
		mc := tiny
		mc.NumHiddenLayers, mc.HiddenSize, mc.IntermediateSize = int(layers), int(hidden), int(inter)
		mc.NumAttentionHeads, mc.NumKeyValueHeads, mc.HeadDim, mc.VocabSize = int(heads), int(kvHeads), int(headDim), int(vocab)
		cfg := ld.Config
		cfg.Policy.TrainGlobalBatchSize = int(batch)
		cfg.Policy.Precision = config.PrecisionFloat32
		if flags&fuzzBF16 != 0 {
			cfg.Policy.Precision = config.PrecisionBFloat16
		}
		cfg.Policy.DtensorCfg.ActivationCheckpointing = flags&fuzzRecompute != 0
		cfg.Policy.MegatronCfg.ActivationCheckpointing = flags&fuzzRecompute != 0
		cfg.LossFn.ReferencePolicyKLPenalty = 0
		if flags&fuzzKL != 0 {
			cfg.LossFn.ReferencePolicyKLPenalty = 0.01
		}
		backend, ws := "cpu", func(w kernels.Workload) int64 { return cpu.PlanWorkspace(w, 2) }
		if flags&fuzzCUDA != 0 {
			backend, ws = "cuda", func(w kernels.Workload) int64 { return cuda.PlanWorkspace(w, cuda.Options{}) }
		}
		req := PlanRequest{Config: &cfg, Model: mc, ModelName: "fuzz", Backend: backend, Workspace: ws,
			Rows: int(rows), Seq: int(seq), Builtin: flags&fuzzBuiltin != 0, Resume: flags&fuzzResume != 0,
			World: int(ranks), Shard: flags&fuzzShard != 0, NoReshard: flags&fuzzNoReshard != 0}
		if p, err := PlanRun(req); err == nil {
			checkPlanSums(t, "train plan", p)
		}
		// bench and score: each rank's share of the rows.
		if ranks < 1 || ranks > 1<<20 || rows < 1 || seq < 1 {
			return
		}
		for _, r := range []int{0, int(ranks - 1)} {
			lo, hi := collective.Block(int(rows), r, int(ranks))
			if lo < 0 || hi < lo || hi > int(rows) {
				t.Fatalf("Block(%d, %d, %d) = [%d, %d)", rows, r, ranks, lo, hi)
			}
			T := int64(hi-lo) * seq // as bench computes it once its rows × seq is within int32
			if hi == lo || rows > model.MaxTokens || seq > model.MaxTokens || T > model.MaxTokens || T/seq != int64(hi-lo) {
				continue
			}
			spec := PlanSpec{Request: PlanRequest{Model: mc, ModelName: "fuzz", Backend: backend, Workspace: ws, Rows: hi - lo},
				Options: model.Options{MaxTokens: int(T), MaxSeqs: hi - lo, Recompute: flags&fuzzRecompute != 0}, Optimizer: flags&fuzzKL == 0}
			if p, err := PlanModelRun(spec); err == nil {
				checkPlanSums(t, "bench plan", p)
			}
		}
	})
}

// checkPlanSums fails when a plan has a negative part or total, or a total
// that is not the exact sum of its parts.
func checkPlanSums(t *testing.T, what string, p *MemPlan) {
	t.Helper()
	sum := new(big.Int)
	for _, c := range p.Components {
		if c.Bytes < 0 {
			t.Fatalf("%s: %s is %d bytes", what, c.Name, c.Bytes)
		}
		sum.Add(sum, big.NewInt(c.Bytes))
	}
	if p.TotalBytes < 0 || sum.Cmp(big.NewInt(p.TotalBytes)) != 0 {
		t.Fatalf("%s: total %d bytes, the parts sum to %s", what, p.TotalBytes, sum)
	}
	if p.ActivationsCheckpointed < 0 || p.ActivationsFull < 0 || p.Params < 0 {
		t.Fatalf("%s: activations %d and %d bytes, %d parameters", what, p.ActivationsCheckpointed, p.ActivationsFull, p.Params)
	}
}
