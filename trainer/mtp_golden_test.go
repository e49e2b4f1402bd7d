package trainer

import (
	"bytes"
	"encoding/json"
	"errors"
	"fmt"
	"github.com/tracegrpo/tracegrpo/config"
	"github.com/tracegrpo/tracegrpo/kernels/cpu"
	"math"
	"os"
	"path/filepath"
	"slices"
	"strings"
	"testing"

	"github.com/tracegrpo/tracegrpo/checkpoint"
	"github.com/tracegrpo/tracegrpo/gym"
	"github.com/tracegrpo/tracegrpo/internal/safetensors"
)

// mtpGolden is trainer/testdata/mtp_grpo/golden.json
// (scripts/golden_mtp_grpo.py).
type mtpGolden struct {
	Sets  map[string]any `json:"sets"`
	Steps []struct {
		Rollouts []struct {
			Task  int `json:"task"`
			Index int `json:"index"`
			Calls []struct {
				Prompt     []int32   `json:"prompt"`
				Generation []int32   `json:"generation"`
				GenLP      []float64 `json:"generation_logprobs"`
			} `json:"calls"`
			Reward float64 `json:"reward"`
		} `json:"rollouts"`
		Loss           float64   `json:"loss"`
		GradNorm       float64   `json:"grad_norm"`
		MTPGradNorm    float64   `json:"mtp_grad_norm"`
		MTPLoss        []float64 `json:"mtp_loss"`
		LR             float64   `json:"lr"`
		EligibleTokens int       `json:"eligible_tokens"`
		TrainTokens    int       `json:"train_tokens"`
		// Counts are each router's tokens per expert (the expert-bias
		// golden's, scripts/golden_bias_grpo.py).
		Counts map[string][]int64 `json:"counts"`
	} `json:"steps"`
}

const mtpGoldenDir = "testdata/mtp_grpo"

// loadMTPGolden writes the golden's rollouts as NeMo Gym records and
// captures under tmp (a second call's parent is the first).
func loadMTPGolden(t *testing.T, tmp string) (g mtpGolden, caps, steps string) {
	t.Helper()
	return loadGymGolden(t, mtpGoldenDir, "scripts/golden_mtp_grpo.py", tmp)
}

// loadGymGolden is loadMTPGolden for the golden in dir (golden.json in
// mtpGolden's layout) that script writes.
func loadGymGolden(t *testing.T, dir, script, tmp string) (g mtpGolden, caps, steps string) {
	t.Helper()
	raw, err := os.ReadFile(filepath.Join(dir, "golden.json"))
	if err != nil {
		t.Fatalf("%v (regenerate with: make golden, or /usr/bin/python3 %s)", err, script)
	}
	if err := json.Unmarshal(raw, &g); err != nil {
		t.Fatal(err)
	}
	caps, steps = filepath.Join(tmp, "captures"), filepath.Join(tmp, "steps")
	if err := os.MkdirAll(steps, 0o755); err != nil {
		t.Fatal(err)
	}
	w, err := gym.NewWriter(caps)
	if err != nil {
		t.Fatal(err)
	}
	w.SetFsync(false)
	for s, st := range g.Steps {
		var recs bytes.Buffer
		for _, r := range st.Rollouts {
			rid := fmt.Sprintf("mtp-%d-%d-%d", s+1, r.Task, r.Index)
			for c, call := range r.Calls {
				parent := ""
				if c > 0 {
					parent = fmt.Sprintf("c%d", c)
				}
				if err := w.Put(gym.NewCallEntry(rid, fmt.Sprintf("c%d", c+1), "m", call.Prompt, call.Generation, call.GenLP, parent, "")); err != nil {
					t.Fatal(err)
				}
			}
			if err := w.Freeze(rid); err != nil && !errors.Is(err, gym.ErrFrozen) {
				t.Fatal(err)
			}
			fmt.Fprintf(&recs, `{"_ng_task_index": %d, "_ng_rollout_index": %d, "_ng_rollout_id": %q, "reward": %v, "response": {"id": "r"}}`+"\n",
				r.Task, r.Index, rid, r.Reward)
		}
		if err := os.WriteFile(filepath.Join(steps, fmt.Sprintf("step_%d.jsonl", s+1)), recs.Bytes(), 0o644); err != nil {
			t.Fatal(err)
		}
	}
	return g, caps, steps
}

// mtpGoldenArgs are the train arguments of the golden's two steps.
func mtpGoldenArgs(g mtpGolden, caps, steps, out string, extra ...string) []string {
	return gymGoldenArgs(mtpGoldenDir, g, caps, steps, out, extra...)
}

