package trainer

import (
	"bytes"
	"encoding/json"
	"errors"
	"fmt"
	"maps"
	"math"
	"os"
	"path/filepath"
	"slices"
	"strings"
	"syscall"
	"testing"

	"github.com/tracegrpo/tracegrpo/checkpoint"
	"github.com/tracegrpo/tracegrpo/gym"
	"github.com/tracegrpo/tracegrpo/internal/safetensors"
	"github.com/tracegrpo/tracegrpo/kernels"
	"github.com/tracegrpo/tracegrpo/model"
)

// small is the built-in job shrunk so that a step takes milliseconds: three
// task groups of four rollouts, checkpoints every two steps.
var small = []string{
	"--quiet",
	"--set", "grpo.num_prompts_per_step=3",
	"--set", "grpo.num_generations_per_prompt=4",
	"--set", "checkpointing.save_period=2",
	"--set", "checkpointing.keep_top_k=null",
	"--set", "policy.megatron_cfg.scheduler.lr_warmup_iters=0",
}

func trainArgs(out string, steps int, extra ...string) []string {
	args := append([]string{"--out", out, "--steps", fmt.Sprint(steps)}, small...)
	return append(args, extra...)
}

// mustTrain runs train and fails the test on a non-zero exit.
func mustTrain(t *testing.T, args ...string) string {
	t.Helper()
	var stdout, stderr bytes.Buffer
	if code := run(args, &stdout, &stderr); code != 0 {
		t.Fatalf("train %s: exit %d\n%s", strings.Join(args, " "), code, stderr.String())
	}
	return stderr.String()
}

// failTrain runs train, wants a failure, and returns its message.
func failTrain(t *testing.T, args ...string) string {
	t.Helper()
	var stdout, stderr bytes.Buffer
	if code := run(args, &stdout, &stderr); code == 0 {
		t.Fatalf("train %s: succeeded, want a failure", strings.Join(args, " "))
	}
	return stderr.String()
}

// metricsNoTimes reads metrics.jsonl with every timing field zeroed.
func metricsNoTimes(t *testing.T, out string) []Metrics {
	t.Helper()
	ms, _, err := ReadMetrics(filepath.Join(out, "metrics.jsonl"))
	if err != nil {
		t.Fatal(err)
	}
	for i := range ms {
		ms[i].TokensPerS, ms[i].TimeS, ms[i].Phases = 0, 0, PhaseTimes{}
	}
	return ms
}

func checkpointBytes(t *testing.T, out string, step int, file string) []byte {
	t.Helper()
	b, err := os.ReadFile(filepath.Join(out, "checkpoints", checkpoint.StepDir(int64(step)), file))
	if err != nil {
		t.Fatal(err)
	}
	return b
}

// weights reads a checkpoint's model weights as one map of float32 slices.
func weights(t *testing.T, out string, step int) map[string][]float32 {
	t.Helper()
	st, err := checkpoint.Load(filepath.Join(out, "checkpoints", checkpoint.StepDir(int64(step))), checkpoint.LoadOptions{})
	if err != nil {
		t.Fatal(err)
	}
	w := map[string][]float32{}
	for _, x := range st.Model {
		w[x.Name] = x.F32
	}
	return w
}

func sameMetrics(t *testing.T, a, b []Metrics) {
	t.Helper()
	if len(a) != len(b) {
		t.Fatalf("%d metric lines vs %d", len(a), len(b))
	}
	for i := range a {
		ja, _ := json.Marshal(a[i])
		jb, _ := json.Marshal(b[i])
		if !bytes.Equal(ja, jb) {
			t.Fatalf("step %d metrics differ:\n%s\n%s", a[i].Step, ja, jb)
		}
	}
}

func TestSameSeedIsBitIdentical(t *testing.T) {
	a, b := t.TempDir(), t.TempDir()
	mustTrain(t, trainArgs(a, 4)...)
	mustTrain(t, trainArgs(b, 4)...)
	sameMetrics(t, metricsNoTimes(t, a), metricsNoTimes(t, b))
	for _, f := range []string{checkpoint.ModelFile, "optimizer.safetensors", "trainer_state.json"} {
		if !bytes.Equal(checkpointBytes(t, a, 4, f), checkpointBytes(t, b, 4, f)) {
			t.Errorf("%s differs between two runs with the same seed", f)
		}
	}
	// A different seed trains differently (so the comparison above can fail).
	c := t.TempDir()
	mustTrain(t, trainArgs(c, 4, "--set", "grpo.seed=7")...)
	if bytes.Equal(checkpointBytes(t, a, 4, checkpoint.ModelFile), checkpointBytes(t, c, 4, checkpoint.ModelFile)) {
		t.Error("grpo.seed does not change the run")
	}
}

// TestExactResume: N steps in one run equal k steps, a crash, and --resume
// for the rest, bit for bit (weights, optimizer state, metrics), for a crash
// right after a checkpoint (k=4) and between checkpoints (k=3, k=5: the
// resumed run redoes the steps after the last checkpoint), with the captures
// in memory and on disk (--save-captures: the resumed run clears what the
// crashed attempt wrote for the steps it redoes).
func TestExactResume(t *testing.T) {
	const n = 6
	ref := t.TempDir()
	mustTrain(t, trainArgs(ref, n)...)
	for _, store := range captureStores {
		for _, k := range []int{3, 4, 5} {
			t.Run(fmt.Sprintf("%s/crash after step %d", store.name, k), func(t *testing.T) {
				exactResume(t, ref, n, k, store.args)
			})
		}
	}
}

// captureStores are the two places the built-in job keeps its captures.
var captureStores = []struct {
	name string
	args []string
}{
	{"captures in memory", nil},
	{"captures on disk", []string{"--save-captures"}},
}

