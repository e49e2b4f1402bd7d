package main

import (
	"bytes"
	"fmt"
	"path/filepath"
	"slices"
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

// TestExitStatuses: one convention for every command: 0 for success and
// --help, 2 for a usage error, 1 for a failure.
func TestExitStatuses(t *testing.T) {
	dir := t.TempDir()
	missing := filepath.Join(dir, "missing")
	for _, c := range []struct {
		args []string
		code int
	}{
		{[]string{"--help"}, 0},
		{[]string{"--no-such-flag"}, 2},
		{[]string{"stray-argument"}, 2},
		{[]string{"--backend", "tpu"}, 2},
		{[]string{"--steps", "0"}, 2},
		{[]string{"--backend", "cpu", "--config", missing, "--out", filepath.Join(dir, "r1")}, 1},
		{[]string{"config", "--help"}, 0},
		{[]string{"config", "--no-such-flag"}, 2},
		{[]string{"config", "extra"}, 2},
		{[]string{"config", "--config", missing}, 1},
		{[]string{"traces", "--bogus"}, 2},
		{[]string{"traces"}, 2},
		{[]string{"traces", "--captures", missing, "--rollouts", missing}, 1},
		{[]string{"score", "--bogus"}, 2},
		{[]string{"score", "--model", missing}, 2},
		{[]string{"score", "--model", missing, "--input", missing}, 1},
		{[]string{"bench", "--bogus"}, 2},
		{[]string{"bench", "--model", missing}, 1},
		{[]string{"plot", "--bogus"}, 2},
		{[]string{"plot", "x"}, 2},
		{[]string{"plot", "--out", missing}, 1},
		{[]string{"verify"}, 2},
		{[]string{"verify", "--bogus", dir}, 2},
		{[]string{"verify", missing}, 1},
	} {
		var stdout, stderr bytes.Buffer
		if got := run(c.args, &stdout, &stderr); got != c.code {
			t.Errorf("train %s: exit %d, want %d\n%s", strings.Join(c.args, " "), got, c.code, stderr.String())
		}
	}
	var stdout bytes.Buffer
	run([]string{"--help"}, &stdout, &bytes.Buffer{})
	if !strings.Contains(stdout.String(), "Exit status") || !strings.Contains(stdout.String(), "2 for a usage error") {
		t.Errorf("train --help does not document the exit statuses:\n%s", stdout.String())
	}
}

// TestQuietPrintsTheBackendOnce: --quiet silences setup and progress lines
// but still says, once, which backend the run uses; without it the backend
// is named once too.
func TestQuietPrintsTheBackendOnce(t *testing.T) {
	for _, quiet := range []bool{true, false} {
		args := trainArgs(filepath.Join(t.TempDir(), "run"), 1)
		if !quiet {
			args = slices.DeleteFunc(args, func(a string) bool { return a == "--quiet" })
		}
		log := mustTrain(t, args...)
		if n := strings.Count(log, "backend"); n != 1 {
			t.Errorf("quiet=%v: the backend is named %d times:\n%s", quiet, n, log)
		}
		if quiet && strings.Count(log, "\n") != 1 {
			t.Errorf("--quiet printed more than the backend line:\n%s", log)
		}
	}
}
