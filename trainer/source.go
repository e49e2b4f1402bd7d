package trainer

import (
	"bufio"
	"crypto/sha256"
	"encoding/json"
	"errors"
	"fmt"
	"io"
	"os"
	"path/filepath"
	"slices"
	"strings"
	"time"

	"github.com/tracegrpo/tracegrpo/collective"
	"github.com/tracegrpo/tracegrpo/gym"
	"github.com/tracegrpo/tracegrpo/internal/inputfile"
	"github.com/tracegrpo/tracegrpo/loop"
	"github.com/tracegrpo/tracegrpo/model"
	"github.com/tracegrpo/tracegrpo/rollout"
	"github.com/tracegrpo/tracegrpo/rollout/modelpolicy"
)

// rolloutSource yields each step's rollout records and the captures they
// correlate with.
type rolloutSource interface {
	// start finishes setting up once the model and the random streams exist.
	start(t *Trainer) error
	// next returns the records of GRPO step (1-based) and their captures.
	next(step int) ([]*gym.Record, gym.Source, error)
	// cursor is the source's position after the last step, for checkpoints;
	// restore goes back to it.
	cursor() (json.RawMessage, error)
	restore(c json.RawMessage) error
	// stepInput names what this rank read for the last step (a step file
	// and its sha256) for the ranks to compare; "" when the ranks'
	// inputs were agreed on at start.
	stepInput() string
	// captures is the capture directory the source reads (and, built in,
	// writes), once started; "" when the built-in job keeps its captures
	// in memory.
	captures() string
	// waited is how long the last next waited for its step file to
	// appear (part of its time).
	waited() time.Duration
	close()
}

// newSource chooses the rollout source from the flags and config, and checks
// its inputs exist before any work starts.
func (t *Trainer) newSource() (rolloutSource, error) {
	gbs := t.cfg.Policy.TrainGlobalBatchSize
	capDir := t.cfg.Env.NemoGym.TokenIDCapture.Dir
	if t.o.Captures != "" {
		capDir = t.o.Captures
	}
	if t.o.Rollouts == "" {
		if t.o.Captures != "" {
			return nil, fmt.Errorf("%w: --captures is for --rollouts (the built-in job records its own captures; --save-captures writes them to disk)", ErrUsage)
		}
		tasks, err := rollout.LookupTasks(t.o.Tasks)
		if err != nil {
			return nil, err
		}
		return &builtinSource{tasks: tasks, captureDir: capDir, save: t.o.SaveCaptures}, nil
	}
	if t.o.SaveCaptures {
		return nil, fmt.Errorf("%w: --save-captures is for the built-in job; with --rollouts the captures are NeMo Gym's, in --captures", ErrUsage)
	}
	if capDir == "" {
		return nil, fmt.Errorf("%w: --rollouts needs --captures DIR (or env.nemo_gym.token_id_capture.dir): the NeMo Gym capture directory its records correlate with", ErrUsage)
	}
	if st, err := os.Stat(capDir); err != nil || !st.IsDir() {
		return nil, fmt.Errorf("capture directory %s: not a readable directory", capDir)
	}
	reader, err := gym.NewReader(capDir)
	if err != nil {
		return nil, err
	}
	st, err := os.Stat(t.o.Rollouts)
	if err != nil {
		return nil, fmt.Errorf("rollouts: %w", err)
	}
	src := &externalSource{path: t.o.Rollouts, dir: st.IsDir(), reader: reader, gbs: gbs, wait: t.o.Wait, capDir: capDir}
	if !src.dir {
		if err := src.check(); err != nil {
			return nil, err
		}
	}
	return src, nil
}

// builtinSource plays the built-in tasks with the current policy, records
// every call in a Gym capture store and reads it back like external captures,
// through the same reader and builders. The store is in memory, a fresh one
// each step (the previous step's captures were finalized in that step), so
// memory stays bounded and nothing is written to disk; it is a directory
// only when the user asks: --save-captures (<out>/captures) or an explicit
// env.nemo_gym.token_id_capture.dir.
type builtinSource struct {
	tasks      []rollout.Task
	captureDir string // "": in memory, unless save
	save       bool   // --save-captures: a directory, <out>/captures by default
	t          *Trainer
	writer     *gym.Writer
	reader     *gym.Reader
	rec        *rollout.GymRecorder
	policy     *modelpolicy.Policy
}

