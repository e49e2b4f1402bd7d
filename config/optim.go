package config

import (
	"fmt"
	"math"
	"sort"
	"strings"
)

// Optimizer is the normalized optimizer of either recipe kind. Both are Adam
// with decoupled weight decay (AdamW): Megatron's "adam" and torch.optim.AdamW
// implement the same update.
type Optimizer struct {
	// Source is "megatron" (policy.megatron_cfg.optimizer) or "torch"
	// (policy.optimizer).
	Source      string
	LR          float64 // peak learning rate
	MinLR       float64 // floor of a decaying Megatron schedule; 0 for torch
	WeightDecay float64 // initial weight decay (see Schedule.WeightDecay)
	Beta1       float64
	Beta2       float64
	Eps         float64
	// ClipGrad is the global gradient-norm limit; 0 means no clipping
	// (policy.max_grad_norm null).
	ClipGrad float64
	// Class is the optimizer whose arithmetic the update follows:
	// TorchAdamW (policy.optimizer.name torch.optim.AdamW, and Megatron's
	// adam) or TEFusedAdam (TransformerEngine's FusedAdam).
	Class string
	// BF16Moments: Adam's moments are kept in bfloat16 (FusedAdam's
	// exp_avg_dtype and exp_avg_sq_dtype torch.bfloat16).
	BF16Moments bool
}

// Schedule is the normalized learning-rate and weight-decay schedule, counted
// in scheduler ticks. tracegrpo ticks once per GRPO step (spec §7.2: the
// scheduler advances by the logical rollout count, which the guards make equal
// to train_global_batch_size, i.e. one Megatron iteration). The LR used by the
// step with index k (0-based) is LR(k): NeMo RL reads the LR before stepping.
type Schedule struct {
	// Style is "megatron" (Megatron's OptimizerParamScheduler) or "phases"
	// (torch LinearLR/ConstantLR, chained by SequentialLR milestones).
	Style string

	// Megatron style.
	MaxLR, MinLR float64
	WarmupInit   float64 // LR at tick 0 when WarmupIters > 0
	WarmupIters  int64
	DecayIters   int64  // ticks until MinLR; lr_decay_iters, else grpo.max_num_steps
	DecayStyle   string // constant | linear | cosine | inverse-square-root
	StartWD      float64
	EndWD        float64
	WDIncrStyle  string // constant | linear | cosine
	WDIncrIters  int64  // grpo.max_num_steps (Megatron's train_iters)

	// Phases style: the LR is BaseLR × the factor of the phase in force. Phase i
	// is in force from tick Phases[i].Start (0 for the first) to the next
	// phase's Start, and is evaluated at its local tick (tick − Start), as
	// torch's SequentialLR does. The weight decay is constant.
	BaseLR float64
	Phases []LRPhase
	WD     float64
}

// LRPhase is one torch scheduler in a "phases" schedule.
type LRPhase struct {
	Start int64
	// Kind "linear": factor goes from StartFactor to EndFactor over TotalIters
	// ticks, then stays at EndFactor (torch LinearLR). Kind "constant": factor
	// is StartFactor for the first TotalIters ticks, then 1 (torch ConstantLR).
	Kind        string
	StartFactor float64
	EndFactor   float64
	TotalIters  int64
}

// LR is the learning rate used at tick k (k >= 0).
func (s *Schedule) LR(k int64) float64 {
	if s.Style == "phases" {
		i := sort.Search(len(s.Phases), func(i int) bool { return s.Phases[i].Start > k }) - 1
		if i < 0 {
			i = 0
		}
		p := s.Phases[i]
		local := k - p.Start
		switch p.Kind {
		case "linear":
			if p.TotalIters <= 0 || local >= p.TotalIters {
				return s.BaseLR * p.EndFactor
			}
			return s.BaseLR * (p.StartFactor + (p.EndFactor-p.StartFactor)*float64(local)/float64(p.TotalIters))
		default:
			if local < p.TotalIters {
				return s.BaseLR * p.StartFactor
			}
			return s.BaseLR
		}
	}
	if s.WarmupIters > 0 && k <= s.WarmupIters {
		return s.WarmupInit + (s.MaxLR-s.WarmupInit)*float64(k)/float64(s.WarmupIters)
	}
	if s.DecayStyle == "constant" {
		return s.MaxLR
	}
	if k > s.DecayIters {
		return s.MinLR
	}
	if s.DecayStyle == "inverse-square-root" {
		w := math.Max(float64(s.WarmupIters), 1)
		n := math.Max(float64(k), 1)
		return math.Max(s.MinLR, s.MaxLR*math.Sqrt(w)/math.Sqrt(n))
	}
	ratio := float64(k-s.WarmupIters) / float64(s.DecayIters-s.WarmupIters)
	coeff := 1 - ratio
	if s.DecayStyle == "cosine" {
		coeff = 0.5 * (math.Cos(math.Pi*ratio) + 1)
	}
	return s.MinLR + coeff*(s.MaxLR-s.MinLR)
}

