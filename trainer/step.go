package trainer

import (
	"fmt"
	"math"

	"github.com/tracegrpo/tracegrpo/grpo"
	"github.com/tracegrpo/tracegrpo/gym"
	"github.com/tracegrpo/tracegrpo/optim"
)

// finalize turns the step's rollout records into logical rollouts: each is
// finalized against its captures with the configured builder (or its attached
// envelope is validated), and its loss multiplier folds in every mask: Gym's
// capture mask, a record already marked mask_sample, and the environment's
// instance_config.mask_sample when env.should_mask_flagged_samples. A record
// with missing or malformed correlation is an error naming the record.
func (t *Trainer) finalize(recs []*gym.Record, src gym.Source) ([]grpo.LogicalRollout, []*gym.Finalized, error) {
	logical := make([]grpo.LogicalRollout, len(recs))
	fins := make([]*gym.Finalized, len(recs))
	for i, rec := range recs {
		keys, err := gym.CorrelationKeysFromRecord(rec)
		if err != nil {
			return nil, nil, fmt.Errorf("%s: %w", rec.Where(), err)
		}
		if keys.TaskIndex == nil {
			return nil, nil, fmt.Errorf("%s: no _ng_task_index: the task group of a rollout is its _ng_task_index", rec.Where())
		}
		fin, err := gym.Finalize(rec, src, t.builder)
		if err != nil {
			return nil, nil, fmt.Errorf("%s: %w", rec.Where(), err)
		}
		reward, err := rec.Reward()
		if err != nil {
			return nil, nil, fmt.Errorf("%s: %w", rec.Where(), err)
		}
		mult := 1.0
		if fin.Masked {
			mult = 0
		}
		if masked, err := rec.MaskSample(); err != nil {
			return nil, nil, fmt.Errorf("%s: %w", rec.Where(), err)
		} else if masked {
			mult = 0
		}
		if t.cfg.Env.ShouldMaskFlaggedSamples {
			flagged, err := rec.InstanceMaskSample()
			if err != nil {
				return nil, nil, fmt.Errorf("%s: %w", rec.Where(), err)
			}
			if flagged {
				mult = 0
			}
		}
		logical[i] = grpo.LogicalRollout{
			RolloutID:      fin.RolloutID,
			TaskGroup:      *keys.TaskIndex,
			Reward:         reward,
			LossMultiplier: mult,
			Envelope:       fin.Envelope,
		}
		fins[i] = fin
	}
	return logical, fins, nil
}

// microBatch is a packed token stream of whole rows: row r of the batch
// occupies tokens[off[j]:off[j+1]] where rows[j] = r.
type microBatch struct {
	rows   []int
	tokens []int32
	cu     []int32
	// need marks the positions that carry loss (mask 1 in a valid row): the
	// only ones whose log-probabilities the loss, the KL and the metrics
	// read, so the LM head runs nowhere else.
	need []bool
}

// pack packs the rows that train (valid rows) into micro-batches of at most
// max_total_sequence_length × train_micro_batch_size tokens, in row order.
// Inert rows (masked, invalid or overlong) cost no compute: their loss and
// gradient are exactly zero (sample mask 0), so they are not run. (Padding
// rows are only counted, never built: see the trainer's batch options.)
func (t *Trainer) pack(b *grpo.Batch) []microBatch {
	var out []microBatch
	cur := microBatch{cu: []int32{0}}
	for r := range b.Rows {
		row := &b.Rows[r]
		if !row.Valid {
			if !computeInertRows {
				continue
			}
			inertRowsRun++
		}
		n := len(row.TokenIDs)
		if len(cur.tokens)+n > t.maxTokens && len(cur.rows) > 0 {
			out = append(out, cur)
			cur = microBatch{cu: []int32{0}}
		}
		cur.rows = append(cur.rows, r)
		cur.tokens = append(cur.tokens, row.TokenIDs...)
		cur.cu = append(cur.cu, int32(len(cur.tokens)))
		for _, m := range row.TokenMask {
			cur.need = append(cur.need, m != 0 && row.SampleMask > 0)
		}
	}
	if len(cur.rows) > 0 {
		out = append(out, cur)
	}
	return out
}

// computeInertRows makes pack run inert rows too, counting them in
// inertRowsRun (tests use it to show they contribute exactly nothing).
var (
	computeInertRows = false
	inertRowsRun     int
)

