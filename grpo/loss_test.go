package grpo

import (
	"math"
	"math/rand/v2"
	"strings"
	"testing"

	"github.com/tracegrpo/tracegrpo/config"
	"github.com/tracegrpo/tracegrpo/gym"
)

// tolSum is the tolerance between sums of the same terms in a different order.
const tolSum = 1e-13

func f64p(v float64) *float64 { return &v }
func strp(s string) *string   { return &s }

// lossVariants are option sets for the property tests (every option appears).
func lossVariants(t *testing.T) []LossOptions {
	t.Helper()
	base := config.Default().LossFn
	mods := []func(*config.LossFn){
		func(*config.LossFn) {},
		func(l *config.LossFn) { l.ReferencePolicyKLType = "k1"; l.ReferencePolicyKLPenalty = 0.2 },
		func(l *config.LossFn) {
			l.ReferencePolicyKLType = "k2"
			l.KLInputClampValue = f64p(0.3)
			l.KLOutputClampValue = f64p(0.05)
			l.UseOnPolicyKLApproximation = true
		},
		func(l *config.LossFn) { l.RatioClipMin, l.RatioClipMax, l.RatioClipC = 0.1, 0.3, f64p(2) },
		func(l *config.LossFn) {
			l.UseImportanceSamplingCorrection = true
			l.TruncatedImportanceSamplingType = strp("tis")
			l.TruncatedImportanceSamplingRatio = f64p(1.2)
		},
		func(l *config.LossFn) {
			l.UseImportanceSamplingCorrection = true
			l.TruncatedImportanceSamplingType = strp("icepop")
			l.TruncatedImportanceSamplingRatio = f64p(1.3)
			l.TruncatedImportanceSamplingRatioMin = f64p(0.8)
		},
		func(l *config.LossFn) { l.ForceOnPolicyRatio = true },
		func(l *config.LossFn) { l.DisablePPORatio = true; l.ReferencePolicyKLPenalty = 0 },
		func(l *config.LossFn) { l.UseCISPO = true },
	}
	var out []LossOptions
	for i, m := range mods {
		l := base
		m(&l)
		o, err := NewLossOptions(&l)
		if err != nil {
			t.Fatalf("variant %d: %v", i, err)
		}
		out = append(out, o)
	}
	return out
}

func randomRows(rng *rand.Rand, n int) []LossRow {
	rows := make([]LossRow, n)
	for b := range rows {
		T := 2 + rng.IntN(9)
		r := LossRow{LP: make([]float64, T), LPOld: make([]float64, T), LPGen: make([]float64, T), LPRef: make([]float64, T),
			Mask: make([]int8, T), DLP: make([]float64, T), SampleMask: 1, Advantage: rng.NormFloat64()}
		if rng.IntN(5) == 0 {
			r.SampleMask = 0
		}
		if rng.IntN(6) == 0 {
			r.Advantage = 0
		}
		for p := range T {
			r.LP[p] = math.Log(0.02 + 0.96*rng.Float64())
			r.LPOld[p] = r.LP[p] + 0.4*rng.NormFloat64()
			r.LPGen[p] = r.LPOld[p] + 0.3*rng.NormFloat64()
			r.LPRef[p] = r.LP[p] + 0.6*rng.NormFloat64()
			if p > 0 && rng.IntN(3) > 0 {
				r.Mask[p] = 1
			}
		}
		rows[b] = r
	}
	return rows
}

// setPartitions calls f with every partition of {0..n-1} into blocks.
func setPartitions(n int, f func([][]int)) {
	assign := make([]int, n)
	var rec func(i, blocks int)
	rec = func(i, blocks int) {
		if i == n {
			parts := make([][]int, blocks)
			for k, b := range assign {
				parts[b] = append(parts[b], k)
			}
			f(parts)
			return
		}
		for b := 0; b <= blocks; b++ {
			assign[i] = b
			nb := blocks
			if b == blocks {
				nb++
			}
			rec(i+1, nb)
		}
	}
	rec(0, 0)
}

