package trainer

import (
	"bytes"
	"fmt"
	"math/rand/v2"
	"os"
	"path/filepath"
	"strconv"
	"strings"
	"syscall"
	"testing"
	"time"

	"github.com/tracegrpo/tracegrpo/checkpoint"
	"github.com/tracegrpo/tracegrpo/kernels/cpu"
)

// newTrainer builds a trainer from command-line arguments without running
// it (the caller closes it).
func newTrainer(t *testing.T, args ...string) (*Trainer, error) {
	t.Helper()
	var o Options
	fs := newTestFlags()
	o.AddFlags(fs)
	if err := fs.Parse(args); err != nil {
		t.Fatal(err)
	}
	be := cpu.New(1)
	t.Cleanup(be.Close)
	o.Backend, o.Log = be, &bytes.Buffer{}
	return New(o)
}

// TestRunDirectoryLock: a second trainer on a run directory in use is
// refused, naming the process that holds it; once the first is closed the
// directory can be resumed. Before, both ran and interleaved their files.
func TestRunDirectoryLock(t *testing.T) {
	out := filepath.Join(t.TempDir(), "run")
	a, err := newTrainer(t, trainArgs(out, 2)...)
	if err != nil {
		t.Fatal(err)
	}
	_, err = newTrainer(t, append(trainArgs(out, 2), "--resume")...)
	want := fmt.Sprintf("locked by another trainer (pid %d on ", os.Getpid())
	if err == nil || !strings.Contains(err.Error(), want) {
		t.Fatalf("second trainer on %s: %v; want an error containing %q", out, err, want)
	}
	a.Close()
	b, err := newTrainer(t, append(trainArgs(out, 2), "--resume")...)
	if err != nil {
		t.Fatalf("after the first trainer closed: %v", err)
	}
	b.Close()
}

// TestKilledTrainerLeavesNoStaleLock: the lock is the kernel's flock, so a
// SIGKILLed trainer's directory can be resumed at once.
func TestKilledTrainerLeavesNoStaleLock(t *testing.T) {
	out := filepath.Join(t.TempDir(), "run")
	cmd := trainerCommand(t, trainArgs(out, 100000)...)
	if err := cmd.Start(); err != nil {
		t.Fatal(err)
	}
	waitForLines(t, filepath.Join(out, metricsFileName), 1, 30*time.Second)
	cmd.Process.Kill()
	cmd.Wait()
	b, err := newTrainer(t, append(trainArgs(out, 100000), "--resume")...)
	if err != nil {
		t.Fatalf("resume after SIGKILL: %v", err)
	}
	b.Close()
}

// waitForLines waits until path has at least n lines.
func waitForLines(t *testing.T, path string, n int, limit time.Duration) {
	t.Helper()
	deadline := time.Now().Add(limit)
	for {
		b, _ := os.ReadFile(path)
		if bytes.Count(b, []byte{'\n'}) >= n {
			return
		}
		if time.Now().After(deadline) {
			t.Fatalf("%s has no %d lines after %v", path, n, limit)
		}
		time.Sleep(5 * time.Millisecond)
	}
}

// TestResumeWithoutCheckpoint: a run killed before its first checkpoint
// could neither be resumed nor restarted. --resume (with or without
// --fallback) now starts it over at step 0, saying so, and finishes as an
// uninterrupted run would; a fresh run is still refused naming --resume.
// Each with the captures in memory and on disk (--save-captures).
func TestResumeWithoutCheckpoint(t *testing.T) {
	ref := t.TempDir()
	mustTrain(t, trainArgs(ref, 3, "--set", "checkpointing.save_period=5")...)
	for i, fallback := range []bool{false, true, false, true} {
		runArgs := append([]string{"--set", "checkpointing.save_period=5"}, captureStores[i/2].args...)
		out := t.TempDir()
		stopAfterStep = 1 // one metrics line and captures, no checkpoint
		code := run(trainArgs(out, 3, runArgs...), &bytes.Buffer{}, &bytes.Buffer{})
		stopAfterStep = 0
		if code == 0 {
			t.Fatal("the simulated crash did not fail the run")
		}
		if msg := failTrain(t, trainArgs(out, 3, runArgs...)...); !strings.Contains(msg, "--resume") {
			t.Errorf("fresh run over a crashed one: %q, want --resume named", msg)
		}
		args := append(trainArgs(out, 3, runArgs...), "--resume")
		if fallback {
			args = append(args, "--fallback")
		}
		args = slicesWithout(args, "--quiet")
		log := mustTrain(t, args...)
		if !strings.Contains(log, "no complete checkpoint") || !strings.Contains(log, "starting at step 0") {
			t.Errorf("--resume without a checkpoint does not say it starts over:\n%s", log)
		}
		sameMetrics(t, metricsNoTimes(t, ref), metricsNoTimes(t, out))
		if !bytes.Equal(checkpointBytes(t, ref, 3, checkpoint.ModelFile), checkpointBytes(t, out, 3, checkpoint.ModelFile)) {
			t.Error("weights after starting over differ from the uninterrupted run")
		}
	}
	// --resume into a directory that does not exist yet starts a run too.
	fresh := filepath.Join(t.TempDir(), "new")
	mustTrain(t, append(trainArgs(fresh, 1), "--resume")...)
}

