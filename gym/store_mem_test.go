package gym

import (
	"errors"
	"fmt"
	"io/fs"
	"math/rand/v2"
	"os"
	"path/filepath"
	"strings"
	"testing"

	"github.com/google/go-cmp/cmp"
	"github.com/google/go-cmp/cmp/cmpopts"
)

// storePair applies one sequence of operations to a file store in a
// directory and to an in-memory store, so that every result, every file and
// every snapshot of the two can be compared.
type storePair struct {
	t         *testing.T
	dir       string
	mfs       *memFS
	file, mem *Writer
	fsync     bool
	// Snapshot ids are minted from one counter per store (the same
	// sequence in both), so that frozen snapshots compare equal.
	fileIDs, memIDs int
}

func newStorePair(t *testing.T, fsync bool) *storePair {
	t.Helper()
	p := &storePair{t: t, dir: t.TempDir(), mfs: newMemFS(), fsync: fsync}
	p.reopen()
	return p
}

// reopen starts new writers over the same stores, as a restarted process
// would: their state is loaded (and a torn tail truncated) from the files.
func (p *storePair) reopen() {
	p.t.Helper()
	fw, err := NewWriter(p.dir)
	if err != nil {
		p.t.Fatal(err)
	}
	fw.SetFsync(p.fsync)
	fw.snapshotID = func() string { p.fileIDs++; return fmt.Sprintf("%032x", p.fileIDs) }
	mw := NewMemoryWriter()
	mw.fs = p.mfs
	mw.SetFsync(p.fsync)
	mw.snapshotID = func() string { p.memIDs++; return fmt.Sprintf("%032x", p.memIDs) }
	p.file, p.mem = fw, mw
}

// errText is err's message with the file store's directory written as the
// in-memory store's, "" for nil.
func (p *storePair) errText(err error) string {
	if err == nil {
		return ""
	}
	return strings.ReplaceAll(err.Error(), p.dir, memRoot)
}

// files is the file store's directory as name → bytes.
func (p *storePair) files() map[string]string {
	p.t.Helper()
	des, err := os.ReadDir(p.dir)
	if err != nil {
		p.t.Fatal(err)
	}
	out := map[string]string{}
	for _, de := range des {
		b, err := os.ReadFile(filepath.Join(p.dir, de.Name()))
		if err != nil {
			p.t.Fatal(err)
		}
		out[de.Name()] = string(b)
	}
	return out
}

// memFiles is the in-memory store as name → bytes.
func (p *storePair) memFiles() map[string]string {
	out := map[string]string{}
	p.mfs.mu.RLock()
	defer p.mfs.mu.RUnlock()
	for path, b := range p.mfs.files {
		if filepath.Dir(path) != memRoot {
			p.t.Fatalf("in-memory file %q is outside %s", path, memRoot)
		}
		out[filepath.Base(path)] = string(b)
	}
	return out
}

// snapshotResult is a snapshot read, or the error that refused it.
type snapshotResult struct {
	Snap   *Snapshot
	Err    string
	Reason string // the CaptureDamage reason, if any
}

func (p *storePair) result(s *Snapshot, err error) snapshotResult {
	r := snapshotResult{Snap: s, Err: p.errText(err)}
	if d := (*CaptureDamage)(nil); errors.As(err, &d) {
		r.Reason = d.Reason
	}
	return r
}

// storeOutcomes counts what a property run produced, so that a run that
// never reached the interesting states fails instead of passing.
type storeOutcomes struct {
	conflicts, frozen, retired, torn, incomplete, complete, damage, dropped int
	reasons                                                                 map[string]int
}

// TestMemoryStoreMatchesFileStore: random sequences of BeginCall, Put
// (identical re-puts, conflicting payloads, invalid entries), CancelCall,
// MarkIncomplete, Freeze, Snapshot, Drop, Clear, torn appends, lost
// entries, lost or damaged state documents and writer restarts, applied to a file store and to an
// in-memory store, give the same result for every operation, the same bytes
// in every file, and the same snapshot (or the same damage) from the reader
// for every rollout after every operation.
func TestMemoryStoreMatchesFileStore(t *testing.T) {
	const opsPerSequence = 40
	var got storeOutcomes
	got.reasons = map[string]int{}
	for _, tc := range []struct {
		fsync     bool
		sequences int
	}{{false, 150}, {true, 20}} {
		for seed := 1; seed <= tc.sequences; seed++ {
			t.Run(fmt.Sprintf("fsync=%v/seed=%d", tc.fsync, seed), func(t *testing.T) {
				runStoreSequence(t, tc.fsync, uint64(seed), opsPerSequence, &got)
			})
		}
	}
	t.Logf("outcomes: %+v", got)
	for name, n := range map[string]int{"ErrConflict": got.conflicts, "ErrFrozen": got.frozen, "ErrRetired": got.retired,
		"torn snapshots": got.torn, "incomplete snapshots": got.incomplete, "complete snapshots with entries": got.complete,
		"damaged snapshots": got.damage, "drops": got.dropped,
		ReasonIndexMismatch: got.reasons[ReasonIndexMismatch], ReasonInvalidState: got.reasons[ReasonInvalidState]} {
		if n < 5 {
			t.Errorf("the random sequences produced %s only %d times: they do not exercise the stores", name, n)
		}
	}
}