// WeightDecay is the weight decay used at tick k.
func (s *Schedule) WeightDecay(k int64) float64 {
	if s.Style == "phases" {
		return s.WD
	}
	if k > s.WDIncrIters || s.WDIncrStyle == "constant" || s.WDIncrIters <= 0 {
		if s.WDIncrStyle == "constant" {
			return s.StartWD
		}
		return s.EndWD
	}
	r := float64(k) / float64(s.WDIncrIters)
	coeff := r
	if s.WDIncrStyle == "cosine" {
		coeff = 0.5 * (math.Cos(math.Pi*(1-r)) + 1)
	}
	return s.StartWD + coeff*(s.EndWD-s.StartWD)
}

// Optim normalizes the optimizer and schedule: from policy.megatron_cfg when
// it is enabled, else from policy.optimizer and policy.scheduler.
func (c *Config) Optim() (Optimizer, Schedule, error) {
	clip := 0.0
	if c.Policy.MaxGradNorm != nil {
		clip = *c.Policy.MaxGradNorm
	}
	if c.Policy.MegatronCfg.Enabled {
		return c.megatronOptim()
	}
	o := c.Policy.Optimizer
	if o == nil {
		return Optimizer{}, Schedule{}, &Refusal{Key: "policy.optimizer", Value: "null", Why: "no optimizer configured: policy.megatron_cfg.enabled is false too"}
	}
	if o.Name != TorchAdamW && o.Name != TEFusedAdam {
		return Optimizer{}, Schedule{}, &Refusal{Key: "policy.optimizer.name", Value: o.Name, Why: "tracegrpo implements " + TorchAdamW + " and " + TEFusedAdam}
	}
	k := o.Kwargs
	if len(k.Betas) != 2 {
		return Optimizer{}, Schedule{}, fmt.Errorf("config: policy.optimizer.kwargs.betas: want 2 numbers, found %d", len(k.Betas))
	}
	bf16, err := momentDtypes(o.Name, k)
	if err != nil {
		return Optimizer{}, Schedule{}, err
	}
	opt := Optimizer{Source: "torch", LR: k.LR, WeightDecay: k.WeightDecay, Beta1: k.Betas[0], Beta2: k.Betas[1], Eps: k.Eps, ClipGrad: clip,
		Class: o.Name, BF16Moments: bf16}
	if err := opt.check("policy.optimizer.kwargs"); err != nil {
		return Optimizer{}, Schedule{}, err
	}
	sch, err := torchSchedule(c.Policy.Scheduler)
	if err != nil {
		return Optimizer{}, Schedule{}, err
	}
	sch.BaseLR, sch.WD = k.LR, k.WeightDecay
	return opt, sch, nil
}

