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

// Bounds of TestSharedPrefixGRPOGolden: the trainer's float32 step against
// float64 PyTorch, as TestSparseGRPOGolden's (the same model size, rollouts,
// optimizer and clipping, without experts): the metrics are sums over ~100
// tokens (relative 1e-5); AdamW with eps 1e-4 turns float32 rounding of the
// clipped gradients (~1e-7 relative) into ≲ 1e-7 of weight a step, so 1e-6
// bounds two steps with room. Packing the rollouts as a trie changes only
// the order of float32 sums, well inside both. A boundary token scored
// against one child's label only, a prefix's key/value gradients missing a
// descendant's, or a pair's gradient not summed over equal traces moves
// the loss or weights by ~1e-3 or more.
const (
	sharedGoldenMetricRtol = 1e-5
	sharedGoldenWeightAtol = 1e-6
)

// TestSharedPrefixGRPOGolden: two GRPO steps of a tiny dense Qwen3 from
// external rollouts (NeMo Gym records and captures) whose traces share
// prefixes (each task group's prompt; two generations of a group share
// their first tokens; two are equal), with the micro-batch budget smaller
// than a group's trie (so it is split at branch points), end with the
// loss, KL, gradient norm and lr of each step and the weights after each
// step of scripts/golden_shared_grpo.py, which computes the same steps in
// float64 with every rollout as its own sequence: with
// policy.shared_prefix=auto (each shared prefix computed once: fewer
// computed than trace tokens) and off alike.
func TestSharedPrefixGRPOGolden(t *testing.T) {
	const dir = "testdata/shared_grpo"
	raw, err := os.ReadFile(filepath.Join(dir, "golden.json"))
	if err != nil {
		t.Fatalf("%v (regenerate with: make golden, or /usr/bin/python3 scripts/golden_shared_grpo.py)", err)
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
			rid := fmt.Sprintf("shared-%d-%d-%d", s+1, r.Task, r.Index)
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
	gold, err := safetensors.Open(filepath.Join(dir, "golden.safetensors"))
	if err != nil {
		t.Fatal(err)
	}
	defer gold.Close()
	for _, mode := range []string{"auto", "off"} {
		t.Run(mode, func(t *testing.T) {
			out := filepath.Join(tmp, "run-"+mode)
			args := []string{"--out", out, "--steps", "2", "--quiet", "--rollouts", steps, "--captures", caps, "--init-from", dir,
				"--set", "checkpointing.save_period=1", "--shared-prefix", mode}
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
			for s, want := range g.Steps {
				m := ms[s]
				if m.EligibleTokens != want.EligibleTokens || m.TrainTokens != want.TrainTokens {
					t.Errorf("step %d: eligible %d, train tokens %d; the golden's %d and %d", s+1, m.EligibleTokens, m.TrainTokens, want.EligibleTokens, want.TrainTokens)
				}
				switch {
				case mode == "auto" && !(m.ComputedTokens < m.TrainTokens):
					t.Errorf("step %d: %d computed tokens for %d trace tokens: the shared prefixes were not computed once", s+1, m.ComputedTokens, m.TrainTokens)
				case mode == "off" && m.ComputedTokens != m.TrainTokens:
					t.Errorf("step %d: %d computed tokens for %d trace tokens with sharing off", s+1, m.ComputedTokens, m.TrainTokens)
				}
				t.Logf("step %d: %d trace tokens, %d computed (prefix_reuse %.3f)", s+1, m.TrainTokens, m.ComputedTokens, float64(m.PrefixReuse))
				for _, c := range []struct {
					name      string
					got, want float64
				}{
					{"loss", float64(m.Loss), want.Loss},
					{"kl", float64(m.KL), want.KL},
					{"grad_norm", float64(m.GradNorm), want.GradNorm},
					{"lr", float64(m.LR), want.LR},
				} {
					d := math.Abs(c.got - c.want)
					if !(d <= sharedGoldenMetricRtol*math.Max(math.Abs(c.want), 1e-3)) {
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
				if !(worst <= sharedGoldenWeightAtol) {
					t.Errorf("step %d: weights differ from the golden by %.3g at %s (bound %g)", s+1, worst, where, sharedGoldenWeightAtol)
				}
				t.Logf("step %d: %d tensors, largest weight difference from the golden %.3g (bound %g)", s+1, len(got), worst, sharedGoldenWeightAtol)
			}
		})
	}
}
