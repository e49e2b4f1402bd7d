package gym

import (
	"crypto/sha256"
	"encoding/json"
	"errors"
	"fmt"
	"io/fs"
	"math/rand/v2"
	"os"
	"path/filepath"
	"sort"
	"strings"
	"testing"

	"github.com/google/go-cmp/cmp"
	"github.com/google/go-cmp/cmp/cmpopts"
	"github.com/klauspost/compress/zstd"
)

func newTestWriter(t *testing.T) (*Writer, string) {
	t.Helper()
	dir := t.TempDir()
	w, err := NewWriter(dir)
	if err != nil {
		t.Fatal(err)
	}
	w.SetFsync(false)
	return w, dir
}

func mustPut(t *testing.T, w *Writer, e *TokenEntry) {
	t.Helper()
	if err := w.Put(e); err != nil {
		t.Fatal(err)
	}
}

func sortedByCall(es []TokenEntry) []TokenEntry {
	out := append([]TokenEntry(nil), es...)
	sort.Slice(out, func(i, j int) bool { return out[i].ModelCallID < out[j].ModelCallID })
	return out
}

func TestStoreWriterReaderRoundTrip(t *testing.T) {
	w, dir := newTestWriter(t)
	rng := rand.New(rand.NewPCG(3, 4))
	var want []TokenEntry
	for i := 0; i < 5; i++ {
		e := randomEntry(rng, "task-1.r_0", fmt.Sprintf("call%02d", i))
		e.Extra = map[string]json.RawMessage{"zz_extra": json.RawMessage(`{"k":[1,2]}`)}
		if err := w.BeginCall(e.RolloutID, e.ModelCallID); err != nil {
			t.Fatal(err)
		}
		mustPut(t, w, e)
		want = append(want, *e)
	}
	r, err := NewReader(dir)
	if err != nil {
		t.Fatal(err)
	}
	snap, err := r.Snapshot("task-1.r_0")
	if err != nil {
		t.Fatal(err)
	}
	if snap.Incomplete {
		t.Fatal("complete capture reported incomplete")
	}
	if d := cmp.Diff(sortedByCall(want), sortedByCall(snap.Entries), cmpopts.EquateEmpty()); d != "" {
		t.Fatalf("(-want +got)\n%s", d)
	}
	// The writer's own snapshot freezes and agrees on the entries.
	ws, err := w.Snapshot("task-1.r_0")
	if err != nil {
		t.Fatal(err)
	}
	if d := cmp.Diff(snap.Entries, ws.Entries, cmpopts.EquateEmpty()); d != "" {
		t.Fatalf("writer snapshot differs (-reader +writer)\n%s", d)
	}
	if ws.SnapshotID == "" || ws.Version < 6 {
		t.Fatalf("frozen snapshot id %q version %d", ws.SnapshotID, ws.Version)
	}
	// Lines are sorted-key JSON, one per entry.
	b, _ := os.ReadFile(filepath.Join(dir, "task-1.r_0"+SuffixEntries))
	lines := strings.Split(strings.TrimSuffix(string(b), "\n"), "\n")
	if len(lines) != 5 || !strings.HasPrefix(lines[0], `{"continuation_context_digest":`) {
		t.Fatalf("unexpected file layout: %d lines, first %.60s", len(lines), lines[0])
	}
	ids, err := r.RolloutIDs()
	if err != nil || len(ids) != 1 || ids[0] != "task-1.r_0" {
		t.Fatalf("RolloutIDs = %v, %v", ids, err)
	}
}

