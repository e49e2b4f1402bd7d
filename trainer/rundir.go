package trainer

import (
	"errors"
	"fmt"
	"os"
	"path/filepath"
	"strings"

	"github.com/tracegrpo/tracegrpo/checkpoint"
	"github.com/tracegrpo/tracegrpo/config"
	"github.com/tracegrpo/tracegrpo/internal/atomicfile"
)

// The files a run writes in its directory.
const (
	configFileName  = "config.yaml"
	metricsFileName = "metrics.jsonl"
)

// openRunDir checks and locks the run directory t.out. Nothing of the run
// is written yet: a fresh run refuses a directory that holds another run
// (naming --resume), every output is checked against the inputs, and the
// lock makes a second trainer on the same directory fail naming the first.
func (t *Trainer) openRunDir() error {
	inputs := append([]string{t.o.Rollouts}, t.o.ConfigFiles...)
	for _, f := range []string{configFileName, metricsFileName} {
		if err := atomicfile.CheckNotInput(filepath.Join(t.out, f), inputs...); err != nil {
			return fmt.Errorf("%w: --out %s: the run writes its %s there, over an input (%v): choose another --out", ErrUsage, t.out, f, err)
		}
	}
	if err := t.checkOutputsOutsideInputs(); err != nil {
		return err
	}
	if !t.o.Resume {
		for _, f := range []string{metricsFileName, "checkpoints"} {
			if _, err := os.Stat(filepath.Join(t.out, f)); err == nil {
				return fmt.Errorf("run directory %s already holds a run (%s): pass --resume to continue it (it starts over at step 0 when that run has no complete checkpoint), or choose another --out", t.out, f)
			}
		}
	}
	if err := os.MkdirAll(t.out, 0o755); err != nil {
		return fmt.Errorf("run directory: %w", err)
	}
	unlock, err := lockDir(filepath.Join(t.out, lockFile))
	if err != nil {
		return err
	}
	t.unlock = unlock
	return nil
}

// runInput is one input of a run, named by the flag or key that gave it.
type runInput struct {
	name, path string
	dir        bool // a directory (a model, a checkpoint, a capture store)
}

// runInputs lists what the run reads: recipes, the initial weights'
// directory, the rollouts and the capture store they correlate with.
func (t *Trainer) runInputs() []runInput {
	var in []runInput
	for _, f := range t.o.ConfigFiles {
		in = append(in, runInput{name: "--config", path: f})
	}
	switch {
	case t.o.InitFrom != "":
		in = append(in, runInput{name: "--init-from", path: t.o.InitFrom, dir: true})
	case t.cfg.Policy.ModelName != builtinModelName && t.cfg.Policy.ModelName != "":
		in = append(in, runInput{name: "policy.model_name", path: string(t.cfg.Policy.ModelName), dir: true})
	}
	if src, ok := t.source.(*externalSource); ok {
		in = append(in, runInput{name: "--rollouts", path: src.path, dir: src.dir})
		name := "--captures"
		if t.o.Captures == "" {
			name = "env.nemo_gym.token_id_capture.dir"
		}
		in = append(in, runInput{name: name, path: src.capDir, dir: true})
	}
	return in
}

// captureOutput is the directory the built-in job writes its captures to,
// and what asked for it ("" when they stay in memory).
func (t *Trainer) captureOutput() (dir, name string) {
	s, ok := t.source.(*builtinSource)
	switch {
	case !ok:
		return "", ""
	case s.captureDir != "":
		return s.captureDir, "env.nemo_gym.token_id_capture.dir"
	case s.save:
		return filepath.Join(t.out, "captures"), "--save-captures"
	}
	return "", ""
}

// checkOutputsOutsideInputs refuses a run whose outputs overlap its
// inputs: the run directory or the built-in job's capture directory is an
// input directory or lies inside one (a run written into the checkpoint it
// starts from), or an input lies inside a directory the run writes and
// prunes (its checkpoints, its captures).
func (t *Trainer) checkOutputsOutsideInputs() error {
	capDir, capName := t.captureOutput()
	for _, in := range t.runInputs() {
		if in.path == "" {
			continue
		}
		if in.dir {
			if err := atomicfile.CheckNotInside(t.out, in.path); err != nil {
				return fmt.Errorf("%w: --out: %v, the run's input (%s): the run would write into it; choose a --out outside it", ErrUsage, err, in.name)
			}
			if err := atomicfile.CheckNotInside(capDir, in.path); err != nil {
				return fmt.Errorf("%w: %s: %v, the run's input (%s): the built-in job would write its captures into it", ErrUsage, capName, err, in.name)
			}
		}
		if err := atomicfile.CheckNotInside(in.path, t.checkpointDir()); err != nil {
			return fmt.Errorf("%w: %s: %v, the run's checkpoints directory, which the run writes and prunes: copy the input elsewhere first", ErrUsage, in.name, err)
		}
		if err := atomicfile.CheckNotInside(in.path, capDir); err != nil {
			return fmt.Errorf("%w: %s: %v, where the built-in job writes its captures (%s)", ErrUsage, in.name, err, capName)
		}
	}
	return nil
}

