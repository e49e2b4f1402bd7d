package trainer

import (
	"errors"
	"slices"
	"strings"
	"testing"

	"github.com/tracegrpo/tracegrpo/config"
)

// todaysRecipe is NeMo RL main's grpo_math_1B.yaml.
const todaysRecipe = "../config/testdata/nemo-rl/examples/configs/grpo_math_1B.yaml"

// refusedKeys runs Check on today's grpo_math_1B.yaml with the multi-trace
// opt-in and the given overrides, and returns the refused keys (failing on
// any other error).
func refusedKeys(t *testing.T, overrides ...string) []string {
	t.Helper()
	return refusedKeysFor(t, config.ExpertsUnknown, overrides...)
}

// refusedKeysFor is refusedKeys for a model with or without experts.
func refusedKeysFor(t *testing.T, experts config.Experts, overrides ...string) []string {
	t.Helper()
	ld, err := config.LoadSources(config.Sources{Files: []string{todaysRecipe}, Overrides: append(append([]string{}, multiTraceOptIn...), overrides...)})
	if err != nil {
		t.Fatalf("%v: %v", overrides, err)
	}
	refused, other := config.SplitRefusals(CheckFor(ld, 0, experts))
	if len(other) > 0 {
		t.Fatalf("%v: errors that name no refused key: %v", overrides, other)
	}
	var keys []string
	for _, r := range refused {
		keys = append(keys, r.RefusedKey())
	}
	return keys
}

// TestCheckRefusesEveryRefusedKey: every Refused key of the key table, set
// to its example value on today's grpo_math_1B.yaml with the opt-in (which
// Check accepts), is refused by Check naming that key; so is each
// math-changing key issue 22 lists.
func TestCheckRefusesEveryRefusedKey(t *testing.T) {
	if keys := refusedKeys(t); len(keys) != 0 {
		t.Fatalf("today's grpo_math_1B.yaml with the opt-in is refused for %v", keys)
	}
	n := 0
	for _, r := range config.Rules() {
		if r.Class != config.Refused {
			continue
		}
		n++
		key := r.Key
		if strings.HasPrefix(key, "policy.scheduler.") {
			key = "policy.scheduler.0." + strings.TrimPrefix(key, "policy.scheduler.")
		}
		over := []string{"++" + key + "=" + r.Example}
		if key == "policy.scheduler.0.kwargs" {
			over = []string{"++policy.scheduler.0.kwargs.eta_min=" + r.Example}
		}
		if r.Also != "" {
			over = append(over, "++"+r.Also)
		}
		t.Run(r.Key, func(t *testing.T) {
			experts := config.ExpertsUnknown
			if r.MoEOnly {
				// A key that configures experts changes nothing on a dense
				// model: refused for a sparse one only.
				experts = config.ExpertsSome
				for _, e := range []config.Experts{config.ExpertsNone, config.ExpertsUnknown} {
					if keys := refusedKeysFor(t, e, over...); len(keys) != 0 {
						t.Errorf("%v on a model with experts %v: refused for %v", over, e, keys)
					}
				}
			}
			keys := refusedKeysFor(t, experts, over...)
			for _, k := range keys {
				if k == key || strings.HasPrefix(k, key+".") {
					return
				}
			}
			t.Errorf("%v: refused for %v, not for %s", over, keys, key)
		})
	}
	// Issue 22's list of keys that change the math, each refused by name.
	for _, c := range []struct {
		what string
		over []string
		key  string
	}{
		{"LoRA (DTensor)", []string{"policy.dtensor_cfg.lora_cfg.enabled=true"}, "policy.dtensor_cfg.lora_cfg"},
		{"LoRA (Megatron PEFT)", []string{"policy.megatron_cfg.peft.enabled=true"}, "policy.megatron_cfg.peft"},
		{"FP8", []string{"policy.megatron_cfg.fp8_cfg.enabled=true"}, "policy.megatron_cfg.fp8_cfg"},
		{"quantization", []string{"++policy.quant_cfg=NVFP4_DEFAULT_CFG"}, "policy.quant_cfg"},
		{"draft model", []string{"policy.draft.enabled=true"}, "policy.draft"},
		{"on-policy distillation", []string{"on_policy_distillation={enabled: true}"}, "on_policy_distillation"},
		{"reward penalties", []string{"reward_penalties.penalize_empty_final_answer=true"}, "reward_penalties.penalize_empty_final_answer"},
		{"minus_baseline", []string{"grpo.adv_estimator.name=reinforce_plus_plus", "grpo.adv_estimator.minus_baseline=true"}, "grpo.adv_estimator.minus_baseline"},
		{"optimizer state dtype", []string{"++policy.optimizer.kwargs.exp_avg_dtype=torch.bfloat16"}, "policy.optimizer.kwargs.exp_avg_dtype"},
		{"master weights", []string{"++policy.optimizer.kwargs.master_weights=false"}, "policy.optimizer.kwargs.master_weights"},
		{"Megatron master params", []string{"policy.megatron_cfg.optimizer.params_dtype=bfloat16"}, "policy.megatron_cfg.optimizer.params_dtype"},
	} {
		keys := refusedKeys(t, c.over...)
		found := false
		for _, k := range keys {
			found = found || k == c.key
		}
		if !found {
			t.Errorf("%s: %v refused for %v, not for %s", c.what, c.over, keys, c.key)
		}
	}
	t.Logf("%d refused keys of the table, each refused by name", n)
}

