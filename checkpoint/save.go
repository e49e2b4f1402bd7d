package checkpoint

import (
	"bufio"
	"bytes"
	"crypto/rand"
	"crypto/sha256"
	"encoding/hex"
	"encoding/json"
	"errors"
	"fmt"
	"hash"
	"io"
	"os"
	"path/filepath"
	"sort"
	"strconv"
	"strings"
	"sync"

	"github.com/klauspost/compress/zstd"
	"github.com/tracegrpo/tracegrpo/internal/safetensors"
)

// FormatVersion is the version of the checkpoint layout and of
// trainer_state.json written by this package.
const FormatVersion = 1

// File names inside a step directory.
const (
	ModelFile         = "model.safetensors"
	ConfigFile        = "config.json"
	OptimizerFile     = "optimizer.safetensors"
	OptimizerZstdFile = "optimizer.safetensors.zst"
	TrainerStateFile  = "trainer_state.json"
	ManifestFile      = "manifest.json"
	DoneFile          = "DONE"
)

const (
	stepPrefix  = "step_"
	tmpPrefix   = ".tmp-"
	trashPrefix = ".trash-"
	formatName  = "tracegrpo-checkpoint"
)

// Tensor is one named tensor: a safetensors declaration with its values,
// either F32 (converted to DType on write) or Raw little-endian bytes
// already in DType. Load returns F32 for F32 tensors and Raw otherwise, so a
// tensor given as F32 with DType F32, or as Raw, round-trips bit for bit.
type Tensor = safetensors.Tensor

// TrainerState is trainer_state.json: the trainer's own progress. The fields
// that belong to other packages are opaque here (JSON or bytes) and are
// returned exactly as given, except that JSON values are stored compacted.
type TrainerState struct {
	FormatVersion    int   `json:"format_version"` // set by Save
	Step             int64 `json:"step"`           // GRPO steps completed; names the directory
	ConsumedRollouts int64 `json:"consumed_logical_rollouts"`
	// RunID names the run that saved the checkpoint: set when it starts at
	// step 0 and kept across resumes (a sharded checkpoint's shards carry
	// it; absent in checkpoints of an older tracegrpo).
	RunID string `json:"run_id,omitempty"`
	// Optimizer and Scheduler are optim.State and optim.ScheduleState.
	Optimizer json.RawMessage `json:"optimizer"`
	Scheduler json.RawMessage `json:"scheduler"`
	// RNG maps a stream name to its state (math/rand/v2 PCG MarshalBinary).
	RNG map[string][]byte `json:"rng"`
	// RolloutCursor is the rollout source's position (file, offset, id...).
	RolloutCursor json.RawMessage `json:"rollout_cursor"`
	// Config is the effective run configuration.
	Config json.RawMessage `json:"config"`
	// NoOptimizer says the checkpoint holds no Adam moments
	// (checkpointing.save_optimizer false): its manifest lists no optimizer
	// file and a sharded one's shard files hold weights only. A resume
	// restarts the optimizer from zero moments.
	NoOptimizer bool `json:"no_optimizer,omitempty"`
}

// State is everything one checkpoint holds.
type State struct {
	Model       []Tensor // HF-named weights
	ModelConfig []byte   // HF config.json, bytes as given
	Optimizer   []Tensor // Adam moments (fp32); none when Trainer.NoOptimizer
	Trainer     TrainerState
}

// SaveOptions controls Save.
type SaveOptions struct {
	// KeepTopK keeps the newest K complete checkpoints after a save and
	// deletes older ones; 0 keeps all.
	KeepTopK int
	// CompressOptimizer writes optimizer.safetensors.zst (zstd) instead of
	// optimizer.safetensors.
	CompressOptimizer bool
}

// Manifest is manifest.json.
type Manifest struct {
	Format  string      `json:"format"`
	Version int         `json:"version"`
	Step    int64       `json:"step"`
	Files   []FileEntry `json:"files"`
}

