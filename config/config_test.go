package config

import (
	"fmt"
	"math"
	"os"
	"path/filepath"
	"slices"
	"strings"
	"testing"

	"github.com/google/go-cmp/cmp"

	"github.com/tracegrpo/tracegrpo/internal/nearest"
)

const (
	// NeMo RL main's recipes (copies of testdata/nemo-rl's, at the commit
	// its MANIFEST.tsv records) and October 2025's, which must keep loading.
	recipeBase        = "testdata/grpo_math_1B.yaml"
	recipeMegatron    = "testdata/grpo_math_1B_megatron.yaml"
	recipeOctBase     = "testdata/nemo-rl-2025-10/grpo_math_1B.yaml"
	recipeOctMegatron = "testdata/nemo-rl-2025-10/grpo_math_1B_megatron.yaml"
	overrideMT        = "testdata/multitrace_override.yaml"
)

func mustLoad(t *testing.T, files []string, sets ...string) *Loaded {
	t.Helper()
	l, err := Load(files, sets)
	if err != nil {
		t.Fatalf("Load(%v, %v): %v", files, sets, err)
	}
	return l
}

func writeFile(t *testing.T, dir, name, body string) string {
	t.Helper()
	p := filepath.Join(dir, name)
	if err := os.MkdirAll(filepath.Dir(p), 0o755); err != nil {
		t.Fatal(err)
	}
	if err := os.WriteFile(p, []byte(body), 0o644); err != nil {
		t.Fatal(err)
	}
	return p
}

