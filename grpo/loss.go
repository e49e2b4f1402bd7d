package grpo

import (
	"fmt"
	"math"

	"github.com/tracegrpo/tracegrpo/config"
)

// NormEpsilon is added to G_tok in every reduction (NeMo RL's masked_mean).
const NormEpsilon = 1e-8

// The truncated importance-sampling types (loss_fn.truncated_importance_sampling_type).
const (
	TISNone       = ""
	TISTruncate   = "tis"
	TISIcePop     = "icepop"
	TISSeqMaskTIS = "seq-mask-tis"
)

// LossOptions are the token-level ClippedPGLossFn options (spec §6.1). Build
// them with NewLossOptions, which validates them.
type LossOptions struct {
	RatioClipMin, RatioClipMax float64
	// RatioClipC is the dual-clip bound c (> 1); 0 disables dual clipping.
	RatioClipC float64
	// KLPenalty is β (0 when use_kl_in_reward).
	KLPenalty float64
	KLType    string // "k1", "k2" or "k3"
	// KLInputClamp and KLOutputClamp bound the log-ratio and the weighted KL
	// term; +Inf disables a clamp (null in the recipe).
	KLInputClamp, KLOutputClamp float64
	OnPolicyKLApprox            bool
	ISCorrection                bool
	TISType                     string
	// TISMax is truncated_importance_sampling_ratio; TISMin its _min (0 for
	// "tis" when unset).
	TISMax, TISMin     float64
	ForceOnPolicyRatio bool
	DisablePPORatio    bool
	CISPO              bool
}

// NewLossOptions validates loss_fn and converts it (spec §6.3 constraints).
// Only token-level loss with token-level ratios exists here: the others depend
// on trace boundaries and are refused by the capability guards.
func NewLossOptions(c *config.LossFn) (LossOptions, error) {
	o := LossOptions{
		RatioClipMin: c.RatioClipMin, RatioClipMax: c.RatioClipMax,
		KLPenalty: c.ReferencePolicyKLPenalty, KLType: c.ReferencePolicyKLType,
		KLInputClamp: math.Inf(1), KLOutputClamp: math.Inf(1),
		OnPolicyKLApprox: c.UseOnPolicyKLApproximation, ISCorrection: c.UseImportanceSamplingCorrection,
		ForceOnPolicyRatio: c.ForceOnPolicyRatio, DisablePPORatio: c.DisablePPORatio, CISPO: c.UseCISPO,
	}
	bad := func(key string, val any, why string) (LossOptions, error) {
		return LossOptions{}, &GuardError{Key: "loss_fn." + key, Value: fmt.Sprint(val), Why: why}
	}
	if c.UseKLInReward {
		return bad("use_kl_in_reward", true, "tracegrpo does not add the KL penalty to the reward")
	}
	if c.PositiveExampleNLLWeight != 0 {
		return bad("positive_example_nll_weight", c.PositiveExampleNLLWeight, "the positive-example NLL term is normalized per micro-batch, which breaks micro-batch invariance; tracegrpo does not implement it")
	}
	if !c.TokenLevelLoss {
		return bad("token_level_loss", false, "multi-trace GRPO requires token-level loss (sequence normalization depends on trace boundaries)")
	}
	if c.SequenceLevelImportanceRatios {
		return bad("sequence_level_importance_ratios", true, "multi-trace GRPO requires token-level ratios (sequence ratios depend on trace boundaries)")
	}
	if !(c.RatioClipMin >= 0) || !(c.RatioClipMax >= 0) || math.IsInf(c.RatioClipMin, 0) || math.IsInf(c.RatioClipMax, 0) {
		return bad("ratio_clip_min/max", fmt.Sprintf("%g/%g", c.RatioClipMin, c.RatioClipMax), "want finite numbers >= 0")
	}
	if c.RatioClipC != nil {
		if !(*c.RatioClipC > 1) || math.IsInf(*c.RatioClipC, 0) {
			return bad("ratio_clip_c", *c.RatioClipC, "the dual-clip bound must be a finite number > 1")
		}
		o.RatioClipC = *c.RatioClipC
	}
	switch c.ReferencePolicyKLType {
	case "k1", "k2", "k3":
	default:
		return bad("reference_policy_kl_type", c.ReferencePolicyKLType, "want k1, k2 or k3")
	}
	if math.IsNaN(c.ReferencePolicyKLPenalty) || math.IsInf(c.ReferencePolicyKLPenalty, 0) {
		return bad("reference_policy_kl_penalty", c.ReferencePolicyKLPenalty, "want a finite number")
	}
	if c.KLInputClampValue != nil {
		if !(*c.KLInputClampValue > 0) {
			return bad("kl_input_clamp_value", *c.KLInputClampValue, "want > 0 or null")
		}
		o.KLInputClamp = *c.KLInputClampValue
	}
	if c.KLOutputClampValue != nil {
		if !(*c.KLOutputClampValue > 0) {
			return bad("kl_output_clamp_value", *c.KLOutputClampValue, "want > 0 or null")
		}
		o.KLOutputClamp = *c.KLOutputClampValue
	}
	if c.ForceOnPolicyRatio && c.DisablePPORatio {
		return bad("force_on_policy_ratio", true, "incompatible with disable_ppo_ratio")
	}
	if c.UseCISPO {
		switch {
		case c.DisablePPORatio:
			return bad("use_cispo", true, "CISPO needs the π/π_old ratio that disable_ppo_ratio removes")
		case c.ForceOnPolicyRatio:
			return bad("use_cispo", true, "forcing the ratio to 1 removes the clipped weight CISPO optimizes")
		case c.RatioClipC != nil:
			return bad("use_cispo", true, "CISPO is incompatible with dual clipping (ratio_clip_c must be null)")
		}
	}
	if t := c.TruncatedImportanceSamplingType; t != nil {
		o.TISType = *t
		switch *t {
		case TISTruncate, TISIcePop, TISSeqMaskTIS:
		default:
			return bad("truncated_importance_sampling_type", *t, "want tis, icepop, seq-mask-tis or null")
		}
		if *t == TISSeqMaskTIS {
			if c.UseImportanceSamplingCorrection {
				return bad("truncated_importance_sampling_type", *t, "seq-mask-tis masks whole traces by a sequence-level ratio, which depends on trace boundaries; multi-trace GRPO supports it only with use_importance_sampling_correction false")
			}
			// Inert: the weights are unused when correction is off.
			o.TISType = TISNone
			return o, nil
		}
		if !c.UseImportanceSamplingCorrection {
			return bad("truncated_importance_sampling_type", *t, "truncated importance sampling requires use_importance_sampling_correction")
		}
		r := c.TruncatedImportanceSamplingRatio
		if r == nil || !(*r > 0) || math.IsInf(*r, 0) {
			return bad("truncated_importance_sampling_ratio", fmtPtr(r), "want a finite number > 0 with a truncation type")
		}
		o.TISMax = *r
		if mn := c.TruncatedImportanceSamplingRatioMin; mn != nil {
			if !(*mn >= 0) || *mn > *r {
				return bad("truncated_importance_sampling_ratio_min", *mn, fmt.Sprintf("want 0 <= min <= truncated_importance_sampling_ratio (%g)", *r))
			}
			o.TISMin = *mn
		} else if *t == TISIcePop {
			return bad("truncated_importance_sampling_ratio_min", "null", "icepop needs a lower bound")
		}
	}
	return o, nil
}

