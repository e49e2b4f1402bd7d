package trainer

// Hostile runs (issue 26) at the trainer's level.

import (
	"bytes"
	"context"
	"errors"
	"fmt"
	"math"
	"os"
	"os/exec"
	"path/filepath"
	"strings"
	"sync"
	"syscall"
	"testing"
	"time"

	"github.com/spf13/pflag"
	"github.com/tracegrpo/tracegrpo/checkpoint"
	"github.com/tracegrpo/tracegrpo/collective"
	"github.com/tracegrpo/tracegrpo/kernels"
	"github.com/tracegrpo/tracegrpo/kernels/cpu"
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

// TestOutputsNeverOverlapInputs (issue 26, item 2): train --init-from
// R/checkpoints/step_2 --out R/checkpoints/step_2 wrote its run into that
// checkpoint, which then failed verify on .lock and was refused by
// --resume. A run directory or capture output that is, or lies inside, an
// input directory is refused before anything is written, and so is an input
// inside the directories a run writes and prunes (its checkpoints, its
// captures). The checkpoint still verifies after each refusal.
func TestOutputsNeverOverlapInputs(t *testing.T) {
	dir := t.TempDir()
	r := filepath.Join(dir, "R")
	mustTrain(t, trainArgs(r, 2)...)
	step := filepath.Join(r, "checkpoints", checkpoint.StepDir(2))
	recs, caps := gymFixture(t, dir)
	for _, tc := range []struct {
		name string
		args []string
		want []string
	}{
		{"out is the init checkpoint", trainArgs(step, 1, "--init-from", step), []string{"--out", "--init-from", step}},
		{"out inside the init checkpoint", trainArgs(filepath.Join(step, "run"), 1, "--init-from", step), []string{"--out", "inside", "--init-from"}},
		{"init checkpoint inside the run's checkpoints", trainArgs(r, 3, "--init-from", step, "--resume"), []string{"--init-from", "inside", "checkpoints"}},
		{"out inside the capture store", append([]string{"--out", filepath.Join(caps, "run"), "--steps", "1", "--rollouts", recs, "--captures", caps}, externalSets...),
			[]string{"--out", "inside", "--captures"}},
		{"captures written into the init checkpoint", trainArgs(filepath.Join(dir, "r2"), 1, "--init-from", step, "--set", "env.nemo_gym.token_id_capture.dir="+step),
			[]string{"env.nemo_gym.token_id_capture.dir", "--init-from"}},
		{"init checkpoint inside the saved captures", trainArgs(filepath.Join(dir, "r3"), 1, "--init-from", step, "--save-captures",
			"--set", "env.nemo_gym.token_id_capture.dir="+r), []string{"--init-from", "env.nemo_gym.token_id_capture.dir"}},
	} {
		t.Run(tc.name, func(t *testing.T) {
			var stdout, stderr bytes.Buffer
			code := run(tc.args, &stdout, &stderr)
			if code != 2 {
				t.Errorf("exit %d, want 2 (a usage error)\n%s", code, stderr.String())
			}
			for _, w := range tc.want {
				if !strings.Contains(stderr.String(), w) {
					t.Errorf("the refusal does not say %q:\n%s", w, stderr.String())
				}
			}
			if _, err := checkpoint.Verify(step); err != nil {
				t.Fatalf("the input checkpoint no longer verifies: %v", err)
			}
		})
	}
	if _, err := os.Stat(filepath.Join(caps, "run")); err == nil {
		t.Errorf("a refused run created its directory inside the capture store")
	}
}

// TestNonFiniteUpdateIsNeverSaved (issue 26, item 3): with lr=3e38 step 1's
// update made every weight non-finite; the checkpoint was written, passed
// verify and resumed into a NaN in sampling (the guard looked at the
// gradients only). The weights are checked after the update: the run stops
// there, naming the parameter, with --on-nonfinite skip or abort, on one
// rank or two, and writes no checkpoint and no metrics line of that step.
func TestNonFiniteUpdateIsNeverSaved(t *testing.T) {
	for _, tc := range []struct {
		ranks, savePeriod int // step 1 is a checkpoint's with save period 1
		mode, shard       string
	}{{1, 2, "skip", "none"}, {1, 1, "skip", "none"}, {1, 2, "abort", "none"}, {2, 2, "skip", "none"}, {2, 1, "skip", "none"},
		{2, 2, "skip", "full"}, {2, 1, "abort", "full"}} {
		t.Run(fmt.Sprintf("%d ranks, %s, save period %d, shard %s", tc.ranks, tc.mode, tc.savePeriod, tc.shard), func(t *testing.T) {
			out := t.TempDir()
			args := trainArgs(out, 2, "--set", fmt.Sprintf("checkpointing.save_period=%d", tc.savePeriod), "--on-nonfinite", tc.mode,
				"--set", "policy.megatron_cfg.optimizer.lr=3e38", "--shard", tc.shard)
			var errs []error
			var logs []string
			if tc.ranks == 1 {
				var stderr bytes.Buffer
				code := run(args, &bytes.Buffer{}, &stderr)
				errs, logs = []error{fmt.Errorf("exit %d: %s", code, stderr.String())}, []string{stderr.String()}
				if code != 1 {
					t.Errorf("exit %d, want 1", code)
				}
			} else {
				errs, logs = runLocalRanks(t, tc.ranks, args...)
			}
			for r, err := range errs {
				if err == nil || !strings.Contains(err.Error(), "step 1: the update made the weights of") || !strings.Contains(err.Error(), "not finite") {
					t.Errorf("rank %d: %v, want step 1's weights named as not finite\n%s", r, err, logs[r])
				}
				if tc.ranks > 1 && !Agreed(err) {
					t.Errorf("rank %d: %v is not an error the ranks agreed on", r, err)
				}
			}
			if ents, err := checkpoint.List(filepath.Join(out, "checkpoints")); err == nil && len(ents) > 0 {
				t.Errorf("a checkpoint of non-finite weights was written: %v", ents)
			}
			if b, _ := os.ReadFile(filepath.Join(out, "metrics.jsonl")); len(b) > 0 {
				t.Errorf("a metrics line of the failed step was written:\n%s", b)
			}
		})
	}
}

// TestCheckpointRefusesNonFiniteWeights: whatever made them so, weights or
// moments that are not finite are never written to a checkpoint (a second
// line behind the check after the update).
func TestCheckpointRefusesNonFiniteWeights(t *testing.T) {
	out := t.TempDir()
	var saveErr error
	errs, logs := eachLocalRank(t, 1, trainArgs(out, 1), nil, func(_ int, tr *Trainer) error {
		if err := tr.Run(); err != nil {
			return err
		}
		host, ok := tr.hostView(tr.model.Params())
		if !ok {
			return errors.New("the CPU backend has no host view")
		}
		host[len(host)-1] = float32(math.Inf(1))
		saveErr = tr.save()
		return nil
	})
	if errs[0] != nil {
		t.Fatalf("%v\n%s", errs[0], logs[0])
	}
	if saveErr == nil || !strings.Contains(saveErr.Error(), "not finite") || !strings.Contains(saveErr.Error(), "lm_head") && !strings.Contains(saveErr.Error(), "model.") {
		t.Errorf("saving non-finite weights: %v, want a refusal naming the parameter", saveErr)
	}
	ents, _ := checkpoint.List(filepath.Join(out, "checkpoints"))
	if len(ents) != 1 || ents[0].Step != 1 {
		t.Errorf("checkpoints after the refusal: %v, want step 1's alone", ents)
	}
}

// requestStop delivers a stop request to tr as Options.Signals would (the
// watcher's own close).
func requestStop(tr *Trainer, sig os.Signal) {
	tr.stop.sig = sig
	close(tr.stop.stopped)
}

// TestStopReachesEveryWaitingRank (issue 26, item 4): a SIGTERM to one rank
// while the ranks waited for a rollout file stopped that rank, and the
// others waited on until --wait ran out. The ranks share stop requests
// while they wait: every rank stops, naming the request. The cause is read
// from the errors, not from a stopwatch: a rank that waited --wait out
// would end with a timeout, not an agreed interrupt, and the guard below
// fires long before --wait (10m) could.
func TestStopReachesEveryWaitingRank(t *testing.T) {
	dir := t.TempDir()
	_, caps := gymFixture(t, dir)
	steps := filepath.Join(dir, "steps")
	if err := os.MkdirAll(steps, 0o755); err != nil {
		t.Fatal(err)
	}
	args := append([]string{"--out", filepath.Join(dir, "run"), "--rollouts", steps, "--captures", caps, "--steps", "1", "--wait", "10m"}, externalSets...)
	done := make(chan struct{})
	var errs []error
	var logs []string
	go func() {
		defer close(done)
		errs, logs = eachLocalRank(t, 2, args, nil, func(r int, tr *Trainer) error {
			if r == 1 {
				time.AfterFunc(500*time.Millisecond, func() { requestStop(tr, syscall.SIGTERM) })
			}
			return tr.Run()
		})
	}()
	select {
	case <-done:
	case <-time.After(3 * time.Minute):
		t.Fatal("the ranks still wait 3 minutes after rank 1 got a SIGTERM (--wait 10m): a hang")
	}
	for r, err := range errs {
		if !errors.Is(err, errInterrupted) || !Agreed(err) {
			t.Errorf("rank %d: %v, want an agreed stop\n%s", r, err, logs[r])
		}
	}
	if errs[1] != nil && !strings.Contains(errs[1].Error(), "SIGTERM") {
		t.Errorf("rank 1: %v does not name its SIGTERM", errs[1])
	}
	if errs[0] != nil && !strings.Contains(errs[0].Error(), "another rank") {
		t.Errorf("rank 0: %v does not say the stop came from another rank", errs[0])
	}
}

// TestStopDuringCheckpointWrite (issue 26, item 7): a SIGTERM that arrived
// while a checkpoint was being written ran one more full step before the
// run stopped. It now stops right after that checkpoint, on one rank or
// two, and the checkpoint verifies.
func TestStopDuringCheckpointWrite(t *testing.T) {
	for _, n := range []int{1, 2} {
		t.Run(fmt.Sprintf("%d ranks", n), func(t *testing.T) {
			out := t.TempDir()
			errs, logs := eachLocalRank(t, n, trainArgs(out, 3, "--set", "checkpointing.save_period=1"), nil, func(r int, tr *Trainer) error {
				if r == 0 {
					// The metrics line is synced between the checkpoint's
					// write and its publication: the signal comes then.
					tr.metricsFile = &stopAtSync{metricsFile: tr.metricsFile, stop: func() { requestStop(tr, syscall.SIGTERM) }}
				}
				return tr.Run()
			})
			for r, err := range errs {
				if !errors.Is(err, errInterrupted) || !strings.Contains(err.Error(), "after step 1") {
					t.Errorf("rank %d: %v, want a stop after step 1\n%s", r, err, logs[r])
				}
			}
			if ms := metricsNoTimes(t, out); len(ms) != 1 {
				t.Errorf("%d steps ran, want 1 (the stop came during step 1's checkpoint)", len(ms))
			}
			if _, err := checkpoint.Verify(filepath.Join(out, "checkpoints", checkpoint.StepDir(1))); err != nil {
				t.Error(err)
			}
		})
	}
}

// stopAtSync requests a stop at the first Sync of metrics.jsonl.
type stopAtSync struct {
	metricsFile
	stop func()
	done bool
}

func (s *stopAtSync) Sync() error {
	if !s.done {
		s.done = true
		s.stop()
	}
	return s.metricsFile.Sync()
}

// TestRanksReadDifferentStepFiles: ranks whose step_<N>.jsonl differ (a
// rollouts directory not shared between nodes) fail the step together,
// naming each rank's file and sha256, instead of training on different
// data.
func TestRanksReadDifferentStepFiles(t *testing.T) {
	dir := t.TempDir()
	recs, caps := gymFixture(t, dir)
	data, err := os.ReadFile(recs)
	if err != nil {
		t.Fatal(err)
	}
	var stepDirs []string
	for r := range 2 {
		d := filepath.Join(dir, fmt.Sprintf("steps%d", r))
		os.MkdirAll(d, 0o755)
		b := data
		if r == 1 { // the same records, one reward changed
			b = bytes.Replace(data, []byte(`"reward": 1`), []byte(`"reward": 0`), 1)
		}
		if err := os.WriteFile(filepath.Join(d, "step_1.jsonl"), b, 0o644); err != nil {
			t.Fatal(err)
		}
		stepDirs = append(stepDirs, d)
	}
	args := append([]string{"--out", filepath.Join(dir, "run"), "--rollouts", stepDirs[0], "--captures", caps, "--steps", "1"}, externalSets...)
	errs, _ := eachLocalRank(t, 2, args, nil, func(r int, tr *Trainer) error {
		tr.source.(*externalSource).path = stepDirs[r] // as if each node had its own copy
		return tr.Run()
	})
	for r, err := range errs {
		if err == nil || !Agreed(err) || !strings.Contains(err.Error(), "different rollouts") || !strings.Contains(err.Error(), "sha256") {
			t.Errorf("rank %d: %v, want an agreed error naming the differing step files", r, err)
		}
	}
}

// runRanksEach runs train on len(args) in-process ranks, rank r with
// args[r], and fails the test when they are not all done within d (a rank
// left waiting in a collective).
func runRanksEach(t *testing.T, d time.Duration, args [][]string) ([]error, []string) {
	t.Helper()
	n := len(args)
	mems := make([]kernels.Backend, n)
	for i := range mems {
		b := cpu.New(1)
		t.Cleanup(b.Close)
		mems[i] = b
	}
	comms := collective.Local(mems)
	errs := make([]error, n)
	logs := make([]bytes.Buffer, n)
	var wg sync.WaitGroup
	for r := range n {
		wg.Add(1)
		go func() {
			defer wg.Done()
			var o Options
			fs := newTestFlags()
			o.AddFlags(fs)
			if err := fs.Parse(args[r]); err != nil {
				errs[r] = err
				comms[r].Abort(1)
				return
			}
			o.Backend, o.Comm, o.Log = mems[r], comms[r], &logs[r]
			tr, err := New(o)
			if err == nil {
				err = tr.Run()
				tr.Close()
			}
			if err != nil && !Agreed(err) {
				comms[r].Abort(1)
			}
			errs[r] = err
		}()
	}
	done := make(chan struct{})
	go func() { wg.Wait(); close(done) }()
	select {
	case <-done:
	case <-time.After(d):
		for _, c := range comms {
			c.Abort(1)
		}
		t.Fatalf("the ranks were not done %v after they started", d)
	}
	out := make([]string, n)
	for r := range logs {
		out[r] = logs[r].String()
	}
	return errs, out
}

// TestRanksAgreeOnTheRunAtStart (issue 26, item 1): ranks started with
// different settings or data trained silently on them (rank 1 the built-in
// tasks while rank 0 trained external rollouts, only rank 0's config
// recorded), were caught at the first checkpoint with a message blaming
// the file system, or failed with "gob: type mismatch". Before any work the
// ranks now agree on one digest of the run's identity; a difference stops
// every rank, naming the first differing key and each rank's value.
func TestRanksAgreeOnTheRunAtStart(t *testing.T) {
	dir := t.TempDir()
	recs, caps := gymFixture(t, dir)
	other := filepath.Join(dir, "other.jsonl")
	data, _ := os.ReadFile(recs)
	os.WriteFile(other, bytes.Replace(data, []byte(`"reward": 1`), []byte(`"reward": 0`), 1), 0o644)
	init := filepath.Join(dir, "init")
	mustTrain(t, trainArgs(filepath.Join(dir, "w0"), 1)...)
	os.Rename(filepath.Join(dir, "w0", "checkpoints", "step_1"), init)
	external := func(out string, extra ...string) []string {
		return append(append([]string{"--out", out, "--steps", "1", "--rollouts", recs, "--captures", caps}, externalSets...), extra...)
	}
	for _, tc := range []struct {
		name   string
		r0, r1 func(out string) []string
		key    string // the first differing key, named
	}{
		{"--rollouts on one rank only", func(o string) []string { return external(o) }, func(o string) []string { return trainArgs(o, 1) }, "--rollouts"},
		{"--rollouts files differ", func(o string) []string { return external(o) },
			func(o string) []string { return append(external(o), "--rollouts", other) }, "--rollouts"},
		{"--captures", func(o string) []string { return external(o) }, func(o string) []string { return append(external(o), "--captures", dir) }, "--captures"},
		{"--save-captures", func(o string) []string { return trainArgs(o, 1) }, func(o string) []string { return trainArgs(o, 1, "--save-captures") }, "--save-captures"},
		{"ratio_clip_max", func(o string) []string { return trainArgs(o, 1) }, func(o string) []string { return trainArgs(o, 1, "--set", "loss_fn.ratio_clip_max=0.3") }, "loss_fn.ratio_clip_max"},
		{"max_total_sequence_length", func(o string) []string { return trainArgs(o, 1) },
			func(o string) []string { return trainArgs(o, 1, "--set", "policy.max_total_sequence_length=48") }, "policy.max_total_sequence_length"},
		{"temperature", func(o string) []string { return trainArgs(o, 1) },
			func(o string) []string { return trainArgs(o, 1, "--set", "policy.generation.temperature=0.7") }, "policy.generation.temperature"},
		{"train_micro_batch_size", func(o string) []string { return trainArgs(o, 1) },
			func(o string) []string { return trainArgs(o, 1, "--set", "policy.train_micro_batch_size=4") }, "policy.train_micro_batch_size"},
		{"lr", func(o string) []string { return trainArgs(o, 1) }, func(o string) []string { return trainArgs(o, 1, "--set", "policy.megatron_cfg.optimizer.lr=2e-3") }, "lr"},
		{"seed", func(o string) []string { return trainArgs(o, 1) }, func(o string) []string { return trainArgs(o, 1, "--set", "grpo.seed=7") }, "grpo.seed"},
		{"--steps", func(o string) []string { return trainArgs(o, 2) }, func(o string) []string { return trainArgs(o, 3) }, "grpo.max_num_steps"},
		{"save_period", func(o string) []string { return trainArgs(o, 2) }, func(o string) []string { return trainArgs(o, 2, "--set", "checkpointing.save_period=1") }, "checkpointing.save_period"},
		{"--on-nonfinite", func(o string) []string { return trainArgs(o, 1) }, func(o string) []string { return trainArgs(o, 1, "--on-nonfinite", "abort") }, "--on-nonfinite"},
		{"--init-from", func(o string) []string { return trainArgs(o, 1) }, func(o string) []string { return trainArgs(o, 1, "--init-from", init) }, "init"},
		{"--tasks", func(o string) []string { return trainArgs(o, 1) }, func(o string) []string { return trainArgs(o, 1, "--tasks", "calc") }, "--tasks"},
	} {
		t.Run(tc.name, func(t *testing.T) {
			out := filepath.Join(t.TempDir(), "run")
			errs, logs := runRanksEach(t, 60*time.Second, [][]string{tc.r0(out), tc.r1(out)})
			for r, err := range errs {
				if err == nil || !Agreed(err) || !strings.Contains(err.Error(), tc.key) || !strings.Contains(err.Error(), " differs:") ||
					!strings.Contains(err.Error(), "rank 0") || !strings.Contains(err.Error(), "rank 1") {
					t.Errorf("rank %d: %v\nwant an agreed error naming %s and each rank's value\n%s", r, err, tc.key, logs[r])
				}
			}
			if _, err := os.Stat(filepath.Join(out, "metrics.jsonl")); err == nil {
				t.Errorf("the ranks started training")
			}
		})
	}
}

// TestWeightsCheckSaysWhy (issue 26, item 1): the ranks' weights check,
// the second line behind the agreement at start, blamed the file system at
// every checkpoint. At start it names the weights' source; after steps,
// with the run agreed on, it says an update diverged and that the step is
// not saved.
func TestWeightsCheckSaysWhy(t *testing.T) {
	for _, tc := range []struct{ when, want, not string }{
		{"start", "after loading them", "applied the same updates"},
		{"step 3", "applied the same updates", "file system"},
	} {
		errs := make([]error, 2)
		setup, _ := eachLocalRank(t, 2, trainArgs(t.TempDir(), 1), nil, func(r int, tr *Trainer) error {
			if r == 1 {
				tr.model.InitRandom(99)
			}
			errs[r] = tr.checkSameWeights(tc.when)
			return nil
		})
		for r := range 2 {
			if setup[r] != nil {
				t.Fatal(setup[r])
			}
			if err := errs[r]; err == nil || !strings.Contains(err.Error(), tc.want) || strings.Contains(err.Error(), tc.not) {
				t.Errorf("%s, rank %d: %v; want it to say %q, not %q", tc.when, r, err, tc.want, tc.not)
			}
		}
	}
}

// TestIdentityCoversEveryFlag: every flag of a run is in the ranks'
// identity at start, or listed here with the reason it is not; a new flag
// that changes training cannot be forgotten.
func TestIdentityCoversEveryFlag(t *testing.T) {
	notInIdentity := map[string]string{
		"config": "its keys are, in the effective config", "set": "in the effective config",
		"override": "in the effective config", "steps": "in the effective config (grpo.max_num_steps)",
		"quiet": "changes output only", "wait": "rank 0's decides for every rank",
		"weights-out": "in the effective config (policy.generation.weights_out)", "weights-dtype": "in the effective config (policy.generation.weights_dtype)",
		"weights-keep": "in the effective config (policy.generation.weights_keep)",
	}
	var keys map[string]bool
	errs, logs := eachLocalRank(t, 1, trainArgs(t.TempDir(), 1), nil, func(_ int, tr *Trainer) error {
		id, err := tr.startIdentity()
		keys = map[string]bool{}
		for _, it := range id {
			keys[it.Key] = true
		}
		return err
	})
	if errs[0] != nil {
		t.Fatalf("%v\n%s", errs[0], logs[0])
	}
	var o Options
	fs := newTestFlags()
	o.AddFlags(fs)
	fs.VisitAll(func(f *pflag.Flag) {
		if _, ok := notInIdentity[f.Name]; !ok && !keys["--"+f.Name] {
			t.Errorf("--%s is not in the ranks' identity at start (trainer/agree.go)", f.Name)
		}
	})
}

// TestStepFileShortOrTorn (QA round): the trainer reads a step file as
// soon as it appears, so a generator that writes it in place (as Gym's
// rollout collection writes its output) is read short or torn; the run
// stops naming the file and saying how a generator must write it.
func TestStepFileShortOrTorn(t *testing.T) {
	dir := t.TempDir()
	recs, caps := gymFixture(t, dir)
	data, err := os.ReadFile(recs)
	if err != nil {
		t.Fatal(err)
	}
	lines := bytes.SplitAfter(bytes.TrimSuffix(data, []byte("\n")), []byte("\n"))
	for _, c := range []struct {
		name string
		body []byte
		want string
	}{
		{"short", bytes.Join(lines[:len(lines)-1], nil), fmt.Sprintf("holds %d records", len(lines)-1)},
		{"torn", data[:len(data)-len(lines[len(lines)-1])/2], fmt.Sprintf("step_1.jsonl:%d", len(lines))},
	} {
		t.Run(c.name, func(t *testing.T) {
			steps := filepath.Join(dir, c.name)
			if err := os.MkdirAll(steps, 0o755); err != nil {
				t.Fatal(err)
			}
			if err := os.WriteFile(filepath.Join(steps, "step_1.jsonl"), c.body, 0o644); err != nil {
				t.Fatal(err)
			}
			args := append([]string{"--out", filepath.Join(dir, "run-"+c.name), "--rollouts", steps, "--captures", caps, "--steps", "1"}, externalSets...)
			tr, err := newTrainer(t, args...)
			if err != nil {
				t.Fatal(err)
			}
			defer tr.Close()
			err = tr.Run()
			if err == nil || !strings.Contains(err.Error(), c.want) || !strings.Contains(err.Error(), "renames it into place") ||
				strings.Contains(err.Error(), "rollouts: rollouts:") {
				t.Errorf("err = %v\nwant one saying %q and how a generator writes a step file", err, c.want)
			}
		})
	}
}