func TestStoreIdempotentPutConflictAndFreeze(t *testing.T) {
	w, dir := newTestWriter(t)
	e := randomEntry(rand.New(rand.NewPCG(5, 6)), "r", "c1")
	e.GenerationTokenIDs, e.GenerationLogProbs = []int32{4, 5}, []float64{-1, -2}
	mustPut(t, w, e)
	mustPut(t, w, e) // identical: no-op
	b, _ := os.ReadFile(filepath.Join(dir, "r"+SuffixEntries))
	if n := strings.Count(string(b), "\n"); n != 1 {
		t.Fatalf("identical re-put wrote %d lines", n)
	}
	// A new writer on the same directory still sees the first put.
	w2, _ := NewWriter(dir)
	w2.SetFsync(false)
	mustPut(t, w2, e)
	conflict := *e
	conflict.GenerationLogProbs = []float64{-1, -2.5}
	if err := w2.Put(&conflict); !errors.Is(err, ErrConflict) {
		t.Fatalf("conflicting re-put: %v", err)
	}
	r, _ := NewReader(dir)
	snap, err := r.Snapshot("r")
	if err != nil {
		t.Fatal(err)
	}
	if !snap.Incomplete || len(snap.Entries) != 1 {
		t.Fatalf("after conflict: incomplete=%v entries=%d", snap.Incomplete, len(snap.Entries))
	}
	if err := w2.Freeze("r"); err != nil {
		t.Fatal(err)
	}
	if err := w2.Freeze("r"); err != nil {
		t.Fatalf("freeze is not idempotent: %v", err)
	}
	other := *e
	other.ModelCallID = "c2"
	if err := w2.Put(&other); !errors.Is(err, ErrFrozen) {
		t.Fatalf("put after freeze: %v", err)
	}
	if err := w2.BeginCall("r", "c3"); !errors.Is(err, ErrFrozen) {
		t.Fatalf("begin after freeze: %v", err)
	}
	// A writer restarted after the freeze still refuses.
	w3, _ := NewWriter(dir)
	if err := w3.Put(&other); !errors.Is(err, ErrFrozen) {
		t.Fatalf("put after freeze (new writer): %v", err)
	}
}

func TestStoreIncompleteRules(t *testing.T) {
	entry := func(call string) *TokenEntry {
		return &TokenEntry{SchemaVersion: 3, RolloutID: "r", ModelCallID: call,
			PromptTokenIDs: []int32{1}, GenerationTokenIDs: []int32{2}, GenerationLogProbs: []float64{-1}}
	}
	cases := []struct {
		name       string
		do         func(w *Writer) error
		incomplete bool
		entries    int
	}{
		{"nothing", func(w *Writer) error { return nil }, false, 0},
		{"intent with entry", func(w *Writer) error {
			if err := w.BeginCall("r", "a"); err != nil {
				return err
			}
			return w.Put(entry("a"))
		}, false, 1},
		{"dangling intent", func(w *Writer) error {
			if err := w.BeginCall("r", "a"); err != nil {
				return err
			}
			if err := w.BeginCall("r", "b"); err != nil {
				return err
			}
			return w.Put(entry("a"))
		}, true, 1},
		{"cancelled intent", func(w *Writer) error {
			if err := w.BeginCall("r", "b"); err != nil {
				return err
			}
			return w.CancelCall("r", "b")
		}, false, 0},
		{"marked", func(w *Writer) error {
			if err := w.Put(entry("a")); err != nil {
				return err
			}
			return w.MarkIncomplete("r", "lost")
		}, true, 1},
	}
	for _, tc := range cases {
		t.Run(tc.name, func(t *testing.T) {
			w, dir := newTestWriter(t)
			if err := tc.do(w); err != nil {
				t.Fatal(err)
			}
			r, _ := NewReader(dir)
			snap, err := r.Snapshot("r")
			if err != nil {
				t.Fatal(err)
			}
			if snap.Incomplete != tc.incomplete || len(snap.Entries) != tc.entries {
				t.Fatalf("incomplete=%v entries=%d, want %v %d", snap.Incomplete, len(snap.Entries), tc.incomplete, tc.entries)
			}
		})
	}
}

func TestReaderTornLineAndBadLines(t *testing.T) {
	dir := t.TempDir()
	good := (&TokenEntry{SchemaVersion: 3, RolloutID: "r", ModelCallID: "a", PromptTokenIDs: []int32{1},
		GenerationTokenIDs: []int32{2}, GenerationLogProbs: []float64{-1}}).AppendJSON(nil)
	write := func(name, s string) {
		if err := os.WriteFile(filepath.Join(dir, name), []byte(s), 0o644); err != nil {
			t.Fatal(err)
		}
	}
	write("torn"+SuffixEntries, string(good)+"\n"+string(good[:40]))
	write("midbad"+SuffixEntries, string(good)+"\n"+string(good[:40])+"\n"+string(good)+"\n")
	write("schema"+SuffixEntries, strings.Replace(string(good), `"schema_version":3`, `"schema_version":4`, 1)+"\n")
	write("floattok"+SuffixEntries, "\n"+strings.Replace(string(good), `"prompt_token_ids":[1]`, `"prompt_token_ids":[1.0]`, 1)+"\n")
	r, _ := NewReader(dir)
	snap, err := r.Snapshot("torn")
	if err != nil || !snap.Incomplete || len(snap.Entries) != 1 {
		t.Fatalf("torn: %v %+v", err, snap)
	}
	_, err = r.Snapshot("midbad")
	var le *EntryLineError
	if !errors.As(err, &le) || le.Line != 2 || !strings.HasSuffix(le.File, "midbad"+SuffixEntries) {
		t.Fatalf("mid-file bad line: %v", err)
	}
	_, err = r.Snapshot("schema")
	if !errors.Is(err, ErrSchemaVersion) || !strings.Contains(err.Error(), "schema"+SuffixEntries+":1:") {
		t.Fatalf("schema 4: %v", err)
	}
	_, err = r.Snapshot("floattok")
	if err == nil || !strings.Contains(err.Error(), ":2: field prompt_token_ids[0]: expected an integer") {
		t.Fatalf("float token: %v", err)
	}
}

