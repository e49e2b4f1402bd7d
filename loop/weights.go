package loop

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
	"slices"
	"sort"
	"strconv"
	"strings"
	"time"

	"github.com/tracegrpo/tracegrpo/internal/inputfile"
)

// File names of a weights directory.
const (
	DoneFile   = "DONE"
	ModelFile  = "model.safetensors"
	ConfigFile = "config.json"
)

// Done format.
const (
	DoneFormat  = "tracegrpo-weights"
	DoneVersion = 1
)

const (
	stepPrefix  = "step_"
	tmpPrefix   = ".tmp-"
	trashPrefix = ".trash-"
	// FileMode is every published file's mode, whatever the umask: a
	// server running as another user reads them.
	FileMode os.FileMode = 0o644
	dirMode  os.FileMode = 0o755
)

// CopyFiles are the files of a Hugging Face model directory, beside its
// weights and config.json, that a server needs to serve it: the tokenizer's
// and the generation defaults. Publish copies those the initial weights'
// directory has.
var CopyFiles = []string{
	"generation_config.json",
	"tokenizer.json", "tokenizer_config.json", "special_tokens_map.json", "added_tokens.json",
	"vocab.json", "vocab.txt", "merges.txt", "tokenizer.model", "spiece.model",
	"chat_template.jinja", "chat_template.json",
}

// Done is a weights directory's DONE marker: the directory's step and
// dtype, and the size and sha256 of every other file in it.
type Done struct {
	Format  string      `json:"format"`
	Version int         `json:"version"`
	Step    int64       `json:"step"`
	DType   string      `json:"dtype"`
	Files   []FileEntry `json:"files"`
}

// FileEntry is one published file.
type FileEntry struct {
	Name   string `json:"name"`
	Size   int64  `json:"size"`
	SHA256 string `json:"sha256"`
}

// File returns the entry of the file named name.
func (d *Done) File(name string) (FileEntry, bool) {
	for _, f := range d.Files {
		if f.Name == name {
			return f, true
		}
	}
	return FileEntry{}, false
}

// Bytes is the size of the directory's files, DONE aside.
func (d *Done) Bytes() int64 {
	var n int64
	for _, f := range d.Files {
		n += f.Size
	}
	return n
}

// WeightsDir is the directory of step's weights under root.
func WeightsDir(root string, step int64) string {
	return filepath.Join(root, stepPrefix+strconv.FormatInt(step, 10))
}

// Publisher publishes step directories of weights under Root.
type Publisher struct {
	root string
	keep int
}

// OpenPublisher prepares root for publishing, keeping the keep (>= 1)
// newest directories: it is created if needed, and what an interrupted
// publication left (its temporary and trash directories) is removed. A
// step_<N> directory without DONE is no publication's: it is refused and
// left alone. It reports the complete step directories already there,
// newest first.
func OpenPublisher(root string, keep int) (*Publisher, []int64, error) {
	if keep < 1 {
		return nil, nil, fmt.Errorf("loop: keep %d weights directories: want at least 1 (the newest is the one a generator needs)", keep)
	}
	if err := os.MkdirAll(root, dirMode); err != nil {
		return nil, nil, fmt.Errorf("loop: weights directory: %w", err)
	}
	ents, err := os.ReadDir(root)
	if err != nil {
		return nil, nil, fmt.Errorf("loop: weights directory: %w", err)
	}
	// First the whole listing, then the removals: a directory this package
	// did not write stops the open before anything is removed.
	var have []int64
	var leftovers []string
	for _, e := range ents {
		n := e.Name()
		path := filepath.Join(root, n)
		switch {
		case e.IsDir() && (strings.HasPrefix(n, tmpPrefix+stepPrefix) || strings.HasPrefix(n, trashPrefix+stepPrefix)):
			leftovers = append(leftovers, path)
		case e.IsDir():
			step, ok := parseStepDir(n)
			if !ok {
				continue
			}
			if _, err := os.Lstat(filepath.Join(path, DoneFile)); err != nil {
				// Publish renames a directory into place with its DONE
				// written, so no publication, whole or interrupted, leaves
				// step_<N> without one: this is another program's (a NeMo RL
				// checkpoint is step_<N> too), and is never removed.
				return nil, nil, fmt.Errorf("loop: weights directory %s holds %s, which tracegrpo did not publish (it has no %s marker, "+
					"and a publication is renamed into place with its marker): it may be another program's data, such as a checkpoint; "+
					"choose a directory of its own for the weights", root, n, DoneFile)
			}
			have = append(have, step)
		}
	}
	for _, path := range leftovers {
		if err := os.RemoveAll(path); err != nil {
			return nil, nil, fmt.Errorf("loop: remove leftover %s: %w", path, err)
		}
	}
	slices.Sort(have)
	slices.Reverse(have)
	return &Publisher{root: root, keep: keep}, have, nil
}

