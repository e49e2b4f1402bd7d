package trainer

import (
	"bufio"
	"bytes"
	"crypto/sha256"
	"encoding/hex"
	"encoding/json"
	"errors"
	"fmt"
	"math"
	"os"
	"path/filepath"
	"slices"
	"sort"
	"strings"

	"go.yaml.in/yaml/v3"

	"github.com/tracegrpo/tracegrpo/checkpoint"
	"github.com/tracegrpo/tracegrpo/config"
	"github.com/tracegrpo/tracegrpo/internal/atomicfile"
	"github.com/tracegrpo/tracegrpo/internal/inputfile"
	"github.com/tracegrpo/tracegrpo/internal/safetensors"
	"github.com/tracegrpo/tracegrpo/kernels"
	"github.com/tracegrpo/tracegrpo/model"
	"github.com/tracegrpo/tracegrpo/optim"
)

// newRunID is the id of a run that starts at step 0: the first 16 bytes,
// in hex, of the sha256 of its identity (the effective config, the
// initial weights, the data), so that runs that would train differently
// have different ids, and two runs of one identity (which train the same
// bits) write the same checkpoints.
func (t *Trainer) newRunID() (string, error) {
	id, err := t.identity()
	if err != nil {
		return "", err
	}
	b, err := json.Marshal(id)
	if err != nil {
		return "", err
	}
	sum := sha256.Sum256(b)
	return hex.EncodeToString(sum[:16]), nil
}

// runIdentity is what a resumed run must share with the run it continues,
// saved as trainer_state.json's config.
type runIdentity struct {
	ConfigYAML string     `json:"config_yaml"` // the effective config
	Init       initSource `json:"init"`
	Tasks      []string   `json:"tasks,omitempty"`
	Rollouts   string     `json:"rollouts,omitempty"`
	// Streams names how the built-in rollouts draw their randomness;
	// checkpoints of a tracegrpo from before keyed streams have none (their
	// sequential streams were saved in trainer_state.json's rng).
	Streams string `json:"random_streams"`
	// Rounding and Kernels are the backend's rounding path and kernel path
	// (kernels.Numerics) where it has them. They are not compared: a resume
	// on another kind of host keeps working, and says how its rounding
	// differs (noteNumerics).
	Rounding string `json:"rounding_path,omitempty"`
	Kernels  string `json:"kernel_path,omitempty"`
}

// streamsScheme is Streams of this version: rollout.Streams, keyed by (seed,
// step, task group, rollout, call).
const streamsScheme = "keyed-v1 (seed, step, task group, rollout, call)"

func (t *Trainer) identity() (runIdentity, error) {
	y, err := config.Marshal(&t.cfg)
	if err != nil {
		return runIdentity{}, err
	}
	id := runIdentity{ConfigYAML: string(y), Init: t.init, Rollouts: t.o.Rollouts, Streams: streamsScheme}
	if t.o.Rollouts == "" {
		id.Tasks = t.o.Tasks
	}
	if n, ok := t.be.(kernels.Numerics); ok {
		id.Rounding, id.Kernels = n.RoundingPath(), n.KernelPath()
	}
	return id, nil
}

func (t *Trainer) checkpointDir() string { return filepath.Join(t.out, "checkpoints") }

// savesAt says whether step is checkpointed: every
// checkpointing.save_period steps and at the end.
func (t *Trainer) savesAt(step int) bool {
	c := t.cfg.Checkpointing
	return c.Enabled && ((c.SavePeriod > 0 && step%c.SavePeriod == 0) || step == t.maxSteps)
}

// save writes and publishes step_<N>/ at once (a signal's stop).
func (t *Trainer) save() error {
	p, err := t.prepare()
	if err != nil {
		return err
	}
	_, err = p.Publish()
	return err
}