// gymGoldenArgs is mtpGoldenArgs for the golden in dir.
func gymGoldenArgs(dir string, g mtpGolden, caps, steps, out string, extra ...string) []string {
	args := []string{"--out", out, "--steps", "2", "--quiet", "--rollouts", steps, "--captures", caps, "--init-from", dir,
		"--set", "checkpointing.save_period=1"}
	for _, k := range slices.Sorted(func(yield func(string) bool) {
		for k := range g.Sets {
			if !yield(k) {
				return
			}
		}
	}) {
		args = append(args, "--set", fmt.Sprintf("%s=%v", k, g.Sets[k]))
	}
	return append(args, extra...)
}

// Bounds of TestMTPGRPOGolden, as TestSparseGRPOGolden's: the metrics are
// sums over ~70-140 tokens in float32 (relative 1e-5); AdamW with eps 1e-4
// turns float32 rounding of the clipped gradients into ≲ 1e-7 of weight a
// step. Reassociated sums (other micro-batches, ranks) stay well inside.
// A dropped depth, a wrong normaliser (per micro-batch, or the main loss's
// G_tok), an undetached head or a router frozen that trains moves the
// weights or the MTP metrics by ~1e-4 or more.
const (
	mtpGoldenMetricRtol = 1e-5
	mtpGoldenWeightAtol = 1e-6
)

// TestMTPGRPOGolden: two GRPO steps of a tiny Super-shaped Nemotron-H with
// Super's recipe MTP (2 depths, one repeated block, detached heads,
// scaling 0.3, the backbone's routers frozen) from external rollouts whose
// second calls the per_request builder makes second traces (their first
// calls' tokens owned by the first traces) end with each step's loss,
// grad_norm (the main set's), mtp_grad_norm, each depth's mtp_loss and
// the weights of scripts/golden_mtp_grpo.py (float64 PyTorch) — and so
// they do when the step's traces are packed into other micro-batches
// (one of every trace, or of at most 40 tokens each) and across 2 ranks, and 3 fully sharded ranks:
// the MTP term's normaliser is the step's, not a micro-batch's; and the
// prefix_merging builder, one merged trace per rollout, trains the same.
func TestMTPGRPOGolden(t *testing.T) {
	tmp := t.TempDir()
	g, caps, steps := loadMTPGolden(t, tmp)
	gold, err := safetensors.Open(filepath.Join(mtpGoldenDir, "golden.safetensors"))
	if err != nil {
		t.Fatal(err)
	}
	defer gold.Close()
	check := func(t *testing.T, out string, merged bool) {
		ms := metricsNoTimes(t, out)
		if len(ms) != 2 {
			t.Fatalf("%d metric lines, want 2", len(ms))
		}
		for s, want := range g.Steps {
			m := ms[s]
			if m.EligibleTokens != want.EligibleTokens || m.TrainTokens != want.TrainTokens && !merged {
				t.Errorf("step %d: eligible %d, train tokens %d; the golden's %d and %d", s+1, m.EligibleTokens, m.TrainTokens, want.EligibleTokens, want.TrainTokens)
			}
			if m.ComputedTokens != m.TrainTokens {
				// policy.shared_prefix is auto: with MTP on the traces are packed alone.
				t.Errorf("step %d: %d computed tokens for %d trace tokens: traces with MTP were packed as tries", s+1, m.ComputedTokens, m.TrainTokens)
			}
			if len(m.MTPLoss) != len(want.MTPLoss) || m.MTPGradNorm == nil {
				t.Fatalf("step %d: mtp_loss %v, mtp_grad_norm %v; want %d depths and a norm", s+1, m.MTPLoss, m.MTPGradNorm, len(want.MTPLoss))
			}
			ms := []goldenMetric{
				{"loss", float64(m.Loss), want.Loss},
				{"grad_norm", float64(m.GradNorm), want.GradNorm},
				{"mtp_grad_norm", float64(*m.MTPGradNorm), want.MTPGradNorm},
				{"lr", float64(m.LR), want.LR},
			}
			for k, x := range want.MTPLoss {
				ms = append(ms, goldenMetric{fmt.Sprintf("mtp_loss[%d]", k), float64(m.MTPLoss[k]), x})
			}
			checkGoldenMetrics(t, s+1, mtpGoldenMetricRtol, ms)
			got := stepTensors(t, out, s+1)[checkpoint.KindWeights]
			worst, where := 0.0, ""
			for name, x := range got {
				y := make([]float32, len(x))
				if err := gold.ReadF32(fmt.Sprintf("step%d.%s", s+1, name), y); err != nil {
					t.Fatal(err)
				}
				for i := range x {
					if d := math.Abs(float64(x[i]) - float64(y[i])); d > worst || d != d {
						worst, where = d, fmt.Sprintf("%s[%d]: %g vs %g", name, i, x[i], y[i])
					}
				}
			}
			if !(worst <= mtpGoldenWeightAtol) {
				t.Errorf("step %d: weights differ from the golden by %.3g at %s (bound %g)", s+1, worst, where, mtpGoldenWeightAtol)
			}
			t.Logf("step %d: %d tensors, largest weight difference from the golden %.3g (bound %g)", s+1, len(got), worst, mtpGoldenWeightAtol)
			for _, name := range []string{"mtp.layers.0.eh_proj.weight", "mtp.layers.1.final_layernorm.weight", "mtp.layers.1.mixer.gate.weight"} {
				if _, ok := got[name]; !ok {
					t.Errorf("the checkpoint has no %s", name)
				}
			}
		}
	}
	for _, c := range []struct {
		name  string
		ranks int
		extra []string
	}{
		{"micro-batches of 40 tokens", 1, nil},
		{"one micro-batch", 1, []string{"--set", "policy.train_micro_batch_size=8"}},
		{"two ranks", 2, []string{"--set", "cluster.num_nodes=1", "--set", "cluster.gpus_per_node=2"}},
		{"three sharded ranks", 3, []string{"--shard", "full", "--set", "cluster.num_nodes=1", "--set", "cluster.gpus_per_node=3"}},
		// Split/merge equivalence (spec §6.6) holds for the MTP term too:
		// a target's context is its whole causal prefix either way.
		{"prefix_merging", 1, []string{"--set", "env.nemo_gym.token_id_capture.builder=prefix_merging"}},
	} {
		t.Run(c.name, func(t *testing.T) {
			out := filepath.Join(tmp, "run-"+strings.ReplaceAll(c.name, " ", "-"))
			args := mtpGoldenArgs(g, caps, steps, out, c.extra...)
			if c.ranks == 1 {
				mustTrain(t, args...)
			} else {
				mustRanks(t, c.ranks, args...)
			}
			check(t, out, c.name == "prefix_merging")
		})
	}
}

