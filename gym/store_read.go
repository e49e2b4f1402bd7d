package gym

// Reading one rollout's capture: the files (on disk, through osFS, or in
// memory, through memFS: storefs.go) are opened without following a
// symlink out of the capture directory and without blocking on a FIFO, read
// no further than their stated size, and checked against the state index
// (indexed_size and entry_digests) the way Gym's store reconciles them, plus
// a re-hash of every acknowledged line. Every defect of one rollout's files
// is a *CaptureDamage: the rollout is masked with its Reason, and the run
// goes on.

import (
	"bytes"
	"crypto/sha256"
	"encoding/hex"
	"encoding/json"
	"errors"
	"fmt"
	"io"
	"io/fs"
	"os"
	"path/filepath"
	"sort"
	"strings"
	"unicode/utf8"

	"github.com/klauspost/compress/zstd"

	"github.com/tracegrpo/tracegrpo/internal/inputfile"
)

// Mask reasons for damage to one rollout's capture files (CaptureDamage).
const (
	// ReasonUnsupportedSchema: a capture line has a TokenEntry
	// schema_version other than 1 or 3, or one rollout's lines mix the two.
	ReasonUnsupportedSchema = "unsupported_schema"
	// ReasonInvalidState: the .tokens.state.json document is not a JSON
	// object.
	ReasonInvalidState = "invalid_state"
	// ReasonIndexMismatch: the entries file is shorter than the state's
	// indexed_size, indexed_size falls inside a line, or an acknowledged
	// line does not hash to its entry_digests value.
	ReasonIndexMismatch = "index_mismatch"
	// ReasonConflictingPayloads: two lines for one model_call_id differ in
	// some byte.
	ReasonConflictingPayloads = "conflicting_payloads"
	// ReasonNotRegularFile: a capture path is a FIFO, a device, a socket, a
	// directory, a dangling symlink or a symlink out of the capture dir.
	ReasonNotRegularFile = "not_a_regular_file"
	// ReasonCaptureUnreadable: reading a capture file failed (permissions,
	// I/O error).
	ReasonCaptureUnreadable = "capture_unreadable"
)

// CaptureDamage is a defect of one rollout's capture files. Finalize masks
// the rollout with Reason. Offset is the byte offset in Path the defect
// was found at (-1 when none applies).
type CaptureDamage struct {
	Reason string
	Path   string
	Offset int64
	Err    error
}

func (e *CaptureDamage) Error() string { return e.Reason + ": " + e.Detail() }

// Detail is the error without its reason code: the file, the offset when
// known, and what is wrong there.
func (e *CaptureDamage) Detail() string {
	if e.Offset >= 0 {
		return fmt.Sprintf("%s (offset %d): %v", e.Path, e.Offset, e.Err)
	}
	return fmt.Sprintf("%s: %v", e.Path, e.Err)
}

func (e *CaptureDamage) Unwrap() error { return e.Err }

func damage(reason, path string, off int64, format string, args ...any) *CaptureDamage {
	return &CaptureDamage{Reason: reason, Path: path, Offset: off, Err: fmt.Errorf(format, args...)}
}

// Bounds on what one rollout's files may hold.
const (
	maxStateFile   = 256 << 20
	maxIntentsFile = 256 << 20
)

// storeIndex is the state document as Gym's store reads it: truthiness for
// the flags, entry_digests and indexed_size only when they have the types
// Gym requires (otherwise Gym re-indexes the whole file: legacy).
type storeIndex struct {
	legacy                      bool
	frozen, retired, incomplete bool
	snapshotID                  string
	version                     int
	digests                     map[string]string
	indexedSize                 int64
}

// nonStringDigest stands for an entry_digests value that is not a string:
// it equals no sha256 hex digest, as in Gym's comparison.
const nonStringDigest = "\x00non-string"

