package main

import (
	"fmt"
	"io"
	"math"
	"time"

	"github.com/tracegrpo/tracegrpo/grpo"
	"github.com/tracegrpo/tracegrpo/optim"
	"github.com/tracegrpo/tracegrpo/rollout"
)

func init() {
	register(command{name: "", summary: "run synchronous multi-trace GRPO", run: runTrain})
}

const trainSynopsis = `train [--config FILE] [--set key=value ...] [flags]

Runs synchronous multi-trace GRPO. With no --config it runs the built-in job: a
tiny Qwen3-shaped model learns the built-in agentic tasks from scratch on the
CPU, with rollouts sampled in-process and recorded in NeMo Gym's capture format.
With --rollouts it trains on rollout records and captures that NeMo Gym wrote.

Each step: choose tasks and run rollouts (or read them), finalize every rollout
against its captures with the configured builder, expand logical rollouts to
physical trace rows, compute one advantage per logical rollout, compute the
previous-policy (and reference) log-probabilities, then forward, loss and
backward per micro-batch, one clipped AdamW update, and one scheduler tick
counted in logical rollouts.

The run directory (--out) receives metrics.jsonl (one line per step),
config.yaml (the effective config), checkpoints/step_<N>/ and, for the
built-in job, captures/.

Flags:`

// runTrain is the default command: parse flags, set up, then the loop.
func runTrain(args []string, stdout, stderr io.Writer) error {
	fs := newFlags("train", trainSynopsis, stdout)
	var o trainOptions
	fs.StringArrayVar(&o.configFiles, "config", nil, "NeMo RL recipe (YAML); repeatable, later files override earlier ones")
	fs.StringArrayVar(&o.sets, "set", nil, "override one config key after the files, e.g. --set grpo.num_prompts_per_step=4 (repeatable)")
	fs.StringVar(&o.out, "out", "", "run directory (default runs/<recipe name>, runs/builtin for the built-in job)")
	fs.BoolVar(&o.resume, "resume", false, "continue from the newest complete checkpoint in --out")
	fs.BoolVar(&o.fallback, "fallback", false, "with --resume: if the newest checkpoint is incomplete or corrupt, use the newest older one that verifies")
	fs.StringVar(&o.initFrom, "init-from", "", "start from Hugging Face weights in DIR (config.json + model.safetensors)")
	fs.StringVar(&o.backend, "backend", "auto", "compute backend: auto (CUDA when a driver and device are found, else CPU), cpu or cuda")
	fs.IntVar(&o.threads, "threads", 0, "CPU backend threads (0: all cores)")
	fs.IntVar(&o.steps, "steps", 0, "run this many GRPO steps in all (overrides grpo.max_num_steps)")
	fs.StringVar(&o.rollouts, "rollouts", "", "train on NeMo Gym rollout records: a JSONL file, or a directory of step_<N>.jsonl files")
	fs.StringVar(&o.captures, "captures", "", "NeMo Gym capture directory of --rollouts (default env.nemo_gym.token_id_capture.dir)")
	fs.DurationVar(&o.wait, "wait", 10*time.Minute, "with a --rollouts directory: how long to wait for each step_<N>.jsonl")
	fs.StringSliceVar(&o.tasks, "tasks", rollout.TaskNames(), "built-in tasks to cycle through")
	fs.StringVar(&o.onNonFinite, "on-nonfinite", "skip", "a non-finite loss or gradient: skip the update (and count it) or abort")
	fs.BoolVar(&o.quiet, "quiet", false, "no progress line per step")
	if err := fs.Parse(args); err != nil {
		return err
	}
	if fs.NArg() > 0 {
		return fmt.Errorf("%w: unexpected argument %q (see train --help)", errUsage, fs.Arg(0))
	}
	o.stderr = stderr
	t, err := newTrainer(o)
	if err != nil {
		return err
	}
	defer t.close()
	return t.run()
}

// run is the GRPO loop. It reads top to bottom as one step.
func (t *trainer) run() error {
	for t.step < t.maxSteps {
		step := t.step + 1
		var ph phaseTimes
		sw := newStopwatch()

		// 1. Rollouts: run this step's logical rollouts with the current policy
		// (built-in) or read the ones NeMo Gym produced (external).
		recs, captures, err := t.source.next(step)
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

		// 7. Checkpoint, then one line of metrics.
		if err := t.maybeCheckpoint(); err != nil {
			return fmt.Errorf("step %d: checkpoint: %w", step, err)
		}
		ph.Checkpoint = sw.lap()
		m := t.metrics(step, logical, fin, batch, loss, upd, ph, sw.total())
		if err := t.log(m); err != nil {
			return err
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
func (s *stopwatch) lap() num {
	n := time.Now()
	d := n.Sub(s.last).Seconds()
	s.last = n
	return num(d)
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
