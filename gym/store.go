package gym

import (
	"bytes"
	"crypto/rand"
	"encoding/hex"
	"encoding/json"
	"errors"
	"fmt"
	"maps"
	"os"
	"path/filepath"
	"regexp"
	"sort"
	"strings"
	"sync"
)

// File name suffixes of Gym's file capture store (spec §2.2).
const (
	SuffixEntries    = ".tokens.jsonl"
	SuffixEntriesZst = ".tokens.jsonl.zst"
	SuffixIncomplete = ".tokens.incomplete"
	SuffixIntents    = ".tokens.intents"
	SuffixState      = ".tokens.state.json"
	SuffixLock       = ".tokens.lock"
)

// maxEntriesFile bounds the decompressed size of one rollout's entries.
const maxEntriesFile = 4 << 30

// maxEntryLine bounds one capture line (a 1M-token prompt is about 8 MB).
const maxEntryLine = 256 << 20

var rolloutIDPattern = regexp.MustCompile(`^[A-Za-z0-9][A-Za-z0-9._-]*$`)

// ErrBadRolloutID is returned for a rollout id that does not match
// ^[A-Za-z0-9][A-Za-z0-9._-]*$. No path is ever formed from such an id.
var ErrBadRolloutID = errors.New("gym: malformed rollout id")

// ErrFrozen is returned by a write to a frozen rollout.
var ErrFrozen = errors.New("gym: rollout capture is frozen")

// ErrRetired is returned for a rollout whose capture was retired (dropped).
var ErrRetired = errors.New("gym: rollout capture is retired")

// ErrConflict is returned when a model call id is re-put with a different payload.
var ErrConflict = errors.New("gym: model call id reused with a different payload")

// ValidateRolloutID checks a rollout id before any path is formed from it.
func ValidateRolloutID(id string) error {
	if !rolloutIDPattern.MatchString(id) {
		return fmt.Errorf("%w: %q does not match ^[A-Za-z0-9][A-Za-z0-9._-]*$", ErrBadRolloutID, id)
	}
	return nil
}

// Snapshot is the frozen set of one rollout's capture (Gym's
// TokenCaptureSnapshot). Entry order carries no meaning.
type Snapshot struct {
	RolloutID  string
	Entries    []TokenEntry
	Incomplete bool
	SnapshotID string
	Version    int
}

// Source yields a rollout's snapshot for finalization. Both Reader and
// Writer implement it, over a directory or in memory. A rollout with nothing
// captured yields a snapshot with no entries (not an error).
type Source interface {
	Snapshot(rolloutID string) (*Snapshot, error)
}

// storeState is the <rid>.tokens.state.json document.
type storeState struct {
	Frozen       bool              `json:"frozen"`
	Retired      bool              `json:"retired"`
	Incomplete   bool              `json:"incomplete"`
	SnapshotID   string            `json:"snapshot_id"`
	Version      int               `json:"version"`
	EntryDigests map[string]string `json:"entry_digests"`
	IndexedSize  int64             `json:"indexed_size"`
}

// EntryLineError is a capture line that could not be decoded.
type EntryLineError struct {
	File string
	Line int
	Err  error
}

func (e *EntryLineError) Error() string { return fmt.Sprintf("%s:%d: %v", e.File, e.Line, e.Err) }
func (e *EntryLineError) Unwrap() error { return e.Err }

// Reader reads Gym's file capture store (or an in-memory one: see
// Writer.Reader). It never creates, modifies or deletes a file; it takes no
// locks (a store being written concurrently may show a torn last line,
// which marks the snapshot incomplete).
type Reader struct {
	fs storeFS
}

// NewReader opens a capture directory for reading.
func NewReader(dir string) (*Reader, error) {
	st, err := os.Stat(dir)
	if err != nil {
		return nil, fmt.Errorf("gym: capture dir: %w", err)
	}
	if !st.IsDir() {
		return nil, fmt.Errorf("gym: capture dir %s: not a directory", dir)
	}
	return &Reader{fs: osFS{dir}}, nil
}

