package main

import (
	"bytes"
	"fmt"
	"math"
	"os"
	"path/filepath"
	"strings"
	"testing"

	"github.com/tracegrpo/tracegrpo/trainer"
)

// todaysRecipe is NeMo RL main's grpo_math_1B.yaml (the commit
// config/testdata/nemo-rl/MANIFEST.tsv records).
const todaysRecipe = "../../config/testdata/nemo-rl/examples/configs/grpo_math_1B.yaml"

// gymRollouts are rollouts of gym/testdata/gymdiff that NeMo Gym's own
// builders deliver whole, with every call's custody resolved (the
// differential test checks both): two task groups of two per step, two
// steps; step 2 regroups step 1's rollouts with others.
var gymRollouts = [2][2][2]string{
	{{"single-call", "multi-turn"}, {"forks", "compaction"}},
	{{"delta-prompt", "forks"}, {"duplicate-identical", "single-call"}},
}

// TestTrainTodaysRecipeTwoSteps: two GRPO steps on the CPU from NeMo RL
// main's grpo_math_1B.yaml, with the multi-trace opt-in given as NeMo RL's
// command-line overrides, a tiny Qwen2-shaped model (model/testdata), and
// rollouts captured by NeMo Gym's own capture store (gym/testdata/gymdiff).
// Every step trains every rollout's tokens with a finite, non-zero loss, and
// the weights move.
func TestTrainTodaysRecipeTwoSteps(t *testing.T) {
	dir := t.TempDir()
	caps := filepath.Join(dir, "captures")
	if err := os.MkdirAll(caps, 0o755); err != nil {
		t.Fatal(err)
	}
	var recs bytes.Buffer
	for step, groups := range gymRollouts {
		for task, ids := range groups {
			for i, id := range ids {
				files, err := filepath.Glob(filepath.Join(gymDiffDir, "captures", id+".tokens.*"))
				if err != nil || len(files) == 0 {
					t.Fatalf("gymdiff has no captures of %s (%v)", id, err)
				}
				for _, f := range files {
					copyFile(t, f, filepath.Join(caps, filepath.Base(f)))
				}
				// Rewards differ within each group: every rollout has an advantage.
				fmt.Fprintf(&recs, `{"_ng_task_index": %d, "_ng_rollout_index": %d, "_ng_rollout_id": %q, "reward": %d, "response": {"id": "r"}}`+"\n",
					2*step+task, i, id, i)
			}
		}
	}
	rollouts := filepath.Join(dir, "rollouts.jsonl")
	if err := os.WriteFile(rollouts, recs.Bytes(), 0o644); err != nil {
		t.Fatal(err)
	}
	out := filepath.Join(dir, "run")
	log := mustTrain(t, "--config", todaysRecipe, "--backend", "cpu", "--out", out,
		"--init-from", "../../model/testdata/qwen2_tied", "--rollouts", rollouts, "--captures", caps,
		// The multi-trace opt-in, as run_grpo.py takes overrides.
		"++grpo.gym_multi_trace=true", "++env.nemo_gym.token_id_capture.enabled=true",
		"++env.nemo_gym.token_id_capture.all_agents=true", "++env.nemo_gym.token_id_capture.delivery=all_traces",
		"++env.nemo_gym.token_id_capture.builder=per_request",
		// The recipe's sizes, cut to the fixture: 2 prompts × 2 generations.
		"grpo.num_prompts_per_step=2", "grpo.num_generations_per_prompt=2", "grpo.max_num_steps=2",
		"policy.train_global_batch_size=4", "policy.train_micro_batch_size=2", "checkpointing.save_period=1")
	if !strings.Contains(log, "run grpo_math_1B:") {
		t.Errorf("the run is not named after the recipe:\n%s", log)
	}
	ms, _, err := trainer.ReadMetrics(filepath.Join(out, "metrics.jsonl"))
	if err != nil {
		t.Fatal(err)
	}
	if len(ms) != 2 {
		t.Fatalf("%d steps, want 2", len(ms))
	}
	for _, m := range ms {
		t.Logf("step %d: loss %v, %d logical rollouts, %d traces, %d eligible tokens, %d masked %v", m.Step, m.Loss, m.LogicalRollouts, m.Traces, m.EligibleTokens, m.MaskedRollouts, m.MaskReasons)
		if m.LogicalRollouts != 4 || m.MaskedRollouts != 0 || m.EligibleTokens == 0 {
			t.Errorf("step %d: %d logical rollouts (%d masked), %d eligible tokens; want 4, none masked, some tokens", m.Step, m.LogicalRollouts, m.MaskedRollouts, m.EligibleTokens)
		}
		if l := float64(m.Loss); l == 0 || math.IsNaN(l) || math.IsInf(l, 0) {
			t.Errorf("step %d: loss %v, want finite and non-zero", m.Step, m.Loss)
		}
	}
	if d, where := maxDiff(ckptWeights(t, out, 1), ckptWeights(t, out, 2)); d == 0 || d != d {
		t.Errorf("step 2 did not move the weights (largest change %g at %s)", d, where)
	}
	eff, err := os.ReadFile(filepath.Join(out, "config.yaml"))
	if err != nil {
		t.Fatal(err)
	}
	for _, want := range []string{"# override ++grpo.gym_multi_trace=true", "gym_multi_trace: true", "delivery: all_traces", "num_prompts_per_step: 2"} {
		if !strings.Contains(string(eff), want) {
			t.Errorf("config.yaml lacks %q", want)
		}
	}
}

func copyFile(t *testing.T, src, dst string) {
	t.Helper()
	b, err := os.ReadFile(src)
	if err != nil {
		t.Fatal(err)
	}
	if err := os.WriteFile(dst, b, 0o644); err != nil {
		t.Fatal(err)
	}
}
