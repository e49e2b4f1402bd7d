package optim

import (
	"fmt"
	"math"
	"sort"
)

// Schedule gives the learning rate and weight decay of the next update and
// advances with the training clock.
type Schedule interface {
	// LR is the learning rate for the next optimizer update (read before Step).
	LR() float64
	// WeightDecay is the weight-decay coefficient for groups with Decay set
	// (groups without it always use 0).
	WeightDecay() float64
	// Step advances the clock after a GRPO step that consumed n logical
	// rollouts (spec §7.2: scheduler_step_samples, never physical rows).
	// Megatron counts the samples; Sequential counts one step per call.
	Step(n int64)
	// State is the clock, for checkpoints.
	State() ScheduleState
	// Restore sets the clock from a checkpoint.
	Restore(ScheduleState) error
}

// ScheduleState is a schedule's clock. Both counters are kept by every
// schedule so that a checkpoint is the same shape whichever is configured.
type ScheduleState struct {
	Samples int64 `json:"samples"` // Σ n over Step(n) calls (Megatron's num_steps)
	Steps   int64 `json:"steps"`   // number of Step calls (torch's last_epoch)
}

// StepSamples returns the scheduler increment of one GRPO step exactly as the
// Megatron worker chooses it: scheduler_step_samples (the logical rollout
// count) when the multi-trace path supplies it, else gbs (the physical row
// count of the legacy path). Spec §7.1–§7.2.
func StepSamples(physicalRows, logicalRollouts int) int64 {
	if logicalRollouts > 0 {
		return int64(logicalRollouts)
	}
	return int64(physicalRows)
}

// Decay styles of the Megatron learning rate (lr_decay_style).
const (
	DecayConstant          = "constant"
	DecayLinear            = "linear"
	DecayCosine            = "cosine"
	DecayInverseSquareRoot = "inverse-square-root"
)

// Increment styles of the Megatron weight decay (weight_decay_incr_style).
const (
	WDConstant = "constant"
	WDLinear   = "linear"
	WDCosine   = "cosine"
)

// MegatronConfig holds the scheduler keys of a NeMo RL Megatron recipe
// (policy.megatron_cfg.scheduler and the batch size that scales them).
// Iteration counts are in optimizer iterations; the schedule multiplies them
// by GlobalBatchSize to count samples, as Megatron-Bridge does.
type MegatronConfig struct {
	LR         float64 // lr (Megatron's max_lr)
	MinLR      float64 // min_lr
	WarmupInit float64 // lr_warmup_init (Megatron's init_lr)

	WarmupIters int64 // lr_warmup_iters
	// WarmupFraction is lr_warmup_fraction; when non-nil it replaces
	// WarmupIters: warmup samples = fraction × decay samples.
	WarmupFraction *float64
	DecayIters     int64  // lr_decay_iters; 0 means TrainIters
	DecayStyle     string // lr_decay_style: constant|linear|cosine|inverse-square-root

	StartWD     float64 // start_weight_decay
	EndWD       float64 // end_weight_decay
	WDIncrStyle string  // weight_decay_incr_style: constant|linear|cosine

	TrainIters      int64 // train_iters: weight-decay increment length, default decay length
	GlobalBatchSize int64 // train_global_batch_size: samples per iteration
}

// Megatron is Megatron-Core's OptimizerParamScheduler with the sample-counting
// clock Megatron-Bridge gives it.
type Megatron struct {
	cfg         MegatronConfig
	warmupSteps float64 // samples
	decaySteps  int64   // samples
	wdIncrSteps int64   // samples
	st          ScheduleState
	notes       []string
	lr, wd      float64
}

