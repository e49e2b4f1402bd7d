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

// grpoGolden is the golden.json of a two-step GRPO golden under
// trainer/testdata (moe_grpo from scripts/golden_moe_grpo.py, shared_grpo
// from scripts/golden_shared_grpo.py): the run's --set values, and per step
// its rollouts, their micro-batches and the metrics the reference computed.
type grpoGolden struct {
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

// loadGRPOGolden reads dir/golden.json (script: the script that writes it)
// and turns its two steps' rollouts into NeMo Gym records and captures
// under tmp, as an external run reads them: it returns the golden, the
// capture store and the rollouts directory (step_N.jsonl).
func loadGRPOGolden(t *testing.T, dir, script, tmp string) (g grpoGolden, caps, steps string) {
	t.Helper()
	raw, err := os.ReadFile(filepath.Join(dir, "golden.json"))
	if err != nil {
		t.Fatalf("%v (regenerate with: make golden, or /usr/bin/python3 %s)", err, script)
	}
	if err := json.Unmarshal(raw, &g); err != nil {
		t.Fatalf("%s: %v", filepath.Join(dir, "golden.json"), err)
	}
	if len(g.Steps) != 2 {
		t.Fatalf("the golden has %d steps, want 2", len(g.Steps))
	}
	caps, steps = filepath.Join(tmp, "captures"), filepath.Join(tmp, "steps")
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
			rid := fmt.Sprintf("%s-%d-%d-%d", filepath.Base(dir), s+1, r.Task, r.Index)
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
	return g, caps, steps
}

// trainGRPOGolden trains the golden's two steps from dir's initial weights
// into out, with its --set values (in sorted order) and extra arguments,
// checkpointing every step, and returns the two metrics lines.
func trainGRPOGolden(t *testing.T, g grpoGolden, dir, caps, steps, out string, extra ...string) []Metrics {
	t.Helper()
	args := []string{"--out", out, "--steps", "2", "--quiet", "--rollouts", steps, "--captures", caps, "--init-from", dir,
		"--set", "checkpointing.save_period=1"}
	args = append(args, extra...)
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
	return ms
}

// goldenMetric is one metric of a step: the trainer's value and the
// golden's.
type goldenMetric struct {
	name      string
	got, want float64
}

// checkGoldenMetrics fails unless each metric of step s is within rtol of
// the golden's (relative to max(|want|, 1e-3)), and logs every difference.
func checkGoldenMetrics(t *testing.T, s int, rtol float64, ms []goldenMetric) {
	t.Helper()
	for _, c := range ms {
		d := math.Abs(c.got - c.want)
		if !(d <= rtol*math.Max(math.Abs(c.want), 1e-3)) {
			t.Errorf("step %d: %s %.9g, the golden's %.9g", s, c.name, c.got, c.want)
		}
		t.Logf("step %d: %s %.9g (golden %.9g, |Δ| %.3g)", s, c.name, c.got, c.want, d)
	}
}

// checkGoldenWeights fails unless every weight of out's checkpoint of step
// s is within atol of the golden's tensor step<s>.<name> (a NaN fails).
func checkGoldenWeights(t *testing.T, gold *safetensors.File, out string, s int, atol float64) {
	t.Helper()
	got := weights(t, out, s)
	worst, where := 0.0, ""
	for name, x := range got {
		y := make([]float32, len(x))
		if err := gold.ReadF32(fmt.Sprintf("step%d.%s", s, name), y); err != nil {
			t.Fatal(err)
		}
		for i := range x {
			if d := math.Abs(float64(x[i]) - float64(y[i])); d > worst || d != d {
				worst, where = d, fmt.Sprintf("%s[%d]: %g vs %g", name, i, x[i], y[i])
			}
		}
	}
	if !(worst <= atol) {
		t.Errorf("step %d: weights differ from the golden by %.3g at %s (bound %g)", s, worst, where, atol)
	}
	t.Logf("step %d: %d tensors, largest weight difference from the golden %.3g (bound %g)", s, len(got), worst, atol)
}
