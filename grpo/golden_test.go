package grpo

import (
	"encoding/json"
	"fmt"
	"math"
	"os"
	"testing"

	"github.com/tracegrpo/tracegrpo/config"
)

// Tolerances against the PyTorch goldens (float64 on both sides; the only
// differences are summation order and exp/log rounding).
const (
	goldenRTol = 1e-10
	goldenATol = 1e-12
)

type goldenRow struct {
	LP         []float64 `json:"lp"`
	LPOld      []float64 `json:"lp_old"`
	LPGen      []float64 `json:"lp_gen"`
	LPRef      []float64 `json:"lp_ref"`
	Mask       []int8    `json:"mask"`
	SampleMask float64   `json:"sample_mask"`
	Advantage  float64   `json:"advantage"`
}

type goldenMetrics struct {
	Tokens                 float64  `json:"tokens"`
	EligibleTokens         int      `json:"eligible_tokens"`
	NonzeroAdvantageTokens int      `json:"nonzero_advantage_tokens"`
	RatioSum               float64  `json:"ratio_sum"`
	RatioClampedSum        float64  `json:"ratio_clamped_sum"`
	RatioMin               *float64 `json:"ratio_min"`
	RatioMax               *float64 `json:"ratio_max"`
	ClipLow                float64  `json:"clip_low"`
	ClipHigh               float64  `json:"clip_high"`
	ISWeightSum            float64  `json:"is_weight_sum"`
	ISWeightMin            *float64 `json:"is_weight_min"`
	ISWeightMax            *float64 `json:"is_weight_max"`
	ISOOB                  float64  `json:"is_oob"`
	KLSum                  float64  `json:"kl_sum"`
	TokenMultProbError     float64  `json:"token_mult_prob_error"`
	GenKLError             float64  `json:"gen_kl_error"`
}

type goldenLossCase struct {
	Name      string        `json:"name"`
	Options   config.LossFn `json:"-"`
	RawOpts   goldenOptions `json:"options"`
	GTok      float64       `json:"g_tok"`
	Rows      []goldenRow   `json:"rows"`
	Loss      float64       `json:"loss"`
	ActorLoss float64       `json:"actor_loss"`
	KLLoss    float64       `json:"kl_loss"`
	DLP       [][]float64   `json:"dlp"`
	Metrics   goldenMetrics `json:"metrics"`
}

type goldenOptions struct {
	RatioClipMin                        float64  `json:"ratio_clip_min"`
	RatioClipMax                        float64  `json:"ratio_clip_max"`
	RatioClipC                          *float64 `json:"ratio_clip_c"`
	ReferencePolicyKLPenalty            float64  `json:"reference_policy_kl_penalty"`
	ReferencePolicyKLType               string   `json:"reference_policy_kl_type"`
	KLInputClampValue                   *float64 `json:"kl_input_clamp_value"`
	KLOutputClampValue                  *float64 `json:"kl_output_clamp_value"`
	UseOnPolicyKLApproximation          bool     `json:"use_on_policy_kl_approximation"`
	UseImportanceSamplingCorrection     bool     `json:"use_importance_sampling_correction"`
	TruncatedImportanceSamplingType     *string  `json:"truncated_importance_sampling_type"`
	TruncatedImportanceSamplingRatio    *float64 `json:"truncated_importance_sampling_ratio"`
	TruncatedImportanceSamplingRatioMin *float64 `json:"truncated_importance_sampling_ratio_min"`
	ForceOnPolicyRatio                  bool     `json:"force_on_policy_ratio"`
	DisablePPORatio                     bool     `json:"disable_ppo_ratio"`
	UseCISPO                            bool     `json:"use_cispo"`
}

func (g goldenOptions) lossFn() config.LossFn {
	return config.LossFn{
		ReferencePolicyKLPenalty: g.ReferencePolicyKLPenalty, ReferencePolicyKLType: g.ReferencePolicyKLType,
		KLInputClampValue: g.KLInputClampValue, KLOutputClampValue: g.KLOutputClampValue,
		RatioClipMin: g.RatioClipMin, RatioClipMax: g.RatioClipMax, RatioClipC: g.RatioClipC,
		UseOnPolicyKLApproximation: g.UseOnPolicyKLApproximation, UseImportanceSamplingCorrection: g.UseImportanceSamplingCorrection,
		TruncatedImportanceSamplingType: g.TruncatedImportanceSamplingType, TruncatedImportanceSamplingRatio: g.TruncatedImportanceSamplingRatio,
		TruncatedImportanceSamplingRatioMin: g.TruncatedImportanceSamplingRatioMin,
		TokenLevelLoss:                      true,
		ForceOnPolicyRatio:                  g.ForceOnPolicyRatio, DisablePPORatio: g.DisablePPORatio, UseCISPO: g.UseCISPO,
	}
}