// exactResume crashes a run of n steps after step k, resumes it and
// compares it with the uninterrupted run ref.
func exactResume(t *testing.T, ref string, n, k int, extra []string) {
	t.Helper()
	out := t.TempDir()
	stopAfterStep = k
	var stderr bytes.Buffer
	code := run(trainArgs(out, n, extra...), &bytes.Buffer{}, &stderr)
	stopAfterStep = 0
	if code == 0 || !strings.Contains(stderr.String(), errSimulatedCrash.Error()) {
		t.Fatalf("simulated crash: exit %d: %s", code, stderr.String())
	}
	// Without --resume the directory is refused.
	if msg := failTrain(t, trainArgs(out, n, extra...)...); !strings.Contains(msg, "--resume") {
		t.Errorf("rerun without --resume: %q, want a hint to pass --resume", msg)
	}
	mustTrain(t, append(trainArgs(out, n, extra...), "--resume")...)
	sameMetrics(t, metricsNoTimes(t, ref), metricsNoTimes(t, out))
	for _, f := range []string{checkpoint.ModelFile, "optimizer.safetensors"} {
		if !bytes.Equal(checkpointBytes(t, ref, n, f), checkpointBytes(t, out, n, f)) {
			t.Errorf("%s after resume differs from the uninterrupted run", f)
		}
	}
	var a, b checkpoint.TrainerState
	a, _ = checkpoint.ParseTrainerState(checkpointBytes(t, ref, n, "trainer_state.json"))
	b, _ = checkpoint.ParseTrainerState(checkpointBytes(t, out, n, "trainer_state.json"))
	if a.Step != b.Step || a.ConsumedRollouts != b.ConsumedRollouts || !bytes.Equal(a.Scheduler, b.Scheduler) ||
		!bytes.Equal(a.Optimizer, b.Optimizer) || fmt.Sprint(a.RNG) != fmt.Sprint(b.RNG) {
		t.Errorf("trainer state after resume differs:\n%+v\n%+v", a, b)
	}
}

func TestResumeRefusesAnotherConfig(t *testing.T) {
	out := t.TempDir()
	mustTrain(t, trainArgs(out, 2)...)
	msg := failTrain(t, append(trainArgs(out, 2), "--resume", "--set", "loss_fn.ratio_clip_max=0.3")...)
	if !strings.Contains(msg, "loss_fn.ratio_clip_max") {
		t.Errorf("resume under a changed config: %q, want the differing key named", msg)
	}
	// The built-in schedule decays over grpo.max_num_steps, so more steps
	// change it too: refused, naming the derived key ...
	msg = failTrain(t, append(trainArgs(out, 4), "--resume")...)
	if !strings.Contains(msg, "lr_decay_iters") {
		t.Errorf("resume with a longer schedule: %q, want lr_decay_iters named", msg)
	}
	// ... unless the schedule is kept: then extending the run is allowed.
	mustTrain(t, append(trainArgs(out, 4), "--resume", "--set", "policy.megatron_cfg.scheduler.lr_decay_iters=2")...)
	if ms := metricsNoTimes(t, out); len(ms) != 4 {
		t.Errorf("extended run logged %d steps, want 4", len(ms))
	}
}

// sameUpdateSets make AdamW a smooth function of the gradient for the tests
// that compare updates whose gradients were summed in another order (other
// packing, other micro-batches, other builders). With the recipe's eps
// (1e-8) a gradient element that is pure cancellation noise (|g| ≪ the
// rounding of its terms, but ≫ eps) moves its weight by ±lr whatever its
// value, so rounding alone can move a weight by up to 2·lr = 2e-3. With
// eps = 1e-4 an update lr·m/(√v+eps) changes by at most lr·|δg|/eps =
// 10·|δg| for a gradient change δg.
var sameUpdateSets = []string{"--set", "policy.megatron_cfg.optimizer.adam_eps=1e-4"}

// updateAtol bounds the weight difference of two such updates: float32 sums
// of a few hundred terms of gradients of size ≤ 1e-2 differ by ≲ 1e-8, so
// two steps move a weight by ≲ 2·10·1e-8 = 2e-7 apart (measured: ≤ 2.3e-8).
// It is 2e-4·lr, far below one step: a wrong gradient (a divisor off by a
// micro-batch's share, a dropped row) moves weights by ~1e-4 and fails.
const updateAtol = 2e-7

// maxAbsDiff is the largest |a−b| over all weights.
func maxAbsDiff(a, b map[string][]float32) (float64, string) {
	worst, where := 0.0, ""
	for name, x := range a {
		y := b[name]
		for i := range x {
			if d := math.Abs(float64(x[i]) - float64(y[i])); d > worst || (where == "" && d != d) {
				worst, where = d, fmt.Sprintf("%s[%d]: %g vs %g", name, i, x[i], y[i])
			}
		}
	}
	return worst, where
}

func TestBuildersGiveTheSameUpdate(t *testing.T) {
	pm, pr := t.TempDir(), t.TempDir()
	mustTrain(t, trainArgs(pm, 2, append(sameUpdateSets, "--set", "env.nemo_gym.token_id_capture.builder=prefix_merging")...)...)
	mustTrain(t, trainArgs(pr, 2, append(sameUpdateSets, "--set", "env.nemo_gym.token_id_capture.builder=per_request")...)...)
	a, b := metricsNoTimes(t, pm), metricsNoTimes(t, pr)
	if a[0].Traces >= b[0].Traces {
		t.Errorf("per_request made %d traces, prefix_merging %d: the built-in tasks should split further per request", b[0].Traces, a[0].Traces)
	}
	if a[0].EligibleTokens != b[0].EligibleTokens || a[0].RewardMean != b[0].RewardMean {
		t.Errorf("the builders trained different data: eligible %d vs %d, reward %v vs %v",
			a[0].EligibleTokens, b[0].EligibleTokens, a[0].RewardMean, b[0].RewardMean)
	}
	if d := math.Abs(float64(a[0].Loss - b[0].Loss)); d > 1e-6*math.Max(1, math.Abs(float64(a[0].Loss))) {
		t.Errorf("loss %v (prefix_merging) vs %v (per_request)", a[0].Loss, b[0].Loss)
	}
	d, where := maxAbsDiff(weights(t, pm, 2), weights(t, pr, 2))
	if d > updateAtol {
		t.Errorf("weights after the same steps under the two builders differ by %.3g at %s", d, where)
	}
	t.Logf("largest weight difference between the builders: %.3g (bound %g)", d, updateAtol)
}

