package main

import (
	"bytes"
	"os"
	"path/filepath"
	"strings"
	"testing"

	"github.com/google/go-cmp/cmp"
	"github.com/tracegrpo/tracegrpo/config"
)

const (
	cfgMegatron = "../../config/testdata/grpo_math_1B_megatron.yaml"
	cfgOverride = "../../config/testdata/multitrace_override.yaml"
)

func TestConfigCommand(t *testing.T) {
	var out, errOut bytes.Buffer
	code := run([]string{"config", "--config", cfgMegatron, "--config", cfgOverride, "--set", "grpo.num_prompts_per_step=8",
		"--set", "policy.train_global_batch_size=16", "--check"}, &out, &errOut)
	if code != 0 {
		t.Fatalf("exit %d: %s", code, errOut.String())
	}
	s := out.String()
	for _, want := range []string{
		"# file: " + cfgMegatron,
		"#   policy.dtensor_cfg.tensor_parallel_size\n",
		"num_prompts_per_step: 8\n",
		"gym_multi_trace: true\n",
		"delivery: all_traces\n",
		"train_global_batch_size: 16\n",
		"max_new_tokens: 4096\n", // ${policy.max_total_sequence_length} resolved after the override
		"clip_grad: 1\n",         // ${policy.max_grad_norm}
	} {
		if !strings.Contains(s, want) {
			t.Errorf("output lacks %q", want)
		}
	}
	// The printed configuration is itself a loadable recipe with the same values.
	p := filepath.Join(t.TempDir(), "effective.yaml")
	if err := os.WriteFile(p, out.Bytes(), 0o644); err != nil {
		t.Fatal(err)
	}
	a, err := config.Load([]string{cfgMegatron, cfgOverride}, []string{"grpo.num_prompts_per_step=8", "policy.train_global_batch_size=16"})
	if err != nil {
		t.Fatal(err)
	}
	b, err := config.Load([]string{p}, nil)
	if err != nil {
		t.Fatal(err)
	}
	if d := cmp.Diff(a.Config, b.Config); d != "" {
		t.Errorf("reloaded (-want +got)\n%s", d)
	}
}

func TestConfigCommandErrors(t *testing.T) {
	cases := []struct {
		args []string
		code int
		want string
	}{
		{[]string{"config", "--set", "grpo.num_prompt_per_step=4"}, 1, "nearest known key: grpo.num_prompts_per_step"},
		{[]string{"config", "--config", cfgMegatron, "--config", cfgOverride, "--set", "grpo.async_grpo.enabled=true", "--check"}, 1, "grpo.async_grpo.enabled = true"},
		{[]string{"config", "stray"}, 2, "unexpected argument"},
		{[]string{"config", "--bogus"}, 2, "unknown flag"},
	}
	for _, tc := range cases {
		var out, errOut bytes.Buffer
		code := run(tc.args, &out, &errOut)
		if code != tc.code || !strings.Contains(errOut.String(), tc.want) {
			t.Errorf("%v: exit %d, stderr %q; want exit %d and %q", tc.args, code, errOut.String(), tc.code, tc.want)
		}
	}
}

// TestCheckRefusesWhatTrainRefuses: train config --check and train refuse the
// same recipes with the same errors, the multi-trace opt-in included.
func TestCheckRefusesWhatTrainRefuses(t *testing.T) {
	optIn := []string{"++grpo.gym_multi_trace=true", "++env.nemo_gym.token_id_capture.enabled=true",
		"++env.nemo_gym.token_id_capture.all_agents=true", "++env.nemo_gym.token_id_capture.delivery=all_traces",
		"++env.nemo_gym.token_id_capture.builder=per_request"}
	for _, c := range []struct {
		name string
		args []string
		want string
	}{
		{"no opt-in", []string{"--config", todaysRecipe}, "grpo.gym_multi_trace = false"},
		{"LoRA", append([]string{"--config", todaysRecipe, "policy.dtensor_cfg.lora_cfg.enabled=true"}, optIn...), "policy.dtensor_cfg.lora_cfg = {enabled: true"},
		{"FP8", append([]string{"--config", todaysRecipe, "policy.megatron_cfg.fp8_cfg.enabled=true"}, optIn...), "policy.megatron_cfg.fp8_cfg"},
		{"batch", append([]string{"--config", todaysRecipe, "policy.train_global_batch_size=64"}, optIn...), "policy.train_global_batch_size = 64"},
		{"async", append([]string{"--config", todaysRecipe, "grpo.async_grpo.enabled=true"}, optIn...), "grpo.async_grpo.enabled = true"},
	} {
		var cout, cerr bytes.Buffer
		ccode := run(append([]string{"config", "--check"}, c.args...), &cout, &cerr)
		var tout, terr bytes.Buffer
		tcode := run(append([]string{"--backend", "cpu", "--quiet", "--out", t.TempDir(), "--init-from", "../../model/testdata/qwen2_tied"}, c.args...), &tout, &terr)
		refusal := func(s string) string {
			for _, line := range strings.Split(s, "\n") {
				if strings.Contains(line, c.want) {
					return line
				}
			}
			return ""
		}
		cr, tr := refusal(cerr.String()), refusal(terr.String())
		if ccode != 1 || tcode != 1 || cr == "" || cr != tr {
			t.Errorf("%s: train config --check exit %d:\n%s\ntrain exit %d:\n%s\nwant both to refuse with the same %q line", c.name, ccode, cerr.String(), tcode, terr.String(), c.want)
		}
	}
}

// TestConfigKeysListsClasses: train config --keys names each key's class and
// why, and says whether a refused key is neutral here.
func TestConfigKeysListsClasses(t *testing.T) {
	var out, errOut bytes.Buffer
	if code := run([]string{"config", "--config", todaysRecipe, "--keys", "policy.dtensor_cfg.lora_cfg.enabled=true"}, &out, &errOut); code != 0 {
		t.Fatalf("exit %d: %s", code, errOut.String())
	}
	lines := map[string]string{}
	for _, l := range strings.Split(out.String(), "\n") {
		if f := strings.Fields(l); len(f) >= 2 {
			lines[f[1]] = l
		}
	}
	for key, want := range map[string][]string{
		"grpo.num_prompts_per_step":          {"used", "grpo_math_1B.yaml:3"},
		"policy.dtensor_cfg.lora_cfg":        {"refused", "LoRA adapters", "REFUSED by --check and train"},
		"policy.megatron_cfg.fp8_cfg":        {"refused", "FP8", "neutral here"},
		"policy.generation.vllm_cfg":         {"ignored", "generation engine"},
		"policy.megatron_cfg.optimizer.bf16": {"ignored", "policy.precision"},
		"grpo.use_dynamic_sampling":          {"refused", "capability guards"},
	} {
		l, ok := lines[key]
		if !ok {
			t.Errorf("--keys lists no %s", key)
			continue
		}
		for _, w := range want {
			if !strings.Contains(l, w) {
				t.Errorf("--keys line %q lacks %q", l, w)
			}
		}
	}
}