// TestRecipesLoad loads the two real NeMo RL recipes alone and under the
// multi-trace override block of spec §9, and checks resolved values.
func TestRecipesLoad(t *testing.T) {
	type want struct {
		megatron         bool
		optimizerNil     bool
		ckptDir          string
		multiTrace       bool
		delivery         string
		builder          string
		gbs, mbs, maxLen int
		maxNewTokens     int
		optSource        string
		lr, minLR        float64
		clip             float64
		beta2, eps       float64
		scheduleStyle    string
	}
	cases := []struct {
		name  string
		files []string
		want  want
	}{
		{"base", []string{recipeBase}, want{
			ckptDir: "results/grpo", delivery: "main_chain", builder: "prefix_merging",
			gbs: 512, mbs: 4, maxLen: 512, maxNewTokens: 512,
			optSource: "torch", lr: 5e-6, clip: 1, beta2: 0.999, eps: 1e-8, scheduleStyle: "phases"}},
		{"megatron", []string{recipeMegatron}, want{
			megatron: true, optimizerNil: true, ckptDir: "results/grpo_megatron", delivery: "main_chain", builder: "prefix_merging",
			gbs: 512, mbs: 4, maxLen: 512, maxNewTokens: 512,
			optSource: "megatron", lr: 5e-6, minLR: 5e-7, clip: 1, beta2: 0.999, eps: 1e-8, scheduleStyle: "megatron"}},
		{"base+multitrace", []string{recipeBase, overrideMT}, want{
			megatron: true, ckptDir: "results/grpo", multiTrace: true, delivery: "all_traces", builder: "per_request",
			gbs: 8, mbs: 1, maxLen: 4096, maxNewTokens: 4096,
			optSource: "megatron", lr: 5e-6, minLR: 5e-7, clip: 1, beta2: 0.999, eps: 1e-8, scheduleStyle: "megatron"}},
		{"megatron+multitrace", []string{recipeMegatron, overrideMT}, want{
			megatron: true, optimizerNil: true, ckptDir: "results/grpo_megatron", multiTrace: true, delivery: "all_traces", builder: "per_request",
			gbs: 8, mbs: 1, maxLen: 4096, maxNewTokens: 4096,
			optSource: "megatron", lr: 5e-6, minLR: 5e-7, clip: 1, beta2: 0.999, eps: 1e-8, scheduleStyle: "megatron"}},
		{"October 2025 base", []string{recipeOctBase}, want{
			ckptDir: "results/grpo", delivery: "main_chain", builder: "prefix_merging",
			gbs: 512, mbs: 4, maxLen: 512, maxNewTokens: 512,
			optSource: "torch", lr: 5e-6, clip: 1, beta2: 0.999, eps: 1e-8, scheduleStyle: "phases"}},
		{"October 2025 megatron+multitrace", []string{recipeOctMegatron, overrideMT}, want{
			megatron: true, optimizerNil: true, ckptDir: "results/grpo_megatron", multiTrace: true, delivery: "all_traces", builder: "per_request",
			gbs: 8, mbs: 1, maxLen: 4096, maxNewTokens: 4096,
			optSource: "megatron", lr: 5e-6, minLR: 5e-7, clip: 1, beta2: 0.999, eps: 1e-8, scheduleStyle: "megatron"}},
		{"inherited multitrace recipe", []string{"testdata/multitrace_1B_megatron.yaml"}, want{
			megatron: true, optimizerNil: true, ckptDir: "results/grpo_megatron", multiTrace: true, delivery: "all_traces", builder: "per_request",
			gbs: 8, mbs: 1, maxLen: 4096, maxNewTokens: 4096,
			optSource: "megatron", lr: 5e-6, minLR: 5e-7, clip: 1, beta2: 0.999, eps: 1e-8, scheduleStyle: "megatron"}},
	}
	for _, tc := range cases {
		t.Run(tc.name, func(t *testing.T) {
			l := mustLoad(t, tc.files)
			c := &l.Config
			opt, sch, err := c.Optim()
			if err != nil {
				t.Fatalf("Optim: %v", err)
			}
			got := want{
				megatron: c.Policy.MegatronCfg.Enabled, optimizerNil: c.Policy.Optimizer == nil,
				ckptDir: c.Checkpointing.CheckpointDir, multiTrace: c.GRPO.GymMultiTrace,
				delivery: c.Env.NemoGym.TokenIDCapture.Delivery, builder: c.Env.NemoGym.TokenIDCapture.Builder,
				gbs: c.Policy.TrainGlobalBatchSize, mbs: c.Policy.TrainMicroBatchSize, maxLen: c.Policy.MaxTotalSequenceLength,
				maxNewTokens: c.Policy.Generation.MaxNewTokens,
				optSource:    opt.Source, lr: opt.LR, minLR: opt.MinLR, clip: opt.ClipGrad, beta2: opt.Beta2, eps: opt.Eps,
				scheduleStyle: sch.Style,
			}
			if d := cmp.Diff(tc.want, got, cmp.AllowUnexported(want{})); d != "" {
				t.Errorf("(-want +got)\n%s", d)
			}
			for _, k := range []string{"policy.dtensor_cfg.tensor_parallel_size", "data", "env.math", "logger.wandb", "policy.megatron_cfg.tensor_model_parallel_size"} {
				if !slices.Contains(l.Ignored, k) {
					t.Errorf("Ignored lacks %s: %v", k, l.Ignored)
				}
			}
		})
	}
}

// TestDefaultsMatchLoad: Default() is what loading no file gives.
func TestDefaultsMatchLoad(t *testing.T) {
	l := mustLoad(t, nil)
	if d := cmp.Diff(Default(), l.Config); d != "" {
		t.Errorf("(-Default +Load)\n%s", d)
	}
	if len(l.Ignored) != 0 {
		t.Errorf("Ignored = %v, want none", l.Ignored)
	}
}

// TestRoundTrip: the printed effective config loads back to the same Config.
func TestRoundTrip(t *testing.T) {
	for _, files := range [][]string{nil, {recipeBase}, {recipeMegatron}, {recipeMegatron, overrideMT}} {
		l := mustLoad(t, files, "loss_fn.ratio_clip_c=3", "grpo.advantage_clip_low=-2.5")
		b, err := l.YAML()
		if err != nil {
			t.Fatal(err)
		}
		p := writeFile(t, t.TempDir(), "effective.yaml", string(b))
		l2 := mustLoad(t, []string{p})
		if d := cmp.Diff(l.Config, l2.Config); d != "" {
			t.Errorf("%v: (-loaded +reloaded)\n%s", files, d)
		}
	}
}