func parseStoreIndex(b []byte, path string) (*storeIndex, error) {
	v, err := parsePy(b, true)
	if err != nil {
		return nil, damage(ReasonInvalidState, path, -1, "not a JSON document: %v; remove it to rebuild the index from the entries file", err)
	}
	if v.kind != pyDict {
		return nil, damage(ReasonInvalidState, path, -1, "expected a JSON object, found %s", v.typeName())
	}
	idx := &storeIndex{frozen: v.get("frozen").truthy(), retired: v.get("retired").truthy(),
		incomplete: v.get("incomplete").truthy()}
	if s := v.get("snapshot_id"); s != nil {
		idx.snapshotID = pyStr(s)
	}
	if n := v.get("version"); n != nil && n.kind == pyInt {
		fmt.Sscan(n.i, &idx.version)
	}
	d, size := v.get("entry_digests"), v.get("indexed_size")
	switch {
	case d == nil || d.kind != pyDict || size == nil || (size.kind != pyInt && size.kind != pyBool):
		idx.legacy = true
	default:
		idx.digests = make(map[string]string, len(d.keys))
		for _, k := range d.keys {
			if dv := d.vals[k]; dv.kind == pyStr_ {
				idx.digests[k] = dv.s
			} else {
				idx.digests[k] = nonStringDigest
			}
		}
		if size.kind == pyBool {
			if size.b {
				idx.indexedSize = 1
			}
		} else if _, err := fmt.Sscan(size.i, &idx.indexedSize); err != nil || strings.TrimLeft(size.i, "-0123456789") != "" {
			return nil, damage(ReasonIndexMismatch, path, -1, "indexed_size %s is out of range", size.i)
		}
	}
	return idx, nil
}

func indexFromState(st *storeState) *storeIndex {
	idx := &storeIndex{frozen: st.Frozen, retired: st.Retired, incomplete: st.Incomplete,
		snapshotID: st.SnapshotID, version: st.Version, indexedSize: st.IndexedSize, digests: st.EntryDigests}
	if idx.digests == nil {
		idx.legacy = true
	}
	return idx
}

// describeMode names a non-regular file type.
func describeMode(m fs.FileMode) string {
	switch {
	case m&fs.ModeNamedPipe != 0:
		return "a FIFO"
	case m&fs.ModeDevice != 0:
		return "a device"
	case m&fs.ModeSocket != 0:
		return "a socket"
	case m.IsDir():
		return "a directory"
	}
	return "not a regular file (" + m.Type().String() + ")"
}

// checkCapturePath Lstats a capture path: absent (nil, nil), or the regular
// file it is or that its symlink names inside dir. Anything else is
// damage; nothing is opened.
func checkCapturePath(dir, path string) (fs.FileInfo, error) {
	fi, err := os.Lstat(path)
	if errors.Is(err, fs.ErrNotExist) {
		return nil, nil
	}
	if err != nil {
		return nil, damage(ReasonCaptureUnreadable, path, -1, "%v", err)
	}
	if fi.Mode()&fs.ModeSymlink != 0 {
		target, err := filepath.EvalSymlinks(path)
		if err != nil {
			return nil, damage(ReasonNotRegularFile, path, -1, "a symlink that does not resolve: %v", err)
		}
		root, err := filepath.EvalSymlinks(dir)
		if err != nil {
			return nil, damage(ReasonCaptureUnreadable, dir, -1, "%v", err)
		}
		if rel, err := filepath.Rel(root, target); err != nil || rel == ".." || strings.HasPrefix(rel, ".."+string(filepath.Separator)) {
			return nil, damage(ReasonNotRegularFile, path, -1, "a symlink pointing outside the capture directory (to %s)", target)
		}
		if fi, err = os.Stat(target); err != nil {
			return nil, damage(ReasonCaptureUnreadable, path, -1, "%v", err)
		}
	}
	if !fi.Mode().IsRegular() {
		return nil, damage(ReasonNotRegularFile, path, -1, "%s, not a regular file", describeMode(fi.Mode()))
	}
	return fi, nil
}

