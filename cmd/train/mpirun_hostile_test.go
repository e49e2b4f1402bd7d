package main

// Hostile runs under mpirun (issue 26): signals and waits across ranks.
// Every process must end within mpirunDeadline and leave no checkpoint
// that fails verify.

import (
	"bytes"
	"encoding/json"
	"fmt"
	"os"
	"os/exec"
	"path/filepath"
	"strings"
	"sync"
	"syscall"
	"testing"
	"time"

	"github.com/tracegrpo/tracegrpo/internal/testtool"
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
	cmd         *exec.Cmd
	out         *syncBuffer
	done        chan struct{} // closed when mpirun has exited
	pgrep, kill string        // procps's, as scripts/deps.sh provides them
}

// procTools are the pgrep and kill the rank-killing tests run (procps,
// through internal/testtool: a skip, or a failure under make test, when
// they are missing).
func procTools(t *testing.T) (pgrep, kill string) {
	t.Helper()
	return testtool.Path(t, "pgrep", "TRACEGRPO_REQUIRE_MPI"), testtool.Path(t, "kill", "TRACEGRPO_REQUIRE_MPI")
}

func startMpirun(t *testing.T, n int, env []string, args ...string) *mpirunJob {
	t.Helper()
	cmd := mpirunCmd(t, n, args...)
	cmd.Env = append(cmd.Env, env...)
	return runMpirun(t, cmd)
}