func TestReaderZstdTransparent(t *testing.T) {
	w, dir := newTestWriter(t)
	rng := rand.New(rand.NewPCG(7, 8))
	for i := 0; i < 3; i++ {
		mustPut(t, w, randomEntry(rng, "z", fmt.Sprintf("c%d", i)))
	}
	r, _ := NewReader(dir)
	plain, err := r.Snapshot("z")
	if err != nil {
		t.Fatal(err)
	}
	raw, _ := os.ReadFile(filepath.Join(dir, "z"+SuffixEntries))
	enc, _ := zstd.NewWriter(nil)
	comp := enc.EncodeAll(raw, nil)
	if err := os.WriteFile(filepath.Join(dir, "z"+SuffixEntriesZst), comp, 0o644); err != nil {
		t.Fatal(err)
	}
	var dmg *CaptureDamage
	if _, err := r.Snapshot("z"); !errors.As(err, &dmg) || dmg.Reason != ReasonInvalidCapture || !strings.Contains(err.Error(), "exist; keep one") {
		t.Fatalf("plain and zst together: %v", err)
	}
	os.Remove(filepath.Join(dir, "z"+SuffixEntries))
	zs, err := r.Snapshot("z")
	if err != nil {
		t.Fatal(err)
	}
	if d := cmp.Diff(plain.Entries, zs.Entries, cmpopts.EquateEmpty()); d != "" {
		t.Fatalf("zst (-plain +zst)\n%s", d)
	}
	os.WriteFile(filepath.Join(dir, "bad"+SuffixEntriesZst), []byte("not zstd"), 0o644)
	if _, err := r.Snapshot("bad"); !errors.As(err, &dmg) || dmg.Reason != ReasonInvalidCapture {
		t.Fatalf("corrupt zst: %v", err)
	}
}

func TestRolloutIDValidationBeforeAnyPath(t *testing.T) {
	w, dir := newTestWriter(t)
	r, _ := NewReader(dir)
	outside := filepath.Join(filepath.Dir(dir), "escape")
	bad := []string{"", ".", "..", "../escape", "/etc/passwd", "a/b", `a\b`, ".hidden", "-x", "_x", "a b", "é", "a\x00b",
		"r\n", outside}
	for _, id := range bad {
		if err := ValidateRolloutID(id); !errors.Is(err, ErrBadRolloutID) {
			t.Errorf("%q accepted", id)
		}
		if _, err := r.Snapshot(id); !errors.Is(err, ErrBadRolloutID) {
			t.Errorf("reader %q: %v", id, err)
		}
		e := &TokenEntry{SchemaVersion: 3, RolloutID: id, ModelCallID: "c"}
		if err := w.Put(e); !errors.Is(err, ErrBadRolloutID) {
			t.Errorf("writer %q: %v", id, err)
		}
		if err := w.BeginCall(id, "c"); !errors.Is(err, ErrBadRolloutID) {
			t.Errorf("begin %q: %v", id, err)
		}
		if err := w.MarkIncomplete(id, "c"); !errors.Is(err, ErrBadRolloutID) {
			t.Errorf("mark %q: %v", id, err)
		}
	}
	if _, err := os.Stat(outside + SuffixEntries); err == nil {
		t.Fatal("a file was written outside the store")
	}
	des, _ := os.ReadDir(dir)
	if len(des) != 0 {
		t.Fatalf("rejected ids created files: %v", des)
	}
	for _, id := range []string{"a", "0", "1-2", "1-2-a3", "A.b_c-d", "abc.."} {
		if err := ValidateRolloutID(id); err != nil {
			t.Errorf("%q rejected: %v", id, err)
		}
	}
}