func copyRows(rows []LossRow, idx []int) []LossRow {
	out := make([]LossRow, len(idx))
	for k, i := range idx {
		out[k] = rows[i]
		out[k].DLP = make([]float64, len(rows[i].LP))
	}
	return out
}

// TestLossPartitionInvariance: for random batches and every partition of the
// rows into micro-batches, the micro-batch losses and metric sums add up to the
// whole batch's, and every per-token gradient equals the whole-batch gradient.
func TestLossPartitionInvariance(t *testing.T) {
	rng := rand.New(rand.NewPCG(3, 1))
	variants := lossVariants(t)
	partitions := 0
	for trial := range 24 {
		o := variants[trial%len(variants)]
		rows := randomRows(rng, 1+rng.IntN(6))
		g := 0.0
		for _, r := range rows {
			for p := 1; p < len(r.Mask); p++ {
				g += float64(r.Mask[p]) * r.SampleMask
			}
		}
		g += float64(rng.IntN(3)) // sometimes a shard of a larger step
		if g == 0 {
			g = 1
		}
		whole, err := Loss(rows, g, &o)
		if err != nil {
			t.Fatal(err)
		}
		setPartitions(len(rows), func(parts [][]int) {
			partitions++
			sum := NewLossSums()
			for _, part := range parts {
				mb := copyRows(rows, part)
				s, err := Loss(mb, g, &o)
				if err != nil {
					t.Fatal(err)
				}
				sum.Add(s)
				for k, i := range part {
					for p := range mb[k].DLP {
						if mb[k].DLP[p] != rows[i].DLP[p] {
							t.Fatalf("trial %d partition %v: dlp[%d][%d] = %g, whole batch %g", trial, parts, i, p, mb[k].DLP[p], rows[i].DLP[p])
						}
					}
				}
			}
			pairs := []struct {
				name      string
				got, want float64
			}{
				{"loss", sum.Loss, whole.Loss}, {"actor", sum.ActorLoss, whole.ActorLoss}, {"kl", sum.KLLoss, whole.KLLoss},
				{"tokens", sum.Tokens, whole.Tokens}, {"ratio_sum", sum.RatioSum, whole.RatioSum},
				{"ratio_min", sum.RatioMin, whole.RatioMin}, {"ratio_max", sum.RatioMax, whole.RatioMax},
				{"clip_low", sum.ClipLow, whole.ClipLow}, {"clip_high", sum.ClipHigh, whole.ClipHigh},
				{"is_sum", sum.ISWeightSum, whole.ISWeightSum}, {"is_oob", sum.ISOutOfBounds, whole.ISOutOfBounds},
				{"kl_sum", sum.KLSum, whole.KLSum}, {"mult_prob", sum.TokenMultProbError, whole.TokenMultProbError},
				{"gen_kl", sum.GenKLError, whole.GenKLError},
				{"eligible", float64(sum.EligibleTokens), float64(whole.EligibleTokens)},
			}
			for _, p := range pairs {
				if !closeTo(p.got, p.want, tolSum, tolSum) {
					t.Fatalf("trial %d partition %v: %s = %.17g, whole batch %.17g", trial, parts, p.name, p.got, p.want)
				}
			}
		})
	}
	if partitions < 500 {
		t.Errorf("only %d partitions checked", partitions)
	}
}

// toyModel is a tiny causal "language model" whose log-prob of x_t depends on
// the whole prefix x_<t: score_v = φ[x_{t-1}][v] + θ[v]·Σx_<t/10 + ψ[v]·t/10.
type toyModel struct {
	V          int
	theta, psi []float64
	phi        []float64 // (V, V)
}

