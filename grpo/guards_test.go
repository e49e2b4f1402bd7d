package grpo

import (
	"errors"
	"strings"
	"testing"

	"github.com/tracegrpo/tracegrpo/config"
)

var recipes = map[string][]string{
	"megatron": {"../config/testdata/grpo_math_1B_megatron.yaml", "../config/testdata/multitrace_override.yaml"},
	"base":     {"../config/testdata/grpo_math_1B.yaml", "../config/testdata/multitrace_override.yaml"},
}

func loadRecipe(t *testing.T, files []string, sets ...string) *config.Config {
	t.Helper()
	l, err := config.Load(files, sets)
	if err != nil {
		t.Fatalf("config.Load(%v, %v): %v", files, sets, err)
	}
	return &l.Config
}

// TestGuardsPassOnRecipes: the real recipes with the spec §9 block pass, and so
// do the recipes alone (both sides off).
func TestGuardsPassOnRecipes(t *testing.T) {
	for name, files := range recipes {
		if err := CheckConfig(loadRecipe(t, files)); err != nil {
			t.Errorf("%s + multi-trace block: %v", name, err)
		}
		if err := CheckConfig(loadRecipe(t, files[:1])); err != nil {
			t.Errorf("%s alone (both sides off): %v", name, err)
		}
	}
}

// TestGuards: each guard fires on the real recipe (with the multi-trace block)
// after exactly one --set, naming the key, the value and why (spec §8.1,
// §10.1 #8–#10).
func TestGuards(t *testing.T) {
	cases := []struct {
		set      string
		key, why string
	}{
		// §10.1 #8, the 9 recovered cases.
		{"grpo.async_grpo.enabled=true", "grpo.async_grpo.enabled", "synchronous"},
		{"data_plane={enabled: true}", "data_plane.enabled", "data plane"},
		{"policy.is_vlm=true", "policy.is_vlm", "text policy"},
		{"loss_fn.token_level_loss=false", "loss_fn.token_level_loss", "token-level loss"},
		{"grpo.use_dynamic_sampling=true", "grpo.use_dynamic_sampling", "dynamic sampling"},
		{"grpo.seq_logprob_error_threshold=2.0", "grpo.seq_logprob_error_threshold", "trace boundaries"},
		{"grpo.adv_estimator.name=gdpo", "grpo.adv_estimator.name", "only the grpo estimator"},
		{"env.nemo_gym.token_id_capture.sink=my.module.Sink", "env.nemo_gym.token_id_capture.sink", "custom sinks"},
		{"policy.train_global_batch_size=16", "policy.train_global_batch_size", "4 × 2 = 8"},
		// The rest of spec §8.1 and the Gym configuration rules.
		{"loss_fn.sequence_level_importance_ratios=true", "loss_fn.sequence_level_importance_ratios", "token-level ratios"},
		{"env.nemo_gym.token_id_capture.external_staging=true", "env.nemo_gym.token_id_capture.external_staging", "external staging"},
		{"policy.router_replay.enabled=true", "policy.router_replay.enabled", "routed_experts"},
		{"grpo.overlong_filtering=true", "grpo.overlong_filtering", "per-trace overlong"},
		{"grpo.reward_shaping.enabled=true", "grpo.reward_shaping.enabled", "reward shaping"},
		{"grpo.invalid_tool_call_advantage=-1", "grpo.invalid_tool_call_advantage", "message-level"},
		{"grpo.malformed_thinking_advantage=-1", "grpo.malformed_thinking_advantage", "message-level"},
		{"env.nemo_gym.token_id_capture.delivery=everything", "env.nemo_gym.token_id_capture.delivery", "main_chain or all_traces"},
		{"env.nemo_gym.token_id_capture.builder=tree", "env.nemo_gym.token_id_capture.builder", "prefix_merging or per_request"},
		{"env.nemo_gym.token_id_capture.delivery=main_chain", "env.nemo_gym.token_id_capture.builder", "per_request requires delivery all_traces"},
		{"env.nemo_gym.token_id_capture.delivery=main_chain", "grpo.gym_multi_trace", "both sides must opt in"},
		// §10.1 #10: all_traces without gym_multi_trace.
		{"grpo.gym_multi_trace=false", "env.nemo_gym.token_id_capture.delivery", "requires grpo.gym_multi_trace"},
		// §10.1 #9: seq-mask-tis with correction on (the recipe's correction is off).
		{"loss_fn={use_importance_sampling_correction: true, truncated_importance_sampling_type: seq-mask-tis, truncated_importance_sampling_ratio: 1.002, truncated_importance_sampling_ratio_min: 0.999}",
			"loss_fn.truncated_importance_sampling_type", "seq-mask-tis"},
		// Loss constraints of spec §6.3 and what tracegrpo does not implement.
		{"loss_fn.ratio_clip_c=0.5", "loss_fn.ratio_clip_c", "> 1"},
		{"loss_fn.reference_policy_kl_type=k4", "loss_fn.reference_policy_kl_type", "k1, k2 or k3"},
		{"loss_fn.truncated_importance_sampling_type=tis", "loss_fn.truncated_importance_sampling_type", "requires use_importance_sampling_correction"},
		{"loss_fn.use_kl_in_reward=true", "loss_fn.use_kl_in_reward", "reward"},
		{"loss_fn.positive_example_nll_weight=0.1", "loss_fn.positive_example_nll_weight", "micro-batch"},
		{"grpo.reward_scaling.enabled=true", "grpo.reward_scaling.enabled", "reward scaling"},
		{"policy.max_total_sequence_length=1", "policy.max_total_sequence_length", ">= 2"},
		{"policy.train_micro_batch_size=0", "policy.train_micro_batch_size", ">= 1"},
	}
	for name, files := range recipes {
		for _, tc := range cases {
			t.Run(name+"/"+tc.set, func(t *testing.T) {
				err := CheckConfig(loadRecipe(t, files, tc.set))
				if err == nil {
					t.Fatalf("--set %s passed the guards", tc.set)
				}
				var found *GuardError
				for _, e := range unwrapAll(err) {
					var g *GuardError
					if errors.As(e, &g) && g.Key == tc.key {
						found = g
					}
				}
				if found == nil {
					t.Fatalf("no guard error for key %s in: %v", tc.key, err)
				}
				if !strings.Contains(found.Why, tc.why) || found.Value == "" {
					t.Errorf("guard %s: value %q, why %q; want a value and a reason containing %q", tc.key, found.Value, found.Why, tc.why)
				}
				if !strings.Contains(err.Error(), tc.key+" = "+found.Value) {
					t.Errorf("message %q does not name key and value", err)
				}
			})
		}
	}
}