func slicesWithout(s []string, drop string) []string {
	var out []string
	for _, x := range s {
		if x != drop {
			out = append(out, x)
		}
	}
	return out
}

// TestResumeRefusalTouchesNothing: a --resume refused because the newest
// checkpoint is damaged changes no file of the run, and its hint says what
// --fallback would do, which depends on whether an older checkpoint exists.
func TestResumeRefusalTouchesNothing(t *testing.T) {
	out := t.TempDir()
	mustTrain(t, trainArgs(out, 4)...) // checkpoints 2 and 4
	snapshot := func() map[string]string {
		m := map[string]string{}
		filepath.Walk(out, func(p string, info os.FileInfo, err error) error {
			if err == nil && !info.IsDir() && filepath.Base(p) != lockFile {
				b, _ := os.ReadFile(p)
				m[p] = fmt.Sprintf("%x %v", b, info.ModTime())
			}
			return nil
		})
		return m
	}
	os.Remove(filepath.Join(out, "checkpoints", checkpoint.StepDir(4), checkpoint.DoneFile))
	before := snapshot()
	msg := failTrain(t, append(trainArgs(out, 6), "--resume", "--set", "policy.megatron_cfg.scheduler.lr_decay_iters=4")...)
	if !strings.Contains(msg, "--fallback to resume from the newest older checkpoint") || !strings.Contains(msg, "step_2") {
		t.Errorf("refused resume with an older checkpoint: %q", msg)
	}
	if after := snapshot(); fmt.Sprint(after) != fmt.Sprint(before) {
		t.Error("a refused --resume changed files of the run")
	}
	// With only a damaged checkpoint, the hint says --fallback starts over.
	os.RemoveAll(filepath.Join(out, "checkpoints", checkpoint.StepDir(2)))
	msg = failTrain(t, append(trainArgs(out, 6), "--resume")...)
	if !strings.Contains(msg, "--fallback to start the run over at step 0") {
		t.Errorf("refused resume without an older checkpoint: %q", msg)
	}
	mustTrain(t, append(trainArgs(out, 6), "--resume", "--fallback")...)
	if ms := metricsNoTimes(t, out); len(ms) != 6 || ms[0].Step != 1 {
		t.Errorf("--fallback over a damaged only checkpoint logged %d steps", len(ms))
	}
}

// TestRecipeIsNeverOverwritten: --config DIR/config.yaml --out DIR wrote the
// effective config over the user's recipe. It is refused, and the recipe
// keeps every byte; a metrics.jsonl given as --rollouts is protected too.
func TestRecipeIsNeverOverwritten(t *testing.T) {
	dir := t.TempDir()
	recipe := filepath.Join(dir, "config.yaml")
	content := builtinRecipe
	os.WriteFile(recipe, content, 0o644)
	msg := failTrain(t, "--quiet", "--config", recipe, "--out", dir)
	if !strings.Contains(msg, "over an input") || !strings.Contains(msg, "config.yaml") {
		t.Errorf("--out holding the recipe: %q", msg)
	}
	if b, _ := os.ReadFile(recipe); !bytes.Equal(b, content) {
		t.Fatalf("the recipe was changed to %q", b)
	}
	link := filepath.Join(t.TempDir(), "link")
	os.Symlink(dir, link)
	if msg := failTrain(t, "--quiet", "--config", recipe, "--out", link); !strings.Contains(msg, "over an input") {
		t.Errorf("--out reaching the recipe through a link: %q", msg)
	}
	recs, caps := gymFixture(t, t.TempDir())
	rollouts := filepath.Join(dir, "metrics.jsonl")
	data, _ := os.ReadFile(recs)
	os.WriteFile(rollouts, data, 0o644)
	args := append([]string{"--rollouts", rollouts, "--captures", caps, "--out", dir}, externalSets...)
	if msg := failTrain(t, args...); !strings.Contains(msg, "over an input") {
		t.Errorf("--out holding the rollouts as metrics.jsonl: %q", msg)
	}
	if b, _ := os.ReadFile(rollouts); !bytes.Equal(b, data) {
		t.Fatal("the rollouts file was changed")
	}
}