// openCaptureFile opens a checked capture path without blocking (a FIFO
// swapped in after the check cannot hang the read) and confirms that what
// was opened is the regular file that was checked.
func openCaptureFile(dir, path string) (*os.File, fs.FileInfo, error) {
	fi, err := checkCapturePath(dir, path)
	if fi == nil || err != nil {
		return nil, nil, err
	}
	f, err := inputfile.OpenNoBlock(path)
	if err != nil {
		return nil, nil, damage(ReasonCaptureUnreadable, path, -1, "%v", err)
	}
	st, err := f.Stat()
	if err != nil || !st.Mode().IsRegular() || !os.SameFile(st, fi) {
		f.Close()
		return nil, nil, damage(ReasonNotRegularFile, path, -1, "changed to something other than the checked regular file while being opened")
	}
	return f, st, nil
}

// readCaptureFile reads a capture file of at most limit bytes, no further
// than the size it states when opened. ok is false when it does not exist.
func readCaptureFile(dir, path string, limit int64) (data []byte, ok bool, err error) {
	f, st, err := openCaptureFile(dir, path)
	if f == nil || err != nil {
		return nil, false, err
	}
	defer f.Close()
	if st.Size() > limit {
		return nil, false, damage(ReasonCaptureUnreadable, path, -1, "%d bytes, more than the %d this reader accepts", st.Size(), limit)
	}
	data = make([]byte, st.Size())
	n, err := io.ReadFull(f, data)
	if err != nil && !errors.Is(err, io.ErrUnexpectedEOF) && !errors.Is(err, io.EOF) {
		return nil, false, damage(ReasonCaptureUnreadable, path, int64(n), "%v", err)
	}
	return data[:n], true, nil
}

// readEntriesData returns the (decompressed) entries file and its name, or
// nil when the rollout has none.
func readEntriesData(fsys storeFS, base string) ([]byte, string, error) {
	plainPath, zstPath := base+SuffixEntries, base+SuffixEntriesZst
	plain, havePlain, err := fsys.readCapture(plainPath, maxEntriesFile)
	if err != nil {
		return nil, "", err
	}
	f, size, err := fsys.openCapture(zstPath)
	if err != nil {
		return nil, "", err
	}
	if f == nil {
		return plain, plainPath, nil
	}
	defer f.Close()
	if havePlain {
		return nil, "", damage(ReasonInvalidCapture, base, -1, "both %s and %s exist; keep one", plainPath, zstPath)
	}
	dec, err := zstd.NewReader(io.LimitReader(f, size), zstd.WithDecoderConcurrency(1), zstd.WithDecoderMaxMemory(maxEntriesFile))
	if err != nil {
		return nil, "", damage(ReasonInvalidCapture, zstPath, -1, "zstd: %v", err)
	}
	defer dec.Close()
	data, err := io.ReadAll(io.LimitReader(dec, maxEntriesFile+1))
	if err != nil {
		return nil, "", damage(ReasonInvalidCapture, zstPath, int64(len(data)), "corrupt zstd stream (decompressed offset %d): %v", len(data), err)
	}
	if len(data) > maxEntriesFile {
		return nil, "", damage(ReasonInvalidCapture, zstPath, -1, "decompresses to more than %d bytes", maxEntriesFile)
	}
	return data, zstPath, nil
}

// asciiStrip is Python's bytes.strip(): it removes ASCII white space.
func asciiStrip(b []byte) []byte {
	isSpace := func(c byte) bool { return c == ' ' || c == '\t' || c == '\n' || c == '\r' || c == '\v' || c == '\f' }
	for len(b) > 0 && isSpace(b[0]) {
		b = b[1:]
	}
	for len(b) > 0 && isSpace(b[len(b)-1]) {
		b = b[:len(b)-1]
	}
	return b
}

