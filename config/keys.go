package config

import (
	"math"
	"reflect"
	"strconv"
	"strings"

	"go.yaml.in/yaml/v3"
)

// Class is what tracegrpo does with a recipe key.
type Class int

const (
	// Unclassified: the key is in no rule. Loading applies the
	// forward-compatibility rule (ForwardCompatible).
	Unclassified Class = iota
	// Used keys are decoded into Config and honoured.
	Used
	// Ignored keys configure an engine or service tracegrpo does not run;
	// they cannot change what is trained. They are accepted and listed.
	Ignored
	// Refused keys ask for training math or a model change tracegrpo does
	// not implement. A value that asks for nothing (Neutral) is accepted;
	// any other is refused, naming the key, before any work (trainer.Check).
	Refused
)

func (c Class) String() string {
	switch c {
	case Used:
		return "used"
	case Ignored:
		return "ignored"
	case Refused:
		return "refused"
	}
	return "unclassified"
}

// KeyRule classifies one key path and everything under it that no more
// specific rule names. Paths drop list indices ("policy.scheduler.name"); a
// "*" segment matches any one key.
type KeyRule struct {
	Key   string
	Class Class
	// Why says, for Ignored and Refused keys, what the key does and why
	// tracegrpo ignores or refuses it; train config and the refusal print it.
	Why string
	// Neutral lists the values of a Refused key that ask for nothing
	// tracegrpo lacks (nil: no value is neutral).
	Neutral *Neutral
	// Guard marks a Refused key typed in Config whose refusal the
	// capability guards of package grpo (or the trainer) make, with a
	// reason specific to the value.
	Guard bool
	// Example is a value (YAML) that the check must refuse; the key table's
	// test applies it and expects a refusal naming Key.
	Example string
	// Also is an override (key=value) the Example needs to take effect.
	Also string
	// MappingOnly restricts the rule to keys whose value is a mapping (an
	// "env.*" rule names environment blocks, not scalar typos under env).
	MappingOnly bool
	// KnownOnly restricts an Ignored section's rule to the keys NeMo RL's
	// schema and recipes know there (gen_nemorl_keys.tsv): any other key
	// under it is unknown (a typo, warned about with the nearest key).
	KnownOnly bool
	// Overwritten names the NeMo RL module that overwrites an Ignored key
	// before use (the key table's test checks that gen_nemorl_keys.tsv
	// still records the store there).
	Overwritten string
	// MoEOnly marks a key that configures a model's experts: on a dense
	// model it changes nothing, so it is refused only when the model has
	// experts (decided where the model is known; see Loaded.Refusals).
	MoEOnly bool
}