func TestMicroBatchSizeDoesNotChangeTheUpdate(t *testing.T) {
	var ref map[string][]float32
	for _, mbs := range []int{1, 2, 4} {
		out := t.TempDir()
		mustTrain(t, trainArgs(out, 2, append(sameUpdateSets, "--set", fmt.Sprintf("policy.train_micro_batch_size=%d", mbs))...)...)
		w := weights(t, out, 2)
		if ref == nil {
			ref = w
			continue
		}
		d, where := maxAbsDiff(ref, w)
		if d > updateAtol {
			t.Errorf("micro-batch size %d: weights differ from size 1 by %.3g at %s", mbs, d, where)
		}
		t.Logf("micro-batch size %d: largest weight difference from size 1: %.3g (bound %g)", mbs, d, updateAtol)
	}
}

// TestInertRowsContributeNothing: running the inert rows of an external
// step (masked, invalid and overlong rollouts: the gym fixture has each)
// changes neither the metrics nor the update, bit for bit, when every row is
// its own sequence. (Packed in a token trie, an inert [pad, pad] row can
// split a trace's segment, which moves the gradient's summation order:
// TestSharedPrefixGivesTheSameStep bounds that.)
func TestInertRowsContributeNothing(t *testing.T) {
	dir := t.TempDir()
	recs, caps := gymFixture(t, dir)
	run := func(out string) {
		mustTrain(t, append([]string{"--out", out, "--steps", "1", "--rollouts", recs, "--captures", caps,
			"--set", "checkpointing.save_period=1", "--shared-prefix", "off"}, externalSets...)...)
	}
	a, b := filepath.Join(dir, "a"), filepath.Join(dir, "b")
	run(a)
	computeInertRows, inertRowsRun = true, 0
	defer func() { computeInertRows = false }()
	run(b)
	if inertRowsRun == 0 {
		t.Fatal("no inert row ran: the test shows nothing")
	}
	ma, mb := metricsNoTimes(t, a), metricsNoTimes(t, b)
	for i := range mb { // the inert rows ran: they are computed tokens
		if mb[i].ComputedTokens <= ma[i].ComputedTokens {
			t.Errorf("step %d: %d tokens computed with the inert rows, %d without", mb[i].Step, mb[i].ComputedTokens, ma[i].ComputedTokens)
		}
		mb[i].ComputedTokens, mb[i].PrefixReuse = ma[i].ComputedTokens, ma[i].PrefixReuse
	}
	sameMetrics(t, ma, mb)
	if d, where := maxAbsDiff(weights(t, a, 1), weights(t, b, 1)); d != 0 {
		t.Errorf("running %d inert rows changed the update by %.3g at %s", inertRowsRun, d, where)
	}
	t.Logf("%d inert rows ran, the update unchanged", inertRowsRun)
}

// gymFixture writes, with the gym package's writer only (not rollout/), the
// captures and rollout records of one external step: two task groups of
// four rollouts with normal, masked (conflicting duplicate), zero-call and
// overlong cases.
func gymFixture(t *testing.T, dir string) (records, captures string) {
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
	record := func(task, idx int, rid string, reward float64) {
		fmt.Fprintf(&recs, `{"_ng_task_index": %d, "_ng_rollout_index": %d, "_ng_rollout_id": %q, "reward": %v, "response": {"id": "r"}}`+"\n", task, idx, rid, reward)
	}
	for task := 0; task < 2; task++ {
		for i := 0; i < 4; i++ {
			rid := fmt.Sprintf("ext-%d-%d", task, i)
			reward := float64((task+i)%3) / 2
			switch {
			case task == 1 && i == 0: // zero calls: an inert, masked rollout
			case task == 1 && i == 1: // a conflicting duplicate: Gym masks it
				put(rid, "c1", "", []int32{1, 3, 10, 4}, []int32{5, 2})
				dup := &gym.TokenEntry{SchemaVersion: 3, RolloutID: rid, ModelCallID: "c1", Model: "m",
					PromptTokenIDs: []int32{1, 3, 10, 4}, GenerationTokenIDs: []int32{5, 2}, GenerationLogProbs: []float64{-9, -9}}
				dup.Stamp()
				line := dup.AppendJSON(nil)
				f, err := os.OpenFile(filepath.Join(captures, rid+gym.SuffixEntries), os.O_APPEND|os.O_WRONLY, 0)
				if err != nil {
					t.Fatal(err)
				}
				f.Write(append(line, '\n'))
				f.Close()
			case task == 1 && i == 2: // one overlong trace beside a trainable root
				long := make([]int32, 40)
				for j := range long {
					long[j] = int32(10 + j%10)
				}
				put(rid, "c1", "", long, []int32{5, 2})
				put(rid, "c2", "", []int32{1, 7, 11, 4}, []int32{12, 2})
			default: // a tool call, then an answer continuing it
				put(rid, "c1", "", []int32{1, 3, int32(10 + i), 9, 11, 4}, []int32{5, 2})
				put(rid, "c2", "c1", []int32{1, 3, int32(10 + i), 9, 11, 4, 5, 2, 6, 12, 4}, []int32{int32(10 + i), 2})
			}
			record(task, i, rid, reward)
			if err := w.Freeze(rid); err != nil && !errors.Is(err, gym.ErrFrozen) {
				t.Fatal(err)
			}
		}
	}
	records = filepath.Join(dir, "rollouts.jsonl")
	if err := os.WriteFile(records, recs.Bytes(), 0o644); err != nil {
		t.Fatal(err)
	}
	return records, captures
}