func TestSetOverrides(t *testing.T) {
	l := mustLoad(t, []string{recipeMegatron},
		"grpo.num_prompts_per_step=4",
		"policy.max_total_sequence_length=1024", // moves ${policy.max_total_sequence_length} users
		"policy.model_name=123",                 // a string field keeps digits as a string
		"loss_fn.truncated_importance_sampling_type=null",
		"loss_fn.ratio_clip_c=3",
		"policy.optimizer={name: torch.optim.AdamW, kwargs: {lr: 1e-5, betas: [0.8, 0.9], eps: 1e-6}}",
		"policy.scheduler.0.kwargs.total_iters=7",
		"policy.dtensor_cfg.enabled=true", // ignored: DTensor is the path whenever Megatron is off
		"grpo.normalize_rewards=false",    // estimator follows the legacy key when the recipe has no adv_estimator
		"grpo.gym_multi_trace=on",         // YAML 1.1, as in a file: on is true
	)
	c := l.Config
	checks := []struct {
		name      string
		got, want any
	}{
		{"num_prompts", c.GRPO.NumPromptsPerStep, 4},
		{"max_len", c.Policy.MaxTotalSequenceLength, 1024},
		{"max_new_tokens follows", c.Policy.Generation.MaxNewTokens, 1024},
		{"model_name", c.Policy.ModelName, OptionalString("123")},
		{"tis type", c.LossFn.TruncatedImportanceSamplingType == nil, true},
		{"ratio_clip_c", *c.LossFn.RatioClipC, 3.0},
		{"adamw betas", c.Policy.Optimizer.Kwargs.Betas, []float64{0.8, 0.9}},
		{"adamw lr", c.Policy.Optimizer.Kwargs.LR, 1e-5},
		{"linear total_iters", *c.Policy.Scheduler[0].Kwargs.TotalIters, int64(7)},
		{"estimator normalize follows", c.GRPO.AdvEstimator.NormalizeRewards, false},
		{"on is true", c.GRPO.GymMultiTrace, true},
	}
	for _, ck := range checks {
		if d := cmp.Diff(ck.want, ck.got); d != "" {
			t.Errorf("%s: (-want +got)\n%s", ck.name, d)
		}
	}
}