// Dir is the directory the reader reads ("" for an in-memory store).
func (r *Reader) Dir() string { return storeDir(r.fs) }

// storeDir is the directory of a store on disk, "" for one in memory.
func storeDir(fsys storeFS) string {
	if o, ok := fsys.(osFS); ok {
		return o.dir
	}
	return ""
}

// RolloutIDs lists the rollouts that have an entries file, sorted.
func (r *Reader) RolloutIDs() ([]string, error) {
	names, err := r.fs.names()
	if err != nil {
		return nil, fmt.Errorf("gym: list %s: %w", r.fs.root(), err)
	}
	seen := map[string]bool{}
	for _, name := range names {
		var rid string
		switch {
		case strings.HasSuffix(name, SuffixEntries):
			rid = strings.TrimSuffix(name, SuffixEntries)
		case strings.HasSuffix(name, SuffixEntriesZst):
			rid = strings.TrimSuffix(name, SuffixEntriesZst)
		default:
			continue
		}
		if ValidateRolloutID(rid) == nil {
			seen[rid] = true
		}
	}
	out := make([]string, 0, len(seen))
	for rid := range seen {
		out = append(out, rid)
	}
	sort.Strings(out)
	return out, nil
}

// Snapshot reads one rollout's capture. It is incomplete when an incomplete
// marker exists, the state says so, an intent has no entry, or the entries
// file ends in a torn (unterminated, undecodable) line. SnapshotID and
// Version come from the state file when there is one; otherwise SnapshotID
// is the first 32 hex digits of sha256 over the entries file's bytes and
// Version is the number of entries. A line that does not decode is an
// *EntryLineError naming the file and line.
func (r *Reader) Snapshot(rolloutID string) (*Snapshot, error) {
	if err := ValidateRolloutID(rolloutID); err != nil {
		return nil, err
	}
	return readSnapshot(r.fs, rolloutID, nil)
}

// Writer writes Gym's file capture store: one fsync'd sorted-key JSON line
// per entry, durable intents, incomplete markers and the state document. An
// identical re-put is a no-op, a conflicting re-put is ErrConflict (and marks
// the rollout incomplete), and every write after Freeze is ErrFrozen. One
// Writer per directory per process; it is safe for concurrent use.
//
// NewMemoryWriter makes a Writer whose store is held in memory: the same
// files with the same bytes, written by the same code, read back by the
// same reader (Writer.Reader), but none of them on disk.
type Writer struct {
	fs    storeFS
	mu    sync.Mutex
	state map[string]*storeState
	fsync bool
	// snapshotID mints a frozen snapshot's id (nil: newSnapshotID).
	snapshotID func() string
}

// NewWriter opens (creating if needed) a capture directory for writing.
func NewWriter(dir string) (*Writer, error) {
	if err := os.MkdirAll(dir, 0o755); err != nil {
		return nil, fmt.Errorf("gym: capture dir: %w", err)
	}
	return newWriter(osFS{dir}, true), nil
}

// NewMemoryWriter returns a Writer over a new, empty in-memory store, for
// captures that are read back by this process only (the built-in job's).
// Nothing reaches the disk, so per-write fsync is off (SetFsync(true)
// still makes Put update the state document after every entry, as on
// disk). Memory grows with what is captured: Clear a rollout once its
// snapshot has been used. Paths in its messages start with "(memory)".
func NewMemoryWriter() *Writer { return newWriter(newMemFS(), false) }

func newWriter(fsys storeFS, fsync bool) *Writer {
	return &Writer{fs: fsys, state: map[string]*storeState{}, fsync: fsync}
}

// Reader returns a Reader over the writer's store, on disk or in memory.
func (w *Writer) Reader() *Reader { return &Reader{fs: w.fs} }

// SetFsync turns per-write fsync off (tests, benchmarks and throwaway stores)
// or back on. It is on by default. Without fsync, Put also leaves state.json
// to the next Freeze (its index is rebuilt from the entries file's tail).
func (w *Writer) SetFsync(on bool) {
	w.mu.Lock()
	w.fsync = on
	w.mu.Unlock()
}