// The key classes. One rule per line; the most specific rule for a key wins.
// To honour a refused key: add its field to Config (schema.go), read it, and
// turn its rule into {Key, Used, "", nil, false, ""}. Every key of NeMo RL's
// schema and GRPO recipes (gen_nemorl_keys.tsv) must be in exactly one class;
// TestKeyClassesCoverNeMoRL checks it.
var keyRules = []KeyRule{
	// grpo: the step and the advantage.
	{Key: "grpo.num_prompts_per_step", Class: Used},
	{Key: "grpo.num_generations_per_prompt", Class: Used},
	{Key: "grpo.max_num_steps", Class: Used},
	{Key: "grpo.gym_multi_trace", Class: Used},
	{Key: "grpo.seed", Class: Used},
	{Key: "grpo.normalize_rewards", Class: Used},
	{Key: "grpo.use_leave_one_out_baseline", Class: Used},
	{Key: "grpo.adv_estimator.name", Class: Used},
	{Key: "grpo.adv_estimator.normalize_rewards", Class: Used},
	{Key: "grpo.adv_estimator.use_leave_one_out_baseline", Class: Used},
	{Key: "grpo.advantage_clip_low", Class: Used},
	{Key: "grpo.advantage_clip_high", Class: Used},
	{Key: "grpo.adv_estimator.minus_baseline", Class: Refused, Neutral: inertUnlessEstimator("reinforce_plus_plus"), Example: "true", Also: "grpo.adv_estimator.name=reinforce_plus_plus",
		Why: "Reinforce++'s per-prompt baseline subtraction; NeMo RL reads it only with adv_estimator.name reinforce_plus_plus, and tracegrpo implements the grpo estimator"},
	{Key: "grpo.adv_estimator.reward_weights", Class: Refused, Neutral: nullOr(), Example: "[1.0, 0.5]",
		Why: "GDPO's per-reward-component weights; tracegrpo implements the grpo estimator over one scalar reward"},
	{Key: "grpo.async_grpo.enabled", Class: Refused, Guard: true, Example: "true",
		Why: "asynchronous GRPO trains on rollouts from older policies"},
	{Key: "grpo.async_grpo", Class: Ignored, Why: "knobs of asynchronous GRPO, which is refused when grpo.async_grpo.enabled"},
	{Key: "grpo.use_dynamic_sampling", Class: Refused, Guard: true, Example: "true",
		Why: "dynamic sampling drops and refills prompt groups"},
	{Key: "grpo.batch_multiplier", Class: Ignored, Why: "a knob of dynamic sampling, which is refused when grpo.use_dynamic_sampling"},
	{Key: "grpo.dynamic_sampling_max_gen_batches", Class: Ignored, Why: "a knob of dynamic sampling, which is refused when grpo.use_dynamic_sampling"},
	{Key: "grpo.dynamic_sampling_oversample_ratio", Class: Ignored, Why: "meant as a knob of dynamic sampling"},
	{Key: "grpo.zero_variance_prompt_filtering", Class: Ignored, Why: "meant to filter out prompt groups whose rewards do not vary"},
	{Key: "grpo.seq_logprob_error_threshold", Class: Refused, Guard: true, Example: "1.5",
		Why: "sequence-level logprob-error masking depends on trace boundaries"},
	{Key: "grpo.overlong_filtering", Class: Refused, Guard: true, Example: "true",
		Why: "episode-length filtering; multi-trace GRPO masks overlong traces instead"},
	{Key: "grpo.reward_shaping.enabled", Class: Refused, Guard: true, Example: "true",
		Why: "episode-length reward shaping"},
	{Key: "grpo.reward_shaping", Class: Ignored, Why: "knobs of reward shaping, which is refused when grpo.reward_shaping.enabled"},
	{Key: "grpo.reward_scaling.enabled", Class: Refused, Guard: true, Example: "true",
		Why: "linear reward scaling"},
	{Key: "grpo.reward_scaling", Class: Ignored, Why: "knobs of reward scaling, which is refused when grpo.reward_scaling.enabled"},
	{Key: "grpo.invalid_tool_call_advantage", Class: Refused, Guard: true, Example: "-5.0",
		Why: "message-level advantage penalties"},
	{Key: "grpo.malformed_thinking_advantage", Class: Refused, Guard: true, Example: "-5.0",
		Why: "message-level advantage penalties"},
	// Keys NeMo RL's Python never reads are Ignored whatever their rule
	// (keys_nemorl.go); these rules say what each was meant to do.
	{Key: "grpo.penalize_invalid_tool_call", Class: Ignored, Why: "meant as a tool-call penalty on the advantage (the switch NeMo RL reads is grpo.invalid_tool_call_advantage, refused when set)"},
	{Key: "grpo.penalize_malformed_thinking", Class: Ignored, Why: "meant as a thinking-tag penalty on the advantage (the switch NeMo RL reads is grpo.malformed_thinking_advantage, refused when set)"},
	{Key: "grpo.invalid_tool_call_strategy", Class: Ignored, Why: "meant as a knob of the tool-call penalty"},
	{Key: "grpo.use_best_at_k", Class: Ignored, Why: "meant as best-of-k training"},
	{Key: "grpo.best_at_k_k", Class: Ignored, Why: "meant as a knob of grpo.use_best_at_k"},
	{Key: "grpo.best_at_k_m", Class: Ignored, Why: "meant as a knob of grpo.use_best_at_k"},
	{Key: "grpo.use_combined_training", Class: Ignored, Why: "meant to mix a best-of-k objective into the loss"},
	{Key: "grpo.combined_training_weight_mode", Class: Ignored, Why: "meant as a knob of grpo.use_combined_training"},
	{Key: "grpo.combined_training_best_at_k_weight", Class: Ignored, Why: "meant as a knob of grpo.use_combined_training"},
	{Key: "grpo.combined_training_pass_at_1_weight", Class: Ignored, Why: "meant as a knob of grpo.use_combined_training"},
	{Key: "grpo.skip_reference_policy_logprobs_calculation", Class: Refused, Neutral: skipRefNeutral(), Example: "true",
		Why: "skips the reference policy's logprobs while loss_fn.reference_policy_kl_penalty needs them (tracegrpo skips the reference policy by itself when the penalty is 0)"},
	{Key: "grpo.max_rollout_turns", Class: Ignored, Why: "turns of NeMo RL's own rollout loop; NeMo Gym's agents decide the turns of the rollouts tracegrpo trains on"},
	{Key: "grpo.max_num_epochs", Class: Ignored, Why: "epochs of NeMo RL's prompt dataloader; the run length is grpo.max_num_steps"},
	{Key: "grpo.val_period", Class: Ignored, Why: "validation; tracegrpo runs no validation loop"},
	{Key: "grpo.val_start_at", Class: Ignored, Why: "validation; tracegrpo runs no validation loop"},
	{Key: "grpo.val_at_start", Class: Ignored, Why: "validation; tracegrpo runs no validation loop"},
	{Key: "grpo.val_at_end", Class: Ignored, Why: "validation; tracegrpo runs no validation loop"},
	{Key: "grpo.val_batch_size", Class: Ignored, Why: "validation; tracegrpo runs no validation loop"},
	{Key: "grpo.max_val_samples", Class: Ignored, Why: "validation; tracegrpo runs no validation loop"},
	{Key: "grpo.val_num_generations_per_prompt", Class: Ignored, Why: "validation; tracegrpo runs no validation loop"},
	{Key: "grpo.num_val_generations_per_prompt", Class: Ignored, Why: "a misspelling of grpo.val_num_generations_per_prompt (validation)"},
	{Key: "grpo.stop_at_validation_metric", Class: Ignored, Why: "early stop on a validation metric; tracegrpo runs no validation loop"},
	{Key: "grpo.stop_at_validation_threshold", Class: Ignored, Why: "early stop on a validation metric; tracegrpo runs no validation loop"},
	{Key: "grpo.calculate_advantages_on_gpu", Class: Ignored, Why: "where NeMo RL computes advantages; the values are the same"},
	{Key: "grpo.debug_payload_metrics", Class: Ignored, Why: "NeMo RL's payload metrics"},
	{Key: "grpo.deduplicate_multimodal_data", Class: Ignored, Why: "multimodal payload sharing; tracegrpo trains text models (policy.is_vlm is refused)"},

	// loss_fn: ClippedPGLossFn (spec §6). The guards refuse the values tracegrpo lacks.
	{Key: "loss_fn.reference_policy_kl_penalty", Class: Used},
	{Key: "loss_fn.reference_policy_kl_type", Class: Used},
	{Key: "loss_fn.kl_input_clamp_value", Class: Used},
	{Key: "loss_fn.kl_output_clamp_value", Class: Used},
	{Key: "loss_fn.ratio_clip_min", Class: Used},
	{Key: "loss_fn.ratio_clip_max", Class: Used},
	{Key: "loss_fn.ratio_clip_c", Class: Used},
	{Key: "loss_fn.use_on_policy_kl_approximation", Class: Used},
	{Key: "loss_fn.use_importance_sampling_correction", Class: Used},
	{Key: "loss_fn.truncated_importance_sampling_type", Class: Used},
	{Key: "loss_fn.truncated_importance_sampling_ratio", Class: Used},
	{Key: "loss_fn.truncated_importance_sampling_ratio_min", Class: Used},
	{Key: "loss_fn.force_on_policy_ratio", Class: Used},
	{Key: "loss_fn.disable_ppo_ratio", Class: Used},
	{Key: "loss_fn.use_cispo", Class: Used},
	{Key: "loss_fn.token_level_loss", Class: Refused, Guard: true, Example: "false",
		Why: "sequence-level loss normalization depends on trace boundaries (true is what tracegrpo does)"},
	{Key: "loss_fn.sequence_level_importance_ratios", Class: Refused, Guard: true, Example: "true",
		Why: "sequence-level importance ratios depend on trace boundaries"},
	{Key: "loss_fn.use_kl_in_reward", Class: Refused, Guard: true, Example: "true",
		Why: "Reinforce++'s KL penalty in the reward"},
	{Key: "loss_fn.positive_example_nll_weight", Class: Refused, Guard: true, Example: "0.1",
		Why: "VAPO's positive-example NLL term"},

	// reward_penalties: reward zeroing on Gym results.
	{Key: "reward_penalties.penalize_duplicated_reasoning", Class: Refused, Neutral: falseOr(), Example: "true",
		Why: "zeroes the reward of rollouts with duplicated reasoning; tracegrpo trains the rewards Gym recorded"},
	{Key: "reward_penalties.penalize_empty_final_answer", Class: Refused, Neutral: falseOr(), Example: "true",
		Why: "zeroes the reward of rollouts without a final answer; tracegrpo trains the rewards Gym recorded"},
	{Key: "reward_penalties.penalize_unwanted_tokens", Class: Refused, Neutral: falseOr(), Example: "true",
		Why: "zeroes the reward of rollouts with unwanted tokens; tracegrpo trains the rewards Gym recorded"},
	{Key: "reward_penalties.penalize_malformed_think_tag", Class: Refused, Neutral: falseOr(), Example: "true",
		Why: "zeroes the reward of rollouts with malformed think tags; tracegrpo trains the rewards Gym recorded"},
	{Key: "reward_penalties.token_ids", Class: Ignored, Why: "token IDs of the reward penalties, which are refused when on"},

	// on-policy distillation and its teachers.
	{Key: "on_policy_distillation", Class: Refused, Neutral: disabled(), Example: "{enabled: true}",
		Why: "multi-teacher on-policy distillation trains on teacher-minus-student advantages; tracegrpo trains GRPO advantages"},
	{Key: "_teachers", Class: Ignored, Why: "a block of teacher settings that MOPD recipes interpolate (on_policy_distillation is refused when on)"},

	// policy: the model, its batch, its precision, its optimizer.
	{Key: "policy.model_name", Class: Used},
	{Key: "policy.train_global_batch_size", Class: Used},
	{Key: "policy.train_micro_batch_size", Class: Used},
	{Key: "policy.max_total_sequence_length", Class: Used},
	{Key: "policy.max_grad_norm", Class: Used},
	{Key: "policy.precision", Class: Used},
	{Key: "policy.hf_config_overrides", Class: Used},
	// tracegrpo's own key (not NeMo RL's): shared-prefix token tries, auto or off.
	{Key: "policy.shared_prefix", Class: Used},
	{Key: "policy.is_vlm", Class: Refused, Guard: true, Example: "true",
		Why: "vision-language models"},
	{Key: "policy.router_replay.enabled", Class: Refused, Guard: true, Example: "true",
		Why: "MoE router replay"},
	{Key: "policy.router_replay", Class: Ignored, Why: "knobs of router replay, which is refused when policy.router_replay.enabled"},
	{Key: "policy.draft", Class: Refused, Neutral: disabled(), Example: "{enabled: true, model_name: AngelSlim/Qwen3-1.7B_eagle3}",
		Why: "trains a speculative-decoding draft model beside the policy (its loss is added with loss_weight)"},
	{Key: "policy.reward_model_cfg", Class: Refused, Neutral: disabled(), Example: "{enabled: true, reward_model_type: bradley_terry}",
		Why: "trains the policy as a reward model"},
	{Key: "policy.pretrained_checkpoint", Class: Refused, Neutral: nullOr(), Example: "{path: /ckpt, format: megatron_bridge}",
		Why: "starts from a Megatron checkpoint; tracegrpo starts from Hugging Face weights (policy.model_name or --init-from)"},
	{Key: "policy.quant_cfg", Class: Refused, Neutral: nullOr(), Example: "NVFP4_DEFAULT_CFG",
		Why: "ModelOpt quantization-aware training"},
	{Key: "policy.quant_batch_size", Class: Ignored, Why: "a knob of ModelOpt quantization, which is refused when policy.quant_cfg is set"},
	{Key: "policy.quant_calib_data", Class: Ignored, Why: "a knob of ModelOpt quantization, which is refused when policy.quant_cfg is set"},
	{Key: "policy.quant_calib_size", Class: Ignored, Why: "a knob of ModelOpt quantization, which is refused when policy.quant_cfg is set"},
	{Key: "policy.quant_sequence_length", Class: Ignored, Why: "a knob of ModelOpt quantization, which is refused when policy.quant_cfg is set"},
	{Key: "policy.disable_modelopt_layer_spec", Class: Ignored, Why: "a knob of ModelOpt quantization, which is refused when policy.quant_cfg is set"},
	{Key: "policy.tokenizer", Class: Ignored, Why: "the tokenizer and chat template: NeMo Gym tokenizes, tracegrpo trains the token IDs it recorded"},
	{Key: "policy.generation_batch_size", Class: Ignored, Why: "batching of NeMo RL's HF generation"},
	{Key: "policy.logprob_batch_size", Class: Ignored, Why: "batching of NeMo RL's logprob pass; tracegrpo packs its own micro-batches (the values are the same)"},
	{Key: "policy.logprob_chunk_size", Class: Ignored, Why: "chunking of NeMo RL's logprob pass (the values are the same)"},
	{Key: "policy.dynamic_batching", Class: Ignored, Why: "NeMo RL's micro-batch layout; the token-level loss does not depend on it"},
	{Key: "policy.sequence_packing", Class: Ignored, Why: "NeMo RL's micro-batch layout; the token-level loss does not depend on it"},
	{Key: "policy.make_sequence_length_divisible_by", Class: Ignored, Why: "padding for NeMo RL's parallel layouts"},
	{Key: "policy.offload_optimizer_for_logprob", Class: Ignored, Why: "memory placement of NeMo RL's engines"},
	{Key: "policy.refit_buffer_size_gb", Class: Ignored, Why: "weight transfer to NeMo RL's generation engine"},
	{Key: "policy.activation_checkpointing_enabled", Class: Ignored, Why: "activation checkpointing is policy.dtensor_cfg/megatron_cfg.activation_checkpointing"},
	{Key: "policy.optimizer.name", Class: Used},
	{Key: "policy.optimizer.kwargs.lr", Class: Used},
	{Key: "policy.optimizer.kwargs.weight_decay", Class: Used},
	{Key: "policy.optimizer.kwargs.betas", Class: Used},
	{Key: "policy.optimizer.kwargs.eps", Class: Used},
	{Key: "policy.optimizer.kwargs.foreach", Class: Ignored, Why: "how torch runs AdamW; the update is the same"},
	{Key: "policy.optimizer.kwargs.fused", Class: Ignored, Why: "how torch runs AdamW; the update is the same"},
	{Key: "policy.optimizer.kwargs.exp_avg_dtype", Class: Used},
	{Key: "policy.optimizer.kwargs.exp_avg_sq_dtype", Class: Used},
	{Key: "policy.optimizer.kwargs.master_weights", Class: Refused, Neutral: oneOf("true"), Example: "false",
		Why: "false updates reduced-precision weights in place; tracegrpo keeps float32 master weights (true is what it does)"},
	{Key: "policy.optimizer.kwargs.store_param_remainders", Class: Ignored, Why: "how FusedAdam stores its float32 master weights (exactly); the update is the same"},
	{Key: "policy.scheduler.name", Class: Used},
	{Key: "policy.scheduler.milestones", Class: Used},
	{Key: "policy.scheduler.kwargs.start_factor", Class: Used},
	{Key: "policy.scheduler.kwargs.end_factor", Class: Used},
	{Key: "policy.scheduler.kwargs.factor", Class: Used},
	{Key: "policy.scheduler.kwargs.total_iters", Class: Used},
	{Key: "policy.scheduler.kwargs", Class: Refused, Neutral: nullOr(), Example: "0.1",
		Why: "an argument of a learning-rate scheduler tracegrpo does not implement (it implements LinearLR and ConstantLR)"},

	// policy.generation: sampling. Rollouts come from NeMo Gym's captures (or the built-in sampler).
	{Key: "policy.generation.temperature", Class: Used},
	{Key: "policy.generation.top_p", Class: Used},
	{Key: "policy.generation.top_k", Class: Used},
	{Key: "policy.generation.max_new_tokens", Class: Used},
	{Key: "policy.generation.weights_out", Class: Used},
	{Key: "policy.generation.weights_dtype", Class: Used},
	{Key: "policy.generation.weights_keep", Class: Used},
	{Key: "policy.generation", Class: Ignored, Why: "the generation engine (backend, vLLM/SGLang/TRT-LLM/Dynamo/Megatron settings, refit, ports, stop conditions, validation sampling): NeMo Gym's rollouts were sampled outside tracegrpo, which trains the tokens and logprobs they recorded"},

	// policy.dtensor_cfg: NeMo RL's DTensor (FSDP2) engine.
	{Key: "policy.dtensor_cfg.activation_checkpointing", Class: Used},
	{Key: "policy.dtensor_cfg.enabled", Class: Used},
	{Key: "policy.dtensor_cfg.lora_cfg", Class: Refused, Neutral: disabled(), Example: "{enabled: true, dim: 8, alpha: 32}",
		Why: "LoRA adapters train low-rank updates instead of the weights; tracegrpo trains every parameter"},
	{Key: "policy.dtensor_cfg.automodel_kwargs.freeze_config.freeze_language_model", Class: Refused, Neutral: falseOr(), Example: "true",
		Why: "freezes the language model; tracegrpo trains every parameter"},
	{Key: "policy.dtensor_cfg.automodel_kwargs.freeze_config", Class: Ignored, Why: "freezing of multimodal towers; tracegrpo trains text models (policy.is_vlm is refused)"},
	{Key: "policy.dtensor_cfg.automodel_kwargs.backend.fake_balanced_gate", Class: Refused, MoEOnly: true, Neutral: falseOr(), Example: "true",
		Why: "replaces MoE routing by a fake balanced gate (for testing)"},
	{Key: "policy.dtensor_cfg.automodel_kwargs.backend.gate_precision", Class: Refused, MoEOnly: true, Neutral: nullOr(), Example: "float64",
		Why: "the precision of MoE gates: tracegrpo's router GEMM runs in the policy's precision (its softmax and top-k in float64)"},
	{Key: "policy.dtensor_cfg.automodel_kwargs", Class: Ignored, Why: "kernels and implementation of NeMo Automodel (attention, linear, norm, MoE dispatch backends, Liger, HF fallback); the math is the model's"},
	{Key: "policy.dtensor_cfg.moe_parallelizer.lm_head_precision", Class: Refused, Neutral: nullOr("float32", "torch.float32"), Example: "bfloat16",
		Why: "computes the LM head in another precision; tracegrpo's LM head accumulates in float32"},
	{Key: "policy.dtensor_cfg", Class: Ignored, Why: "the DTensor engine's layout (_v2, tensor/context/expert/sequence parallel sizes, FSDP options, CPU offload, MoE parallelizer, environment): tracegrpo runs data parallel over cluster.num_nodes × gpus_per_node ranks, fully sharded when dtensor_cfg.enabled (or --shard full), and train plan checks that it fits"},

	// policy.megatron_cfg: NeMo RL's Megatron engine.
	{Key: "policy.megatron_cfg.enabled", Class: Used},
	{Key: "policy.megatron_cfg.activation_checkpointing", Class: Used},
	{Key: "policy.megatron_cfg.optimizer.optimizer", Class: Used},
	{Key: "policy.megatron_cfg.optimizer.lr", Class: Used},
	{Key: "policy.megatron_cfg.optimizer.min_lr", Class: Used},
	{Key: "policy.megatron_cfg.optimizer.weight_decay", Class: Used},
	{Key: "policy.megatron_cfg.optimizer.adam_beta1", Class: Used},
	{Key: "policy.megatron_cfg.optimizer.adam_beta2", Class: Used},
	{Key: "policy.megatron_cfg.optimizer.adam_eps", Class: Used},
	{Key: "policy.megatron_cfg.optimizer.clip_grad", Class: Used},
	{Key: "policy.megatron_cfg.optimizer.fp16", Class: Refused, Neutral: falseOr(), Example: "true",
		Why: "fp16 training with loss scaling; tracegrpo trains in float32 or bfloat16 (policy.precision)"},
	{Key: "policy.megatron_cfg.optimizer.params_dtype", Class: Refused, Neutral: nullOr("float32", "torch.float32", "fp32"), Example: "bfloat16",
		Why: "keeps the optimizer's parameters in reduced precision; tracegrpo keeps float32 master weights"},
	{Key: "policy.megatron_cfg.optimizer.bf16", Class: Ignored, Why: "Megatron's bf16 flag; tracegrpo's precision is policy.precision"},
	{Key: "policy.megatron_cfg.optimizer.sgd_momentum", Class: Ignored, Why: "a knob of SGD; megatron_cfg.optimizer.optimizer other than adam is refused"},
	{Key: "policy.megatron_cfg.optimizer.use_distributed_optimizer", Class: Used},
	{Key: "policy.megatron_cfg.optimizer.use_precision_aware_optimizer", Class: Ignored, Why: "Megatron's precision-aware optimizer with its default float32 states; the update is the same"},
	{Key: "policy.megatron_cfg.optimizer.optimizer_cpu_offload", Class: Ignored, Why: "memory placement of the optimizer state"},
	{Key: "policy.megatron_cfg.optimizer.optimizer_offload_fraction", Class: Ignored, Why: "memory placement of the optimizer state"},
	{Key: "policy.megatron_cfg.optimizer.overlap_cpu_optimizer_d2h_h2d", Class: Ignored, Why: "memory placement of the optimizer state"},
	{Key: "policy.megatron_cfg.optimizer.loss_scale", Class: Ignored, Why: "fp16 loss scaling; fp16 is refused"},
	{Key: "policy.megatron_cfg.optimizer.initial_loss_scale", Class: Ignored, Why: "fp16 loss scaling; fp16 is refused"},
	{Key: "policy.megatron_cfg.optimizer.min_loss_scale", Class: Ignored, Why: "fp16 loss scaling; fp16 is refused"},
	{Key: "policy.megatron_cfg.optimizer.loss_scale_window", Class: Ignored, Why: "fp16 loss scaling; fp16 is refused"},
	{Key: "policy.megatron_cfg.optimizer.hysteresis", Class: Ignored, Why: "fp16 loss scaling; fp16 is refused"},
	{Key: "policy.megatron_cfg.scheduler.start_weight_decay", Class: Used},
	{Key: "policy.megatron_cfg.scheduler.end_weight_decay", Class: Used},
	{Key: "policy.megatron_cfg.scheduler.weight_decay_incr_style", Class: Used},
	{Key: "policy.megatron_cfg.scheduler.lr_decay_style", Class: Used},
	{Key: "policy.megatron_cfg.scheduler.lr_decay_iters", Class: Used},
	{Key: "policy.megatron_cfg.scheduler.lr_warmup_iters", Class: Used},
	{Key: "policy.megatron_cfg.scheduler.lr_warmup_init", Class: Used},
	{Key: "policy.megatron_cfg.scheduler.override_opt_param_scheduler", Class: Ignored, Why: "how Megatron restores its scheduler from a checkpoint; tracegrpo's checkpoints hold the step count"},
	{Key: "policy.megatron_cfg.scheduler.use_checkpoint_opt_param_scheduler", Class: Ignored, Why: "how Megatron restores its scheduler from a checkpoint; tracegrpo's checkpoints hold the step count"},
	{Key: "policy.megatron_cfg.train_iters", Class: Ignored, Overwritten: "nemo_rl/algorithms/grpo.py",
		Why: "NeMo RL's GRPO setup overwrites it before the policy sees it (nemo_rl/algorithms/grpo.py sets it to min(grpo.max_num_steps, grpo.max_num_epochs × the samples), \"the total number of scheduler steps\"), so the recipe's value has no effect; tracegrpo's schedules count grpo.max_num_steps"},
	{Key: "policy.megatron_cfg.peft", Class: Refused, Neutral: disabled(), Example: "{enabled: true, dim: 8, alpha: 32}",
		Why: "LoRA adapters train low-rank updates instead of the weights; tracegrpo trains every parameter"},
	{Key: "policy.megatron_cfg.fp8_cfg", Class: Refused, Neutral: disabled(), Example: "{enabled: true, fp8: e4m3, fp8_recipe: blockwise}",
		Why: "FP8 training; tracegrpo trains in float32 or bfloat16 (policy.precision)"},
	{Key: "policy.megatron_cfg.first_last_layers_bf16", Class: Ignored, Why: "a knob of FP8 training, which is refused when policy.megatron_cfg.fp8_cfg.enabled"},
	{Key: "policy.megatron_cfg.num_layers_at_start_in_bf16", Class: Ignored, Why: "a knob of FP8 training, which is refused when policy.megatron_cfg.fp8_cfg.enabled"},
	{Key: "policy.megatron_cfg.num_layers_at_end_in_bf16", Class: Ignored, Why: "a knob of FP8 training, which is refused when policy.megatron_cfg.fp8_cfg.enabled"},
	{Key: "policy.megatron_cfg.model_overrides", Class: Refused, Neutral: emptyOrNull(), Example: "{num_layers: 2}",
		Why: "patches Megatron's model provider (Megatron's field names); the Hugging Face config is patched with policy.hf_config_overrides"},
	// The MoE router (sparse models; no effect on a dense one).
	{Key: "policy.megatron_cfg.freeze_moe_router", Class: Used},
	{Key: "policy.megatron_cfg.moe_router_dtype", Class: Refused, MoEOnly: true, Neutral: nullOr("fp64", "fp32"), Example: "bf16",
		Why: "a router in bf16 or fp16: tracegrpo's router takes its softmax and top-k in float64 (fp32 and fp64 are honoured)"},
	{Key: "policy.megatron_cfg.moe_router_load_balancing_type", Class: Refused, MoEOnly: true, Neutral: nullOr("none"), Example: "aux_loss",
		Why: "Megatron's load-balancing losses (aux_loss, seq_aux_loss, global_aux_loss) and Sinkhorn routing are not implemented; the load-balancing loss tracegrpo implements is transformers', switched on by the model's output_router_logits (policy.hf_config_overrides)"},
	// Aux-loss-free load balancing: used with a selection bias (Nemotron-H's
	// routers), refused by name on a sparse model without one (trainer's
	// CheckFor).
	{Key: "policy.megatron_cfg.moe_router_bias_update_rate", Class: Used},
	{Key: "policy.megatron_cfg.moe_router_enable_expert_bias", Class: Used},
	{Key: "policy.megatron_cfg.moe_aux_loss_coeff", Class: Refused, MoEOnly: true, Neutral: zeroOr(), Example: "0.001",
		Why: "the coefficient of Megatron's load-balancing losses, which are not implemented (see moe_router_load_balancing_type)"},
	{Key: "policy.megatron_cfg.moe_router_num_groups", Class: Refused, MoEOnly: true, Neutral: nullOr(), Example: "8",
		Why: "group-limited MoE routing (DeepSeek-V3's) is not implemented"},
	{Key: "policy.megatron_cfg.moe_router_group_topk", Class: Refused, MoEOnly: true, Neutral: nullOr(), Example: "4",
		Why: "group-limited MoE routing (DeepSeek-V3's) is not implemented"},
	{Key: "policy.megatron_cfg.mtp_num_layers", Class: Used},
	{Key: "policy.megatron_cfg.mtp_loss_scaling_factor", Class: Used},
	{Key: "policy.megatron_cfg.mtp_use_repeated_layer", Class: Used},
	{Key: "policy.megatron_cfg.mtp_detach_heads", Class: Used},
	{Key: "policy.megatron_cfg.freeze_config.freeze_language_model", Class: Refused, Neutral: falseOr(), Example: "true",
		Why: "freezes the language model; tracegrpo trains every parameter"},
	{Key: "policy.megatron_cfg.freeze_config", Class: Ignored, Why: "freezing of multimodal towers; tracegrpo trains text models (policy.is_vlm is refused)"},
	{Key: "policy.megatron_cfg.freeze_vision_model", Class: Ignored, Why: "a multimodal tower; tracegrpo trains text models (policy.is_vlm is refused)"},
	{Key: "policy.megatron_cfg.freeze_vision_projection", Class: Ignored, Why: "a multimodal tower; tracegrpo trains text models (policy.is_vlm is refused)"},
	{Key: "policy.megatron_cfg.freeze_sound_encoder", Class: Ignored, Why: "a multimodal tower; tracegrpo trains text models (policy.is_vlm is refused)"},
	{Key: "policy.megatron_cfg.freeze_sound_projection", Class: Ignored, Why: "a multimodal tower; tracegrpo trains text models (policy.is_vlm is refused)"},
	{Key: "policy.megatron_cfg.radio_force_cpe_eval_mode", Class: Ignored, Why: "a multimodal tower; tracegrpo trains text models (policy.is_vlm is refused)"},
	{Key: "policy.megatron_cfg.calculate_per_token_loss", Class: Ignored, Why: "how Megatron scales the loss NeMo RL hands it across its parallel groups; tracegrpo normalizes by the step's eligible tokens (spec §6)"},
	{Key: "policy.megatron_cfg.scale_loss_by_dp_cp_size", Class: Ignored, Why: "how Megatron scales the loss NeMo RL hands it across its parallel groups; tracegrpo normalizes by the step's eligible tokens (spec §6)"},
	{Key: "policy.megatron_cfg.do_not_average_loss", Class: Ignored, Why: "how Megatron scales the loss NeMo RL hands it across its parallel groups; tracegrpo normalizes by the step's eligible tokens (spec §6)"},
	{Key: "policy.megatron_cfg.cp_normalize", Class: Ignored, Why: "how Megatron scales the loss NeMo RL hands it across its parallel groups; tracegrpo normalizes by the step's eligible tokens (spec §6)"},
	{Key: "policy.megatron_cfg", Class: Ignored, Why: "the Megatron engine's layout and kernels (tensor/pipeline/context/expert parallel sizes, sequence parallel, fusions, CUDA graphs, recompute and offload options, MoE dispatch, checkpoint format, DDP options, environment): tracegrpo runs data parallel over cluster.num_nodes × gpus_per_node ranks, with the whole model on each unless --shard full shards it, and train plan checks that it fits"},

	// checkpointing.
	{Key: "checkpointing.enabled", Class: Used},
	{Key: "checkpointing.checkpoint_dir", Class: Used},
	{Key: "checkpointing.save_period", Class: Used},
	{Key: "checkpointing.keep_top_k", Class: Used},
	{Key: "checkpointing.save_optimizer", Class: Used},
	{Key: "checkpointing", Class: Ignored, KnownOnly: true, Why: "checkpoint extras of NeMo RL (best-checkpoint metric, save deadline, formats, async saving, fault-tolerance saves, PEFT, model cache); tracegrpo keeps the newest keep_top_k checkpoints in its own format"},

	// env: NeMo Gym's capture settings; other environments.
	{Key: "env.should_use_nemo_gym", Class: Ignored, Why: "NeMo RL's switch to run NeMo Gym; tracegrpo always trains on Gym's captures (or the built-in job's, recorded in Gym's format)"},
	{Key: "env.should_mask_flagged_samples", Class: Used},
	{Key: "env.nemo_gym.token_id_capture.enabled", Class: Refused, Guard: true, Example: "false",
		Why: "multi-trace GRPO trains the token IDs Gym captures; with capture off there are none (true is the opt-in)"},
	{Key: "env.nemo_gym.token_id_capture.all_agents", Class: Refused, Guard: true, Example: "false",
		Why: "multi-trace GRPO trains every agent's calls; with all_agents false Gym captures the main agent's only, and the other traces of a rollout would be missing (true is the opt-in)"},
	{Key: "env.nemo_gym.token_id_capture.delivery", Class: Used},
	{Key: "env.nemo_gym.token_id_capture.builder", Class: Used},
	{Key: "env.nemo_gym.token_id_capture.dir", Class: Used},
	{Key: "env.nemo_gym.token_id_capture.sink", Class: Used},
	{Key: "env.nemo_gym.token_id_capture.external_staging", Class: Used},
	{Key: "env.nemo_gym.token_id_capture.sink_kwargs", Class: Ignored, Why: "Gym's capture settings that do not change what is trained (spec §2.6)"},
	{Key: "env.nemo_gym.token_id_capture.lineage_store", Class: Ignored, Why: "Gym's capture settings that do not change what is trained (spec §2.6)"},
	{Key: "env.nemo_gym.token_id_capture.lineage_store_kwargs", Class: Ignored, Why: "Gym's capture settings that do not change what is trained (spec §2.6)"},
	{Key: "env.nemo_gym.token_id_capture.rebuild_response", Class: Ignored, Why: "Gym's capture settings that do not change what is trained (spec §2.6)"},
	{Key: "env.nemo_gym.token_id_capture.allow_unresolved_continuations", Class: Ignored, Why: "Gym's capture settings that do not change what is trained (spec §2.6)"},
	{Key: "env.nemo_gym.token_id_capture.delta_records", Class: Ignored, Why: "Gym's capture settings that do not change what is trained (spec §2.6)"},
	{Key: "env.nemo_gym.token_id_capture.max_mask_fraction", Class: Ignored, Why: "Gym's capture settings that do not change what is trained (spec §2.6)"},
	{Key: "env.nemo_gym.token_id_capture.mask_fraction_min_samples", Class: Ignored, Why: "Gym's capture settings that do not change what is trained (spec §2.6)"},
	{Key: "env.nemo_gym.token_id_capture.external_staging_backend", Class: Ignored, Why: "Gym's capture settings that do not change what is trained (spec §2.6)"},
	{Key: "env.nemo_gym.token_id_capture.control_auth_token_env", Class: Ignored, Why: "Gym's capture settings that do not change what is trained (spec §2.6)"},
	{Key: "env.nemo_gym.token_id_capture.mask_incomplete_when_attributed", Class: Ignored, Why: "Gym's capture settings that do not change what is trained (spec §2.6)"},
	{Key: "env.nemo_gym", Class: Ignored, Why: "NeMo Gym's servers, agents and ports: Gym runs them and records the rollouts tracegrpo trains on"},
	{Key: "env.should_log_nemo_gym_responses", Class: Ignored, Why: "NeMo RL's logging of Gym responses"},
	{Key: "env.*", Class: Ignored, MappingOnly: true, Why: "an environment tracegrpo does not run (rewards come from NeMo Gym's rollouts)"},

	// cluster.
	{Key: "cluster.gpus_per_node", Class: Used},
	{Key: "cluster.num_nodes", Class: Used},
	{Key: "cluster.master_port_range_low", Class: Ignored, Why: "Ray's rendezvous ports; tracegrpo's launcher (torchrun, srun, mpirun) sets them"},
	{Key: "cluster.master_port_range_high", Class: Ignored, Why: "Ray's rendezvous ports; tracegrpo's launcher (torchrun, srun, mpirun) sets them"},
	{Key: "cluster.segment_size", Class: Ignored, Why: "Ray's NVLink-domain placement"},

	// The asynchronous data plane and the single-controller runner.
	{Key: "data_plane.enabled", Class: Refused, Guard: true, Example: "true",
		Why: "NeMo RL's asynchronous data plane"},
	{Key: "data_plane", Class: Ignored, KnownOnly: true, Why: "knobs of the data plane, which is refused when data_plane.enabled"},
	{Key: "async_rl.sampler.max_lookahead_versions", Class: Refused, Neutral: zeroOr(), Example: "1",
		Why: "lets generation run ahead of the trainer, so a step trains rollouts of older policies"},
	{Key: "async_rl.sampler.max_staleness_versions", Class: Refused, Neutral: zeroOr(), Example: "1",
		Why: "trains rollouts up to this many policy versions old"},
	{Key: "async_rl", Class: Ignored, KnownOnly: true, Why: "the single-controller runner's buffering, health checks, routing and failure policy"},

	// Data, logging and files of NeMo RL's own services.
	{Key: "data", Class: Ignored, KnownOnly: true, Why: "data sets, prompts and processors: NeMo Gym serves the rollouts tracegrpo trains on"},
	{Key: "logger.log_dir", Class: Used},
	{Key: "logger.tensorboard_enabled", Class: Used},
	{Key: "logger", Class: Ignored, KnownOnly: true, Why: "NeMo RL's other logger back ends (W&B, MLflow, SwanLab, GPU monitoring); tracegrpo writes metrics.jsonl and, with tensorboard_enabled, TensorBoard event files, and says at start which enabled back end it does not write"},
	{Key: "sif_dir", Class: Ignored, Why: "a container image directory of NeMo RL's launch scripts"},
}

