package trainer

import (
	"cmp"
	"fmt"
	"math"
	"sort"
	"strings"

	"github.com/tracegrpo/tracegrpo/grpo"
	"github.com/tracegrpo/tracegrpo/gym"
	"github.com/tracegrpo/tracegrpo/model"
	"github.com/tracegrpo/tracegrpo/optim"
)

// finalize turns the step's rollout records into logical rollouts: each is
// finalized against its captures with the configured builder (or its attached
// envelope is validated), and its loss multiplier folds in every mask: Gym's
// capture mask, a record already marked mask_sample, and the environment's
// instance_config.mask_sample when env.should_mask_flagged_samples. A record
// with missing or malformed correlation is an error naming the record.
// reasons[i] says why rollout i is masked ("" when it is not): Gym's reason
// code, MaskSampleReason or FlaggedReason.
func (t *Trainer) finalize(recs []*gym.Record, src gym.Source) (logical []grpo.LogicalRollout, reasons []string, err error) {
	logical = make([]grpo.LogicalRollout, len(recs))
	reasons = make([]string, len(recs))
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
			mult, reasons[i] = 0, fin.Reason
		}
		if masked, err := rec.MaskSample(); err != nil {
			return nil, nil, fmt.Errorf("%s: %w", rec.Where(), err)
		} else if masked && mult != 0 {
			mult, reasons[i] = 0, MaskSampleReason
		}
		if t.cfg.Env.ShouldMaskFlaggedSamples {
			flagged, err := rec.InstanceMaskSample()
			if err != nil {
				return nil, nil, fmt.Errorf("%s: %w", rec.Where(), err)
			}
			if flagged && mult != 0 {
				mult, reasons[i] = 0, FlaggedReason
			}
		}
		logical[i] = grpo.LogicalRollout{
			RolloutID:      fin.RolloutID,
			TaskGroup:      *keys.TaskIndex,
			Reward:         reward,
			LossMultiplier: mult,
			Envelope:       fin.Envelope,
		}
	}
	return logical, reasons, nil
}

// The mask reasons of rollouts that Gym delivered but the record masks.
const (
	// MaskSampleReason: the record's own mask_sample is true.
	MaskSampleReason = "mask_sample"
	// FlaggedReason: the environment flagged the sample
	// (instance_config.mask_sample) and env.should_mask_flagged_samples.
	FlaggedReason = "instance_config.mask_sample"
)

// checkMasked stops a step whose masked share of logical rollouts exceeds
// --max-masked-fraction, or that has no eligible training token, naming
// every mask reason with its count (and what else left nothing to train).
func (t *Trainer) checkMasked(stepN int, st *step, eligible int) error {
	counts := map[string]int{}
	masked, invalid, overlong := 0, 0, 0
	for _, s := range st.shards {
		for i, z := range s.Zeroed {
			if z {
				masked++
				counts[cmp.Or(s.Reasons[i], "masked")]++
			}
		}
		invalid += s.Invalid
		overlong += s.Overlong
	}
	why := reasonCounts(counts)
	hint := ""
	if 2*counts[gym.ReasonNothingRecorded] >= masked && masked > 0 {
		hint = " (nothing_recorded: the capture directory holds no call of those rollouts: is --captures the directory their generator captured into?)"
	}
	if frac := float64(masked) / float64(max(st.logical, 1)); frac > t.maxMasked {
		return fmt.Errorf("step %d: %d of %d logical rollouts (%.1f%%) are masked, more than --max-masked-fraction %g: %s%s",
			stepN, masked, st.logical, 100*frac, t.maxMasked, why, hint)
	}
	if eligible == 0 {
		return fmt.Errorf("step %d: %w: %d logical rollouts, %d masked (%s), %d invalid (no trainable row), %d traces overlong%s",
			stepN, grpo.ErrNoEligibleTokens, st.logical, masked, cmp.Or(why, "none"), invalid, overlong, hint)
	}
	return nil
}