// TestReaderNeverModifies hashes every file (content, mode, mtime) before and
// after reading every snapshot, including torn and incomplete ones.
func TestReaderNeverModifies(t *testing.T) {
	w, dir := newTestWriter(t)
	rng := rand.New(rand.NewPCG(9, 10))
	mustPut(t, w, randomEntry(rng, "a", "c1"))
	if err := w.BeginCall("b", "c9"); err != nil {
		t.Fatal(err)
	}
	mustPut(t, w, randomEntry(rng, "c", "c1"))
	if err := w.MarkIncomplete("c", "x"); err != nil {
		t.Fatal(err)
	}
	f, _ := os.OpenFile(filepath.Join(dir, "a"+SuffixEntries), os.O_APPEND|os.O_WRONLY, 0)
	f.WriteString(`{"schema_version":3,"rol`)
	f.Close()
	before := hashTree(t, dir)
	r, _ := NewReader(dir)
	for _, id := range []string{"a", "b", "c", "missing"} {
		if _, err := r.Snapshot(id); err != nil {
			t.Fatalf("%s: %v", id, err)
		}
	}
	if _, err := r.RolloutIDs(); err != nil {
		t.Fatal(err)
	}
	if after := hashTree(t, dir); after != before {
		t.Fatal("reading changed the store")
	}
}

func hashTree(t *testing.T, dir string) string {
	t.Helper()
	h := sha256.New()
	filepath.WalkDir(dir, func(p string, d fs.DirEntry, err error) error {
		if err != nil {
			t.Fatal(err)
		}
		info, _ := d.Info()
		fmt.Fprintf(h, "%s %v %d %d\n", p, info.Mode(), info.Size(), info.ModTime().UnixNano())
		if !d.IsDir() {
			b, _ := os.ReadFile(p)
			h.Write(b)
		}
		return nil
	})
	return fmt.Sprintf("%x", h.Sum(nil))
}

func TestStoreDropIsConditional(t *testing.T) {
	w, dir := newTestWriter(t)
	mustPut(t, w, randomEntry(rand.New(rand.NewPCG(1, 1)), "r", "c"))
	snap, err := w.Snapshot("r")
	if err != nil {
		t.Fatal(err)
	}
	if ok, err := w.Drop("r", snap.SnapshotID, snap.Version+1); ok || err != nil {
		t.Fatalf("stale drop: %v %v", ok, err)
	}
	if ok, err := w.Drop("r", "other", snap.Version); ok || err != nil {
		t.Fatalf("wrong-id drop: %v %v", ok, err)
	}
	if _, err := os.Stat(filepath.Join(dir, "r"+SuffixEntries)); err != nil {
		t.Fatal("refused drop deleted entries")
	}
	if ok, err := w.Drop("r", snap.SnapshotID, snap.Version); !ok || err != nil {
		t.Fatalf("drop: %v %v", ok, err)
	}
	if _, err := os.Stat(filepath.Join(dir, "r"+SuffixEntries)); !errors.Is(err, os.ErrNotExist) {
		t.Fatal("drop kept entries")
	}
	r, _ := NewReader(dir)
	if _, err := r.Snapshot("r"); !errors.Is(err, ErrRetired) {
		t.Fatalf("retired snapshot: %v", err)
	}
	if err := w.Put(randomEntry(rand.New(rand.NewPCG(1, 1)), "r", "c2")); !errors.Is(err, ErrRetired) {
		t.Fatalf("put after retire: %v", err)
	}
}