func fmtPtr(p *float64) string {
	if p == nil {
		return "null"
	}
	return fmt.Sprint(*p)
}

// LossRow is one row of a micro-batch as the loss sees it. All slices have the
// row's length T and follow the alignment convention of the package doc.
type LossRow struct {
	LP    []float64 // (T) current log-probs (with gradient)
	LPOld []float64 // (T) prev_logprobs; ignored (may be nil) with ForceOnPolicyRatio
	LPGen []float64 // (T) behaviour log-probs
	LPRef []float64 // (T) reference log-probs; may be nil when KLPenalty == 0
	Mask  []int8    // (T) token mask
	// SampleMask and Advantage are the row's (Row.SampleMask, Row.Advantage).
	SampleMask float64
	Advantage  float64
	DLP        []float64 // (T) output: dLoss/dLP, assigned (=); DLP[0] = 0
	// LPKL, when not nil, are the current log-probs the KL term reads
	// instead of LP: under a top-k/top-p filter NeMo RL's actor loss reads
	// the filtered log-probs and its KL penalty (and the KL's importance
	// weights) the unfiltered ones, curr_logprobs_unfiltered
	// (nemo_rl/algorithms/loss/loss_functions.py at 7ea279abfbeb, lines
	// 393-395 and 468-500). The KL's gradient then goes to DLPKL (=).
	LPKL  []float64 // (T)
	DLPKL []float64 // (T) output with LPKL
}