// reasonCounts renders mask reasons and their counts, most frequent first.
func reasonCounts(counts map[string]int) string {
	keys := make([]string, 0, len(counts))
	for k := range counts {
		keys = append(keys, k)
	}
	sort.Slice(keys, func(i, j int) bool {
		if counts[keys[i]] != counts[keys[j]] {
			return counts[keys[i]] > counts[keys[j]]
		}
		return keys[i] < keys[j]
	})
	parts := make([]string, len(keys))
	for i, k := range keys {
		parts[i] = fmt.Sprintf("%s %d", k, counts[k])
	}
	return strings.Join(parts, ", ")
}

// microBatch is one forward and backward pass: whole rows packed as a token
// stream (row r of the batch occupies tokens[cu[j]:cu[j+1]] where rows[j] =
// r), or, with policy.shared_prefix=auto, as a token trie (tree).
type microBatch struct {
	rows   []int
	tokens []int32
	cu     []int32
	// need marks the positions that carry loss (mask 1 in a valid row): the
	// only ones whose log-probabilities the loss, the KL and the metrics
	// read, so the LM head runs nowhere else.
	need []bool
	// tree packs rows (tree.Rows) as a token trie: each shared prefix once,
	// the LM head over (row, label) pairs (grpo.PackedTree). nil for a
	// packed stream.
	tree *grpo.PackedTree
}

// computed is the tokens the micro-batch runs through the model.
func (mb *microBatch) computed() int {
	if mb.tree != nil {
		return len(mb.tree.Tokens)
	}
	return len(mb.tokens)
}