// Dir is the directory the writer writes ("" for an in-memory store).
func (w *Writer) Dir() string { return storeDir(w.fs) }

// loadState returns the rollout's state, reading it from disk the first time
// and indexing any entries past indexed_size. Caller holds mu.
func (w *Writer) loadState(rid string) (*storeState, error) {
	if st, ok := w.state[rid]; ok {
		return st, nil
	}
	base := filepath.Join(w.fs.root(), rid)
	st := &storeState{EntryDigests: map[string]string{}}
	b, err := w.fs.readFile(base + SuffixState)
	switch {
	case err == nil:
		// The Reader's rules (parseStoreIndex): a state without typed
		// entry_digests and indexed_size is legacy, and Gym re-indexes the
		// whole entries file, so indexing starts at offset 0 with no digests.
		idx, err := parseStoreIndex(b, base+SuffixState)
		if err != nil {
			return nil, fmt.Errorf("gym: %w", err)
		}
		st.Frozen, st.Retired, st.Incomplete = idx.frozen, idx.retired, idx.incomplete
		st.SnapshotID, st.Version = idx.snapshotID, idx.version
		if !idx.legacy {
			st.IndexedSize = idx.indexedSize
			maps.Copy(st.EntryDigests, idx.digests)
		}
	case !errors.Is(err, os.ErrNotExist):
		return nil, fmt.Errorf("gym: %w", err)
	}
	// Index entries written after the last state update.
	data, err := w.fs.readFile(base + SuffixEntries)
	if err != nil && !errors.Is(err, os.ErrNotExist) {
		return nil, fmt.Errorf("gym: %w", err)
	}
	if st.IndexedSize < 0 || st.IndexedSize > int64(len(data)) {
		return nil, fmt.Errorf("gym: %s: indexed_size %d is outside the entries file (%d bytes)",
			base+SuffixState, st.IndexedSize, len(data))
	}
	tail := data[st.IndexedSize:]
	off := st.IndexedSize
	lineNo := bytes.Count(data[:st.IndexedSize], []byte{'\n'})
	for len(tail) > 0 {
		nl := bytes.IndexByte(tail, '\n')
		if nl < 0 {
			// A torn final line was never acknowledged: truncate it, as Gym does.
			if err := w.fs.truncate(base+SuffixEntries, off); err != nil {
				return nil, fmt.Errorf("gym: %w", err)
			}
			break
		}
		line := asciiStrip(tail[:nl]) // as the Reader strips and hashes it
		lineNo++
		if len(line) > 0 {
			e, err := DecodeTokenEntry(line)
			if err != nil {
				return nil, &EntryLineError{File: base + SuffixEntries, Line: lineNo, Err: err}
			}
			d := lineDigest(line)
			if old, ok := st.EntryDigests[e.ModelCallID]; ok && old != d {
				return nil, fmt.Errorf("%w: %s in rollout %s (durable file)", ErrConflict, e.ModelCallID, rid)
			}
			st.EntryDigests[e.ModelCallID] = d
			st.Version++
		}
		off += int64(nl + 1)
		tail = tail[nl+1:]
	}
	st.IndexedSize = off
	w.state[rid] = st
	return st, nil
}

func (w *Writer) writeState(rid string, st *storeState, durable bool) error {
	b, err := json.Marshal(st)
	if err != nil {
		return fmt.Errorf("gym: state: %w", err)
	}
	b = append(b, '\n')
	if err := w.fs.replaceFile(filepath.Join(w.fs.root(), rid+SuffixState), b, durable && w.fsync); err != nil {
		return fmt.Errorf("gym: %w", err)
	}
	if durable {
		return w.syncDir()
	}
	return nil
}

func (w *Writer) syncDir() error {
	if !w.fsync {
		return nil
	}
	if err := w.fs.syncDir(); err != nil {
		return fmt.Errorf("gym: %w", err)
	}
	return nil
}

