package trainer

import (
	"bytes"
	"encoding/json"
	"errors"
	"fmt"
	"math"
	"os"
	"path/filepath"
	"slices"
	"testing"

	"github.com/tracegrpo/tracegrpo/gym"
	"github.com/tracegrpo/tracegrpo/internal/safetensors"
)

// moeGolden is trainer/testdata/moe_grpo/golden.json, written by
// scripts/golden_moe_grpo.py.
type moeGolden struct {
	Sets  map[string]any `json:"sets"`
	Steps []struct {
		Rollouts []struct {
			Task       int       `json:"task"`
			Index      int       `json:"index"`
			Prompt     []int32   `json:"prompt"`
			Generation []int32   `json:"generation"`
			GenLP      []float64 `json:"generation_logprobs"`
			Reward     float64   `json:"reward"`
		} `json:"rollouts"`
		MicroBatches   [][]int `json:"micro_batches"`
		Loss           float64 `json:"loss"`
		KL             float64 `json:"kl"`
		GradNorm       float64 `json:"grad_norm"`
		RouterAuxLoss  float64 `json:"router_aux_loss"`
		LR             float64 `json:"lr"`
		EligibleTokens int     `json:"eligible_tokens"`
		TrainTokens    int     `json:"train_tokens"`
	} `json:"steps"`
}

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
	raw, err := os.ReadFile(filepath.Join(dir, "golden.json"))
	if err != nil {
		t.Fatal(err)
	}
	var g moeGolden
	if err := json.Unmarshal(raw, &g); err != nil {
		t.Fatal(err)
	}
	if len(g.Steps) != 2 {
		t.Fatalf("the golden has %d steps, want 2", len(g.Steps))
	}
	tmp := t.TempDir()
	caps, steps := filepath.Join(tmp, "captures"), filepath.Join(tmp, "steps")
	if err := os.MkdirAll(steps, 0o755); err != nil {
		t.Fatal(err)
	}
	w, err := gym.NewWriter(caps)
	if err != nil {
		t.Fatal(err)
	}
	w.SetFsync(false)
	for s, st := range g.Steps {
		var recs bytes.Buffer
		for _, r := range st.Rollouts {
			rid := fmt.Sprintf("moe-%d-%d-%d", s+1, r.Task, r.Index)
			if err := w.Put(gym.NewCallEntry(rid, "c1", "m", r.Prompt, r.Generation, r.GenLP, "", "")); err != nil {
				t.Fatal(err)
			}
			if err := w.Freeze(rid); err != nil && !errors.Is(err, gym.ErrFrozen) {
				t.Fatal(err)
			}
			fmt.Fprintf(&recs, `{"_ng_task_index": %d, "_ng_rollout_index": %d, "_ng_rollout_id": %q, "reward": %v, "response": {"id": "r"}}`+"\n",
				r.Task, r.Index, rid, r.Reward)
		}
		if err := os.WriteFile(filepath.Join(steps, fmt.Sprintf("step_%d.jsonl", s+1)), recs.Bytes(), 0o644); err != nil {
			t.Fatal(err)
		}
	}
	out := filepath.Join(tmp, "run")
	args := []string{"--out", out, "--steps", "2", "--quiet", "--rollouts", steps, "--captures", caps, "--init-from", dir,
		"--set", "checkpointing.save_period=1"}
	for _, k := range slices.Sorted(func(yield func(string) bool) {
		for k := range g.Sets {
			if !yield(k) {
				return
			}
		}
	}) {
		args = append(args, "--set", fmt.Sprintf("%s=%v", k, g.Sets[k]))
	}
	mustTrain(t, args...)
	ms := metricsNoTimes(t, out)
	if len(ms) != 2 {
		t.Fatalf("%d metric lines, want 2", len(ms))
	}
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
		for _, c := range []struct {
			name      string
			got, want float64
		}{
			{"loss", float64(m.Loss), want.Loss},
			{"kl", float64(m.KL), want.KL},
			{"grad_norm", float64(m.GradNorm), want.GradNorm},
			{"router_aux_loss", aux, want.RouterAuxLoss},
			{"lr", float64(m.LR), want.LR},
		} {
			d := math.Abs(c.got - c.want)
			if !(d <= moeGoldenMetricRtol*math.Max(math.Abs(c.want), 1e-3)) {
				t.Errorf("step %d: %s %.9g, the golden's %.9g", s+1, c.name, c.got, c.want)
			}
			t.Logf("step %d: %s %.9g (golden %.9g, |Δ| %.3g)", s+1, c.name, c.got, c.want, d)
		}
		got := weights(t, out, s+1)
		worst, where := 0.0, ""
		for name, x := range got {
			y := make([]float32, len(x))
			if err := gold.ReadF32(fmt.Sprintf("step%d.%s", s+1, name), y); err != nil {
				t.Fatal(err)
			}
			for i := range x {
				if d := math.Abs(float64(x[i]) - float64(y[i])); d > worst || d != d {
					worst, where = d, fmt.Sprintf("%s[%d]: %g vs %g", name, i, x[i], y[i])
				}
			}
		}
		if !(worst <= moeGoldenWeightAtol) {
			t.Errorf("step %d: weights differ from the golden by %.3g at %s (bound %g)", s+1, worst, where, moeGoldenWeightAtol)
		}
		t.Logf("step %d: %d tensors, largest weight difference from the golden %.3g (bound %g)", s+1, len(got), worst, moeGoldenWeightAtol)
	}
}
