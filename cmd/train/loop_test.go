package main

import (
	"bytes"
	"crypto/sha256"
	"encoding/hex"
	"encoding/json"
	"fmt"
	"os"
	"os/exec"
	"path/filepath"
	"strings"
	"syscall"
	"testing"
	"time"

	"github.com/tracegrpo/tracegrpo/loop"
	"github.com/tracegrpo/tracegrpo/trainer"
)

// The trainer–generator protocol (package loop, docs/loop.md) end to end:
// a real trainer (this test binary run as train) with --rollouts R
// --captures C --weights-out W, and beside it a real generator process,
// train generate (loop/fakegen): it waits for each W/step_<N-1>/DONE, loads
// those weights and samples the built-in tasks with them, records the calls
// in C and writes R/step_<N>.jsonl with its sidecar.

// loopSets are the built-in job cut to the protocol tests: one task group
// of four rollouts per step, every row in one micro-batch, gradient
// clipping out of reach. Under mpirun -np 2 the group is rank 0's and rank
// 1 trains nothing, so the ranks' reduce-scatter adds rank 0's gradients
// to exact zeros: the same float operations as one process, and with no
// clipping (whose norm sums the shards in another order) the weights are
// the same bits. With groups split across ranks they differ in the last
// bits of fp32 sums (distTol, dist_test.go).
var loopSets = []string{"--set", "grpo.num_prompts_per_step=1", "--set", "grpo.num_generations_per_prompt=4",
	"--set", "policy.train_micro_batch_size=16", "--set", "policy.max_grad_norm=1000"}

// loopSteps is the length of the protocol runs.
const loopSteps = 5

type loopRun struct{ R, C, W, Out string }

func newLoopRun(t *testing.T) loopRun {
	t.Helper()
	d := t.TempDir()
	r := loopRun{R: filepath.Join(d, "rollouts"), C: filepath.Join(d, "captures"), W: filepath.Join(d, "weights"), Out: filepath.Join(d, "run")}
	for _, p := range []string{r.R, r.C} {
		if err := os.MkdirAll(p, 0o755); err != nil {
			t.Fatal(err)
		}
	}
	return r
}

// trainArgs are the trainer's flags for the run; the weights are kept, all
// of them, in float32 so that the generator's sampling log-probabilities
// can be compared with the trainer's to float32 rounding.
func (r loopRun) trainArgs(extra ...string) []string {
	args := []string{"--backend", "cpu", "--quiet", "--out", r.Out, "--rollouts", r.R, "--captures", r.C,
		"--weights-out", r.W, "--weights-keep", "100", "--weights-dtype", "float32", "--wait", "2m", "--steps", fmt.Sprint(loopSteps)}
	return append(append(args, loopSets...), extra...)
}

// generator is a running train generate.
type generator struct {
	cmd  *exec.Cmd
	out  bytes.Buffer
	done chan error
}

// startGenerator starts train generate on the run's directories.
func startGenerator(t *testing.T, r loopRun, extra ...string) *generator {
	t.Helper()
	args := append([]string{"generate", "--weights", r.W, "--rollouts", r.R, "--captures", r.C, "--wait", "2m",
		"--steps", fmt.Sprint(loopSteps), "--threads", "1"}, loopSets...)
	g := &generator{cmd: trainCommand(append(args, extra...)...), done: make(chan error, 1)}
	g.cmd.Stdout, g.cmd.Stderr = &g.out, &g.out
	if err := g.cmd.Start(); err != nil {
		t.Fatal(err)
	}
	go func() { g.done <- g.cmd.Wait() }()
	t.Cleanup(func() {
		g.cmd.Process.Kill()
		<-g.done
	})
	return g
}

// wait waits for the generator to finish its steps.
func (g *generator) wait(t *testing.T) {
	t.Helper()
	select {
	case err := <-g.done:
		g.done <- err
		if err != nil {
			t.Fatalf("generator: %v\n%s", err, g.out.String())
		}
	case <-time.After(3 * time.Minute):
		t.Fatalf("the generator did not finish\n%s", g.out.String())
	}
}

func fileSHA(t *testing.T, path string) string {
	t.Helper()
	b, err := os.ReadFile(path)
	if err != nil {
		t.Fatal(err)
	}
	s := sha256.Sum256(b)
	return hex.EncodeToString(s[:])
}

// sameWeightsDirs fails unless every step directory 0..loopSteps of a and
// b holds the same files, byte for byte.
func sameWeightsDirs(t *testing.T, what, a, b string) {
	t.Helper()
	for s := int64(0); s <= loopSteps; s++ {
		da, db := loop.WeightsDir(a, s), loop.WeightsDir(b, s)
		ea, err := os.ReadDir(da)
		if err != nil {
			t.Fatal(err)
		}
		eb, err := os.ReadDir(db)
		if err != nil {
			t.Fatalf("%s: %v", what, err)
		}
		if len(ea) != len(eb) {
			t.Errorf("%s: step_%d has %d files, the reference %d", what, s, len(eb), len(ea))
			continue
		}
		for _, e := range ea {
			x, _ := os.ReadFile(filepath.Join(da, e.Name()))
			y, _ := os.ReadFile(filepath.Join(db, e.Name()))
			if len(x) == 0 || !bytes.Equal(x, y) {
				t.Errorf("%s: step_%d/%s differs from the reference", what, s, e.Name())
			}
		}
	}
}

