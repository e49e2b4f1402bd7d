package grpo

import (
	"errors"
	"fmt"
	"math"

	"github.com/tracegrpo/tracegrpo/gym"
)

// LogicalRollout is one agent episode of a step (spec §4.1): one reward, one
// advantage, and zero or more training traces.
type LogicalRollout struct {
	RolloutID string
	// TaskGroup is gym_task_group_id: the K rollouts of one task share it.
	TaskGroup int64
	Reward    float64
	// LossMultiplier already folds in the data set's multiplier and every mask
	// (env-flagged mask_sample, Gym's capture mask); 0 masks the rollout.
	LossMultiplier float64
	// Envelope is the rollout's training_traces envelope; nil when Gym masked
	// the rollout or captured nothing (one inert row).
	Envelope *gym.TrainingTraceBatch
}

// BatchOptions configures BuildBatch.
type BatchOptions struct {
	PadTokenID int32
	// MaxSeqLen is the per-trace context limit (policy.max_total_sequence_length).
	MaxSeqLen int
	// RowMultiple is data-parallel size × train_micro_batch_size; the row count
	// is padded to a multiple of it.
	RowMultiple int
	Advantage   AdvantageOptions
	// Shard says the rollouts are one data-parallel rank's share of a step:
	// they may be none, or hold no eligible token (the step's other ranks
	// may), so neither is ErrNoEligibleTokens; the caller checks the step's
	// total instead.
	Shard bool
}

// Row is one physical training row.
type Row struct {
	// LogicalIndex is the index of the row's logical rollout (0 for padding).
	LogicalIndex int
	TaskGroup    int64
	RolloutID    string // "" for padding rows
	TraceID      string // "" for padding rows and trace-less rollouts
	TokenIDs     []int32
	// TokenMask is 1 exactly on the trace's owned sampled spans (the envelope
	// loss_mask); all 0 for inert rows.
	TokenMask []int8
	// GenLogprobs are the behaviour log-probabilities on mask-1 positions and 0
	// elsewhere, aligned with TokenIDs (see the package doc).
	GenLogprobs []float64
	// SampleMask is the rollout's loss multiplier × the row's validity.
	SampleMask float64
	// Advantage is the logical rollout's advantage, the same for every token.
	Advantage float64
	// Valid reports that the row trains (SampleMask > 0 and some mask bit).
	Valid bool
	// Overlong marks a trace made inert for exceeding MaxSeqLen.
	Overlong bool
}

// BatchMetrics are the step's expansion counts (spec §4.2).
type BatchMetrics struct {
	Logical  int // logical rollouts
	Physical int // rows before padding (inert rows included)
	Padding  int // inert rows appended for divisibility
	Overlong int // traces longer than MaxSeqLen
	Invalid  int // logical rollouts with no valid row
	// LogicalValid[i] reports that rollout i has a valid row and votes in its
	// group's baseline.
	LogicalValid []bool
	// EligibleTokens counts the positions with token mask 1 in valid rows.
	EligibleTokens int
}

// Batch is one GRPO step's physical rows.
type Batch struct {
	Rows []Row
	// GTok is Σ_rows Σ_t token_mask·sample_mask: the global eligible-token
	// count that normalizes the loss of every micro-batch of the step.
	GTok       float64
	Metrics    BatchMetrics
	Advantages AdvantageResult // per logical rollout
}

// ErrNoEligibleTokens is returned when no logical rollout of a step is valid.
var ErrNoEligibleTokens = errors.New("grpo: Gym logical batch has no eligible training tokens")