// TestMTPInertRowsContributeNothing: with MTP on, a masked rollout's rows
// (inert: sample mask 0) add nothing to the MTP term, its counts or the
// update when they run.
func TestMTPInertRowsContributeNothing(t *testing.T) {
	tmp := t.TempDir()
	g, caps, steps := loadMTPGolden(t, tmp)
	// Step 1's second rollout (two traces) masked by its record.
	p := filepath.Join(steps, "step_1.jsonl")
	data, err := os.ReadFile(p)
	if err != nil {
		t.Fatal(err)
	}
	lines := bytes.SplitAfter(data, []byte("\n"))
	lines[1] = bytes.Replace(lines[1], []byte(`"reward"`), []byte(`"mask_sample": true, "reward"`), 1)
	if err := os.WriteFile(p, bytes.Join(lines, nil), 0o644); err != nil {
		t.Fatal(err)
	}
	run := func(out string) {
		mustTrain(t, mtpGoldenArgs(g, caps, steps, out, "--steps", "1", "--set", "policy.train_micro_batch_size=8", "--max-masked-fraction", "1")...)
	}
	a, b := filepath.Join(tmp, "a"), filepath.Join(tmp, "b")
	run(a)
	computeInertRows, inertRowsRun = true, 0
	defer func() { computeInertRows = false }()
	run(b)
	if inertRowsRun == 0 {
		t.Fatal("no inert row ran: the test shows nothing")
	}
	// A hybrid model's kernels block their sums by the micro-batch's
	// tokens (the scan's chunks, the experts' groups), so more rows
	// reassociate them: within float32 rounding, where a leaked inert
	// target moves mtp_loss by ~1e-2.
	ma, mb := metricsNoTimes(t, a)[0], metricsNoTimes(t, b)[0]
	close := func(what string, x, y float64) {
		if math.Abs(x-y) > 1e-6*math.Max(math.Abs(x), 1) {
			t.Errorf("%s: %.9g without the inert rows, %.9g with", what, x, y)
		}
	}
	close("loss", float64(ma.Loss), float64(mb.Loss))
	close("grad_norm", float64(ma.GradNorm), float64(mb.GradNorm))
	close("mtp_grad_norm", float64(*ma.MTPGradNorm), float64(*mb.MTPGradNorm))
	for k := range ma.MTPLoss {
		close(fmt.Sprintf("mtp_loss[%d]", k), float64(ma.MTPLoss[k]), float64(mb.MTPLoss[k]))
	}
	if ma.EligibleTokens != mb.EligibleTokens || mb.MaskedRollouts != 1 {
		t.Errorf("eligible %d and %d, masked rollouts %d", ma.EligibleTokens, mb.EligibleTokens, mb.MaskedRollouts)
	}
	if d, where := maxAbsDiff(weights(t, a, 1), weights(t, b, 1)); d > 1e-7 {
		t.Errorf("running %d inert rows changed the update by %.3g at %s", inertRowsRun, d, where)
	}
	t.Logf("%d inert rows ran, the MTP metrics %v and the update unchanged", inertRowsRun, ma.MTPLoss)
}

