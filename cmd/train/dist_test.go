package main

import (
	"bytes"
	"encoding/json"
	"fmt"
	"math"
	"os"
	"os/exec"
	"path/filepath"
	"strings"
	"testing"
	"time"

	"github.com/tracegrpo/tracegrpo/checkpoint"
	"github.com/tracegrpo/tracegrpo/gym"
	"github.com/tracegrpo/tracegrpo/internal/testtool"
	"github.com/tracegrpo/tracegrpo/trainer"
)

// mpirunCmd is this test binary started as train with args on n ranks by
// Open MPI's mpirun, or a skip (a failure with $TRACEGRPO_REQUIRE_MPI=1, as
// make test sets) without mpirun.
func mpirunCmd(t *testing.T, n int, args ...string) *exec.Cmd {
	t.Helper()
	path := testtool.Path(t, "mpirun", "TRACEGRPO_REQUIRE_MPI")
	a, _ := json.Marshal(args)
	cmd := exec.Command(path, "-np", fmt.Sprint(n), "--allow-run-as-root", "--oversubscribe",
		"--mca", "btl_vader_single_copy_mechanism", "none", "-x", "TRACEGRPO_CLI_ARGS", os.Args[0], "-test.run=^$")
	cmd.Env = append(os.Environ(), "TRACEGRPO_CLI_ARGS="+string(a))
	return cmd
}

func mustMpirun(t *testing.T, n int, args ...string) string {
	t.Helper()
	out, err := mpirunCmd(t, n, args...).CombinedOutput()
	if err != nil {
		t.Fatalf("mpirun -np %d train %s: %v\n%s", n, strings.Join(args, " "), err, out)
	}
	return string(out)
}

// distArgs are the built-in job shrunk for the data-parallel tests: three
// task groups (so 3 ranks get one each), a checkpoint every step, and the
// adam_eps that makes AdamW a smooth function of the gradient (so the
// bound below follows from the gradients' rounding).
func distArgs(out string, steps int, extra ...string) []string {
	return append(trainArgs(out, steps, "--set", "checkpointing.save_period=1",
		"--set", "policy.megatron_cfg.optimizer.adam_eps=1e-4"), extra...)
}

// distTol bounds the weight difference between world sizes. The ranks sum
// their gradients in another order than one process does (each its own
// micro-batches, then the ranks' sums): float32 sums differ by ~1e-7
// relative, and the largest gradient elements here are ~0.1, so a gradient
// moves by δg ≲ 1e-8. AdamW with eps 1e-4 amplifies that by at most
// lr/eps = 10 per step: ≲ 1e-7 per step (measured: 1.2e-7 after 4 steps on
// 2 ranks). 1e-6 (1e-3·lr) bounds 4 steps, while a wrong divisor or a lost
// rank's gradient moves weights by ~1e-4.
const distTol = 1e-6

func readMetricsNoTimes(t *testing.T, out string) []trainer.Metrics {
	t.Helper()
	ms, _, err := trainer.ReadMetrics(filepath.Join(out, "metrics.jsonl"))
	if err != nil {
		t.Fatal(err)
	}
	for i := range ms {
		ms[i].TokensPerS, ms[i].TimeS, ms[i].Phases = 0, 0, trainer.PhaseTimes{}
	}
	return ms
}

// ckptWeights reads the weights of run directory out's checkpoint of step.
func ckptWeights(t *testing.T, out string, step int) map[string][]float32 {
	t.Helper()
	return checkpointWeights(t, filepath.Join(out, "checkpoints", checkpoint.StepDir(int64(step))))
}

func maxDiff(a, b map[string][]float32) (float64, string) {
	worst, where := 0.0, ""
	for name, x := range a {
		for i, v := range x {
			if d := math.Abs(float64(v) - float64(b[name][i])); d > worst || d != d {
				worst, where = d, fmt.Sprintf("%s[%d]", name, i)
			}
		}
	}
	return worst, where
}

