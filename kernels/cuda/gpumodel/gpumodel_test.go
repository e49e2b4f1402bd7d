//go:build cgo

package gpumodel

import (
	"math"
	"testing"

	"github.com/tracegrpo/tracegrpo/kernels"
	"github.com/tracegrpo/tracegrpo/kernels/cuda"
	"github.com/tracegrpo/tracegrpo/model"
)

// TestBenchShape meters the bench step (Qwen3-1.7B, bf16, 8 × 4096) and
// checks the ledger against the model's arithmetic, counted twice by
// independent code: ModelFLOPs' formula from the config equals the
// ledger's GEMM FLOPs less what the ledger counts beyond the model (the
// LM head's logits recomputed in the backward pass) plus causal
// attention's FLOPs; and the prediction covers every launch with an op.
func TestBenchShape(t *testing.T) {
	cfg, err := model.LoadConfig("../../../model/testdata/published/qwen3-1.7b.config.json")
	if err != nil {
		t.Fatal(err)
	}
	const rows, seq = 8, 4096
	res, err := Run(cfg, Step{Rows: rows, Seq: seq, Precision: kernels.BF16}, cuda.H200)
	if err != nil {
		t.Fatal(err)
	}
	var gemm float64
	for _, l := range res.Ledger {
		if l.Op == "" {
			t.Errorf("launch of %s with no op", l.Kernel)
		}
		if l.Kind == cuda.KindGEMM {
			gemm += float64(l.FLOPs)
		}
	}
	T := float64(rows * seq)
	C, V := float64(cfg.HiddenSize), float64(cfg.VocabSize)
	NH, HD, L := float64(cfg.NumAttentionHeads), float64(cfg.HeadDim), float64(cfg.NumHiddenLayers)
	attn := T * L * 3 * 4 * NH * HD * float64(seq+1) / 2
	if want, got := res.ModelFLOPs, gemm-2*T*V*C+attn; math.Abs(got-want) > 1e-9*want {
		t.Errorf("model FLOPs %.6g; from the ledger's GEMMs %.6g", want, got)
	}
	p := res.Prediction
	if len(p.Estimates) != len(res.Ledger) || !(p.Seconds > 0) {
		t.Fatalf("%d estimates of %d launches, %v s", len(p.Estimates), len(res.Ledger), p.Seconds)
	}
	// No step can beat its FLOPs at the matrix rate.
	if floor := float64(p.FLOPs) / cuda.H200.GemmRate; p.Seconds < floor {
		t.Errorf("predicted %.3f s, below the step's FLOPs at cuBLAS's rate, %.3f s", p.Seconds, floor)
	}
	t.Logf("predicted %.1f ms, MFU %.1f%%", 1e3*p.Seconds, p.MFU(res.ModelFLOPs))
}
