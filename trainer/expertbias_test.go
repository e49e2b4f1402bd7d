package trainer

import (
	"errors"
	"fmt"
	"math"
	"path/filepath"
	"slices"
	"strings"
	"testing"

	"github.com/tracegrpo/tracegrpo/checkpoint"
	"github.com/tracegrpo/tracegrpo/config"
	"github.com/tracegrpo/tracegrpo/internal/safetensors"
	"github.com/tracegrpo/tracegrpo/kernels/cpu"
)

// biasGoldenDir holds scripts/golden_bias_grpo.py's variants.
const biasGoldenDir = "testdata/bias_grpo"

const biasGoldenScript = "scripts/golden_bias_grpo.py"

// isBias reports whether a tensor is a router's selection bias.
func isBias(name string) bool { return strings.HasSuffix(name, "e_score_correction_bias") }

// checkBiasGolden holds the run in out to the golden g of dir: each step's
// loss and grad_norm (mtpGoldenMetricRtol), its weights (within
// mtpGoldenWeightAtol) and its selection biases bit for bit (each is its
// initial fp32 value plus a sum of ±rate steps in fp32: a count off by one
// token moves it by the rate).
func checkBiasGolden(t *testing.T, dir string, g mtpGolden, out string) {
	t.Helper()
	gold, err := safetensors.Open(filepath.Join(dir, "golden.safetensors"))
	if err != nil {
		t.Fatal(err)
	}
	defer gold.Close()
	ms := metricsNoTimes(t, out)
	if len(ms) != len(g.Steps) {
		t.Fatalf("%d metric lines, want %d", len(ms), len(g.Steps))
	}
	for s, want := range g.Steps {
		m := ms[s]
		if m.EligibleTokens != want.EligibleTokens || m.TrainTokens != want.TrainTokens {
			t.Errorf("step %d: eligible %d, train tokens %d; the golden's %d and %d", s+1, m.EligibleTokens, m.TrainTokens, want.EligibleTokens, want.TrainTokens)
		}
		checkGoldenMetrics(t, s+1, mtpGoldenMetricRtol, []goldenMetric{
			{"loss", float64(m.Loss), want.Loss},
			{"grad_norm", float64(m.GradNorm), want.GradNorm},
			{"lr", float64(m.LR), want.LR},
		})
		// expert_load_max_violation from the golden's counts (PyTorch's
		// routing of every trace).
		vio := math.Inf(-1)
		for _, c := range want.Counts {
			var total, most int64
			for _, n := range c {
				total, most = total+n, max(most, n)
			}
			vio = math.Max(vio, float64(most)*float64(len(c))/float64(total)-1)
		}
		if len(want.Counts) == 0 || m.ExpertLoadMaxViolation == nil || math.Abs(float64(*m.ExpertLoadMaxViolation)-vio) > 1e-9*vio {
			t.Errorf("step %d: expert_load_max_violation %v, the golden's counts give %v", s+1, m.ExpertLoadMaxViolation, vio)
		}
		got := stepTensors(t, out, s+1)[checkpoint.KindWeights]
		worst, where, biases, moved := 0.0, "", 0, 0
		for name, x := range got {
			y := make([]float32, len(x))
			if err := gold.ReadF32(fmt.Sprintf("step%d.%s", s+1, name), y); err != nil {
				t.Fatal(err)
			}
			if isBias(name) {
				biases++
				if !slices.Equal(x, y) {
					t.Errorf("step %d: %s is %v, the golden's %v", s+1, name, x, y)
				}
				continue
			}
			for i := range x {
				if d := math.Abs(float64(x[i]) - float64(y[i])); d > worst || d != d {
					worst, where = d, fmt.Sprintf("%s[%d]: %g vs %g", name, i, x[i], y[i])
				}
			}
		}
		if biases == 0 {
			t.Fatalf("step %d: the checkpoint has no selection biases", s+1)
		}
		init := goldenInitWeights(t, dir)
		for name, x := range got {
			if isBias(name) && !slices.Equal(x, init[name]) {
				moved++
			}
		}
		if moved != biases {
			t.Errorf("step %d: %d of %d selection biases moved", s+1, moved, biases)
		}
		if !(worst <= mtpGoldenWeightAtol) {
			t.Errorf("step %d: weights differ from the golden by %.3g at %s (bound %g)", s+1, worst, where, mtpGoldenWeightAtol)
		}
		t.Logf("step %d: %d selection biases equal to the golden's; largest other weight difference %.3g (bound %g)", s+1, biases, worst, mtpGoldenWeightAtol)
	}
}

