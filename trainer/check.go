package trainer

import (
	"errors"
	"fmt"
	"math"

	"github.com/tracegrpo/tracegrpo/config"
	"github.com/tracegrpo/tracegrpo/grpo"
	"github.com/tracegrpo/tracegrpo/model"
	"github.com/tracegrpo/tracegrpo/rollout"
)

// Check runs every refusal that the configuration alone decides, before any
// work: the key table's refused keys (config.Loaded.Refusals), the capability
// guards and loss options (grpo.CheckConfig), the multi-trace opt-in, the
// optimizer and schedule, the training precision, the sampling temperature
// and the run length (steps: --steps, 0 for grpo.max_num_steps). train runs
// it first; train config --check runs it and nothing else, so the two refuse
// the same recipes. It returns every refusal found, joined; each names its
// key (config.SplitRefusals separates them from other errors). The model
// is not known here: a key that configures experts is left undecided (see
// CheckFor and config.Loaded.Undecided).
func Check(ld *config.Loaded, steps int) error { return CheckFor(ld, steps, config.ExpertsUnknown) }

// CheckFor is Check knowing whether the model has experts: a MoE-only key
// (the router's settings) is refused only when it has.
func CheckFor(ld *config.Loaded, steps int, experts config.Experts) error {
	c := &ld.Config
	var errs []error
	add := func(err error) {
		if err != nil {
			errs = append(errs, err)
		}
	}
	add(ld.RefusalsFor(experts))
	add(grpo.CheckConfig(c))
	tic := &c.Env.NemoGym.TokenIDCapture
	const ticKey = "env.nemo_gym.token_id_capture."
	if !c.GRPO.GymMultiTrace {
		add(&config.Refusal{Key: "grpo.gym_multi_trace", Value: "false",
			Why: "tracegrpo trains the multi-trace path only: set grpo.gym_multi_trace: true and env.nemo_gym.token_id_capture {enabled: true, all_agents: true, delivery: all_traces, builder: per_request or prefix_merging} (spec §9)"})
	} else {
		if !tic.Enabled {
			add(&config.Refusal{Key: ticKey + "enabled", Value: "false", Why: "multi-trace GRPO trains the token IDs Gym captures; turn capture on (enabled: true is part of the opt-in)"})
		}
		if !tic.AllAgents {
			add(&config.Refusal{Key: ticKey + "all_agents", Value: "false", Why: "multi-trace GRPO trains every agent's calls; with all_agents false Gym captures the main agent's only (all_agents: true is part of the opt-in)"})
		}
	}
	// NeMo RL filters the training logits by top-k/top-p to match generation
	// (nemo_rl/algorithms/logits_sampling_utils.py): so does the model
	// (model.Options.HeadFilter). vLLM takes top_p in (0, 1].
	if g := &c.Policy.Generation; !(g.TopP > 0 && g.TopP <= 1) {
		add(&config.Refusal{Key: "policy.generation.top_p", Value: fmt.Sprint(g.TopP),
			Why: "top_p must be in (0, 1] (1 keeps every token)"})
	}
	if _, _, err := c.Optim(); err != nil {
		add(err)
	}
	if _, err := c.TrainingPrecision(); err != nil {
		add(err)
	}
	// The sampler and the training head divide float32 logits by it: an
	// infinite one, or one float32 holds as 0 or ±Inf or whose inverse
	// overflows,
	// passed this check and failed at step 1.
	if temp := c.Policy.Generation.Temperature; !(temp > 0) || math.IsInf(temp, 0) ||
		!(float32(temp) > 0) || math.IsInf(float64(float32(temp)), 0) || math.IsInf(float64(1/float32(temp)), 0) {
		add(&config.Refusal{Key: "policy.generation.temperature", Value: fmt.Sprint(temp),
			Why: "must be a finite number > 0 that a float32 holds, with its inverse (training log-probabilities divide the float32 logits by it)"})
	}
	add(checkStepCount(c, steps))
	add(checkExpertBias(c, experts))
	return errors.Join(errs...)
}

// Why the expert-bias keys are refused (checkExpertBias).
const (
	whyNoExpertBias = "aux-loss-free load balancing updates the routers' selection bias (e_score_correction_bias), and this model's routers have none: Megatron allows the expert bias only with the sigmoid or sqrtsoftplus score function (megatron/core/transformer/transformer_config.py:2617), and Qwen3-MoE's is softmax"
	whyBiasAlwaysOn = "NeMo RL's Megatron setup never reads this key: Megatron-Bridge's Nemotron-H provider turns the expert bias on (src/megatron/bridge/models/nemotronh/nemotron_h_bridge.py:312), so the loaded e_score_correction_bias routes and moe_router_bias_update_rate updates it whatever this says; to keep the bias fixed set moe_router_bias_update_rate: 0"
)