// appendLine appends line to path and returns the file's new size.
func (w *Writer) appendLine(path string, line []byte) (int64, error) {
	off, err := w.fs.appendFile(path, line, w.fsync)
	if err != nil {
		return 0, fmt.Errorf("gym: %w", err)
	}
	return off, nil
}

func (w *Writer) writable(rid string) (*storeState, error) {
	if err := ValidateRolloutID(rid); err != nil {
		return nil, err
	}
	st, err := w.loadState(rid)
	if err != nil {
		return nil, err
	}
	if st.Retired {
		return nil, fmt.Errorf("%w: %s", ErrRetired, rid)
	}
	if st.Frozen {
		return nil, fmt.Errorf("%w: %s", ErrFrozen, rid)
	}
	return st, nil
}

// BeginCall durably records that a call is about to be dispatched; a call
// that never gets an entry leaves a dangling intent and masks the rollout.
func (w *Writer) BeginCall(rolloutID, modelCallID string) error {
	if modelCallID == "" || strings.ContainsAny(modelCallID, "\n\r") || strings.HasPrefix(modelCallID, "-") {
		return fmt.Errorf("gym: BeginCall: model call id %q must be non-empty, one line, and not start with '-'", modelCallID)
	}
	w.mu.Lock()
	defer w.mu.Unlock()
	if _, err := w.writable(rolloutID); err != nil {
		return err
	}
	_, err := w.appendLine(filepath.Join(w.fs.root(), rolloutID+SuffixIntents), []byte(modelCallID+"\n"))
	return err
}

// CancelCall durably closes an intent whose call exited without generation.
func (w *Writer) CancelCall(rolloutID, modelCallID string) error {
	w.mu.Lock()
	defer w.mu.Unlock()
	if _, err := w.writable(rolloutID); err != nil {
		return err
	}
	_, err := w.appendLine(filepath.Join(w.fs.root(), rolloutID+SuffixIntents), []byte("-"+modelCallID+"\n"))
	return err
}

// Put validates and durably appends one entry under e.RolloutID. Putting an
// identical entry again is a no-op; a different payload under the same
// model_call_id is ErrConflict and marks the rollout incomplete.
func (w *Writer) Put(e *TokenEntry) error {
	if err := e.Validate(); err != nil {
		return fmt.Errorf("gym: Put %s/%s: %w", e.RolloutID, e.ModelCallID, err)
	}
	line := e.AppendJSON(make([]byte, 0, 8*(len(e.PromptTokenIDs)+len(e.GenerationTokenIDs))+24*len(e.GenerationLogProbs)+512))
	d := lineDigest(line)
	line = append(line, '\n')
	w.mu.Lock()
	defer w.mu.Unlock()
	st, err := w.writable(e.RolloutID)
	if err != nil {
		return err
	}
	if old, ok := st.EntryDigests[e.ModelCallID]; ok {
		if old == d {
			return nil
		}
		st.Incomplete = true
		st.Version++
		if err := w.writeState(e.RolloutID, st, true); err != nil {
			return err
		}
		return fmt.Errorf("%w: %s in rollout %s", ErrConflict, e.ModelCallID, e.RolloutID)
	}
	off, err := w.appendLine(filepath.Join(w.fs.root(), e.RolloutID+SuffixEntries), line)
	if err != nil {
		return err
	}
	st.IndexedSize = off
	st.EntryDigests[e.ModelCallID] = d
	st.Version++
	// The entry's fsync is the durability guarantee; the index is rebuilt
	// from the file tail if this state write is lost. Without fsync (a
	// throwaway store) the state is only written when it changes meaning
	// (freeze, incomplete, conflict, retire), which readers rely on.
	if !w.fsync {
		return nil
	}
	return w.writeState(e.RolloutID, st, false)
}