// TestTrainStepMasksDamagedRollouts: in the training step, damage to one
// rollout's capture files (a corrupt state file, a schema-2 line, an
// entries file shorter than its acknowledged size) masks that rollout with
// its reason in mask_reasons; the step trains on the others.
func TestTrainStepMasksDamagedRollouts(t *testing.T) {
	dir := t.TempDir()
	recs, caps := gymFixture(t, dir)
	base := func(rid string) string { return filepath.Join(caps, rid) }
	if err := os.WriteFile(base("ext-0-0")+gym.SuffixState, []byte("[]"), 0o644); err != nil {
		t.Fatal(err)
	}
	b, _ := os.ReadFile(base("ext-0-1") + gym.SuffixEntries)
	os.WriteFile(base("ext-0-1")+gym.SuffixEntries, bytes.Replace(b, []byte(`"schema_version":3`), []byte(`"schema_version":2`), 1), 0o644)
	b, _ = os.ReadFile(base("ext-0-2") + gym.SuffixEntries)
	os.WriteFile(base("ext-0-2")+gym.SuffixEntries, b[:bytes.IndexByte(b, '\n')+1], 0o644)
	out := filepath.Join(dir, "run")
	// 5 of 8 masked: over the default --max-masked-fraction.
	mustTrain(t, append([]string{"--out", out, "--steps", "1", "--rollouts", recs, "--captures", caps, "--max-masked-fraction", "1"}, externalSets...)...)
	m := metricsNoTimes(t, out)[0]
	want := map[string]int{gym.ReasonNothingRecorded: 1, gym.ReasonConflictingPayloads: 1,
		gym.ReasonInvalidState: 1, gym.ReasonUnsupportedSchema: 1, gym.ReasonIndexMismatch: 1}
	if !maps.Equal(m.MaskReasons, want) || m.MaskedRollouts != 5 {
		t.Fatalf("masked %d, reasons %v, want 5 and %v", m.MaskedRollouts, m.MaskReasons, want)
	}
}

var externalSets = []string{
	"--quiet",
	"--set", "grpo.num_prompts_per_step=2",
	"--set", "grpo.num_generations_per_prompt=4",
	"--set", "policy.train_micro_batch_size=2",
	"--set", "policy.megatron_cfg.scheduler.lr_warmup_iters=0",
}

func TestExternalGymCaptures(t *testing.T) {
	dir := t.TempDir()
	recs, caps := gymFixture(t, dir)
	out := filepath.Join(dir, "run")
	args := append([]string{"--out", out, "--steps", "1", "--rollouts", recs, "--captures", caps}, externalSets...)
	mustTrain(t, args...)
	ms := metricsNoTimes(t, out)
	if len(ms) != 1 {
		t.Fatalf("%d steps logged", len(ms))
	}
	m := ms[0]
	type counts struct{ Logical, Masked, Overlong, Invalid int }
	want := counts{Logical: 8, Masked: 2, Overlong: 1, Invalid: 2}
	got := counts{m.LogicalRollouts, m.MaskedRollouts, m.OverlongTraces, m.InvalidRollouts}
	if got != want {
		t.Errorf("external step counts %+v, want %+v", got, want)
	}
	if m.MaskReasons[gym.ReasonNothingRecorded] != 1 || m.MaskReasons[gym.ReasonConflictingPayloads] != 1 || len(m.MaskReasons) != 2 {
		t.Errorf("mask reasons %v, want one %q and one %q", m.MaskReasons, gym.ReasonNothingRecorded, gym.ReasonConflictingPayloads)
	}
	// 5 rollouts with two calls of 2 generated tokens each, plus the overlong
	// rollout's trainable root: every owned sampled token once.
	if m.EligibleTokens != 5*4+2 {
		t.Errorf("eligible tokens %d, want %d", m.EligibleTokens, 5*4+2)
	}
	if m.PhysicalRows%2 != 0 && m.PaddingRows == 0 {
		t.Errorf("rows %d + %d padding are not a multiple of the micro-batch size", m.PhysicalRows, m.PaddingRows)
	}
	// The behaviour logprobs in the captures are not the model's, so the
	// importance diagnostics see the mismatch.
	if m.GenKLError == 0 {
		t.Error("gen_kl_error is 0 on captures whose logprobs are not the policy's")
	}
}

func TestBadInputFailsBeforeWork(t *testing.T) {
	dir := t.TempDir()
	recs, caps := gymFixture(t, dir)
	bad := filepath.Join(dir, "bad.jsonl")
	data, _ := os.ReadFile(recs)
	lines := strings.SplitAfter(string(data), "\n")
	lines[3] = `{"_ng_task_index": 0, "_ng_rollout_index": 3, "_ng_rollout_id": "../../etc", "reward": 1}` + "\n"
	os.WriteFile(bad, []byte(strings.Join(lines, "")), 0o644)
	tests := []struct {
		name string
		args []string
		want []string
	}{
		{"missing capture dir", []string{"--rollouts", recs, "--captures", filepath.Join(dir, "nope")}, []string{"nope", "capture directory"}},
		{"malformed record", []string{"--rollouts", bad, "--captures", caps}, []string{"bad.jsonl:4", "_ng_rollout_id"}},
		{"guard", []string{"--set", "loss_fn.token_level_loss=false"}, []string{"loss_fn.token_level_loss"}},
		{"guard: batch size", []string{"--set", "policy.train_global_batch_size=7"}, []string{"policy.train_global_batch_size"}},
		{"unknown key", []string{"--set", "grpo.num_prompt_per_step=3"}, []string{"grpo.num_prompt_per_step", "num_prompts_per_step"}},
		{"unknown task", []string{"--tasks", "calc,chess"}, []string{"chess"}},
	}
	for _, tc := range tests {
		t.Run(tc.name, func(t *testing.T) {
			out := filepath.Join(dir, "out-"+strings.ReplaceAll(tc.name, " ", "-"))
			args := append(append([]string{"--out", out, "--steps", "1"}, externalSets...), tc.args...)
			msg := failTrain(t, args...)
			for _, w := range tc.want {
				if !strings.Contains(msg, w) {
					t.Errorf("error %q does not mention %q", msg, w)
				}
			}
			if _, err := os.Stat(filepath.Join(out, "metrics.jsonl")); err == nil {
				t.Error("a step ran before the bad input was refused")
			}
		})
	}
}

