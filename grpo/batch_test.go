package grpo

import (
	"errors"
	"fmt"
	"math"
	"math/rand/v2"
	"strings"
	"testing"

	"github.com/google/go-cmp/cmp"
	"github.com/tracegrpo/tracegrpo/gym"
)

// trace builds a trace from tokens and half-open owned spans; owned positions
// get behaviour log-prob lp.
func trace(id string, tokens []int32, lp float64, spans ...[2]int) gym.TrainingTrace {
	tr := gym.TrainingTrace{TraceID: id, TokenIDs: tokens,
		GenerationLogprobs: make([]float64, len(tokens)), LossMask: make([]int8, len(tokens))}
	for k, s := range spans {
		call := id + "-call" + string(rune('a'+k))
		tr.ModelCallIDs = append(tr.ModelCallIDs, call)
		tr.SampledSpans = append(tr.SampledSpans, gym.SampledSpan{ModelCallID: call, Start: s[0], End: s[1]})
		for p := s[0]; p < s[1]; p++ {
			tr.LossMask[p] = 1
			tr.GenerationLogprobs[p] = lp
		}
	}
	return tr
}

func envelope(rid string, traces ...gym.TrainingTrace) *gym.TrainingTraceBatch {
	return &gym.TrainingTraceBatch{SchemaVersion: 1, RolloutID: rid, Builder: gym.BuilderPrefixMerging, Traces: traces}
}

func rowField[T any](b *Batch, f func(Row) T) []T {
	out := make([]T, len(b.Rows))
	for i, r := range b.Rows {
		out[i] = f(r)
	}
	return out
}

// TestExactCustody is spec §10.1 #1 / §4.4: the envelope's tokens, logprobs and
// mask reach the row unchanged; the context edit (token 9) stays masked.
func TestExactCustody(t *testing.T) {
	a := trace("r:a", []int32{1, 2, 3, 9, 4, 5}, -0.125, [2]int{2, 3}, [2]int{4, 6})
	b := trace("r:b", []int32{1, 2, 3, 7, 8}, -0.5, [2]int{4, 5})
	batch, err := BuildBatch([]LogicalRollout{{RolloutID: "r", TaskGroup: 1, Reward: 1, LossMultiplier: 1, Envelope: envelope("r", a, b)}},
		BatchOptions{PadTokenID: 0, MaxSeqLen: 16, RowMultiple: 4})
	if err != nil {
		t.Fatal(err)
	}
	r0 := batch.Rows[0]
	checks := []struct {
		name      string
		got, want any
	}{
		{"input_ids[0]", r0.TokenIDs, []int32{1, 2, 3, 9, 4, 5}},
		{"token_mask[0]", r0.TokenMask, []int8{0, 0, 1, 0, 1, 1}},
		{"generation_logprobs[0]", r0.GenLogprobs, []float64{0, 0, -.125, 0, -.125, -.125}},
		{"sample_mask", rowField(batch, func(r Row) float64 { return r.SampleMask }), []float64{1, 1, 0, 0}},
		{"trace ids", rowField(batch, func(r Row) string { return r.TraceID }), []string{"r:a", "r:b", "", ""}},
		{"rollout ids", rowField(batch, func(r Row) string { return r.RolloutID }), []string{"r", "r", "", ""}},
		{"padding rows", batch.Rows[3].TokenIDs, []int32{0, 0}},
		{"counts", [3]int{batch.Metrics.Logical, batch.Metrics.Physical, batch.Metrics.Padding}, [3]int{1, 2, 2}},
		{"G_tok", batch.GTok, 4.0},
		{"eligible", batch.Metrics.EligibleTokens, 4},
	}
	for _, c := range checks {
		if d := cmp.Diff(c.want, c.got); d != "" {
			t.Errorf("%s (-want +got)\n%s", c.name, d)
		}
	}
	// Custody is a copy: mutating the envelope afterwards does not reach the row.
	a.TokenIDs[0] = 99
	if batch.Rows[0].TokenIDs[0] != 1 {
		t.Errorf("row aliases the envelope's token ids")
	}
}