// Root is the directory the publisher writes into.
func (p *Publisher) Root() string { return p.root }

// Pending is a step directory being written under a temporary name.
type Pending struct {
	p     *Publisher
	step  int64
	tmp   string
	files []FileEntry
	done  bool
}

// Begin starts step's directory.
func (p *Publisher) Begin(step int64) (*Pending, error) {
	if step < 0 {
		return nil, fmt.Errorf("loop: publish: negative step %d", step)
	}
	tmp := filepath.Join(p.root, tmpPrefix+stepPrefix+strconv.FormatInt(step, 10)+"-"+randSuffix())
	if err := os.Mkdir(tmp, dirMode); err != nil {
		return nil, fmt.Errorf("loop: publish: %w", err)
	}
	if err := os.Chmod(tmp, dirMode); err != nil { // the umask may have narrowed it
		os.RemoveAll(tmp)
		return nil, fmt.Errorf("loop: publish: %w", err)
	}
	return &Pending{p: p, step: step, tmp: tmp}, nil
}

// Dir is the temporary directory the files are written into.
func (pd *Pending) Dir() string { return pd.tmp }

// File is one file of a Pending directory: written through a buffer, hashed
// and counted as it goes; Close syncs it and records it.
type File struct {
	pd   *Pending
	f    *os.File
	bw   *bufio.Writer
	h    hash.Hash
	n    int64
	name string
	err  error
}

// Create starts the file name (a base name) of the directory.
func (pd *Pending) Create(name string) (*File, error) {
	if err := checkName(name); err != nil {
		return nil, err
	}
	path := filepath.Join(pd.tmp, name)
	f, err := os.OpenFile(path, os.O_WRONLY|os.O_CREATE|os.O_EXCL, FileMode)
	if err == nil {
		err = f.Chmod(FileMode) // whatever the umask
		if err != nil {
			f.Close()
		}
	}
	if err != nil {
		return nil, fmt.Errorf("loop: publish: %w", err)
	}
	out := &File{pd: pd, f: f, h: sha256.New(), name: name}
	out.bw = bufio.NewWriterSize(writerFunc(out.write), 1<<20)
	return out, nil
}

type writerFunc func([]byte) (int, error)

func (w writerFunc) Write(p []byte) (int, error) { return w(p) }

func (f *File) write(p []byte) (int, error) {
	n, err := f.f.Write(p)
	f.h.Write(p[:n])
	f.n += int64(n)
	if err == nil && n < len(p) {
		err = io.ErrShortWrite
	}
	return n, err
}

// Write implements io.Writer.
func (f *File) Write(p []byte) (int, error) {
	if f.err != nil {
		return 0, f.err
	}
	n, err := f.bw.Write(p)
	if err != nil {
		f.err = fmt.Errorf("loop: publish: write %s: %w", f.name, err)
	}
	return n, f.err
}

// Close flushes, syncs and closes the file, and records it for DONE.
func (f *File) Close() error {
	err := f.err
	if err == nil {
		if err = f.bw.Flush(); err == nil {
			err = f.f.Sync()
		}
	}
	if cerr := f.f.Close(); err == nil {
		err = cerr
	}
	if err != nil {
		return fmt.Errorf("loop: publish: %s: %w", f.name, err)
	}
	f.pd.files = append(f.pd.files, FileEntry{Name: f.name, Size: f.n, SHA256: hex.EncodeToString(f.h.Sum(nil))})
	return nil
}

// WriteFile writes the file name of the directory whole.
func (pd *Pending) WriteFile(name string, data []byte) error {
	f, err := pd.Create(name)
	if err != nil {
		return err
	}
	if _, err := f.Write(data); err != nil {
		f.Close()
		return err
	}
	return f.Close()
}

// CopyFrom copies into the directory the files of CopyFiles that dir
// holds (regular files, or links to them, as a Hugging Face cache holds
// them), and returns their names.
func (pd *Pending) CopyFrom(dir string) ([]string, error) {
	var copied []string
	for _, name := range CopyFiles {
		src := filepath.Join(dir, name)
		st, err := os.Stat(src)
		if errors.Is(err, os.ErrNotExist) {
			continue
		}
		if err != nil {
			return copied, fmt.Errorf("loop: publish: copy %s: %w", src, err)
		}
		if !st.Mode().IsRegular() {
			return copied, fmt.Errorf("loop: publish: copy %s: not a regular file (%s)", src, st.Mode().Type())
		}
		in, err := os.Open(src)
		if err != nil {
			return copied, fmt.Errorf("loop: publish: copy %s: %w", src, err)
		}
		out, err := pd.Create(name)
		if err == nil {
			if _, err = io.Copy(out, in); err != nil {
				out.Close()
			} else {
				err = out.Close()
			}
		}
		in.Close()
		if err != nil {
			return copied, fmt.Errorf("loop: publish: copy %s: %w", src, err)
		}
		copied = append(copied, name)
	}
	return copied, nil
}