// runMpirun starts cmd (an mpirun) as a job whose output is kept, and
// kills whatever of it is still running when the test ends.
func runMpirun(t *testing.T, cmd *exec.Cmd) *mpirunJob {
	t.Helper()
	pgrep, kill := procTools(t)
	j := &mpirunJob{cmd: cmd, out: &syncBuffer{}, done: make(chan struct{}), pgrep: pgrep, kill: kill}
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
		kids, _ := exec.Command(j.pgrep, "-P", fmt.Sprint(j.cmd.Process.Pid)).Output()
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
	kids, _ := exec.Command(j.pgrep, "-P", fmt.Sprint(j.cmd.Process.Pid)).Output()
	for _, f := range strings.Fields(string(kids)) {
		exec.Command(j.kill, "-9", f).Run()
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
	code := j.wait(t, start) // within mpirunDeadline, far below --wait 10m: the stop, not the wait, ended it
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
		// mpirun forwards the signal to every rank; the first to see it
		// stops them all, so rank 0 reports its own SIGUSR1 or another
		// rank's stop request, whichever came first.
		stopped := strings.Contains(j.out.String(), "interrupted by SIGUSR1") || strings.Contains(j.out.String(), "interrupted by a stop request on another rank")
		if code != 1 || !stopped || !strings.Contains(j.out.String(), "written, continue with --resume") {
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

// mpirunRank is one rank of mpirunEach: its working directory, arguments
// and extra environment (NAME=value).
type mpirunRank struct {
	dir  string
	args []string
	env  []string
}

// mpirunEach starts this test binary as train under mpirun, one process per
// element of ranks (Open MPI's MPMD form), each with its own arguments and
// working directory.
func mpirunEach(t *testing.T, ranks []mpirunRank) *mpirunJob {
	t.Helper()
	path := testtool.Path(t, "mpirun", "TRACEGRPO_REQUIRE_MPI")
	argv := []string{"--allow-run-as-root", "--oversubscribe", "--mca", "btl_vader_single_copy_mechanism", "none"}
	for i, r := range ranks {
		if i > 0 {
			argv = append(argv, ":")
		}
		a, _ := json.Marshal(r.args)
		argv = append(argv, "-np", "1", "-wdir", r.dir, "-x", "TRACEGRPO_CLI_ARGS="+string(a))
		for _, kv := range r.env {
			argv = append(argv, "-x", kv)
		}
		argv = append(argv, os.Args[0], "-test.run=^$")
	}
	cmd := exec.Command(path, argv...)
	cmd.Env = os.Environ()
	return runMpirun(t, cmd)
}

// TestMpirunRanksAgreeAtStart (issue 26, item 1) under mpirun: ranks
// started with another --set, or in directories where the same rollouts
// path holds other records, stop together before any work, naming the key
// and each rank's value; nothing is trained and no checkpoint written.
func TestMpirunRanksAgreeAtStart(t *testing.T) {
	base := t.TempDir()
	recs, caps := externalFixture(t, base)
	data, err := os.ReadFile(recs)
	if err != nil {
		t.Fatal(err)
	}
	out := filepath.Join(base, "run")
	args := func(extra ...string) []string {
		return append([]string{"--out", out, "--quiet", "--backend", "cpu", "--steps", "1", "--rollouts", "rollouts.jsonl", "--captures", caps,
			"--set", "grpo.num_prompts_per_step=2", "--set", "grpo.num_generations_per_prompt=4", "--set", "policy.train_micro_batch_size=2"}, extra...)
	}
	var dirs []string
	for r := range 2 {
		d := filepath.Join(base, fmt.Sprintf("node%d", r))
		os.MkdirAll(d, 0o755)
		b := data
		if r == 1 { // the same path on another node, one reward changed
			b = bytes.Replace(data, []byte(`"reward": 0.5`), []byte(`"reward": 0`), 1)
		}
		if err := os.WriteFile(filepath.Join(d, "rollouts.jsonl"), b, 0o644); err != nil {
			t.Fatal(err)
		}
		dirs = append(dirs, d)
	}
	same := filepath.Join(dirs[0], "rollouts.jsonl")
	for _, tc := range []struct {
		name  string
		ranks []mpirunRank
		want  []string
	}{
		{"ratio_clip_max", []mpirunRank{{dirs[0], args(), nil}, {dirs[0], args("--set", "loss_fn.ratio_clip_max=0.3"), nil}},
			[]string{"loss_fn.ratio_clip_max differs", "rank 0: 0.2", "rank 1: 0.3"}},
		{"rollouts contents", []mpirunRank{{dirs[0], args(), nil}, {dirs[1], args(), nil}}, []string{"rollouts file differs", "sha256"}},
		{"--steps", []mpirunRank{{dirs[0], args("--rollouts", same), nil}, {dirs[1], args("--rollouts", same, "--steps", "2"), nil}}, []string{"grpo.max_num_steps differs"}},
	} {
		t.Run(tc.name, func(t *testing.T) {
			j := mpirunEach(t, tc.ranks)
			start := time.Now()
			code := j.wait(t, start)
			if code == 0 {
				t.Errorf("exit 0")
			}
			for _, w := range tc.want {
				if !strings.Contains(j.out.String(), w) {
					t.Errorf("the output does not say %q:\n%s", w, j.out.String())
				}
			}
			if _, err := os.Stat(filepath.Join(out, "metrics.jsonl")); err == nil {
				t.Errorf("the ranks trained")
			}
		})
	}
}

// TestSlurmAllocation (issue 26, item 16): inside a Slurm allocation
// (SLURM_PROCID and SLURM_NTASKS set, as a batch script sees them) a single
// process was refused even with --dist none, and mpirun inside the
// allocation was refused as "launchers disagree". --dist none runs one
// process (srun's other tasks stay refused), an allocation's shell is one
// process, and mpirun's ranks use Open MPI's numbers and train.
func TestSlurmAllocation(t *testing.T) {
	batch := []string{"SLURM_PROCID=0", "SLURM_NTASKS=4", "SLURM_LOCALID=0", "SLURM_JOB_ID=26"}
	for _, tc := range []struct {
		name string
		env  []string
		dist string
		code int
		want string
	}{
		{"batch script, --dist none", batch, "none", 0, "--dist none: one process"},
		{"srun task 2, --dist none", []string{"SLURM_PROCID=2", "SLURM_NTASKS=4", "SLURM_LOCALID=0"}, "none", 2, "task 2 of 4"},
		{"salloc shell", []string{"SLURM_NTASKS=4", "SLURM_JOB_ID=26"}, "auto", 0, ""},
	} {
		t.Run(tc.name, func(t *testing.T) {
			cmd := trainCommand(append(trainArgs(filepath.Join(t.TempDir(), "run"), 1), "--dist", tc.dist)...)
			cmd.Env = append(cmd.Env, tc.env...)
			out, _ := cmd.CombinedOutput()
			if code := cmd.ProcessState.ExitCode(); code != tc.code || !strings.Contains(string(out), tc.want) {
				t.Errorf("exit %d, want %d saying %q:\n%s", code, tc.code, tc.want, out)
			}
		})
	}
	t.Run("mpirun in the allocation", func(t *testing.T) {
		out := filepath.Join(t.TempDir(), "run")
		wd, _ := os.Getwd()
		j := mpirunEach(t, []mpirunRank{{wd, trainArgs(out, 2), batch}, {wd, trainArgs(out, 2), batch}})
		if code := j.wait(t, time.Now()); code != 0 || !strings.Contains(j.out.String(), "2 ranks over mpi (slurm+mpirun)") {
			t.Fatalf("exit %d, want 0 with 2 ranks:\n%s", code, j.out.String())
		}
		if ms := readMetricsNoTimes(t, out); len(ms) != 2 {
			t.Errorf("%d steps, want 2", len(ms))
		}
		mustVerify(t, out)
	})
}

// TestMpirunStoppedRankTimesOut (issue 34): a rank stopped with SIGSTOP
// made the others wait forever, polling at 40% CPU. With --rank-timeout,
// the job ends once the timeout has passed and the others' roll call has
// gone unanswered, with an error naming the stopped rank (alone), and the
// checkpoints already published still verify.
func TestMpirunStoppedRankTimesOut(t *testing.T) {
	out := filepath.Join(t.TempDir(), "run")
	// 12s, so the roll call's grace (a quarter of it, at least 1 s) is 3 s:
	// at 3s (a 1 s grace) a running rank on a machine at load 40 answered
	// late and was named silent beside the stopped one.
	j := startMpirun(t, 3, nil, distArgs(out, 500, "--rank-timeout", "12s")...)
	pids := j.ranks(t, 3)
	waitLines(t, j, out, 2)
	if err := exec.Command(j.kill, "-STOP", fmt.Sprint(pids[1])).Run(); err != nil {
		t.Fatal(err)
	}
	stopped := time.Now()
	code := j.wait(t, stopped)
	got := j.out.String()
	if code == 0 || !strings.Contains(got, "rank 1 is silent") || strings.Contains(got, "rank 0 is silent") || strings.Contains(got, "rank 2 is silent") || strings.Contains(got, " are silent") {
		t.Fatalf("exit %d; want a failure naming rank 1 alone silent:\n%s", code, got)
	}
	mustVerify(t, out)
}
