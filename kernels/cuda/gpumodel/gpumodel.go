// Package gpumodel predicts the time of a training step on a GPU that has
// never run it: one step of a model (forward, backward, AdamW, as train
// bench runs it) on kernels/cuda's metering device (cuda.OpenMeter: the
// real backend over a driver on which nothing runs), whose launch ledger
// the roofline (cuda.Device.PredictLedger) turns into a time per op. make
// gpu-model prints it for the bench shape (Qwen3-1.7B, bf16, 8 × 4096
// tokens) with the predicted MFU.
//
// The step needs no memory for the model: the metering device's
// allocations are addresses with nothing behind them, and the weights
// stay zero (no kernel runs, so their values do not matter).
package gpumodel

import (
	"fmt"

	"github.com/tracegrpo/tracegrpo/kernels"
	"github.com/tracegrpo/tracegrpo/kernels/cuda"
	"github.com/tracegrpo/tracegrpo/model"
	"github.com/tracegrpo/tracegrpo/optim"
)

// Step is the shape of one training step.
type Step struct {
	Rows, Seq int           // packed sequences of Seq tokens each
	Precision kernels.DType // kernels.F32, or kernels.BF16: mixed precision
	Recompute bool
}

// Result is one metered step.
type Result struct {
	Ledger     []cuda.Launch
	Prediction cuda.Prediction
	// ModelFLOPs is the step's model FLOPs (ModelFLOPs), the MFU's numerator.
	ModelFLOPs float64
}

// Run meters one training step of cfg (after a warm-up step, as train
// bench times it) and predicts it on dev.
func Run(cfg model.Config, s Step, dev cuda.Device) (Result, error) {
	be, err := cuda.OpenMeter(cuda.Options{})
	if err != nil {
		return Result{}, fmt.Errorf("gpumodel: %w", err)
	}
	defer be.(interface{ Close() error }).Close()
	led := be.(cuda.Ledgered)
	T := s.Rows * s.Seq
	m, err := model.New(be, cfg, model.Options{MaxTokens: T, MaxSeqs: s.Rows, Recompute: s.Recompute, Precision: s.Precision})
	if err != nil {
		return Result{}, fmt.Errorf("gpumodel: %w", err)
	}
	defer m.Close()
	var groups []optim.Group
	for _, p := range m.Table().Params {
		groups = append(groups, optim.Group{Off: p.Offset, N: p.N, Decay: p.Decay})
	}
	opt, err := optim.New(be, m.Params(), m.Grads(), groups, optim.Config{Beta1: 0.9, Beta2: 0.999, Eps: 1e-8})
	if err != nil {
		return Result{}, fmt.Errorf("gpumodel: %w", err)
	}
	defer opt.Close()
	// The LM head's logits scratch as train sizes it: from the memory left
	// once the model and the optimizer hold theirs (the metering device
	// counts its allocations).
	if b, ok := be.(interface {
		MemInfo() (free, total int64, err error)
		SizeLogitsScratch(headroom int64) (int, bool)
	}); ok {
		if free, _, err := b.MemInfo(); err == nil {
			b.SizeLogitsScratch(free)
		}
	}
	tokens := make([]int32, T)
	dl := make([]float32, T)
	for i := range tokens {
		tokens[i] = int32(i % cfg.VocabSize)
		dl[i] = 1 / float32(T)
	}
	cu := make([]int32, s.Rows+1)
	for r := range cu {
		cu[r] = int32(r * s.Seq)
	}
	step := func() error {
		m.ZeroGrad()
		if _, _, err := m.Forward(tokens, cu, 1); err != nil {
			return err
		}
		if err := m.Backward(dl); err != nil {
			return err
		}
		if _, err := opt.Step(1e-6, 0.01); err != nil {
			return err
		}
		m.ParamsChanged()
		return be.Sync()
	}
	if err := step(); err != nil {
		return Result{}, fmt.Errorf("gpumodel: warm-up step: %w", err)
	}
	led.StartLedger()
	if err := step(); err != nil {
		return Result{}, fmt.Errorf("gpumodel: step: %w", err)
	}
	ledger := led.TakeLedger()
	return Result{Ledger: ledger, Prediction: dev.PredictLedger(ledger, nil), ModelFLOPs: ModelFLOPs(cfg, s.Rows, s.Seq)}, nil
}

// ModelFLOPs is a step's model FLOPs as scripts/gpu-check.sh counts them
// for its MFU (forward + backward = 3 × forward): 6 per matmul weight per
// token (every projection and the LM head), plus causal attention's
// 3·4·NH·HD·(seq+1)/2 per layer per token. Recomputation is not counted;
// a sparse layer counts its experts' TopK share.
func ModelFLOPs(cfg model.Config, rows, seq int) float64 {
	C, I, L := float64(cfg.HiddenSize), float64(cfg.IntermediateSize), float64(cfg.NumHiddenLayers)
	NH, NKV, HD, V := float64(cfg.NumAttentionHeads), float64(cfg.NumKeyValueHeads), float64(cfg.HeadDim), float64(cfg.VocabSize)
	w := L*(C*NH*HD+2*C*NKV*HD+NH*HD*C) + V*C
	for l := 0; l < cfg.NumHiddenLayers; l++ {
		if cfg.SparseLayer(l) {
			w += 3*C*float64(cfg.MoE.IntermediateSize)*float64(cfg.MoE.TopK) + C*float64(cfg.MoE.NumExperts)
		} else {
			w += 3 * C * I
		}
	}
	perToken := 6*w + L*3*4*NH*HD*float64(seq+1)/2
	return perToken * float64(rows*seq)
}