// Publish writes DONE (dtype names the weights' dtype) after the files and
// the directory are synced, renames the directory to step_<N> (replacing a
// step_<N> already there) and applies retention. It returns DONE's content
// and the directory's path.
func (pd *Pending) Publish(dtype string) (Done, string, error) {
	if pd.done {
		return Done{}, "", fmt.Errorf("loop: step_%d published or discarded already", pd.step)
	}
	pd.done = true
	fail := func(err error) (Done, string, error) {
		os.RemoveAll(pd.tmp)
		return Done{}, "", err
	}
	files := slices.Clone(pd.files)
	sort.Slice(files, func(i, j int) bool { return files[i].Name < files[j].Name })
	d := Done{Format: DoneFormat, Version: DoneVersion, Step: pd.step, DType: dtype, Files: files}
	if _, ok := d.File(ModelFile); !ok {
		return fail(fmt.Errorf("loop: publish step_%d: no %s was written", pd.step, ModelFile))
	}
	b, err := json.MarshalIndent(d, "", "  ")
	if err != nil {
		return fail(err)
	}
	if err := syncDir(pd.tmp); err != nil { // the files' names
		return fail(err)
	}
	if err := writeSynced(filepath.Join(pd.tmp, DoneFile), append(b, '\n')); err != nil {
		return fail(err)
	}
	if err := syncDir(pd.tmp); err != nil {
		return fail(err)
	}
	final := WeightsDir(pd.p.root, pd.step)
	trash := ""
	if _, err := os.Lstat(final); err == nil {
		trash = filepath.Join(pd.p.root, trashPrefix+filepath.Base(final)+"-"+randSuffix())
		if err := os.Rename(final, trash); err != nil {
			return fail(fmt.Errorf("loop: publish: move the existing %s aside: %w", final, err))
		}
	}
	if err := os.Rename(pd.tmp, final); err != nil {
		if trash != "" {
			os.Rename(trash, final)
		}
		return fail(fmt.Errorf("loop: publish: %w", err))
	}
	if err := syncDir(pd.p.root); err != nil {
		return d, final, err
	}
	if trash != "" {
		if err := os.RemoveAll(trash); err != nil {
			return d, final, fmt.Errorf("loop: publish: remove the replaced %s: %w", trash, err)
		}
	}
	return d, final, pd.p.retain(pd.step)
}

// Discard removes a directory that will not be published.
func (pd *Pending) Discard() {
	if !pd.done {
		pd.done = true
		os.RemoveAll(pd.tmp)
	}
}

// removeAll deletes a directory retention moved aside; a variable so that
// a test can count deletions.
var removeAll = os.RemoveAll

// retain keeps the keep newest complete directories at or below step;
// those above it (a resumed run's, to be redone) are left alone.
func (p *Publisher) retain(step int64) error {
	ents, err := os.ReadDir(p.root)
	if err != nil {
		return fmt.Errorf("loop: retention: %w", err)
	}
	var old []int64
	for _, e := range ents {
		n, ok := parseStepDir(e.Name())
		if !ok || !e.IsDir() || n > step {
			continue
		}
		if _, err := os.Lstat(filepath.Join(p.root, e.Name(), DoneFile)); err == nil {
			old = append(old, n)
		}
	}
	slices.Sort(old)
	slices.Reverse(old)
	if len(old) <= p.keep {
		return nil
	}
	for _, n := range old[p.keep:] {
		dir := WeightsDir(p.root, n)
		trash := filepath.Join(p.root, trashPrefix+filepath.Base(dir)+"-"+randSuffix())
		if err := os.Rename(dir, trash); err != nil {
			return fmt.Errorf("loop: retention: %w", err)
		}
		if err := removeAll(trash); err != nil {
			return fmt.Errorf("loop: retention: %w", err)
		}
	}
	return syncDir(p.root)
}

// ReadDone reads and checks the DONE marker of the weights directory dir:
// its format and version, a step that names dir, and a model file.
func ReadDone(dir string) (Done, error) {
	path := filepath.Join(dir, DoneFile)
	b, err := inputfile.ReadFile(path, inputfile.LoopJSON)
	if err != nil {
		return Done{}, err
	}
	var d Done
	dec := json.NewDecoder(bytes.NewReader(b))
	dec.DisallowUnknownFields()
	if err := dec.Decode(&d); err != nil {
		return Done{}, fmt.Errorf("loop: %s: %w", path, err)
	}
	if d.Format != DoneFormat || d.Version != DoneVersion {
		return Done{}, fmt.Errorf("loop: %s: format %q version %d, want %q version %d (written by another tracegrpo version?)", path, d.Format, d.Version, DoneFormat, DoneVersion)
	}
	if n, ok := parseStepDir(filepath.Base(filepath.Clean(dir))); ok && n != d.Step {
		return Done{}, fmt.Errorf("loop: %s: step %d, but the directory is step_%d", path, d.Step, n)
	}
	if _, ok := d.File(ModelFile); !ok {
		return Done{}, fmt.Errorf("loop: %s: lists no %s", path, ModelFile)
	}
	for _, f := range d.Files {
		if checkName(f.Name) != nil || f.Size < 0 || !isSHA256(f.SHA256) {
			return Done{}, fmt.Errorf("loop: %s: bad entry %+v", path, f)
		}
	}
	return d, nil
}