// A writer opening a store written by someone else indexes the entries past
// the state's indexed_size and truncates a torn final line, as Gym does.
func TestWriterRecoversTailAndTornLine(t *testing.T) {
	dir := t.TempDir()
	a := call("a", toks(1, 2), toks(3), "")
	a.RolloutID = "rr"
	b := call("b", toks(1, 2, 3, 4), toks(5), "a")
	b.RolloutID = "rr"
	path := filepath.Join(dir, "rr"+SuffixEntries)
	if err := writeEntriesFile(path, []TokenEntry{a}); err != nil {
		t.Fatal(err)
	}
	f, _ := os.OpenFile(path, os.O_APPEND|os.O_WRONLY, 0)
	f.WriteString(`{"schema_version":3,"rollout`)
	f.Close()
	w, _ := NewWriter(dir)
	w.SetFsync(false)
	mustPut(t, w, &a) // already in the file: a no-op
	mustPut(t, w, &b)
	changed := a
	changed.GenerationLogProbs = []float64{-9}
	if err := w.Put(&changed); !errors.Is(err, ErrConflict) {
		t.Fatalf("conflict with a tail-indexed entry: %v", err)
	}
	data, _ := os.ReadFile(path)
	if strings.Contains(string(data), `"rollout{`) || strings.Count(string(data), "\n") != 2 {
		t.Fatalf("torn line not truncated or entries duplicated:\n%s", data)
	}
	r, _ := NewReader(dir)
	snap, err := r.Snapshot("rr")
	if err != nil || len(snap.Entries) != 2 {
		t.Fatalf("%v %d", err, len(snap.Entries))
	}
}

// NewCallEntry writes what the builders need: a root and a resolved child
// round-trip through the store and build the expected chain.
func TestNewCallEntryThroughStore(t *testing.T) {
	w, dir := newTestWriter(t)
	a := NewCallEntry("g", "a", "m", toks(1, 2), toks(3), []float64{-1}, "", "resp-a")
	b := NewCallEntry("g", "b", "m", toks(1, 2, 3, 4), toks(5, 6), []float64{-1, -2}, "a", "resp-b")
	for _, e := range []*TokenEntry{a, b} {
		if err := w.BeginCall("g", e.ModelCallID); err != nil {
			t.Fatal(err)
		}
		mustPut(t, w, e)
	}
	if err := w.Freeze("g"); err != nil {
		t.Fatal(err)
	}
	r, _ := NewReader(dir)
	snap, err := r.Snapshot("g")
	if err != nil {
		t.Fatal(err)
	}
	env, m, err := BuildTrainingTraces(snap, BuilderPrefixMerging, TerminalWitnesses{HaveResponse: true, ResponseID: "resp-b"})
	if err != nil {
		t.Fatal(err)
	}
	if len(env.Traces) != 1 || env.Traces[0].TraceID != "g:b" || m.TerminalAttribution.CallID != "b" || *a.CumLen != 3 {
		t.Fatalf("%+v %+v", env.Traces, m.TerminalAttribution)
	}
}

// TestWriterAppendsToLegacyState: a state document without typed
// entry_digests or indexed_size is legacy (the Reader then re-indexes the
// whole entries file, as Gym does); a Writer reopening the store must index
// it the same way. It trusted indexed_size alone, wrote a state that knew only
// the entries it appended, and the Reader then refused the store it had
// accepted. Covered for a state with only indexed_size, and with digests of
// the wrong type.
func TestWriterAppendsToLegacyState(t *testing.T) {
	for _, legacy := range []func(size int) string{
		func(size int) string { return fmt.Sprintf(`{"indexed_size": %d}`, size) },
		func(size int) string {
			return fmt.Sprintf(`{"entry_digests": [], "indexed_size": %d, "version": 3}`, size)
		},
	} {
		w, dir := newTestWriter(t)
		r := rand.New(rand.NewPCG(7, 8))
		mustPut(t, w, randomEntry(r, "r", "t1"))
		data, err := os.ReadFile(filepath.Join(dir, "r"+SuffixEntries))
		if err != nil {
			t.Fatal(err)
		}
		state := legacy(len(data))
		if err := os.WriteFile(filepath.Join(dir, "r"+SuffixState), []byte(state), 0o644); err != nil {
			t.Fatal(err)
		}
		rd, _ := NewReader(dir)
		if _, err := rd.Snapshot("r"); err != nil {
			t.Fatalf("%s: the Reader refuses the legacy store: %v", state, err)
		}
		w2, err := NewWriter(dir) // with fsync: the state is rewritten after the append
		if err != nil {
			t.Fatal(err)
		}
		mustPut(t, w2, randomEntry(r, "r", "t2"))
		snap, err := rd.Snapshot("r")
		if err != nil {
			t.Fatalf("%s: after the Writer appended, the Reader refuses the store: %v", state, err)
		}
		if len(snap.Entries) != 2 || snap.Incomplete {
			t.Errorf("%s: after the append: %d entries, incomplete %v; want 2, complete", state, len(snap.Entries), snap.Incomplete)
		}
	}
}
