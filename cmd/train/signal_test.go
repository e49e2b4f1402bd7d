package main

import (
	"bytes"
	"errors"
	"os"
	"os/exec"
	"path/filepath"
	"strings"
	"sync"
	"syscall"
	"testing"
	"time"
)

// lockedBuffer collects a process's output, readable while it runs.
type lockedBuffer struct {
	mu sync.Mutex
	b  bytes.Buffer
}

func (l *lockedBuffer) Write(p []byte) (int, error) {
	l.mu.Lock()
	defer l.mu.Unlock()
	return l.b.Write(p)
}

func (l *lockedBuffer) String() string {
	l.mu.Lock()
	defer l.mu.Unlock()
	return l.b.String()
}

// waitFor waits until the output holds want, or fails after a minute.
func (l *lockedBuffer) waitFor(t *testing.T, want string) {
	t.Helper()
	for deadline := time.Now().Add(time.Minute); !strings.Contains(l.String(), want); time.Sleep(5 * time.Millisecond) {
		if time.Now().After(deadline) {
			t.Fatalf("no %q after a minute:\n%s", want, l.String())
		}
	}
}

// startAndWait starts a long built-in run (with env added to its
// environment) and waits until it has logged n steps.
func startAndWait(t *testing.T, out string, n int, env ...string) (*exec.Cmd, *lockedBuffer) {
	t.Helper()
	cmd := trainCommand(trainArgs(out, 1000000)...)
	cmd.Env = append(cmd.Env, env...)
	stderr := &lockedBuffer{}
	cmd.Stderr = stderr
	if err := cmd.Start(); err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { cmd.Process.Kill() })
	deadline := time.Now().Add(time.Minute)
	for {
		b, _ := os.ReadFile(filepath.Join(out, "metrics.jsonl"))
		if bytes.Count(b, []byte{'\n'}) >= n {
			return cmd, stderr
		}
		if time.Now().After(deadline) {
			t.Fatalf("no %d steps after a minute: %s", n, stderr.String())
		}
		time.Sleep(5 * time.Millisecond)
	}
}

// TestFirstSignalStopsCleanly: one SIGINT ends the run after the step in
// progress with a checkpoint of it (exit 1, saying how to resume).
func TestFirstSignalStopsCleanly(t *testing.T) {
	out := filepath.Join(t.TempDir(), "run")
	cmd, stderr := startAndWait(t, out, 3)
	cmd.Process.Signal(syscall.SIGINT)
	err := cmd.Wait()
	var ee *exec.ExitError
	if !errors.As(err, &ee) || ee.ExitCode() != 1 {
		t.Fatalf("after one SIGINT: %v, want exit status 1\n%s", err, stderr.String())
	}
	for _, w := range []string{"SIGINT again stops at once", "interrupted by SIGINT after step", "continue with --resume"} {
		if !strings.Contains(stderr.String(), w) {
			t.Errorf("stderr lacks %q:\n%s", w, stderr.String())
		}
	}
	var vout bytes.Buffer
	if code := run([]string{"verify", out}, &vout, &bytes.Buffer{}); code != 0 {
		t.Errorf("checkpoints after a clean stop do not verify:\n%s", vout.String())
	}
}

// TestSecondSignalStopsAtOnce: a second Ctrl-C was ignored. It now ends the
// process at once, by the signal, and the newest complete checkpoint still
// verifies, so --resume continues. The run holds back its first stop
// request (as a step that does not end would): it cannot stop cleanly
// after the first signal, so only the second signal's path can end it.
func TestSecondSignalStopsAtOnce(t *testing.T) {
	out := filepath.Join(t.TempDir(), "run")
	cmd, stderr := startAndWait(t, out, 3, holdStopEnv+"=1")
	cmd.Process.Signal(syscall.SIGINT)
	// The second is sent once the first was taken: two SIGINTs pending at
	// once are one.
	stderr.waitFor(t, "SIGINT: stopping after the step in progress")
	cmd.Process.Signal(syscall.SIGINT)
	done := make(chan error, 1)
	go func() { done <- cmd.Wait() }()
	var err error
	select {
	case err = <-done:
	case <-time.After(30 * time.Second):
		cmd.Process.Kill()
		<-done
		t.Fatalf("the process did not end after a second SIGINT:\n%s", stderr.String())
	}
	var ee *exec.ExitError
	if !errors.As(err, &ee) {
		t.Fatalf("after two SIGINTs: %v\n%s", err, stderr.String())
	}
	if ws, _ := ee.Sys().(syscall.WaitStatus); !ws.Signaled() || ws.Signal() != syscall.SIGINT {
		t.Fatalf("after two SIGINTs: %v (status %v), want death by SIGINT\n%s", err, ws, stderr.String())
	}
	for _, w := range []string{"SIGINT again stops at once", "second SIGINT: stopping at once"} {
		if !strings.Contains(stderr.String(), w) {
			t.Errorf("stderr lacks %q:\n%s", w, stderr.String())
		}
	}
	var vout bytes.Buffer
	if code := run([]string{"verify", out}, &vout, &bytes.Buffer{}); code != 0 {
		t.Fatalf("a checkpoint is damaged after the second signal:\n%s", vout.String())
	}
	mustTrain(t, append(trainArgs(out, 8), "--resume", "--set", "policy.megatron_cfg.scheduler.lr_decay_iters=1000000")...)
}