// TestNonFiniteLoss starts from weights so large that the activations
// overflow: the gradient is not finite. By default the update is skipped and
// counted; with --on-nonfinite abort the run stops with an error. The steps
// train on external captures, so that no sampling from the broken policy is
// involved (whether sampling hits a NaN first depends on the draws).
func TestNonFiniteLoss(t *testing.T) {
	dir := t.TempDir()
	init := filepath.Join(dir, "init")
	os.MkdirAll(init, 0o755)
	os.WriteFile(filepath.Join(init, "config.json"), builtinModelConfig, 0o644)
	w0 := t.TempDir()
	mustTrain(t, append(trainArgs(w0, 1), "--set", "checkpointing.save_period=1")...)
	st, err := checkpoint.Load(filepath.Join(w0, "checkpoints", checkpoint.StepDir(1)), checkpoint.LoadOptions{})
	if err != nil {
		t.Fatal(err)
	}
	for i := range st.Model {
		if st.Model[i].Name == "model.norm.weight" {
			for j := range st.Model[i].F32 {
				st.Model[i].F32[j] = 1e38
			}
		}
	}
	if err := safetensors.WriteFile(filepath.Join(init, "model.safetensors"), st.Model, map[string]string{"format": "pt"}); err != nil {
		t.Fatal(err)
	}
	recs, caps := gymFixture(t, dir)
	external := func(out string, extra ...string) []string {
		args := append([]string{"--out", out, "--steps", "1", "--rollouts", recs, "--captures", caps, "--init-from", init}, externalSets...)
		return append(args, extra...)
	}
	out := filepath.Join(dir, "skip")
	mustTrain(t, external(out, "--set", "checkpointing.save_period=1")...)
	ms := metricsNoTimes(t, out)
	if g := float64(ms[0].GradNorm); len(ms) != 1 || !ms[0].SkippedUpdate || !(math.IsNaN(g) || math.IsInf(g, 0)) {
		t.Fatalf("a non-finite gradient was not reported as a non-finite grad_norm and a skipped update: %+v", ms)
	}
	// The weights are unchanged by the skipped update.
	if d, where := maxAbsDiff(weights(t, out, 1), func() map[string][]float32 {
		w := map[string][]float32{}
		for _, x := range st.Model {
			w[x.Name] = x.F32
		}
		return w
	}()); d != 0 {
		t.Errorf("a skipped update changed the weights by %g at %s", d, where)
	}
	// Sampling from such a policy gives non-finite logprobs: a clear error,
	// never a capture with NaN in it.
	msg := failTrain(t, trainArgs(filepath.Join(dir, "skip2"), 3, "--init-from", init)...)
	if !strings.Contains(msg, "log-probability") && !strings.Contains(msg, "non-finite") {
		t.Errorf("sampling from a non-finite policy: %q", msg)
	}
	msg = failTrain(t, external(filepath.Join(dir, "abort"), "--on-nonfinite", "abort")...)
	if !strings.Contains(msg, "non-finite") {
		t.Errorf("abort on a NaN gradient: %q", msg)
	}
}

// TestReferencePolicyKL: with a KL penalty the frozen reference is the
// initial policy, so the first step's KL is exactly 0 and later ones are
// not; a resumed run rebuilds the same reference (bit-exact resume).
func TestReferencePolicyKL(t *testing.T) {
	kl := []string{"--set", "loss_fn.reference_policy_kl_penalty=0.05"}
	ref := t.TempDir()
	mustTrain(t, trainArgs(ref, 4, kl...)...)
	ms := metricsNoTimes(t, ref)
	if ms[0].KL != 0 {
		t.Errorf("step 1 KL %v, want 0 (the policy is the reference)", ms[0].KL)
	}
	if !(ms[3].KL > 0) {
		t.Errorf("step 4 KL %v, want > 0 after three updates", ms[3].KL)
	}
	out := t.TempDir()
	stopAfterStep = 3
	run(trainArgs(out, 4, kl...), &bytes.Buffer{}, &bytes.Buffer{})
	stopAfterStep = 0
	mustTrain(t, append(trainArgs(out, 4, kl...), "--resume")...)
	sameMetrics(t, ms, metricsNoTimes(t, out))
}

// TestExternalStepDirectory: a directory of step_<N>.jsonl files is consumed
// one file per step, waiting for each; a missing file times out by name.
func TestExternalStepDirectory(t *testing.T) {
	dir := t.TempDir()
	recs, caps := gymFixture(t, dir)
	steps := filepath.Join(dir, "steps")
	os.MkdirAll(steps, 0o755)
	data, _ := os.ReadFile(recs)
	os.WriteFile(filepath.Join(steps, "step_1.jsonl"), data, 0o644)
	out := filepath.Join(dir, "run")
	args := append([]string{"--out", out, "--rollouts", steps, "--captures", caps, "--wait", "300ms",
		"--steps", "2", "--set", "checkpointing.save_period=1"}, externalSets...)
	msg := failTrain(t, args...)
	if !strings.Contains(msg, "step_2.jsonl") {
		t.Errorf("missing step file: %q, want it named", msg)
	}
	if ms := metricsNoTimes(t, out); len(ms) != 1 {
		t.Fatalf("%d steps trained before the wait ran out, want 1", len(ms))
	}
	// A file with the wrong number of records is refused.
	lines := strings.SplitAfter(string(data), "\n")
	os.WriteFile(filepath.Join(steps, "step_2.jsonl"), []byte(strings.Join(lines[:3], "")), 0o644)
	msg = failTrain(t, append(args, "--resume")...)
	if !strings.Contains(msg, "3 records") {
		t.Errorf("short step file: %q", msg)
	}
	// Once the file is there, the run goes on from the checkpoint.
	os.WriteFile(filepath.Join(steps, "step_2.jsonl"), data, 0o644)
	mustTrain(t, append(args, "--resume")...)
	if ms := metricsNoTimes(t, out); len(ms) != 2 {
		t.Errorf("%d steps after resuming, want 2", len(ms))
	}
}