func newToy(rng *rand.Rand, V int) *toyModel {
	m := &toyModel{V: V, theta: make([]float64, V), psi: make([]float64, V), phi: make([]float64, V*V)}
	for i := range m.theta {
		m.theta[i], m.psi[i] = rng.NormFloat64(), rng.NormFloat64()
	}
	for i := range m.phi {
		m.phi[i] = rng.NormFloat64()
	}
	return m
}

func (m *toyModel) perturbed(rng *rand.Rand, s float64) *toyModel {
	c := &toyModel{V: m.V, theta: append([]float64(nil), m.theta...), psi: append([]float64(nil), m.psi...), phi: append([]float64(nil), m.phi...)}
	for _, p := range [][]float64{c.theta, c.psi, c.phi} {
		for i := range p {
			p[i] += s * rng.NormFloat64()
		}
	}
	return c
}

// logprobs returns lp[t] for t >= 1 and, when grad is non-nil, adds
// Σ_t dlp[t]·∂lp[t]/∂params into grad (θ, ψ, φ flattened).
func (m *toyModel) logprobs(x []int32, dlp []float64, grad []float64) []float64 {
	lp := make([]float64, len(x))
	sum := 0.0
	score := make([]float64, m.V)
	for t := 1; t < len(x); t++ {
		sum += float64(x[t-1])
		c, l := sum/10, float64(t)/10
		mx := math.Inf(-1)
		for v := range m.V {
			score[v] = m.phi[int(x[t-1])*m.V+v] + m.theta[v]*c + m.psi[v]*l
			mx = math.Max(mx, score[v])
		}
		z := 0.0
		for v := range m.V {
			z += math.Exp(score[v] - mx)
		}
		lse := mx + math.Log(z)
		lp[t] = score[x[t]] - lse
		if grad != nil && dlp[t] != 0 {
			for v := range m.V {
				d := -math.Exp(score[v] - lse)
				if v == int(x[t]) {
					d++
				}
				d *= dlp[t]
				grad[v] += d * c
				grad[m.V+v] += d * l
				grad[2*m.V+int(x[t-1])*m.V+v] += d
			}
		}
	}
	return lp
}