// NewMegatron validates cfg and returns the schedule at sample 0.
func NewMegatron(cfg MegatronConfig) (*Megatron, error) {
	bad := func(field, want string, got any) error {
		return fmt.Errorf("optim: megatron scheduler: %s: want %s, got %v", field, want, got)
	}
	if cfg.GlobalBatchSize <= 0 {
		return nil, bad("train_global_batch_size", "> 0", cfg.GlobalBatchSize)
	}
	if cfg.MinLR < 0 {
		return nil, bad("min_lr", ">= 0", cfg.MinLR)
	}
	if cfg.LR < cfg.MinLR {
		return nil, bad("lr", fmt.Sprintf(">= min_lr (%v)", cfg.MinLR), cfg.LR)
	}
	if cfg.WarmupInit > cfg.LR {
		return nil, bad("lr_warmup_init", fmt.Sprintf("<= lr (%v)", cfg.LR), cfg.WarmupInit)
	}
	if cfg.WarmupIters < 0 {
		return nil, bad("lr_warmup_iters", ">= 0", cfg.WarmupIters)
	}
	switch cfg.DecayStyle {
	case DecayConstant, DecayLinear, DecayCosine, DecayInverseSquareRoot:
	default:
		return nil, bad("lr_decay_style", "constant|linear|cosine|inverse-square-root", fmt.Sprintf("%q", cfg.DecayStyle))
	}
	switch cfg.WDIncrStyle {
	case WDConstant, WDLinear, WDCosine:
	default:
		return nil, bad("weight_decay_incr_style", "constant|linear|cosine", fmt.Sprintf("%q", cfg.WDIncrStyle))
	}
	if cfg.StartWD < 0 {
		return nil, bad("start_weight_decay", ">= 0", cfg.StartWD)
	}
	if cfg.EndWD < cfg.StartWD {
		return nil, bad("end_weight_decay", fmt.Sprintf(">= start_weight_decay (%v)", cfg.StartWD), cfg.EndWD)
	}
	if cfg.WDIncrStyle == WDConstant && cfg.StartWD != cfg.EndWD {
		return nil, bad("end_weight_decay", fmt.Sprintf("= start_weight_decay (%v) with constant increment style", cfg.StartWD), cfg.EndWD)
	}
	decayIters := cfg.DecayIters
	if decayIters == 0 {
		decayIters = cfg.TrainIters
	}
	if decayIters <= 0 {
		return nil, bad("lr_decay_iters (or train_iters when unset)", "> 0", decayIters)
	}
	if cfg.TrainIters <= 0 {
		return nil, bad("train_iters", "> 0", cfg.TrainIters)
	}
	s := &Megatron{
		cfg:         cfg,
		decaySteps:  decayIters * cfg.GlobalBatchSize,
		wdIncrSteps: cfg.TrainIters * cfg.GlobalBatchSize,
	}
	if cfg.WarmupFraction != nil {
		f := *cfg.WarmupFraction
		if f < 0 || f > 1 || math.IsNaN(f) {
			return nil, bad("lr_warmup_fraction", "in [0, 1]", f)
		}
		s.warmupSteps = f * float64(s.decaySteps)
	} else {
		s.warmupSteps = float64(cfg.WarmupIters * cfg.GlobalBatchSize)
	}
	if s.warmupSteps >= float64(s.decaySteps) {
		// Megatron-Bridge caps the warmup (with a warning) so that
		// Megatron-Core's invariant warmup < decay holds.
		capped := float64(s.decaySteps - 1)
		s.notes = append(s.notes, fmt.Sprintf("lr warmup (%v samples) >= lr decay (%d samples): capped to %v samples", s.warmupSteps, s.decaySteps, capped))
		s.warmupSteps = capped
	}
	s.update()
	return s, nil
}

// Notes lists adjustments made to the configuration (Megatron-Bridge's
// warnings), for the run log.
func (s *Megatron) Notes() []string { return append([]string(nil), s.notes...) }

// WarmupSamples, DecaySamples and WDIncrSamples are the schedule's lengths in
// samples.
func (s *Megatron) WarmupSamples() float64 { return s.warmupSteps }

// DecaySamples is lr_decay_iters × train_global_batch_size.
func (s *Megatron) DecaySamples() int64 { return s.decaySteps }

// WDIncrSamples is train_iters × train_global_batch_size.
func (s *Megatron) WDIncrSamples() int64 { return s.wdIncrSteps }

// LR implements Schedule.
func (s *Megatron) LR() float64 { return s.lr }

// WeightDecay implements Schedule.
func (s *Megatron) WeightDecay() float64 { return s.wd }

// Step implements Schedule: the clock advances by n samples (n ≥ 0).
func (s *Megatron) Step(n int64) {
	if n < 0 {
		panic(fmt.Sprintf("optim: Megatron.Step(%d): negative increment", n))
	}
	s.st.Samples += n
	s.st.Steps++
	s.update()
}