// TestSchedulerCountsLogicalRollouts: the scheduler's clock advances by the
// logical rollout count of each step (12 here), however many physical rows
// the traces expanded into, and the optimizer steps once per GRPO step.
func TestSchedulerCountsLogicalRollouts(t *testing.T) {
	out := t.TempDir()
	mustTrain(t, trainArgs(out, 4)...)
	ms := metricsNoTimes(t, out)
	rows := map[int]bool{}
	for _, m := range ms {
		rows[m.PhysicalRows+m.PaddingRows] = true
	}
	ts, err := checkpoint.ParseTrainerState(checkpointBytes(t, out, 4, "trainer_state.json"))
	if err != nil {
		t.Fatal(err)
	}
	var sched struct{ Samples, Steps int64 }
	var opt struct{ Step int64 }
	json.Unmarshal(ts.Scheduler, &sched)
	json.Unmarshal(ts.Optimizer, &opt)
	if sched.Samples != 4*12 || sched.Steps != 4 || opt.Step != 4 {
		t.Errorf("after 4 steps of 12 logical rollouts (physical row counts %v): scheduler %+v, optimizer step %d; want 48 samples, 4 ticks, 4 updates",
			rows, sched, opt.Step)
	}
	if ts.ConsumedRollouts != 48 {
		t.Errorf("consumed_logical_rollouts = %d, want 48", ts.ConsumedRollouts)
	}
}

// learnGainMin is the least gain of mean reward (last 10 steps minus first
// 10) that TestBuiltinJobLearns accepts from its 40-step run. It was set from
// the spread over seeds, not from one seed: 40-step runs at lr 3e-3 of seeds
// 1–30 gained 0.226 on average, standard deviation 0.045, least 0.106
// (seed 12), and every one of the 30 passes 0.08, which is 3.2 standard
// deviations below the mean. The same runs at lr 0 (a policy that does not
// learn) gained 0.002 ± 0.004 over seeds 1–10, so 0.08 is ~19 of their
// standard deviations above them: a change that stops learning fails, and a
// harmless change to how random numbers are drawn (a new seed in effect)
// passes. Re-measure with scripts/learning_guard.sh when the task, the model
// or the recipe changes.
const learnGainMin = 0.08

// bf16GainSpread is how far the bf16 run's gain may lie from the fp32 run's:
// three standard deviations (0.045) of the gain over seeds. Mixed precision
// changes the sampled rollouts from the first update on, as a new seed does.
const bf16GainSpread = 0.135

// TestBuiltinJobLearns guards the main job's learning in CI time: 40 steps
// of the built-in job at a higher learning rate must raise the mean reward
// of the last 10 steps above the first 10 by learnGainMin (the full 300-step
// job is measured in docs/benchmarks.md and generated into README.md).
func TestBuiltinJobLearns(t *testing.T) {
	out := t.TempDir()
	mustTrain(t, "--out", out, "--quiet", "--steps", "40",
		"--set", "policy.megatron_cfg.optimizer.lr=3e-3", "--set", "checkpointing.enabled=false")
	ms := metricsNoTimes(t, out)
	_, first, last := RewardEnds(ms)
	if last-first < learnGainMin {
		t.Errorf("mean reward of the first 10 steps %.3f, of the last 10 %.3f: gain %.3f < %.2f, the built-in job did not learn",
			first, last, last-first, learnGainMin)
	}
	t.Logf("mean reward: first 10 steps %.3f, last 10 %.3f (gain %.3f, guard %.2f)", first, last, last-first, learnGainMin)
}

// TestSignalStopsAfterTheStepWithACheckpoint: SIGTERM (a pre-emption) during
// step 1 ends the run after that step with a checkpoint of it, although 1 is
// not a multiple of save_period; --resume then finishes bit-identical to a
// run that was never stopped (captures in memory or on disk).
func TestSignalStopsAfterTheStepWithACheckpoint(t *testing.T) {
	ref := t.TempDir()
	mustTrain(t, trainArgs(ref, 4)...)
	for _, store := range captureStores {
		t.Run(store.name, func(t *testing.T) {
			out := t.TempDir()
			testSignals = make(chan os.Signal, 1)
			testSignals <- syscall.SIGTERM
			var stderr bytes.Buffer
			code := run(trainArgs(out, 4, store.args...), &bytes.Buffer{}, &stderr)
			testSignals = nil
			if code == 0 || !strings.Contains(stderr.String(), "after step 1") || !strings.Contains(stderr.String(), "--resume") {
				t.Fatalf("SIGTERM: exit %d, %q; want a stop after step 1 naming --resume", code, stderr.String())
			}
			if _, err := os.Stat(filepath.Join(out, "checkpoints", checkpoint.StepDir(1), checkpoint.DoneFile)); err != nil {
				t.Fatalf("no complete checkpoint of step 1 after the signal: %v", err)
			}
			mustTrain(t, append(trainArgs(out, 4, store.args...), "--resume")...)
			sameMetrics(t, metricsNoTimes(t, ref), metricsNoTimes(t, out))
			if !bytes.Equal(checkpointBytes(t, ref, 4, checkpoint.ModelFile), checkpointBytes(t, out, 4, checkpoint.ModelFile)) {
				t.Error("weights after a signal and --resume differ from the uninterrupted run")
			}
		})
	}
}

// TestActivationCheckpointingIsBitIdentical: the recipe's activation
// checkpointing (megatron_cfg here, the block the built-in recipe enables)
// recomputes activations in the backward pass and changes no bit of the
// run: metrics and weights equal those without it, with a KL reference
// policy too (which runs in the policy's activation memory).
func TestActivationCheckpointingIsBitIdentical(t *testing.T) {
	kl := []string{"--set", "loss_fn.reference_policy_kl_penalty=0.05"}
	plain, ckpt := t.TempDir(), t.TempDir()
	loud := func(args []string) []string {
		return slices.DeleteFunc(args, func(a string) bool { return a == "--quiet" })
	}
	if log := mustTrain(t, loud(trainArgs(plain, 3, kl...))...); !strings.Contains(log, "activation checkpointing off") {
		t.Fatalf("the run does not say checkpointing is off:\n%s", log)
	}
	log := mustTrain(t, loud(trainArgs(ckpt, 3, append(kl, "--set", "policy.megatron_cfg.activation_checkpointing=true")...))...)
	if !strings.Contains(log, "activation checkpointing on (policy.megatron_cfg.activation_checkpointing)") {
		t.Fatalf("the recipe's checkpointing did not reach the model:\n%s", log)
	}
	sameMetrics(t, metricsNoTimes(t, plain), metricsNoTimes(t, ckpt))
	if d, name := maxAbsDiff(weights(t, plain, 3), weights(t, ckpt, 3)); d != 0 {
		t.Fatalf("weights differ by %g (%s)", d, name)
	}
}