// rowSlices returns per-row float64 buffers of the batch's row lengths,
// reusing buf's storage.
func rowSlices(buf [][]float64, b *grpo.Batch) [][]float64 {
	if cap(buf) < len(b.Rows) {
		buf = make([][]float64, len(b.Rows))
	}
	buf = buf[:len(b.Rows)]
	for i := range b.Rows {
		n := len(b.Rows[i].TokenIDs)
		if cap(buf[i]) < n {
			buf[i] = make([]float64, n)
		}
		buf[i] = buf[i][:n]
	}
	return buf
}

// logprobs runs the previous policy (the current weights, before this step's
// update) over every micro-batch without gradient, and the frozen reference
// policy when the loss has a KL penalty.
func (t *Trainer) logprobs(mbs []microBatch, b *grpo.Batch) error {
	t.rowLPOld = rowSlices(t.rowLPOld, b)
	if t.ref != nil {
		t.rowLPRef = rowSlices(t.rowLPRef, b)
	}
	for _, mb := range mbs {
		lp, _, err := t.model.ForwardMasked(mb.tokens, mb.cu, t.temp, mb.need)
		if err != nil {
			return err
		}
		scatter(t.rowLPOld, mb, lp)
		if t.ref != nil {
			lp, _, err := t.ref.ForwardMasked(mb.tokens, mb.cu, t.temp, mb.need)
			if err != nil {
				return err
			}
			scatter(t.rowLPRef, mb, lp)
		}
	}
	return nil
}

// scatter copies a micro-batch's per-token values into per-row buffers.
func scatter(dst [][]float64, mb microBatch, v []float32) {
	for j, r := range mb.rows {
		seg := v[mb.cu[j]:mb.cu[j+1]]
		for i, x := range seg {
			dst[r][i] = float64(x)
		}
	}
}

// train runs forward, the loss with the step's global G_tok (all ranks'
// eligible tokens), and backward for every micro-batch; gradients accumulate
// in the model's gradient arena. It returns this rank's loss sums, the sum
// and count of entropies over eligible tokens, and max |lp − lp_old| over
// them (the training forward against the no-gradient forward of the same
// weights: 0 unless the forward is not deterministic).
//
// A sparse model's load-balancing loss enters the step's loss as the
// token-weighted mean of its micro-batches' losses over every rank
// (weight T_mb / the step's train tokens), times routerLossCoef; the same
// mean is reported whether or not it trains.
func (t *Trainer) train(mbs []microBatch, b *grpo.Batch, st *step) (post, error) {
	gTok := st.gTok
	out := post{Sums: grpo.NewLossSums()}
	var stepTokens int
	for _, s := range st.shards {
		stepTokens += s.TrainTokens
	}
	t.rowLP = rowSlices(t.rowLP, b)
	t.rowEnt = rowSlices(t.rowEnt, b)
	t.rowDLP = rowSlices(t.rowDLP, b)
	for _, mb := range mbs {
		lp, ent, err := t.model.ForwardMasked(mb.tokens, mb.cu, t.temp, mb.need)
		if err != nil {
			return out, err
		}
		scatter(t.rowLP, mb, lp)
		scatter(t.rowEnt, mb, ent)
		rows := t.lossRows[:0]
		for _, r := range mb.rows {
			row := &b.Rows[r]
			var ref []float64
			if t.ref != nil {
				ref = t.rowLPRef[r]
			}
			rows = append(rows, row.LossRow(t.rowLP[r], t.rowLPOld[r], ref, t.rowDLP[r]))
			if row.SampleMask > 0 {
				for i, m := range row.TokenMask {
					if m != 0 {
						out.EntSum += t.rowEnt[r][i]
						out.EntN++
						out.MaxOldDiff = math.Max(out.MaxOldDiff, math.Abs(t.rowLP[r][i]-t.rowLPOld[r][i]))
					}
				}
			}
		}
		t.lossRows = rows
		if aux, ok := t.model.RouterLoss(); ok {
			out.RouterLossSum += float64(len(mb.tokens)) * aux
			out.RouterTokens += len(mb.tokens)
			t.model.SetRouterLossWeight(float32(t.routerLossCoef * float64(len(mb.tokens)) / float64(max(stepTokens, 1))))
		}
		sums, err := grpo.Loss(rows, gTok, &t.lossOpt)
		if err != nil {
			return out, err
		}
		out.Sums.Add(sums)
		if cap(t.dlogprob) < len(mb.tokens) {
			t.dlogprob = make([]float32, len(mb.tokens))
		}
		d := t.dlogprob[:len(mb.tokens)]
		for j := range mb.rows {
			off := int(mb.cu[j])
			for i, g := range rows[j].DLP {
				d[off+i] = float32(g)
			}
		}
		if err := t.model.Backward(d); err != nil {
			return out, err
		}
	}
	return out, nil
}

