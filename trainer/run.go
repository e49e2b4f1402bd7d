package trainer

import (
	"errors"
	"fmt"
	"math"
	"time"

	"github.com/tracegrpo/tracegrpo/checkpoint"
	"github.com/tracegrpo/tracegrpo/grpo"
	"github.com/tracegrpo/tracegrpo/optim"
)

// Run is the GRPO loop. It reads top to bottom as one step. With several
// ranks (see ranks.go) each runs it on its share of the step's task groups.
func (t *Trainer) Run() error {
	// 0. The weights the first step file must come from, for the
	// generator: the initial ones (step_0), or a resumed run's.
	if err := t.publishFirst(); err != nil {
		return err
	}
	for t.step < t.maxSteps {
		step := t.step + 1
		var ph PhaseTimes
		sw := newStopwatch()
		comm0 := t.model.CommStats()

		// 1. Rollouts: run this rank's share of the step's logical rollouts
		// with the current policy (built-in), or read the ones NeMo Gym
		// produced (external). A stop request ends a wait for them.
		var my shard
		recs, captures, err := t.source.next(step)
		if errors.Is(err, errStopWaiting) {
			my.Stop, err = true, nil
		}
		ph.Rollout = sw.lap()
		ph.Wait = Num(t.source.waited().Seconds())
		ph.Rollout = max(0, ph.Rollout-ph.Wait) // reading or sampling them

		// 2. Finalize each rollout against its captures: training_traces, or
		// a mask with its reason. Bad correlation fails the step.
		var logical []grpo.LogicalRollout
		var reasons []string
		if err == nil && !my.Stop {
			if logical, reasons, err = t.finalize(recs, captures); err != nil {
				err = fmt.Errorf("step %d: %w", step, err)
			}
		} else if err != nil {
			err = fmt.Errorf("step %d: rollouts: %w", step, err)
		}
		ph.Finalize = sw.lap()

		// 3. Logical rollouts → physical rows; one advantage per logical
		// rollout (groups are whole on every rank).
		var batch *grpo.Batch
		var mbs []microBatch
		if err == nil && !my.Stop {
			if batch, err = grpo.BuildBatch(logical, t.batchOpt); err != nil {
				err = fmt.Errorf("step %d: %w", step, err)
			} else {
				my = myShard(logical, reasons, batch)
				if t.mtp.run {
					my.MTPTargets = mtpTargets(batch, t.mtp.depths)
				}
				if mbs, err = t.pack(batch); err != nil {
					err = fmt.Errorf("step %d: pack: %w", step, err)
				}
				my.MicroBatches = len(mbs)
				my.Input = t.source.stepInput()
			}
		}
		my.Err = rankErrorOf(err)

		// 4. The ranks meet: every rank learns of any failure or stop
		// request, and the step's G_tok is the sum of every rank's.
		st, err := t.exchange(step, my, err)
		if err != nil {
			return err
		}
		if st.stop {
			return t.stopOnSignal(t.interrupted())
		}
		if t.sharded() {
			// Every pass is a sequence of collectives: every rank runs the
			// step's most micro-batches, empty ones where it has fewer.
			for len(mbs) < st.microBatches {
				mbs = append(mbs, microBatch{cu: []int32{0}})
			}
		}

		// 5. Previous-policy and reference log-probabilities (no gradient).
		if err := t.logprobs(mbs, batch); err != nil {
			return fmt.Errorf("step %d: logprobs: %w", step, err)
		}
		ph.Logprob = sw.lap()

		// 6. Forward, loss over the step's G_tok, backward, per micro-batch;
		// then the gradients are summed over the ranks.
		p, err := t.train(mbs, batch, st)
		if err != nil {
			return fmt.Errorf("step %d: train: %w", step, err)
		}
		if t.comm.Size() > 1 && !t.sharded() { // sharded: reduce-scattered in Backward
			if err := t.comm.AllReduceSum(t.model.Grads()); err != nil {
				return fmt.Errorf("step %d: gradient all-reduce: %w", step, err)
			}
		}
		// Megatron's finalize_model_grads: the selection biases move by the
		// step's expert load, summed over the ranks.
		if err := t.updateExpertBias(); err != nil {
			return fmt.Errorf("step %d: %w", step, err)
		}
		ph.Train = sw.lap()
		p.Logprob, p.Train = float64(ph.Logprob), float64(ph.Train)

		// 7. One clipped AdamW update, the same on every rank; the scheduler
		// advances by the logical rollout count, however many physical rows
		// they expanded into.
		// Weights the update made non-finite stop every rank at the
		// gather below, before anything of the step is saved.
		lr, wd := t.sched.LR(), t.sched.WeightDecay()
		upd, err := t.opt.Step(lr, wd)
		t.model.ParamsChanged() // the bf16 copy (mixed precision) is remade once, at the next forward
		if we := (*optim.WeightsError)(nil); errors.As(err, &we) {
			p.Err, err = rankErrorOf(t.nonFiniteWeights(step, we)), nil
		}
		if err != nil {
			return fmt.Errorf("step %d: optimizer: %w", step, err)
		}
		t.sched.Step(optim.StepSamples(0, st.logical))
		t.model.ZeroGrad()
		t.step, t.consumed = step, t.consumed+int64(st.logical)
		if st.posts, err = gather(t, p); err != nil {
			return fmt.Errorf("step %d: %w", step, err)
		}
		if err := t.postsError(st.posts); err != nil {
			return err
		}
		ph.Optimizer = sw.lap()

		// 8. Checkpoint and one line of metrics (rank 0): the checkpoint is
		// written under a temporary name, the line appended and synced, and
		// only then is the checkpoint published, so that whatever moment a
		// kill comes at, a checkpoint of step N never exists without line N.
		comm := t.model.CommStats()
		st.commGather, st.commReduce = comm.GatherBytes-comm0.GatherBytes, comm.ReduceScatterBytes-comm0.ReduceScatterBytes
		if err := t.finish(step, st, upd, ph, sw); err != nil {
			return err
		}
		if stopAfterStep > 0 && step >= stopAfterStep {
			return errSimulatedCrash
		}

		// A pre-emption or Ctrl-C reached a rank during the step or while
		// its checkpoint was written: every rank stops cleanly now.
		if stop, err := t.stopRequested(); err != nil {
			return fmt.Errorf("step %d: %w", step, err)
		} else if stop {
			return t.stopOnSignal(t.interrupted())
		}
	}
	t.progressDone()
	return nil
}