// State implements Schedule.
func (s *Megatron) State() ScheduleState { return s.st }

// Restore implements Schedule.
func (s *Megatron) Restore(st ScheduleState) error {
	if st.Samples < 0 || st.Steps < 0 {
		return fmt.Errorf("optim: megatron scheduler: restore: negative clock %+v", st)
	}
	s.st = st
	s.update()
	return nil
}

func (s *Megatron) update() {
	s.lr = s.lrAt(s.st.Samples)
	s.wd = s.wdAt(s.st.Samples)
}

// lrAt is OptimizerParamScheduler.get_lr, term for term.
func (s *Megatron) lrAt(n int64) float64 {
	c := s.cfg
	num := float64(n)
	if s.warmupSteps > 0 && num <= s.warmupSteps {
		return c.WarmupInit + (c.LR-c.WarmupInit)*num/s.warmupSteps
	}
	if c.DecayStyle == DecayConstant {
		return c.LR
	}
	if n > s.decaySteps {
		return c.MinLR
	}
	if c.DecayStyle == DecayInverseSquareRoot {
		w := math.Max(s.warmupSteps, 1)
		k := math.Max(num, 1)
		return math.Max(c.MinLR, c.LR*math.Sqrt(w)/math.Sqrt(k))
	}
	ratio := (num - s.warmupSteps) / (float64(s.decaySteps) - s.warmupSteps)
	var coeff float64
	switch c.DecayStyle {
	case DecayLinear:
		coeff = 1 - ratio
	case DecayCosine:
		coeff = 0.5 * (math.Cos(math.Pi*ratio) + 1)
	}
	return c.MinLR + coeff*(c.LR-c.MinLR)
}

// wdAt is OptimizerParamScheduler.get_wd, term for term.
func (s *Megatron) wdAt(n int64) float64 {
	c := s.cfg
	if n > s.wdIncrSteps || c.WDIncrStyle == WDConstant {
		return c.EndWD
	}
	ratio := float64(n) / float64(s.wdIncrSteps)
	var coeff float64
	switch c.WDIncrStyle {
	case WDLinear:
		coeff = ratio
	case WDCosine:
		coeff = 0.5 * (math.Cos(math.Pi*(1-ratio)) + 1)
	}
	return c.StartWD + coeff*(c.EndWD-c.StartWD)
}

// Phase kinds of the non-Megatron schedule (torch.optim.lr_scheduler names).
const (
	PhaseLinear   = "LinearLR"
	PhaseConstant = "ConstantLR"
)

// Phase is one torch scheduler of NeMo RL's policy.scheduler list.
type Phase struct {
	Kind        string  // LinearLR | ConstantLR
	StartFactor float64 // LinearLR start_factor (torch default 1/3)
	EndFactor   float64 // LinearLR end_factor (torch default 1)
	Factor      float64 // ConstantLR factor (torch default 1/3)
	TotalIters  int64   // total_iters (torch default 5)
}

// SequentialConfig is NeMo RL's non-Megatron scheduler: torch's SequentialLR
// over Phases switching at Milestones (counted in scheduler steps, one per
// GRPO step), with a fixed weight decay (optimizer kwargs weight_decay).
// No phases means a constant learning rate.
type SequentialConfig struct {
	LR          float64
	WeightDecay float64
	Phases      []Phase
	Milestones  []int64 // len(Phases)-1 increasing step counts
}

// Sequential is torch's SequentialLR of LinearLR/ConstantLR phases, in closed
// form: phase i runs from step Milestones[i-1] with its own clock restarted
// at 0, as SequentialLR's step(0) does.
type Sequential struct {
	cfg SequentialConfig
	st  ScheduleState
	lr  float64
}