// sameData fails when two runs trained other data: rewards, rollouts, rows,
// tokens (the sampled rollouts are the same iff these are).
func sameData(t *testing.T, what string, want, got []trainer.Metrics) {
	t.Helper()
	if len(got) != len(want) {
		t.Fatalf("%s: %d metric lines, want %d", what, len(got), len(want))
	}
	for i := range got {
		w, g := want[i], got[i]
		if g.Step != w.Step || g.RewardMean != w.RewardMean || g.RewardStd != w.RewardStd || g.LogicalRollouts != w.LogicalRollouts ||
			g.EligibleTokens != w.EligibleTokens || g.Traces != w.Traces || g.PhysicalRows != w.PhysicalRows ||
			g.PaddingRows != w.PaddingRows || g.TrainTokens != w.TrainTokens || g.MaskedRollouts != w.MaskedRollouts {
			t.Errorf("%s: step %d trained other data:\n got %+v\nwant %+v", what, i+1, g, w)
		}
	}
}

// TestMpirunTrainsLikeOneProcess: mpirun -np 2 and -np 3 runs of the
// built-in job sample the same rollouts as one process, end every step
// with its weights within distTol, are bit-identical when repeated, and
// leave exactly the files one process leaves (only rank 0 writes).
func TestMpirunTrainsLikeOneProcess(t *testing.T) {
	const steps = 4
	ref := t.TempDir()
	mustTrain(t, distArgs(ref, steps)...)
	want := readMetricsNoTimes(t, ref)
	for _, n := range []int{2, 3} {
		a, b := t.TempDir(), t.TempDir()
		mustMpirun(t, n, distArgs(a, steps)...)
		mustMpirun(t, n, distArgs(b, steps)...)
		sameData(t, fmt.Sprintf("%d ranks", n), want, readMetricsNoTimes(t, a))
		for s := 1; s <= steps; s++ {
			d, where := maxDiff(ckptWeights(t, ref, s), ckptWeights(t, a, s))
			if d > distTol {
				t.Errorf("%d ranks, step %d: weights differ from one process by %.3g at %s", n, s, d, where)
			}
			if s == steps {
				t.Logf("%d ranks: largest weight difference from one process after %d steps: %.3g (bound %g)", n, steps, d, distTol)
			}
		}
		for _, f := range []string{checkpoint.ModelFile, "optimizer.safetensors"} {
			ca, _ := os.ReadFile(filepath.Join(a, "checkpoints", checkpoint.StepDir(steps), f))
			cb, _ := os.ReadFile(filepath.Join(b, "checkpoints", checkpoint.StepDir(steps), f))
			if len(ca) == 0 || !bytes.Equal(ca, cb) {
				t.Errorf("two runs on %d ranks: %s differs", n, f)
			}
		}
		if got, wantFiles := runFiles(t, a), runFiles(t, ref); got != wantFiles {
			t.Errorf("%d ranks left other files than one process:\n%s\nwant\n%s", n, got, wantFiles)
		}
	}
}

// runFiles lists a run directory's files, recursively, without checkpoint
// step directories' names (their number depends on retention only).
func runFiles(t *testing.T, dir string) string {
	t.Helper()
	var names []string
	filepath.Walk(dir, func(p string, info os.FileInfo, err error) error {
		if err == nil && p != dir {
			rel, _ := filepath.Rel(dir, p)
			names = append(names, rel)
		}
		return nil
	})
	return strings.Join(names, "\n")
}

