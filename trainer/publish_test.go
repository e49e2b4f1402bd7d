package trainer

import (
	"encoding/binary"
	"fmt"
	"io"
	"math"
	"os"
	"path/filepath"
	"strings"
	"testing"
	"time"

	"github.com/tracegrpo/tracegrpo/internal/safetensors"
	"github.com/tracegrpo/tracegrpo/loop"
)

// bf16RNE rounds x to bfloat16, nearest even, as torch's .to(torch.bfloat16)
// does (x finite), and returns its bits.
func bf16RNE(x float32) uint16 {
	b := math.Float32bits(x)
	return uint16((b + 0x7fff + (b>>16)&1) >> 16)
}

// TestWeightsOutEveryStep: the built-in job with --weights-out publishes
// step_0 (the initial weights) and a directory after every step, each
// holding the step's checkpoint weights rounded to bfloat16 (every
// element, nearest even), a config.json that says so, no optimizer state,
// and only the newest --weights-keep of them; the metrics line has each
// export's bytes and time; the full checkpoint is written only at
// save_period.
func TestWeightsOutEveryStep(t *testing.T) {
	dir := t.TempDir()
	out, w := filepath.Join(dir, "run"), filepath.Join(dir, "weights")
	mustTrain(t, trainArgs(out, 5, "--weights-out", w, "--weights-keep", "3", "--set", "checkpointing.save_period=4")...)
	ents, err := os.ReadDir(w)
	if err != nil {
		t.Fatal(err)
	}
	var names []string
	for _, e := range ents {
		names = append(names, e.Name())
	}
	if got := strings.Join(names, " "); got != "step_3 step_4 step_5" {
		t.Errorf("weights directory holds %s, want the newest 3: step_3 step_4 step_5", got)
	}
	if ck, _ := os.ReadDir(filepath.Join(out, "checkpoints")); len(ck) != 2 || ck[0].Name() != "step_4" || ck[1].Name() != "step_5" {
		t.Errorf("checkpoints %v, want step_4 (save_period 4) and step_5 (the last)", ck)
	}
	d, err := loop.Verify(loop.WeightsDir(w, 4))
	if err != nil {
		t.Fatal(err)
	}
	if len(d.Files) != 2 || d.DType != "bfloat16" {
		t.Errorf("step_4: %+v, want config.json and model.safetensors in bfloat16", d)
	}
	cfg, _ := os.ReadFile(filepath.Join(loop.WeightsDir(w, 4), loop.ConfigFile))
	if !strings.Contains(string(cfg), `"torch_dtype":"bfloat16"`) && !strings.Contains(string(cfg), `"torch_dtype": "bfloat16"`) {
		t.Errorf("config.json does not say bfloat16: %s", cfg)
	}
	f, err := safetensors.Open(filepath.Join(loop.WeightsDir(w, 4), loop.ModelFile))
	if err != nil {
		t.Fatal(err)
	}
	defer f.Close()
	want := weights(t, out, 4)
	n := 0
	for name, x := range want {
		ti, ok := f.Tensor(name)
		if !ok || ti.DType != safetensors.BF16 {
			t.Fatalf("%s: %+v in the export", name, ti)
		}
		raw := make([]byte, 2*len(x))
		if err := f.ReadRaw(name, raw); err != nil {
			t.Fatal(err)
		}
		for i, v := range x {
			if got := binary.LittleEndian.Uint16(raw[2*i:]); got != bf16RNE(v) {
				t.Fatalf("%s[%d]: bf16 bits %#04x, want %#04x (the checkpoint's %v rounded)", name, i, got, bf16RNE(v), v)
			}
			n++
		}
	}
	ms := metricsNoTimes(t, out)
	for _, m := range ms {
		if m.WeightsBytes != d.Bytes() {
			t.Errorf("step %d: weights_bytes %d, want %d", m.Step, m.WeightsBytes, d.Bytes())
		}
	}
	t.Logf("%d weights match the checkpoint's rounded to bf16; %d bytes a step", n, d.Bytes())
}

