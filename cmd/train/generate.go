package main

import (
	"fmt"
	"io"
	"os"
	"time"

	"github.com/tracegrpo/tracegrpo/kernels/cpu"
	"github.com/tracegrpo/tracegrpo/loop"
	"github.com/tracegrpo/tracegrpo/loop/fakegen"
	"github.com/tracegrpo/tracegrpo/rollout"
	"github.com/tracegrpo/tracegrpo/trainer"
)

func init() {
	register(command{
		name:    "generate",
		summary: "a generator of the loop protocol on the CPU (no vLLM): the built-in tasks played with each step's published weights",
		run:     runGenerate,
	})
}

const generateSynopsis = `train generate --weights W --rollouts R --captures C [--config FILE]... [--set key=value]... [flags]

A generator of the trainer–generator protocol (docs/loop.md) that needs no
vLLM and no NeMo Gym, for trying the loop and for tests: for each step N it
waits for W/step_<N-1>/DONE (the weights a trainer run with --weights-out W
publishes), checks the directory's files against DONE, loads those weights,
plays tracegrpo's built-in agentic tasks with them (the built-in job's own
sampler), records every call in the NeMo Gym capture store C and writes
R/step_<N>.jsonl with its sidecar R/step_<N>.meta.json. Run it beside

  train --rollouts R --captures C --weights-out W [the same --config/--set]

It starts after the newest step file in R (or at --from) and stops after
grpo.max_num_steps (or --steps). The recipe must be the trainer's: the task
groups per step, rollouts per group, seed, sampling and sequence length.

With --step N --records FILE it collects one step only, from W/step_<N-1>,
recording its captures in C and writing the records to FILE, with no sidecar
and no rename: scripts/gym_vllm_loop.py --fake runs the rest of the protocol
itself around it.

Flags:`

func runGenerate(args []string, stdout, stderr io.Writer) error {
	fs := newFlags("generate", generateSynopsis, stdout)
	var files, sets []string
	fs.StringArrayVar(&files, "config", nil, "the trainer's recipe (YAML); repeatable")
	fs.StringArrayVar(&sets, "set", nil, "the trainer's --set overrides (repeatable)")
	weights := fs.String("weights", "", "the trainer's --weights-out directory")
	rollouts := fs.String("rollouts", "", "the trainer's --rollouts directory, where step_<N>.jsonl and its sidecar are written")
	captures := fs.String("captures", "", "the NeMo Gym capture store the calls are recorded in (the trainer's --captures)")
	tasks := fs.StringSlice("tasks", rollout.TaskNames(), "built-in tasks to cycle through (the trainer's --tasks)")
	from := fs.Int("from", 0, "the first step to generate (default: one past the newest step file in --rollouts)")
	steps := fs.Int("steps", 0, "the last step to generate (default grpo.max_num_steps)")
	wait := fs.Duration("wait", 10*time.Minute, "how long to wait for each weights directory")
	stale := fs.Int("stale", 0, "serve the weights of this many steps too early (to see a trainer refuse stale rollouts)")
	noSidecar := fs.Bool("no-sidecar", false, "write no step_<N>.meta.json (a generator that does not state its policy version: the trainer warns once and checks nothing)")
	one := fs.Int("step", 0, "collect this one step only, from W/step_<N-1>, writing its records to --records")
	records := fs.String("records", "", "with --step: the file the step's records are written to")
	threads := fs.Int("threads", 0, "CPU threads (0: all)")
	if err := parseFlags(fs, args, 0); err != nil {
		return err
	}
	if *weights == "" || *captures == "" || (*rollouts == "" && *one == 0) {
		return fmt.Errorf("%w: generate needs --weights, --captures and --rollouts (or --step and --records)", errUsage)
	}
	if (*one != 0) != (*records != "") || *one < 0 || *stale < 0 || *from < 0 || *steps < 0 {
		return fmt.Errorf("%w: generate: --step N (N ≥ 1) and --records FILE go together; --from, --steps and --stale are not negative", errUsage)
	}
	ld, _, err := trainer.LoadRecipe(files, sets)
	if err != nil {
		return fmt.Errorf("generate: %w", err)
	}
	ts, err := rollout.LookupTasks(*tasks)
	if err != nil {
		return fmt.Errorf("%w: generate: %v", errUsage, err)
	}
	be, err := newCPU(*threads)
	if err != nil {
		return fmt.Errorf("generate: %w", err)
	}
	defer be.Close()
	fmt.Fprintf(stderr, "generate: backend cpu (%d threads), %s\n", be.Threads(), cpu.SIMDChoice())
	g, err := fakegen.New(fakegen.Options{Config: &ld.Config, Tasks: ts, Weights: *weights, Rollouts: *rollouts,
		Captures: *captures, Backend: be, Wait: *wait, Stale: *stale, NoSidecar: *noSidecar, Log: stderr})
	if err != nil {
		return fmt.Errorf("generate: %w", err)
	}
	if *one != 0 {
		recs, meta, err := g.Collect(*one, loop.WeightsDir(*weights, int64(g.Source(*one))))
		if err != nil {
			return fmt.Errorf("generate: %w", err)
		}
		if err := os.WriteFile(*records, recs, 0o644); err != nil {
			return fmt.Errorf("generate: %w", err)
		}
		fmt.Fprintf(stdout, "{\"policy_step\": %d, \"weights_sha256\": %q}\n", meta.PolicyStep, meta.WeightsSHA256)
		return nil
	}
	last := *steps
	if last == 0 {
		last = ld.Config.GRPO.MaxNumSteps
	}
	if err := g.Run(*from, last); err != nil {
		return fmt.Errorf("generate: %w", err)
	}
	return nil
}
