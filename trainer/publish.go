package trainer

import (
	"errors"
	"fmt"
	"io"
	"path/filepath"
	"strconv"
	"time"

	"github.com/tracegrpo/tracegrpo/config"
	"github.com/tracegrpo/tracegrpo/internal/atomicfile"
	"github.com/tracegrpo/tracegrpo/internal/safetensors"
	"github.com/tracegrpo/tracegrpo/loop"
)

// Weights for the generator (--weights-out, policy.generation.weights_out):
// a servable directory of the policy's weights (package loop) before the
// first step (the initial weights, or a resumed run's) and after every
// step's update. Rank 0 writes it; under --shard full every rank takes part
// in the export's gathers, one layer at a time, so no rank holds the whole
// model. The trainer remembers the sha256 of the weights it published last,
// which the next step file's sidecar must name.

// weightsOut is the run's weights publisher.
type weightsOut struct {
	dir       string
	dtype     safetensors.DType
	dtypeName string
	keep      int
	copyFrom  string          // the initial weights' directory: its tokenizer files ("" : none)
	pub       *loop.Publisher // rank 0
	// The newest published step and the sha256 of its model.safetensors
	// (rank 0; -1 before the first).
	step int
	sha  string
}

var weightsDTypes = map[string]safetensors.DType{
	config.WeightsBFloat16: safetensors.BF16, config.WeightsFloat16: safetensors.F16, config.WeightsFloat32: safetensors.F32,
}

// setupWeightsOut opens the weights directory the config names (rank 0),
// refusing one that is, or lies inside, an input or the run's checkpoints.
func (t *Trainer) setupWeightsOut() error {
	dir, dtype, keep, err := t.cfg.WeightsOut()
	if err != nil || dir == "" {
		return err
	}
	w := &weightsOut{dir: dir, dtype: weightsDTypes[dtype], dtypeName: dtype, keep: keep, copyFrom: t.initDir(), step: -1}
	t.wout = w
	if t.rank != 0 {
		return nil
	}
	name := "--weights-out"
	if t.o.WeightsOut == "" {
		name = "policy.generation.weights_out"
	}
	for _, in := range t.runInputs() {
		if in.path == "" {
			continue
		}
		if err := atomicfile.CheckNotInside(dir, in.path); err != nil {
			return fmt.Errorf("%w: %s: %v, the run's input (%s): the weights for the generator would be written into it; choose a directory outside it", ErrUsage, name, err, in.name)
		}
		if err := atomicfile.CheckNotInside(in.path, dir); err != nil {
			return fmt.Errorf("%w: %s: %s (%s) lies inside it, and the trainer prunes its step directories: choose another directory", ErrUsage, name, in.name, in.path)
		}
	}
	if err := atomicfile.CheckNotInside(dir, t.checkpointDir()); err != nil {
		return fmt.Errorf("%w: %s: %v, the run's checkpoints directory: choose a directory of its own (e.g. %s)", ErrUsage, name, err, filepath.Join(t.out, "weights"))
	}
	if err := atomicfile.CheckNotInside(t.out, dir); err != nil {
		return fmt.Errorf("%w: %s: the run directory %s is inside it: choose a directory of its own (e.g. %s)", ErrUsage, name, t.out, filepath.Join(t.out, "weights"))
	}
	var have []int64
	if w.pub, have, err = loop.OpenPublisher(dir, keep); err != nil {
		return err
	}
	if len(have) > 0 && !t.o.Resume {
		return fmt.Errorf("%w: %s %s already holds weights (step_%d): a generator could take them for this run's; choose an empty directory, or remove them", ErrUsage, name, dir, have[0])
	}
	return nil
}

// exported is what one publication of the weights cost.
type exported struct {
	seconds float64
	bytes   int64
}

// publishWeights publishes the weights after step (0: the initial ones) as
// W/step_<step>/. Every rank calls it; rank 0 writes.
func (t *Trainer) publishWeights(step int) (exported, error) {
	w := t.wout
	if w == nil {
		return exported{}, nil
	}
	start := time.Now()
	var done loop.Done
	var err error
	switch {
	case t.rank == 0:
		done, err = t.writeWeights(step)
	case t.sharded(): // the gathers rank 0 streams from
		err = t.model.WriteHF(nil, w.dtype, nil)
	}
	if err := t.agree(err); err != nil {
		return exported{}, fmt.Errorf("weights for the generator (step_%d): %w", step, err)
	}
	if t.rank == 0 {
		m, _ := done.File(loop.ModelFile)
		w.step, w.sha = step, m.SHA256
	}
	return exported{seconds: time.Since(start).Seconds(), bytes: done.Bytes()}, nil
}

// writeWeights is rank 0's part of publishWeights.
func (t *Trainer) writeWeights(step int) (loop.Done, error) {
	w := t.wout
	pd, err := w.pub.Begin(int64(step))
	var f *loop.File
	if err == nil {
		if f, err = pd.Create(loop.ModelFile); err != nil {
			pd.Discard()
		}
	}
	var out io.Writer
	if f != nil {
		out = f
	}
	if out != nil || t.sharded() { // sharded: the other ranks gather with rank 0 whatever it met
		meta := map[string]string{"format": "pt", "tracegrpo_format": "generator-weights", "step": strconv.Itoa(step)}
		err = errors.Join(err, t.model.WriteHF(out, w.dtype, meta))
	}
	if f != nil {
		err = errors.Join(err, f.Close())
	}
	if err != nil {
		if pd != nil {
			pd.Discard()
		}
		return loop.Done{}, err
	}
	cfgJSON, err := t.model.HFConfigJSON(w.dtype)
	if err == nil {
		err = pd.WriteFile(loop.ConfigFile, cfgJSON)
	}
	if err == nil && w.copyFrom != "" {
		_, err = pd.CopyFrom(w.copyFrom)
	}
	if err != nil {
		pd.Discard()
		return loop.Done{}, err
	}
	done, _, err := pd.Publish(w.dtypeName)
	return done, err
}

// publishFirst publishes the weights the first step file must come from:
// the initial weights (step_0), or a resumed run's. It says so once.
func (t *Trainer) publishFirst() error {
	if t.wout == nil {
		return nil
	}
	e, err := t.publishWeights(t.step)
	if err != nil {
		return err
	}
	copied := "no tokenizer files (the initial weights are random: serve them with the tokenizer of your choice)"
	if t.wout.copyFrom != "" {
		copied = "the tokenizer files and generation_config.json of " + t.wout.copyFrom
	}
	t.logf("weights for the generator: %s (%s, %s, with %s) in %.2fs; step_<N> follows each step's update, the newest %d kept",
		loop.WeightsDir(t.wout.dir, int64(t.step)), t.wout.dtypeName, Bytes(e.bytes), copied, e.seconds, t.wout.keep)
	return nil
}

// publishedSHA is the sha256 of the model.safetensors the trainer
// published as step ("": not known on this rank, or not published).
func (t *Trainer) publishedSHA(step int) string {
	if t.wout == nil || t.wout.step != step {
		return ""
	}
	return t.wout.sha
}
