package main

// Hostile runs under mpirun (issue 26): signals and waits across ranks.
// Every process must end within mpirunDeadline and leave no checkpoint
// that fails verify.

import (
	"bytes"
	"fmt"
	"os"
	"os/exec"
	"path/filepath"
	"strings"
	"sync"
	"syscall"
	"testing"
	"time"
)

// mpirunDeadline bounds how long a stopped or failing mpirun job may take
// to end, every rank included.
const mpirunDeadline = 60 * time.Second

// syncBuffer is a bytes.Buffer safe for a process's output and a test
// reading it while the process runs.
type syncBuffer struct {
	mu sync.Mutex
	b  bytes.Buffer
}

func (s *syncBuffer) Write(p []byte) (int, error) {
	s.mu.Lock()
	defer s.mu.Unlock()
	return s.b.Write(p)
}

func (s *syncBuffer) String() string {
	s.mu.Lock()
	defer s.mu.Unlock()
	return s.b.String()
}

// mpirunJob is a running mpirun job of this test binary as train.
type mpirunJob struct {
	cmd  *exec.Cmd
	out  *syncBuffer
	done chan struct{} // closed when mpirun has exited
}

func startMpirun(t *testing.T, n int, env []string, args ...string) *mpirunJob {
	t.Helper()
	cmd := mpirunCmd(t, n, args...)
	cmd.Env = append(cmd.Env, env...)
	j := &mpirunJob{cmd: cmd, out: &syncBuffer{}, done: make(chan struct{})}
	cmd.Stdout, cmd.Stderr = j.out, j.out
	if err := cmd.Start(); err != nil {
		t.Fatal(err)
	}
	go func() {
		cmd.Wait()
		close(j.done)
	}()
	t.Cleanup(func() {
		select {
		case <-j.done:
		default:
			j.killAll()
			<-j.done
		}
	})
	return j
}

// ranks returns the pids of the job's ranks by rank (mpirun's children,
// named by their OMPI_COMM_WORLD_RANK).
func (j *mpirunJob) ranks(t *testing.T, n int) map[int]int {
	t.Helper()
	deadline := time.Now().Add(30 * time.Second)
	for {
		out := map[int]int{}
		kids, _ := exec.Command("pgrep", "-P", fmt.Sprint(j.cmd.Process.Pid)).Output()
		for _, f := range strings.Fields(string(kids)) {
			var pid int
			fmt.Sscan(f, &pid)
			env, err := os.ReadFile(fmt.Sprintf("/proc/%d/environ", pid))
			if err != nil {
				continue
			}
			for _, kv := range bytes.Split(env, []byte{0}) {
				var r int
				if _, err := fmt.Sscanf(string(kv), "OMPI_COMM_WORLD_RANK=%d", &r); err == nil {
					out[r] = pid
				}
			}
		}
		if len(out) == n {
			return out
		}
		if time.Now().After(deadline) {
			t.Fatalf("mpirun's ranks: found %v, want %d\n%s", out, n, j.out.String())
		}
		time.Sleep(50 * time.Millisecond)
	}
}

func (j *mpirunJob) killAll() {
	kids, _ := exec.Command("pgrep", "-P", fmt.Sprint(j.cmd.Process.Pid)).Output()
	for _, f := range strings.Fields(string(kids)) {
		exec.Command("kill", "-9", f).Run()
	}
	j.cmd.Process.Kill()
}

// waitFor waits until the job's output holds s.
func (j *mpirunJob) waitFor(t *testing.T, s string) {
	t.Helper()
	deadline := time.Now().Add(mpirunDeadline)
	for !strings.Contains(j.out.String(), s) {
		if time.Now().After(deadline) {
			t.Fatalf("no %q in the job's output after %v:\n%s", s, mpirunDeadline, j.out.String())
		}
		time.Sleep(20 * time.Millisecond)
	}
}

// wait waits for the job to end within mpirunDeadline and returns its exit
// status.
func (j *mpirunJob) wait(t *testing.T, since time.Time) int {
	t.Helper()
	select {
	case <-j.done:
	case <-time.After(time.Until(since.Add(mpirunDeadline))):
		j.killAll()
		t.Fatalf("the job did not end within %v:\n%s", mpirunDeadline, j.out.String())
	}
	t.Logf("the job ended %v after the event:\n%s", time.Since(since).Round(time.Millisecond), j.out.String())
	return j.cmd.ProcessState.ExitCode()
}

// waitLines waits until run directory out's metrics.jsonl has n lines.
func waitLines(t *testing.T, j *mpirunJob, out string, n int) {
	t.Helper()
	deadline := time.Now().Add(mpirunDeadline)
	for {
		b, _ := os.ReadFile(filepath.Join(out, "metrics.jsonl"))
		if bytes.Count(b, []byte{'\n'}) >= n {
			return
		}
		if time.Now().After(deadline) {
			t.Fatalf("no %d steps in %v:\n%s", n, mpirunDeadline, j.out.String())
		}
		time.Sleep(10 * time.Millisecond)
	}
}