// TestSignalEndsTheWaitForRollouts: a SIGTERM while the run waits for the
// next step_<N>.jsonl ended it only when --wait expired, with a timeout and
// no checkpoint. It now ends the wait at once with a checkpoint of the last
// completed step, which --resume continues.
func TestSignalEndsTheWaitForRollouts(t *testing.T) {
	dir := t.TempDir()
	recs, caps := gymFixture(t, dir)
	steps := filepath.Join(dir, "steps")
	os.MkdirAll(steps, 0o755)
	data, _ := os.ReadFile(recs)
	os.WriteFile(filepath.Join(steps, "step_1.jsonl"), data, 0o644)
	out := filepath.Join(dir, "run")
	args := append([]string{"--out", out, "--rollouts", steps, "--captures", caps, "--wait", "1h", "--steps", "3",
		"--set", "checkpointing.save_period=5"}, externalSets...)
	testSignals = make(chan os.Signal, 1)
	defer func() { testSignals = nil }()
	go func() {
		waitForLines(t, filepath.Join(out, metricsFileName), 1, time.Minute)
		time.Sleep(300 * time.Millisecond) // well into the wait for step_2.jsonl
		testSignals <- syscall.SIGTERM
	}()
	start := time.Now()
	var stderr bytes.Buffer
	code := run(args, &bytes.Buffer{}, &stderr)
	if took := time.Since(start); code == 0 || took > 30*time.Second {
		t.Fatalf("exit %d after %v: %s", code, took, stderr.String())
	}
	if !strings.Contains(stderr.String(), "SIGTERM after step 1; checkpoint of step 1 written") {
		t.Errorf("stop message: %s", stderr.String())
	}
	if _, err := checkpoint.Verify(filepath.Join(out, "checkpoints", checkpoint.StepDir(1))); err != nil {
		t.Fatalf("no checkpoint of step 1: %v", err)
	}
	testSignals = nil
	os.WriteFile(filepath.Join(steps, "step_2.jsonl"), data, 0o644)
	os.WriteFile(filepath.Join(steps, "step_3.jsonl"), data, 0o644)
	mustTrain(t, append(args, "--resume")...)
	if ms := metricsNoTimes(t, out); len(ms) != 3 {
		t.Errorf("%d steps after the resume, want 3", len(ms))
	}
}

// TestEffectiveConfigSaysWhatTheRunDoes: config.yaml names the directories
// the run writes and only the optimizer in force, and loads back as a
// recipe that runs the same configuration.
func TestEffectiveConfigSaysWhatTheRunDoes(t *testing.T) {
	out := t.TempDir()
	mustTrain(t, trainArgs(out, 1, "--save-captures")...)
	b, err := os.ReadFile(filepath.Join(out, configFileName))
	if err != nil {
		t.Fatal(err)
	}
	y := string(b)
	for _, w := range []string{
		"checkpoint_dir: " + filepath.Join(out, "checkpoints"),
		"dir: " + filepath.Join(out, "captures"),
		"# optimizer: policy.megatron_cfg.optimizer",
		"  optimizer: null",
		"# --set grpo.num_prompts_per_step=3",
		"# file: " + BuiltinRecipeName,
	} {
		if !strings.Contains(y, w) {
			t.Errorf("config.yaml lacks %q:\n%s", w, y)
		}
	}
	for _, bad := range []string{"results/grpo", "log_dir: logs"} {
		if strings.Contains(y, bad) {
			t.Errorf("config.yaml names %q, which the run does not use", bad)
		}
	}
	ld, _, err := LoadRecipe([]string{filepath.Join(out, configFileName)}, nil)
	if err != nil {
		t.Fatalf("config.yaml does not load back: %v", err)
	}
	if ld.Config.GRPO.NumPromptsPerStep != 3 || ld.Config.Policy.ModelName != "tracegrpo/tiny-qwen3" {
		t.Errorf("config.yaml loads back as %+v", ld.Config.GRPO)
	}
}