// BuildBatch expands logical rollouts into physical rows (spec §4.2–§4.3).
//
// Rows come in logical order, each rollout's traces in envelope order. A trace
// trains when the rollout's LossMultiplier > 0, the trace has a loss token and
// len(TokenIDs) <= MaxSeqLen; otherwise its row is inert ([pad, pad], mask 0,
// sample mask 0) and keeps its ids. A rollout without traces gives one inert
// row with an empty trace id. Advantages are computed once per logical rollout
// over valid rollouts only and broadcast to the rollout's rows. Finally inert
// padding rows (logical index 0, empty ids) bring the count to a multiple of
// RowMultiple.
//
// Custody is checked before any row is built: every envelope must pass gym's
// wire-contract validation ((*gym.TrainingTraceBatch).Validate: schema version,
// aligned arrays, masks, finite log-probabilities, spans, one owner per call),
// belong to its rollout (envelope rollout_id == RolloutID), and no trace id
// may repeat within the step.
func BuildBatch(rollouts []LogicalRollout, opt BatchOptions) (*Batch, error) {
	if opt.RowMultiple < 1 {
		return nil, fmt.Errorf("grpo: build batch: row multiple %d, want >= 1", opt.RowMultiple)
	}
	if opt.MaxSeqLen < 2 {
		return nil, fmt.Errorf("grpo: build batch: max sequence length %d, want >= 2", opt.MaxSeqLen)
	}
	if opt.PadTokenID < 0 {
		return nil, fmt.Errorf("grpo: build batch: pad token id %d, want >= 0", opt.PadTokenID)
	}
	seenRollout := map[string]int{}
	seenTrace := map[string]string{}
	for i, lr := range rollouts {
		if math.IsNaN(lr.Reward) || math.IsInf(lr.Reward, 0) {
			return nil, fmt.Errorf("grpo: build batch: rollout %d (%q): reward %v, want a finite number", i, lr.RolloutID, lr.Reward)
		}
		if !(lr.LossMultiplier >= 0) || math.IsInf(lr.LossMultiplier, 0) {
			return nil, fmt.Errorf("grpo: build batch: rollout %d (%q): loss multiplier %v, want a finite number >= 0", i, lr.RolloutID, lr.LossMultiplier)
		}
		if lr.RolloutID == "" {
			return nil, fmt.Errorf("grpo: build batch: rollout %d: empty rollout id", i)
		}
		if j, dup := seenRollout[lr.RolloutID]; dup {
			return nil, fmt.Errorf("grpo: build batch: duplicate Gym rollout_id %q in a logical batch (rollouts %d and %d)", lr.RolloutID, j, i)
		}
		seenRollout[lr.RolloutID] = i
		if lr.Envelope == nil {
			continue
		}
		if err := lr.Envelope.Validate(); err != nil {
			return nil, fmt.Errorf("grpo: build batch: rollout %d (%q): %w", i, lr.RolloutID, err)
		}
		if lr.Envelope.RolloutID != lr.RolloutID {
			return nil, fmt.Errorf("grpo: build batch: rollout %d: training_traces.rollout_id %q, want the row's rollout_id %q", i, lr.Envelope.RolloutID, lr.RolloutID)
		}
		for k := range lr.Envelope.Traces {
			tr := &lr.Envelope.Traces[k]
			if err := checkTrace(tr); err != nil {
				return nil, fmt.Errorf("grpo: build batch: rollout %q trace %d (%q): %w", lr.RolloutID, k, tr.TraceID, err)
			}
			if other, dup := seenTrace[tr.TraceID]; dup {
				return nil, fmt.Errorf("grpo: build batch: trace_id %q appears in rollouts %q and %q", tr.TraceID, other, lr.RolloutID)
			}
			seenTrace[tr.TraceID] = lr.RolloutID
		}
	}

	b := &Batch{}
	m := &b.Metrics
	m.Logical = len(rollouts)
	m.LogicalValid = make([]bool, len(rollouts))
	inert := func(idx int, tg int64, rid, tid string) Row {
		return Row{LogicalIndex: idx, TaskGroup: tg, RolloutID: rid, TraceID: tid,
			TokenIDs: []int32{opt.PadTokenID, opt.PadTokenID}, TokenMask: []int8{0, 0}, GenLogprobs: []float64{0, 0}}
	}
	for i, lr := range rollouts {
		if lr.Envelope == nil || len(lr.Envelope.Traces) == 0 {
			b.Rows = append(b.Rows, inert(i, lr.TaskGroup, lr.RolloutID, ""))
			continue
		}
		for k := range lr.Envelope.Traces {
			tr := &lr.Envelope.Traces[k]
			overlong := len(tr.TokenIDs) > opt.MaxSeqLen
			if overlong {
				m.Overlong++
			}
			hasLoss := false
			for _, v := range tr.LossMask {
				if v == 1 {
					hasLoss = true
					break
				}
			}
			ok := hasLoss && !overlong && lr.LossMultiplier > 0
			if !ok {
				r := inert(i, lr.TaskGroup, lr.RolloutID, tr.TraceID)
				r.Overlong = overlong
				b.Rows = append(b.Rows, r)
				continue
			}
			m.LogicalValid[i] = true
			r := Row{LogicalIndex: i, TaskGroup: lr.TaskGroup, RolloutID: lr.RolloutID, TraceID: tr.TraceID,
				TokenIDs:    append([]int32(nil), tr.TokenIDs...),
				TokenMask:   append([]int8(nil), tr.LossMask...),
				GenLogprobs: make([]float64, len(tr.TokenIDs)),
				SampleMask:  lr.LossMultiplier, Valid: true}
			for t, v := range tr.LossMask {
				if v == 1 {
					r.GenLogprobs[t] = tr.GenerationLogprobs[t]
					m.EligibleTokens++
					b.GTok += lr.LossMultiplier
				}
			}
			b.Rows = append(b.Rows, r)
		}
	}
	for _, v := range m.LogicalValid {
		if !v {
			m.Invalid++
		}
	}
	if m.Invalid == len(rollouts) && !opt.Shard {
		return nil, ErrNoEligibleTokens
	}
	if len(rollouts) == 0 {
		return b, nil
	}
	groups := make([]int64, len(rollouts))
	rewards := make([]float64, len(rollouts))
	for i, lr := range rollouts {
		groups[i], rewards[i] = lr.TaskGroup, lr.Reward
	}
	adv, err := Advantages(groups, rewards, m.LogicalValid, opt.Advantage)
	if err != nil {
		return nil, err
	}
	b.Advantages = adv
	m.Physical = len(b.Rows)
	m.Padding = PaddingRows(m.Physical, opt.RowMultiple)
	for range m.Padding {
		b.Rows = append(b.Rows, inert(0, rollouts[0].TaskGroup, "", ""))
	}
	for k := range b.Rows {
		b.Rows[k].Advantage = adv.Advantage[b.Rows[k].LogicalIndex]
	}
	return b, nil
}