// FileEntry is one file of a checkpoint.
type FileEntry struct {
	Name   string `json:"name"`
	Size   int64  `json:"size"`
	SHA256 string `json:"sha256"`
	// UncompressedSize is the decompressed size of a .zst file; the loader
	// decompresses no more than this.
	UncompressedSize int64 `json:"uncompressed_size,omitempty"`
}

// StepDir returns the directory name of step n.
func StepDir(n int64) string { return stepPrefix + strconv.FormatInt(n, 10) }

// Save writes st as <dir>/step_<st.Trainer.Step> atomically (see the package
// doc), applies retention and returns the checkpoint's path: Prepare, then
// Publish.
func Save(dir string, st *State, opt SaveOptions) (string, error) {
	p, err := Prepare(dir, st, opt)
	if err != nil {
		return "", err
	}
	return p.Publish()
}

// Pending is a checkpoint written in full (every file, the manifest and
// DONE, synced) under a temporary name: not yet visible to Latest, Load or a
// resume. Publish makes it the step's checkpoint with one rename; Discard
// removes it. A process killed in between leaves a temporary directory that
// the next Save removes.
//
// Prepare writes one process's checkpoint at once. A sharded run builds one
// in steps: Begin, then every rank's files in Dir (WriteShard, and the HF
// export), recorded with Add or WriteFile, then Seal and Publish.
type Pending struct {
	dir, tmp, name string
	step           int64
	opt            SaveOptions
	files          []FileEntry
	sealed, done   bool
}

// Prepare writes st into a temporary directory of dir (see Pending).
func Prepare(dir string, st *State, opt SaveOptions) (*Pending, error) {
	p, err := Begin(dir, st.Trainer.Step, opt)
	if err != nil {
		return nil, err
	}
	entries, err := writeFiles(p.tmp, st, p.opt)
	if err == nil {
		p.Add(entries...)
		err = p.Seal()
	}
	if err != nil {
		p.Discard()
		return nil, err
	}
	return p, nil
}

// Begin creates the temporary directory of step's checkpoint in dir,
// removing what earlier saves left behind; the checkpoint's files are
// written into Dir.
func Begin(dir string, step int64, opt SaveOptions) (*Pending, error) {
	if step < 0 {
		return nil, fmt.Errorf("checkpoint: save: negative step %d", step)
	}
	if opt.KeepTopK < 0 {
		return nil, fmt.Errorf("checkpoint: save: keep_top_k: want >= 0, got %d", opt.KeepTopK)
	}
	if err := os.MkdirAll(dir, 0o755); err != nil {
		return nil, fmt.Errorf("checkpoint: save: %w", err)
	}
	if err := removeLeftovers(dir); err != nil {
		return nil, err
	}
	name := StepDir(step)
	tmp := filepath.Join(dir, tmpPrefix+name+"-"+randSuffix())
	if err := os.Mkdir(tmp, 0o755); err != nil {
		return nil, fmt.Errorf("checkpoint: save: %w", err)
	}
	return &Pending{dir: dir, tmp: tmp, name: name, step: step, opt: opt}, nil
}

// Dir is the temporary directory the checkpoint's files are written into.
func (p *Pending) Dir() string { return p.tmp }

// Add records files written into Dir (their manifest entries).
func (p *Pending) Add(entries ...FileEntry) { p.files = append(p.files, entries...) }

// WriteFile writes a file of the checkpoint into Dir and records it.
func (p *Pending) WriteFile(name string, data []byte) error {
	e, err := writeBytes(filepath.Join(p.tmp, name), data)
	if err == nil {
		p.Add(e)
	}
	return err
}

// AddWritten records a file that other code wrote (and synced) into Dir,
// hashing it.
func (p *Pending) AddWritten(name string) error {
	e, err := HashFile(filepath.Join(p.tmp, name))
	if err == nil {
		p.Add(e)
	}
	return err
}

