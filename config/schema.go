package config

// Config is the typed part of a NeMo RL GRPO recipe: every key tracegrpo reads.
// Field tags are NeMo RL's key names. Nullable keys are pointers (nil = null).
type Config struct {
	GRPO          GRPO          `yaml:"grpo"`
	LossFn        LossFn        `yaml:"loss_fn"`
	Policy        Policy        `yaml:"policy"`
	Checkpointing Checkpointing `yaml:"checkpointing"`
	Env           Env           `yaml:"env"`
	Cluster       Cluster       `yaml:"cluster"`
	Logger        Logger        `yaml:"logger"`
	// DataPlane is NeMo RL's asynchronous data plane; multi-trace requires it
	// null or disabled.
	DataPlane *Toggle `yaml:"data_plane"`
}

// Toggle is a block of which tracegrpo reads only `enabled`; its other keys are
// accepted and ignored.
type Toggle struct {
	Enabled bool `yaml:"enabled"`
}

// GRPO is the `grpo:` block.
type GRPO struct {
	NumPromptsPerStep       int   `yaml:"num_prompts_per_step"`
	NumGenerationsPerPrompt int   `yaml:"num_generations_per_prompt"`
	MaxNumSteps             int   `yaml:"max_num_steps"`
	GymMultiTrace           bool  `yaml:"gym_multi_trace"`
	Seed                    int64 `yaml:"seed"`
	// NormalizeRewards and UseLeaveOneOutBaseline are the legacy top-level keys;
	// when a recipe has no adv_estimator block they also configure the estimator.
	NormalizeRewards       bool         `yaml:"normalize_rewards"`
	UseLeaveOneOutBaseline bool         `yaml:"use_leave_one_out_baseline"`
	AdvEstimator           AdvEstimator `yaml:"adv_estimator"`
	AdvantageClipLow       *float64     `yaml:"advantage_clip_low"`
	AdvantageClipHigh      *float64     `yaml:"advantage_clip_high"`

	// Keys typed only so that the capability guards can refuse them.
	AsyncGRPO                  Toggle   `yaml:"async_grpo"`
	UseDynamicSampling         bool     `yaml:"use_dynamic_sampling"`
	SeqLogprobErrorThreshold   *float64 `yaml:"seq_logprob_error_threshold"`
	OverlongFiltering          bool     `yaml:"overlong_filtering"`
	RewardShaping              Toggle   `yaml:"reward_shaping"`
	RewardScaling              Toggle   `yaml:"reward_scaling"`
	InvalidToolCallAdvantage   *float64 `yaml:"invalid_tool_call_advantage"`
	MalformedThinkingAdvantage *float64 `yaml:"malformed_thinking_advantage"`
}

// AdvEstimator is `grpo.adv_estimator`.
type AdvEstimator struct {
	Name                   string `yaml:"name"`
	NormalizeRewards       bool   `yaml:"normalize_rewards"`
	UseLeaveOneOutBaseline bool   `yaml:"use_leave_one_out_baseline"`
}

// LossFn is `loss_fn:` (NeMo RL's ClippedPGLossConfig, spec §6.1).
type LossFn struct {
	ReferencePolicyKLPenalty            float64  `yaml:"reference_policy_kl_penalty"`
	ReferencePolicyKLType               string   `yaml:"reference_policy_kl_type"`
	KLInputClampValue                   *float64 `yaml:"kl_input_clamp_value"`
	KLOutputClampValue                  *float64 `yaml:"kl_output_clamp_value"`
	RatioClipMin                        float64  `yaml:"ratio_clip_min"`
	RatioClipMax                        float64  `yaml:"ratio_clip_max"`
	RatioClipC                          *float64 `yaml:"ratio_clip_c"`
	UseOnPolicyKLApproximation          bool     `yaml:"use_on_policy_kl_approximation"`
	UseImportanceSamplingCorrection     bool     `yaml:"use_importance_sampling_correction"`
	TruncatedImportanceSamplingType     *string  `yaml:"truncated_importance_sampling_type"`
	TruncatedImportanceSamplingRatio    *float64 `yaml:"truncated_importance_sampling_ratio"`
	TruncatedImportanceSamplingRatioMin *float64 `yaml:"truncated_importance_sampling_ratio_min"`
	TokenLevelLoss                      bool     `yaml:"token_level_loss"`
	SequenceLevelImportanceRatios       bool     `yaml:"sequence_level_importance_ratios"`
	ForceOnPolicyRatio                  bool     `yaml:"force_on_policy_ratio"`
	DisablePPORatio                     bool     `yaml:"disable_ppo_ratio"`
	UseCISPO                            bool     `yaml:"use_cispo"`
	UseKLInReward                       bool     `yaml:"use_kl_in_reward"`
	PositiveExampleNLLWeight            float64  `yaml:"positive_example_nll_weight"`
}