// TestCPUSaysItComputesInFP32: policy.precision=bfloat16 on the CPU trains
// in fp32, exactly as float32 does, and says so once, even under --quiet.
func TestCPUSaysItComputesInFP32(t *testing.T) {
	f32, bf16 := t.TempDir(), t.TempDir()
	mustTrain(t, trainArgs(f32, 2)...)
	log := mustTrain(t, trainArgs(bf16, 2, "--set", "policy.precision=bfloat16", "--quiet")...)
	if n := strings.Count(log, "computes in fp32"); n != 1 {
		t.Fatalf("the CPU said %d times that it computes in fp32:\n%s", n, log)
	}
	sameMetrics(t, metricsNoTimes(t, f32), metricsNoTimes(t, bf16))
}

// TestBuiltinJobLearnsInBF16: 50 steps of the built-in job in bf16 mixed
// precision learn as fp32 does. The CPU runs the mixed-precision path here
// through its reference bf16 kernels (the ones the CUDA kernels are checked
// against); kernels/cuda runs the same on the emulator.
func TestBuiltinJobLearnsInBF16(t *testing.T) {
	gains := map[string]float64{}
	for _, prec := range []string{"float32", "bfloat16"} {
		cpuMixedPrecision = prec == "bfloat16"
		out := t.TempDir()
		log := mustTrain(t, "--out", out, "--steps", "50", "--set", "policy.precision="+prec,
			"--set", "policy.megatron_cfg.optimizer.lr=3e-3", "--set", "checkpointing.enabled=false")
		cpuMixedPrecision = false
		if want := map[string]string{"float32": "compute: fp32", "bfloat16": "compute: bf16 mixed precision"}[prec]; !strings.Contains(log, want) {
			t.Fatalf("%s: the run does not say %q:\n%s", prec, want, log)
		}
		ms := metricsNoTimes(t, out)
		_, first, last := RewardEnds(ms)
		gains[prec] = last - first
		t.Logf("%s: mean reward of the first 10 steps %.3f, of the last 10 %.3f (gain %.3f)", prec, first, last, last-first)
	}
	if g := gains["bfloat16"]; g < learnGainMin || math.Abs(g-gains["float32"]) > bf16GainSpread {
		t.Errorf("bf16 gain %.3f, fp32 gain %.3f: want ≥ %.2f and within %.2f of fp32's", g, gains["float32"], learnGainMin, bf16GainSpread)
	}
}

// convertCounter counts the whole-arena bf16 conversions of n parameters:
// the mixed-precision weight copy.
type convertCounter struct {
	kernels.Backend
	n, copies int
}

func (c *convertCounter) Convert(dst, src kernels.Buf) {
	if dst.DType == kernels.BF16 && dst.N == c.n {
		c.copies++
	}
	c.Backend.Convert(dst, src)
}

// TestWeightCopyOncePerStep: under mixed precision the trainer has the bf16
// copy of the weights remade once per optimizer step, not per micro-batch
// or per forward: five steps, five copies (the first before step 1's
// generation, then one after each update but the last).
func TestWeightCopyOncePerStep(t *testing.T) {
	cfg, err := model.ParseConfig(builtinModelConfig, "builtin")
	if err != nil {
		t.Fatal(err)
	}
	c := &convertCounter{n: model.NewParamTable(cfg).Total}
	testWrap = func(b kernels.Backend) kernels.Backend { c.Backend = b; return c }
	cpuMixedPrecision = true
	defer func() { testWrap, cpuMixedPrecision = nil, false }()
	// Micro-batches of 2 rows: several forwards per step.
	mustTrain(t, trainArgs(t.TempDir(), 5, "--set", "policy.precision=bfloat16", "--set", "policy.train_micro_batch_size=2")...)
	if c.copies != 5 {
		t.Fatalf("5 steps made %d copies of the weights, want 5", c.copies)
	}
}

// TestSamplerSlotsDoNotChangeTheRun: with fewer sampler slots than calls in
// a round, the calls decode in turn (each finished slot takes the next
// waiting prompt) and the run is bit-identical: every call draws from its
// own random stream.
func TestSamplerSlotsDoNotChangeTheRun(t *testing.T) {
	full, few := t.TempDir(), t.TempDir()
	mustTrain(t, trainArgs(full, 2)...)
	maxSamplerSlots = 5
	defer func() { maxSamplerSlots = 256 }()
	mustTrain(t, trainArgs(few, 2)...)
	sameMetrics(t, metricsNoTimes(t, full), metricsNoTimes(t, few))
	if d, name := maxAbsDiff(weights(t, full, 2), weights(t, few, 2)); d != 0 {
		t.Fatalf("weights differ by %g (%s)", d, name)
	}
}