// nonFiniteWeights is the error for an update that made weights non-finite:
// it names the parameter, and says that nothing of the step is saved.
func (t *Trainer) nonFiniteWeights(step int, we *optim.WeightsError) error {
	name := fmt.Sprintf("elements [%d, %d)", we.Off, we.Off+we.N)
	if params := t.model.Table().Params; we.Group < len(params) {
		name = params[we.Group].Name // one optimizer group per parameter (newOptimizer)
	}
	return fmt.Errorf("step %d: the update made the weights of %s not finite (sum of squares %v; lr %g): a learning rate or weight decay too large for float32? "+
		"The run stops without saving them (whatever --on-nonfinite says); the newest checkpoint in %s holds the weights before: resume from it with a smaller lr",
		step, name, we.SumSq, we.LR, t.checkpointDir())
}

// postsError is the error every rank returns when a rank's update failed
// (its post carries the error).
func (t *Trainer) postsError(posts []post) error {
	errs := make([]rankError, len(posts))
	for r, p := range posts {
		errs[r] = p.Err
	}
	if t.comm.Size() == 1 && errs[0].Msg != "" {
		return errors.New(errs[0].Msg)
	}
	return agreedOf(errs)
}

// exchange gathers every rank's share of the step (myErr: this rank's
// failure, also in my.Err): a failure on any rank
// fails every rank (naming it), a stop request on any rank stops every
// rank, and the step's G_tok and logical rollout count are the sums.
func (t *Trainer) exchange(stepN int, my shard, myErr error) (*step, error) {
	if myErr != nil && t.comm.Size() == 1 {
		return nil, myErr // as it is: one process needs no agreement
	}
	shards, err := gather(t, my)
	if err != nil {
		return nil, fmt.Errorf("step %d: %w", stepN, err)
	}
	st := &step{shards: shards}
	errs := make([]rankError, len(shards))
	eligible := 0
	for r, s := range shards {
		errs[r] = s.Err
		if s.Err.Msg == "" && s.Stop {
			st.stop = true
		}
		st.gTok += s.GTok
		st.logical += len(s.Rewards)
		st.microBatches = max(st.microBatches, s.MicroBatches)
		eligible += s.Eligible
	}
	if err := agreedOf(errs); err != nil {
		return nil, err
	}
	for r, s := range shards {
		if !st.stop && s.Input != shards[0].Input {
			return nil, &agreedError{err: fmt.Errorf("step %d: the ranks read different rollouts: rank 0 read %s, rank %d read %s (is the rollouts directory on a file system every rank shares?)",
				stepN, shards[0].Input, r, s.Input)}
		}
	}
	if !st.stop {
		if err := t.checkMasked(stepN, st, eligible); err != nil {
			return nil, &agreedError{err: err}
		}
	}
	return st, nil
}

