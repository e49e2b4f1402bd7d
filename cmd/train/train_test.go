package main

import (
	"bytes"
	"fmt"
	"strings"
	"testing"
)

func TestHelpExplains(t *testing.T) {
	var stdout, stderr bytes.Buffer
	if code := run([]string{"--help"}, &stdout, &stderr); code != 0 {
		t.Fatalf("train --help: exit %d", code)
	}
	for _, w := range []string{"--config", "--set", "--resume", "--rollouts", "--backend", "metrics.jsonl"} {
		if !strings.Contains(stdout.String(), w) {
			t.Errorf("train --help does not mention %s", w)
		}
	}
}

// trainArgs are the built-in job shrunk to milliseconds per step (the
// trainer package's tests use the same), on the CPU, for steps steps with a
// checkpoint every two.
func trainArgs(out string, steps int, extra ...string) []string {
	args := []string{"--out", out, "--steps", fmt.Sprint(steps), "--backend", "cpu", "--quiet",
		"--set", "grpo.num_prompts_per_step=3", "--set", "grpo.num_generations_per_prompt=4",
		"--set", "checkpointing.save_period=2", "--set", "checkpointing.keep_top_k=null"}
	return append(args, extra...)
}

// mustTrain runs train and fails the test on a non-zero exit.
func mustTrain(t *testing.T, args ...string) string {
	t.Helper()
	var stdout, stderr bytes.Buffer
	if code := run(args, &stdout, &stderr); code != 0 {
		t.Fatalf("train %s: exit %d\n%s", strings.Join(args, " "), code, stderr.String())
	}
	return stderr.String()
}