// TestGroupingBeforeExpansion is spec §10.1 #2 / §4.4.
func TestGroupingBeforeExpansion(t *testing.T) {
	rs := []LogicalRollout{
		{RolloutID: "a", TaskGroup: 7, Reward: 0, LossMultiplier: 1, Envelope: envelope("a",
			trace("a:1", []int32{1, 2, 3}, -1, [2]int{2, 3}), trace("a:2", []int32{1, 4, 5}, -1, [2]int{1, 3}))},
		{RolloutID: "b", TaskGroup: 7, Reward: 100, LossMultiplier: 0, Envelope: envelope("b", trace("b:1", []int32{1, 2}, -1, [2]int{1, 2}))},
		{RolloutID: "c", TaskGroup: 8, Reward: 1, LossMultiplier: 1, Envelope: envelope("c", trace("c:1", []int32{1, 2}, -1, [2]int{1, 2}))},
		{RolloutID: "d", TaskGroup: 8, Reward: 0, LossMultiplier: 1, Envelope: envelope("d", trace("d:1", []int32{1, 3}, -1, [2]int{1, 2}))},
	}
	b, err := BuildBatch(rs, BatchOptions{MaxSeqLen: 8, RowMultiple: 4, Advantage: AdvantageOptions{LeaveOneOut: true}})
	if err != nil {
		t.Fatal(err)
	}
	checks := []struct {
		name      string
		got, want any
	}{
		{"logical_indices", rowField(b, func(r Row) int { return r.LogicalIndex }), []int{0, 0, 1, 2, 3, 0, 0, 0}},
		{"advantages[:5]", rowField(b, func(r Row) float64 { return r.Advantage })[:5], []float64{0, 0, 0, 1, -1}},
		{"loss_multiplier", rowField(b, func(r Row) float64 { return r.SampleMask }), []float64{1, 1, 0, 1, 1, 0, 0, 0}},
		{"invalid_rollout_count", b.Metrics.Invalid, 1},
		{"logical_valid_mask", b.Metrics.LogicalValid, []bool{true, false, true, true}},
		{"group 7 baseline = own reward", b.Advantages.Baseline[:2], []float64{0, 100}},
	}
	for _, c := range checks {
		if d := cmp.Diff(c.want, c.got); d != "" {
			t.Errorf("%s (-want +got)\n%s", c.name, d)
		}
	}
}

// TestOverlongPerRow is spec §10.1 #3 / §4.4.
func TestOverlongPerRow(t *testing.T) {
	rs := []LogicalRollout{
		{RolloutID: "a", TaskGroup: 1, Reward: 1, LossMultiplier: 1, Envelope: envelope("a",
			trace("a:long", []int32{1, 2, 3, 4, 5}, -1, [2]int{3, 5}), trace("a:short", []int32{1, 2, 6}, -1, [2]int{2, 3}))},
		{RolloutID: "masked-1", TaskGroup: 1, Reward: 0, LossMultiplier: 1, Envelope: nil},
	}
	b, err := BuildBatch(rs, BatchOptions{PadTokenID: 0, MaxSeqLen: 3, RowMultiple: 4, Advantage: AdvantageOptions{NormalizeRewards: true, LeaveOneOut: true}})
	if err != nil {
		t.Fatal(err)
	}
	maxLen := 0
	for _, r := range b.Rows {
		maxLen = max(maxLen, len(r.TokenIDs))
	}
	checks := []struct {
		name      string
		got, want any
	}{
		{"loss_multiplier", rowField(b, func(r Row) float64 { return r.SampleMask }), []float64{0, 1, 0, 0}},
		{"gym_rollout_id", rowField(b, func(r Row) string { return r.RolloutID }), []string{"a", "a", "masked-1", ""}},
		{"trace ids", rowField(b, func(r Row) string { return r.TraceID }), []string{"a:long", "a:short", "", ""}},
		{"overlong flags", rowField(b, func(r Row) bool { return r.Overlong }), []bool{true, false, false, false}},
		{"max input length <= 3", maxLen <= 3, true},
		{"short trace advantage", b.Rows[1].Advantage, 0.0},
		{"counts", [4]int{b.Metrics.Physical, b.Metrics.Padding, b.Metrics.Overlong, b.Metrics.Invalid}, [4]int{3, 1, 1, 1}},
		{"inert overlong row", b.Rows[0].TokenIDs, []int32{0, 0}},
	}
	for _, c := range checks {
		if d := cmp.Diff(c.want, c.got); d != "" {
			t.Errorf("%s (-want +got)\n%s", c.name, d)
		}
	}
}