// Verify reads dir's DONE and checks every file it lists, size and sha256.
func Verify(dir string) (Done, error) {
	d, err := ReadDone(dir)
	if err != nil {
		return d, err
	}
	for _, f := range d.Files {
		path := filepath.Join(dir, f.Name)
		n, sum, err := HashFile(path)
		if err != nil {
			return d, err
		}
		if n != f.Size || sum != f.SHA256 {
			return d, fmt.Errorf("loop: %s: %d bytes with sha256 %s; DONE says %d bytes with sha256 %s", path, n, sum, f.Size, f.SHA256)
		}
	}
	return d, nil
}

// HashFile returns the size and the sha256 (hex) of the file at path.
func HashFile(path string) (int64, string, error) {
	f, err := inputfile.Open(path, inputfile.Checkpoint)
	if err != nil {
		return 0, "", err
	}
	defer f.Close()
	h := sha256.New()
	n, err := io.Copy(h, f)
	if err != nil {
		return 0, "", fmt.Errorf("loop: read %s: %w", path, err)
	}
	return n, hex.EncodeToString(h.Sum(nil)), nil
}

// WaitDone waits until step's weights directory under root has DONE,
// polling every poll, and reads it. It gives up after timeout (0: look
// once) or when stop is closed (nil: never).
func WaitDone(root string, step int64, timeout, poll time.Duration, stop <-chan struct{}) (Done, error) {
	dir := WeightsDir(root, step)
	deadline := time.Now().Add(timeout)
	for {
		if _, err := os.Lstat(filepath.Join(dir, DoneFile)); err == nil {
			return ReadDone(dir)
		} else if !errors.Is(err, os.ErrNotExist) {
			return Done{}, fmt.Errorf("loop: %w", err)
		}
		if !time.Now().Before(deadline) {
			return Done{}, fmt.Errorf("loop: %s did not appear within %v", filepath.Join(dir, DoneFile), timeout)
		}
		select {
		case <-stop:
			return Done{}, ErrStopped
		case <-time.After(poll):
		}
	}
}

// ErrStopped is WaitDone's error when its stop channel closed.
var ErrStopped = errors.New("loop: stopped while waiting")

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

func checkName(name string) error {
	if name == "" || name == "." || name == ".." || strings.ContainsAny(name, `/\`) || name == DoneFile {
		return fmt.Errorf("loop: publish: %q is not a file name of a weights directory", name)
	}
	return nil
}

func isSHA256(s string) bool {
	if len(s) != 64 {
		return false
	}
	for _, c := range s {
		if (c < '0' || c > '9') && (c < 'a' || c > 'f') {
			return false
		}
	}
	return true
}

// writeSynced writes path through a temporary file beside it (synced,
// mode FileMode) renamed into place; the caller syncs the directory.
func writeSynced(path string, data []byte) error {
	tmp := path + ".tmp-" + randSuffix()
	f, err := os.OpenFile(tmp, os.O_WRONLY|os.O_CREATE|os.O_EXCL, FileMode)
	if err != nil {
		return fmt.Errorf("loop: write %s: %w", path, err)
	}
	_, err = f.Write(data)
	if err == nil {
		err = f.Chmod(FileMode)
	}
	if err == nil {
		err = f.Sync()
	}
	if cerr := f.Close(); err == nil {
		err = cerr
	}
	if err == nil {
		err = os.Rename(tmp, path)
	}
	if err != nil {
		os.Remove(tmp)
		return fmt.Errorf("loop: write %s: %w", path, err)
	}
	return nil
}

func syncDir(dir string) error {
	d, err := os.Open(dir)
	if err != nil {
		return fmt.Errorf("loop: fsync %s: %w", dir, err)
	}
	defer d.Close()
	if err := d.Sync(); err != nil {
		return fmt.Errorf("loop: fsync %s: %w", dir, err)
	}
	return nil
}

func randSuffix() string {
	var b [6]byte
	if _, err := rand.Read(b[:]); err != nil {
		panic(err) // crypto/rand never fails on supported platforms
	}
	return hex.EncodeToString(b[:])
}
