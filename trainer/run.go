package trainer

import (
	"errors"
	"fmt"
	"math"
	"time"

	"github.com/tracegrpo/tracegrpo/grpo"
	"github.com/tracegrpo/tracegrpo/optim"
)

// Run is the GRPO loop. It reads top to bottom as one step.
func (t *Trainer) Run() error {
	for t.step < t.maxSteps {
		step := t.step + 1
		var ph PhaseTimes
		sw := newStopwatch()

		// 1. Rollouts: run this step's logical rollouts with the current policy
		// (built-in) or read the ones NeMo Gym produced (external).
		recs, captures, err := t.source.next(step)
		if errors.Is(err, errStopWaiting) {
			return t.stopOnSignal(t.interrupted())
		}
		if err != nil {
			return fmt.Errorf("step %d: rollouts: %w", step, err)
		}
		ph.Rollout = sw.lap()

		// 2. Finalize each rollout against its captures: training_traces, or a
		// mask with its reason. Bad correlation stops the step.
		logical, fin, err := t.finalize(recs, captures)
		if err != nil {
			return fmt.Errorf("step %d: %w", step, err)
		}
		ph.Finalize = sw.lap()

		// 3. Logical rollouts → physical rows; one advantage per logical rollout.
		batch, err := grpo.BuildBatch(logical, t.batchOpt)
		if err != nil {
			return fmt.Errorf("step %d: %w", step, err)
		}
		mbs := t.pack(batch)

		// 4. Previous-policy and reference log-probabilities (no gradient).
		if err := t.logprobs(mbs, batch); err != nil {
			return fmt.Errorf("step %d: logprobs: %w", step, err)
		}
		ph.Logprob = sw.lap()

		// 5. Forward, loss over the step's G_tok, backward, per micro-batch.
		loss, err := t.train(mbs, batch)
		if err != nil {
			return fmt.Errorf("step %d: train: %w", step, err)
		}
		ph.Train = sw.lap()

		// 6. One clipped AdamW update; the scheduler advances by the logical
		// rollout count, however many physical rows they expanded into.
		lr, wd := t.sched.LR(), t.sched.WeightDecay()
		upd, err := t.opt.Step(lr, wd)
		if err != nil {
			return fmt.Errorf("step %d: optimizer: %w", step, err)
		}
		t.sched.Step(optim.StepSamples(len(batch.Rows), batch.Metrics.Logical))
		t.model.ZeroGrad()
		t.step, t.consumed = step, t.consumed+int64(len(recs))
		ph.Optimizer = sw.lap()

		// 7. Checkpoint and one line of metrics: the checkpoint is written
		// under a temporary name, the line appended and synced, and only
		// then is the checkpoint published, so that whatever moment a kill
		// comes at, a checkpoint of step N never exists without line N.
		pending, err := t.prepareCheckpoint()
		if err != nil {
			return fmt.Errorf("step %d: checkpoint: %w", step, err)
		}
		ph.Checkpoint = sw.lap()
		m := t.metrics(step, logical, fin, batch, loss, upd, ph, sw.total())
		if err := t.log(m, pending != nil); err != nil {
			if pending != nil {
				pending.Discard()
			}
			return err
		}
		if pending != nil {
			if _, err := pending.Publish(); err != nil {
				return fmt.Errorf("step %d: checkpoint: %w", step, err)
			}
		}
		if stopAfterStep > 0 && step >= stopAfterStep {
			return errSimulatedCrash
		}

		// A pre-emption or Ctrl-C arrived during the step: stop cleanly.
		if sig := t.interrupted(); sig != nil {
			return t.stopOnSignal(sig)
		}
	}
	t.progressDone()
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