// prepare writes step_<N>/ (HF weights, Adam moments, trainer state) under a
// temporary name; Run publishes it after the step's metrics line is on
// disk, so that a checkpoint never exists without its line.
func (t *Trainer) prepare() (*checkpoint.Pending, error) {
	table := t.model.Table()
	mBuf, vBuf := t.opt.Moments()
	host, m, v := t.hostCopy(t.model.Params()), t.hostCopy(mBuf), t.hostCopy(vBuf)
	if err := t.be.Sync(); err != nil {
		return nil, err
	}
	if err := t.takeStageErr(); err != nil {
		return nil, err
	}
	if err := t.checkFinite(host, m, v, func(i int) string { return paramAt(table, i) }); err != nil {
		return nil, err
	}
	st := &checkpoint.State{}
	for _, p := range table.Params {
		spec := func(name string) safetensors.Spec {
			return safetensors.Spec{Name: name, DType: safetensors.F32, Shape: p.Shape}
		}
		r := host[p.Offset : p.Offset+p.N]
		st.Model = append(st.Model, checkpoint.Tensor{Spec: spec(p.Name), F32: r})
		if !t.cfg.SavesOptimizer() {
			continue // checkpointing.save_optimizer false: weights only
		}
		st.Optimizer = append(st.Optimizer,
			checkpoint.Tensor{Spec: spec(p.Name + ".exp_avg"), F32: m[p.Offset : p.Offset+p.N]},
			checkpoint.Tensor{Spec: spec(p.Name + ".exp_avg_sq"), F32: v[p.Offset : p.Offset+p.N]})
	}
	var err error
	if st.ModelConfig, err = t.modelCfg.JSON("float32"); err != nil {
		return nil, err
	}
	if st.Trainer, err = t.trainerState(); err != nil {
		return nil, err
	}
	keep := 0
	if k := t.cfg.Checkpointing.KeepTopK; k != nil {
		keep = *k
	}
	return checkpoint.Prepare(t.checkpointDir(), st, checkpoint.SaveOptions{KeepTopK: keep})
}

// checkFinite refuses to checkpoint weights or Adam moments that are not
// finite (whatever made them so): such a checkpoint would verify, and
// resume into NaN. name names the parameter of an arena element.
func (t *Trainer) checkFinite(w, m, v []float32, name func(int) string) error {
	for _, a := range []struct {
		what string
		x    []float32
	}{{"weights", w}, {"Adam moments", m}, {"Adam moments", v}} {
		if i := slices.IndexFunc(a.x, func(x float32) bool { return math.IsNaN(float64(x)) || math.IsInf(float64(x), 0) }); i >= 0 {
			return fmt.Errorf("step %d: the %s are not finite (%s element %d is %v): no checkpoint is written", t.step, a.what, name(i), i, a.x[i])
		}
	}
	return nil
}

// paramAt names the parameter holding element i of the arena.
func paramAt(table *model.ParamTable, i int) string {
	for _, p := range table.Params {
		if i >= p.Offset && i < p.Offset+p.N {
			return p.Name
		}
	}
	return "the arena"
}

// restore loads the newest complete checkpoint of the run directory and puts
// the run back exactly where it was after that step.
func (t *Trainer) restore() error {
	cfgJSON, err := t.modelCfg.JSON("float32")
	if err != nil {
		return err
	}
	if man, err := checkpoint.Structure(t.resumeFrom); err == nil && (man.Sharded() || t.sharded()) {
		return t.restoreSharded(cfgJSON)
	}
	res, err := checkpoint.LoadLatest(t.checkpointDir(), checkpoint.LoadOptions{Fallback: t.o.Fallback, ExpectConfig: cfgJSON})
	if err != nil {
		hint := ""
		if !t.o.Fallback && !errors.Is(err, checkpoint.ErrConfigMismatch) {
			hint = " (pass --fallback to use the newest older checkpoint that verifies, if any)"
		}
		return fmt.Errorf("resume: %w%s", err, hint)
	}
	for _, s := range res.Skipped {
		t.logf("resume: skipped %v", s)
	}
	st := res.State
	if err := t.checkIdentity(st.Trainer.Config); err != nil {
		return err
	}
	table := t.model.Table()
	mBuf, vBuf := t.opt.Moments()
	host, m, v := t.hostTarget(t.model.Params()), t.hostTarget(mBuf), t.hostTarget(vBuf)
	byName := func(ts []checkpoint.Tensor) map[string]checkpoint.Tensor {
		out := make(map[string]checkpoint.Tensor, len(ts))
		for _, x := range ts {
			out[x.Name] = x
		}
		return out
	}
	mt, ot := byName(st.Model), byName(st.Optimizer)
	for _, p := range table.Params {
		for _, want := range []struct {
			from map[string]checkpoint.Tensor
			name string
			dst  []float32
			file string
		}{
			{mt, p.Name, host, checkpoint.ModelFile},
			{ot, p.Name + ".exp_avg", m, "optimizer"},
			{ot, p.Name + ".exp_avg_sq", v, "optimizer"},
		} {
			if st.Trainer.NoOptimizer && want.file == "optimizer" {
				continue // the fresh optimizer's zero moments
			}
			x, ok := want.from[want.name]
			if !ok {
				return fmt.Errorf("resume: %s: %s has no tensor %s", res.Path, want.file, want.name)
			}
			if !slices.Equal(x.Shape, p.Shape) || len(x.F32) != p.N {
				return fmt.Errorf("resume: %s: tensor %s has shape %v (%d float32 values), the model wants %v",
					res.Path, want.name, x.Shape, len(x.F32), p.Shape)
			}
			copy(want.dst[p.Offset:p.Offset+p.N], x.F32)
		}
	}
	for _, x := range []struct {
		buf  kernels.Buf
		host []float32
	}{{t.model.Params(), host}, {mBuf, m}, {vBuf, v}} {
		if _, ok := t.hostView(x.buf); !ok {
			if err := uploadHost(t.be, x.buf, x.host, t.stage); err != nil {
				return fmt.Errorf("resume: %w", err)
			}
		}
	}
	t.model.ParamsChanged()
	if err := t.be.Sync(); err != nil {
		return err
	}
	return t.restoreState(res.Path, st)
}

