package trainer

// Hostile runs (issue 26) at the trainer's level.

import (
	"bytes"
	"context"
	"errors"
	"os"
	"os/exec"
	"path/filepath"
	"strings"
	"testing"
	"time"
)

// runWithin runs this test binary as a trainer with args and fails the
// test when it is still running after d (it is then killed): a hang fails
// instead of stopping the suite. It returns the exit status and output.
func runWithin(t *testing.T, d time.Duration, args ...string) (int, string) {
	t.Helper()
	ctx, cancel := context.WithTimeout(context.Background(), d)
	defer cancel()
	c := trainerCommand(t, args...)
	cmd := exec.CommandContext(ctx, c.Path, c.Args[1:]...)
	cmd.Env = c.Env
	var out bytes.Buffer
	cmd.Stdout, cmd.Stderr = &out, &out
	start := time.Now()
	err := cmd.Run()
	if ctx.Err() != nil {
		t.Fatalf("train %s: still running after %v (killed)\n%s", strings.Join(args, " "), time.Since(start).Round(time.Second), out.String())
	}
	var ee *exec.ExitError
	if err != nil && !errors.As(err, &ee) {
		t.Fatal(err)
	}
	return cmd.ProcessState.ExitCode(), out.String()
}

// TestWaitZeroDoesNotWait (issue 26, item 6): --wait 0 quietly meant ten
// minutes. It now means do not wait: a missing step file fails at once,
// naming it; a negative --wait is a usage error.
func TestWaitZeroDoesNotWait(t *testing.T) {
	dir := t.TempDir()
	_, caps := gymFixture(t, dir)
	steps := filepath.Join(dir, "steps")
	if err := os.MkdirAll(steps, 0o755); err != nil {
		t.Fatal(err)
	}
	args := append([]string{"--out", filepath.Join(dir, "run"), "--rollouts", steps, "--captures", caps, "--steps", "1"}, externalSets...)
	start := time.Now()
	code, out := runWithin(t, 30*time.Second, append(args, "--wait", "0")...)
	if code != 1 || !strings.Contains(out, "step_1.jsonl") || !strings.Contains(out, "--wait 0") {
		t.Errorf("--wait 0 and no step file: exit %d after %v:\n%s\nwant exit 1 at once naming step_1.jsonl and --wait 0", code, time.Since(start), out)
	}
	code, out = runWithin(t, 30*time.Second, append(args, "--wait", "-1s", "--out", filepath.Join(dir, "run2"))...)
	if code != 2 || !strings.Contains(out, "--wait") {
		t.Errorf("--wait -1s: exit %d:\n%s\nwant a usage error naming --wait", code, out)
	}
}