// TestWeightsOutRefused: a weights directory that would overwrite an input
// or the run's checkpoints, or that already holds another run's weights,
// and bad dtype or keep values are refused before any work, naming them.
func TestWeightsOutRefused(t *testing.T) {
	dir := t.TempDir()
	out := filepath.Join(dir, "run")
	full := filepath.Join(dir, "full")
	if err := os.MkdirAll(filepath.Join(full, "step_3"), 0o755); err != nil {
		t.Fatal(err)
	}
	os.WriteFile(filepath.Join(full, "step_3", loop.DoneFile), []byte("{}"), 0o644)
	for _, c := range []struct {
		name string
		args []string
		want string
	}{
		{"the checkpoints", []string{"--weights-out", filepath.Join(out, "checkpoints")}, "the run's checkpoints directory"},
		{"the run directory", []string{"--weights-out", out}, "is inside it"},
		{"weights already there", []string{"--weights-out", full}, "already holds weights (step_3)"},
		{"a bad dtype", []string{"--weights-out", filepath.Join(dir, "w1"), "--weights-dtype", "int8"}, "--weights-dtype \"int8\""},
		{"keep 0 in the recipe", []string{"--weights-out", filepath.Join(dir, "w2"), "--set", "policy.generation.weights_keep=0"}, "policy.generation.weights_keep=0"},
	} {
		t.Run(c.name, func(t *testing.T) {
			msg := failTrain(t, trainArgs(out, 1, c.args...)...)
			if !strings.Contains(msg, c.want) {
				t.Errorf("message lacks %q:\n%s", c.want, msg)
			}
		})
	}
}

// TestWaitSaysWhatItWaitsFor: a trainer waiting for a step file says so
// every waitProgressEvery, naming the file and the time waited, and the
// metrics line keeps the wait apart from the reading. The step file is
// written only after the trainer has said five times that it waits.
func TestWaitSaysWhatItWaitsFor(t *testing.T) {
	defer func(d time.Duration) { waitProgressEvery = d }(waitProgressEvery)
	waitProgressEvery = 100 * time.Millisecond
	dir := t.TempDir()
	recs, caps := gymFixture(t, dir)
	rdir := filepath.Join(dir, "rollouts")
	if err := os.Mkdir(rdir, 0o755); err != nil {
		t.Fatal(err)
	}
	b, err := os.ReadFile(recs)
	if err != nil {
		t.Fatal(err)
	}
	want := fmt.Sprintf("train: waiting for %s: ", loop.StepFile(rdir, 1))
	var log lockedBuffer
	wrote := make(chan error, 1)
	go func() {
		for strings.Count(log.String(), want) < 5 {
			time.Sleep(10 * time.Millisecond)
		}
		wrote <- loop.WriteStep(rdir, 1, b, nil)
	}()
	out := filepath.Join(dir, "run")
	args := append([]string{"--out", out, "--steps", "1", "--rollouts", rdir, "--captures", caps, "--wait", "1m", "--max-masked-fraction", "1"}, externalSets[1:]...)
	if code := run(args, io.Discard, &log); code != 0 {
		t.Fatalf("train: exit %d\n%s", code, log.String())
	}
	if err := <-wrote; err != nil {
		t.Fatal(err)
	}
	if s := log.String(); !strings.Contains(s, "so far (--wait 1m0s)") || !strings.Contains(s, "policy versions not checked") {
		t.Errorf("the wait lines do not say how long, or no warning for the missing sidecar:\n%s", s)
	}
	ms, _, err := ReadMetrics(filepath.Join(out, "metrics.jsonl"))
	if err != nil {
		t.Fatal(err)
	}
	// Five lines a tenth of a second apart: at least half a second waited;
	// reading eight records takes microseconds.
	if p := ms[0].Phases; !(p.Wait >= 0.5) || p.Rollout >= p.Wait {
		t.Errorf("phase_s wait %v, rollout %v: want the wait (≥ 0.5 s) apart from the reading", p.Wait, p.Rollout)
	}
}

// TestDiskPlanMatchesFiles: train plan's disk figures are the sizes of the
// files a run writes: a weights directory's model.safetensors in its dtype
// and a checkpoint's model and optimizer files, byte for byte.
func TestDiskPlanMatchesFiles(t *testing.T) {
	for _, dtype := range []string{"bfloat16", "float32"} {
		dir := t.TempDir()
		out, w := filepath.Join(dir, "run"), filepath.Join(dir, "weights")
		args := trainArgs(out, 1, "--weights-out", w, "--weights-dtype", dtype)
		mustTrain(t, args...)
		ld, _, err := LoadRecipe(nil, append(setsOf(args), "policy.generation.weights_dtype="+dtype))
		if err != nil {
			t.Fatal(err)
		}
		mc, _, err := ModelConfig(&ld.Config, "")
		if err != nil {
			t.Fatal(err)
		}
		d, err := PlanDisk(&ld.Config, mc)
		if err != nil {
			t.Fatal(err)
		}
		size := func(path string) int64 {
			st, err := os.Stat(path)
			if err != nil {
				t.Fatal(err)
			}
			return st.Size()
		}
		ck := filepath.Join(out, "checkpoints", "step_1")
		for _, c := range []struct {
			what      string
			plan, got int64
		}{
			{"weights " + dtype, d.Weights, size(filepath.Join(loop.WeightsDir(w, 1), loop.ModelFile))},
			{"checkpoint weights", d.CheckpointWeights, size(filepath.Join(ck, "model.safetensors"))},
			{"checkpoint moments", d.CheckpointMoments, size(filepath.Join(ck, "optimizer.safetensors"))},
		} {
			if c.plan != c.got {
				t.Errorf("%s: planned %d bytes, the run wrote %d", c.what, c.plan, c.got)
			}
		}
	}
}