// restoreSharded resumes from t.resumeFrom reading only the ranges of the
// tensors this rank holds: a sharded run, or a sharded checkpoint.
func (t *Trainer) restoreSharded(cfgJSON []byte) error {
	path := t.resumeFrom
	st, err := checkpoint.LoadMeta(path, checkpoint.LoadOptions{ExpectConfig: cfgJSON})
	if err != nil {
		return fmt.Errorf("resume: %w", err)
	}
	if err := t.checkIdentity(st.Trainer.Config); err != nil {
		return err
	}
	if err := t.restoreRanges(path, st); err != nil {
		return err
	}
	return t.restoreState(path, st)
}

// restoreState restores the optimizer, scheduler and rollout source state
// and the step counters from a checkpoint's trainer state.
func (t *Trainer) restoreState(path string, st *checkpoint.State) error {
	res := struct{ Path string }{path}
	var ostate optim.State
	if err := json.Unmarshal(st.Trainer.Optimizer, &ostate); err != nil {
		return fmt.Errorf("resume: %s: optimizer state: %w", res.Path, err)
	}
	if st.Trainer.NoOptimizer {
		// NeMo RL's resume without optimizer state: a fresh AdamW (zero
		// moments, bias correction from step 1), the schedule where it was.
		ostate = optim.State{}
		if t.rank == 0 {
			fmt.Fprintf(t.o.Log, "train: warning: resume: %s holds no optimizer state (checkpointing.save_optimizer was false): AdamW restarts from zero moments, so the run does not continue bit for bit as an uninterrupted one would\n", res.Path)
		}
	}
	if err := t.opt.SetState(ostate); err != nil {
		return err
	}
	var ss optim.ScheduleState
	if err := json.Unmarshal(st.Trainer.Scheduler, &ss); err != nil {
		return fmt.Errorf("resume: %s: scheduler state: %w", res.Path, err)
	}
	if err := t.sched.Restore(ss); err != nil {
		return err
	}
	if err := t.source.restore(st.Trainer.RolloutCursor); err != nil {
		return err
	}
	t.step, t.consumed = int(st.Trainer.Step), st.Trainer.ConsumedRollouts
	if st.Trainer.RunID != "" { // else a checkpoint of an older tracegrpo: the run takes a new id
		t.runID = st.Trainer.RunID
	}
	t.logf("resumed from %s (step %d, %d logical rollouts consumed)", res.Path, t.step, t.consumed)
	return nil
}