func (s *builtinSource) start(t *Trainer) error {
	s.t = t
	if s.save && s.captureDir == "" {
		s.captureDir = filepath.Join(t.out, "captures")
	}
	if s.captureDir != "" { // else next makes each step's in-memory store
		// A directory outside the run directory (the spec §9 block's
		// /shared/gym-capture) is never created implicitly.
		if err := mkdirUnder(s.captureDir, t.out, "env.nemo_gym.token_id_capture.dir"); err != nil {
			return err
		}
		var err error
		if s.writer, err = gym.NewWriter(s.captureDir); err != nil {
			return err
		}
		// The built-in generator re-creates a step's captures from the
		// checkpointed random streams on resume (clearing what a crashed
		// attempt left), so they need no per-write fsync.
		s.writer.SetFsync(false)
		if s.reader, err = gym.NewReader(s.captureDir); err != nil {
			return err
		}
		s.rec = &rollout.GymRecorder{W: s.writer, Model: string(t.cfg.Policy.ModelName)}
	}
	// The longest call: every prompt and generation fits one trace.
	sm := t.model
	if t.sampleModel != nil { // sharded: the whole weights, gathered each step
		sm = t.sampleModel
	}
	sampler, err := model.NewSampler(sm, samplerSlots(&t.cfg), t.cfg.Policy.MaxTotalSequenceLength)
	if err != nil {
		return err
	}
	s.policy = &modelpolicy.Policy{S: sampler, Opt: modelpolicy.Options(t.cfg.Policy.Generation), Max: t.cfg.Policy.MaxTotalSequenceLength}
	return nil
}

// newMemoryStore starts an empty in-memory capture store; the previous
// one, with everything captured in it, is dropped.
func (s *builtinSource) newMemoryStore() {
	s.writer = gym.NewMemoryWriter()
	s.reader = s.writer.Reader()
	s.rec = &rollout.GymRecorder{W: s.writer, Model: string(s.t.cfg.Policy.ModelName)}
}

func (s *builtinSource) next(step int) ([]*gym.Record, gym.Source, error) {
	if s.captureDir == "" {
		s.newMemoryStore()
	}
	c := &s.t.cfg.GRPO
	if s.t.sampleModel != nil {
		if err := s.t.sampleModel.GatherFrom(s.t.model); err != nil { // every rank, before its rollouts
			return nil, nil, fmt.Errorf("gather the weights for sampling: %w", err)
		}
	}
	// Every rank plans the whole step (the same specs, from keyed streams)
	// and plays its own block of task groups.
	specs := rollout.Plan(s.tasks, step, c.NumPromptsPerStep, c.NumGenerationsPerPrompt, s.t.streams)
	lo, hi := collective.Block(c.NumPromptsPerStep, s.t.rank, s.t.comm.Size())
	var mine []rollout.Spec
	for _, sp := range specs {
		if sp.TaskIndex >= lo && sp.TaskIndex < hi {
			mine = append(mine, sp)
		}
	}
	results, err := rollout.Run(s.policy, s.rec, mine, s.t.streams)
	if err != nil {
		return nil, nil, err
	}
	recs := make([]*gym.Record, len(results))
	for i := range results {
		b, err := json.Marshal(results[i].Record())
		if err != nil {
			return nil, nil, err
		}
		if recs[i], err = gym.ParseRecord(b); err != nil {
			return nil, nil, err
		}
		recs[i].File, recs[i].Line = fmt.Sprintf("built-in step %d", step), i+1
	}
	return recs, s.reader, nil
}

func (s *builtinSource) cursor() (json.RawMessage, error) {
	return json.Marshal(map[string]string{"kind": "builtin"})
}
func (s *builtinSource) restore(json.RawMessage) error { return nil }
func (s *builtinSource) captures() string              { return s.captureDir }
func (s *builtinSource) stepInput() string             { return "" }
func (s *builtinSource) waited() time.Duration         { return 0 }

func (s *builtinSource) close() {
	if s.policy != nil {
		s.policy.S.Close() // its KV cache and buffers, on the backend
		s.policy = nil
	}
	s.writer, s.reader, s.rec = nil, nil, nil
}