// goldenInitWeights reads a golden's model.safetensors.
func goldenInitWeights(t *testing.T, dir string) map[string][]float32 {
	t.Helper()
	f, err := safetensors.Open(filepath.Join(dir, "model.safetensors"))
	if err != nil {
		t.Fatal(err)
	}
	defer f.Close()
	out := map[string][]float32{}
	for _, ti := range f.Tensors() {
		x := make([]float32, ti.NumElements())
		if err := f.ReadF32(ti.Name, x); err != nil {
			t.Fatal(err)
		}
		out[ti.Name] = x
	}
	return out
}

// TestExpertBiasGRPOGolden: two GRPO steps of a tiny Nemotron-H with the
// recipes' aux-loss-free load balancing (moe_router_enable_expert_bias,
// moe_router_bias_update_rate 0.01, load balancing none, freeze_moe_router)
// end with scripts/golden_bias_grpo.py's loss, grad_norm and weights, the
// selection biases bit for bit — Super-shaped with an MTP block, whose
// router's bias moves too, and Nano-shaped with group-limited routing —
// whatever the micro-batches, on 2 ranks and on 2 fully sharded ranks: the
// counts are summed over micro-batches and ranks before the one update. The
// Nano-shaped model packs its traces as token tries (shared_prefix auto),
// and meets the golden as it does with every trace packed alone: a shared
// token counts once per trace that holds it.
func TestExpertBiasGRPOGolden(t *testing.T) {
	for _, v := range []string{"mtp", "nano"} {
		t.Run(v, func(t *testing.T) {
			dir := filepath.Join(biasGoldenDir, v)
			tmp := t.TempDir()
			g, caps, steps := loadGymGolden(t, dir, biasGoldenScript, tmp)
			for _, c := range []struct {
				name  string
				ranks int
				extra []string
			}{
				{"micro-batches of 40 tokens", 1, nil},
				{"one micro-batch", 1, []string{"--set", "policy.train_micro_batch_size=8"}},
				{"two ranks", 2, []string{"--set", "cluster.num_nodes=1", "--set", "cluster.gpus_per_node=2"}},
				{"two sharded ranks", 2, []string{"--shard", "full", "--set", "cluster.num_nodes=1", "--set", "cluster.gpus_per_node=2"}},
				// A Nemotron-H without MTP packs token tries under
				// shared_prefix auto (the default): the same update as
				// every trace packed alone.
				{"traces packed alone", 1, []string{"--set", "policy.shared_prefix=off"}},
				{"tries on two sharded ranks", 2, []string{"--set", "policy.shared_prefix=auto", "--shard", "full", "--set", "cluster.num_nodes=1", "--set", "cluster.gpus_per_node=2"}},
			} {
				t.Run(c.name, func(t *testing.T) {
					out := filepath.Join(tmp, "run-"+strings.ReplaceAll(c.name, " ", "-"))
					args := gymGoldenArgs(dir, g, caps, steps, out, c.extra...)
					if c.ranks == 1 {
						mustTrain(t, args...)
					} else {
						mustRanks(t, c.ranks, args...)
					}
					checkBiasGolden(t, dir, g, out)
					tries := 0
					for _, m := range metricsNoTimes(t, out) {
						if m.ComputedTokens < m.TrainTokens {
							tries++
						}
					}
					if wantTries := v == "nano" && c.name != "traces packed alone"; (tries > 0) != wantTries {
						t.Errorf("%d of 2 steps computed fewer tokens than their traces hold, want tries %v", tries, wantTries)
					}
				})
			}
		})
	}
}