// mustVerify fails when a checkpoint of run directory out fails verify.
func mustVerify(t *testing.T, out string) {
	t.Helper()
	var v bytes.Buffer
	if code := run([]string{"verify", out}, &v, &bytes.Buffer{}); code != 0 {
		t.Errorf("a checkpoint fails verify:\n%s", v.String())
	}
}

// TestMpirunStopWhileWaiting (issue 26, item 4): under mpirun -np 2, a
// SIGTERM to rank 1 while the ranks waited for a step file left rank 0
// waiting until --wait (here 10 minutes) ran out. Every rank now stops
// within a poll: the job ends in seconds, saying why.
func TestMpirunStopWhileWaiting(t *testing.T) {
	dir := t.TempDir()
	_, caps := externalFixture(t, dir)
	steps := filepath.Join(dir, "steps")
	if err := os.MkdirAll(steps, 0o755); err != nil {
		t.Fatal(err)
	}
	out := filepath.Join(dir, "run")
	j := startMpirun(t, 2, nil, "--out", out, "--backend", "cpu", "--steps", "1", "--wait", "10m",
		"--rollouts", steps, "--captures", caps, "--set", "grpo.num_prompts_per_step=2", "--set", "grpo.num_generations_per_prompt=4")
	j.waitFor(t, "train: compute:") // rank 0's last setup line: the ranks wait for step_1.jsonl
	time.Sleep(500 * time.Millisecond)
	pids := j.ranks(t, 2)
	start := time.Now()
	if err := syscall.Kill(pids[1], syscall.SIGTERM); err != nil {
		t.Fatal(err)
	}
	code := j.wait(t, start)
	if d := time.Since(start); d > 20*time.Second {
		t.Errorf("the job ended %v after rank 1's SIGTERM", d)
	}
	if code != 1 || !strings.Contains(j.out.String(), "interrupted by a stop request on another rank") {
		t.Errorf("exit %d, want 1 with rank 0 saying another rank was stopped:\n%s", code, j.out.String())
	}
}

// TestMpirunSignalsToMpirun (issue 26, item 17): a SIGTERM to mpirun
// itself reached the ranks, which announced a checkpoint, and Open MPI
// SIGKILLed them a second later with none written. mpirun forwards
// SIGUSR1 and does not kill: a SIGUSR1 to mpirun stops every rank after the
// step in progress with a checkpoint, and the run resumes from it. A
// SIGTERM to mpirun still ends the job at once (Open MPI's choice), but the
// ranks say what to send instead, and no checkpoint is left damaged.
func TestMpirunSignalsToMpirun(t *testing.T) {
	t.Run("SIGUSR1", func(t *testing.T) {
		out := filepath.Join(t.TempDir(), "run")
		j := startMpirun(t, 2, nil, distArgs(out, 1000000)...)
		waitLines(t, j, out, 2)
		start := time.Now()
		if err := j.cmd.Process.Signal(syscall.SIGUSR1); err != nil {
			t.Fatal(err)
		}
		code := j.wait(t, start)
		if code != 1 || !strings.Contains(j.out.String(), "interrupted by SIGUSR1") || !strings.Contains(j.out.String(), "written, continue with --resume") {
			t.Fatalf("SIGUSR1 to mpirun: exit %d, want 1 with a checkpoint written:\n%s", code, j.out.String())
		}
		mustVerify(t, out)
		n := len(readMetricsNoTimes(t, out))
		mustMpirun(t, 2, distArgs(out, n+1, "--resume", "--set", "policy.megatron_cfg.scheduler.lr_decay_iters=1000000")...)
		if got := len(readMetricsNoTimes(t, out)); got != n+1 {
			t.Errorf("resumed after SIGUSR1: %d steps, want %d", got, n+1)
		}
	})
	t.Run("SIGTERM", func(t *testing.T) {
		out := filepath.Join(t.TempDir(), "run")
		j := startMpirun(t, 2, nil, distArgs(out, 1000000)...)
		waitLines(t, j, out, 2)
		start := time.Now()
		if err := j.cmd.Process.Signal(syscall.SIGTERM); err != nil {
			t.Fatal(err)
		}
		code := j.wait(t, start)
		if code == 0 {
			t.Errorf("SIGTERM to mpirun: exit 0")
		}
		if !strings.Contains(j.out.String(), "SIGUSR1") || !strings.Contains(j.out.String(), "mpirun") {
			t.Errorf("the ranks do not say to send SIGUSR1 to mpirun:\n%s", j.out.String())
		}
		mustVerify(t, out)
	})
}