// TestErrors: every error names where, the key path, and what was expected.
func TestErrors(t *testing.T) {
	dir := t.TempDir()
	typo := writeFile(t, dir, "typo.yaml", "defaults: grpo_math_1B.yaml\ngrpo:\n  num_prompt_per_step: 4\n")
	writeFile(t, dir, "grpo_math_1B.yaml", mustRead(t, recipeBase))
	badType := writeFile(t, dir, "badtype.yaml", "grpo:\n  num_prompts_per_step: four\n")
	cycA := writeFile(t, dir, "a.yaml", "defaults: b.yaml\n")
	writeFile(t, dir, "b.yaml", "defaults: a.yaml\n")
	missingRef := writeFile(t, dir, "ref.yaml", "policy:\n  model_name: ${policy.no_such_key}\n")
	cycRef := writeFile(t, dir, "cyc.yaml", "policy:\n  model_name: ${policy.precision}\n  precision: ${policy.model_name}\n")
	resolverBad := writeFile(t, dir, "res.yaml", "policy:\n  train_micro_batch_size: ${nosuch:4,2}\n")
	mulBad := writeFile(t, dir, "mul.yaml", "policy:\n  train_micro_batch_size: ${mul:4,${policy.model_name}}\n")
	scalarEnv := writeFile(t, dir, "env.yaml", "env:\n  should_mask_flaged_samples: false\n")
	twoDocs := writeFile(t, dir, "two.yaml", "grpo: {}\n---\ngrpo: {}\n")
	listTop := writeFile(t, dir, "list.yaml", "- a\n- b\n")
	dup := writeFile(t, dir, "dup.yaml", "grpo:\n  seed: 1\n  seed: 2\n")
	cases := []struct {
		name  string
		files []string
		sets  []string
		want  []string // substrings of the error
	}{
		{"unknown key in file", []string{typo}, nil, []string{"typo.yaml:3", "unknown key grpo.num_prompt_per_step", "nearest known key: grpo.num_prompts_per_step"}},
		{"unknown key in --set", nil, []string{"loss_fn.ratio_clip_mx=0.3"}, []string{"unknown key loss_fn.ratio_clip_mx", "nearest known key: loss_fn.ratio_clip_max"}},
		{"unknown top-level key", nil, []string{"polcy.model_name=x"}, []string{"unknown key polcy.model_name", "nearest known key: policy.model_name"}},
		{"bad type in file", []string{badType}, nil, []string{"badtype.yaml:2", "grpo.num_prompts_per_step", "want an integer", `"four"`}},
		{"bad int in --set", nil, []string{"grpo.num_prompts_per_step=1.5"}, []string{"grpo.num_prompts_per_step", "want an integer", `"1.5"`}},
		{"bad bool in --set", nil, []string{"grpo.gym_multi_trace=maybe"}, []string{"grpo.gym_multi_trace", "want a boolean"}},
		{"bad --set syntax", nil, []string{"grpo.seed"}, []string{"want key.path=value"}},
		{"defaults cycle", []string{cycA}, nil, []string{"defaults cycle"}},
		{"missing defaults file", []string{writeFile(t, dir, "m.yaml", "defaults: nope.yaml\n")}, nil, []string{"nope.yaml"}},
		{"missing reference", []string{missingRef}, nil, []string{"ref.yaml:2", "policy.model_name", "${policy.no_such_key}", "no such key"}},
		{"reference cycle", []string{cycRef}, nil, []string{"interpolation cycle"}},
		{"unknown resolver", []string{resolverBad}, nil, []string{"res.yaml:2", `unknown resolver "nosuch"`, "tracegrpo has: add, mul, div, max"}},
		{"mul of a string repeats it (Python's *), then the type is wrong", []string{mulBad}, nil, []string{"mul.yaml:2", "want an integer"}},
		{"scalar under env is not an environment block", []string{scalarEnv}, nil, []string{"unknown key env.should_mask_flaged_samples", "nearest known key: env.should_mask_flagged_samples"}},
		{"two documents", []string{twoDocs}, nil, []string{"second"}},
		{"list at top level", []string{listTop}, nil, []string{"want a mapping at the top level"}},
		{"duplicate key", []string{dup}, nil, []string{`duplicate key "seed"`}},
		{"list index out of range", nil, []string{"policy.scheduler.9.name=x"}, []string{"no list element"}},
	}
	for _, tc := range cases {
		t.Run(tc.name, func(t *testing.T) {
			_, err := Load(tc.files, tc.sets)
			if err == nil {
				t.Fatal("Load succeeded, want an error")
			}
			for _, w := range tc.want {
				if !strings.Contains(err.Error(), w) {
					t.Errorf("error %q lacks %q", err, w)
				}
			}
		})
	}
}

func mustRead(t *testing.T, p string) string {
	t.Helper()
	b, err := os.ReadFile(p)
	if err != nil {
		t.Fatal(err)
	}
	return string(b)
}

