package main

import (
	"io"

	"github.com/tracegrpo/tracegrpo/trainer"
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
config.yaml (the effective config) and checkpoints/step_<N>/. The built-in
job keeps the captures it records in memory, one step at a time, and writes
none to disk unless asked: --save-captures writes them to captures/ in the
run directory, an explicit env.nemo_gym.token_id_capture.dir to that
directory (NeMo Gym's capture store format, readable by train traces).

Flags:`

// runTrain is the default command: flags, the backend, then the trainer.
func runTrain(args []string, stdout, stderr io.Writer) error {
	fs := newFlags("train", trainSynopsis, stdout)
	var o trainer.Options
	o.AddFlags(fs)
	backend := fs.String("backend", "auto", "compute backend: auto (CUDA when a driver and device are found, else CPU), cpu or cuda")
	threads := fs.Int("threads", 0, "CPU backend threads (0: all cores)")
	if err := parseFlags(fs, args, 0); err != nil {
		return err
	}
	be, err := openBackend(*backend, *threads, stderr)
	if err != nil {
		return err
	}
	defer closeBackend(be)
	stop, release := trainer.WatchSignals(stderr)
	defer release()
	o.Backend, o.Log, o.Signals = be, stderr, stop
	t, err := trainer.New(o)
	if err != nil {
		return err
	}
	defer t.Close()
	return t.Run()
}