func runStoreSequence(t *testing.T, fsync bool, seed uint64, nops int, got *storeOutcomes) {
	p := newStorePair(t, fsync)
	rng := rand.New(rand.NewPCG(seed, 0x5707e))
	rids := []string{"r0", "r1"}
	calls := []string{"c0", "c1", "c2"}
	// Two payloads per call: putting the second after the first conflicts.
	payload := map[string][2]*TokenEntry{}
	for _, rid := range rids {
		for _, c := range calls {
			payload[rid+"/"+c] = [2]*TokenEntry{randomEntry(rng, rid, c), randomEntry(rng, rid, c)}
		}
	}
	// The last frozen snapshot (id, version) of each rollout, to drop.
	lastSnap := map[string]*Snapshot{}
	pick := func(xs []string) string { return xs[rng.IntN(len(xs))] }
	var log []string
	for i := 0; i < nops; i++ {
		rid, call := pick(rids), pick(calls)
		if rng.IntN(25) == 0 {
			rid = "-bad/id"
		}
		var desc string
		var ferr, merr error
		var fsnap, msnap *Snapshot
		switch k := rng.IntN(100); {
		case k < 20:
			if rng.IntN(15) == 0 {
				call = "-" + call
			}
			desc = fmt.Sprintf("BeginCall(%s, %s)", rid, call)
			ferr, merr = p.file.BeginCall(rid, call), p.mem.BeginCall(rid, call)
		case k < 50:
			e := *payload[pick(rids)+"/"+call][rng.IntN(2)]
			e.RolloutID = rid
			if rng.IntN(20) == 0 {
				e.GenerationLogProbs = append(e.GenerationLogProbs, -1) // invalid: misaligned
			}
			desc = fmt.Sprintf("Put(%s, %s)", rid, call)
			ferr, merr = p.file.Put(&e), p.mem.Put(&e)
		case k < 58:
			desc = fmt.Sprintf("CancelCall(%s, %s)", rid, call)
			ferr, merr = p.file.CancelCall(rid, call), p.mem.CancelCall(rid, call)
		case k < 63:
			desc = fmt.Sprintf("MarkIncomplete(%s, %s)", rid, call)
			ferr, merr = p.file.MarkIncomplete(rid, call), p.mem.MarkIncomplete(rid, call)
		case k < 69:
			desc = fmt.Sprintf("Freeze(%s)", rid)
			ferr, merr = p.file.Freeze(rid), p.mem.Freeze(rid)
		case k < 75:
			desc = fmt.Sprintf("Writer.Snapshot(%s)", rid)
			fsnap, ferr = p.file.Snapshot(rid)
			msnap, merr = p.mem.Snapshot(rid)
			if ferr == nil {
				lastSnap[rid] = fsnap
			}
		case k < 81:
			id, version := "", 0
			if s := lastSnap[rid]; s != nil {
				id, version = s.SnapshotID, s.Version
			}
			if rng.IntN(4) == 0 {
				version++ // a stale snapshot: nothing is dropped
			}
			desc = fmt.Sprintf("Drop(%s, %s, %d)", rid, id, version)
			var fok, mok bool
			fok, ferr = p.file.Drop(rid, id, version)
			mok, merr = p.mem.Drop(rid, id, version)
			if fok != mok {
				t.Fatalf("%s: file store dropped=%v, memory store dropped=%v", desc, fok, mok)
			}
			if fok {
				got.dropped++
			}
		case k < 86:
			desc = fmt.Sprintf("Clear(%s)", rid)
			ferr, merr = p.file.Clear(rid), p.mem.Clear(rid)
		case k < 91:
			// A crash in the middle of an append: part of a line, no newline.
			if ValidateRolloutID(rid) != nil {
				continue
			}
			line := payload[rid+"/"+call][0].AppendJSON(nil)
			part := line[:1+rng.IntN(len(line)-1)]
			desc = fmt.Sprintf("tear(%s, %d bytes)", rid, len(part))
			_, ferr = osFS{p.dir}.appendFile(filepath.Join(p.dir, rid+SuffixEntries), part, false)
			_, merr = p.mfs.appendFile(filepath.Join(memRoot, rid+SuffixEntries), part, false)
		case k < 94:
			desc = "reopen"
			p.reopen()
		case k < 96:
			// The state document lost: the reader falls back to the files
			// (the incomplete marker, the intents, the whole entries file).
			if ValidateRolloutID(rid) != nil {
				continue
			}
			desc = fmt.Sprintf("lose state(%s)", rid)
			ferr = osFS{p.dir}.remove(filepath.Join(p.dir, rid+SuffixState))
			merr = p.mfs.remove(filepath.Join(memRoot, rid+SuffixState))
			if errors.Is(ferr, fs.ErrNotExist) && errors.Is(merr, fs.ErrNotExist) {
				ferr, merr = nil, nil
			}
			p.reopen()
		case k < 98:
			// Entries lost from the end (a crash before they reached the
			// disk): the state may acknowledge more than the file holds.
			if ValidateRolloutID(rid) != nil {
				continue
			}
			fpath, mpath := filepath.Join(p.dir, rid+SuffixEntries), filepath.Join(memRoot, rid+SuffixEntries)
			b, _, _ := p.mfs.readCapture(mpath, maxEntriesFile)
			if len(b) == 0 {
				continue
			}
			n := int64(rng.IntN(len(b)))
			desc = fmt.Sprintf("truncate(%s, %d of %d bytes)", rid, n, len(b))
			ferr, merr = osFS{p.dir}.truncate(fpath, n), p.mfs.truncate(mpath, n)
			p.reopen()
		default:
			// A state document that is not JSON (a disk error, a stray write).
			if ValidateRolloutID(rid) != nil {
				continue
			}
			desc = fmt.Sprintf("damage state(%s)", rid)
			ferr = osFS{p.dir}.replaceFile(filepath.Join(p.dir, rid+SuffixState), []byte("{\"frozen\": tru"), false)
			merr = p.mfs.replaceFile(filepath.Join(memRoot, rid+SuffixState), []byte("{\"frozen\": tru"), false)
			p.reopen() // a writer that cached the state would overwrite it
		}
		log = append(log, desc)
		where := func() string { return strings.Join(log, "; ") }
		if f, m := p.errText(ferr), p.errText(merr); f != m {
			t.Fatalf("after %s\nfile store: %q\nmemory store: %q", where(), f, m)
		}
		switch {
		case errors.Is(ferr, ErrConflict):
			got.conflicts++
		case errors.Is(ferr, ErrFrozen):
			got.frozen++
		case errors.Is(ferr, ErrRetired):
			got.retired++
		}
		if d := cmp.Diff(fsnap, msnap, cmpopts.EquateEmpty()); d != "" {
			t.Fatalf("after %s: Writer.Snapshot (-file +memory)\n%s", where(), d)
		}
		if d := cmp.Diff(p.files(), p.memFiles()); d != "" {
			t.Fatalf("after %s: files (-file +memory)\n%s", where(), d)
		}
		if d := cmp.Diff(p.file.state, p.mem.state, cmpopts.EquateEmpty()); d != "" {
			t.Fatalf("after %s: writer state (-file +memory)\n%s", where(), d)
		}
		fr, err := NewReader(p.dir)
		if err != nil {
			t.Fatal(err)
		}
		mr := p.mem.Reader()
		fids, ferr := fr.RolloutIDs()
		mids, merr := mr.RolloutIDs()
		if d := cmp.Diff(fids, mids, cmpopts.EquateEmpty()); d != "" || ferr != nil || merr != nil {
			t.Fatalf("after %s: RolloutIDs (-file +memory) %v %v\n%s", where(), ferr, merr, d)
		}
		for _, r := range rids {
			f := p.result(fr.Snapshot(r))
			m := p.result(mr.Snapshot(r))
			if d := cmp.Diff(f, m, cmpopts.EquateEmpty()); d != "" {
				t.Fatalf("after %s: Reader.Snapshot(%s) (-file +memory)\n%s", where(), r, d)
			}
			switch {
			case f.Reason != "":
				got.damage++
				got.reasons[f.Reason]++
			case f.Snap == nil:
			case f.Snap.Incomplete:
				got.incomplete++
				if raw, ok, _ := p.mfs.readCapture(filepath.Join(memRoot, r+SuffixEntries), maxEntriesFile); ok && len(raw) > 0 && raw[len(raw)-1] != '\n' {
					got.torn++
				}
			case len(f.Snap.Entries) > 0:
				got.complete++
			}
		}
	}
}