// TestInheritance: defaults lists, relative paths from a subdirectory, deep
// merge, null replacing a block, list replacement, embedded interpolation.
func TestInheritance(t *testing.T) {
	dir := t.TempDir()
	writeFile(t, dir, "base/parent.yaml", `
grpo: {num_prompts_per_step: 3, num_generations_per_prompt: 5, seed: 7}
policy:
  model_name: base-model
  optimizer: {name: torch.optim.AdamW, kwargs: {lr: 1.0e-4, weight_decay: 0.1, betas: [0.9, 0.95], eps: 1.0e-8}}
  scheduler: [{name: torch.optim.lr_scheduler.ConstantLR, kwargs: {factor: 0.5, total_iters: 4}}]
checkpointing: {checkpoint_dir: "results/${policy.model_name}-${grpo.seed}"}
`)
	writeFile(t, dir, "base/other.yaml", "grpo: {seed: 9}\n")
	child := writeFile(t, dir, "recipes/child.yaml", `
defaults: [../base/parent.yaml, ../base/other.yaml]
grpo: {num_generations_per_prompt: 2}
policy:
  train_global_batch_size: ${mul:${grpo.num_prompts_per_step}, ${grpo.num_generations_per_prompt}}
`)
	l := mustLoad(t, []string{child})
	c := l.Config
	checks := []struct {
		name      string
		got, want any
	}{
		{"parent key kept", c.GRPO.NumPromptsPerStep, 3},
		{"child overrides", c.GRPO.NumGenerationsPerPrompt, 2},
		{"second parent overrides first", c.GRPO.Seed, int64(9)},
		{"mul over merged values", c.Policy.TrainGlobalBatchSize, 6},
		{"embedded interpolation", c.Checkpointing.CheckpointDir, "results/base-model-9"},
		{"list replaced", len(c.Policy.Scheduler), 1},
		{"files in order", len(l.Files), 3},
	}
	for _, ck := range checks {
		if d := cmp.Diff(ck.want, ck.got); d != "" {
			t.Errorf("%s: (-want +got)\n%s", ck.name, d)
		}
	}
	_, sch, err := c.Optim()
	if err != nil {
		t.Fatal(err)
	}
	if got := sch.LR(0); got != 0.5e-4 {
		t.Errorf("LR(0) = %g, want 5e-5", got)
	}
	if got := sch.LR(4); got != 1e-4 {
		t.Errorf("LR(4) = %g, want 1e-4", got)
	}
	// null removes the parent's optimizer block.
	l = mustLoad(t, []string{child}, "policy.optimizer=null")
	if l.Config.Policy.Optimizer != nil {
		t.Errorf("policy.optimizer = %+v, want nil", l.Config.Policy.Optimizer)
	}
	if _, _, err := l.Config.Optim(); err == nil || !strings.Contains(err.Error(), "no optimizer") {
		t.Errorf("Optim with no optimizer: err = %v", err)
	}
}

// tolLR is the tolerance of schedule values computed by two formulas.
const tolLR = 1e-18

