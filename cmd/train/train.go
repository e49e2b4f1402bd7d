package main

import (
	"errors"
	"fmt"
	"io"
	"strings"

	"github.com/tracegrpo/tracegrpo/trainer"
)

func init() {
	register(command{name: "", summary: "run synchronous multi-trace GRPO", run: runTrain})
}

const trainSynopsis = `train [--config FILE]... [OVERRIDE]... [--set key=value]... [flags]

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

OVERRIDEs are NeMo RL's command-line overrides (Hydra's grammar), applied to
the composed recipe as examples/run_grpo.py applies them: key=value changes a
key the recipe has, +key=value adds one it lacks, ++key=value adds or
changes, ~key deletes (train config --help has the whole grammar). --set
applies after them, over the defaults, typed by tracegrpo's schema. Every
refusal train makes from the configuration, train config --check makes too.

SIGTERM, SIGINT or SIGUSR1 stops the run after the step in progress (at once
while it waits for rollouts) with a checkpoint; a second one stops at once.
Under mpirun, send SIGUSR1 to mpirun: a SIGTERM to mpirun is followed by its
SIGKILL of every rank about a second later. Ranks started with different
flags, recipes or inputs are refused before any work, naming what differs.

Flags:`

// watchSignals is trainer.WatchSignals; this package's tests replace it to
// hold back the first stop request, as a step that never ends would.
var watchSignals = trainer.WatchSignals

// runTrain is the default command: flags, the launch (ranks), the backend
// and the collectives, then the trainer.
func runTrain(args []string, stdout, stderr io.Writer) error {
	fs := newFlags("train", trainSynopsis, stdout)
	var o trainer.Options
	o.AddFlags(fs)
	backend := fs.String("backend", "auto", "compute backend: auto (CUDA when a driver and device are found, else CPU), cpu or cuda")
	threads := fs.Int("threads", 0, "CPU backend threads (0: all cores, shared among the ranks on this machine)")
	device := fs.Int("device", -1, "CUDA device ordinal (default: the launcher's local rank, 0 for one process)")
	distMode := fs.String("dist", "auto", "data-parallel collectives: auto (none for one process; launched by torchrun, srun or mpirun: mpi on the CPU, nccl on CUDA), none, mpi or nccl")
	rankTimeout := addRankTimeout(fs)
	if err := parseFlags(fs, args, -1); err != nil {
		return err
	}
	overrides, err := overrideArgs(fs)
	if err != nil {
		return err
	}
	o.Overrides = overrides
	l, err := detectLaunch(*distMode)
	if err != nil {
		return err
	}
	blog := stderr
	if l.Rank != 0 {
		blog = io.Discard // rank 0 speaks for the run
	}
	if l.note != "" {
		fmt.Fprintf(blog, "train: %s\n", l.note)
	}
	dev := l.LocalRank
	if *device >= 0 {
		dev = *device
	}
	be, err := openBackend(*backend, l.threadsPerRank(*threads), dev, blog)
	if err != nil {
		return err
	}
	defer closeBackend(be)
	if err := l.openComm(*distMode, be, *rankTimeout); err != nil {
		return err
	}
	if l.Size > 1 {
		fmt.Fprintf(blog, "train: %d ranks over %s (%s)\n", l.Size, l.mode, strings.Join(l.Launchers, "+"))
	}
	stop, release := watchSignals(blog)
	defer release()
	o.Backend, o.Log, o.Signals, o.Comm = be, stderr, stop, l.comm
	t, err := trainer.New(o)
	if err == nil {
		err = t.Run()
		t.Close()
	}
	if err != nil && l.Size > 1 {
		if !trainer.Agreed(err) {
			// Only this rank knows: say so, then end every rank, which may
			// be waiting for this one in a collective.
			l.abort(err, stderr)
			return errQuiet
		}
		// Every rank failed with the same error. Rank 0 reports it before
		// any rank exits (mpirun ends the whole job as soon as one rank
		// exits with an error, which cut rank 0's message off), then the
		// ranks leave together.
		if l.Rank == 0 {
			fmt.Fprintf(stderr, "train: %v\n", err)
		}
		if l.comm != nil {
			l.comm.Barrier()
		}
		l.close()
		if errors.Is(err, errUsage) {
			return fmt.Errorf("%w (%w)", errQuiet, errUsage)
		}
		return errQuiet
	}
	l.close()
	return err
}