// OptionalString is a string a recipe may leave null (a launcher fills it
// in): null reads as "" and "" prints as null.
type OptionalString string

// MarshalYAML writes "" as null.
func (s OptionalString) MarshalYAML() (any, error) {
	if s == "" {
		return nil, nil
	}
	return string(s), nil
}

// Policy is `policy:`.
type Policy struct {
	// ModelName is the model: tracegrpo's built-in one, or a directory with
	// a Hugging Face config.json. null (some recipes leave it to their
	// launcher) needs --init-from.
	ModelName              OptionalString `yaml:"model_name"`
	TrainGlobalBatchSize   int            `yaml:"train_global_batch_size"`
	TrainMicroBatchSize    int            `yaml:"train_micro_batch_size"`
	MaxTotalSequenceLength int            `yaml:"max_total_sequence_length"`
	MaxGradNorm            *float64       `yaml:"max_grad_norm"`
	Precision              string         `yaml:"precision"`
	IsVLM                  bool           `yaml:"is_vlm"`
	RouterReplay           Toggle         `yaml:"router_replay"`
	DtensorCfg             DtensorCfg     `yaml:"dtensor_cfg"`
	MegatronCfg            MegatronCfg    `yaml:"megatron_cfg"`
	// Optimizer is the DTensor-path optimizer; null in Megatron recipes.
	Optimizer *TorchOptimizer `yaml:"optimizer"`
	// Scheduler is the DTensor-path schedule: torch schedulers and, when there
	// are several, one entry holding only milestones (SequentialLR). null and
	// [] both mean a constant learning rate, and each prints as written.
	Scheduler  Schedulers `yaml:"scheduler"`
	Generation Generation `yaml:"generation"`
	// HFConfigOverrides patches the model's Hugging Face config.json, key by
	// key at its top level (as NeMo RL passes it to AutoConfig.from_pretrained):
	// a key here replaces the file's value. Empty and null mean none.
	HFConfigOverrides map[string]any `yaml:"hf_config_overrides"`
	// SharedPrefix is tracegrpo's own key (NeMo RL has none like it):
	// "auto" packs each micro-batch's traces as a token trie, computing
	// every shared prefix once; "off" packs each trace as its own sequence.
	// The loss, its gradient and every metric are the same either way
	// (within floating-point summation order). See SharedPrefixOn.
	SharedPrefix string `yaml:"shared_prefix"`
}

// Schedulers is policy.scheduler. A nil list prints as null, an empty one
// as [].
type Schedulers []TorchScheduler

// MarshalYAML writes nil as null (yaml.v3 would write []).
func (s Schedulers) MarshalYAML() (any, error) {
	if s == nil {
		return nil, nil
	}
	return []TorchScheduler(s), nil
}

// DtensorCfg is `policy.dtensor_cfg`; tracegrpo reads only these keys (the
// parallelism and offload knobs are ignored). Enabled (with megatron_cfg
// not enabled) asks for FSDP2: on more than one rank the trainer then
// shards weights, gradients and optimizer state (trainer --shard).
type DtensorCfg struct {
	Enabled                 bool `yaml:"enabled"`
	ActivationCheckpointing bool `yaml:"activation_checkpointing"`
}