// setsOf returns the --set values of args.
func setsOf(args []string) []string {
	var out []string
	for i := 0; i+1 < len(args); i++ {
		if args[i] == "--set" {
			out = append(out, args[i+1])
		}
	}
	return out
}

// TestSidecarsChecked: in the trainer (one process, --weights-out), a step
// file whose sidecar names weights other than the ones published for the
// step before is refused before it trains, naming the file and both hashes;
// a step without a sidecar after one that had one is refused; and a
// resumed run republishes the weights of the step it resumes at before it
// waits.
func TestSidecarsChecked(t *testing.T) {
	dir := t.TempDir()
	recs, caps := gymFixture(t, dir)
	b, err := os.ReadFile(recs)
	if err != nil {
		t.Fatal(err)
	}
	args := func(out, rdir, w, wait string, extra ...string) []string {
		return append(append([]string{"--out", filepath.Join(dir, out), "--rollouts", rdir, "--captures", caps, "--wait", wait,
			"--weights-out", filepath.Join(dir, w), "--max-masked-fraction", "1"}, externalSets...), extra...)
	}
	other := strings.Repeat("0", 64)

	t.Run("other weights", func(t *testing.T) {
		rdir := filepath.Join(dir, "r1")
		os.Mkdir(rdir, 0o755)
		loop.WriteStep(rdir, 1, b, &loop.Meta{PolicyStep: 0, WeightsSHA256: other})
		msg := failTrain(t, args("a", rdir, "w1", "0", "--steps", "1")...)
		want := fmt.Sprintf("%s: weights_sha256 is %s, but the trainer published step_0's model.safetensors with sha256 %s",
			loop.MetaFile(rdir, 1), other, fileSHA256(t, filepath.Join(dir, "w1", "step_0", loop.ModelFile)))
		if !strings.Contains(msg, want) {
			t.Errorf("message lacks %q:\n%s", want, msg)
		}
	})

	t.Run("a sidecar, then none", func(t *testing.T) {
		rdir := filepath.Join(dir, "r2")
		os.Mkdir(rdir, 0o755)
		w := filepath.Join(dir, "w2")
		// Step 1 with the right sidecar: the trainer publishes step_0 first,
		// so the test writes step 1 once it is there.
		done := make(chan error, 1)
		go func() {
			d, err := loop.WaitDone(w, 0, time.Minute, 10*time.Millisecond, nil)
			if err == nil {
				m, _ := d.File(loop.ModelFile)
				err = loop.WriteStep(rdir, 1, b, &loop.Meta{PolicyStep: 0, WeightsSHA256: m.SHA256})
			}
			if err == nil {
				err = loop.WriteStep(rdir, 2, b, nil)
			}
			done <- err
		}()
		msg := failTrain(t, args("b", rdir, "w2", "1m", "--steps", "2")...)
		if err := <-done; err != nil {
			t.Fatal(err)
		}
		if want := "step_2.jsonl has no sidecar step_2.meta.json, though the step files before it had one"; !strings.Contains(msg, want) {
			t.Errorf("message lacks %q:\n%s", want, msg)
		}
	})

	t.Run("resume republishes", func(t *testing.T) {
		out, w := filepath.Join(dir, "c"), filepath.Join(dir, "w3")
		mustTrain(t, trainArgs(out, 2, "--weights-out", w, "--set", "checkpointing.save_period=1", "--set", "policy.megatron_cfg.scheduler.lr_decay_iters=3")...)
		before := fileSHA256(t, filepath.Join(w, "step_2", loop.ModelFile))
		os.RemoveAll(filepath.Join(w, "step_2"))
		mustTrain(t, trainArgs(out, 3, "--weights-out", w, "--resume", "--set", "checkpointing.save_period=1", "--set", "policy.megatron_cfg.scheduler.lr_decay_iters=3")...)
		if got := fileSHA256(t, filepath.Join(w, "step_2", loop.ModelFile)); got != before {
			t.Errorf("the resumed run republished step_2 with sha256 %s, the first run %s", got, before)
		}
		if _, err := loop.Verify(filepath.Join(w, "step_3")); err != nil {
			t.Error(err)
		}
	})
}

func fileSHA256(t *testing.T, path string) string {
	t.Helper()
	_, s, err := loop.HashFile(path)
	if err != nil {
		t.Fatal(err)
	}
	return s
}