// checkIdentity refuses to resume a run under a different configuration,
// init or data: every differing key is named. grpo.max_num_steps may change
// (to extend a run).
func (t *Trainer) checkIdentity(raw json.RawMessage) error {
	var saved runIdentity
	if err := json.Unmarshal(raw, &saved); err != nil {
		return fmt.Errorf("resume: trainer_state.json config: %w", err)
	}
	cur, err := t.identity()
	if err != nil {
		return err
	}
	var diffs []string
	if saved.Init != cur.Init {
		diffs = append(diffs, fmt.Sprintf("initial weights: checkpoint %+v, now %+v", saved.Init, cur.Init))
	}
	if !slices.Equal(saved.Tasks, cur.Tasks) {
		diffs = append(diffs, fmt.Sprintf("--tasks: checkpoint %v, now %v", saved.Tasks, cur.Tasks))
	}
	if saved.Streams != cur.Streams {
		diffs = append(diffs, fmt.Sprintf("random streams of the built-in rollouts: checkpoint %s, now %s (the checkpoint was written by another tracegrpo version; resume it with that version)",
			orNone(saved.Streams), cur.Streams))
	}
	if saved.Rollouts != cur.Rollouts {
		diffs = append(diffs, fmt.Sprintf("--rollouts: checkpoint %q, now %q", saved.Rollouts, cur.Rollouts))
	}
	a, err := flattenYAML(saved.ConfigYAML)
	if err != nil {
		return fmt.Errorf("resume: saved config: %w", err)
	}
	b, err := flattenYAML(cur.ConfigYAML)
	if err != nil {
		return err
	}
	keys := map[string]bool{}
	for k := range a {
		keys[k] = true
	}
	for k := range b {
		keys[k] = true
	}
	var sorted []string
	for k := range keys {
		sorted = append(sorted, k)
	}
	sort.Strings(sorted)
	for _, k := range sorted {
		if a[k] != b[k] && k != "grpo.max_num_steps" {
			diffs = append(diffs, fmt.Sprintf("%s: checkpoint %s, now %s", k, orNone(a[k]), orNone(b[k])))
		}
	}
	if len(diffs) > 0 {
		var buf bytes.Buffer
		for _, d := range diffs {
			buf.WriteString("\n  " + d)
		}
		return fmt.Errorf("resume: this run differs from the checkpoint's (resume it with the same recipe, --set values and flags):%s", buf.String())
	}
	t.noteNumerics(saved, cur)
	return nil
}

// noteNumerics says how this run's rounding compares with the checkpoint's:
// a changed rounding path (another kind of host, or TRACEGRPO_CPU_SIMD)
// keeps training, but no longer bit for bit as the uninterrupted run would.
func (t *Trainer) noteNumerics(saved, cur runIdentity) {
	switch {
	case cur.Rounding == "" || saved.Rounding == cur.Rounding && saved.Kernels == cur.Kernels:
	case saved.Rounding == "":
		t.logf("resume: the checkpoint records no rounding path (another backend, or an older tracegrpo, wrote it); this run's is %s (%s)", cur.Rounding, cur.Kernels)
	case saved.Rounding != cur.Rounding:
		t.logf("resume: the rounding path changed: the checkpoint was written on %s (%s), this run computes on %s (%s); training continues, but not bit-identical to an uninterrupted run",
			saved.Rounding, saved.Kernels, cur.Rounding, cur.Kernels)
	default:
		t.logf("resume: the kernels changed (checkpoint: %s; now: %s) but the rounding path is the same (%s): results stay bit-identical", saved.Kernels, cur.Kernels, cur.Rounding)
	}
}

func orNone(s string) string {
	if s == "" {
		return "(absent)"
	}
	return s
}

// flattenYAML maps every leaf's dotted path to its YAML text.
func flattenYAML(doc string) (map[string]string, error) {
	var root any
	if err := yaml.Unmarshal([]byte(doc), &root); err != nil {
		return nil, err
	}
	out := map[string]string{}
	var walk func(prefix string, v any)
	walk = func(prefix string, v any) {
		switch x := v.(type) {
		case map[string]any:
			for k, c := range x {
				p := k
				if prefix != "" {
					p = prefix + "." + k
				}
				walk(p, c)
			}
		default:
			b, _ := json.Marshal(x)
			out[prefix] = string(b)
		}
	}
	walk("", root)
	return out, nil
}