// TestExpertBiasResumeBitExact: a run stopped after step 1 and resumed
// from its checkpoint ends step 2 with the weights, selection biases
// included, and the optimizer state of the uninterrupted run, bit for bit.
func TestExpertBiasResumeBitExact(t *testing.T) {
	dir := filepath.Join(biasGoldenDir, "mtp")
	tmp := t.TempDir()
	g, caps, steps := loadGymGolden(t, dir, biasGoldenScript, tmp)
	whole, split := filepath.Join(tmp, "whole"), filepath.Join(tmp, "split")
	decay := []string{"--set", "policy.megatron_cfg.scheduler.lr_decay_iters=2"} // the schedule of the whole run
	mustTrain(t, gymGoldenArgs(dir, g, caps, steps, whole, decay...)...)
	mustTrain(t, gymGoldenArgs(dir, g, caps, steps, split, append(decay, "--steps", "1")...)...)
	mustTrain(t, gymGoldenArgs(dir, g, caps, steps, split, append(decay, "--resume")...)...)
	a, b := stepTensors(t, whole, 2), stepTensors(t, split, 2)
	n := 0
	for k := range checkpoint.NumKinds {
		for name, x := range a[k] {
			if !slices.Equal(x, b[k][name]) {
				t.Errorf("%v %s differs after the resume", k, name)
			}
			if isBias(name) {
				n++
			}
		}
	}
	if n == 0 {
		t.Fatal("no selection bias in the checkpoints")
	}
	checkBiasGolden(t, dir, g, split)
}

// TestExpertBiasFreezeRouter: under freeze_moe_router the backbone's router
// weights stay as loaded while their biases move (and the MTP block's
// router trains): Megatron's freeze_moe_router clears requires_grad on
// decoder.layers' router weights only. Without an update rate every bias
// stays as loaded.
func TestExpertBiasFreezeRouter(t *testing.T) {
	dir := filepath.Join(biasGoldenDir, "mtp")
	tmp := t.TempDir()
	g, caps, steps := loadGymGolden(t, dir, biasGoldenScript, tmp)
	init := goldenInitWeights(t, dir)
	for _, rate := range []string{"0.01", "0"} {
		out := filepath.Join(tmp, "rate-"+rate)
		mustTrain(t, gymGoldenArgs(dir, g, caps, steps, out, "--steps", "1", "--set", "policy.megatron_cfg.moe_router_bias_update_rate="+rate)...)
		w := weights(t, out, 1)
		var routers, biases int
		for name, x := range w {
			same := slices.Equal(x, init[name])
			switch {
			case isBias(name):
				biases++
				if same != (rate == "0") {
					t.Errorf("rate %s: %s moved %v", rate, name, !same)
				}
			case strings.HasSuffix(name, "mixer.gate.weight"):
				routers++
				if frozen := strings.HasPrefix(name, "backbone."); same != frozen {
					t.Errorf("rate %s: %s unchanged %v, want %v", rate, name, same, frozen)
				}
			}
		}
		if routers != 3 || biases != 3 {
			t.Errorf("%d routers and %d biases, want 3 each (2 backbone, 1 MTP)", routers, biases)
		}
	}
}

