// Package fakegen is a generator of the loop protocol (package loop) that
// needs no vLLM and no NeMo Gym: for each step N it waits for the trainer's
// W/step_<N-1>/, checks it against its DONE, loads those weights on a CPU
// (or any) backend, plays tracegrpo's built-in agentic tasks with them
// through the built-in job's own sampler (rollout/modelpolicy), records
// every call in a NeMo Gym capture store, and writes R/step_<N>.jsonl with
// its sidecar (loop.WriteStep). `train generate` runs it; the protocol
// tests drive a real trainer with it, and scripts/gym_vllm_loop.py --fake
// calls `train generate --step` for its collection in place of vLLM and
// Gym. The tiny built-in model it serves is the trainer's: its rollouts are
// the ones the built-in job would sample from the same weights.
package fakegen

import (
	"bytes"
	"encoding/json"
	"fmt"
	"io"
	"path/filepath"
	"time"

	"github.com/tracegrpo/tracegrpo/config"
	"github.com/tracegrpo/tracegrpo/gym"
	"github.com/tracegrpo/tracegrpo/kernels"
	"github.com/tracegrpo/tracegrpo/loop"
	"github.com/tracegrpo/tracegrpo/model"
	"github.com/tracegrpo/tracegrpo/rollout"
	"github.com/tracegrpo/tracegrpo/rollout/modelpolicy"
)

// Options configure a generator.
type Options struct {
	// Config is the run's recipe: the task groups per step, the rollouts
	// per group, the seed, the sampling and the sequence length are the
	// trainer's.
	Config *config.Config
	Tasks  []rollout.Task
	// Weights is the trainer's --weights-out, Rollouts its --rollouts
	// directory and Captures its --captures.
	Weights, Rollouts, Captures string
	Backend                     kernels.Backend
	// Wait bounds each wait for a weights directory (0: look once).
	Wait time.Duration
	// Stale makes the generator serve the weights of Stale steps before
	// the ones it should (tests: a generator that fell behind). Its
	// sidecars say so, and a trainer refuses them.
	Stale int
	// NoSidecar writes step files without their sidecar, as a generator
	// that does not state its policy version does.
	NoSidecar bool
	Log       io.Writer       // one line per step (nil: none)
	Stop      <-chan struct{} // ends a wait (nil: never)
}

// Generator writes step files.
type Generator struct {
	o      Options
	writer *gym.Writer
}

// New opens the capture store a generator records into.
func New(o Options) (*Generator, error) {
	if o.Config == nil || o.Backend == nil || len(o.Tasks) == 0 {
		return nil, fmt.Errorf("fakegen: Options need a Config, a Backend and tasks")
	}
	if o.Log == nil {
		o.Log = io.Discard
	}
	w, err := gym.NewWriter(o.Captures)
	if err != nil {
		return nil, err
	}
	return &Generator{o: o, writer: w}, nil
}

// Source is the weights step N's rollouts are generated from: N-1, or
// earlier for a stale generator.
func (g *Generator) Source(step int) int { return max(0, step-1-g.o.Stale) }

// Collect generates step's rollouts from the weights directory dir (its
// files checked against DONE first), recording their calls in the capture
// store, and returns the records (JSONL) and the sidecar that names dir.
func (g *Generator) Collect(step int, dir string) ([]byte, loop.Meta, error) {
	d, err := loop.Verify(dir)
	if err != nil {
		return nil, loop.Meta{}, err
	}
	entry, _ := d.File(loop.ModelFile)
	mc, err := model.LoadConfig(filepath.Join(dir, loop.ConfigFile))
	if err != nil {
		return nil, loop.Meta{}, err
	}
	c := g.o.Config
	maxLen := c.Policy.MaxTotalSequenceLength
	m, err := model.New(g.o.Backend, mc, model.Options{MaxTokens: maxLen, ForwardOnly: true})
	if err != nil {
		return nil, loop.Meta{}, err
	}
	defer m.Close()
	if err := m.LoadHF(dir); err != nil {
		return nil, loop.Meta{}, err
	}
	gbs := c.GRPO.NumPromptsPerStep * c.GRPO.NumGenerationsPerPrompt
	s, err := model.NewSampler(m, min(gbs, 64)*2, maxLen)
	if err != nil {
		return nil, loop.Meta{}, err
	}
	defer s.Close()
	policy := &modelpolicy.Policy{S: s, Opt: modelpolicy.Options(c.Policy.Generation), Max: maxLen}
	streams := rollout.Streams{Seed: uint64(c.GRPO.Seed)}
	specs := rollout.Plan(g.o.Tasks, step, c.GRPO.NumPromptsPerStep, c.GRPO.NumGenerationsPerPrompt, streams)
	rec := &rollout.GymRecorder{W: g.writer, Model: string(c.Policy.ModelName)}
	results, err := rollout.Run(policy, rec, specs, streams)
	if err != nil {
		return nil, loop.Meta{}, fmt.Errorf("fakegen: step %d: %w", step, err)
	}
	var recs bytes.Buffer
	for i := range results {
		b, err := json.Marshal(results[i].Record())
		if err != nil {
			return nil, loop.Meta{}, err
		}
		recs.Write(append(b, '\n'))
	}
	return recs.Bytes(), loop.Meta{PolicyStep: d.Step, WeightsSHA256: entry.SHA256}, nil
}

// Step generates step N whole: it waits for its weights, collects, and
// writes the step file with its sidecar.
func (g *Generator) Step(step int) error {
	src := g.Source(step)
	if _, err := loop.WaitDone(g.o.Weights, int64(src), g.o.Wait, 50*time.Millisecond, g.o.Stop); err != nil {
		return fmt.Errorf("fakegen: step %d: %w", step, err)
	}
	recs, meta, err := g.Collect(step, loop.WeightsDir(g.o.Weights, int64(src)))
	if err != nil {
		return err
	}
	side := &meta
	if g.o.NoSidecar {
		side = nil
	}
	if err := loop.WriteStep(g.o.Rollouts, int64(step), recs, side); err != nil {
		return err
	}
	fmt.Fprintf(g.o.Log, "generate: %s: %d rollouts from %s (sha256 %s…)\n", loop.StepFile(g.o.Rollouts, int64(step)),
		bytes.Count(recs, []byte{'\n'}), loop.WeightsDir(g.o.Weights, int64(src)), meta.WeightsSHA256[:12])
	return nil
}

// Run generates steps from (0: the one after the rollouts directory's
// newest, loop.NextStep) through last.
func (g *Generator) Run(from, last int) error {
	if from == 0 {
		n, err := loop.NextStep(g.o.Rollouts)
		if err != nil {
			return err
		}
		from = int(n)
	}
	for n := from; n <= last; n++ {
		if err := g.Step(n); err != nil {
			return err
		}
	}
	return nil
}