// MarkIncomplete durably records that a call of the rollout was lost.
func (w *Writer) MarkIncomplete(rolloutID, modelCallID string) error {
	if strings.ContainsAny(modelCallID, "\n\r") {
		return fmt.Errorf("gym: MarkIncomplete: model call id %q must be one line", modelCallID)
	}
	if err := ValidateRolloutID(rolloutID); err != nil {
		return err
	}
	w.mu.Lock()
	defer w.mu.Unlock()
	st, err := w.loadState(rolloutID)
	if err != nil {
		return err
	}
	if st.Retired {
		return fmt.Errorf("%w: %s", ErrRetired, rolloutID)
	}
	st.Incomplete = true
	st.Version++
	if err := w.writeState(rolloutID, st, true); err != nil {
		return err
	}
	if _, err := w.appendLine(filepath.Join(w.fs.root(), rolloutID+SuffixIncomplete), []byte(modelCallID+"\n")); err != nil {
		return err
	}
	return w.syncDir()
}

// Freeze makes the rollout read-only; it is idempotent. It does not read
// the entries: damage to them shows when the snapshot is read.
func (w *Writer) Freeze(rolloutID string) error {
	if err := ValidateRolloutID(rolloutID); err != nil {
		return err
	}
	w.mu.Lock()
	defer w.mu.Unlock()
	_, err := w.freeze(rolloutID)
	return err
}

// freeze marks the rollout frozen (once) and returns its state. Caller
// holds mu.
func (w *Writer) freeze(rolloutID string) (*storeState, error) {
	st, err := w.loadState(rolloutID)
	if err != nil {
		return nil, err
	}
	if st.Retired {
		return nil, fmt.Errorf("%w: %s", ErrRetired, rolloutID)
	}
	if !st.Frozen {
		st.Frozen = true
		if w.snapshotID != nil {
			st.SnapshotID = w.snapshotID()
		} else {
			st.SnapshotID = newSnapshotID()
		}
		st.Version++
		if err := w.writeState(rolloutID, st, true); err != nil {
			return nil, err
		}
	}
	return st, nil
}

// Snapshot freezes the rollout (idempotently) and returns its snapshot, like
// Gym's freeze_now.
func (w *Writer) Snapshot(rolloutID string) (*Snapshot, error) {
	if err := ValidateRolloutID(rolloutID); err != nil {
		return nil, err
	}
	w.mu.Lock()
	defer w.mu.Unlock()
	st, err := w.freeze(rolloutID)
	if err != nil {
		return nil, err
	}
	cp := *st
	return readSnapshot(w.fs, rolloutID, &cp)
}

func newSnapshotID() string {
	var b [16]byte
	if _, err := rand.Read(b[:]); err != nil {
		panic("gym: crypto/rand: " + err.Error())
	}
	return hex.EncodeToString(b[:])
}

// Drop retires a frozen snapshot: it deletes the entries, intents and
// incomplete marker and keeps a retired tombstone. It reports false (and
// deletes nothing) when the rollout is not frozen at that snapshot id and
// version.
func (w *Writer) Drop(rolloutID, snapshotID string, version int) (bool, error) {
	if err := ValidateRolloutID(rolloutID); err != nil {
		return false, err
	}
	w.mu.Lock()
	defer w.mu.Unlock()
	st, err := w.loadState(rolloutID)
	if err != nil {
		return false, err
	}
	if !st.Frozen || st.Retired || st.SnapshotID != snapshotID || st.Version != version {
		return false, nil
	}
	base := filepath.Join(w.fs.root(), rolloutID)
	for _, suf := range []string{SuffixEntries, SuffixIncomplete, SuffixIntents} {
		if err := w.fs.remove(base + suf); err != nil && !errors.Is(err, os.ErrNotExist) {
			return false, fmt.Errorf("gym: %w", err)
		}
	}
	st.IndexedSize = 0
	st.EntryDigests = map[string]string{}
	st.Retired = true
	if err := w.writeState(rolloutID, st, true); err != nil {
		return false, err
	}
	return true, nil
}

// Close releases the writer. The store holds no open handles.
func (w *Writer) Close() error { return nil }