// externalSource reads rollout records that NeMo Gym wrote: a JSONL file
// consumed train_global_batch_size records per step, or a directory of
// step_<N>.jsonl files (one per step) waited for as a generator writes them
// (package loop's protocol): a writer of that directory creates each file
// whole (write, then rename into place), its sidecar step_<N>.meta.json
// first, which names the weights that generated it.
type externalSource struct {
	t       *Trainer
	stopped <-chan struct{} // closed by a stop request: stop waiting
	capDir  string
	path    string
	dir     bool
	reader  *gym.Reader
	gbs     int
	wait    time.Duration

	f        *os.File
	rr       *gym.RecordReader
	consumed int64
	lastID   string
	digest   string // the last step file read, with its sha256

	waitedFor time.Duration // the last step file's wait
	sidecars  bool          // a step file had a sidecar: every later one must
	warned    bool          // the warning for a step file without one was given

	size   int64  // the rollouts file's bytes, when checked
	sha256 string // and its sha256
}

// fileCursor is an external JSONL file's position.
type fileCursor struct {
	Kind          string `json:"kind"`
	Path          string `json:"path"`
	Records       int64  `json:"records"`
	Offset        int64  `json:"offset"`
	LastRolloutID string `json:"last_rollout_id"`
}

// check reads the whole rollouts file once before training, so that a
// malformed record fails before any work.
func (s *externalSource) check() error {
	f, err := inputfile.Open(s.path, inputfile.Records)
	if err != nil {
		return fmt.Errorf("rollouts: %w", err)
	}
	defer f.Close()
	hr := &hashingReader{r: f, h: sha256.New()}
	rr := gym.NewRecordReader(bufio.NewReaderSize(hr, 1<<20), s.path)
	n := 0
	for {
		rec, err := rr.Next()
		if errors.Is(err, io.EOF) {
			break
		}
		if err != nil {
			return err
		}
		if _, err := gym.CorrelationKeysFromRecord(rec); err != nil {
			return fmt.Errorf("%s: %w", rec.Where(), err)
		}
		if _, err := gym.RolloutIDFromRecord(rec); err != nil {
			return fmt.Errorf("%s: %w", rec.Where(), err)
		}
		if _, err := rec.Reward(); err != nil {
			return fmt.Errorf("%s: %w", rec.Where(), err)
		}
		n++
	}
	if n < s.gbs {
		return fmt.Errorf("rollouts: %s holds %d records, fewer than one step's train_global_batch_size=%d", s.path, n, s.gbs)
	}
	if _, err := io.Copy(io.Discard, hr); err != nil { // the hash covers the whole file
		return fmt.Errorf("rollouts: %w", err)
	}
	s.size, s.sha256 = hr.n, fmt.Sprintf("%x", hr.h.Sum(nil))
	return nil
}

func (s *externalSource) start(t *Trainer) error {
	s.t, s.stopped = t, t.stop.stopped
	if s.dir {
		return nil
	}
	f, err := inputfile.Open(s.path, inputfile.Records)
	if err != nil {
		return fmt.Errorf("rollouts: %w", err)
	}
	s.f = f
	s.rr = gym.NewRecordReader(bufio.NewReaderSize(f, 1<<20), s.path)
	return nil
}

func (s *externalSource) next(step int) ([]*gym.Record, gym.Source, error) {
	recs, err := s.readStep(step)
	if err != nil {
		return nil, nil, err
	}
	return s.t.myRecords(recs), s.reader, nil
}

// myRecords is this rank's share of a step's records: the records of a
// contiguous block of the step's task groups (_ng_task_index, ascending),
// in their order in the file. A record without a usable task index goes to
// rank 0, whose finalization names it.
func (t *Trainer) myRecords(recs []*gym.Record) []*gym.Record {
	n := t.comm.Size()
	if n == 1 {
		return recs
	}
	group := make([]int64, len(recs))
	has := make([]bool, len(recs))
	seen := map[int64]bool{}
	var groups []int64
	for i, rec := range recs {
		if keys, err := gym.CorrelationKeysFromRecord(rec); err == nil && keys.TaskIndex != nil {
			group[i], has[i] = *keys.TaskIndex, true
			if !seen[group[i]] {
				seen[group[i]] = true
				groups = append(groups, group[i])
			}
		}
	}
	slices.Sort(groups)
	lo, hi := collective.Block(len(groups), t.rank, n)
	mine := map[int64]bool{}
	for _, g := range groups[lo:hi] {
		mine[g] = true
	}
	var out []*gym.Record
	for i, rec := range recs {
		if (has[i] && mine[group[i]]) || (!has[i] && t.rank == 0) {
			out = append(out, rec)
		}
	}
	return out
}