// pack packs the rows that train (valid rows) into micro-batches of at most
// max_total_sequence_length × train_micro_batch_size computed tokens.
// Inert rows (masked, invalid or overlong) cost no compute: their loss and
// gradient are exactly zero (sample mask 0), so they are not run. (Padding
// rows are only counted, never built: see the trainer's batch options.)
//
// With policy.shared_prefix=off each row is its own sequence, in row order.
// With auto the rows are packed as token tries (grpo.PackTrees): the budget
// counts computed tokens, each shared prefix once, and a tree larger than
// it is split at branch points.
func (t *Trainer) pack(b *grpo.Batch) ([]microBatch, error) {
	var rows []int
	for r := range b.Rows {
		if !b.Rows[r].Valid {
			if !computeInertRows {
				continue
			}
			inertRowsRun++
		}
		rows = append(rows, r)
	}
	if t.shared {
		trees, err := grpo.PackTrees(b, rows, grpo.TreeLimits{MaxTokens: t.maxTokens, MaxSegs: t.maxSegs})
		if err != nil {
			return nil, err
		}
		out := make([]microBatch, len(trees))
		for i := range trees {
			out[i] = microBatch{rows: trees[i].Rows, tree: &trees[i]}
		}
		return out, nil
	}
	var out []microBatch
	cur := microBatch{cu: []int32{0}}
	for _, r := range rows {
		row := &b.Rows[r]
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
	return out, nil
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

// forward runs model m over a micro-batch and writes each of its rows'
// log-probabilities (and entropies into ent, unless nil) per position:
// needed positions get theirs, every other one 0.
func (t *Trainer) forward(m *model.Model, mb microBatch, lp, ent [][]float64) error {
	if mb.tree == nil {
		l, e, err := m.ForwardMasked(mb.tokens, mb.cu, t.temp, mb.need)
		if err != nil {
			return err
		}
		scatter(lp, mb, l)
		if ent != nil {
			scatter(ent, mb, e)
		}
		return nil
	}
	pt := mb.tree
	l, e, err := m.ForwardTree(model.Tree{Tokens: pt.Tokens, Segs: pt.Segs, Parent: pt.Parent, Rows: pt.PairRows, Labels: pt.PairLabels, Traces: pt.Traces}, t.temp)
	if err != nil {
		return err
	}
	scatterPairs(lp, mb, l)
	if ent != nil {
		scatterPairs(ent, mb, e)
	}
	return nil
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
		if err := t.forward(t.model, mb, t.rowLPOld, nil); err != nil {
			return err
		}
		for _, r := range mb.rows {
			maskNegInf(t.rowLPOld[r], nil)
		}
		if t.ref != nil {
			if err := t.forward(t.ref, mb, t.rowLPRef, nil); err != nil {
				return err
			}
		}
	}
	return nil
}

// scatterOut copies a forward's per-token (stream) or per-pair (tree)
// values into per-row buffers.
func scatterOut(dst [][]float64, mb microBatch, v []float32) {
	if mb.tree == nil {
		scatter(dst, mb, v)
	} else {
		scatterPairs(dst, mb, v)
	}
}

// maskNegInf is NeMo RL's mask_out_neg_inf_logprobs
// (nemo_rl/algorithms/utils.py at 7ea279abfbeb, lines 227-257): a
// log-probability of −inf (the token fell outside the top-k/top-p
// filter) becomes 0, recorded in neg (when not nil) so that it gets no
// gradient; the token stays in the loss's masks.
func maskNegInf(lp []float64, neg []bool) {
	for i, x := range lp {
		inf := math.IsInf(x, -1)
		if inf {
			lp[i] = 0
		}
		if neg != nil {
			neg[i] = inf
		}
	}
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

// scatterPairs copies a tree's per-pair values to its rows' positions (0 at
// the positions no pair gives).
func scatterPairs(dst [][]float64, mb microBatch, v []float32) {
	for j, r := range mb.rows {
		for i, p := range mb.tree.Pair[j] {
			dst[r][i] = 0
			if p >= 0 {
				dst[r][i] = float64(v[p])
			}
		}
	}
}

// rowPost is one row's share of a rank's post: its loss sums, the sum and
// count of its entropies over eligible tokens, and max |lp − lp_old| there.
type rowPost struct {
	sums        grpo.LossSums
	entSum      float64
	entN        float64
	maxOldDiff  float64
	filteredOut int
	ran         bool
}

// train runs forward, the loss with the step's global G_tok (all ranks'
// eligible tokens), and backward for every micro-batch; gradients accumulate
// in the model's gradient arena. It returns this rank's loss sums, the sum
// and count of entropies over eligible tokens, and max |lp − lp_old| over
// them (the training forward against the no-gradient forward of the same
// weights: 0 unless the forward is not deterministic). Each row's sums are
// computed alone and added in row order, so they do not depend on how the
// rows were packed into micro-batches (streams or tries, of any size).
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
	full := t.model.Options().HeadFull
	if full {
		t.rowLPFull = rowSlices(t.rowLPFull, b)
		t.rowDLPFull = rowSlices(t.rowDLPFull, b)
	}
	t.rowNegInf = boolRows(t.rowNegInf, b)
	if cap(t.rowPosts) < len(b.Rows) {
		t.rowPosts = make([]rowPost, len(b.Rows))
	}
	t.rowPosts = t.rowPosts[:len(b.Rows)]
	clear(t.rowPosts)
	if cap(t.lossRows) < 1 {
		t.lossRows = make([]grpo.LossRow, 1)
	}
	t.mtpStep(st, b, &out)
	for _, mb := range mbs {
		if err := t.forwardTrain(mb); err != nil {
			return out, err
		}
		if full {
			scatterOut(t.rowLPFull, mb, t.model.LogprobsFull())
		}
		out.ComputedTokens += mb.computed()
		for _, r := range mb.rows {
			row := &b.Rows[r]
			neg := t.rowNegInf[r]
			maskNegInf(t.rowLP[r], neg)
			var ref []float64
			if t.ref != nil {
				ref = t.rowLPRef[r]
			}
			one := t.lossRows[:1]
			one[0] = row.LossRow(t.rowLP[r], t.rowLPOld[r], ref, t.rowDLP[r])
			if full {
				one[0].LPKL, one[0].DLPKL = t.rowLPFull[r], t.rowDLPFull[r]
			}
			sums, err := grpo.Loss(one, gTok, &t.lossOpt)
			if err != nil {
				return out, err
			}
			rp := rowPost{sums: sums, ran: true}
			if row.SampleMask > 0 {
				for i, m := range row.TokenMask {
					if m != 0 {
						rp.entSum += t.rowEnt[r][i]
						rp.entN++
						rp.maxOldDiff = math.Max(rp.maxOldDiff, math.Abs(t.rowLP[r][i]-t.rowLPOld[r][i]))
						if neg[i] {
							rp.filteredOut++
						}
					}
				}
			}
			for i, n := range neg { // a masked −inf is a constant: no gradient
				if n {
					t.rowDLP[r][i] = 0
				}
			}
			t.rowPosts[r] = rp
		}
		if aux, ok := t.model.RouterLoss(); ok {
			n := mb.computed() // sparse models are never packed as tries: the tokens of the micro-batch
			out.RouterLossSum += float64(n) * aux
			out.RouterTokens += n
			t.model.SetRouterLossWeight(float32(t.routerLossCoef * float64(n) / float64(max(stepTokens, 1))))
		}
		var dfull []float32
		if full {
			dfull = t.dlogprobOf(mb, t.rowDLPFull, &t.dlogprobFull)
		}
		if err := t.mtpMicroBatch(mb, b); err != nil {
			return out, err
		}
		if err := t.model.BackwardFull(t.dlogprobOf(mb, t.rowDLP, &t.dlogprob), dfull); err != nil {
			return out, err
		}
	}
	t.mtpSums(&out)
	for _, rp := range t.rowPosts {
		if rp.ran {
			out.Sums.Add(rp.sums)
			out.EntSum, out.EntN = out.EntSum+rp.entSum, out.EntN+rp.entN
			out.MaxOldDiff = math.Max(out.MaxOldDiff, rp.maxOldDiff)
			out.FilteredOut += rp.filteredOut
		}
	}
	return out, nil
}

// dlogprobOf returns dL/dlogprob for a micro-batch's backward from its
// rows' gradients (rowD: t.rowDLP, or t.rowDLPFull for the unfiltered
// log-probs), in *buf's storage: per packed token for a stream; per pair
// for a tree, where a pair read by several rows (a shared position, e.g.
// two equal generations) gets the sum of their gradients, added in the
// tree's row order.
func (t *Trainer) dlogprobOf(mb microBatch, rowD [][]float64, buf *[]float32) []float32 {
	if mb.tree == nil {
		if cap(*buf) < len(mb.tokens) {
			*buf = make([]float32, len(mb.tokens))
		}
		d := (*buf)[:len(mb.tokens)]
		for j, r := range mb.rows {
			off := int(mb.cu[j])
			for i, g := range rowD[r] {
				d[off+i] = float32(g)
			}
		}
		return d
	}
	P := len(mb.tree.PairRows)
	if cap(t.dpair) < P {
		t.dpair = make([]float64, P)
	}
	if cap(*buf) < P {
		*buf = make([]float32, P)
	}
	sum, d := t.dpair[:P], (*buf)[:P]
	clear(sum)
	for j, r := range mb.rows {
		for i, p := range mb.tree.Pair[j] {
			if p >= 0 {
				sum[p] += rowD[r][i]
			}
		}
	}
	for p, g := range sum {
		d[p] = float32(g)
	}
	return d
}

// boolRows returns per-row bool buffers of the batch's row lengths,
// reusing buf's storage.
func boolRows(buf [][]bool, b *grpo.Batch) [][]bool {
	if cap(buf) < len(b.Rows) {
		buf = make([][]bool, len(b.Rows))
	}
	buf = buf[:len(b.Rows)]
	for i := range b.Rows {
		n := len(b.Rows[i].TokenIDs)
		if cap(buf[i]) < n {
			buf[i] = make([]bool, n)
		}
		buf[i] = buf[i][:n]
		clear(buf[i])
	}
	return buf
}

// metrics assembles the step's metrics line from every rank's share.
func (t *Trainer) metrics(stepN int, st *step, upd optim.Result, ph PhaseTimes, total float64) Metrics {
	m := Metrics{Step: stepN, Phases: ph, TimeS: Num(total), CommGatherBytes: st.commGather, CommReduceScatterBytes: st.commReduce}
	var rewards []float64
	var logical, physical, eligible, toks, computed int
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
		computed += p.ComputedTokens
		entSum, entN = entSum+p.EntSum, entN+p.EntN
		m.FilterMaskedTokens += p.FilteredOut
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
	if v := t.loadViolation; v != nil {
		x := Num(*v)
		m.ExpertLoadMaxViolation = &x
	}
	m.TokenMultProbErr, m.GenKLError = Num(lm.TokenMultProbError), Num(lm.GenKLError)
	t.mtpMetrics(&m, st, upd.SetNorms)
	m.TrainTokens, m.ComputedTokens = toks, computed
	if computed > 0 {
		m.PrefixReuse = Num(float64(toks) / float64(computed))
	}
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