// momentDtypes reads FusedAdam's exp_avg_dtype and exp_avg_sq_dtype
// (resolved from their "torch." strings as NeMo RL's automodel setup
// does): both float32 (or unset), or both bfloat16, which
// TransformerEngine's multi_tensor_adam requires to match; float16 and
// uint8 (FP8) moments are refused, as are the keys on torch.optim.AdamW,
// which takes no such argument.
func momentDtypes(name string, k AdamWKwargs) (bf16 bool, err error) {
	const p = "policy.optimizer.kwargs."
	kind := func(key, v string) (string, error) {
		switch strings.TrimPrefix(v, "torch.") {
		case "", "float32":
			return "float32", nil
		case "bfloat16":
			if name != TEFusedAdam {
				return "", &Refusal{Key: p + key, Value: v, Why: name + " takes no " + key + " (only " + TEFusedAdam + " keeps its moments in bfloat16)"}
			}
			return "bfloat16", nil
		}
		return "", &Refusal{Key: p + key, Value: v, Why: "tracegrpo keeps Adam's moments in float32 or bfloat16 (FusedAdam's float16 and FP8 moments scale by a per-tensor factor it does not implement)"}
	}
	a, err := kind("exp_avg_dtype", k.ExpAvgDtype)
	if err != nil {
		return false, err
	}
	b, err := kind("exp_avg_sq_dtype", k.ExpAvgSqDtype)
	if err != nil {
		return false, err
	}
	if a != b {
		return false, &Refusal{Key: p + "exp_avg_sq_dtype", Value: k.ExpAvgSqDtype,
			Why: fmt.Sprintf("differs from exp_avg_dtype %q: TransformerEngine's FusedAdam keeps both moments in float32 or both in bfloat16", k.ExpAvgDtype)}
	}
	return a == "bfloat16", nil
}

func (c *Config) megatronOptim() (Optimizer, Schedule, error) {
	m, s := c.Policy.MegatronCfg.Optimizer, c.Policy.MegatronCfg.Scheduler
	if m.Optimizer != "adam" {
		return Optimizer{}, Schedule{}, &Refusal{Key: "policy.megatron_cfg.optimizer.optimizer", Value: m.Optimizer, Why: "tracegrpo implements adam (AdamW)"}
	}
	clip := 0.0
	if m.ClipGrad != nil {
		clip = *m.ClipGrad
	}
	opt := Optimizer{Source: "megatron", LR: m.LR, MinLR: m.MinLR, WeightDecay: m.WeightDecay, Beta1: m.AdamBeta1, Beta2: m.AdamBeta2, Eps: m.AdamEps, ClipGrad: clip,
		Class: TorchAdamW}
	if err := opt.check("policy.megatron_cfg.optimizer"); err != nil {
		return Optimizer{}, Schedule{}, err
	}
	const p = "policy.megatron_cfg.scheduler"
	sch := Schedule{Style: "megatron", MaxLR: m.LR, MinLR: m.MinLR, WarmupInit: s.LRWarmupInit, WarmupIters: s.LRWarmupIters,
		DecayStyle: s.LRDecayStyle, WDIncrStyle: s.WeightDecayIncrStyle, WDIncrIters: int64(c.GRPO.MaxNumSteps)}
	sch.DecayIters = int64(c.GRPO.MaxNumSteps)
	if s.LRDecayIters != nil {
		sch.DecayIters = *s.LRDecayIters
	}
	sch.StartWD, sch.EndWD = m.WeightDecay, m.WeightDecay
	if s.StartWeightDecay != nil {
		sch.StartWD = *s.StartWeightDecay
	}
	if s.EndWeightDecay != nil {
		sch.EndWD = *s.EndWeightDecay
	}
	switch s.LRDecayStyle {
	case "constant", "linear", "cosine", "inverse-square-root":
	default:
		return Optimizer{}, Schedule{}, &Refusal{Key: p + ".lr_decay_style", Value: s.LRDecayStyle, Why: "tracegrpo implements constant, linear, cosine and inverse-square-root"}
	}
	switch s.WeightDecayIncrStyle {
	case "constant":
		if sch.StartWD != sch.EndWD {
			return Optimizer{}, Schedule{}, fmt.Errorf("config: %s: weight_decay_incr_style constant needs start_weight_decay == end_weight_decay, found %g and %g", p, sch.StartWD, sch.EndWD)
		}
	case "linear", "cosine":
	default:
		return Optimizer{}, Schedule{}, &Refusal{Key: p + ".weight_decay_incr_style", Value: s.WeightDecayIncrStyle, Why: "tracegrpo implements constant, linear and cosine"}
	}
	if sch.WarmupIters < 0 {
		return Optimizer{}, Schedule{}, fmt.Errorf("config: %s.lr_warmup_iters: want >= 0, found %d", p, sch.WarmupIters)
	}
	if s.LRDecayStyle != "constant" && s.LRDecayStyle != "inverse-square-root" && sch.DecayIters <= sch.WarmupIters {
		return Optimizer{}, Schedule{}, fmt.Errorf("config: %s.lr_decay_iters: want > lr_warmup_iters (%d), found %d", p, sch.WarmupIters, sch.DecayIters)
	}
	return opt, sch, nil
}