// metricsFile is what the trainer does with metrics.jsonl: append lines,
// sync them (before a checkpoint of their step is published) and close it.
// An *os.File; tests wrap it to see the order of its writes and syncs.
type metricsFile interface {
	Write(b []byte) (int, error)
	Sync() error
	Close() error
}

// openMetrics opens metrics.jsonl for appending. On resume it first drops
// the lines of steps after the checkpoint (a crashed attempt logged them;
// they are about to be re-run), and warns, even under --quiet, when the
// steps up to the checkpoint lack lines (the file was truncated, edited or
// replaced): their metrics are lost, and the log would have a gap.
func (t *Trainer) openMetrics() error {
	path := filepath.Join(t.out, metricsFileName)
	if t.o.Resume {
		missing, err := truncateMetrics(path, t.step)
		if err != nil {
			return err
		}
		if len(missing) > 0 {
			fmt.Fprintf(t.o.Log, "train: warning: resume: %s has no line for %s of the %d steps before the checkpoint: their metrics are lost, and the log continues from step %d without them\n",
				path, stepRanges(missing), t.step, t.step+1)
		}
	}
	f, err := os.OpenFile(path, os.O_CREATE|os.O_WRONLY|os.O_APPEND, 0o644)
	if err != nil {
		return err
	}
	t.metricsFile = f
	return nil
}

// truncateMetrics keeps the lines of steps 1..keep of the metrics log at
// path and returns
// the steps in 1..keep it has no line for.
func truncateMetrics(path string, keep int) ([]int, error) {
	data, err := inputfile.ReadFile(path, inputfile.Metrics)
	if errors.Is(err, os.ErrNotExist) {
		data, err = nil, nil
	}
	if err != nil {
		return nil, err
	}
	var out bytes.Buffer
	seen := make(map[int]bool)
	sc := bufio.NewScanner(bytes.NewReader(data))
	sc.Buffer(make([]byte, 0, 64*1024), 16<<20)
	for line := 1; sc.Scan(); line++ {
		var m struct {
			Step int `json:"step"`
		}
		if err := json.Unmarshal(sc.Bytes(), &m); err != nil {
			// A torn last line from a crash is dropped; anything else is an error.
			if !bytes.HasSuffix(data, sc.Bytes()) {
				return nil, fmt.Errorf("resume: %s:%d: %w", path, line, err)
			}
			continue
		}
		if m.Step <= keep {
			out.Write(sc.Bytes())
			out.WriteByte('\n')
			seen[m.Step] = true
		}
	}
	var missing []int
	for s := 1; s <= keep; s++ {
		if !seen[s] {
			missing = append(missing, s)
		}
	}
	if data == nil {
		return missing, nil
	}
	return missing, atomicfile.WriteFile(path, out.Bytes())
}

// stepRanges writes sorted steps as "steps 2-4, 7" (the first 20 ranges,
// then how many more steps).
func stepRanges(steps []int) string {
	var parts []string
	more := 0
	for i := 0; i < len(steps); {
		j := i
		for j+1 < len(steps) && steps[j+1] == steps[j]+1 {
			j++
		}
		switch {
		case len(parts) == 20:
			more += j - i + 1
		case j > i:
			parts = append(parts, fmt.Sprintf("%d-%d", steps[i], steps[j]))
		default:
			parts = append(parts, fmt.Sprint(steps[i]))
		}
		i = j + 1
	}
	what := "step "
	if len(steps) > 1 {
		what = "steps "
	}
	s := what + strings.Join(parts, ", ")
	if more > 0 {
		s += fmt.Sprintf(" and %d more", more)
	}
	return fmt.Sprintf("%s (%d)", s, len(steps))
}

// log appends the step's metrics line, synced to disk when sync is set (a
// checkpoint of the step is about to be published), and shows the progress
// line.
func (t *Trainer) log(m Metrics, sync bool) error {
	b, err := json.Marshal(m)
	if err != nil {
		return err
	}
	if _, err := t.metricsFile.Write(append(b, '\n')); err != nil {
		return fmt.Errorf("metrics: %w", err)
	}
	if sync {
		if err := t.metricsFile.Sync(); err != nil {
			return fmt.Errorf("metrics: %w", err)
		}
	}
	if err := t.tbLog(m, sync); err != nil {
		return err
	}
	t.progress.step(m)
	return nil
}