func unwrapAll(err error) []error {
	if j, ok := err.(interface{ Unwrap() []error }); ok {
		return j.Unwrap()
	}
	return []error{err}
}

// TestSeqMaskTISAllowedWithoutCorrection is spec §10.1 #9's other half.
func TestSeqMaskTISAllowedWithoutCorrection(t *testing.T) {
	for name, files := range recipes {
		c := loadRecipe(t, files, "loss_fn={use_importance_sampling_correction: false, truncated_importance_sampling_type: seq-mask-tis, truncated_importance_sampling_ratio: 1.002, truncated_importance_sampling_ratio_min: 0.999}")
		if err := CheckConfig(c); err != nil {
			t.Errorf("%s: seq-mask-tis with correction off: %v", name, err)
		}
		o, err := NewLossOptions(&c.LossFn)
		if err != nil || o.TISType != TISNone {
			t.Errorf("%s: options %+v, %v; want seq-mask-tis inert", name, o, err)
		}
	}
}

// TestBothSidesOff is spec §10.1 #10: delivery main_chain without multi-trace
// is fine; the multi-trace-only rules do not apply then.
func TestBothSidesOff(t *testing.T) {
	c := loadRecipe(t, recipes["megatron"][:1], "grpo.use_dynamic_sampling=true")
	if err := CheckConfig(c); err != nil {
		t.Errorf("legacy mode: %v", err)
	}
}

func TestHelpersFromConfig(t *testing.T) {
	c := loadRecipe(t, recipes["megatron"], "cluster.gpus_per_node=2", "policy.train_micro_batch_size=3", "grpo.advantage_clip_low=-4")
	if got := RowMultiple(c); got != 6 {
		t.Errorf("RowMultiple = %d, want 6", got)
	}
	a := AdvantageOptionsFrom(c)
	if !a.NormalizeRewards || !a.LeaveOneOut || a.ClipLow == nil || *a.ClipLow != -4 || a.ClipHigh != nil {
		t.Errorf("AdvantageOptionsFrom = %+v", a)
	}
}