func TestSchedules(t *testing.T) {
	meg := mustLoad(t, []string{recipeMegatron}).Config
	_, sMeg, err := meg.Optim()
	if err != nil {
		t.Fatal(err)
	}
	base := mustLoad(t, []string{recipeBase}).Config
	_, sTorch, err := base.Optim()
	if err != nil {
		t.Fatal(err)
	}
	lin := mustLoad(t, []string{recipeMegatron}, "policy.megatron_cfg.scheduler.lr_decay_style=linear", "policy.megatron_cfg.scheduler.lr_decay_iters=113").Config
	_, sLin, err := lin.Optim()
	if err != nil {
		t.Fatal(err)
	}
	cos := mustLoad(t, []string{recipeMegatron}, "policy.megatron_cfg.scheduler.lr_decay_style=cosine", "policy.megatron_cfg.scheduler.lr_decay_iters=113").Config
	_, sCos, err := cos.Optim()
	if err != nil {
		t.Fatal(err)
	}
	const peak, floor, init = 5e-6, 5e-7, 5e-7
	cases := []struct {
		name string
		s    *Schedule
		k    int64
		want float64
	}{
		{"megatron warmup start", &sMeg, 0, init},
		{"megatron warmup middle", &sMeg, 6, init + (peak-init)*6/13},
		{"megatron warmup end", &sMeg, 13, peak},
		{"megatron constant after warmup", &sMeg, 5000, peak},
		{"linear decay middle", &sLin, 63, floor + 0.5*(peak-floor)},
		{"linear decay end", &sLin, 113, floor},
		{"linear past end", &sLin, 500, floor},
		{"cosine middle", &sCos, 63, floor + 0.5*(math.Cos(math.Pi*0.5)+1)*(peak-floor)},
		{"torch linear start", &sTorch, 0, peak * 0.1},
		{"torch linear middle", &sTorch, 25, peak * (0.1 + 0.9*25/50)},
		{"torch milestone", &sTorch, 50, peak},
		{"torch constant", &sTorch, 100000, peak},
	}
	for _, tc := range cases {
		if got := tc.s.LR(tc.k); math.Abs(got-tc.want) > tolLR {
			t.Errorf("%s: LR(%d) = %.17g, want %.17g", tc.name, tc.k, got, tc.want)
		}
	}
	if got := sMeg.WeightDecay(10); got != 0.01 {
		t.Errorf("WeightDecay = %g, want 0.01", got)
	}
	bad := []struct {
		sets []string
		want string
	}{
		{[]string{"policy.megatron_cfg.scheduler.lr_decay_style=WSD"}, "lr_decay_style"},
		{[]string{"policy.megatron_cfg.optimizer.optimizer=sgd"}, "policy.megatron_cfg.optimizer.optimizer = sgd: tracegrpo implements adam"},
		{[]string{"policy.megatron_cfg.scheduler.end_weight_decay=0.1"}, "start_weight_decay == end_weight_decay"},
		{[]string{"policy.megatron_cfg.optimizer.adam_beta2=1.5"}, "beta2"},
	}
	for _, b := range bad {
		c := mustLoad(t, []string{recipeMegatron}, b.sets...).Config
		if _, _, err := c.Optim(); err == nil || !strings.Contains(err.Error(), b.want) {
			t.Errorf("%v: err = %v, want it to contain %q", b.sets, err, b.want)
		}
	}
	badTorch := []struct {
		sets []string
		want string
	}{
		{[]string{"policy.scheduler.2.milestones=[]"}, "milestones"},
		{[]string{"policy.scheduler.0.name=torch.optim.lr_scheduler.CosineAnnealingLR"}, "CosineAnnealingLR"},
		{[]string{"policy.optimizer.name=torch.optim.SGD"}, "torch.optim.SGD"},
	}
	for _, b := range badTorch {
		c := mustLoad(t, []string{recipeBase}, b.sets...).Config
		if _, _, err := c.Optim(); err == nil || !strings.Contains(err.Error(), b.want) {
			t.Errorf("%v: err = %v, want it to contain %q", b.sets, err, b.want)
		}
	}
}

func TestSuggest(t *testing.T) {
	cases := map[string]string{
		"grpo.num_prompt_per_step":                  "grpo.num_prompts_per_step",
		"loss_fn.reference_policy_kl_penalt":        "loss_fn.reference_policy_kl_penalty",
		"env.nemo_gym.token_id_capture.delivry":     "env.nemo_gym.token_id_capture.delivery",
		"policy.scheduler.0.kwarg":                  "policy.scheduler.0.kwargs",
		"policy.megatron_cfg.optimizer.adam_beta_1": "policy.megatron_cfg.optimizer.adam_beta1",
	}
	for in, want := range cases {
		if got := suggest(in); !strings.Contains(got, want+")") {
			t.Errorf("suggest(%q) = %q, want %q", in, got, want)
		}
	}
}