type goldenAdvCase struct {
	Name      string     `json:"name"`
	Groups    []int64    `json:"groups"`
	Rewards   []float64  `json:"rewards"`
	Valid     []bool     `json:"valid"`
	Normalize bool       `json:"normalize_rewards"`
	LeaveOne  bool       `json:"leave_one_out"`
	ClipLow   *float64   `json:"clip_low"`
	ClipHigh  *float64   `json:"clip_high"`
	Advantage []float64  `json:"advantage"`
	Baseline  []float64  `json:"baseline"`
	Std       []*float64 `json:"std"`
}

type goldenFile struct {
	Meta struct {
		Script string `json:"script"`
		Seed   int64  `json:"seed"`
		Torch  string `json:"torch"`
	} `json:"meta"`
	LossCases      []goldenLossCase `json:"loss_cases"`
	AdvantageCases []goldenAdvCase  `json:"advantage_cases"`
}

func readGolden(t *testing.T) *goldenFile {
	t.Helper()
	b, err := os.ReadFile("testdata/golden_grpo.json")
	if err != nil {
		t.Fatalf("%v (regenerate with: make golden, or /usr/bin/python3 scripts/golden_grpo.py)", err)
	}
	var g goldenFile
	if err := json.Unmarshal(b, &g); err != nil {
		t.Fatalf("testdata/golden_grpo.json: %v", err)
	}
	if g.Meta.Script != "scripts/golden_grpo.py" || g.Meta.Torch == "" {
		t.Fatalf("golden metadata %+v: want script scripts/golden_grpo.py and a torch version", g.Meta)
	}
	return &g
}

// closeTo reports |got-want| <= atol + rtol·|want|.
func closeTo(got, want, rtol, atol float64) bool {
	if math.IsInf(want, 0) || math.IsInf(got, 0) {
		return got == want
	}
	return math.Abs(got-want) <= atol+rtol*math.Abs(want)
}

// cmpVals compares named values and reports the max errors and the first
// mismatches.
type cmpVals struct {
	t        *testing.T
	name     string
	maxAbs   float64
	maxRel   float64
	failures int
}

func (c *cmpVals) check(where string, got, want float64) {
	c.t.Helper()
	abs := math.Abs(got - want)
	if abs > c.maxAbs {
		c.maxAbs = abs
	}
	if want != 0 && abs/math.Abs(want) > c.maxRel {
		c.maxRel = abs / math.Abs(want)
	}
	if !closeTo(got, want, goldenRTol, goldenATol) {
		c.failures++
		if c.failures <= 5 {
			c.t.Errorf("%s: %s = %.17g, want %.17g", c.name, where, got, want)
		}
	}
}

func (c *cmpVals) done() {
	c.t.Helper()
	if c.failures > 0 {
		c.t.Errorf("%s: %d mismatches; max abs err %.3g, max rel err %.3g", c.name, c.failures, c.maxAbs, c.maxRel)
	}
}

func lossRowsFromGolden(rows []goldenRow) []LossRow {
	out := make([]LossRow, len(rows))
	for i, r := range rows {
		out[i] = LossRow{LP: r.LP, LPOld: r.LPOld, LPGen: r.LPGen, LPRef: r.LPRef, Mask: r.Mask,
			SampleMask: r.SampleMask, Advantage: r.Advantage, DLP: make([]float64, len(r.LP))}
	}
	return out
}