// TestLoopProtocol: the generator and the trainer run the loop for
// loopSteps steps, each step's rollouts from the weights of the step
// before; a stale generator and one serving another run's weights are
// refused before their step trains; one that states no policy version
// trains with one warning; a SIGTERM in the middle and --resume give the
// uninterrupted run's weights bit for bit, and so does mpirun -np 2
// --shard full.
func TestLoopProtocol(t *testing.T) {
	ref := newLoopRun(t)
	g := startGenerator(t, ref)
	log := mustTrain(t, ref.trainArgs()...)
	g.wait(t)
	if strings.Contains(log, "not checked") {
		t.Errorf("the trainer did not check the policy versions:\n%s", log)
	}
	ms, _, err := trainer.ReadMetrics(filepath.Join(ref.Out, "metrics.jsonl"))
	if err != nil || len(ms) != loopSteps {
		t.Fatalf("%d metric lines, %v", len(ms), err)
	}
	freshKL, waited := 0.0, 0.0
	for n := int64(1); n <= loopSteps; n++ {
		// The sidecar names the weights of the step before, as published.
		m, err := loop.ReadMeta(loop.MetaFile(ref.R, n))
		if err != nil {
			t.Fatal(err)
		}
		want := fileSHA(t, filepath.Join(loop.WeightsDir(ref.W, n-1), loop.ModelFile))
		if m.PolicyStep != n-1 || m.WeightsSHA256 != want {
			t.Errorf("step %d: sidecar %+v, want policy_step %d and sha256 %s", n, m, n-1, want)
		}
		// And the rollouts' log-probabilities are those weights': the
		// trainer's previous policy is the weights of the step before, and
		// the generator sampled with the same float32 values.
		st := ms[n-1]
		freshKL = max(freshKL, float64(st.GenKLError))
		waited += float64(st.Phases.Wait)
		if st.WeightsBytes <= 0 || st.Phases.Export <= 0 {
			t.Errorf("step %d: weights_bytes %d, phase_s.export %v: the export is not in the metrics", n, st.WeightsBytes, st.Phases.Export)
		}
		d, err := loop.Verify(loop.WeightsDir(ref.W, n))
		if err != nil || d.Bytes() != st.WeightsBytes || d.DType != "float32" {
			t.Errorf("step %d: %+v, %v; metrics say %d bytes", n, d, err, st.WeightsBytes)
		}
	}
	// Measured: ≤ 6e-15 fresh (the sampler and the training forward round
	// differently), 7e-4 when every step samples from the weights of two
	// steps before (the no-sidecar case below).
	if freshKL > 1e-11 {
		t.Errorf("gen_kl_error up to %g: the rollouts were not sampled from the trainer's weights of the step before", freshKL)
	}
	t.Logf("gen_kl_error ≤ %.3g over %d steps; %.2fs waiting for step files", freshKL, loopSteps, waited)
	if !(waited > 0) {
		t.Errorf("phase_s.wait is 0 in every step: the waits for the generator are not timed")
	}

	t.Run("stale sidecar", func(t *testing.T) {
		r := newLoopRun(t)
		startGenerator(t, r, "--stale", "1")
		msg := failTrain(t, r.trainArgs()...)
		for _, w := range []string{"step 2: rollouts: " + loop.MetaFile(r.R, 2) + ": policy_step is 0", "step 2 on rollouts of the weights of step 1"} {
			if !strings.Contains(msg, w) {
				t.Errorf("message lacks %q:\n%s", w, msg)
			}
		}
		if ms, _, _ := trainer.ReadMetrics(filepath.Join(r.Out, "metrics.jsonl")); len(ms) != 1 {
			t.Errorf("%d steps trained, want 1 (the stale step is refused before it trains)", len(ms))
		}
		t.Logf("refused: %s", strings.TrimSpace(msg))
	})

	t.Run("another run's weights", func(t *testing.T) {
		r := newLoopRun(t)
		r.W = ref.W // the generator serves the reference run's weights
		startGenerator(t, r)
		other := newLoopRun(t)
		other.R, other.C = r.R, r.C
		msg := failTrain(t, other.trainArgs("--set", "grpo.seed=7")...)
		want := fileSHA(t, filepath.Join(loop.WeightsDir(other.W, 0), loop.ModelFile))
		for _, w := range []string{loop.MetaFile(r.R, 1) + ": weights_sha256 is " + fileSHA(t, filepath.Join(loop.WeightsDir(ref.W, 0), loop.ModelFile)),
			"published step_0's model.safetensors with sha256 " + want} {
			if !strings.Contains(msg, w) {
				t.Errorf("message lacks %q:\n%s", w, msg)
			}
		}
		t.Logf("refused: %s", strings.TrimSpace(msg))
	})

	t.Run("no sidecar", func(t *testing.T) {
		r := newLoopRun(t)
		startGenerator(t, r, "--stale", "1", "--no-sidecar")
		log := mustTrain(t, r.trainArgs()...)
		if n := strings.Count(log, "policy versions not checked"); n != 1 {
			t.Errorf("%d warnings that the policy versions are not checked, want 1:\n%s", n, log)
		}
		ms := readMetricsNoTimes(t, r.Out)
		staleKL := 0.0
		for _, m := range ms[1:] {
			staleKL = max(staleKL, float64(m.GenKLError))
		}
		if !(staleKL > 100*freshKL) {
			t.Errorf("stale rollouts: gen_kl_error up to %g, fresh %g: the check above would not tell them apart", staleKL, freshKL)
		}
		t.Logf("stale rollouts, trained unchecked: gen_kl_error up to %.3g (fresh %.3g)", staleKL, freshKL)
	})

	t.Run("SIGTERM and resume", func(t *testing.T) {
		// The generator stops after step 3, so the trainer is waiting for
		// step_4.jsonl when the SIGTERM comes; a second generator picks up
		// where the first stopped, and the trainer resumes.
		r := newLoopRun(t)
		first := startGenerator(t, r, "--steps", "3")
		cmd := trainCommand(r.trainArgs()...)
		var out bytes.Buffer
		cmd.Stdout, cmd.Stderr = &out, &out
		if err := cmd.Start(); err != nil {
			t.Fatal(err)
		}
		first.wait(t)
		metrics := filepath.Join(r.Out, "metrics.jsonl")
		deadline := time.Now().Add(2 * time.Minute)
		for {
			if b, _ := os.ReadFile(metrics); bytes.Count(b, []byte{'\n'}) >= 3 {
				break
			}
			if time.Now().After(deadline) {
				cmd.Process.Kill()
				t.Fatalf("no three steps within 2m\n%s", out.String())
			}
			time.Sleep(20 * time.Millisecond)
		}
		cmd.Process.Signal(syscall.SIGTERM)
		if err := cmd.Wait(); err == nil {
			t.Fatalf("a stopped run exited 0\n%s", out.String())
		}
		if stopped, _, _ := trainer.ReadMetrics(metrics); len(stopped) != 3 {
			t.Fatalf("%d steps before the SIGTERM, want 3\n%s", len(stopped), out.String())
		}
		g := startGenerator(t, r)
		mustTrain(t, r.trainArgs("--resume")...)
		g.wait(t)
		sameWeightsDirs(t, "SIGTERM and --resume", ref.W, r.W)
		for n := int64(1); n <= loopSteps; n++ {
			if a, b := fileSHA(t, loop.StepFile(ref.R, n)), fileSHA(t, loop.StepFile(r.R, n)); a != b {
				t.Errorf("step_%d.jsonl differs from the uninterrupted run's", n)
			}
		}
	})

	t.Run("mpirun sharded", func(t *testing.T) {
		r := newLoopRun(t)
		g := startGenerator(t, r)
		mustMpirun(t, 2, r.trainArgs("--shard", "full")...)
		g.wait(t)
		sameWeightsDirs(t, "mpirun -np 2 --shard full", ref.W, r.W)
	})
}