// TestSharedPrefixGivesTheSameStep: a step of the built-in job with its
// traces packed as token tries (policy.shared_prefix=auto) against every
// trace packed alone (off), on the same rollouts: every metric but the
// computed tokens, prefix_reuse and the gradient norm is the same bit for
// bit (the log-probabilities are, and each row's loss sums are added in row
// order either way); the gradient differs only by summation order, so the
// updated weights agree within updateAtol; and the tries computed fewer
// tokens than the traces hold.
func TestSharedPrefixGivesTheSameStep(t *testing.T) {
	on, off := t.TempDir(), t.TempDir()
	mustTrain(t, trainArgs(on, 1, append(sameUpdateSets, "--set", "checkpointing.save_period=1", "--shared-prefix", "auto")...)...)
	mustTrain(t, trainArgs(off, 1, append(sameUpdateSets, "--set", "checkpointing.save_period=1", "--set", "policy.shared_prefix=off")...)...)
	a, b := metricsNoTimes(t, on)[0], metricsNoTimes(t, off)[0]
	if !(a.PrefixReuse > 1.2) || b.PrefixReuse != 1 || a.ComputedTokens >= b.ComputedTokens || a.TrainTokens != b.TrainTokens {
		t.Errorf("prefix_reuse %v with sharing (%d of %d tokens computed), %v without (%d): want > 1.2 and 1",
			a.PrefixReuse, a.ComputedTokens, a.TrainTokens, b.PrefixReuse, b.ComputedTokens)
	}
	if d := math.Abs(float64(a.GradNorm-b.GradNorm)) / float64(b.GradNorm); d > 1e-5 {
		t.Errorf("grad norm %v with sharing, %v without", a.GradNorm, b.GradNorm)
	}
	reuse, computed := a.PrefixReuse, a.ComputedTokens
	a.ComputedTokens, a.PrefixReuse, a.GradNorm = b.ComputedTokens, b.PrefixReuse, b.GradNorm
	sameMetrics(t, []Metrics{b}, []Metrics{a})
	d, where := maxAbsDiff(weights(t, on, 1), weights(t, off, 1))
	if d > updateAtol {
		t.Errorf("weights after the step with and without shared prefixes differ by %.3g at %s", d, where)
	}
	t.Logf("prefix_reuse %.3f (%d trace tokens, %d computed); largest weight difference %.3g (bound %g)",
		reuse, a.TrainTokens, computed, d, updateAtol)
}

// TestSharedPrefixShapes: policy.shared_prefix=auto builds the model for
// token trees, off does not, and a sparse model's traces are never packed as
// tries (its load-balancing loss counts each token once per trace).
func TestSharedPrefixShapes(t *testing.T) {
	for _, c := range []struct {
		set    string
		sparse bool
		tree   bool
	}{{"policy.shared_prefix=auto", false, true}, {"policy.shared_prefix=off", false, false}, {"policy.shared_prefix=auto", true, false}} {
		ld, _, err := LoadRecipe(nil, []string{c.set})
		if err != nil {
			t.Fatal(err)
		}
		sh, err := shapeOf(&ld.Config, "cpu", 0, 0, true, c.sparse)
		if err != nil {
			t.Fatal(err)
		}
		if sh.opt.Tree != c.tree {
			t.Errorf("%s, sparse %v: Options.Tree %v, want %v", c.set, c.sparse, sh.opt.Tree, c.tree)
		}
	}
}

// TestMaskedFractionStops: a step whose masked share of logical rollouts
// exceeds --max-masked-fraction stops before training, naming each mask
// reason with its count (a capture directory that is not the rollouts':
// every one nothing_recorded; records that arrive masked, masked_upstream); at the limit
// it trains, and with nothing eligible left the error names the reasons.
func TestMaskedFractionStops(t *testing.T) {
	dir := t.TempDir()
	recs, caps := gymFixture(t, dir)
	empty := filepath.Join(dir, "empty")
	if err := os.Mkdir(empty, 0o755); err != nil {
		t.Fatal(err)
	}
	// Two records masked by their own mask_sample: with the fixture's two
	// Gym masks, 4 of 8.
	b, err := os.ReadFile(recs)
	if err != nil {
		t.Fatal(err)
	}
	lines := strings.SplitAfter(string(b), "\n")
	for _, i := range []int{0, 1} {
		lines[i] = strings.Replace(lines[i], `"reward"`, `"mask_sample": true, "reward"`, 1)
	}
	half := filepath.Join(dir, "half.jsonl")
	if err := os.WriteFile(half, []byte(strings.Join(lines, "")), 0o644); err != nil {
		t.Fatal(err)
	}
	args := func(out, rollouts, captures string, extra ...string) []string {
		return append(append([]string{"--out", filepath.Join(dir, out), "--steps", "1", "--rollouts", rollouts, "--captures", captures}, externalSets...), extra...)
	}
	for _, c := range []struct {
		name string
		args []string
		want []string // "": trains
	}{
		{"wrong captures", args("a", recs, empty), []string{"step 1: 8 of 8 logical rollouts (100.0%) are masked, more than --max-masked-fraction 0.5: nothing_recorded 8",
			"is --captures the directory their generator captured into?"}},
		{"half, at the limit", args("b", half, caps), nil},
		{"half, over a lower limit", args("c", half, caps, "--max-masked-fraction", "0.4"),
			[]string{"4 of 8 logical rollouts (50.0%) are masked, more than --max-masked-fraction 0.4: masked_upstream 2, conflicting_payloads 1, nothing_recorded 1"}},
		{"nothing eligible", args("d", recs, empty, "--max-masked-fraction", "1"),
			[]string{"no eligible training tokens: 8 logical rollouts, 8 masked (nothing_recorded 8), 8 invalid (no trainable row), 0 traces overlong"}},
		{"a fraction above 1", args("e", recs, caps, "--max-masked-fraction", "1.5"), []string{"--max-masked-fraction 1.5: want a share from 0"}},
	} {
		t.Run(c.name, func(t *testing.T) {
			if c.want == nil {
				mustTrain(t, c.args...)
				if m := metricsNoTimes(t, filepath.Join(dir, "b"))[0]; m.MaskedRollouts != 4 || m.MaskReasons[gym.ReasonMaskedUpstream] != 2 {
					t.Errorf("masked %d, reasons %v; want 4 with %s 2", m.MaskedRollouts, m.MaskReasons, gym.ReasonMaskedUpstream)
				}
				return
			}
			msg := failTrain(t, c.args...)
			for _, w := range c.want {
				if !strings.Contains(msg, w) {
					t.Errorf("message lacks %q:\n%s", w, msg)
				}
			}
			if _, err := os.Stat(filepath.Join(dir, c.args[1], "checkpoints")); err == nil {
				t.Errorf("a stopped step wrote a checkpoint")
			}
		})
	}
}