// TestKillAtRandomMoments kills a save_period=1 trainer with SIGKILL at
// random moments (the first ones before any checkpoint), resumes it to the
// end, and requires the uninterrupted run's final weights and optimizer
// state bit for bit and a metrics.jsonl of exactly one line per step.
// Odd trials keep the captures on disk (--save-captures), where a kill
// leaves a step's capture files half written. TRACEGRPO_KILL_TRIALS sets the
// number of kills (default 4 in CI).
func TestKillAtRandomMoments(t *testing.T) {
	trials := 4
	if s := os.Getenv("TRACEGRPO_KILL_TRIALS"); s != "" {
		trials, _ = strconv.Atoi(s)
	}
	const steps = 5
	trial := 0
	args := func(out string) []string {
		return trainArgs(out, steps, append([]string{"--set", "checkpointing.save_period=1", "--set", "checkpointing.keep_top_k=2"},
			captureStores[trial%2].args...)...)
	}
	ref := t.TempDir()
	start := time.Now()
	if out, err := trainerCommand(t, args(ref)...).CombinedOutput(); err != nil {
		t.Fatalf("reference run: %v\n%s", err, out)
	}
	full := time.Since(start)
	want := metricsNoTimes(t, ref)
	seed := uint64(time.Now().UnixNano())
	rng := rand.New(rand.NewPCG(seed, 7))
	perStep := full / steps
	resumedFrom := map[string]int{}
	for i := 0; i < trials; i++ {
		trial = i
		out := filepath.Join(t.TempDir(), "run")
		// A random moment: after k of the steps' metrics lines (k = 0, before
		// any checkpoint, for the first trials), plus a random part of a step.
		k := rng.IntN(steps)
		if i < trials/4+1 {
			k = 0
		}
		extra := time.Duration(rng.Float64() * float64(perStep))
		cmd := trainerCommand(t, args(out)...)
		if err := cmd.Start(); err != nil {
			t.Fatal(err)
		}
		if k > 0 {
			waitForLines(t, filepath.Join(out, metricsFileName), k, time.Minute)
		}
		time.Sleep(extra)
		cmd.Process.Signal(syscall.SIGKILL)
		cmd.Wait()
		delay := fmt.Sprintf("%d lines + %v, %s", k, extra, captureStores[trial%2].name)
		ents, _ := checkpoint.List(filepath.Join(out, "checkpoints"))
		done := 0
		for _, e := range ents {
			if e.Done {
				done = int(max(int64(done), e.Step))
			}
		}
		lines := 0
		if b, err := os.ReadFile(filepath.Join(out, metricsFileName)); err == nil {
			lines = bytes.Count(b, []byte{'\n'})
		}
		resumedFrom[fmt.Sprintf("checkpoint %d, %d lines", done, lines)]++
		var stderr bytes.Buffer
		if code := run(append(args(out), "--resume"), &bytes.Buffer{}, &stderr); code != 0 {
			t.Fatalf("trial %d (killed after %s, seed %d): resume: exit %d\n%s", i, delay, seed, code, stderr.String())
		}
		sameMetrics(t, want, metricsNoTimes(t, out))
		for _, f := range []string{checkpoint.ModelFile, "optimizer.safetensors"} {
			if !bytes.Equal(checkpointBytes(t, ref, steps, f), checkpointBytes(t, out, steps, f)) {
				t.Fatalf("trial %d (killed after %s, seed %d): %s differs from the uninterrupted run", i, delay, seed, f)
			}
		}
	}
	t.Logf("%d kills (seed %d); what each left: %v (a run takes %v)", trials, seed, resumedFrom, full)
}

// TestEveryRankChecksItCanWriteOut (issue 34): a rank of a sharded run
// that cannot write --out (here rank 1, as a read-only mount on its node
// would: the tests run as root, so the probe's creation is made to fail)
// stops every rank at start, naming the rank, the directory and why,
// before any step; an unsharded run's other ranks never write there, so
// it runs; a run leaves no probe file behind.
func TestEveryRankChecksItCanWriteOut(t *testing.T) {
	defer func(f func(string) (*os.File, error)) { createProbe = f }(createProbe)
	createProbe = func(path string) (*os.File, error) {
		if strings.Contains(filepath.Base(path), "rank-1-") {
			return nil, &os.PathError{Op: "open", Path: path, Err: syscall.EROFS}
		}
		return os.OpenFile(path, os.O_WRONLY|os.O_CREATE|os.O_EXCL, 0o600)
	}
	out := filepath.Join(t.TempDir(), "run")
	errs, _ := runLocalRanks(t, 2, trainArgs(out, 2, "--shard", "full")...)
	for r, err := range errs {
		if msg := fmt.Sprint(err); !strings.Contains(msg, "rank 1 cannot write there") || !strings.Contains(msg, out) || !strings.Contains(msg, "read-only file system") {
			t.Errorf("rank %d: %v; want a refusal naming rank 1, --out and the reason", r, err)
		}
	}
	if b, err := os.ReadFile(filepath.Join(out, "metrics.jsonl")); len(b) > 0 || err != nil && !os.IsNotExist(err) {
		t.Errorf("the refused run trained: metrics.jsonl holds %d bytes", len(b))
	}
	if _, err := os.Stat(filepath.Join(out, "checkpoints")); err == nil {
		t.Errorf("the refused run wrote checkpoints")
	}
	out2 := filepath.Join(t.TempDir(), "run")
	mustRanks(t, 2, trainArgs(out2, 2, "--shard", "none")...)
	ents, err := os.ReadDir(out2)
	if err != nil {
		t.Fatal(err)
	}
	for _, e := range ents {
		if strings.HasPrefix(e.Name(), ".write-check") {
			t.Errorf("the run left its probe %s in --out", e.Name())
		}
	}
}