// MegatronCfg is `policy.megatron_cfg`; tracegrpo reads only these keys (the
// parallelism and fusion knobs are ignored).
type MegatronCfg struct {
	Enabled                 bool              `yaml:"enabled"`
	ActivationCheckpointing bool              `yaml:"activation_checkpointing"`
	Optimizer               MegatronOptimizer `yaml:"optimizer"`
	Scheduler               MegatronScheduler `yaml:"scheduler"`

	// FreezeMoERouter leaves a sparse model's routers untrained (NeMo RL's
	// Megatron default); read when Enabled.
	FreezeMoERouter bool `yaml:"freeze_moe_router,omitempty"`

	// Aux-loss-free load balancing (read when Enabled, for a model whose
	// routers have a selection bias: Nemotron-H's e_score_correction_bias):
	// once per step each bias moves by MoERouterBiasUpdateRate ·
	// sign(mean − count) from the tokens routed to its experts (0: the
	// biases stay as loaded). MoERouterEnableExpertBias is nil where the
	// recipe does not state it; NeMo RL's Megatron setup never reads it, and
	// Megatron-Bridge's Nemotron-H provider turns the expert bias on (the
	// trainer refuses false, and either key on a model without the bias).
	MoERouterEnableExpertBias *bool   `yaml:"moe_router_enable_expert_bias,omitempty"`
	MoERouterBiasUpdateRate   float64 `yaml:"moe_router_bias_update_rate,omitempty"`

	// Multi-token prediction (a Nemotron-H model's MTP blocks; read when
	// Enabled): nil where the recipe does not state the key, which NeMo
	// RL's _apply_mtp_config then leaves to Megatron-Bridge's provider
	// (the checkpoint's num_nextn_predict_layers, trainer/mtp.go).
	MTPNumLayers         *int     `yaml:"mtp_num_layers,omitempty"`
	MTPLossScalingFactor *float64 `yaml:"mtp_loss_scaling_factor,omitempty"`
	MTPUseRepeatedLayer  *bool    `yaml:"mtp_use_repeated_layer,omitempty"`
	MTPDetachHeads       *bool    `yaml:"mtp_detach_heads,omitempty"`
}

// MegatronOptimizer is `policy.megatron_cfg.optimizer`.
type MegatronOptimizer struct {
	Optimizer   string   `yaml:"optimizer"`
	LR          float64  `yaml:"lr"`
	MinLR       float64  `yaml:"min_lr"`
	WeightDecay float64  `yaml:"weight_decay"`
	AdamBeta1   float64  `yaml:"adam_beta1"`
	AdamBeta2   float64  `yaml:"adam_beta2"`
	AdamEps     float64  `yaml:"adam_eps"`
	ClipGrad    *float64 `yaml:"clip_grad"`
	// UseDistributedOptimizer is Megatron's distributed optimizer (ZeRO-1:
	// optimizer state sharded): tracegrpo does not build ZeRO-1, and the
	// trainer refuses it by name unless --shard chooses a mode.
	UseDistributedOptimizer bool `yaml:"use_distributed_optimizer"`
}

// MegatronScheduler is `policy.megatron_cfg.scheduler` (Megatron's
// OptimizerParamScheduler, counted in GRPO steps).
type MegatronScheduler struct {
	StartWeightDecay     *float64 `yaml:"start_weight_decay"`
	EndWeightDecay       *float64 `yaml:"end_weight_decay"`
	WeightDecayIncrStyle string   `yaml:"weight_decay_incr_style"`
	LRDecayStyle         string   `yaml:"lr_decay_style"`
	LRDecayIters         *int64   `yaml:"lr_decay_iters"`
	LRWarmupIters        int64    `yaml:"lr_warmup_iters"`
	LRWarmupInit         float64  `yaml:"lr_warmup_init"`
}

// TorchOptimizer is `policy.optimizer` (name + kwargs of a torch optimizer).
type TorchOptimizer struct {
	Name   string      `yaml:"name"`
	Kwargs AdamWKwargs `yaml:"kwargs"`
}

// AdamWKwargs are the torch.optim.AdamW and TransformerEngine FusedAdam
// keyword arguments tracegrpo reads (foreach and fused are ignored).
// ExpAvgDtype and ExpAvgSqDtype are FusedAdam's moment dtypes ("" when
// unset: float32).
type AdamWKwargs struct {
	LR            float64   `yaml:"lr"`
	WeightDecay   float64   `yaml:"weight_decay"`
	Betas         []float64 `yaml:"betas"`
	Eps           float64   `yaml:"eps"`
	ExpAvgDtype   string    `yaml:"exp_avg_dtype,omitempty"`
	ExpAvgSqDtype string    `yaml:"exp_avg_sq_dtype,omitempty"`
}