// TestSplitMergedEquivalence is spec §10.1 #7: the same sampled spans as one
// merged trace [1..6] with spans (2,3),(4,6), or split per request into
// [1,2,3] + [1..6], give identical loss and parameter gradients for a causal
// model; with a sibling rollout in the group G_tok = 4 and the KL penalty is 0.
func TestSplitMergedEquivalence(t *testing.T) {
	rng := rand.New(rand.NewPCG(7, 7))
	behaviour := newToy(rng, 10)
	current := behaviour.perturbed(rng, 0.3)
	env := func(id string, tokens []int32, spans ...[2]int) gym.TrainingTrace {
		tr := trace(id, tokens, 0, spans...)
		lp := behaviour.logprobs(tokens, nil, nil)
		for p, v := range tr.LossMask {
			if v == 1 {
				tr.GenerationLogprobs[p] = lp[p]
			}
		}
		return tr
	}
	sibling := LogicalRollout{RolloutID: "s", TaskGroup: 3, Reward: 0, LossMultiplier: 1,
		Envelope: envelope("s", env("s:x", []int32{1, 7, 8}, [2]int{2, 3}))}
	layouts := map[string]LogicalRollout{
		"merged": {RolloutID: "m", TaskGroup: 3, Reward: 1, LossMultiplier: 1,
			Envelope: envelope("m", env("m:b", []int32{1, 2, 3, 4, 5, 6}, [2]int{2, 3}, [2]int{4, 6}))},
		"split": {RolloutID: "m", TaskGroup: 3, Reward: 1, LossMultiplier: 1,
			Envelope: envelope("m", env("m:a", []int32{1, 2, 3}, [2]int{2, 3}), env("m:b", []int32{1, 2, 3, 4, 5, 6}, [2]int{4, 6}))},
	}
	for _, beta := range []float64{0, 0.1} {
		lf := config.Default().LossFn
		lf.ReferencePolicyKLPenalty = beta
		o, err := NewLossOptions(&lf)
		if err != nil {
			t.Fatal(err)
		}
		ref := behaviour.perturbed(rng, 0.2)
		type result struct {
			loss float64
			grad []float64
		}
		res := map[string]result{}
		for name, lr := range layouts {
			b, err := BuildBatch([]LogicalRollout{lr, sibling}, BatchOptions{MaxSeqLen: 8, RowMultiple: 2,
				Advantage: AdvantageOptions{NormalizeRewards: true, LeaveOneOut: true}})
			if err != nil {
				t.Fatal(err)
			}
			if b.GTok != 4 {
				t.Fatalf("%s: G_tok = %g, want 4", name, b.GTok)
			}
			rows := make([]LossRow, len(b.Rows))
			for i, r := range b.Rows {
				rows[i] = r.LossRow(current.logprobs(r.TokenIDs, nil, nil), behaviour.logprobs(r.TokenIDs, nil, nil),
					ref.logprobs(r.TokenIDs, nil, nil), make([]float64, len(r.TokenIDs)))
			}
			s, err := Loss(rows, b.GTok, &o)
			if err != nil {
				t.Fatal(err)
			}
			if beta == 0 && s.KLLoss != 0 {
				t.Errorf("%s: KL loss %g with β = 0", name, s.KLLoss)
			}
			grad := make([]float64, 2*current.V+current.V*current.V)
			for i, r := range b.Rows {
				current.logprobs(r.TokenIDs, rows[i].DLP, grad)
			}
			res[name] = result{s.Loss, grad}
		}
		m, sp := res["merged"], res["split"]
		if m.loss == 0 {
			t.Fatalf("β=%g: loss is 0; the test would not see a difference", beta)
		}
		if !closeTo(sp.loss, m.loss, tolSum, tolSum) {
			t.Errorf("β=%g: loss split %.17g, merged %.17g", beta, sp.loss, m.loss)
		}
		nonzero := 0
		for i := range m.grad {
			if m.grad[i] != 0 {
				nonzero++
			}
			if !closeTo(sp.grad[i], m.grad[i], tolSum, tolSum) {
				t.Errorf("β=%g: grad[%d] split %.17g, merged %.17g", beta, i, sp.grad[i], m.grad[i])
			}
		}
		if nonzero == 0 {
			t.Errorf("β=%g: all parameter gradients are 0", beta)
		}
	}
}

// TestLossByHand: one token with ratio 1.25 above the clip 1.2 and A = 1:
// ℓ = max(−1.25, −1.2) = −1.2, the gradient is 0 (clamped branch) and the token
// counts as clipped high.
func TestLossByHand(t *testing.T) {
	lf := config.Default().LossFn
	lf.ReferencePolicyKLPenalty = 0
	o, err := NewLossOptions(&lf)
	if err != nil {
		t.Fatal(err)
	}
	rows := []LossRow{{LP: []float64{0, math.Log(0.5)}, LPOld: []float64{0, math.Log(0.4)}, LPGen: []float64{0, math.Log(0.4)},
		Mask: []int8{0, 1}, SampleMask: 1, Advantage: 1, DLP: []float64{7, 7}}}
	s, err := Loss(rows, 1, &o)
	if err != nil {
		t.Fatal(err)
	}
	m := s.Metrics(1, 0)
	if !closeTo(s.Loss, -1.2/(1+NormEpsilon), 1e-15, 0) || rows[0].DLP[1] != 0 || rows[0].DLP[0] != 0 {
		t.Errorf("loss %.17g dlp %v; want -1.2/(1+1e-8) and [0 0]", s.Loss, rows[0].DLP)
	}
	if !closeTo(m.ClipFracHigh, 1/(1+NormEpsilon), 1e-15, 0) || m.ClipFracLow != 0 || !closeTo(m.RatioMax, 1.25, 1e-15, 0) {
		t.Errorf("metrics %+v", m)
	}
	// Inside the clip range the gradient is −A·r/G.
	rows[0].LP[1] = math.Log(0.42)
	if _, err := Loss(rows, 2, &o); err != nil {
		t.Fatal(err)
	}
	if want := -1.05 / (2 + NormEpsilon); !closeTo(rows[0].DLP[1], want, 1e-14, 0) {
		t.Errorf("dlp = %.17g, want %.17g", rows[0].DLP[1], want)
	}
}