// TestBaselineUsesSameValidity is spec §10.1 #4 / §4.4, parametrized over
// leave-one-out.
func TestBaselineUsesSameValidity(t *testing.T) {
	for _, tc := range []struct {
		loo  bool
		want []float64
	}{{true, []float64{0, 1}}, {false, []float64{0.5, 0.5}}} {
		rewards := []float64{1, 0, 100, 99}
		var rs []LogicalRollout
		for i, r := range rewards {
			id := string(rune('a' + i))
			mult := 1.0
			if i >= 2 {
				mult = 0
			}
			rs = append(rs, LogicalRollout{RolloutID: id, TaskGroup: 5, Reward: r, LossMultiplier: mult,
				Envelope: envelope(id, trace(id+":t", []int32{1, 2}, -1, [2]int{1, 2}))})
		}
		b, err := BuildBatch(rs, BatchOptions{MaxSeqLen: 4, RowMultiple: 1, Advantage: AdvantageOptions{LeaveOneOut: tc.loo}})
		if err != nil {
			t.Fatal(err)
		}
		if d := cmp.Diff(tc.want, b.Advantages.Baseline[:2]); d != "" {
			t.Errorf("loo=%v: baselines (-want +got)\n%s", tc.loo, d)
		}
		for i := range 2 {
			if got, want := b.Advantages.Advantage[i], rewards[i]-tc.want[i]; got != want {
				t.Errorf("loo=%v: advantage[%d] = %g, want reward - baseline = %g", tc.loo, i, got, want)
			}
		}
		if d := cmp.Diff([]bool{true, true, false, false}, b.Metrics.LogicalValid); d != "" {
			t.Errorf("valid (-want +got)\n%s", d)
		}
	}
}

// TestBatchRejects covers spec §10.1 #5 (the custody mutations BuildBatch
// itself checks; schema version, span ranges and double owners are the
// envelope validator's in package gym) and #6.
func TestBatchRejects(t *testing.T) {
	good := func() []LogicalRollout {
		return []LogicalRollout{
			{RolloutID: "r1", TaskGroup: 1, Reward: 1, LossMultiplier: 1, Envelope: envelope("r1", trace("r1:a", []int32{1, 2, 3, 9, 4, 5}, -0.125, [2]int{2, 3}, [2]int{4, 6}))},
			{RolloutID: "r2", TaskGroup: 1, Reward: 0, LossMultiplier: 1, Envelope: envelope("r2", trace("r2:a", []int32{1, 2, 3}, -0.5, [2]int{1, 3}))},
		}
	}
	opt := BatchOptions{MaxSeqLen: 16, RowMultiple: 2}
	cases := []struct {
		name   string
		mutate func(rs []LogicalRollout, o *BatchOptions)
		want   string
	}{
		// Spec §10.1 #5: the six custody mutations.
		{"schema_version 2", func(rs []LogicalRollout, _ *BatchOptions) { rs[0].Envelope.SchemaVersion = 2 }, "schema_version: expected 1, found 2"},
		{"span end out of range", func(rs []LogicalRollout, _ *BatchOptions) { rs[0].Envelope.Traces[0].SampledSpans[1].End = 7 }, "start < end <= 6"},
		{"duplicated trace (double owner)", func(rs []LogicalRollout, _ *BatchOptions) {
			dup := rs[0].Envelope.Traces[0]
			dup.TraceID = "r1:copy"
			rs[0].Envelope.Traces = append(rs[0].Envelope.Traces, dup)
		}, "already owns a span"},
		{"misaligned token_ids", func(rs []LogicalRollout, _ *BatchOptions) {
			tr := &rs[0].Envelope.Traces[0]
			tr.TokenIDs = tr.TokenIDs[:5]
		}, "lengths must match (5, 6, 6)"},
		{"NaN logprob", func(rs []LogicalRollout, _ *BatchOptions) {
			rs[0].Envelope.Traces[0].GenerationLogprobs[2] = math.NaN()
		}, "generation_logprobs[2]: must be finite, found NaN"},
		{"loss_mask[0]=1", func(rs []LogicalRollout, _ *BatchOptions) { rs[0].Envelope.Traces[0].LossMask[0] = 1 }, "loss_mask[0]: the first position is conditioning and must be 0, found 1"},
		{"mask bit 2", func(rs []LogicalRollout, _ *BatchOptions) { rs[0].Envelope.Traces[0].LossMask[3] = 2 }, "loss_mask[3]: must be 0 or 1, found 2"},
		{"negative token", func(rs []LogicalRollout, _ *BatchOptions) { rs[0].Envelope.Traces[0].TokenIDs[1] = -3 }, "token_ids[1]: token ids must be non-negative, found -3"},
		{"duplicated trace id", func(rs []LogicalRollout, _ *BatchOptions) { rs[1].Envelope.Traces[0].TraceID = "r1:a" }, `trace_id "r1:a" appears in rollouts "r1" and "r2"`},
		{"envelope of another rollout", func(rs []LogicalRollout, _ *BatchOptions) { rs[1].Envelope.RolloutID = "r1" }, `training_traces.rollout_id "r1", want the row's rollout_id "r2"`},
		{"duplicate rollout ids", func(rs []LogicalRollout, _ *BatchOptions) {
			rs[1].RolloutID = "r1"
			rs[1].Envelope.RolloutID = "r1"
		}, `duplicate Gym rollout_id "r1"`},
		{"non-finite reward", func(rs []LogicalRollout, _ *BatchOptions) { rs[1].Reward = math.Inf(1) }, "reward +Inf"},
		{"negative loss multiplier", func(rs []LogicalRollout, _ *BatchOptions) { rs[1].LossMultiplier = -1 }, "loss multiplier -1"},
		{"row multiple 0", func(_ []LogicalRollout, o *BatchOptions) { o.RowMultiple = 0 }, "row multiple 0"},
		{"max length 1", func(_ []LogicalRollout, o *BatchOptions) { o.MaxSeqLen = 1 }, "max sequence length 1"},
		{"all invalid", func(rs []LogicalRollout, _ *BatchOptions) {
			rs[0].LossMultiplier = 0
			rs[1].Envelope = nil
		}, "no eligible training tokens"},
	}
	for _, tc := range cases {
		t.Run(tc.name, func(t *testing.T) {
			rs, o := good(), opt
			if _, err := BuildBatch(rs, o); err != nil {
				t.Fatalf("unmutated batch: %v", err)
			}
			tc.mutate(rs, &o)
			_, err := BuildBatch(rs, o)
			if err == nil || !strings.Contains(err.Error(), tc.want) {
				t.Fatalf("err = %v, want it to contain %q", err, tc.want)
			}
		})
	}
	// The all-invalid error is a sentinel.
	rs := good()
	rs[0].LossMultiplier, rs[1].LossMultiplier = 0, 0
	if _, err := BuildBatch(rs, opt); !errors.Is(err, ErrNoEligibleTokens) {
		t.Errorf("err = %v, want ErrNoEligibleTokens", err)
	}
}

