package main

import (
	"bytes"
	"strings"
	"testing"
)

// TestTyposAreLoud: the typo cases of issue 32, each with the message that
// names the key meant, and the exit status.
func TestTyposAreLoud(t *testing.T) {
	for _, c := range []struct {
		name string
		args []string
		code int
		want []string // in this order
	}{
		{"plain override", []string{"config", "--config", todaysRecipe, "grpo.num_prompt_per_step=2"}, 1,
			[]string{"did you mean grpo.num_prompts_per_step?", "a new key is added with +grpo.num_prompt_per_step=2"}},
		{"checkpointing", []string{"config", "--config", todaysRecipe, "++checkpointing.save_perod=1"}, 0,
			[]string{"warning: override ++checkpointing.save_perod=1: checkpointing.save_perod: unknown key, did you mean checkpointing.save_period?"}},
		{"logger", []string{"config", "--config", todaysRecipe, "++logger.tensorbaord_enabled=true"}, 0,
			[]string{"logger.tensorbaord_enabled: unknown key, did you mean logger.tensorboard_enabled?"}},
		{"cluster", []string{"config", "--config", todaysRecipe, "++cluster.gpus_per_nod=8"}, 0,
			[]string{"cluster.gpus_per_nod: unknown key, did you mean cluster.gpus_per_node?"}},
		{"data", []string{"config", "--config", todaysRecipe, "++data.max_input_seq_lenght=8"}, 0,
			[]string{"data.max_input_seq_lenght: unknown key, did you mean data.max_input_seq_length?"}},
		{"command", []string{"tracse"}, 2, []string{`unknown command "tracse"; did you mean "traces"?`}},
		{"command far from any", []string{"frobnicate"}, 2, []string{`unknown command "frobnicate" (the commands: bench, config`}},
		{"flag", []string{"--stpes", "3"}, 2, []string{"train: usage: train: unknown flag: --stpes; did you mean --steps? (see train --help)"}},
		{"subcommand's flag", []string{"config", "--chek"}, 2, []string{"unknown flag: --chek; did you mean --check? (see train config --help)"}},
		{"flag far from any", []string{"plan", "--zzzzzzzz"}, 2, []string{"unknown flag: --zzzzzzzz (see train plan --help)"}},
		{"override typo of a list element", []string{"config", "--config", todaysRecipe, "policy.scheduler.0.kwargs.total_iter=7"}, 1,
			[]string{"did you mean policy.scheduler.0.kwargs.total_iters?"}},
		{"unknown key in a known section", []string{"config", "--config", todaysRecipe, "++checkpointing.x=1"}, 0,
			[]string{"checkpointing.x: unknown key (accepted and not used"}},
	} {
		t.Run(c.name, func(t *testing.T) {
			var out, errOut bytes.Buffer
			code := run(c.args, &out, &errOut)
			msg := errOut.String()
			if code != c.code {
				t.Errorf("%v: exit %d, want %d\n%s", c.args, code, c.code, msg)
			}
			at := 0
			for _, w := range c.want {
				i := strings.Index(msg[at:], w)
				if i < 0 {
					t.Errorf("%v: stderr lacks %q (in order):\n%s", c.args, w, msg)
					break
				}
				at += i + len(w)
			}
		})
	}
}

// TestCheckDecidesMoEKeysByTheModel: the router's keys of a Qwen3-1.7B
// recipe (NeMo Gym's super_swe1) are refused only when the model has
// experts without a selection bias: accepted with a dense --init-from and
// with a Nemotron-H one (whose selection biases they update), refused with
// a Qwen3-MoE one, and named as undecided without a model.
func TestCheckDecidesMoEKeysByTheModel(t *testing.T) {
	recipe := "../../config/testdata/nemo-rl/examples/configs/recipes/llm/grpo-qwen3-1.7b-1n8g-megatron-super-swe1.yaml"
	base := []string{"config", "--check", "--config", recipe, "--config", "../../config/testdata/multitrace_override.yaml",
		"++grpo.overlong_filtering=false", "++policy.megatron_cfg.mtp_num_layers=0", "++policy.megatron_cfg.mtp_loss_scaling_factor=0"}
	moeKeys := []string{"policy.megatron_cfg.moe_router_bias_update_rate", "policy.megatron_cfg.moe_router_enable_expert_bias"}
	for _, c := range []struct {
		name, initFrom string
		code           int
		want           string
	}{
		{"no model", "", 0, "could not decide 2 key(s) that configure a model's experts without the model"},
		{"dense", "../../model/testdata/qwen3_tied", 0, ""},
		{"sparse", "../../model/testdata/moe_k2_norm", 1, "this model's routers have none"},
		// Nemotron-H's routers have a selection bias: the keys are used.
		{"selection bias", "../../model/testdata/nh_groups", 0, ""},
	} {
		t.Run(c.name, func(t *testing.T) {
			args := base
			if c.initFrom != "" {
				args = append(append([]string{}, base...), "--init-from", c.initFrom)
			}
			var out, errOut bytes.Buffer
			code := run(args, &out, &errOut)
			msg := errOut.String()
			if code != c.code || !strings.Contains(msg, c.want) {
				t.Fatalf("exit %d, want %d and %q:\n%s", code, c.code, c.want, msg)
			}
			for _, k := range moeKeys {
				if named := strings.Contains(msg, k); named != (c.name == "no model" || c.name == "sparse") {
					t.Errorf("%s named: %v\n%s", k, named, msg)
				}
			}
		})
	}
}

// TestCheckAppliesTheModelsOverrides: train config --check builds the
// model train would (config.json with policy.hf_config_overrides) and runs
// the checks train runs of it: a vocabulary too small for the built-in
// job's token ids fails at the check, naming the key, as train fails
// before its first step.
func TestCheckAppliesTheModelsOverrides(t *testing.T) {
	var out, errOut bytes.Buffer
	if code := run([]string{"config", "--check", "++policy.hf_config_overrides.vocab_size=7"}, &out, &errOut); code != 1 ||
		!strings.Contains(errOut.String(), "policy.hf_config_overrides.vocab_size = 7: the model's vocabulary has 7 ids") {
		t.Errorf("config --check: exit %d\n%s", code, errOut.String())
	}
	out.Reset()
	errOut.Reset()
	if code := run([]string{"--out", t.TempDir(), "--steps", "1", "++policy.hf_config_overrides.vocab_size=7"}, &out, &errOut); code != 1 ||
		!strings.Contains(errOut.String(), "policy.hf_config_overrides.vocab_size = 7") || strings.Contains(errOut.String(), "step 1") {
		t.Errorf("train: exit %d (want the refusal before step 1)\n%s", code, errOut.String())
	}
}