// TestMpirunResumeOnOtherWorldSizes: a checkpoint written by 2 ranks
// resumes on 1 and on 3 ranks and finishes the run as one uninterrupted
// process does (same data, weights within distTol); the world size is not
// part of the run's identity.
func TestMpirunResumeOnOtherWorldSizes(t *testing.T) {
	const steps = 4
	ref := t.TempDir()
	mustTrain(t, distArgs(ref, steps)...)
	want := readMetricsNoTimes(t, ref)
	for _, n := range []int{1, 3} {
		out := t.TempDir()
		mustMpirun(t, 2, distArgs(out, steps, "--set", "policy.megatron_cfg.scheduler.lr_decay_iters=4", "--steps", "2")...)
		args := distArgs(out, steps, "--set", "policy.megatron_cfg.scheduler.lr_decay_iters=4", "--resume")
		if n == 1 {
			mustTrain(t, args...)
		} else {
			mustMpirun(t, n, args...)
		}
		sameData(t, fmt.Sprintf("2 ranks, then %d", n), want, readMetricsNoTimes(t, out))
		d, where := maxDiff(ckptWeights(t, ref, steps), ckptWeights(t, out, steps))
		if d > distTol {
			t.Errorf("resumed on %d ranks: weights differ from one process by %.3g at %s", n, d, where)
		}
	}
}

// TestMpirunOneRankFailing: a failure on one rank stops every rank with its
// error, naming the rank, and nothing hangs: an error every rank learns of
// at the same point (a bad record in rank 1's share), and a rank that dies
// in the middle of the run (SIGKILL).
func TestMpirunOneRankFailing(t *testing.T) {
	dir := t.TempDir()
	// Two task groups; group 1's record 2 has a malformed rollout id, so
	// rank 1 alone fails to finalize its share of step 1.
	steps := filepath.Join(dir, "steps")
	os.MkdirAll(filepath.Join(dir, "captures"), 0o755)
	os.MkdirAll(steps, 0o755)
	var recs bytes.Buffer
	for g := 0; g < 2; g++ {
		for i := 0; i < 4; i++ {
			id := fmt.Sprintf("r-%d-%d", g, i)
			if g == 1 && i == 2 {
				id = "../escape"
			}
			fmt.Fprintf(&recs, `{"_ng_task_index": %d, "_ng_rollout_index": %d, "_ng_rollout_id": %q, "reward": 1}`+"\n", g, i, id)
		}
	}
	os.WriteFile(filepath.Join(steps, "step_1.jsonl"), recs.Bytes(), 0o644)
	out := filepath.Join(dir, "run")
	cmd := mpirunCmd(t, 2, "--out", out, "--quiet", "--backend", "cpu", "--steps", "1", "--wait", "1m",
		"--rollouts", steps, "--captures", filepath.Join(dir, "captures"),
		"--set", "grpo.num_prompts_per_step=2", "--set", "grpo.num_generations_per_prompt=4")
	start := time.Now()
	b, err := cmd.CombinedOutput()
	if err == nil || time.Since(start) > time.Minute {
		t.Fatalf("a failing rank: %v after %v\n%s", err, time.Since(start), b)
	}
	if !strings.Contains(string(b), "rank 1: step 1:") || !strings.Contains(string(b), "escape") {
		t.Errorf("the error does not name rank 1 and the record:\n%s", b)
	}

	// A rank killed in the middle of a run ends the job at once.
	pgrep, kill := procTools(t)
	out = filepath.Join(dir, "killed")
	cmd = mpirunCmd(t, 2, distArgs(out, 1000000)...)
	var buf bytes.Buffer
	cmd.Stdout, cmd.Stderr = &buf, &buf
	if err := cmd.Start(); err != nil {
		t.Fatal(err)
	}
	deadline := time.Now().Add(time.Minute)
	for {
		m, _ := os.ReadFile(filepath.Join(out, "metrics.jsonl"))
		if bytes.Count(m, []byte{'\n'}) >= 3 {
			break
		}
		if time.Now().After(deadline) {
			cmd.Process.Kill()
			t.Fatalf("no 3 steps in a minute:\n%s", buf.String())
		}
		time.Sleep(10 * time.Millisecond)
	}
	// mpirun's children are the ranks: kill one of them.
	kids, _ := exec.Command(pgrep, "-P", fmt.Sprint(cmd.Process.Pid)).Output()
	pids := strings.Fields(string(kids))
	if len(pids) < 2 {
		cmd.Process.Kill()
		t.Fatalf("mpirun has %d children: %q", len(pids), kids)
	}
	exec.Command(kill, "-9", pids[len(pids)-1]).Run()
	done := make(chan error, 1)
	go func() { done <- cmd.Wait() }()
	select {
	case err := <-done:
		if err == nil {
			t.Errorf("the job exited 0 after a rank was killed:\n%s", buf.String())
		}
	case <-time.After(time.Minute):
		cmd.Process.Kill()
		t.Fatalf("the other rank hung after one was killed:\n%s", buf.String())
	}
	var v bytes.Buffer
	if code := run([]string{"verify", out}, &v, &bytes.Buffer{}); code != 0 {
		t.Errorf("a checkpoint is damaged after a rank was killed:\n%s", v.String())
	}
}