// quietSections carry no training math: an unclassified key there is a
// warning. See ForwardCompatible.
var quietSections = []string{"cluster", "checkpointing", "data_plane", "async_rl", "logger", "data"}

// ForwardCompatible is the rule for a key in no class (a key NeMo RL added
// after the commit gen_nemorl_keys.tsv records, or a typo). In a section that
// carries no training math (cluster, checkpointing, data_plane, async_rl,
// logger, data) it is a warning: the key is accepted, listed by train config
// and at the start of train, and not used. Anywhere else (the top level,
// grpo, loss_fn, policy, env, reward_penalties, ...) it may change the math,
// and it is an error naming the nearest known key. It reports whether key
// path p is an error. (Keys under an Ignored subtree, such as
// policy.generation.vllm_cfg, are classified by the subtree and never reach
// this rule.)
func ForwardCompatible(p string) (isError bool) {
	segs := splitPath(normPath(p))
	if len(segs) <= 1 {
		return true
	}
	for _, s := range quietSections {
		if segs[0] == s {
			return false
		}
	}
	return true
}

// Neutral is the set of values of a Refused key that ask for nothing
// tracegrpo lacks.
type Neutral struct {
	// Desc says which values are neutral, for train config and errors.
	Desc string
	ok   func(v, root *yaml.Node) bool
}

