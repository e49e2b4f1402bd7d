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
	return errors.Join(errs...)
}

// ExpertsOf says whether model mc has experts, for CheckFor.
func ExpertsOf(mc model.Config) config.Experts {
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