func TestAdvantagesByHand(t *testing.T) {
	f := func(v float64) *float64 { return &v }
	cases := []struct {
		name    string
		groups  []int64
		rewards []float64
		valid   []bool
		opt     AdvantageOptions
		want    []float64
	}{
		// Group of 3, no leave-one-out: mean 1, std (Bessel) 1.
		{"normalized", []int64{1, 1, 1}, []float64{0, 1, 2}, []bool{true, true, true}, AdvantageOptions{NormalizeRewards: true},
			[]float64{-1 / (1 + 1e-6), 0, 1 / (1 + 1e-6)}},
		// Zero std: left unscaled (no ε division).
		{"zero std", []int64{1, 1}, []float64{3, 3}, []bool{true, true}, AdvantageOptions{NormalizeRewards: true}, []float64{0, 0}},
		// Leave-one-out with 2 valid: N = 1, std NaN -> 0, A = r - other.
		{"loo pair", []int64{1, 1}, []float64{1, 0}, []bool{true, true}, AdvantageOptions{NormalizeRewards: true, LeaveOneOut: true}, []float64{1, -1}},
		{"single member", []int64{4}, []float64{9}, []bool{true}, AdvantageOptions{NormalizeRewards: true}, []float64{0}},
		{"clipped", []int64{1, 1, 2, 2}, []float64{10, 0, 0, 10}, []bool{true, true, true, true},
			AdvantageOptions{ClipLow: f(-2), ClipHigh: f(3)}, []float64{3, -2, -2, 3}},
	}
	for _, tc := range cases {
		res, err := Advantages(tc.groups, tc.rewards, tc.valid, tc.opt)
		if err != nil {
			t.Fatal(err)
		}
		for i := range tc.want {
			if !closeTo(res.Advantage[i], tc.want[i], 1e-15, 1e-15) {
				t.Errorf("%s: advantage[%d] = %.17g, want %.17g", tc.name, i, res.Advantage[i], tc.want[i])
			}
		}
	}
	if _, err := Advantages([]int64{1}, []float64{math.NaN()}, []bool{true}, AdvantageOptions{}); err == nil {
		t.Error("NaN reward accepted")
	}
}

