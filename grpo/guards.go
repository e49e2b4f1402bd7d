package grpo

import (
	"errors"
	"fmt"
	"math"

	"github.com/tracegrpo/tracegrpo/config"
)

// GuardError is one refused configuration: the key, its value and why.
type GuardError struct {
	Key, Value, Why string
}

func (e *GuardError) Error() string {
	return fmt.Sprintf("grpo: %s = %s: %s", e.Key, e.Value, e.Why)
}

// RefusedKey names the refused key (config.Refuser).
func (e *GuardError) RefusedKey() string { return e.Key }

// CheckConfig runs every capability guard (spec §8.1) and the loss-option
// constraints (spec §6.3) before any work starts. It returns all violations,
// joined; each is a *GuardError.
//
// The Gym-side rules and the opt-in pairing apply always. The multi-trace
// rules apply when grpo.gym_multi_trace is true; with both sides off (delivery
// main_chain) nothing multi-trace is checked, as in NeMo RL.
func CheckConfig(c *config.Config) error {
	var errs []error
	add := func(key string, val any, why string) {
		errs = append(errs, &GuardError{Key: key, Value: fmt.Sprint(val), Why: why})
	}
	tic := &c.Env.NemoGym.TokenIDCapture
	const ticKey = "env.nemo_gym.token_id_capture."

	// Gym configuration (spec §2.6).
	switch tic.Delivery {
	case config.DeliveryMainChain, config.DeliveryAllTraces:
	default:
		add(ticKey+"delivery", tic.Delivery, "want main_chain or all_traces")
	}
	switch tic.Builder {
	case config.BuilderPrefixMerging, config.BuilderPerRequest:
	default:
		add(ticKey+"builder", tic.Builder, "want prefix_merging or per_request")
	}
	if tic.Builder == config.BuilderPerRequest && tic.Delivery != config.DeliveryAllTraces {
		add(ticKey+"builder", tic.Builder, "per_request requires delivery all_traces")
	}
	if tic.Delivery == config.DeliveryAllTraces && tic.ExternalStaging {
		add(ticKey+"external_staging", true, "delivery all_traces needs the local capture store; external staging is asynchronous")
	}

	// Opt-in pairing: both sides or neither.
	if tic.Delivery == config.DeliveryAllTraces && !c.GRPO.GymMultiTrace {
		add(ticKey+"delivery", tic.Delivery, "all_traces requires grpo.gym_multi_trace: true (both sides must opt in)")
	}
	if c.GRPO.GymMultiTrace && tic.Delivery != config.DeliveryAllTraces {
		add("grpo.gym_multi_trace", true, fmt.Sprintf("requires %sdelivery: all_traces, found %q (both sides must opt in)", ticKey, tic.Delivery))
	}

	if c.GRPO.GymMultiTrace {
		g := &c.GRPO
		if g.AsyncGRPO.Enabled {
			add("grpo.async_grpo.enabled", true, "multi-trace GRPO is synchronous: async GRPO mixes policy versions within a logical rollout's traces")
		}
		if c.DataPlane != nil && c.DataPlane.Enabled {
			add("data_plane.enabled", true, "the data plane is not supported by multi-trace GRPO; use data_plane: null or a disabled block")
		}
		if c.Policy.IsVLM {
			add("policy.is_vlm", true, "multi-trace GRPO trains one text policy model")
		}
		if g.UseDynamicSampling {
			add("grpo.use_dynamic_sampling", true, "dynamic sampling filters and refills groups of physical samples, not logical rollouts")
		}
		if g.SeqLogprobErrorThreshold != nil {
			add("grpo.seq_logprob_error_threshold", *g.SeqLogprobErrorThreshold, "sequence-logprob-error masking depends on trace boundaries; must be null")
		}
		if g.AdvEstimator.Name != config.AdvEstimatorGRPO {
			add("grpo.adv_estimator.name", g.AdvEstimator.Name, "multi-trace GRPO supports only the grpo estimator")
		}
		if tic.Sink != nil {
			add(ticKey+"sink", fmt.Sprintf("%v", tic.Sink), "custom sinks are not supported; the trainer reads the local capture store")
		}
		if c.Policy.RouterReplay.Enabled {
			add("policy.router_replay.enabled", true, "router replay is rejected by all_traces (routed_experts are masked)")
		}
		if g.OverlongFiltering {
			add("grpo.overlong_filtering", true, "legacy episode-length filtering is replaced by per-trace overlong masking")
		}
		if g.RewardShaping.Enabled {
			add("grpo.reward_shaping.enabled", true, "legacy episode-length reward shaping is not supported with multi-trace")
		}
		if g.InvalidToolCallAdvantage != nil {
			add("grpo.invalid_tool_call_advantage", *g.InvalidToolCallAdvantage, "message-level advantage penalties are not supported with multi-trace; must be null")
		}
		if g.MalformedThinkingAdvantage != nil {
			add("grpo.malformed_thinking_advantage", *g.MalformedThinkingAdvantage, "message-level advantage penalties are not supported with multi-trace; must be null")
		}
		if want := g.NumPromptsPerStep * g.NumGenerationsPerPrompt; c.Policy.TrainGlobalBatchSize != want {
			add("policy.train_global_batch_size", c.Policy.TrainGlobalBatchSize,
				fmt.Sprintf("must equal num_prompts_per_step × num_generations_per_prompt = %d × %d = %d logical rollouts (one optimizer step and one scheduler tick per GRPO step)",
					g.NumPromptsPerStep, g.NumGenerationsPerPrompt, want))
		}
	}

	// Not implemented by tracegrpo, whatever the mode.
	if c.GRPO.RewardScaling.Enabled {
		add("grpo.reward_scaling.enabled", true, "tracegrpo does not implement reward scaling")
	}

	// Sizes.
	positive := []struct {
		key string
		v   int
	}{
		{"grpo.num_prompts_per_step", c.GRPO.NumPromptsPerStep},
		{"grpo.num_generations_per_prompt", c.GRPO.NumGenerationsPerPrompt},
		{"policy.train_global_batch_size", c.Policy.TrainGlobalBatchSize},
		{"policy.train_micro_batch_size", c.Policy.TrainMicroBatchSize},
		{"cluster.gpus_per_node", c.Cluster.GPUsPerNode},
		{"cluster.num_nodes", c.Cluster.NumNodes},
	}
	for _, p := range positive {
		if p.v < 1 {
			add(p.key, p.v, "want >= 1")
		} else if p.v > MaxCount {
			add(p.key, p.v, fmt.Sprintf("want at most %d", MaxCount))
		}
	}
	if c.Policy.MaxTotalSequenceLength < 2 {
		add("policy.max_total_sequence_length", c.Policy.MaxTotalSequenceLength, "want >= 2 (a trace needs a conditioning token and a sampled token)")
	} else if c.Policy.MaxTotalSequenceLength > math.MaxInt32 {
		add("policy.max_total_sequence_length", c.Policy.MaxTotalSequenceLength, fmt.Sprintf("want at most %d (token positions are int32)", math.MaxInt32))
	}

	// Loss options (spec §6.3) and the seq-mask-tis rule (spec §8.1).
	if _, err := NewLossOptions(&c.LossFn); err != nil {
		errs = append(errs, err)
	}
	return errors.Join(errs...)
}

// MaxCount caps the counts of a step (prompts, generations, batch sizes,
// GPUs): their products size every step's arrays and are checked for
// overflow (3 × 6148914691236517206 generations wrapped around to a batch
// of 2).
const MaxCount = 1 << 24

// RowMultiple is the divisibility of a step's rows: data-parallel size (all
// GPUs) × train_micro_batch_size.
func RowMultiple(c *config.Config) int {
	return c.Cluster.GPUsPerNode * c.Cluster.NumNodes * c.Policy.TrainMicroBatchSize
}

// AdvantageOptionsFrom reads grpo.adv_estimator and the advantage clips.
func AdvantageOptionsFrom(c *config.Config) AdvantageOptions {
	return AdvantageOptions{
		NormalizeRewards: c.GRPO.AdvEstimator.NormalizeRewards,
		LeaveOneOut:      c.GRPO.AdvEstimator.UseLeaveOneOutBaseline,
		ClipLow:          c.GRPO.AdvantageClipLow,
		ClipHigh:         c.GRPO.AdvantageClipHigh,
	}
}