// HashFile returns the manifest entry of the file at path.
func HashFile(path string) (FileEntry, error) {
	f, err := os.Open(path)
	if err != nil {
		return FileEntry{}, fmt.Errorf("checkpoint: %w", err)
	}
	defer f.Close()
	h := sha256.New()
	n, err := io.Copy(h, f)
	if err != nil {
		return FileEntry{}, fmt.Errorf("checkpoint: read %s: %w", path, err)
	}
	return FileEntry{Name: filepath.Base(path), Size: n, SHA256: hex.EncodeToString(h.Sum(nil))}, nil
}

// Seal writes manifest.json, listing every recorded file, and DONE, and
// syncs the directory.
func (p *Pending) Seal() error {
	man := Manifest{Format: formatName, Version: FormatVersion, Step: p.step, Files: p.files}
	mb, err := json.MarshalIndent(man, "", "  ")
	if err != nil {
		return fmt.Errorf("checkpoint: save: %w", err)
	}
	mb = append(mb, '\n')
	if _, err := ParseManifest(mb); err != nil {
		return fmt.Errorf("checkpoint: save %s: %s: %w", p.name, ManifestFile, err)
	}
	if _, err := writeBytes(filepath.Join(p.tmp, ManifestFile), mb); err != nil {
		return err
	}
	if _, err := writeBytes(filepath.Join(p.tmp, DoneFile), doneContent(mb)); err != nil {
		return err
	}
	if err := syncDir(p.tmp); err != nil {
		return err
	}
	p.sealed = true
	return nil
}

// Discard removes a prepared checkpoint that will not be published.
func (p *Pending) Discard() {
	if !p.done {
		p.done = true
		os.RemoveAll(p.tmp)
	}
}

// Publish renames the prepared checkpoint to <dir>/step_<N> (replacing an
// existing one of that step), syncs dir and applies retention; it returns
// the checkpoint's path.
func (p *Pending) Publish() (string, error) {
	if p.done {
		return "", fmt.Errorf("checkpoint: %s: published or discarded already", p.name)
	}
	if !p.sealed {
		return "", fmt.Errorf("checkpoint: %s: published before it was sealed", p.name)
	}
	p.done = true
	final := filepath.Join(p.dir, p.name)
	trash := ""
	if _, err := os.Lstat(final); err == nil {
		trash = filepath.Join(p.dir, trashPrefix+p.name+"-"+randSuffix())
		if err := os.Rename(final, trash); err != nil {
			os.RemoveAll(p.tmp)
			return "", fmt.Errorf("checkpoint: save: move the existing %s aside: %w", final, err)
		}
	}
	if err := os.Rename(p.tmp, final); err != nil {
		os.RemoveAll(p.tmp)
		if trash != "" {
			os.Rename(trash, final) // put the old checkpoint back
		}
		return "", fmt.Errorf("checkpoint: save: %w", err)
	}
	if err := syncDir(p.dir); err != nil {
		return "", err
	}
	if trash != "" {
		if err := os.RemoveAll(trash); err != nil {
			return final, fmt.Errorf("checkpoint: save: remove the replaced %s: %w", trash, err)
		}
	}
	if p.opt.KeepTopK > 0 {
		if err := retain(p.dir, p.opt.KeepTopK); err != nil {
			return final, err
		}
	}
	return final, nil
}

func fileMeta(kind string, step int64) map[string]string {
	return map[string]string{
		"tracegrpo_format":  kind,
		"tracegrpo_version": strconv.Itoa(FormatVersion),
		"step":              strconv.FormatInt(step, 10),
	}
}

// ModelMetadata is the __metadata__ of a checkpoint's model.safetensors of
// step (safetensors adds "format": "pt"), for a writer other than Save's
// (a sharded run's export).
func ModelMetadata(step int64) map[string]string { return fileMeta("checkpoint-model", step) }

func doneContent(manifest []byte) []byte {
	sum := sha256.Sum256(manifest)
	return []byte("sha256:" + hex.EncodeToString(sum[:]) + "\n")
}