// TorchScheduler is one entry of `policy.scheduler`.
type TorchScheduler struct {
	Name       string           `yaml:"name,omitempty"`
	Kwargs     *SchedulerKwargs `yaml:"kwargs,omitempty"`
	Milestones []int64          `yaml:"milestones,omitempty"`
}

// SchedulerKwargs are the arguments of LinearLR and ConstantLR.
type SchedulerKwargs struct {
	StartFactor *float64 `yaml:"start_factor,omitempty"`
	EndFactor   *float64 `yaml:"end_factor,omitempty"`
	Factor      *float64 `yaml:"factor,omitempty"`
	TotalIters  *int64   `yaml:"total_iters,omitempty"`
}

// Generation is `policy.generation` (sampling parameters).
type Generation struct {
	Temperature  float64 `yaml:"temperature"`
	TopP         float64 `yaml:"top_p"`
	TopK         *int    `yaml:"top_k"`
	MaxNewTokens int     `yaml:"max_new_tokens"`
	// WeightsOut, WeightsDType and WeightsKeep are tracegrpo's own keys
	// (NeMo RL refits its generator in process): the directory the trainer
	// publishes the generator's weights into every step (step_<N>/, package
	// loop; "": none), their dtype (bfloat16, float16 or float32) and how
	// many of the newest to keep. See Config.WeightsOut.
	WeightsOut   string `yaml:"weights_out"`
	WeightsDType string `yaml:"weights_dtype"`
	WeightsKeep  int    `yaml:"weights_keep"`
}

// Checkpointing is `checkpointing:`.
type Checkpointing struct {
	Enabled       bool   `yaml:"enabled"`
	CheckpointDir string `yaml:"checkpoint_dir"`
	SavePeriod    int    `yaml:"save_period"`
	KeepTopK      *int   `yaml:"keep_top_k"`
	// SaveOptimizer writes the Adam moments into each checkpoint (NeMo RL's
	// default, true); false writes the weights and trainer state only, and
	// a resume from such a checkpoint restarts AdamW from zero moments.
	SaveOptimizer *bool `yaml:"save_optimizer"`
}

// Env is `env:`. Other environment blocks (env.math, ...) are ignored.
type Env struct {
	ShouldMaskFlaggedSamples bool    `yaml:"should_mask_flagged_samples"`
	NemoGym                  NemoGym `yaml:"nemo_gym"`
}

// NemoGym is `env.nemo_gym`; only token_id_capture is read.
type NemoGym struct {
	TokenIDCapture TokenIDCapture `yaml:"token_id_capture"`
}

// TokenIDCapture is `env.nemo_gym.token_id_capture` (spec §2.6).
type TokenIDCapture struct {
	Enabled   bool   `yaml:"enabled"`
	AllAgents bool   `yaml:"all_agents"`
	Delivery  string `yaml:"delivery"`
	Builder   string `yaml:"builder"`
	Dir       string `yaml:"dir"`
	// Sink is a custom sink (any YAML value); multi-trace requires it unset.
	Sink            any  `yaml:"sink"`
	ExternalStaging bool `yaml:"external_staging"`
}

// Logger is the part of `logger:` tracegrpo writes: TensorBoard event
// files of the metrics under log_dir (a relative log_dir is under the run
// directory). Its other back ends are listed at start as not written.
type Logger struct {
	LogDir             OptionalString `yaml:"log_dir"`
	TensorboardEnabled bool           `yaml:"tensorboard_enabled"`
}

// Cluster is `cluster:`.
type Cluster struct {
	GPUsPerNode int `yaml:"gpus_per_node"`
	NumNodes    int `yaml:"num_nodes"`
}

// The values of token_id_capture.delivery and .builder (spec §2.6).
const (
	DeliveryMainChain    = "main_chain"
	DeliveryAllTraces    = "all_traces"
	BuilderPrefixMerging = "prefix_merging"
	BuilderPerRequest    = "per_request"
	AdvEstimatorGRPO     = "grpo"
	TorchAdamW           = "torch.optim.AdamW"
	TEFusedAdam          = "transformer_engine.pytorch.optimizers.fused_adam.FusedAdam"
	TorchLinearLR        = "torch.optim.lr_scheduler.LinearLR"
	TorchConstantLR      = "torch.optim.lr_scheduler.ConstantLR"
)

