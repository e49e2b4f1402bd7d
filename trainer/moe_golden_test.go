package trainer

import (
	"math"
	"path/filepath"
	"testing"

	"github.com/tracegrpo/tracegrpo/internal/safetensors"
)

// Bounds of TestSparseGRPOGolden: the trainer's float32 step against
// float64 PyTorch. The metrics are sums over ~150 tokens (relative 1e-5).
// A weight moves by at most lr = 1e-3 a step; AdamW with eps 1e-4 turns a
// gradient difference δg into an update difference ≲ lr·δg/eps, and the
// clipped gradients here (norm ~13 before clipping to 1) carry float32
// rounding of ~1e-7 relative of elements up to ~0.1: ≲ 1e-8, so ≲ 1e-7 a
// step. 1e-6 bounds two steps with room; a wrong advantage, loss term,
// router gradient or micro-batch weight moves weights by ~1e-4 or more.
const (
	moeGoldenMetricRtol = 1e-5
	moeGoldenWeightAtol = 1e-6
)

// TestSparseGRPOGolden: two GRPO steps of a tiny Qwen3-MoE (8 experts, 2
// per token, renormalised; the load-balancing loss on with coefficient
// 0.05; a KL penalty against the initial weights; gradient clipping
// active) from external rollouts (NeMo Gym records and captures) end with
// the loss, KL, gradient norm and router_aux_loss of each step and the
// weights after each step of scripts/golden_moe_grpo.py, which computes
// the same steps in float64 from transformers' model definition, NeMo
// RL's loss and torch's AdamW.
func TestSparseGRPOGolden(t *testing.T) {
	const dir = "testdata/moe_grpo"
	tmp := t.TempDir()
	g, caps, steps := loadGRPOGolden(t, dir, "scripts/golden_moe_grpo.py", tmp)
	out := filepath.Join(tmp, "run")
	ms := trainGRPOGolden(t, g, dir, caps, steps, out)
	gold, err := safetensors.Open(filepath.Join(dir, "golden.safetensors"))
	if err != nil {
		t.Fatal(err)
	}
	defer gold.Close()
	for s, want := range g.Steps {
		m := ms[s]
		if m.EligibleTokens != want.EligibleTokens || m.TrainTokens != want.TrainTokens {
			t.Errorf("step %d: eligible %d, train tokens %d; the golden's %d and %d", s+1, m.EligibleTokens, m.TrainTokens, want.EligibleTokens, want.TrainTokens)
		}
		aux := math.NaN()
		if m.RouterAuxLoss != nil {
			aux = float64(*m.RouterAuxLoss)
		}
		checkGoldenMetrics(t, s+1, moeGoldenMetricRtol, []goldenMetric{
			{"loss", float64(m.Loss), want.Loss},
			{"kl", float64(m.KL), want.KL},
			{"grad_norm", float64(m.GradNorm), want.GradNorm},
			{"router_aux_loss", aux, want.RouterAuxLoss},
			{"lr", float64(m.LR), want.LR},
		})
		checkGoldenWeights(t, gold, out, s+1, moeGoldenWeightAtol)
	}
}