// LossSums are a micro-batch's contributions. Loss, ActorLoss and KLLoss are
// already divided by G_tok + 1e-8 (the micro-batch's exact share); the other
// fields are raw sums over eligible tokens, weighted by m = mask·sample_mask,
// and extrema over tokens with m > 0. Add combines micro-batches.
type LossSums struct {
	Loss, ActorLoss, KLLoss float64

	Tokens                 float64 // Σ m
	EligibleTokens         int     // #(m > 0)
	NonzeroAdvantageTokens int     // #(m > 0 and A != 0)

	RatioSum, RatioClampedSum float64 // Σ m·r, Σ m·r̂
	RatioMin, RatioMax        float64
	ClipLow, ClipHigh         float64 // Σ m over r < 1−ε_low, r > 1+ε_high (PPO ratio only)

	ISWeightSum        float64 // Σ m·w (w truncated as configured, computed even without correction)
	ISWeightMin        float64
	ISWeightMax        float64
	ISOutOfBounds      float64 // Σ m over tokens outside the truncation bounds
	KLSum              float64 // Σ m·kl_t (β included)
	TokenMultProbError float64 // Σ m·exp(|lp_gen − lp_old|·m)
	GenKLError         float64 // Σ m·k(lp_old − lp_gen), no clamps
}

// NewLossSums is the identity of Add.
func NewLossSums() LossSums {
	inf := math.Inf(1)
	return LossSums{RatioMin: inf, RatioMax: -inf, ISWeightMin: inf, ISWeightMax: -inf}
}

// Add accumulates o into s.
func (s *LossSums) Add(o LossSums) {
	s.Loss += o.Loss
	s.ActorLoss += o.ActorLoss
	s.KLLoss += o.KLLoss
	s.Tokens += o.Tokens
	s.EligibleTokens += o.EligibleTokens
	s.NonzeroAdvantageTokens += o.NonzeroAdvantageTokens
	s.RatioSum += o.RatioSum
	s.RatioClampedSum += o.RatioClampedSum
	s.RatioMin = math.Min(s.RatioMin, o.RatioMin)
	s.RatioMax = math.Max(s.RatioMax, o.RatioMax)
	s.ClipLow += o.ClipLow
	s.ClipHigh += o.ClipHigh
	s.ISWeightSum += o.ISWeightSum
	s.ISWeightMin = math.Min(s.ISWeightMin, o.ISWeightMin)
	s.ISWeightMax = math.Max(s.ISWeightMax, o.ISWeightMax)
	s.ISOutOfBounds += o.ISOutOfBounds
	s.KLSum += o.KLSum
	s.TokenMultProbError += o.TokenMultProbError
	s.GenKLError += o.GenKLError
}

// LossMetrics are a step's loss metrics: means over the G_tok eligible tokens.
type LossMetrics struct {
	Loss, ActorLoss, KLLoss   float64
	KL                        float64 // mean kl_t / β (NeMo RL's kl_penalty); 0 when β = 0
	Ratio, RatioMin, RatioMax float64
	RatioClamped              float64
	ClipFracLow, ClipFracHigh float64
	ISWeight                  float64
	ISWeightMin, ISWeightMax  float64
	ISOutOfBoundsFrac         float64
	TokenMultProbError        float64
	GenKLError                float64
	EligibleTokens            int
	NonzeroAdvantageTokens    int
}

// Metrics turns summed contributions into means over gTok (+1e-8, as NeMo RL).
func (s LossSums) Metrics(gTok, klPenalty float64) LossMetrics {
	d := gTok + NormEpsilon
	m := LossMetrics{
		Loss: s.Loss, ActorLoss: s.ActorLoss, KLLoss: s.KLLoss,
		Ratio: s.RatioSum / d, RatioMin: s.RatioMin, RatioMax: s.RatioMax, RatioClamped: s.RatioClampedSum / d,
		ClipFracLow: s.ClipLow / d, ClipFracHigh: s.ClipHigh / d,
		ISWeight: s.ISWeightSum / d, ISWeightMin: s.ISWeightMin, ISWeightMax: s.ISWeightMax,
		ISOutOfBoundsFrac:  s.ISOutOfBounds / d,
		TokenMultProbError: s.TokenMultProbError / d, GenKLError: s.GenKLError / d,
		EligibleTokens: s.EligibleTokens, NonzeroAdvantageTokens: s.NonzeroAdvantageTokens,
	}
	if klPenalty != 0 {
		m.KL = s.KLSum / d / klPenalty
	}
	return m
}

// kl returns k(logr) and dk/dlogr for the Schulman estimators.
func kl(kind string, logr float64) (float64, float64) {
	switch kind {
	case "k1":
		return -logr, -1
	case "k2":
		return logr * logr / 2, logr
	default:
		e := math.Exp(logr)
		return e - 1 - logr, e - 1
	}
}