// TestCheckAcceptsKeysNeMoRLIgnores: keys NeMo RL's Python never reads
// (gen_nemorl_keys.tsv, from scripts/nemorl_schema.py), and
// policy.megatron_cfg.train_iters, which its GRPO setup overwrites before
// use, cannot change what NeMo RL trains: Check accepts them at any value,
// and each is Ignored with that reason (issue 32).
func TestCheckAcceptsKeysNeMoRLIgnores(t *testing.T) {
	for _, c := range []struct{ key, value, why string }{
		{"grpo.penalize_invalid_tool_call", "true", "never reads it"},
		{"grpo.penalize_malformed_thinking", "true", "never reads it"},
		{"grpo.zero_variance_prompt_filtering", "true", "never reads it"},
		{"grpo.use_best_at_k", "true", "never reads it"},
		{"grpo.use_combined_training", "true", "never reads it"},
		{"policy.megatron_cfg.train_iters", "100000", "overwrites it before the policy sees it"},
	} {
		over := "++" + c.key + "=" + c.value
		if keys := refusedKeys(t, over); len(keys) != 0 {
			t.Errorf("%s: refused for %v", over, keys)
		}
		cls, r, _ := config.Classify(c.key, nil)
		if cls != config.Ignored || r == nil || !strings.Contains(r.Why, c.why) {
			t.Errorf("%s: class %v (%+v); want Ignored, saying %q", c.key, cls, r, c.why)
		}
	}
}

// TestCheckNeutralValuesAccepted: the values of the refused keys that ask
// for nothing pass.
func TestCheckNeutralValuesAccepted(t *testing.T) {
	for _, over := range [][]string{
		{"policy.dtensor_cfg.lora_cfg.enabled=false"},
		{"policy.megatron_cfg.fp8_cfg=null"},
		{"grpo.adv_estimator.minus_baseline=true"}, // read only by reinforce_plus_plus
		{"++grpo.skip_reference_policy_logprobs_calculation=true", "loss_fn.reference_policy_kl_penalty=0"},
		{"++policy.optimizer.kwargs.master_weights=true", "++policy.optimizer.kwargs.exp_avg_dtype=torch.float32"},
		{"policy.megatron_cfg.moe_router_load_balancing_type=none"},
	} {
		if keys := refusedKeys(t, over...); len(keys) != 0 {
			t.Errorf("%v: refused for %v", over, keys)
		}
	}
}

