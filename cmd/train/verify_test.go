package main

import (
	"bytes"
	"os"
	"path/filepath"
	"strings"
	"testing"

	"github.com/tracegrpo/tracegrpo/checkpoint"
)

// TestVerify: train verify accepts a run directory, a checkpoints directory
// and one checkpoint; a flipped byte in a tensor file (same size, so only
// the sha256 can tell) fails that checkpoint, naming the file, with exit 1.
func TestVerify(t *testing.T) {
	out := t.TempDir()
	mustTrain(t, trainArgs(out, 4)...) // checkpoints of steps 2 and 4
	ckpts := filepath.Join(out, "checkpoints")
	step4 := filepath.Join(ckpts, checkpoint.StepDir(4))
	for _, c := range []struct {
		path string
		want []string
	}{
		{out, []string{"step_4: ok", "step_2: ok"}},
		{ckpts, []string{"step_4: ok", "step_2: ok"}},
		{step4, []string{"step_4: ok (step 4, "}},
	} {
		var stdout, stderr bytes.Buffer
		if code := run([]string{"verify", c.path}, &stdout, &stderr); code != 0 {
			t.Fatalf("verify %s: exit %d\n%s%s", c.path, code, stdout.String(), stderr.String())
		}
		for _, w := range c.want {
			if !strings.Contains(stdout.String(), w) {
				t.Errorf("verify %s: output lacks %q:\n%s", c.path, w, stdout.String())
			}
		}
	}

	model := filepath.Join(step4, checkpoint.ModelFile)
	b, err := os.ReadFile(model)
	if err != nil {
		t.Fatal(err)
	}
	b[len(b)-3] ^= 0x10 // a weight's bit: the file still parses, only its hash differs
	if err := os.WriteFile(model, b, 0o644); err != nil {
		t.Fatal(err)
	}
	var stdout, stderr bytes.Buffer
	code := run([]string{"verify", out}, &stdout, &stderr)
	if code != 1 || !strings.Contains(stdout.String(), "step_4: FAILED") || !strings.Contains(stdout.String(), "model.safetensors: sha256") ||
		!strings.Contains(stdout.String(), "step_2: ok") || !strings.Contains(stderr.String(), "1 of 2 checkpoints failed") {
		t.Errorf("verify after a flipped weight bit: exit %d\n%s%s", code, stdout.String(), stderr.String())
	}

	for _, c := range []struct {
		args []string
		code int
	}{
		{[]string{"verify"}, 2},
		{[]string{"verify", filepath.Join(out, "nonexistent")}, 1},
		{[]string{"verify", t.TempDir()}, 1},
	} {
		if got := run(c.args, &bytes.Buffer{}, &bytes.Buffer{}); got != c.code {
			t.Errorf("train %s: exit %d, want %d", strings.Join(c.args, " "), got, c.code)
		}
	}
}