func (o *Optimizer) check(p string) error {
	bad := func(k string, v float64, want string) error {
		return fmt.Errorf("config: %s.%s: want %s, found %g", p, k, want, v)
	}
	switch {
	case !(o.LR >= 0) || math.IsInf(o.LR, 0):
		return bad("lr", o.LR, "a finite number >= 0")
	case !(o.Beta1 >= 0 && o.Beta1 < 1):
		return bad("beta1", o.Beta1, "0 <= beta1 < 1")
	case !(o.Beta2 >= 0 && o.Beta2 < 1):
		return bad("beta2", o.Beta2, "0 <= beta2 < 1")
	case !(o.Eps > 0):
		return bad("eps", o.Eps, "> 0")
	case !(o.WeightDecay >= 0):
		return bad("weight_decay", o.WeightDecay, ">= 0")
	case !(o.ClipGrad >= 0):
		return bad("clip_grad", o.ClipGrad, ">= 0")
	}
	return nil
}

// torchSchedule reads NeMo RL's policy.scheduler list.
func torchSchedule(list []TorchScheduler) (Schedule, error) {
	const p = "policy.scheduler"
	s := Schedule{Style: "phases"}
	var milestones []int64
	haveMilestones := false
	for i, e := range list {
		if e.Milestones != nil || (e.Name == "" && e.Kwargs == nil) {
			if e.Name != "" || e.Kwargs != nil || haveMilestones {
				return Schedule{}, fmt.Errorf("config: %s.%d: want one entry holding only milestones", p, i)
			}
			milestones, haveMilestones = e.Milestones, true
			continue
		}
		k := SchedulerKwargs{}
		if e.Kwargs != nil {
			k = *e.Kwargs
		}
		ph := LRPhase{}
		switch e.Name {
		case TorchLinearLR:
			// torch defaults: start_factor 1/3, end_factor 1, total_iters 5.
			ph = LRPhase{Kind: "linear", StartFactor: 1.0 / 3, EndFactor: 1, TotalIters: 5}
			if k.StartFactor != nil {
				ph.StartFactor = *k.StartFactor
			}
			if k.EndFactor != nil {
				ph.EndFactor = *k.EndFactor
			}
			if k.Factor != nil {
				return Schedule{}, fmt.Errorf("config: %s.%d.kwargs.factor: LinearLR has no factor", p, i)
			}
		case TorchConstantLR:
			// torch defaults: factor 1/3, total_iters 5.
			ph = LRPhase{Kind: "constant", StartFactor: 1.0 / 3, EndFactor: 1, TotalIters: 5}
			if k.Factor != nil {
				ph.StartFactor = *k.Factor
			}
			if k.StartFactor != nil || k.EndFactor != nil {
				return Schedule{}, fmt.Errorf("config: %s.%d.kwargs: ConstantLR takes factor and total_iters only", p, i)
			}
		default:
			return Schedule{}, &Refusal{Key: fmt.Sprintf("%s.%d.name", p, i), Value: e.Name, Why: "tracegrpo implements " + TorchLinearLR + " and " + TorchConstantLR}
		}
		if k.TotalIters != nil {
			ph.TotalIters = *k.TotalIters
		}
		if ph.TotalIters < 0 {
			return Schedule{}, fmt.Errorf("config: %s.%d.kwargs.total_iters: want >= 0, found %d", p, i, ph.TotalIters)
		}
		s.Phases = append(s.Phases, ph)
	}
	if len(s.Phases) == 0 {
		// No scheduler: a constant learning rate.
		s.Phases = []LRPhase{{Kind: "constant", StartFactor: 1, EndFactor: 1}}
		return s, nil
	}
	if len(s.Phases) > 1 || haveMilestones {
		if len(milestones) != len(s.Phases)-1 {
			return Schedule{}, fmt.Errorf("config: %s: %d schedulers need %d milestones, found %d", p, len(s.Phases), len(s.Phases)-1, len(milestones))
		}
		for i, m := range milestones {
			if m <= 0 || (i > 0 && m <= milestones[i-1]) {
				return Schedule{}, fmt.Errorf("config: %s: milestones must be positive and increasing, found %v", p, milestones)
			}
			s.Phases[i+1].Start = m
		}
	}
	return s, nil
}