func randSuffix() string {
	var b [6]byte
	if _, err := rand.Read(b[:]); err != nil {
		panic(err) // crypto/rand never fails on supported platforms
	}
	return hex.EncodeToString(b[:])
}

// writeFiles writes the four payload files into tmp (the two tensor files
// concurrently) and returns their manifest entries in a fixed order.
func writeFiles(tmp string, st *State, opt SaveOptions) ([]FileEntry, error) {
	ts := st.Trainer
	ts.FormatVersion = FormatVersion
	tb, err := encodeTrainerState(&ts)
	if err != nil {
		return nil, err
	}
	meta := func(kind string) map[string]string { return fileMeta(kind, ts.Step) }
	optName := OptimizerFile
	if opt.CompressOptimizer {
		optName = OptimizerZstdFile
	}
	if ts.NoOptimizer != (len(st.Optimizer) == 0) {
		return nil, fmt.Errorf("checkpoint: save: %d optimizer tensors, but trainer state no_optimizer=%v", len(st.Optimizer), ts.NoOptimizer)
	}
	var wg sync.WaitGroup
	var modelE, optE FileEntry
	var modelErr, optErr error
	wg.Add(1)
	go func() {
		defer wg.Done()
		modelE, modelErr = writeTensors(filepath.Join(tmp, ModelFile), st.Model, meta("checkpoint-model"), false)
	}()
	if !ts.NoOptimizer {
		optE, optErr = writeTensors(filepath.Join(tmp, optName), st.Optimizer, meta("checkpoint-optimizer"), opt.CompressOptimizer)
	}
	wg.Wait()
	if err := errors.Join(modelErr, optErr); err != nil {
		return nil, err
	}
	cfgE, err := writeBytes(filepath.Join(tmp, ConfigFile), st.ModelConfig)
	if err != nil {
		return nil, err
	}
	tsE, err := writeBytes(filepath.Join(tmp, TrainerStateFile), tb)
	if err != nil {
		return nil, err
	}
	if ts.NoOptimizer {
		return []FileEntry{modelE, cfgE, tsE}, nil
	}
	return []FileEntry{modelE, cfgE, optE, tsE}, nil
}

// hashingFile counts and hashes everything written to a file.
type hashingFile struct {
	f *os.File
	h hash.Hash
	n int64
}

// Write hashes p on a second goroutine while the file write copies it to
// the kernel; writes come from a 1 MiB bufio.Writer, so the hand-off is
// cheap next to the work it overlaps.
func (w *hashingFile) Write(p []byte) (int, error) {
	if len(p) < 64<<10 {
		n, err := w.f.Write(p)
		w.h.Write(p[:n])
		w.n += int64(n)
		return n, err
	}
	done := make(chan struct{})
	go func() {
		w.h.Write(p)
		close(done)
	}()
	n, err := w.f.Write(p)
	<-done
	w.n += int64(n)
	if err == nil && n < len(p) {
		err = io.ErrShortWrite
	}
	return n, err
}

func createHashing(path string) (*hashingFile, error) {
	f, err := os.OpenFile(path, os.O_WRONLY|os.O_CREATE|os.O_EXCL, 0o644)
	if err != nil {
		return nil, fmt.Errorf("checkpoint: save: %w", err)
	}
	return &hashingFile{f: f, h: sha256.New()}, nil
}

// finish syncs and closes the file and returns its manifest entry.
func (w *hashingFile) finish() (FileEntry, error) {
	path := w.f.Name()
	if err := w.f.Sync(); err != nil {
		w.f.Close()
		return FileEntry{}, fmt.Errorf("checkpoint: save: fsync %s: %w", path, err)
	}
	if err := w.f.Close(); err != nil {
		return FileEntry{}, fmt.Errorf("checkpoint: save: close %s: %w", path, err)
	}
	return FileEntry{Name: filepath.Base(path), Size: w.n, SHA256: hex.EncodeToString(w.h.Sum(nil))}, nil
}