// NewSequential validates cfg with torch's own checks and returns the
// schedule at step 0.
func NewSequential(cfg SequentialConfig) (*Sequential, error) {
	if cfg.LR < 0 || math.IsNaN(cfg.LR) {
		return nil, fmt.Errorf("optim: scheduler: lr: want >= 0, got %v", cfg.LR)
	}
	if cfg.WeightDecay < 0 || math.IsNaN(cfg.WeightDecay) {
		return nil, fmt.Errorf("optim: scheduler: weight_decay: want >= 0, got %v", cfg.WeightDecay)
	}
	if len(cfg.Phases) > 0 && len(cfg.Milestones) != len(cfg.Phases)-1 {
		return nil, fmt.Errorf("optim: scheduler: milestones: want %d (one fewer than the %d schedulers), got %d", len(cfg.Phases)-1, len(cfg.Phases), len(cfg.Milestones))
	}
	if len(cfg.Phases) == 0 && len(cfg.Milestones) != 0 {
		return nil, fmt.Errorf("optim: scheduler: milestones %v given without schedulers", cfg.Milestones)
	}
	for i, m := range cfg.Milestones {
		if m <= 0 || (i > 0 && m <= cfg.Milestones[i-1]) {
			return nil, fmt.Errorf("optim: scheduler: milestones[%d]: want a positive increasing step count, got %v", i, cfg.Milestones)
		}
	}
	for i, p := range cfg.Phases {
		switch p.Kind {
		case PhaseLinear:
			if p.StartFactor <= 0 || p.StartFactor > 1 {
				return nil, fmt.Errorf("optim: scheduler[%d] LinearLR: start_factor: want in (0, 1], got %v", i, p.StartFactor)
			}
			if p.EndFactor < 0 || p.EndFactor > 1 {
				return nil, fmt.Errorf("optim: scheduler[%d] LinearLR: end_factor: want in [0, 1], got %v", i, p.EndFactor)
			}
			if p.TotalIters <= 0 {
				return nil, fmt.Errorf("optim: scheduler[%d] LinearLR: total_iters: want > 0, got %d", i, p.TotalIters)
			}
		case PhaseConstant:
			if p.Factor < 0 || p.Factor > 1 {
				return nil, fmt.Errorf("optim: scheduler[%d] ConstantLR: factor: want in [0, 1], got %v", i, p.Factor)
			}
			if p.TotalIters < 0 {
				return nil, fmt.Errorf("optim: scheduler[%d] ConstantLR: total_iters: want >= 0, got %d", i, p.TotalIters)
			}
		default:
			return nil, fmt.Errorf("optim: scheduler[%d]: name: want LinearLR or ConstantLR, got %q", i, p.Kind)
		}
	}
	s := &Sequential{cfg: cfg}
	s.update()
	return s, nil
}

// LR implements Schedule.
func (s *Sequential) LR() float64 { return s.lr }

// WeightDecay implements Schedule.
func (s *Sequential) WeightDecay() float64 { return s.cfg.WeightDecay }

// Step implements Schedule: one scheduler step per call; n (the logical
// rollouts of the GRPO step) is only added to State().Samples.
func (s *Sequential) Step(n int64) {
	if n < 0 {
		panic(fmt.Sprintf("optim: Sequential.Step(%d): negative increment", n))
	}
	s.st.Samples += n
	s.st.Steps++
	s.update()
}

// State implements Schedule.
func (s *Sequential) State() ScheduleState { return s.st }

// Restore implements Schedule.
func (s *Sequential) Restore(st ScheduleState) error {
	if st.Samples < 0 || st.Steps < 0 {
		return fmt.Errorf("optim: scheduler: restore: negative clock %+v", st)
	}
	s.st = st
	s.update()
	return nil
}

func (s *Sequential) update() {
	if len(s.cfg.Phases) == 0 {
		s.lr = s.cfg.LR
		return
	}
	k := s.st.Steps
	// bisect_right(milestones, k): the phase whose start is the last
	// milestone <= k.
	i := sort.Search(len(s.cfg.Milestones), func(j int) bool { return s.cfg.Milestones[j] > k })
	local := k
	if i > 0 {
		local = k - s.cfg.Milestones[i-1]
	}
	p := s.cfg.Phases[i]
	var f float64
	switch p.Kind {
	case PhaseLinear:
		f = p.StartFactor + (p.EndFactor-p.StartFactor)*float64(min(local, p.TotalIters))/float64(p.TotalIters)
	case PhaseConstant:
		f = p.Factor
		if local >= p.TotalIters {
			f = 1
		}
	}
	s.lr = s.cfg.LR * f
}