// readStep reads all of step's records: the next train_global_batch_size
// records of the file, or the step's file of the directory.
func (s *externalSource) readStep(step int) ([]*gym.Record, error) {
	if s.dir {
		return s.readStepFile(step)
	}
	recs := make([]*gym.Record, 0, s.gbs)
	for len(recs) < s.gbs {
		rec, err := s.rr.Next()
		if errors.Is(err, io.EOF) {
			return nil, fmt.Errorf("rollouts: %s ran out after %d records; step %d needs %d more (train_global_batch_size=%d per step)",
				s.path, s.consumed, step, s.gbs-len(recs), s.gbs)
		}
		if err != nil {
			return nil, err
		}
		recs = append(recs, rec)
		s.consumed++
		if id, err := gym.RolloutIDFromRecord(rec); err == nil {
			s.lastID = id
		}
	}
	return recs, nil
}

// readStepFile waits for DIR/step_<N>.jsonl, checks the policy version its
// sidecar names, and reads all of it.
func (s *externalSource) readStepFile(step int) ([]*gym.Record, error) {
	path := loop.StepFile(s.path, int64(step))
	start := time.Now()
	err := s.waitFor(path, step)
	s.waitedFor = time.Since(start)
	if err != nil {
		return nil, err
	}
	if err := s.checkPolicy(step); err != nil {
		return nil, err
	}
	f, err := inputfile.Open(path, inputfile.Records)
	if err != nil {
		return nil, err
	}
	defer f.Close()
	h := sha256.New()
	rr := gym.NewRecordReader(bufio.NewReaderSize(io.TeeReader(f, h), 1<<20), path)
	var recs []*gym.Record
	for {
		rec, err := rr.Next()
		if errors.Is(err, io.EOF) {
			break
		}
		if err != nil {
			return nil, fmt.Errorf("%w%s", err, stepFileHint)
		}
		recs = append(recs, rec)
	}
	if len(recs) != s.gbs {
		return nil, fmt.Errorf("%s holds %d records; a step takes exactly train_global_batch_size=%d%s", path, len(recs), s.gbs, stepFileHint)
	}
	s.digest = fmt.Sprintf("%s: sha256 %x", path, h.Sum(nil))
	return recs, nil
}

// stepFileHint ends the errors of a step file that reads short or torn:
// the trainer reads a step file as soon as it exists, so a generator that
// writes it in place races the trainer.
const stepFileHint = " (the trainer reads a step file as soon as it appears: a generator writes it whole under another name, " +
	"then renames it into place, as loop.WriteStep does; a file still being written reads short or torn)"

// checkPolicy checks step's sidecar: the rollouts came from the weights of
// the step before, with the sha256 the trainer published them with (rank
// 0, with --weights-out; otherwise the step alone is checked). A step file
// without a sidecar trains with one warning, unless an earlier one had a
// sidecar (a generator that writes its sidecar after the step file races
// the trainer).
func (s *externalSource) checkPolicy(step int) error {
	path := loop.MetaFile(s.path, int64(step))
	m, err := loop.ReadMeta(path)
	switch {
	case errors.Is(err, os.ErrNotExist) && s.sidecars:
		return fmt.Errorf("%s has no sidecar %s, though the step files before it had one: a generator writes the sidecar first, then renames the step file into place (loop.WriteStep)",
			loop.StepFile(s.path, int64(step)), filepath.Base(path))
	case errors.Is(err, os.ErrNotExist):
		if !s.warned && s.t.rank == 0 {
			s.warned = true
			fmt.Fprintf(s.t.o.Log, "train: warning: policy versions not checked: %s has no sidecar %s ({\"policy_step\": K, \"weights_sha256\": ...}); "+
				"the steps are trained without checking which weights generated their rollouts (docs/loop.md)\n", loop.StepFile(s.path, int64(step)), filepath.Base(path))
		}
		return nil
	case err != nil:
		return err
	}
	if !s.sidecars && s.t.wout == nil && s.t.rank == 0 {
		s.t.logf("note: the sidecars' weights_sha256 is not checked without --weights-out (policy_step is)")
	}
	s.sidecars = true
	return loop.CheckMeta(path, m, int64(step), s.t.publishedSHA(step-1))
}

// waitProgressEvery is how often a wait for a step file says so.
var waitProgressEvery = 30 * time.Second