func f64(v float64) *float64 { return &v }
func i64(v int64) *int64     { return &v }
func iptr(v int) *int        { return &v }
func bptr(v bool) *bool      { return &v }

// Default returns NeMo RL's defaults for every key of Config: the values of the
// shipped base recipe examples/configs/grpo_math_1B.yaml for the keys it sets,
// and the defaults of NeMo RL's code (ClippedPGLossConfig, GRPOAdvantageEstimator,
// Gym's token_id_capture) for the others. Multi-trace is off (gym_multi_trace
// false, delivery main_chain), as in NeMo RL.
func Default() Config {
	return Config{
		GRPO: GRPO{
			NumPromptsPerStep:       32,
			NumGenerationsPerPrompt: 16,
			MaxNumSteps:             1000000,
			Seed:                    42,
			NormalizeRewards:        true,
			UseLeaveOneOutBaseline:  true,
			AdvEstimator:            AdvEstimator{Name: AdvEstimatorGRPO, NormalizeRewards: true, UseLeaveOneOutBaseline: true},
		},
		LossFn: LossFn{
			ReferencePolicyKLPenalty: 0.01,
			ReferencePolicyKLType:    "k3",
			KLInputClampValue:        f64(20),
			KLOutputClampValue:       f64(10),
			RatioClipMin:             0.2,
			RatioClipMax:             0.2,
			TokenLevelLoss:           true,
		},
		Policy: Policy{
			ModelName:              "Qwen/Qwen2.5-1.5B",
			TrainGlobalBatchSize:   512,
			TrainMicroBatchSize:    4,
			MaxTotalSequenceLength: 512,
			MaxGradNorm:            f64(1.0),
			Precision:              "bfloat16",
			MegatronCfg: MegatronCfg{
				Optimizer: MegatronOptimizer{
					Optimizer: "adam", LR: 5e-6, MinLR: 5e-7, WeightDecay: 0.01,
					AdamBeta1: 0.9, AdamBeta2: 0.999, AdamEps: 1e-8, ClipGrad: f64(1.0),
				},
				Scheduler: MegatronScheduler{
					StartWeightDecay: f64(0.01), EndWeightDecay: f64(0.01),
					WeightDecayIncrStyle: "constant", LRDecayStyle: "constant",
					LRDecayIters: i64(1000), LRWarmupIters: 13, LRWarmupInit: 5e-7,
				},
			},
			Optimizer: &TorchOptimizer{
				Name:   TorchAdamW,
				Kwargs: AdamWKwargs{LR: 5e-6, WeightDecay: 0.01, Betas: []float64{0.9, 0.999}, Eps: 1e-8},
			},
			Scheduler: Schedulers{
				{Name: TorchLinearLR, Kwargs: &SchedulerKwargs{StartFactor: f64(0.1), EndFactor: f64(1.0), TotalIters: i64(50)}},
				{Name: TorchConstantLR, Kwargs: &SchedulerKwargs{Factor: f64(1.0), TotalIters: i64(10000000000)}},
				{Milestones: []int64{50}},
			},
			Generation:   Generation{Temperature: 1.0, TopP: 1.0, MaxNewTokens: 512, WeightsDType: WeightsBFloat16, WeightsKeep: 2},
			SharedPrefix: SharedPrefixAuto,
		},
		Checkpointing: Checkpointing{Enabled: true, CheckpointDir: "results/grpo", SavePeriod: 10, KeepTopK: iptr(3), SaveOptimizer: bptr(true)},
		Env: Env{
			ShouldMaskFlaggedSamples: true,
			NemoGym: NemoGym{TokenIDCapture: TokenIDCapture{
				Delivery: DeliveryMainChain, Builder: BuilderPrefixMerging,
			}},
		},
		Cluster: Cluster{GPUsPerNode: 1, NumNodes: 1},
		Logger:  Logger{LogDir: "logs"},
	}
}