// TestMemoryStoreNamesItsPaths: damage in an in-memory store names the
// file as "(memory)/<rollout>.<suffix>", and the store has no directory.
func TestMemoryStoreNamesItsPaths(t *testing.T) {
	w := NewMemoryWriter()
	e := randomEntry(rand.New(rand.NewPCG(1, 2)), "r", "c")
	mustPut(t, w, e)
	if _, err := w.fs.appendFile(filepath.Join(memRoot, "r"+SuffixEntries), []byte("not json\n"), false); err != nil {
		t.Fatal(err)
	}
	e2 := *e
	e2.ModelCallID = "c2"
	mustPut(t, w, &e2)
	_, err := w.Reader().Snapshot("r")
	var d *CaptureDamage
	if !errors.As(err, &d) || d.Reason != ReasonInvalidCapture || d.Path != filepath.Join(memRoot, "r"+SuffixEntries) ||
		!strings.Contains(err.Error(), "(memory)/r.tokens.jsonl:2") {
		t.Fatalf("damaged in-memory entries: %v, want invalid_capture naming (memory)/r.tokens.jsonl line 2", err)
	}
	if w.Dir() != "" || w.Reader().Dir() != "" {
		t.Errorf("in-memory store has a directory: writer %q, reader %q", w.Dir(), w.Reader().Dir())
	}
}