// stopAfterStep, when positive, ends the run right after that step (its
// metrics line written, its checkpoint, if any, published) as a crash would
// (tests of exact resume use it).
var stopAfterStep = 0

var errSimulatedCrash = errors.New("simulated crash")

// hostView returns buf's elements in place when the backend keeps them in
// host memory (the CPU backend) as float32: a checkpoint is written from,
// and read into, the arenas themselves, with no second copy of the
// weights and moments. A BF16 buffer (FusedAdam's bf16 moments) has none.
func (t *Trainer) hostView(buf kernels.Buf) ([]float32, bool) {
	if v, ok := t.be.(interface{ F32(kernels.Buf) []float32 }); ok && buf.DType == kernels.F32 {
		return v.F32(buf), true
	}
	return nil, false
}

// hostCopy returns buf's elements for reading on the host: in place on the
// CPU, else a download (complete after the next Sync). A BF16 buffer is
// widened (exactly) as float32, a stage at a time: a checkpoint keeps
// bf16 moments as float32, as FusedAdam's state_dict casts them (resume
// rounds them back, exactly).
func (t *Trainer) hostCopy(buf kernels.Buf) []float32 {
	if v, ok := t.hostView(buf); ok {
		return v
	}
	h := make([]float32, buf.N)
	if buf.DType == kernels.BF16 {
		if err := downloadWide(t.be, h, buf, t.stage); err != nil {
			t.stageErr = err
		}
		return h
	}
	t.be.DownloadF32(h, buf)
	return h
}

// downloadWide copies the BF16 buffer src into host widened to float32,
// through the float32 staging buffer stage (the trainer's, allocated with
// the bf16 moments; when empty, one of at most stageChunk elements for
// the call).
func downloadWide(be kernels.Backend, host []float32, src, stage kernels.Buf) error {
	tmp, done, err := stagingBuf(be, stage, src.N)
	if err != nil {
		return err
	}
	defer done()
	for off := 0; off < src.N; off += tmp.N {
		n := min(tmp.N, src.N-off)
		be.Convert(tmp.Slice(0, n), src.Slice(off, n))
		be.DownloadF32(host[off:off+n], tmp.Slice(0, n))
		if err := be.Sync(); err != nil {
			return err
		}
	}
	return nil
}

// stagingBuf is stage, or (stage empty) a float32 buffer of at most
// stageChunk elements for n values, freed by done.
func stagingBuf(be kernels.Backend, stage kernels.Buf, n int) (tmp kernels.Buf, done func(), err error) {
	if stage.N > 0 {
		return stage, func() {}, nil
	}
	if tmp, err = be.Alloc(kernels.F32, min(stageChunk, max(n, 1))); err != nil {
		return tmp, nil, fmt.Errorf("staging bf16 values: %w", err)
	}
	return tmp, func() { be.Free(tmp) }, nil
}

// takeStageErr returns (and clears) the error of hostCopy's staging.
func (t *Trainer) takeStageErr() error {
	err := t.stageErr
	t.stageErr = nil
	return err
}

// uploadHost copies host into dst: an upload of an F32 buffer (complete
// after the next Sync), or for a BF16 one a stage at a time through a
// float32 buffer, rounded as Convert rounds (exact for values a bf16
// buffer held).
func uploadHost(be kernels.Backend, dst kernels.Buf, host []float32, stage kernels.Buf) error {
	if dst.DType != kernels.BF16 {
		be.UploadF32(dst, host)
		return nil
	}
	tmp, done, err := stagingBuf(be, stage, dst.N)
	if err != nil {
		return err
	}
	defer done()
	for off := 0; off < dst.N; off += tmp.N {
		n := min(tmp.N, dst.N-off)
		be.UploadF32(tmp.Slice(0, n), host[off:off+n])
		be.Convert(dst.Slice(off, n), tmp.Slice(0, n))
		if err := be.Sync(); err != nil {
			return err
		}
	}
	return nil
}

// hostTarget returns where buf's new elements are written on the host: in
// place on the CPU, else a staging slice the caller uploads.
func (t *Trainer) hostTarget(buf kernels.Buf) []float32 {
	if v, ok := t.hostView(buf); ok {
		return v
	}
	return make([]float32, buf.N)
}