func writeBytes(path string, b []byte) (FileEntry, error) {
	w, err := createHashing(path)
	if err != nil {
		return FileEntry{}, err
	}
	if _, err := w.Write(b); err != nil {
		w.f.Close()
		return FileEntry{}, fmt.Errorf("checkpoint: save: write %s: %w", path, err)
	}
	return w.finish()
}

func writeTensors(path string, tensors []Tensor, meta map[string]string, compress bool) (FileEntry, error) {
	hf, err := createHashing(path)
	if err != nil {
		return FileEntry{}, err
	}
	fail := func(err error) (FileEntry, error) {
		hf.f.Close()
		return FileEntry{}, fmt.Errorf("checkpoint: save: write %s: %w", path, err)
	}
	bw := bufio.NewWriterSize(hf, 1<<20)
	var out io.Writer = bw
	var enc *zstd.Encoder
	if compress {
		if enc, err = zstd.NewWriter(bw, zstd.WithEncoderLevel(zstd.SpeedFastest)); err != nil {
			return fail(err)
		}
		out = enc
	}
	counted := &countingWriter{w: out}
	out = counted
	specs := make([]safetensors.Spec, len(tensors))
	byName := make(map[string]*Tensor, len(tensors))
	for i := range tensors {
		specs[i] = tensors[i].Spec
		byName[tensors[i].Name] = &tensors[i]
	}
	w, err := safetensors.NewWriter(out, specs, meta)
	if err != nil {
		return fail(err)
	}
	for _, t := range w.Tensors() {
		src := byName[t.Name]
		switch {
		case src.F32 != nil:
			if len(src.F32) != t.NumElements() {
				return fail(fmt.Errorf("tensor %q: %d values for shape %v", t.Name, len(src.F32), t.Shape))
			}
			err = w.WriteF32(t.Name, src.F32)
		default:
			err = w.WriteRaw(t.Name, src.Raw)
		}
		if err != nil {
			return fail(err)
		}
	}
	if err := w.Close(); err != nil {
		return fail(err)
	}
	if enc != nil {
		if err := enc.Close(); err != nil {
			return fail(err)
		}
	}
	if err := bw.Flush(); err != nil {
		return fail(err)
	}
	e, err := hf.finish()
	if compress {
		e.UncompressedSize = counted.n
	}
	return e, err
}

// countingWriter counts the bytes written through it.
type countingWriter struct {
	w io.Writer
	n int64
}

func (c *countingWriter) Write(p []byte) (int, error) {
	n, err := c.w.Write(p)
	c.n += int64(n)
	return n, err
}

// encodeTrainerState writes indented JSON with the opaque JSON fields
// compacted first (so that load returns them byte for byte).
func encodeTrainerState(ts *TrainerState) ([]byte, error) {
	c := *ts
	for _, f := range []*json.RawMessage{&c.Optimizer, &c.Scheduler, &c.RolloutCursor, &c.Config} {
		if len(*f) == 0 {
			continue
		}
		var b bytes.Buffer
		if err := json.Compact(&b, *f); err != nil {
			return nil, fmt.Errorf("checkpoint: save: trainer state: %w", err)
		}
		*f = b.Bytes()
	}
	b, err := json.MarshalIndent(&c, "", "  ")
	if err != nil {
		return nil, fmt.Errorf("checkpoint: save: trainer state: %w", err)
	}
	return append(b, '\n'), nil
}

func syncDir(dir string) error {
	d, err := os.Open(dir)
	if err != nil {
		return fmt.Errorf("checkpoint: fsync %s: %w", dir, err)
	}
	defer d.Close()
	if err := d.Sync(); err != nil {
		return fmt.Errorf("checkpoint: fsync %s: %w", dir, err)
	}
	return nil
}