// finiteOr0 is torch.nan_to_num(x, nan=0, posinf=0, neginf=0).
func finiteOr0(x float64) float64 {
	if math.IsNaN(x) || math.IsInf(x, 0) {
		return 0
	}
	return x
}

// Loss computes one micro-batch's share of the step loss, writes dLoss/dLP into
// each row's DLP, and returns the micro-batch's LossSums. gTok is the step's
// global eligible-token count (Batch.GTok). Per eligible token, with
// m = mask·sample_mask and s = m / (gTok + 1e-8) (spec §6.2–§6.5):
//
//	ratio   r = exp(lp − lp_old), r̂ = clamp(r, 1−ε_low, 1+ε_high)
//	        (force_on_policy_ratio: r = r̂ = exp(lp − sg(lp)) = 1, dr/dlp = 1;
//	         disable_ppo_ratio: r = r̂ = lp)
//	actor   ℓ = max(−A·r, −A·r̂); with c: ℓ = min(ℓ, −A·c) where A < 0
//	        (CISPO: ℓ = −A·sg(r̂)·lp)
//	weight  w = nan→0(exp(lp_old − lp_gen)), truncated by tis/icepop; w = 1
//	        without importance correction; w carries no gradient
//	KL      logr = clamp(lp_ref − lp, ±in); kl_w = exp(lp − lp_gen) (on-policy
//	        approximation) or exp(lp − sg(lp)); both detached where the input
//	        clamp is active; kl_t = β·clamp(kl_w·k(logr), ±out); with LPKL
//	        the KL term reads lp_kl where it reads lp, and its gradient is
//	        DLPKL's
//	loss    Σ (w·ℓ + kl_t)·s
//
// Ties of max/min split the gradient evenly, as torch does.
func Loss(rows []LossRow, gTok float64, o *LossOptions) (LossSums, error) {
	if !(gTok > 0) || math.IsInf(gTok, 0) {
		return LossSums{}, fmt.Errorf("grpo: loss: G_tok = %v, want a finite number > 0", gTok)
	}
	d := gTok + NormEpsilon
	sums := NewLossSums()
	var actor, klTot float64
	for b := range rows {
		r := &rows[b]
		T := len(r.LP)
		if len(r.Mask) != T || len(r.LPGen) != T || len(r.DLP) != T ||
			(!o.ForceOnPolicyRatio && len(r.LPOld) != T) || (o.KLPenalty != 0 && len(r.LPRef) != T) {
			return LossSums{}, fmt.Errorf("grpo: loss: row %d: lengths lp %d, lp_old %d, lp_gen %d, lp_ref %d, mask %d, dlp %d; want equal (lp_old unless force_on_policy_ratio, lp_ref when β != 0)",
				b, T, len(r.LPOld), len(r.LPGen), len(r.LPRef), len(r.Mask), len(r.DLP))
		}
		if r.LPKL != nil && (len(r.LPKL) != T || len(r.DLPKL) != T) {
			return LossSums{}, fmt.Errorf("grpo: loss: row %d: lp_kl %d and dlp_kl %d entries, want %d", b, len(r.LPKL), len(r.DLPKL), T)
		}
		if math.IsNaN(r.SampleMask) || r.SampleMask < 0 || math.IsInf(r.SampleMask, 0) || math.IsNaN(r.Advantage) || math.IsInf(r.Advantage, 0) {
			return LossSums{}, fmt.Errorf("grpo: loss: row %d: sample mask %v, advantage %v; want finite, mask >= 0", b, r.SampleMask, r.Advantage)
		}
		A := r.Advantage
		for t := range T {
			r.DLP[t] = 0
			if r.LPKL != nil {
				r.DLPKL[t] = 0
			}
			if t == 0 {
				continue
			}
			mk := float64(r.Mask[t]) * r.SampleMask
			if mk == 0 {
				continue
			}
			lp := r.LP[t]
			if math.IsNaN(lp) || math.IsInf(lp, 0) {
				return LossSums{}, fmt.Errorf("grpo: loss: row %d position %d: current log-prob %v on a loss token, want finite", b, t, lp)
			}
			lpOld := lp
			if !o.ForceOnPolicyRatio {
				lpOld = r.LPOld[t]
			}
			lpGen := r.LPGen[t]

			// Ratio and surrogate.
			var ratio, dRatio, clamped, dClamped float64
			switch {
			case o.ForceOnPolicyRatio:
				ratio, dRatio, clamped, dClamped = 1, 1, 1, 1
			case o.DisablePPORatio:
				ratio, dRatio, clamped, dClamped = lp, 1, lp, 1
			default:
				ratio = math.Exp(lp - lpOld)
				dRatio = ratio
				lo, hi := 1-o.RatioClipMin, 1+o.RatioClipMax
				clamped, dClamped = ratio, ratio
				if ratio < lo {
					clamped, dClamped = lo, 0
				} else if ratio > hi {
					clamped, dClamped = hi, 0
				}
				if ratio < lo {
					sums.ClipLow += mk
				}
				if ratio > hi {
					sums.ClipHigh += mk
				}
			}
			var ell, dEll float64
			if o.CISPO {
				ell, dEll = -A*clamped*lp, -A*clamped
			} else {
				l1, l2 := -A*ratio, -A*clamped
				switch {
				case l1 > l2:
					ell, dEll = l1, -A*dRatio
				case l2 > l1:
					ell, dEll = l2, -A*dClamped
				default:
					ell, dEll = l1, -A*(dRatio+dClamped)/2
				}
			}
			if o.RatioClipC != 0 && A < 0 {
				l3 := -A * o.RatioClipC
				switch {
				case ell > l3:
					ell, dEll = l3, 0
				case ell == l3:
					dEll /= 2
				}
			}

			// Behaviour importance weight (no gradient).
			w := finiteOr0(math.Exp(lpOld - lpGen))
			switch o.TISType {
			case TISTruncate:
				if w > o.TISMax || w < o.TISMin {
					sums.ISOutOfBounds += mk
				}
				w = math.Min(math.Max(w, o.TISMin), o.TISMax)
			case TISIcePop:
				if w < o.TISMin || w > o.TISMax {
					sums.ISOutOfBounds += mk
					w = 0
				}
			}
			sums.ISWeightSum += mk * w
			sums.ISWeightMin = math.Min(sums.ISWeightMin, w)
			sums.ISWeightMax = math.Max(sums.ISWeightMax, w)
			if !o.ISCorrection {
				w = 1
			}

			// KL penalty.
			var klT, dKL float64
			lpKL := lp
			if r.LPKL != nil {
				if lpKL = r.LPKL[t]; math.IsNaN(lpKL) || math.IsInf(lpKL, 0) {
					return LossSums{}, fmt.Errorf("grpo: loss: row %d position %d: unfiltered log-prob %v on a loss token, want finite", b, t, lpKL)
				}
			}
			if o.KLPenalty != 0 {
				raw := r.LPRef[t] - lpKL
				logr, dLogr := raw, -1.0
				inClamped := false
				if raw > o.KLInputClamp {
					logr, dLogr, inClamped = o.KLInputClamp, 0, true
				} else if raw < -o.KLInputClamp {
					logr, dLogr, inClamped = -o.KLInputClamp, 0, true
				}
				k, dk := kl(o.KLType, logr)
				kw, dkw := 1.0, 1.0
				if o.OnPolicyKLApprox {
					kw = math.Exp(lpKL - lpGen)
					dkw = kw
				}
				if math.IsNaN(kw) || math.IsInf(kw, 0) {
					kw, dkw = 0, 0
				}
				if inClamped {
					dkw = 0
				}
				v := kw * k
				dv := dkw*k + kw*dk*dLogr
				if v > o.KLOutputClamp {
					v, dv = o.KLOutputClamp, 0
				} else if v < -o.KLOutputClamp {
					v, dv = -o.KLOutputClamp, 0
				}
				klT, dKL = o.KLPenalty*v, o.KLPenalty*dv
			}

			actor += w * ell * mk
			klTot += klT * mk
			if r.LPKL != nil {
				r.DLP[t] = w * dEll * mk / d
				r.DLPKL[t] = dKL * mk / d
			} else {
				r.DLP[t] = (w*dEll + dKL) * mk / d
			}

			sums.Tokens += mk
			sums.EligibleTokens++
			if A != 0 {
				sums.NonzeroAdvantageTokens++
			}
			sums.RatioSum += mk * ratio
			sums.RatioClampedSum += mk * clamped
			sums.RatioMin = math.Min(sums.RatioMin, ratio)
			sums.RatioMax = math.Max(sums.RatioMax, ratio)
			sums.KLSum += mk * klT
			sums.TokenMultProbError += mk * math.Exp(math.Abs(lpGen-lpOld)*mk)
			g, _ := kl(o.KLType, lpOld-lpGen)
			sums.GenKLError += mk * g
		}
	}
	sums.ActorLoss = actor / d
	sums.KLLoss = klTot / d
	sums.Loss = sums.ActorLoss + sums.KLLoss
	return sums, nil
}