// TestMTPRefusals: multi-token prediction the checkpoint cannot train is
// refused by name, saying what is missing; a recipe without the key takes
// the checkpoint's num_nextn_predict_layers (Megatron-Bridge's provider),
// and without policy.megatron_cfg.enabled the keys have no effect.
func TestMTPRefusals(t *testing.T) {
	model := func(t *testing.T, initFrom string, sets ...string) (mcDepths int, mcRepeated bool, err error) {
		t.Helper()
		ld, _, err := LoadRecipe(nil, sets)
		if err != nil {
			t.Fatal(err)
		}
		mc, _, err := ModelConfig(&ld.Config, initFrom)
		return mc.MTP.Depths, mc.MTP.Repeated, err
	}
	for _, c := range []struct {
		name, init string
		sets       []string
		want       string
	}{
		{"a dense model", "", []string{"policy.megatron_cfg.mtp_num_layers=1"}, "has no multi-token prediction layers"},
		{"a block per depth from one", mtpGoldenDir, []string{"policy.megatron_cfg.mtp_num_layers=3", "policy.megatron_cfg.mtp_use_repeated_layer=false"}, "needs a block per depth"},
		{"too many depths", mtpGoldenDir, []string{"policy.megatron_cfg.mtp_num_layers=65"}, "expected 0 to 64"},
		{"a negative weight", mtpGoldenDir, []string{"policy.megatron_cfg.mtp_num_layers=2", "policy.megatron_cfg.mtp_loss_scaling_factor=-1"}, "policy.megatron_cfg.mtp_loss_scaling_factor"},
	} {
		t.Run(c.name, func(t *testing.T) {
			_, _, err := model(t, c.init, c.sets...)
			var r *config.Refusal
			if err == nil || !errors.As(err, &r) || !strings.Contains(err.Error(), c.want) {
				t.Fatalf("%v, want a refusal containing %q", err, c.want)
			}
		})
	}
	if d, rep, err := model(t, mtpGoldenDir); err != nil || d != 1 || !rep {
		t.Errorf("no mtp_num_layers: %d depths (repeated %v), %v; want the checkpoint's 1, repeated", d, rep, err)
	}
	if d, _, err := model(t, mtpGoldenDir, "policy.megatron_cfg.enabled=false", "policy.megatron_cfg.mtp_num_layers=2"); err != nil || d != 0 {
		t.Errorf("megatron off: %d depths, %v; want none", d, err)
	}
	if d, _, err := model(t, "", "policy.megatron_cfg.mtp_num_layers=0", "policy.megatron_cfg.mtp_loss_scaling_factor=0.3"); err != nil || d != 0 {
		t.Errorf("mtp_num_layers 0 with a weight: %d depths, %v; want none, no refusal", d, err)
	}
}

// TestMTPExport: train export of a checkpoint that trained MTP keeps the
// mtp.layers.* tensors (equal to the checkpoint's) and config.json's MTP
// keys.
func TestMTPExport(t *testing.T) {
	tmp := t.TempDir()
	g, caps, steps := loadMTPGolden(t, tmp)
	out := filepath.Join(tmp, "run")
	mustTrain(t, mtpGoldenArgs(g, caps, steps, out, "--steps", "1")...)
	ckpt := filepath.Join(out, "checkpoints", checkpoint.StepDir(1))
	hf := filepath.Join(tmp, "hf")
	be := cpu.New(1)
	defer be.Close()
	if err := ExportHF(be, nil, ckpt, hf, safetensors.F32); err != nil {
		t.Fatal(err)
	}
	f, err := safetensors.Open(filepath.Join(hf, "model.safetensors"))
	if err != nil {
		t.Fatal(err)
	}
	defer f.Close()
	want := stepTensors(t, out, 1)[checkpoint.KindWeights]
	n := 0
	for name, x := range want {
		if !strings.HasPrefix(name, "mtp.") {
			continue
		}
		n++
		y := make([]float32, len(x))
		if err := f.ReadF32(name, y); err != nil {
			t.Fatalf("the export: %v", err)
		}
		if !slices.Equal(x, y) {
			t.Fatalf("the export's %s differs from the checkpoint's", name)
		}
	}
	if n == 0 {
		t.Fatal("the checkpoint has no mtp.* tensors")
	}
	cfg, err := os.ReadFile(filepath.Join(hf, "config.json"))
	if err != nil {
		t.Fatal(err)
	}
	if !bytes.Contains(cfg, []byte(`"mtp_hybrid_override_pattern": "*E"`)) || !bytes.Contains(cfg, []byte(`"num_nextn_predict_layers": 1`)) {
		t.Errorf("the export's config.json lost the MTP keys:\n%s", cfg)
	}
	t.Logf("%d mtp.* tensors exported", n)
}