func TestLossRejects(t *testing.T) {
	lf := config.Default().LossFn
	o, err := NewLossOptions(&lf)
	if err != nil {
		t.Fatal(err)
	}
	mk := func() []LossRow {
		return []LossRow{{LP: []float64{0, -1}, LPOld: []float64{0, -1}, LPGen: []float64{0, -1}, LPRef: []float64{0, -1},
			Mask: []int8{0, 1}, SampleMask: 1, Advantage: 1, DLP: make([]float64, 2)}}
	}
	cases := []struct {
		name   string
		g      float64
		mutate func([]LossRow)
		want   string
	}{
		{"G_tok 0", 0, func([]LossRow) {}, "G_tok = 0"},
		{"short dlp", 1, func(r []LossRow) { r[0].DLP = r[0].DLP[:1] }, "dlp 1"},
		{"missing ref", 1, func(r []LossRow) { r[0].LPRef = nil }, "lp_ref 0"},
		{"NaN lp", 1, func(r []LossRow) { r[0].LP[1] = math.NaN() }, "position 1"},
		{"negative sample mask", 1, func(r []LossRow) { r[0].SampleMask = -1 }, "sample mask -1"},
	}
	for _, tc := range cases {
		rows := mk()
		tc.mutate(rows)
		if _, err := Loss(rows, tc.g, &o); err == nil || !strings.Contains(err.Error(), tc.want) {
			t.Errorf("%s: err = %v, want %q", tc.name, err, tc.want)
		}
	}
}

func TestNewLossOptionsRejects(t *testing.T) {
	cases := []struct {
		name string
		mod  func(*config.LossFn)
		key  string
	}{
		{"cispo+dual clip", func(l *config.LossFn) { l.UseCISPO = true; l.RatioClipC = f64p(3) }, "loss_fn.use_cispo"},
		{"cispo+disable", func(l *config.LossFn) { l.UseCISPO = true; l.DisablePPORatio = true }, "loss_fn.use_cispo"},
		{"cispo+force", func(l *config.LossFn) { l.UseCISPO = true; l.ForceOnPolicyRatio = true }, "loss_fn.use_cispo"},
		{"force+disable", func(l *config.LossFn) { l.ForceOnPolicyRatio = true; l.DisablePPORatio = true }, "loss_fn.force_on_policy_ratio"},
		{"icepop without min", func(l *config.LossFn) {
			l.UseImportanceSamplingCorrection = true
			l.TruncatedImportanceSamplingType = strp("icepop")
			l.TruncatedImportanceSamplingRatio = f64p(2)
		}, "loss_fn.truncated_importance_sampling_ratio_min"},
		{"tis without ratio", func(l *config.LossFn) {
			l.UseImportanceSamplingCorrection = true
			l.TruncatedImportanceSamplingType = strp("tis")
		}, "loss_fn.truncated_importance_sampling_ratio"},
		{"min above max", func(l *config.LossFn) {
			l.UseImportanceSamplingCorrection = true
			l.TruncatedImportanceSamplingType = strp("tis")
			l.TruncatedImportanceSamplingRatio = f64p(1)
			l.TruncatedImportanceSamplingRatioMin = f64p(2)
		}, "loss_fn.truncated_importance_sampling_ratio_min"},
		{"unknown tis", func(l *config.LossFn) { l.TruncatedImportanceSamplingType = strp("gspo") }, "loss_fn.truncated_importance_sampling_type"},
		{"negative clip", func(l *config.LossFn) { l.RatioClipMin = -0.1 }, "loss_fn.ratio_clip_min/max"},
		{"zero input clamp", func(l *config.LossFn) { l.KLInputClampValue = f64p(0) }, "loss_fn.kl_input_clamp_value"},
	}
	for _, tc := range cases {
		l := config.Default().LossFn
		tc.mod(&l)
		_, err := NewLossOptions(&l)
		g, ok := err.(*GuardError)
		if !ok || g.Key != tc.key {
			t.Errorf("%s: err = %v, want a GuardError for %s", tc.name, err, tc.key)
		}
	}
}