// TestLossGolden checks the loss, every per-token gradient and the metric sums
// against the independent PyTorch implementation (autograd gradient).
func TestLossGolden(t *testing.T) {
	g := readGolden(t)
	if len(g.LossCases) < 20 {
		t.Fatalf("%d loss cases, want >= 20", len(g.LossCases))
	}
	seen := map[string]bool{}
	for _, tc := range g.LossCases {
		t.Run(tc.Name, func(t *testing.T) {
			lf := tc.RawOpts.lossFn()
			o, err := NewLossOptions(&lf)
			if err != nil {
				t.Fatalf("NewLossOptions: %v", err)
			}
			markOptions(seen, &o)
			rows := lossRowsFromGolden(tc.Rows)
			s, err := Loss(rows, tc.GTok, &o)
			if err != nil {
				t.Fatalf("Loss: %v", err)
			}
			c := &cmpVals{t: t, name: tc.Name}
			c.check("loss", s.Loss, tc.Loss)
			c.check("actor_loss", s.ActorLoss, tc.ActorLoss)
			c.check("kl_loss", s.KLLoss, tc.KLLoss)
			for b := range rows {
				for p := range rows[b].DLP {
					c.check(fmt.Sprintf("dlp[%d][%d]", b, p), rows[b].DLP[p], tc.DLP[b][p])
				}
			}
			m := tc.Metrics
			c.check("tokens", s.Tokens, m.Tokens)
			c.check("eligible", float64(s.EligibleTokens), float64(m.EligibleTokens))
			c.check("nonzero_adv", float64(s.NonzeroAdvantageTokens), float64(m.NonzeroAdvantageTokens))
			c.check("ratio_sum", s.RatioSum, m.RatioSum)
			c.check("ratio_clamped_sum", s.RatioClampedSum, m.RatioClampedSum)
			c.check("clip_low", s.ClipLow, m.ClipLow)
			c.check("clip_high", s.ClipHigh, m.ClipHigh)
			c.check("is_weight_sum", s.ISWeightSum, m.ISWeightSum)
			c.check("is_oob", s.ISOutOfBounds, m.ISOOB)
			c.check("kl_sum", s.KLSum, m.KLSum)
			c.check("token_mult_prob_error", s.TokenMultProbError, m.TokenMultProbError)
			c.check("gen_kl_error", s.GenKLError, m.GenKLError)
			ext := func(name string, got float64, want *float64, none float64) {
				if want == nil {
					c.check(name, got, none)
					return
				}
				c.check(name, got, *want)
			}
			ext("ratio_min", s.RatioMin, m.RatioMin, math.Inf(1))
			ext("ratio_max", s.RatioMax, m.RatioMax, math.Inf(-1))
			ext("is_weight_min", s.ISWeightMin, m.ISWeightMin, math.Inf(1))
			ext("is_weight_max", s.ISWeightMax, m.ISWeightMax, math.Inf(-1))
			c.done()
		})
	}
	// Together the goldens must exercise every loss option.
	for _, opt := range []string{"k1", "k2", "k3", "no-kl", "dual-clip", "asymmetric", "is-correction", "tis", "tis-min", "icepop",
		"on-policy-kl", "input-clamp", "no-input-clamp", "no-output-clamp", "force-on-policy", "disable-ppo", "cispo"} {
		if !seen[opt] {
			t.Errorf("no golden case exercises %s", opt)
		}
	}
}

func markOptions(seen map[string]bool, o *LossOptions) {
	if o.KLPenalty == 0 {
		seen["no-kl"] = true
	} else {
		seen[o.KLType] = true
	}
	set := map[string]bool{
		"dual-clip": o.RatioClipC != 0, "asymmetric": o.RatioClipMin != o.RatioClipMax,
		"is-correction": o.ISCorrection, "tis": o.TISType == TISTruncate, "tis-min": o.TISType == TISTruncate && o.TISMin > 0,
		"icepop": o.TISType == TISIcePop, "on-policy-kl": o.OnPolicyKLApprox,
		"input-clamp": !math.IsInf(o.KLInputClamp, 1), "no-input-clamp": math.IsInf(o.KLInputClamp, 1),
		"no-output-clamp": math.IsInf(o.KLOutputClamp, 1), "force-on-policy": o.ForceOnPolicyRatio,
		"disable-ppo": o.DisablePPORatio, "cispo": o.CISPO,
	}
	for k, v := range set {
		if v {
			seen[k] = true
		}
	}
}

func TestAdvantageGolden(t *testing.T) {
	g := readGolden(t)
	if len(g.AdvantageCases) < 10 {
		t.Fatalf("%d advantage cases, want >= 10", len(g.AdvantageCases))
	}
	for _, tc := range g.AdvantageCases {
		t.Run(tc.Name, func(t *testing.T) {
			res, err := Advantages(tc.Groups, tc.Rewards, tc.Valid, AdvantageOptions{
				NormalizeRewards: tc.Normalize, LeaveOneOut: tc.LeaveOne, ClipLow: tc.ClipLow, ClipHigh: tc.ClipHigh})
			if err != nil {
				t.Fatal(err)
			}
			c := &cmpVals{t: t, name: tc.Name}
			for i := range tc.Rewards {
				c.check(fmt.Sprintf("advantage[%d]", i), res.Advantage[i], tc.Advantage[i])
				c.check(fmt.Sprintf("baseline[%d]", i), res.Baseline[i], tc.Baseline[i])
				want := math.Inf(1)
				if tc.Std[i] != nil {
					want = *tc.Std[i]
				}
				c.check(fmt.Sprintf("std[%d]", i), res.Std[i], want)
			}
			c.done()
		})
	}
}