// TestHFConfigOverridesPatchTheModel: policy.hf_config_overrides replaces
// config.json's keys before the model is built (NeMo RL passes them to
// from_pretrained), and the result is checked as the model's own config.
func TestHFConfigOverridesPatchTheModel(t *testing.T) {
	const dir = "../model/testdata/qwen2_tied"
	for _, c := range []struct {
		name      string
		overrides []string
		posEmb    int
		theta     float32
		err       string
	}{
		{"none", nil, 128, 1e6, ""},
		{"two keys", []string{"++policy.hf_config_overrides={max_position_embeddings: 64, rope_theta: 5000.0}"}, 64, 5000, ""},
		{"a key the model refuses", []string{"++policy.hf_config_overrides.rope_scaling={rope_type: yarn, factor: 4.0, original_max_position_embeddings: 32}"}, 0, 0, "with policy.hf_config_overrides"},
	} {
		ld, err := config.LoadSources(config.Sources{Files: []string{todaysRecipe}, Overrides: c.overrides})
		if err != nil {
			t.Fatalf("%s: %v", c.name, err)
		}
		mc, _, err := ModelConfig(&ld.Config, dir)
		if c.err != "" {
			if err == nil || !strings.Contains(err.Error(), c.err) {
				t.Errorf("%s: error %v, want one containing %q", c.name, err, c.err)
			}
			continue
		}
		if err != nil {
			t.Fatalf("%s: %v", c.name, err)
		}
		if mc.MaxPositionEmbeddings != c.posEmb || mc.RopeTheta != c.theta {
			t.Errorf("%s: max_position_embeddings %d, rope_theta %g; want %d and %g", c.name, mc.MaxPositionEmbeddings, mc.RopeTheta, c.posEmb, c.theta)
		}
	}
}

// TestNullModelNameNeedsInitFrom: a recipe that leaves policy.model_name
// null to its launcher loads; the model comes from --init-from, and without
// it the run says so.
func TestNullModelNameNeedsInitFrom(t *testing.T) {
	ld, err := config.LoadSources(config.Sources{Files: []string{todaysRecipe}, Overrides: []string{"policy.model_name=null"}})
	if err != nil {
		t.Fatal(err)
	}
	if _, _, err := ModelConfig(&ld.Config, ""); err == nil || !strings.Contains(err.Error(), "policy.model_name is null") {
		t.Errorf("no model: %v", err)
	}
	if _, _, err := ModelConfig(&ld.Config, "../model/testdata/qwen2_tied"); err != nil {
		t.Errorf("--init-from: %v", err)
	}
}

// TestCheckTopKTopP: policy.generation's top_k and top_p are used (NeMo
// RL's filtered training log-probabilities), not refused; a top_p outside
// (0, 1] (which vLLM refuses) is refused naming the key, and so, where
// the model is known, is a top_k above its vocabulary (NeMo RL's
// torch.topk raises there).
func TestCheckTopKTopP(t *testing.T) {
	for _, over := range [][]string{
		{"policy.generation.top_p=0.9", "policy.generation.top_k=50"},
		{"policy.generation.top_p=1.0", "policy.generation.top_k=-1"},
		{"policy.generation.top_k=null"},
	} {
		if keys := refusedKeys(t, over...); len(keys) != 0 {
			t.Errorf("%v: refused for %v", over, keys)
		}
	}
	for _, p := range []string{"0", "1.5", "-0.1"} {
		if keys := refusedKeys(t, "policy.generation.top_p="+p); !slices.Contains(keys, "policy.generation.top_p") {
			t.Errorf("top_p %s: refused for %v, want policy.generation.top_p", p, keys)
		}
	}
	ld, err := config.LoadSources(config.Sources{Files: []string{todaysRecipe}, Overrides: []string{"policy.generation.top_k=33"}})
	if err != nil {
		t.Fatal(err)
	}
	var r *config.Refusal
	if err := checkTopK(&ld.Config, 32); !errors.As(err, &r) || r.Key != "policy.generation.top_k" {
		t.Errorf("top_k 33 of a 32-token vocabulary: %v, want a refusal of policy.generation.top_k", err)
	}
	if err := checkTopK(&ld.Config, 33); err != nil {
		t.Errorf("top_k 33 of a 33-token vocabulary: %v", err)
	}
}

// TestCheckTemperature (QA round): a temperature the float32 logits cannot
// be divided by (infinite, or so small that float32 holds it as 0 or its
// inverse overflows) is refused at the start, naming the key; it passed
// the check and failed in the first step's sampling or forward.
func TestCheckTemperature(t *testing.T) {
	for _, v := range []string{"0.7", "1.0", "1e-30", "1e30"} {
		if keys := refusedKeys(t, "policy.generation.temperature="+v); slices.Contains(keys, "policy.generation.temperature") {
			t.Errorf("temperature %s: refused", v)
		}
	}
	for _, v := range []string{"0", "-1", "1e-300", "1e-39", "1e39"} {
		if keys := refusedKeys(t, "policy.generation.temperature="+v); !slices.Contains(keys, "policy.generation.temperature") {
			t.Errorf("temperature %s: refused for %v, want policy.generation.temperature", v, keys)
		}
	}
}