// TestLossKLReadsLPKL: with LPKL set (the unfiltered log-probs of a
// top-k/top-p run), the KL term and its importance weights read LPKL and
// send their gradient to DLPKL, the actor term reads LP: at advantage 0
// the loss is the KL of LP := LPKL, with DLPKL that run's DLP and DLP 0;
// and with LPKL = LP the losses are the same and DLP + DLPKL is the
// gradient without LPKL.
func TestLossKLReadsLPKL(t *testing.T) {
	rng := rand.New(rand.NewPCG(32, 3))
	for vi, o := range lossVariants(t) {
		if o.KLPenalty == 0 {
			continue
		}
		for it := range 20 {
			rows := randomRows(rng, 4)
			for i := range rows {
				rows[i].Advantage = 0
				rows[i].LPKL = make([]float64, len(rows[i].LP))
				rows[i].DLPKL = make([]float64, len(rows[i].LP))
				for p := range rows[i].LP {
					rows[i].LPKL[p] = rows[i].LP[p] + 0.5*rng.NormFloat64()
				}
			}
			got, err := Loss(rows, 17, &o)
			if err != nil {
				t.Fatal(err)
			}
			ref := copyRows(rows, []int{0, 1, 2, 3})
			for i := range ref {
				ref[i].LP, ref[i].LPKL, ref[i].DLPKL = rows[i].LPKL, nil, nil
			}
			want, err := Loss(ref, 17, &o)
			if err != nil {
				t.Fatal(err)
			}
			if math.Abs(got.KLLoss-want.KLLoss) > tolSum || got.ActorLoss != 0 {
				t.Fatalf("variant %d iteration %d: KL loss %g (actor %g), want %g from LP = LPKL", vi, it, got.KLLoss, got.ActorLoss, want.KLLoss)
			}
			for i := range rows {
				for p := range rows[i].LP {
					if rows[i].DLP[p] != 0 || math.Abs(rows[i].DLPKL[p]-ref[i].DLP[p]) > tolSum {
						t.Fatalf("variant %d row %d position %d: dlp %g dlp_kl %g, want 0 and %g", vi, i, p, rows[i].DLP[p], rows[i].DLPKL[p], ref[i].DLP[p])
					}
				}
			}
		}
	}
	// LPKL = LP splits the gradient without changing it.
	for vi, o := range lossVariants(t) {
		rows := randomRows(rng, 5)
		plain := copyRows(rows, []int{0, 1, 2, 3, 4})
		for i := range rows {
			rows[i].LPKL = rows[i].LP
			rows[i].DLPKL = make([]float64, len(rows[i].LP))
		}
		got, err := Loss(rows, 23, &o)
		if err != nil {
			t.Fatal(err)
		}
		want, err := Loss(plain, 23, &o)
		if err != nil {
			t.Fatal(err)
		}
		if math.Abs(got.Loss-want.Loss) > tolSum {
			t.Fatalf("variant %d: loss %g, want %g", vi, got.Loss, want.Loss)
		}
		for i := range rows {
			for p := range rows[i].LP {
				if d := rows[i].DLP[p] + rows[i].DLPKL[p] - plain[i].DLP[p]; math.Abs(d) > tolSum {
					t.Fatalf("variant %d row %d position %d: dlp + dlp_kl off by %g", vi, i, p, d)
				}
			}
		}
	}
}