// Accepts reports whether v (the key's value; root is the whole resolved
// recipe) is neutral.
func (n *Neutral) Accepts(v, root *yaml.Node) bool { return n != nil && n.ok(v, root) }

func isNull(v *yaml.Node) bool { return v == nil || v.Kind == yaml.ScalarNode && v.Tag == "!!null" }

func boolValue(v *yaml.Node) (b, ok bool) {
	if v == nil || v.Kind != yaml.ScalarNode || v.Tag != "!!bool" {
		return false, false
	}
	b, err := strconv.ParseBool(v.Value)
	return b, err == nil
}

func numberValue(v *yaml.Node) (float64, bool) {
	if v == nil || v.Kind != yaml.ScalarNode || (v.Tag != "!!int" && v.Tag != "!!float") {
		return 0, false
	}
	f, err := parseYAMLFloat(v.Value)
	return f, err == nil
}

// nullOr: null, or one of the given scalars (compared as text).
func nullOr(vals ...string) *Neutral {
	desc := "null"
	if len(vals) > 0 {
		desc += " or " + strings.Join(vals, ", ")
	}
	return &Neutral{desc, func(v, _ *yaml.Node) bool {
		if isNull(v) {
			return true
		}
		if v.Kind != yaml.ScalarNode {
			return false
		}
		for _, s := range vals {
			if v.Value == s {
				return true
			}
		}
		return false
	}}
}