func lineDigest(line []byte) string {
	h := sha256.Sum256(line)
	return hex.EncodeToString(h[:])
}

// readEntries decodes the entries file against its index (nil: no state
// file). Lines before indexed_size are acknowledged: each must hash to its
// entry_digests value, and every digest must have its line. Lines after it
// are the unacknowledged tail Gym re-indexes: there, a last non-blank line
// that is not JSON is a torn write (torn = true, dropped). Two lines for
// one model call id must be byte-identical.
func readEntries(data []byte, name string, idx *storeIndex) (entries []TokenEntry, torn bool, err error) {
	var indexed int64
	var digests map[string]string
	if idx != nil && !idx.legacy {
		indexed, digests = idx.indexedSize, idx.digests
		if indexed < 0 || indexed > int64(len(data)) {
			return nil, false, damage(ReasonIndexMismatch, name, int64(len(data)), "the state acknowledges %d bytes of entries (indexed_size) but the file holds %d: acknowledged entries were lost from offset %d",
				indexed, len(data), len(data))
		}
		if indexed > 0 && data[indexed-1] != '\n' {
			return nil, false, damage(ReasonIndexMismatch, name, indexed, "indexed_size %d does not end a line", indexed)
		}
	}
	type seenLine struct {
		payload []byte
		off     int64
		line    int
	}
	seen := map[string]seenLine{}
	acked := map[string]bool{}
	var off int64
	lineNo := 0
	for off < int64(len(data)) {
		rest := data[off:]
		nl := bytes.IndexByte(rest, '\n')
		raw := rest
		next := int64(len(data))
		if nl >= 0 {
			raw, next = rest[:nl], off+int64(nl)+1
		}
		lineNo++
		start := off
		off = next
		payload := asciiStrip(raw)
		if len(payload) == 0 {
			continue
		}
		inTail := start >= indexed
		if len(payload) > maxEntryLine {
			return nil, false, damage(ReasonInvalidCapture, name, start, "line %d is longer than %d bytes", lineNo, maxEntryLine)
		}
		e, derr := DecodeTokenEntry(payload)
		if derr != nil {
			if errors.Is(derr, ErrSchemaVersion) {
				return nil, false, &CaptureDamage{Reason: ReasonUnsupportedSchema, Path: name, Offset: start,
					Err: &EntryLineError{File: name, Line: lineNo, Err: derr}}
			}
			if inTail && !json.Valid(payload) && len(asciiStrip(data[off:])) == 0 {
				// An unacknowledged last line that is not JSON is a write
				// that never completed (Gym truncates it on its next write).
				return entries, true, nil
			}
			return nil, false, &CaptureDamage{Reason: ReasonInvalidCapture, Path: name, Offset: start,
				Err: &EntryLineError{File: name, Line: lineNo, Err: derr}}
		}
		id := e.ModelCallID
		if prev, ok := seen[id]; ok && !bytes.Equal(prev.payload, payload) {
			return nil, false, damage(ReasonConflictingPayloads, name, start,
				"model call id %q has conflicting durable payloads: line %d (offset %d) and line %d (offset %d) differ", id, prev.line, prev.off, lineNo, start)
		} else if !ok {
			seen[id] = seenLine{payload, start, lineNo}
		}
		if want, ok := digests[id]; !inTail && (!ok || want != lineDigest(payload)) {
			why := "does not hash to its entry_digests value"
			if !ok {
				why = "has no entry_digests value"
			}
			return nil, false, damage(ReasonIndexMismatch, name, start, "acknowledged line %d (model call id %q, before indexed_size %d) %s", lineNo, id, indexed, why)
		} else if !inTail {
			acked[id] = true
		} else if ok && want != lineDigest(payload) {
			return nil, false, damage(ReasonConflictingPayloads, name, start,
				"model call id %q has conflicting durable payloads: line %d differs from the payload acknowledged in the state index", id, lineNo)
		}
		entries = append(entries, *e)
	}
	if len(acked) != len(digests) {
		var missing []string
		for id := range digests {
			if !acked[id] {
				missing = append(missing, id)
			}
		}
		sort.Strings(missing)
		return nil, false, damage(ReasonIndexMismatch, name, indexed, "acknowledged model call ids %q have no line in the first %d bytes (indexed_size)", missing, indexed)
	}
	return entries, false, nil
}