// TestExpertBiasKeys: the load-balancing keys of the recipes are used with
// a Nemotron-H model's experts, and everything else is refused by name:
// another load-balancing type or a load-balancing loss coefficient on any
// sparse model, the expert bias or its update rate on Qwen3-MoE (no
// selection bias), and enable_expert_bias false on Nemotron-H (NeMo RL
// never reads it: the bias is always on). A dense model and megatron_cfg
// off decide nothing.
func TestExpertBiasKeys(t *testing.T) {
	recipe := []string{"policy.megatron_cfg.moe_router_load_balancing_type=none", "policy.megatron_cfg.moe_aux_loss_coeff=0"}
	const pre = "policy.megatron_cfg."
	for _, c := range []struct {
		name    string
		experts config.Experts
		sets    []string
		want    string // the refused key, "" for none
	}{
		{"nemotron-h: the recipe's", config.ExpertsBiased, []string{pre + "moe_router_enable_expert_bias=true", pre + "moe_router_bias_update_rate=1e-3"}, ""},
		{"nemotron-h: no keys", config.ExpertsBiased, nil, ""},
		{"nemotron-h: bias off", config.ExpertsBiased, []string{pre + "moe_router_enable_expert_bias=false"}, pre + "moe_router_enable_expert_bias"},
		{"nemotron-h: aux_loss", config.ExpertsBiased, []string{pre + "moe_router_load_balancing_type=seq_aux_loss"}, pre + "moe_router_load_balancing_type"},
		{"nemotron-h: aux coefficient", config.ExpertsBiased, []string{pre + "moe_aux_loss_coeff=1e-4"}, pre + "moe_aux_loss_coeff"},
		{"nemotron-h: a rate of inf", config.ExpertsBiased, []string{pre + "moe_router_bias_update_rate=.inf"}, pre + "moe_router_bias_update_rate"},
		{"nemotron-h: megatron off", config.ExpertsBiased, []string{pre + "enabled=false", pre + "moe_router_enable_expert_bias=false"}, ""},
		{"qwen3-moe: expert bias", config.ExpertsSome, []string{pre + "moe_router_enable_expert_bias=true"}, pre + "moe_router_enable_expert_bias"},
		{"qwen3-moe: a rate", config.ExpertsSome, []string{pre + "moe_router_bias_update_rate=1e-3"}, pre + "moe_router_bias_update_rate"},
		{"qwen3-moe: none and 0", config.ExpertsSome, []string{pre + "moe_router_enable_expert_bias=false", pre + "moe_router_bias_update_rate=0"}, ""},
		{"qwen3-moe: aux_loss", config.ExpertsSome, []string{pre + "moe_router_load_balancing_type=aux_loss"}, pre + "moe_router_load_balancing_type"},
		{"dense", config.ExpertsNone, []string{pre + "moe_router_enable_expert_bias=true", pre + "moe_router_bias_update_rate=1e-3", pre + "moe_router_load_balancing_type=aux_loss"}, ""},
	} {
		t.Run(c.name, func(t *testing.T) {
			ld, _, err := LoadRecipe(nil, append(slices.Clone(recipe), c.sets...))
			if err != nil {
				t.Fatal(err)
			}
			refused, _ := config.SplitRefusals(CheckFor(ld, 0, c.experts))
			var keys []string
			for _, r := range refused {
				if strings.Contains(r.RefusedKey(), "moe_") {
					keys = append(keys, r.RefusedKey())
				}
			}
			if c.want == "" && len(keys) > 0 || c.want != "" && !slices.Equal(keys, []string{c.want}) {
				t.Errorf("refused %v, want %q", keys, c.want)
			}
		})
	}
	// Without the model the Qwen3-MoE refusals are undecided, not made.
	ld, _, err := LoadRecipe(nil, []string{pre + "moe_router_enable_expert_bias=true"})
	if err != nil {
		t.Fatal(err)
	}
	if err := CheckFor(ld, 0, config.ExpertsUnknown); err != nil {
		var r config.Refuser
		if errors.As(err, &r) && strings.Contains(r.RefusedKey(), "expert_bias") {
			t.Errorf("refused without the model: %v", err)
		}
	}
	if u := UndecidedExpertBias(&ld.Config); len(u) != 1 || u[0].Key != pre+"moe_router_enable_expert_bias" {
		t.Errorf("undecided %v, want the expert bias", u)
	}
}

// TestExpertBiasExport: train export of a checkpoint whose biases moved
// writes them in the Hub layout as fp32 tensors equal to the checkpoint's,
// whatever the weights' dtype.
func TestExpertBiasExport(t *testing.T) {
	dir := filepath.Join(biasGoldenDir, "mtp")
	tmp := t.TempDir()
	g, caps, steps := loadGymGolden(t, dir, biasGoldenScript, tmp)
	out := filepath.Join(tmp, "run")
	mustTrain(t, gymGoldenArgs(dir, g, caps, steps, out, "--steps", "1")...)
	hf := filepath.Join(tmp, "hf")
	be := cpu.New(1)
	defer be.Close()
	if err := ExportHF(be, nil, filepath.Join(out, "checkpoints", checkpoint.StepDir(1)), hf, safetensors.BF16); err != nil {
		t.Fatal(err)
	}
	f, err := safetensors.Open(filepath.Join(hf, "model.safetensors"))
	if err != nil {
		t.Fatal(err)
	}
	defer f.Close()
	init := goldenInitWeights(t, dir)
	n := 0
	for name, x := range weights(t, out, 1) {
		if !isBias(name) {
			continue
		}
		n++
		ti, ok := f.Tensor(name)
		if !ok || ti.DType != safetensors.F32 {
			t.Fatalf("the export's %s: %+v (present %v), want F32", name, ti, ok)
		}
		y := make([]float32, len(x))
		if err := f.ReadF32(name, y); err != nil {
			t.Fatal(err)
		}
		if !slices.Equal(x, y) || slices.Equal(y, init[name]) {
			t.Errorf("the export's %s is %v, the checkpoint's %v (loaded %v)", name, y, x, init[name])
		}
	}
	if n != 3 {
		t.Errorf("%d selection biases exported, want 3", n)
	}
}