// oneOf: one of the given scalars (compared as text), or null (the key's
// default is what tracegrpo does).
func oneOf(vals ...string) *Neutral {
	n := nullOr(vals...)
	n.Desc = strings.Join(vals, ", ") + " or null"
	return n
}

func falseOr() *Neutral {
	return &Neutral{"false or null", func(v, _ *yaml.Node) bool {
		b, ok := boolValue(v)
		return isNull(v) || ok && !b
	}}
}

func zeroOr() *Neutral {
	return &Neutral{"0 or null", func(v, _ *yaml.Node) bool {
		f, ok := numberValue(v)
		return isNull(v) || ok && f == 0
	}}
}

func emptyOrNull() *Neutral {
	return &Neutral{"{}, [] or null", func(v, _ *yaml.Node) bool {
		return isNull(v) || (v.Kind == yaml.MappingNode || v.Kind == yaml.SequenceNode) && len(v.Content) == 0
	}}
}

// disabled: null, false, or a mapping whose enabled is false.
func disabled() *Neutral {
	return &Neutral{"null or a block with enabled: false", func(v, _ *yaml.Node) bool {
		if b, ok := boolValue(v); isNull(v) || ok && !b {
			return true
		}
		if v.Kind != yaml.MappingNode {
			return false
		}
		j := mapIndex(v, "enabled")
		if j < 0 {
			return false
		}
		b, ok := boolValue(v.Content[j+1])
		return ok && !b
	}}
}