// FuzzLoad: any YAML input either loads or fails with an error; never panics,
// and a loaded config round-trips through Marshal.
func FuzzLoad(f *testing.F) {
	for _, p := range []string{recipeBase, recipeMegatron, overrideMT} {
		b, err := os.ReadFile(p)
		if err != nil {
			f.Fatal(err)
		}
		f.Add(b)
	}
	f.Add([]byte("policy: {model_name: ${mul:${a},2}}"))
	f.Add([]byte("a: &x {b: 1}\nc: *x\n"))
	f.Fuzz(func(t *testing.T, data []byte) {
		dir := t.TempDir()
		p := filepath.Join(dir, "f.yaml")
		if err := os.WriteFile(p, data, 0o644); err != nil {
			t.Fatal(err)
		}
		l, err := Load([]string{p}, nil)
		if err != nil {
			return
		}
		b, err := l.YAML()
		if err != nil {
			t.Fatalf("YAML: %v", err)
		}
		q := filepath.Join(dir, "g.yaml")
		if err := os.WriteFile(q, b, 0o644); err != nil {
			t.Fatal(err)
		}
		l2, err := Load([]string{q}, nil)
		if err != nil {
			t.Fatalf("reload of printed config: %v\n%s", err, b)
		}
		if d := cmp.Diff(l.Config, l2.Config); d != "" {
			t.Fatalf("round trip (-first +second)\n%s", d)
		}
	})
}

// FuzzSet: any --set string either applies or fails with an error; never
// panics, and an accepted override round-trips through the printed YAML.
func FuzzSet(f *testing.F) {
	for _, s := range []string{"grpo.num_prompts_per_step=4", "policy.optimizer=null", "policy.scheduler.0.kwargs.total_iters=7",
		"loss_fn={ratio_clip_c: 3}", "policy.model_name=${policy.precision}", "data.x.y=1", "env.math={a: 1}", "a=b=c", "=1",
		"policy=&000", // a null policy: its scheduler list came back as [] instead of nil
	} {
		f.Add(s)
	}
	f.Fuzz(func(t *testing.T, s string) {
		l, err := Load(nil, []string{s})
		if err != nil {
			return
		}
		b, err := Marshal(&l.Config)
		if err != nil {
			t.Fatalf("Marshal: %v", err)
		}
		p := filepath.Join(t.TempDir(), "g.yaml")
		if err := os.WriteFile(p, b, 0o644); err != nil {
			t.Fatal(err)
		}
		l2, err := Load([]string{p}, nil)
		if err != nil {
			t.Fatalf("reload after --set %q: %v\n%s", s, err, b)
		}
		if d := cmp.Diff(l.Config, l2.Config); d != "" {
			t.Fatalf("--set %q round trip (-first +second)\n%s", s, d)
		}
	})
}

// TestManyUnknownKeysFailFast: a recipe with 64k unknown keys (typos of
// real keys, so that each could get a suggestion) is refused with the first
// maxErrors keys named, each with its suggestion, and the rest counted; and
// the work is bounded: at most maxSuggestions nearest-key searches (64k of
// them took 42 s and made a 7 MB message), and mapping lookups linear in
// the keys (a scan per key made merging a 64k-key recipe take 10 s). The
// work is counted, not timed.
func TestManyUnknownKeysFailFast(t *testing.T) {
	var b strings.Builder
	b.WriteString("grpo:\n  num_prompts_per_step: 4\n")
	const n = 64000
	for i := 0; i < n; i++ {
		fmt.Fprintf(&b, "polic%d: value_%d\n", i, i)
	}
	path := filepath.Join(t.TempDir(), "big.yaml")
	if err := os.WriteFile(path, []byte(b.String()), 0o644); err != nil {
		t.Fatal(err)
	}
	// The cost of the searches the message needs: the bound's unit.
	c0 := nearest.Cells.Load()
	for i := 0; i < maxSuggestions; i++ {
		Nearest(fmt.Sprintf("polic%d", i))
	}
	need := nearest.Cells.Load() - c0
	cells, probes := nearest.Cells.Load(), work.keyProbes.Load()
	_, err := Load([]string{path}, nil)
	cells, probes = nearest.Cells.Load()-cells, work.keyProbes.Load()-probes
	if err == nil {
		t.Fatal("a recipe of unknown keys loaded")
	}
	msg := err.Error()
	for _, w := range []string{"big.yaml:3: unknown key polic0 (nearest known key: policy)", "unknown key polic19 ",
		fmt.Sprintf("and %d more errors", n-maxErrors)} {
		if !strings.Contains(msg, w) {
			t.Errorf("error lacks %q", w)
		}
	}
	if strings.Contains(msg, "polic20 ") || len(msg) > 10000 {
		t.Errorf("error reports more than the first %d keys (%d bytes)", maxErrors, len(msg))
	}
	t.Logf("the %d suggestions shown: %d cells; the load: %d cells, %d mapping key comparisons for %d keys", maxSuggestions, need, cells, probes, n)
	if cells > 2*need {
		t.Errorf("the load computed %d edit-distance cells, more than twice the %d its %d suggestions need", cells, need, maxSuggestions)
	}
	if probes > 50*n {
		t.Errorf("the load compared %d mapping keys for %d keys (a scan per key?)", probes, n)
	}
}