// TestMpirunExternalRollouts: external rollout records split across 2
// ranks (one task group each) give the update one process gives.
func TestMpirunExternalRollouts(t *testing.T) {
	dir := t.TempDir()
	recs, caps := externalFixture(t, dir)
	args := func(out string) []string {
		return []string{"--out", out, "--quiet", "--backend", "cpu", "--steps", "1", "--rollouts", recs, "--captures", caps,
			"--set", "grpo.num_prompts_per_step=2", "--set", "grpo.num_generations_per_prompt=4",
			"--set", "policy.train_micro_batch_size=2", "--set", "policy.megatron_cfg.optimizer.adam_eps=1e-4"}
	}
	ref, out := filepath.Join(dir, "one"), filepath.Join(dir, "two")
	mustTrain(t, args(ref)...)
	mustMpirun(t, 2, args(out)...)
	sameData(t, "2 ranks, external", readMetricsNoTimes(t, ref), readMetricsNoTimes(t, out))
	d, where := maxDiff(ckptWeights(t, ref, 1), ckptWeights(t, out, 1))
	if d > distTol {
		t.Errorf("external rollouts on 2 ranks: weights differ from one process by %.3g at %s", d, where)
	}
	t.Logf("external rollouts on 2 ranks: largest weight difference %.3g (bound %g)", d, distTol)
}

// externalFixture writes, with gym's writer, one step of external rollouts:
// two task groups of four rollouts, each a tool call and an answer that
// continues it, with rewards that differ within each group.
func externalFixture(t *testing.T, dir string) (records, captures string) {
	t.Helper()
	captures = filepath.Join(dir, "captures")
	w, err := gym.NewWriter(captures)
	if err != nil {
		t.Fatal(err)
	}
	w.SetFsync(false)
	put := func(rid, call, parent string, prompt, gen []int32) {
		t.Helper()
		lp := make([]float64, len(gen))
		for i := range lp {
			lp[i] = -1.5 - 0.25*float64(i)
		}
		if err := w.Put(gym.NewCallEntry(rid, call, "m", prompt, gen, lp, parent, "")); err != nil {
			t.Fatal(err)
		}
	}
	var recs bytes.Buffer
	for task := 0; task < 2; task++ {
		for i := 0; i < 4; i++ {
			rid := fmt.Sprintf("ext-%d-%d", task, i)
			put(rid, "c1", "", []int32{1, 3, int32(10 + i), 9, 11, 4}, []int32{5, 2})
			put(rid, "c2", "c1", []int32{1, 3, int32(10 + i), 9, 11, 4, 5, 2, 6, 12, 4}, []int32{int32(10 + i), 2})
			if err := w.Freeze(rid); err != nil {
				t.Fatal(err)
			}
			fmt.Fprintf(&recs, `{"_ng_task_index": %d, "_ng_rollout_index": %d, "_ng_rollout_id": %q, "reward": %v, "response": {"id": "r"}}`+"\n",
				task, i, rid, float64((task+i)%3)/2)
		}
	}
	records = filepath.Join(dir, "rollouts.jsonl")
	if err := os.WriteFile(records, recs.Bytes(), 0o644); err != nil {
		t.Fatal(err)
	}
	return records, captures
}