// inertUnlessEstimator: any value while grpo.adv_estimator.name is not est
// (the key is read only by that estimator).
func inertUnlessEstimator(est string) *Neutral {
	return &Neutral{"any value unless grpo.adv_estimator.name is " + est, func(v, root *yaml.Node) bool {
		name := lookup(root, splitPath("grpo.adv_estimator.name"))
		return name == nil || name.Value != est
	}}
}

// skipRefNeutral: false or null, or true while the KL penalty is 0 (the
// reference policy is not needed then).
func skipRefNeutral() *Neutral {
	return &Neutral{"false or null, or true with loss_fn.reference_policy_kl_penalty 0", func(v, root *yaml.Node) bool {
		b, ok := boolValue(v)
		if isNull(v) || ok && !b {
			return true
		}
		beta, ok := numberValue(lookup(root, splitPath("loss_fn.reference_policy_kl_penalty")))
		return ok && beta == 0
	}}
}

// parseYAMLFloat parses a canonical !!int or !!float value.
func parseYAMLFloat(s string) (float64, error) {
	switch strings.ToLower(s) {
	case ".inf", "+.inf":
		return math.Inf(1), nil
	case "-.inf":
		return math.Inf(-1), nil
	case ".nan":
		return math.NaN(), nil
	}
	return strconv.ParseFloat(s, 64)
}