// TestGenerateOneStep: train generate --step N --records FILE collects one
// step from W/step_<N-1> (what scripts/gym_vllm_loop.py --fake calls),
// printing the sidecar it would write, and the records are those the
// generator's own loop writes for that step.
func TestGenerateOneStep(t *testing.T) {
	r := newLoopRun(t)
	g := startGenerator(t, r)
	mustTrain(t, r.trainArgs("--steps", "2")...)
	g.cmd.Process.Kill()
	one := t.TempDir()
	recs := filepath.Join(one, "step_2.jsonl")
	var stdout, stderr bytes.Buffer
	args := append([]string{"generate", "--weights", r.W, "--captures", filepath.Join(one, "captures"), "--step", "2", "--records", recs}, loopSets...)
	if code := run(args, &stdout, &stderr); code != 0 {
		t.Fatalf("generate --step: exit %d\n%s", code, stderr.String())
	}
	var m loop.Meta
	if err := json.Unmarshal(stdout.Bytes(), &m); err != nil {
		t.Fatalf("%v: %q", err, stdout.String())
	}
	if want := fileSHA(t, filepath.Join(loop.WeightsDir(r.W, 1), loop.ModelFile)); m.PolicyStep != 1 || m.WeightsSHA256 != want {
		t.Errorf("printed %+v, want policy_step 1 and sha256 %s", m, want)
	}
	a, _ := os.ReadFile(recs)
	b, _ := os.ReadFile(loop.StepFile(r.R, 2))
	if len(a) == 0 || !bytes.Equal(a, b) {
		t.Errorf("generate --step 2 wrote other records than the generator's loop:\n%s\n%s", a, b)
	}
}

// failTrain runs train, wants it to fail, and returns what it said.
func failTrain(t *testing.T, args ...string) string {
	t.Helper()
	var stdout, stderr bytes.Buffer
	if code := run(args, &stdout, &stderr); code == 0 {
		t.Fatalf("train %s: succeeded, want a failure", strings.Join(args, " "))
	}
	return stderr.String()
}