// TestActivationCheckpointingAndPrecision: activation checkpointing comes
// from the training block the recipe enables; policy.precision is float32
// or bfloat16, anything else refused by name.
func TestActivationCheckpointingAndPrecision(t *testing.T) {
	for _, c := range []struct {
		sets []string
		on   bool
		key  string
	}{
		{[]string{"policy.megatron_cfg.enabled=true", "policy.megatron_cfg.activation_checkpointing=true"}, true, "policy.megatron_cfg.activation_checkpointing"},
		{[]string{"policy.megatron_cfg.enabled=true", "policy.dtensor_cfg.activation_checkpointing=true"}, false, "policy.megatron_cfg.activation_checkpointing"},
		{[]string{"policy.megatron_cfg.enabled=false", "policy.dtensor_cfg.enabled=true", "policy.dtensor_cfg.activation_checkpointing=true"}, true, "policy.dtensor_cfg.activation_checkpointing"},
	} {
		l := mustLoad(t, []string{"testdata/grpo_math_1B_megatron.yaml"}, c.sets...)
		if on, key := l.Config.ActivationCheckpointing(); on != c.on || key != c.key {
			t.Errorf("%v: %v from %s, want %v from %s", c.sets, on, key, c.on, c.key)
		}
	}
	for p, want := range map[string]string{"float32": PrecisionFloat32, "bfloat16": PrecisionBFloat16, "bf16": PrecisionBFloat16, "fp16": ""} {
		l := mustLoad(t, []string{"testdata/grpo_math_1B_megatron.yaml"}, "policy.precision="+p)
		got, err := l.Config.TrainingPrecision()
		if got != want || (want == "") != (err != nil) {
			t.Errorf("policy.precision=%s: %q, %v; want %q", p, got, err, want)
		} else if err != nil && !strings.Contains(err.Error(), "policy.precision") {
			t.Errorf("the error does not name the key: %v", err)
		}
	}
}

// TestSharedPrefixKey: policy.shared_prefix, tracegrpo's own key, is auto
// unless a recipe or --set says off; any other value is refused by name.
func TestSharedPrefixKey(t *testing.T) {
	for _, c := range []struct {
		sets []string
		on   bool
		bad  bool
	}{
		{nil, true, false},
		{[]string{"policy.shared_prefix=off"}, false, false},
		{[]string{"policy.shared_prefix=auto"}, true, false},
		{[]string{"policy.shared_prefix=on"}, false, true},
	} {
		l := mustLoad(t, []string{"testdata/grpo_math_1B_megatron.yaml"}, c.sets...)
		on, err := l.Config.SharedPrefixOn()
		switch {
		case c.bad && (err == nil || !strings.Contains(err.Error(), "policy.shared_prefix")):
			t.Errorf("%v: %v, want an error naming policy.shared_prefix", c.sets, err)
		case !c.bad && (err != nil || on != c.on):
			t.Errorf("%v: %v, %v; want %v", c.sets, on, err, c.on)
		}
	}
}