// ActivationCheckpointing says whether the recipe asks to recompute
// activations in the backward pass: the activation_checkpointing of the
// training backend block the recipe enables (policy.megatron_cfg when it is
// enabled, else policy.dtensor_cfg), with the key that said so.
func (c *Config) ActivationCheckpointing() (on bool, key string) {
	if c.Policy.MegatronCfg.Enabled {
		return c.Policy.MegatronCfg.ActivationCheckpointing, "policy.megatron_cfg.activation_checkpointing"
	}
	return c.Policy.DtensorCfg.ActivationCheckpointing, "policy.dtensor_cfg.activation_checkpointing"
}

// The values of policy.shared_prefix.
const (
	SharedPrefixAuto = "auto"
	SharedPrefixOff  = "off"
)

// SharedPrefixOn reads policy.shared_prefix: true for "auto" (pack the
// traces of each micro-batch as a token trie, computing shared prefixes
// once), false for "off". Any other value is refused by name.
func (c *Config) SharedPrefixOn() (bool, error) {
	switch p := c.Policy.SharedPrefix; p {
	case SharedPrefixAuto:
		return true, nil
	case SharedPrefixOff:
		return false, nil
	default:
		return false, fmt.Errorf("config: policy.shared_prefix=%q: want auto (shared prefixes computed once) or off (every trace packed alone)", p)
	}
}

// Precisions tracegrpo trains in (policy.precision).
const (
	PrecisionFloat32  = "float32"
	PrecisionBFloat16 = "bfloat16"
)

// TrainingPrecision checks policy.precision: "float32" (fp32 everywhere;
// TF32 only when asked for), or "bfloat16" (mixed precision: fp32 master
// weights, gradients and Adam; bf16 GEMM and attention operands). Other
// values (fp16, fp8 recipes) are refused by name.
func (c *Config) TrainingPrecision() (string, error) {
	switch p := c.Policy.Precision; p {
	case PrecisionFloat32, PrecisionBFloat16:
		return p, nil
	case "", "fp32":
		return PrecisionFloat32, nil
	case "bf16":
		return PrecisionBFloat16, nil
	default:
		return "", &Refusal{Key: "policy.precision", Value: p, Why: "tracegrpo trains in float32 or bfloat16 (mixed precision)"}
	}
}

// The values of policy.generation.weights_dtype.
const (
	WeightsBFloat16 = "bfloat16"
	WeightsFloat16  = "float16"
	WeightsFloat32  = "float32"
)

// WeightsOut reads tracegrpo's policy.generation.weights_* keys: the
// directory the generator's weights are published into ("": none), their
// dtype and how many to keep.
func (c *Config) WeightsOut() (dir, dtype string, keep int, err error) {
	g := c.Policy.Generation
	switch g.WeightsDType {
	case WeightsBFloat16, WeightsFloat16, WeightsFloat32:
	default:
		return "", "", 0, fmt.Errorf("config: policy.generation.weights_dtype=%q: want bfloat16, float16 or float32 (the dtype the generator serves)", g.WeightsDType)
	}
	if g.WeightsKeep < 1 {
		return "", "", 0, fmt.Errorf("config: policy.generation.weights_keep=%d: want at least 1 (the newest weights directory is the one the generator needs)", g.WeightsKeep)
	}
	return g.WeightsOut, g.WeightsDType, g.WeightsKeep, nil
}

// SavesOptimizer reads checkpointing.save_optimizer (null: true, NeMo RL's
// default).
func (c *Config) SavesOptimizer() bool {
	return c.Checkpointing.SaveOptimizer == nil || *c.Checkpointing.SaveOptimizer
}
