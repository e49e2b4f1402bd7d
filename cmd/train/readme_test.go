package main

import (
	"os"
	"path/filepath"
	"strings"
	"testing"

	"github.com/tracegrpo/tracegrpo/checkpoint"
	"github.com/tracegrpo/tracegrpo/trainer"
)

// docCommand returns the arguments of the first command of the section
// heading of the document doc (a path from the repository's root) that
// starts with prefix, continuation lines joined.
func docCommand(t *testing.T, doc, heading, prefix string) []string {
	t.Helper()
	b, err := os.ReadFile("../../" + doc)
	if err != nil {
		t.Fatal(err)
	}
	_, sec, ok := strings.Cut(string(b), heading)
	if !ok {
		t.Fatalf("%s has no %q", doc, heading)
	}
	sec, _, _ = strings.Cut(sec, "\n## ")
	var cmd []string
	in := false
	for _, line := range strings.Split(sec, "\n") {
		line = strings.TrimSpace(line)
		if !in && strings.HasPrefix(line, prefix) {
			in = true
		}
		if !in {
			continue
		}
		if i := strings.Index(line, "#"); i >= 0 {
			line = line[:i]
		}
		cont := strings.HasSuffix(strings.TrimSpace(line), "\\")
		cmd = append(cmd, strings.Fields(strings.TrimSuffix(strings.TrimSpace(line), "\\"))...)
		if !cont {
			break
		}
	}
	if len(cmd) == 0 {
		t.Fatalf("%s's %q section has no command starting %q", doc, heading, prefix)
	}
	return cmd[1:] // without bin/train
}

// TestReadmeRecipeExample runs docs/recipes.md's NeMo RL recipe example as it is
// written (from a short built-in run's checkpoint instead of step_300, in
// temporary directories): it must write the checkpoints it says, train with
// a non-zero loss in every step, and be named after the recipe.
func TestReadmeRecipeExample(t *testing.T) {
	args := docCommand(t, "docs/recipes.md", "## Training from a NeMo RL recipe", "bin/train --config")
	dir := t.TempDir()
	init := filepath.Join(dir, "builtin")
	mustTrain(t, trainArgs(init, 2)...)
	repl := map[string]string{
		"runs/builtin/checkpoints/step_300": filepath.Join(init, "checkpoints", checkpoint.StepDir(2)),
		"runs/recipe":                       filepath.Join(dir, "recipe"),
	}
	for i, a := range args {
		for from, to := range repl {
			if a == from {
				args[i] = to
			}
		}
		if strings.HasPrefix(a, "config/") {
			args[i] = "../../" + a
		}
		if strings.HasPrefix(a, "env.nemo_gym.token_id_capture.dir=") {
			args[i] = "env.nemo_gym.token_id_capture.dir=" + filepath.Join(dir, "recipe", "captures")
		}
	}
	log := mustTrain(t, append(args, "--backend", "cpu")...)
	if !strings.Contains(log, "run grpo_math_1B_megatron:") {
		t.Errorf("the run is not named after the recipe:\n%s", log)
	}
	out := filepath.Join(dir, "recipe")
	for _, s := range []int64{2, 4} {
		if _, err := checkpoint.Verify(filepath.Join(out, "checkpoints", checkpoint.StepDir(s))); err != nil {
			t.Errorf("docs/recipes.md promises step_%d: %v", s, err)
		}
	}
	ms, _, err := trainer.ReadMetrics(filepath.Join(out, "metrics.jsonl"))
	if err != nil {
		t.Fatal(err)
	}
	if len(ms) != 4 {
		t.Fatalf("%d steps, docs/recipes.md says 4", len(ms))
	}
	for _, m := range ms {
		if m.Loss == 0 {
			t.Errorf("step %d has loss 0 (no learning signal): reward %v ± %v", m.Step, m.RewardMean, m.RewardStd)
		}
	}
}