// waitPoll is one rank's view of the step file the ranks wait for, shared
// at every poll.
type waitPoll struct {
	Seen bool      // the file exists for this rank
	Stop bool      // a stop request reached this rank
	Late bool      // this rank's --wait ran out (rank 0's decides)
	Err  rankError // the file could not be checked
}

// waitPollInterval is how often waiting ranks look for the step file and
// share what they saw.
const waitPollInterval = 200 * time.Millisecond

// waitFor waits until path exists for every rank. The ranks wait together:
// each poll they share whether they see the file and whether a stop request
// reached one of them, so a SIGTERM to any rank stops every rank within a
// poll, and all give up together when rank 0's --wait runs out (--wait 0:
// at the first look).
func (s *externalSource) waitFor(path string, step int) error {
	start := time.Now()
	deadline := start.Add(s.wait)
	said := start
	for {
		var my waitPoll
		if _, err := os.Stat(path); err == nil {
			my.Seen = true
		} else if !errors.Is(err, os.ErrNotExist) {
			my.Err = rankErrorOf(fmt.Errorf("rollouts: %w", err))
		}
		my.Stop = s.t.interrupted() != nil
		my.Late = !time.Now().Before(deadline)
		all, err := gather(s.t, my)
		if err != nil {
			return err
		}
		var seen, missing []string
		for r, p := range all {
			if p.Err.Msg != "" {
				return errors.New(p.Err.Msg)
			}
			if p.Stop {
				return errStopWaiting
			}
			if p.Seen {
				seen = append(seen, fmt.Sprint(r))
			} else {
				missing = append(missing, fmt.Sprint(r))
			}
		}
		switch {
		case len(missing) == 0:
			return nil
		case !all[0].Late:
		case len(seen) == 0:
			return fmt.Errorf("rollouts: %s did not appear within --wait %v", path, s.wait)
		default:
			return fmt.Errorf("rollouts: %s appeared for rank %s but not for rank %s within --wait %v: is %s on a file system every rank shares?",
				path, strings.Join(seen, ", "), strings.Join(missing, ", "), s.wait, s.path)
		}
		if now := time.Now(); now.Sub(said) >= waitProgressEvery && s.t.rank == 0 {
			said = now
			from := ""
			if w := s.t.wout; w != nil {
				from = fmt.Sprintf("; its generator serves %s", loop.WeightsDir(w.dir, int64(step-1)))
			}
			s.t.logf("waiting for %s: %v so far (--wait %v)%s", path, now.Sub(start).Round(time.Second), s.wait, from)
		}
		select {
		case <-s.stopped:
		case <-time.After(waitPollInterval):
		}
	}
}

func (s *externalSource) cursor() (json.RawMessage, error) {
	if s.dir {
		return json.Marshal(map[string]string{"kind": "dir", "path": s.path})
	}
	return json.Marshal(fileCursor{Kind: "file", Path: s.path, Records: s.consumed, Offset: s.rr.Offset(), LastRolloutID: s.lastID})
}

// restore skips the records a checkpoint consumed and checks that the file
// still holds them: resuming on another or a rewritten file is an error,
// never a silent skip.
func (s *externalSource) restore(raw json.RawMessage) error {
	if s.dir {
		return nil
	}
	var c fileCursor
	if err := json.Unmarshal(raw, &c); err != nil || c.Kind != "file" {
		return fmt.Errorf("resume: the checkpoint's rollout cursor %s is not a rollouts-file position (was the run started without --rollouts FILE?)", raw)
	}
	for s.consumed < c.Records {
		rec, err := s.rr.Next()
		if err != nil {
			return fmt.Errorf("resume: %s: reading the %d records the checkpoint consumed: %w", s.path, c.Records, err)
		}
		s.consumed++
		if id, err := gym.RolloutIDFromRecord(rec); err == nil {
			s.lastID = id
		}
	}
	if s.rr.Offset() != c.Offset || s.lastID != c.LastRolloutID {
		return fmt.Errorf("resume: %s changed since the checkpoint: after %d records it is at byte %d with rollout %q, the checkpoint recorded byte %d with rollout %q",
			s.path, c.Records, s.rr.Offset(), s.lastID, c.Offset, c.LastRolloutID)
	}
	return nil
}

func (s *externalSource) captures() string      { return s.capDir }
func (s *externalSource) stepInput() string     { return s.digest }
func (s *externalSource) waited() time.Duration { return s.waitedFor }

func (s *externalSource) close() {
	if s.f != nil {
		s.f.Close()
	}
}