// checkTrace re-checks the envelope invariants BuildBatch relies on.
func checkTrace(tr *gym.TrainingTrace) error {
	n := len(tr.TokenIDs)
	if n == 0 || len(tr.GenerationLogprobs) != n || len(tr.LossMask) != n {
		return fmt.Errorf("token_ids, generation_logprobs and loss_mask have lengths %d, %d, %d; want equal and > 0", n, len(tr.GenerationLogprobs), len(tr.LossMask))
	}
	if tr.TraceID == "" {
		return fmt.Errorf("empty trace_id")
	}
	if tr.LossMask[0] != 0 {
		return fmt.Errorf("loss_mask[0] = %d, want 0 (position 0 has no conditioning)", tr.LossMask[0])
	}
	for t := range n {
		if tr.TokenIDs[t] < 0 {
			return fmt.Errorf("token_ids[%d] = %d, want >= 0", t, tr.TokenIDs[t])
		}
		if v := tr.LossMask[t]; v != 0 && v != 1 {
			return fmt.Errorf("loss_mask[%d] = %d, want 0 or 1", t, v)
		}
		if lp := tr.GenerationLogprobs[t]; math.IsNaN(lp) || math.IsInf(lp, 0) {
			return fmt.Errorf("generation_logprobs[%d] = %v, want a finite number", t, lp)
		}
	}
	return nil
}

// LossRow pairs the row with the model's per-token arrays for Loss: lp
// (current), lpOld (prev_logprobs; nil with force_on_policy_ratio), lpRef
// (nil when β = 0) and the gradient output dlp, all of len(r.TokenIDs) and
// aligned as in the package doc. The row's behaviour log-probs, token mask,
// sample mask and advantage fill the rest.
func (r *Row) LossRow(lp, lpOld, lpRef, dlp []float64) LossRow {
	return LossRow{LP: lp, LPOld: lpOld, LPGen: r.GenLogprobs, LPRef: lpRef, Mask: r.TokenMask,
		SampleMask: r.SampleMask, Advantage: r.Advantage, DLP: dlp}
}

// PaddingRows is how many inert rows bring physical rows to a multiple of
// multiple (≥ 1).
func PaddingRows(physical, multiple int) int {
	return (multiple - physical%multiple) % multiple
}