// checkExpertBias refuses the aux-loss-free load-balancing keys
// (policy.megatron_cfg.moe_router_enable_expert_bias and
// moe_router_bias_update_rate, read when megatron_cfg is enabled) where
// they cannot take effect as NeMo RL's Megatron run would: on a sparse
// model without a selection bias, any value that asks for one, and on a
// model with one, enable_expert_bias false. A dense model has no routers
// for them to change; without the model (ExpertsUnknown) they are left to
// train (see UndecidedExpertBias).
func checkExpertBias(c *config.Config, experts config.Experts) error {
	var errs []error
	for _, r := range expertBiasRefusals(c, experts) {
		errs = append(errs, r)
	}
	return errors.Join(errs...)
}

func expertBiasRefusals(c *config.Config, experts config.Experts) []*config.Refusal {
	mc := &c.Policy.MegatronCfg
	if !mc.Enabled {
		return nil
	}
	const pre = "policy.megatron_cfg."
	var out []*config.Refusal
	enable, rate := mc.MoERouterEnableExpertBias, mc.MoERouterBiasUpdateRate
	switch experts {
	case config.ExpertsSome:
		if enable != nil && *enable {
			out = append(out, &config.Refusal{Key: pre + "moe_router_enable_expert_bias", Value: "true", Why: whyNoExpertBias})
		}
		if rate != 0 {
			out = append(out, &config.Refusal{Key: pre + "moe_router_bias_update_rate", Value: fmt.Sprint(rate), Why: whyNoExpertBias + " (accepted: 0)"})
		}
	case config.ExpertsBiased:
		if enable != nil && !*enable {
			out = append(out, &config.Refusal{Key: pre + "moe_router_enable_expert_bias", Value: "false", Why: whyBiasAlwaysOn})
		}
		if math.IsNaN(rate) || math.IsInf(rate, 0) {
			out = append(out, &config.Refusal{Key: pre + "moe_router_bias_update_rate", Value: fmt.Sprint(rate), Why: "must be a finite number"})
		}
	}
	return out
}

// UndecidedExpertBias are the expert-bias keys' refusals on a sparse model
// without a selection bias: what train config --check cannot decide
// without the model (config.Loaded.Undecided's counterpart for these
// typed keys).
func UndecidedExpertBias(c *config.Config) []*config.Refusal {
	return expertBiasRefusals(c, config.ExpertsSome)
}

// ExpertsOf says whether model mc has experts, for CheckFor.
func ExpertsOf(mc model.Config) config.Experts {
	if mc.Sparse() && mc.Hybrid() { // Nemotron-H's routers: a selection bias each
		return config.ExpertsBiased
	}
	if mc.Sparse() {
		return config.ExpertsSome
	}
	return config.ExpertsNone
}

// CheckModel runs the checks of the model (its config.json with
// policy.hf_config_overrides applied) against what the run feeds it, before
// any work: the built-in job's token ids must be in the vocabulary, and so
// must the padding token. train runs it when it builds the model, and train
// config --check when the model is at hand, so that
// ++policy.hf_config_overrides.vocab_size=7 fails at the check, not at the
// first step's forward. builtin: the built-in job (no --rollouts).
func CheckModel(mc model.Config, builtin bool) error {
	const key = "policy.hf_config_overrides.vocab_size"
	if builtin && mc.VocabSize < rollout.VocabSize {
		return &config.Refusal{Key: key, Value: fmt.Sprint(mc.VocabSize),
			Why: fmt.Sprintf("the model's vocabulary has %d ids, and the built-in job's tasks use ids 0 to %d: want vocab_size >= %d", mc.VocabSize, rollout.VocabSize-1, rollout.VocabSize)}
	}
	if pad := padToken(mc); int(pad) >= mc.VocabSize {
		return &config.Refusal{Key: "pad_token_id", Value: fmt.Sprint(pad),
			Why: fmt.Sprintf("the model's padding token (config.json pad_token_id, with policy.hf_config_overrides) is outside its vocabulary [0, %d)", mc.VocabSize)}
	}
	return nil
}