// findCheckpoint decides where a --resume run starts: the newest complete
// checkpoint, an older one with --fallback, or step 0 when there is none.
// A refused newest checkpoint without --fallback is an error whose hint
// says what --fallback would do.
func (t *Trainer) findCheckpoint() error {
	dir := t.checkpointDir()
	ents, err := checkpoint.List(dir)
	if errors.Is(err, os.ErrNotExist) || (err == nil && len(ents) == 0) {
		return nil // nothing to resume: start at step 0
	}
	if err != nil {
		return fmt.Errorf("resume: %w", err)
	}
	path, err := checkpoint.Latest(dir, checkpoint.LoadOptions{Fallback: t.o.Fallback})
	switch {
	case err == nil:
		t.resumeFrom = path
		return nil
	case errors.Is(err, checkpoint.ErrNoCheckpoint):
		// Only with --fallback: every checkpoint was refused.
		t.resumeNote = fmt.Sprintf(" (%d refused: %v)", len(ents), err)
		return nil
	}
	older := ""
	for _, e := range ents[1:] {
		if e.Done {
			older = e.Path
			break
		}
	}
	hint := "pass --fallback to start the run over at step 0 (there is no older checkpoint)"
	if older != "" {
		hint = fmt.Sprintf("pass --fallback to resume from the newest older checkpoint that verifies (%s has a DONE marker)", filepath.Base(older))
	}
	return fmt.Errorf("resume: %w; %s", err, hint)
}

// writeEffectiveConfig writes config.yaml: what the run actually does.
func (t *Trainer) writeEffectiveConfig() error {
	y, err := t.effectiveConfig()
	if err != nil {
		return err
	}
	return atomicfile.WriteFile(filepath.Join(t.out, configFileName), y)
}

// effectiveConfig is the configuration as the run uses it: the recipe with
// the paths the run really writes, only the optimizer block in force, and a
// header naming the files read, the ignored keys and the choices made.
func (t *Trainer) effectiveConfig() ([]byte, error) {
	c := t.cfg
	c.Checkpointing.CheckpointDir = t.checkpointDir()
	c.Logger.LogDir = config.OptionalString(t.logDir()) // null when nothing is written there
	capDir := t.source.captures()
	if capDir != "" {
		c.Env.NemoGym.TokenIDCapture.Dir = capDir
	}
	oc, _, err := c.Optim()
	if err != nil {
		return nil, err
	}
	var notes []string
	if oc.Source == "megatron" {
		c.Policy.Optimizer, c.Policy.Scheduler = nil, nil
		notes = append(notes, "optimizer: policy.megatron_cfg.optimizer and .scheduler (megatron_cfg.enabled); policy.optimizer and policy.scheduler are not used and not shown")
	} else {
		notes = append(notes, "optimizer: policy.optimizer and policy.scheduler; policy.megatron_cfg.optimizer and .scheduler are not used")
	}
	switch {
	case capDir == "":
		notes = append(notes, "checkpointing.checkpoint_dir is the directory this run writes (--out)",
			"captures: kept in memory, one step at a time, and never written to disk (token_id_capture.dir is empty; --save-captures writes them to "+filepath.Join(t.out, "captures")+")")
	case t.o.Rollouts == "":
		notes = append(notes, "checkpointing.checkpoint_dir and the capture dir are the directories this run writes",
			"captures: written to "+capDir+" in NeMo Gym's format")
	default:
		notes = append(notes, "checkpointing.checkpoint_dir is the directory this run writes (--out)",
			"captures: read from "+capDir+" (NeMo Gym's)")
	}
	body, err := config.Marshal(&c)
	if err != nil {
		return nil, err
	}
	var b strings.Builder
	b.WriteString("# tracegrpo effective configuration: what this run does\n")
	for _, f := range t.loaded.Files {
		fmt.Fprintf(&b, "# file: %s\n", f)
	}
	for _, s := range t.o.Overrides {
		fmt.Fprintf(&b, "# override %s\n", s)
	}
	for _, s := range t.o.Sets {
		fmt.Fprintf(&b, "# --set %s\n", s)
	}
	for _, n := range notes {
		fmt.Fprintf(&b, "# %s\n", n)
	}
	if len(t.loaded.Ignored) > 0 {
		fmt.Fprintf(&b, "# ignored (%d keys for engines tracegrpo does not run): %s\n", len(t.loaded.Ignored), strings.Join(t.loaded.Ignored, ", "))
	}
	for _, w := range t.loaded.Warnings() {
		fmt.Fprintf(&b, "# warning: %s\n", w)
	}
	b.Write(body)
	return []byte(b.String()), nil
}

// checkOutWritable makes sure, before any work, that this rank can write
// the run directory if it ever will: rank 0 always (its metrics, config
// and checkpoints), every rank of a sharded run that checkpoints (each
// writes its shard of every checkpoint there). A rank that cannot (a
// read-only or missing mount on its node, another user's directory) would
// otherwise be found at the first checkpoint, after save_period steps of
// work. It creates and removes a file of its own in the directory.
func (t *Trainer) checkOutWritable() error {
	if t.rank != 0 && !(t.shardFull && t.cfg.Checkpointing.Enabled) {
		return nil
	}
	why := "the run writes its metrics, config and checkpoints there"
	if t.rank != 0 {
		why = "every rank of a sharded run writes its shard of each checkpoint there"
	}
	probe := filepath.Join(t.out, fmt.Sprintf(".write-check-rank-%d-%d", t.rank, os.Getpid()))
	f, err := createProbe(probe)
	if err == nil {
		_, err = f.Write([]byte("tracegrpo\n"))
		err = errors.Join(err, f.Close(), os.Remove(probe))
	}
	if err != nil {
		return fmt.Errorf("--out %s: rank %d cannot write there (%w): %s; make it writable on every rank's machine, or choose another --out", t.out, t.rank, err, why)
	}
	return nil
}

// createProbe creates checkOutWritable's file (a variable: tests make it
// fail for one rank, as a read-only mount would; they run as root, whom
// permissions do not stop).
var createProbe = func(path string) (*os.File, error) {
	return os.OpenFile(path, os.O_WRONLY|os.O_CREATE|os.O_EXCL, 0o600)
}