// metrics assembles the step's metrics line from every rank's share.
func (t *Trainer) metrics(stepN int, st *step, upd optim.Result, ph PhaseTimes, total float64) Metrics {
	m := Metrics{Step: stepN, Phases: ph, TimeS: Num(total), CommGatherBytes: st.commGather, CommReduceScatterBytes: st.commReduce}
	var rewards []float64
	var logical, physical, eligible, toks int
	var entSum, entN, busy, routerSum float64
	routerTokens := 0
	sums := grpo.NewLossSums()
	for r, s := range st.shards {
		for i := range s.Rewards {
			rewards = append(rewards, s.Rewards[i])
			if s.Zeroed[i] {
				m.MaskedRollouts++
			}
			m.Traces += s.Traces[i]
			if s.Reasons[i] != "" {
				if m.MaskReasons == nil {
					m.MaskReasons = map[string]int{}
				}
				m.MaskReasons[s.Reasons[i]]++
			}
		}
		logical += len(s.Rewards)
		physical += s.Physical
		eligible += s.Eligible
		toks += s.TrainTokens
		m.OverlongTraces += s.Overlong
		m.InvalidRollouts += s.Invalid
		p := st.posts[r]
		sums.Add(p.Sums)
		entSum, entN = entSum+p.EntSum, entN+p.EntN
		routerSum, routerTokens = routerSum+p.RouterLossSum, routerTokens+p.RouterTokens
		m.PrevLogprobMaxDiff = Num(math.Max(float64(m.PrevLogprobMaxDiff), p.MaxOldDiff))
		busy = math.Max(busy, p.Logprob+p.Train)
	}
	mean, std := meanStd(rewards)
	m.RewardMean, m.RewardStd = Num(mean), Num(std)
	m.TracesPerRollout = Num(float64(m.Traces) / float64(max(1, logical)))
	advantageStats(&m, st.shards)
	lm := sums.Metrics(st.gTok, t.lossOpt.KLPenalty)
	m.Loss = Num(lm.Loss)
	m.GradNorm = Num(upd.GradNorm)
	m.LR = Num(upd.LR)
	m.SkippedUpdate = upd.Skipped
	m.LogicalRollouts, m.PhysicalRows, m.PaddingRows = logical, physical, grpo.PaddingRows(physical, t.rowMultiple)
	m.EligibleTokens = eligible
	m.NonzeroAdvantageTokens = lm.NonzeroAdvantageTokens
	m.ClipFractionLow, m.ClipFractionHigh = Num(lm.ClipFracLow), Num(lm.ClipFracHigh)
	m.RatioMin, m.RatioMean, m.RatioMax = Num(lm.RatioMin), Num(lm.Ratio), Num(lm.RatioMax)
	m.KL = Num(lm.KL)
	if entN > 0 {
		m.Entropy = Num(entSum / entN)
	}
	if routerTokens > 0 {
		v := Num(routerSum / float64(routerTokens))
		m.RouterAuxLoss = &v
	}
	m.TokenMultProbErr, m.GenKLError = Num(lm.TokenMultProbError), Num(lm.GenKLError)
	m.TrainTokens = toks
	if busy > 0 {
		m.TokensPerS = Num(float64(toks) / busy)
	}
	return m
}

// advantageStats fills the advantage diagnostics from the valid rollouts
// of every rank.
func advantageStats(m *Metrics, shards []shard) {
	lo, hi, sum, n := math.Inf(1), math.Inf(-1), 0.0, 0
	type group struct {
		r      float64
		seen   bool
		varied bool
	}
	groups := map[int64]*group{}
	var order []int64
	for _, s := range shards {
		for i, valid := range s.Valid {
			if !valid {
				continue
			}
			a := s.Advantage[i]
			lo, hi, sum, n = math.Min(lo, a), math.Max(hi, a), sum+math.Abs(a), n+1
			g, ok := groups[s.Groups[i]]
			if !ok {
				g = &group{}
				groups[s.Groups[i]] = g
				order = append(order, s.Groups[i])
			}
			if !g.seen {
				g.r, g.seen = s.Rewards[i], true
			} else if s.Rewards[i] != g.r {
				g.varied = true
			}
		}
	}
	if n == 0 {
		return
	}
	m.AdvantageAbsMean, m.AdvantageMin, m.AdvantageMax = Num(sum/float64(n)), Num(lo), Num(hi)
	flat := 0
	for _, k := range order {
		if !groups[k].varied {
			flat++
		}
	}
	m.ZeroSignalGroups = Num(float64(flat) / float64(len(order)))
}