// indexedRule is a rule with its key split into segments once.
type indexedRule struct {
	r    *KeyRule
	segs []string
}

// ruleIndex holds keyRules by their first segment.
var ruleIndex = func() map[string][]indexedRule {
	m := map[string][]indexedRule{}
	for i := range keyRules {
		r := &keyRules[i]
		segs := splitPath(r.Key)
		m[segs[0]] = append(m[segs[0]], indexedRule{r, segs})
	}
	return m
}()

// matchRule reports whether rule key pattern pat covers path segments segs
// (pat equal to segs or a prefix of them), and how specifically: the number
// of segments it names, literal ones counting twice.
func matchRule(pat []string, segs []string) (score int, ok bool) {
	if len(pat) > len(segs) {
		return 0, false
	}
	for i, s := range pat {
		switch s {
		case "*":
			score++
		case segs[i]:
			score += 2
		default:
			return 0, false
		}
	}
	return score, true
}

// ruleFor is the most specific rule covering key path p (list indices
// dropped), or nil. v is the key's value (for MappingOnly rules; may be nil).
func ruleFor(p string, v *yaml.Node) *KeyRule {
	np := normPath(p)
	r := tableRule(np, v)
	if r == nil || r.Class != Used {
		if nr := neverRead(np, r); nr != nil {
			return nr
		}
	}
	if r != nil && r.KnownOnly && np != r.Key && !knownToNeMoRL(np) {
		return nil
	}
	return r
}

