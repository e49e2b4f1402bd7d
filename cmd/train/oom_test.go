package main

import (
	"bytes"
	"encoding/json"
	"errors"
	"fmt"
	"os"
	"os/exec"
	"path/filepath"
	"strings"
	"testing"

	"github.com/tracegrpo/tracegrpo/internal/meminfo"
	"github.com/tracegrpo/tracegrpo/trainer"
)

// runRefused runs train with args (and extra environment) and checks that
// it ends with exit status 1, an error naming each of want, and no Go
// crash: no "fatal error", no goroutine dump, no panic.
func runRefused(t *testing.T, env []string, want []string, args ...string) {
	t.Helper()
	cmd := trainCommand(args...)
	cmd.Env = append(cmd.Env, env...)
	var stderr bytes.Buffer
	cmd.Stderr = &stderr
	err := cmd.Run()
	var ee *exec.ExitError
	if !errors.As(err, &ee) || ee.ExitCode() != 1 {
		t.Fatalf("train %s: %v, want exit status 1\n%s", strings.Join(args, " "), err, stderr.String())
	}
	out := stderr.String()
	for _, bad := range []string{"fatal error", "goroutine ", "panic:", "out of memory"} {
		if strings.Contains(out, bad) {
			t.Fatalf("train %s: a crash (%q):\n%s", strings.Join(args, " "), bad, out)
		}
	}
	for _, w := range want {
		if !strings.Contains(out, w) {
			t.Errorf("train %s: the error does not say %q:\n%s", strings.Join(args, " "), w, out)
		}
	}
}

// memoryBelow returns the environment that makes free memory smaller than
// need: none when the machine has less than need free already (the real
// check runs), else $TRACEGRPO_MEMORY at half of need.
func memoryBelow(t *testing.T, need int64) []string {
	if a, ok := meminfo.Host(); ok && a.Bytes < need {
		return nil
	}
	t.Logf("this machine has %s or more free: planning against $%s=%d", trainer.Bytes(need), trainer.MemoryEnv, need/2)
	return []string{fmt.Sprintf("%s=%d", trainer.MemoryEnv, need/2)}
}

func planTotal(t *testing.T, args ...string) int64 {
	t.Helper()
	var out, errb bytes.Buffer
	if code := run(append([]string{"plan", "--json"}, args...), &out, &errb); code != 0 {
		t.Fatalf("train plan %v: exit %d: %s", args, code, errb.String())
	}
	var p trainer.MemPlan
	if err := json.Unmarshal(out.Bytes(), &p); err != nil {
		t.Fatal(err)
	}
	return p.TotalBytes
}

// TestOutOfMemoryCasesRefused: the three runs issue 14 found ending in a
// Go out-of-memory crash with a goroutine dump end in a clear error, exit
// status 1, before allocating.
func TestOutOfMemoryCasesRefused(t *testing.T) {
	t.Run("builtin_131072", func(t *testing.T) {
		set := "policy.max_total_sequence_length=131072"
		need := planTotal(t, "--backend", "cpu", "--set", set)
		runRefused(t, memoryBelow(t, need), []string{"does not fit in memory", "activations", "policy.max_total_sequence_length", "sampler_kv_cache"},
			"--backend", "cpu", "--set", set, "--out", t.TempDir(), "--quiet")
	})
	t.Run("bench_seq_1e8", func(t *testing.T) {
		runRefused(t, nil, []string{"does not fit in memory", "activations", "--seq", "--recompute"},
			"bench", "--backend", "cpu", "--model", "../../model/testdata/qwen3_untied/config.json", "--rows", "2", "--seq", "100000000", "--steps", "1")
	})
	t.Run("score_2M_token_line", func(t *testing.T) {
		dir := t.TempDir()
		in := filepath.Join(dir, "long.jsonl")
		writeLongLine(t, in, 2_000_000)
		runRefused(t, nil, []string{"long.jsonl line 1", "2000000 tokens", "max_position_embeddings 128"},
			"score", "--model", "../../model/testdata/qwen3_untied", "--input", in)
	})
	t.Run("score_line_beyond_memory", func(t *testing.T) {
		// Within the context of a model with a long one, but not within
		// the memory given: refused naming the longest line that fits.
		dir := t.TempDir()
		in := filepath.Join(dir, "long.jsonl")
		writeLongLine(t, in, 100_000)
		runRefused(t, []string{trainer.MemoryEnv + "=64M"}, []string{"long.jsonl line 1", "100000 tokens in one forward pass", "the longest line that fits is"},
			"score", "--model", "../../model/testdata/llama31_long", "--input", in)
	})
}

func writeLongLine(t *testing.T, path string, n int) {
	t.Helper()
	var b strings.Builder
	b.WriteString(`{"token_ids": [`)
	for i := range n {
		if i > 0 {
			b.WriteByte(',')
		}
		fmt.Fprintf(&b, "%d", i%50)
	}
	b.WriteString("]}\n")
	if err := os.WriteFile(path, []byte(b.String()), 0o644); err != nil {
		t.Fatal(err)
	}
}