// TestBuildBatchProperties checks the expansion invariants on random steps:
// every trace appears once, in logical then envelope order, with its exact
// tokens when valid and as [pad, pad] otherwise; padding completes a multiple
// of RowMultiple; G_tok and the counts match the rows; every row carries its
// rollout's advantage.
func TestBuildBatchProperties(t *testing.T) {
	rng := rand.New(rand.NewPCG(11, 5))
	for trial := range 200 {
		n := 1 + rng.IntN(7)
		var rs []LogicalRollout
		for i := range n {
			id := fmt.Sprintf("r%d", i)
			lr := LogicalRollout{RolloutID: id, TaskGroup: int64(rng.IntN(3)), Reward: float64(rng.IntN(3)), LossMultiplier: 1}
			switch rng.IntN(6) {
			case 0:
				lr.LossMultiplier = 0
			case 1:
				lr.LossMultiplier = 0.5
			}
			if rng.IntN(5) > 0 {
				var trs []gym.TrainingTrace
				for k := range 1 + rng.IntN(3) {
					L := 2 + rng.IntN(8)
					toks := make([]int32, L)
					for p := range toks {
						toks[p] = int32(1 + rng.IntN(50))
					}
					s := 1 + rng.IntN(L-1)
					trs = append(trs, trace(fmt.Sprintf("%s:%d", id, k), toks, -0.25, [2]int{s, s + 1 + rng.IntN(L-s)}))
				}
				lr.Envelope = envelope(id, trs...)
			}
			rs = append(rs, lr)
		}
		opt := BatchOptions{PadTokenID: 0, MaxSeqLen: 2 + rng.IntN(8), RowMultiple: 1 + rng.IntN(4),
			Advantage: AdvantageOptions{NormalizeRewards: rng.IntN(2) == 0, LeaveOneOut: rng.IntN(2) == 0}}
		b, err := BuildBatch(rs, opt)
		if errors.Is(err, ErrNoEligibleTokens) {
			continue
		}
		if err != nil {
			t.Fatalf("trial %d: %v", trial, err)
		}
		if len(b.Rows)%opt.RowMultiple != 0 || len(b.Rows) != b.Metrics.Physical+b.Metrics.Padding || b.Metrics.Padding >= opt.RowMultiple {
			t.Fatalf("trial %d: %d rows, metrics %+v, multiple %d", trial, len(b.Rows), b.Metrics, opt.RowMultiple)
		}
		k, g, elig, overlong := 0, 0.0, 0, 0
		for i, lr := range rs {
			var trs []gym.TrainingTrace
			if lr.Envelope != nil {
				trs = lr.Envelope.Traces
			}
			if len(trs) == 0 {
				trs = []gym.TrainingTrace{{}}
			}
			for _, tr := range trs {
				r := b.Rows[k]
				k++
				if r.LogicalIndex != i || r.RolloutID != lr.RolloutID || r.TraceID != tr.TraceID || r.Advantage != b.Advantages.Advantage[i] {
					t.Fatalf("trial %d row %d: %+v, want rollout %d trace %q", trial, k-1, r, i, tr.TraceID)
				}
				long := len(tr.TokenIDs) > opt.MaxSeqLen
				if long {
					overlong++
				}
				valid := tr.TraceID != "" && !long && lr.LossMultiplier > 0
				if valid != r.Valid || valid != b.Metrics.LogicalValid[i] && valid {
					t.Fatalf("trial %d row %d: valid %v, want %v", trial, k-1, r.Valid, valid)
				}
				if !valid {
					if d := cmp.Diff([]int32{0, 0}, r.TokenIDs); d != "" || r.SampleMask != 0 {
						t.Fatalf("trial %d row %d: inert row %+v", trial, k-1, r)
					}
					continue
				}
				if d := cmp.Diff(tr.TokenIDs, r.TokenIDs); d != "" || r.SampleMask != lr.LossMultiplier {
					t.Fatalf("trial %d row %d: tokens (-want +got)\n%s sample mask %g", trial, k-1, d, r.SampleMask)
				}
				for _, m := range r.TokenMask {
					if m == 1 {
						g += r.SampleMask
						elig++
					}
				}
			}
		}
		if g != b.GTok || elig != b.Metrics.EligibleTokens || overlong != b.Metrics.Overlong {
			t.Fatalf("trial %d: G_tok %g/%g, eligible %d/%d, overlong %d/%d", trial, b.GTok, g, b.Metrics.EligibleTokens, elig, b.Metrics.Overlong, overlong)
		}
		for _, r := range b.Rows[k:] {
			if r.RolloutID != "" || r.TraceID != "" || r.LogicalIndex != 0 || r.SampleMask != 0 {
				t.Fatalf("trial %d: padding row %+v", trial, r)
			}
		}
	}
}