// tableRule is the key table's most specific rule covering normalized key
// path np, or nil.
func tableRule(np string, v *yaml.Node) *KeyRule {
	segs := splitPath(np)
	var best *KeyRule
	bestScore := -1
	for _, first := range []string{segs[0], "*"} {
		for _, ir := range ruleIndex[first] {
			if ir.r.MappingOnly && (v == nil || v.Kind != yaml.MappingNode || len(ir.segs) != len(segs)) {
				continue
			}
			if sc, ok := matchRule(ir.segs, segs); ok && sc > bestScore {
				best, bestScore = ir.r, sc
			}
		}
	}
	return best
}

// rulesBeneath reports whether some rule names a key strictly under p.
func rulesBeneath(p string) bool {
	segs := splitPath(normPath(p))
	for _, first := range []string{segs[0], "*"} {
		for _, ir := range ruleIndex[first] {
			if len(ir.segs) <= len(segs) {
				continue
			}
			if _, ok := matchRule(ir.segs[:len(segs)], segs); ok {
				return true
			}
		}
	}
	return false
}

// Classify is the class of key path p (list indices allowed or dropped) as
// loading decides it, walking down from the top: a key Config types is Used
// (or refused by a guard, as its rule says), and so is everything under a
// typed mapping such as policy.hf_config_overrides; a section with more
// specific rules is classified key by key; otherwise the most specific rule
// covering the first untyped key on the way decides, for that key and all
// under it. at is the key path that decided. isMapping says which paths hold
// mappings (nil: none), for rules such as "env.*".
func Classify(p string, isMapping func(string) bool) (cls Class, r *KeyRule, at string) {
	segs := splitPath(normPath(p))
	for i := 1; i <= len(segs); i++ {
		q := strings.Join(segs[:i], ".")
		if t := normSchemaType(q); t != nil {
			if t.Kind() == reflect.Map || i == len(segs) {
				if r := ruleFor(q, nil); r != nil && r.Key == q {
					return r.Class, r, q
				}
				return Used, nil, q
			}
			continue
		}
		mapping := isMapping != nil && isMapping(q)
		if i < len(segs) && rulesBeneath(q) {
			continue
		}
		var v *yaml.Node
		if mapping || i < len(segs) {
			v = &yaml.Node{Kind: yaml.MappingNode}
		}
		if r := ruleFor(q, v); r != nil {
			return r.Class, r, q
		}
		if i == len(segs) && mapping && rulesBeneath(q) {
			return Unclassified, nil, q // a section: its keys have rules
		}
		return Unclassified, nil, q
	}
	return Unclassified, nil, p
}

// normSchemaType is the Go type Config gives key path p with list indices
// dropped (a list of structs stands for its elements), or nil.
func normSchemaType(p string) reflect.Type {
	t := reflect.TypeOf(Config{})
	for _, seg := range splitPath(p) {
		for t.Kind() == reflect.Pointer || t.Kind() == reflect.Slice && t.Elem().Kind() == reflect.Struct {
			t = t.Elem()
		}
		if t.Kind() != reflect.Struct {
			return nil
		}
		fi, ok := fieldsOf(t)[seg]
		if !ok {
			return nil
		}
		t = t.Field(fi).Type
	}
	for t.Kind() == reflect.Pointer {
		t = t.Elem()
	}
	return t
}

// Rules returns the key class table (a copy), for train config --keys and
// the tests.
func Rules() []KeyRule { return append([]KeyRule(nil), keyRules...) }