// readIntents returns the intents (minus cancellations "-id") that have no
// entry, sorted. Lines split as Python's bytes.splitlines and strip ASCII
// white space, as Gym reads them.
func readIntents(fsys storeFS, path string, entries []TokenEntry) ([]string, error) {
	b, ok, err := fsys.readCapture(path, maxIntentsFile)
	if err != nil || !ok {
		return nil, err
	}
	b = bytes.ReplaceAll(b, []byte("\r\n"), []byte("\n"))
	b = bytes.ReplaceAll(b, []byte("\r"), []byte("\n"))
	active := map[string]bool{}
	for _, raw := range bytes.Split(b, []byte{'\n'}) {
		line := asciiStrip(raw)
		if len(line) == 0 {
			continue
		}
		if !utf8.Valid(line) {
			return nil, damage(ReasonInvalidCapture, path, -1, "an intent line is not UTF-8")
		}
		if line[0] == '-' {
			delete(active, string(line[1:]))
		} else {
			active[string(line)] = true
		}
	}
	for i := range entries {
		delete(active, entries[i].ModelCallID)
	}
	out := make([]string, 0, len(active))
	for id := range active {
		out = append(out, id)
	}
	sort.Strings(out)
	return out, nil
}

// readSnapshot reads one rollout's capture (st nil: read the state file).
func readSnapshot(fsys storeFS, rid string, st *storeState) (*Snapshot, error) {
	base := filepath.Join(fsys.root(), rid)
	var idx *storeIndex
	if st != nil {
		idx = indexFromState(st)
	} else {
		b, ok, err := fsys.readCapture(base+SuffixState, maxStateFile)
		if err != nil {
			if d := (*CaptureDamage)(nil); errors.As(err, &d) && d.Reason == ReasonCaptureUnreadable {
				d.Reason = ReasonInvalidState
			}
			return nil, err
		}
		if ok {
			if idx, err = parseStoreIndex(b, base+SuffixState); err != nil {
				return nil, err
			}
		}
	}
	if idx != nil && idx.retired {
		return nil, fmt.Errorf("%w: %s", ErrRetired, rid)
	}
	data, name, err := readEntriesData(fsys, base)
	if err != nil {
		return nil, err
	}
	if data == nil && idx != nil && !idx.legacy && (idx.indexedSize != 0 || len(idx.digests) > 0) {
		return nil, damage(ReasonIndexMismatch, base+SuffixEntries, 0, "the state acknowledges %d bytes of entries (indexed_size) but the entries file is missing", idx.indexedSize)
	}
	entries, torn, err := readEntries(data, name, idx)
	if err != nil {
		return nil, err
	}
	snap := &Snapshot{RolloutID: rid, Entries: entries, Incomplete: torn}
	marker, err := fsys.statCapture(base + SuffixIncomplete)
	if err != nil {
		return nil, err
	}
	if marker || (idx != nil && idx.incomplete) {
		snap.Incomplete = true
	}
	dangling, err := readIntents(fsys, base+SuffixIntents, entries)
	if err != nil {
		return nil, err
	}
	if len(dangling) > 0 {
		snap.Incomplete = true
	}
	if idx != nil {
		snap.SnapshotID, snap.Version = idx.snapshotID, idx.version
	} else {
		h := sha256.Sum256(data)
		snap.SnapshotID = hex.EncodeToString(h[:16])
		snap.Version = len(entries)
	}
	return snap, nil
}