// finish writes the step's checkpoint and metrics line (rank 0) once every
// rank has finished the step; at a checkpoint the ranks also check that
// their weights are the same.
func (t *Trainer) finish(stepN int, st *step, upd optim.Result, ph PhaseTimes, sw *stopwatch) error {
	saves := t.savesAt(stepN)
	if saves {
		if err := t.checkSameWeights(fmt.Sprintf("step %d", stepN)); err != nil {
			return err
		}
	}
	var pending *checkpoint.Pending
	var err error
	switch {
	case saves && t.sharded(): // every rank writes its shard
		if pending, err = t.prepareSharded(); err != nil {
			return fmt.Errorf("step %d: checkpoint: %w", stepN, err)
		}
	case t.rank == 0 && saves:
		if pending, err = t.prepare(); err != nil { // published after the metrics line, below
			err = fmt.Errorf("step %d: checkpoint: %w", stepN, err)
		}
	}
	if saves {
		// Every rank has its share of the step done before rank 0
		// publishes the checkpoint (and learns of rank 0's failure).
		if err := t.agree(err); err != nil {
			if pending != nil {
				pending.Discard()
			}
			return err
		}
	}
	ph.Checkpoint = sw.lap()
	// The weights for the generator, before the step's line: a generator
	// may start on the next step as soon as they are there.
	exp, err := t.publishWeights(stepN)
	if err != nil {
		if pending != nil {
			pending.Discard()
		}
		return fmt.Errorf("step %d: %w", stepN, err)
	}
	ph.Export = sw.lap()
	if t.rank != 0 {
		return nil
	}
	m := t.metrics(stepN, st, upd, ph, sw.total())
	m.WeightsBytes = exp.bytes
	if err := t.log(m, pending != nil); err != nil {
		if pending != nil {
			pending.Discard()
		}
		return err
	}
	if pending != nil {
		if _, err := pending.Publish(); err != nil {
			return fmt.Errorf("step %d: checkpoint: %w", stepN, err)
		}
	}
	return nil
}

// stopwatch times consecutive phases.
type stopwatch struct{ start, last time.Time }

func newStopwatch() *stopwatch { n := time.Now(); return &stopwatch{n, n} }

// lap returns the seconds since the previous lap.
func (s *stopwatch) lap() Num {
	n := time.Now()
	d := n.Sub(s.last).Seconds()
	s.last = n
	return Num(d)
}

func (s *stopwatch) total() float64 { return time.Since(s.start).Seconds() }

// meanStd returns the mean and population standard deviation of xs.
func meanStd(xs []float64) (float64, float64) {
	if len(xs) == 0 {
		return 0, 0
	}
	var s float64
	for _, x := range xs {
		s += x
	}
	mean := s / float64(len(xs))
	var v float64
	for _, x := range xs {
		v += (x - mean) * (x - mean)
	}
	return mean, math.Sqrt(v / float64(len(xs)))
}