// TestMemoryStoreClearForgetsEverything: clearing every rollout leaves an
// in-memory store holding nothing, files or state, so a long run that clears
// what it has used stays bounded.
func TestMemoryStoreClearForgetsEverything(t *testing.T) {
	w := NewMemoryWriter()
	rng := rand.New(rand.NewPCG(7, 8))
	var rids []string
	for r := 0; r < 4; r++ {
		rid := fmt.Sprintf("step%06d-0-%d", 1, r)
		rids = append(rids, rid)
		for c := 0; c < 3; c++ {
			call := fmt.Sprintf("c%d", c)
			if err := w.BeginCall(rid, call); err != nil {
				t.Fatal(err)
			}
			mustPut(t, w, randomEntry(rng, rid, call))
		}
		if r == 1 {
			if err := w.MarkIncomplete(rid, "c9"); err != nil {
				t.Fatal(err)
			}
		}
		if _, err := w.Snapshot(rid); err != nil {
			t.Fatal(err)
		}
	}
	if n := len(w.fs.(*memFS).files); n != 4*3+1 {
		t.Fatalf("%d files before Clear, want 13 (entries, intents, state per rollout, one marker)", n)
	}
	for _, rid := range rids {
		if err := w.Clear(rid); err != nil {
			t.Fatal(err)
		}
	}
	if n, s := len(w.fs.(*memFS).files), len(w.state); n != 0 || s != 0 {
		t.Fatalf("after clearing every rollout the store holds %d files and %d states, want none", n, s)
	}
}

// TestMemoryStoreConcurrentReaders: readers of an in-memory store may run
// beside each other and beside the writer (as FinalizeBatch's jobs do); each
// sees the frozen rollouts exactly as a lone reader does. Run with -race.
func TestMemoryStoreConcurrentReaders(t *testing.T) {
	w := NewMemoryWriter()
	rng := rand.New(rand.NewPCG(9, 10))
	rids := []string{"a", "b", "c", "d"}
	for _, rid := range rids {
		for c := 0; c < 3; c++ {
			mustPut(t, w, randomEntry(rng, rid, fmt.Sprintf("c%d", c)))
		}
		if err := w.Freeze(rid); err != nil {
			t.Fatal(err)
		}
	}
	r := w.Reader()
	want := map[string]*Snapshot{}
	for _, rid := range rids {
		s, err := r.Snapshot(rid)
		if err != nil {
			t.Fatal(err)
		}
		want[rid] = s
	}
	extra := make([]*TokenEntry, 50)
	for i := range extra {
		extra[i] = randomEntry(rng, "e", fmt.Sprintf("c%d", i))
	}
	errs := make(chan error, 9)
	go func() { // the writer, on another rollout
		for _, e := range extra {
			if err := w.Put(e); err != nil {
				errs <- err
				return
			}
		}
		errs <- nil
	}()
	for g := 0; g < 8; g++ {
		go func() {
			for i := 0; i < 20; i++ {
				for _, rid := range rids {
					s, err := r.Snapshot(rid)
					if err != nil {
						errs <- err
						return
					}
					if d := cmp.Diff(want[rid], s); d != "" {
						errs <- fmt.Errorf("concurrent snapshot of %s (-alone +concurrent)\n%s", rid, d)
						return
					}
				}
			}
			errs <- nil
		}()
	}
	for i := 0; i < 9; i++ {
		if err := <-errs; err != nil {
			t.Error(err)
		}
	}
}