// removeLeftovers deletes .tmp- and .trash- directories of earlier saves.
func removeLeftovers(dir string) error {
	ents, err := os.ReadDir(dir)
	if err != nil {
		return fmt.Errorf("checkpoint: %w", err)
	}
	for _, e := range ents {
		n := e.Name()
		if e.IsDir() && (strings.HasPrefix(n, tmpPrefix+stepPrefix) || strings.HasPrefix(n, trashPrefix+stepPrefix)) {
			if err := os.RemoveAll(filepath.Join(dir, n)); err != nil {
				return fmt.Errorf("checkpoint: remove leftover %s: %w", n, err)
			}
		}
	}
	return nil
}

// removeAll deletes a checkpoint directory that retention or a replacing
// save has moved aside; a variable so that a test can stop a deletion
// midway, as a crash would.
var removeAll = os.RemoveAll

// retain keeps the newest keep complete checkpoints. Each old one is renamed
// aside before it is deleted, so a crash mid-delete never leaves a step_N
// that is half gone.
func retain(dir string, keep int) error {
	steps, err := List(dir)
	if err != nil {
		return err
	}
	var complete []Entry
	for _, e := range steps {
		if e.Done {
			complete = append(complete, e)
		}
	}
	sort.Slice(complete, func(i, j int) bool { return complete[i].Step > complete[j].Step })
	if len(complete) <= keep {
		return nil
	}
	for _, e := range complete[keep:] {
		trash := filepath.Join(dir, trashPrefix+filepath.Base(e.Path)+"-"+randSuffix())
		if err := os.Rename(e.Path, trash); err != nil {
			return fmt.Errorf("checkpoint: retention: %w", err)
		}
		if err := removeAll(trash); err != nil {
			return fmt.Errorf("checkpoint: retention: %w", err)
		}
	}
	return syncDir(dir)
}

// Entry is one step directory found by List.
type Entry struct {
	Step int64
	Path string
	Done bool // the DONE marker exists (not yet verified)
}

// List returns the step_<N> directories of dir, newest first.
func List(dir string) ([]Entry, error) {
	ents, err := os.ReadDir(dir)
	if err != nil {
		return nil, fmt.Errorf("checkpoint: %w", err)
	}
	var out []Entry
	for _, e := range ents {
		n, ok := parseStepDir(e.Name())
		if !ok || !e.IsDir() {
			continue
		}
		p := filepath.Join(dir, e.Name())
		_, err := os.Lstat(filepath.Join(p, DoneFile))
		out = append(out, Entry{Step: n, Path: p, Done: err == nil})
	}
	sort.Slice(out, func(i, j int) bool { return out[i].Step > out[j].Step })
	return out, nil
}

func parseStepDir(name string) (int64, bool) {
	s, ok := strings.CutPrefix(name, stepPrefix)
	if !ok || s == "" || (len(s) > 1 && s[0] == '0') {
		return 0, false
	}
	for _, c := range s {
		if c < '0' || c > '9' {
			return 0, false
		}
	}
	n, err := strconv.ParseInt(s, 10, 64)
	return n, err == nil
}

// Marks names what makes dir a checkpoint's own directory, complete or
// not ("" when nothing does): a step_<N> name or a save's temporary or
// trash name, or one of a checkpoint's marker files (manifest.json, DONE,
// shards.index.json) inside it. A checkpoint is verified against its
// manifest, so nothing but a save may write into such a directory.
func Marks(dir string) string {
	base := filepath.Base(dir)
	if _, ok := parseStepDir(base); ok {
		return "a checkpoint's name (" + base + ")"
	}
	for _, p := range []string{tmpPrefix + stepPrefix, trashPrefix + stepPrefix} {
		if strings.HasPrefix(base, p) {
			return "the name of a checkpoint being saved or deleted (" + base + ")"
		}
	}
	for _, f := range []string{ManifestFile, DoneFile, ShardIndexFile} {
		if _, err := os.Lstat(filepath.Join(dir, f)); err == nil {
			return "a checkpoint's " + f
		}
	}
	return ""
}
