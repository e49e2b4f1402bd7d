package gym

import (
	"bytes"
	"errors"
	"os"
	"path/filepath"
	"strings"
	"syscall"
	"testing"
	"time"
)

// twoTurnCalls is a two-call chain whose second call is the scored one.
func twoTurnCalls() []TokenEntry {
	return []TokenEntry{
		call("t1", toks(1, 2), toks(10, 11), ""),
		call("t2", toks(1, 2, 10, 11, 3), toks(12, 13), "t1"),
	}
}

// frozenStore writes entries with the Writer (no intents) and freezes the
// rollout, so its state file indexes every line.
func frozenStore(t *testing.T, rid string, entries []TokenEntry) string {
	t.Helper()
	w, dir := newTestWriter(t)
	for i := range entries {
		e := entries[i]
		e.RolloutID = rid
		mustPut(t, w, &e)
	}
	if err := w.Freeze(rid); err != nil {
		t.Fatal(err)
	}
	return dir
}

func finalizeRID(t *testing.T, dir, rid string) *Finalized {
	t.Helper()
	r, err := NewReader(dir)
	if err != nil {
		t.Fatal(err)
	}
	fin, err := Finalize(parseRec(t, `{"_ng_rollout_id":"`+rid+`","reward":1.0}`), r, BuilderPrefixMerging)
	if err != nil {
		t.Fatalf("a damaged store must mask, not fail: %v", err)
	}
	return fin
}

func wantMask(t *testing.T, fin *Finalized, reason string, msg ...string) {
	t.Helper()
	if !fin.Masked || fin.Reason != reason {
		t.Fatalf("got masked=%v reason=%q error=%q, want reason %s", fin.Masked, fin.Reason, fin.Metrics.Error, reason)
	}
	for _, m := range msg {
		if !strings.Contains(fin.Metrics.Error, m) {
			t.Fatalf("error %q does not say %q", fin.Metrics.Error, m)
		}
	}
}

// TestStateIndexLostAcknowledgedLine is issue 11's second case: the writer
// recorded no intents, and the entries file then lost its last
// acknowledged line. Gym refuses the snapshot ("Invalid token-capture index
// offset"); tracegrpo used to deliver the rollout without its final,
// scored call.
func TestStateIndexLostAcknowledgedLine(t *testing.T) {
	dir := frozenStore(t, "lost", twoTurnCalls())
	path := filepath.Join(dir, "lost"+SuffixEntries)
	data, _ := os.ReadFile(path)
	cut := bytes.IndexByte(data, '\n') + 1
	if err := os.WriteFile(path, data[:cut], 0o644); err != nil {
		t.Fatal(err)
	}
	wantMask(t, finalizeRID(t, dir, "lost"), ReasonIndexMismatch, "indexed_size", "lost from offset "+itoa(cut))
}

// TestStateIndexDigestMismatch: an acknowledged line whose bytes changed
// (same length, still a valid entry) no longer hashes to its digest.
func TestStateIndexDigestMismatch(t *testing.T) {
	dir := frozenStore(t, "flip", twoTurnCalls())
	path := filepath.Join(dir, "flip"+SuffixEntries)
	data, _ := os.ReadFile(path)
	second := bytes.IndexByte(data, '\n') + 1
	i := second + bytes.Index(data[second:], []byte(`"generation_token_ids":[12,13]`))
	copy(data[i:], `"generation_token_ids":[12,14]`)
	if err := os.WriteFile(path, data, 0o644); err != nil {
		t.Fatal(err)
	}
	wantMask(t, finalizeRID(t, dir, "flip"), ReasonIndexMismatch, "offset "+itoa(second), `"t2"`, "entry_digests")
	// indexed_size inside a line, and a digest with no line, are refused too.
	for name, state := range map[string]string{
		"midline": `{"indexed_size":5,"entry_digests":{}}`,
		"ghost":   `{"indexed_size":0,"entry_digests":{"zz":"00"}}`,
	} {
		d := frozenStore(t, name, twoTurnCalls())
		os.WriteFile(filepath.Join(d, name+SuffixState), []byte(state), 0o644)
		wantMask(t, finalizeRID(t, d, name), ReasonIndexMismatch)
	}
	// An unindexed tail is recovered, as Gym recovers it.
	d := frozenStore(t, "tail", twoTurnCalls())
	os.WriteFile(filepath.Join(d, "tail"+SuffixState), []byte(`{"indexed_size":0,"entry_digests":{}}`), 0o644)
	if fin := finalizeRID(t, d, "tail"); fin.Masked {
		t.Fatalf("unindexed tail masked: %s", fin.Metrics.Error)
	}
}

// TestConflictingPayloadsForOneCallMask is issue 11's third case: two lines
// for one model call id that differ in any byte, created_at included, are
// conflicting durable payloads and mask the rollout, with or without a
// state index over them; byte-identical repeats are de-duplicated.
func TestConflictingPayloadsForOneCallMask(t *testing.T) {
	e := twoTurnCalls()
	later := e[1]
	later.CreatedAt = 1764512345.5
	write := func(t *testing.T, rid string, lines ...TokenEntry) string {
		dir := t.TempDir()
		var buf []byte
		for i := range lines {
			lines[i].RolloutID = rid
			buf = append(lines[i].AppendJSON(buf), '\n')
		}
		os.WriteFile(filepath.Join(dir, rid+SuffixEntries), buf, 0o644)
		return dir
	}
	for _, indexed := range []bool{false, true} {
		dir := write(t, "dup", e[0], e[1], later)
		if indexed {
			// The index acknowledges all three lines, with the first
			// payload of each call (as Gym's writer would have recorded).
			data, _ := os.ReadFile(filepath.Join(dir, "dup"+SuffixEntries))
			lines := bytes.Split(data, []byte{'\n'})
			st := `{"indexed_size":` + itoa(len(data)) + `,"entry_digests":{"t1":"` + lineDigest(lines[0]) + `","t2":"` + lineDigest(lines[1]) + `"}}`
			os.WriteFile(filepath.Join(dir, "dup"+SuffixState), []byte(st), 0o644)
		}
		wantMask(t, finalizeRID(t, dir, "dup"), ReasonConflictingPayloads, `"t2"`, "line 2", "line 3")
	}
	dir := write(t, "same", e[0], e[1], e[1])
	if fin := finalizeRID(t, dir, "same"); fin.Masked || len(fin.Envelope.Traces) != 1 {
		t.Fatalf("byte-identical repeat not de-duplicated: %+v", fin)
	}
}

// TestDamagedStoreMasksOneRollout is issue 11's fourth case: damage to one
// rollout's files masks that rollout with a reason code and leaves the
// others in the same batch alone.
func TestDamagedStoreMasksOneRollout(t *testing.T) {
	w, dir := newTestWriter(t)
	rids := []string{"good", "schema2", "badstate", "arraystate", "badzst", "bothfiles", "badintents"}
	for _, rid := range rids {
		for _, e := range twoTurnCalls() {
			e.RolloutID = rid
			mustPut(t, w, &e)
		}
		if err := w.Freeze(rid); err != nil {
			t.Fatal(err)
		}
	}
	base := func(rid string) string { return filepath.Join(dir, rid) }
	data, _ := os.ReadFile(base("schema2") + SuffixEntries)
	os.WriteFile(base("schema2")+SuffixEntries, bytes.Replace(data, []byte(`"schema_version":3`), []byte(`"schema_version":2`), 1), 0o644)
	os.WriteFile(base("badstate")+SuffixState, []byte(`{"frozen":tru`), 0o644)
	os.WriteFile(base("arraystate")+SuffixState, []byte(`[1,2]`), 0o644)
	os.Remove(base("badzst") + SuffixEntries)
	os.WriteFile(base("badzst")+SuffixEntriesZst, []byte("\x28\xb5\x2f\xfd garbage"), 0o644)
	os.WriteFile(base("bothfiles")+SuffixEntriesZst, []byte("x"), 0o644)
	os.WriteFile(base("badintents")+SuffixIntents, []byte("a\xff\n"), 0o644)
	want := map[string]string{"good": "", "schema2": ReasonUnsupportedSchema, "badstate": ReasonInvalidState,
		"arraystate": ReasonInvalidState, "badzst": ReasonInvalidCapture, "bothfiles": ReasonInvalidCapture,
		"badintents": ReasonInvalidCapture}
	r, _ := NewReader(dir)
	var recs []*Record
	for _, rid := range rids {
		recs = append(recs, parseRec(t, `{"_ng_rollout_id":"`+rid+`","reward":1.0}`))
	}
	fins, err := FinalizeBatch(recs, r, BuilderPerRequest, false, 3)
	if err != nil {
		t.Fatalf("one damaged rollout stopped the batch: %v", err)
	}
	for i, rid := range rids {
		if got := fins[i].Reason; got != want[rid] || fins[i].Masked != (want[rid] != "") {
			t.Errorf("%s: masked=%v reason %q (%s), want %q", rid, fins[i].Masked, got, fins[i].Metrics.Error, want[rid])
		}
		if fins[i].Masked && !strings.Contains(fins[i].Metrics.Error, rid) {
			t.Errorf("%s: error %q does not name the file", rid, fins[i].Metrics.Error)
		}
	}
}

// TestNonRegularCapturePathsMask is issue 11's fifth case: a capture path
// that is a symlink out of the capture directory, a FIFO, a directory or a
// dangling symlink masks the rollout; a FIFO does not hang the reader and
// /dev/zero is never read. A symlink to a regular file inside the capture
// directory is followed.
func TestNonRegularCapturePathsMask(t *testing.T) {
	dir := frozenStore(t, "ok", twoTurnCalls())
	w, _ := NewWriter(dir)
	w.SetFsync(false)
	outside := filepath.Join(t.TempDir(), "elsewhere.jsonl")
	okData, _ := os.ReadFile(filepath.Join(dir, "ok"+SuffixEntries))
	os.WriteFile(outside, okData, 0o644)
	mk := func(rid string, fn func(base string) error) {
		t.Helper()
		if err := fn(filepath.Join(dir, rid)); err != nil {
			t.Fatal(err)
		}
	}
	mk("fifo", func(b string) error { return syscall.Mkfifo(b+SuffixEntries, 0o644) })
	mk("fifostate", func(b string) error {
		os.WriteFile(b+SuffixEntries, okData, 0o644)
		return syscall.Mkfifo(b+SuffixState, 0o644)
	})
	mk("zero", func(b string) error { return os.Symlink("/dev/zero", b+SuffixEntries) })
	mk("escape", func(b string) error { return os.Symlink(outside, b+SuffixEntries) })
	mk("dangling", func(b string) error { return os.Symlink(filepath.Join(dir, "nowhere"), b+SuffixEntries) })
	mk("isdir", func(b string) error { return os.Mkdir(b+SuffixEntries, 0o755) })
	mk("fifointents", func(b string) error {
		os.WriteFile(b+SuffixEntries, bytes.ReplaceAll(okData, []byte(`"rollout_id":"ok"`), []byte(`"rollout_id":"fifointents"`)), 0o644)
		return syscall.Mkfifo(b+SuffixIntents, 0o644)
	})
	mk("inside", func(b string) error {
		os.WriteFile(b+".data", bytes.ReplaceAll(okData, []byte(`"rollout_id":"ok"`), []byte(`"rollout_id":"inside"`)), 0o644)
		return os.Symlink(b+".data", b+SuffixEntries)
	})
	// A character device (/dev/zero's numbers) inside the capture dir, where
	// this process may create one (root); otherwise the case says so.
	devOK := syscall.Mknod(filepath.Join(dir, "device"+SuffixEntries), syscall.S_IFCHR|0o600, 1<<8|5) == nil
	cases := map[string]string{"fifo": "a FIFO", "fifostate": "a FIFO", "zero": "outside the capture directory",
		"escape": "outside the capture directory", "dangling": "does not resolve", "isdir": "a directory", "fifointents": "a FIFO"}
	if devOK {
		cases["device"] = "a device"
	} else {
		t.Log("mknod is not permitted here: the device-node case did not run (the /dev/zero symlink case did)")
	}
	done := make(chan struct{})
	go func() {
		defer close(done)
		for rid, msg := range cases {
			wantMask(t, finalizeRID(t, dir, rid), ReasonNotRegularFile, msg)
		}
		if fin := finalizeRID(t, dir, "inside"); fin.Masked {
			t.Errorf("symlink inside the capture dir masked: %s", fin.Metrics.Error)
		}
	}()
	select {
	case <-done:
	case <-time.After(20 * time.Second):
		t.Fatal("reading non-regular capture paths hung")
	}
}

// TestCaptureDamageNamesOffset: every damage error carries the file and,
// where one applies, the byte offset.
func TestCaptureDamageNamesOffset(t *testing.T) {
	d := damage(ReasonIndexMismatch, "/x/r.tokens.jsonl", 42, "boom")
	if got := d.Error(); got != "index_mismatch: /x/r.tokens.jsonl (offset 42): boom" {
		t.Fatal(got)
	}
	var cd *CaptureDamage
	if !errors.As(error(d), &cd) || cd.Offset != 42 {
		t.Fatal("not a CaptureDamage")
	}
}

// indexedStore writes the two-call chain's lines for rid (the second with
// second's payload instead when it is not nil), and a state file whose
// entry_digests hold the given lines' digests and whose indexed_size is
// indexed(data). It returns the capture directory.
func indexedStore(t *testing.T, rid string, digests map[string]string, indexed func(data []byte) int) string {
	t.Helper()
	dir := t.TempDir()
	var data []byte
	for _, e := range twoTurnCalls() {
		e.RolloutID = rid
		data = append(e.AppendJSON(data), '\n')
	}
	if err := os.WriteFile(filepath.Join(dir, rid+SuffixEntries), data, 0o644); err != nil {
		t.Fatal(err)
	}
	var d []string
	for _, id := range []string{"t1", "t2"} {
		if v, ok := digests[id]; ok {
			d = append(d, `"`+id+`":"`+v+`"`)
		}
	}
	st := `{"indexed_size":` + itoa(indexed(data)) + `,"entry_digests":{` + strings.Join(d, ",") + `}}`
	if err := os.WriteFile(filepath.Join(dir, rid+SuffixState), []byte(st), 0o644); err != nil {
		t.Fatal(err)
	}
	return dir
}

// chainDigests are the sha256 digests of the two-call chain's lines as
// indexedStore writes them for rid.
func chainDigests(rid string) (lines [][]byte, digests map[string]string) {
	digests = map[string]string{}
	for _, e := range twoTurnCalls() {
		e.RolloutID = rid
		line := e.AppendJSON(nil)
		lines = append(lines, line)
		digests[e.ModelCallID] = lineDigest(line)
	}
	return lines, digests
}

// TestStateIndexSizeMustEndALine: an indexed_size that falls inside a line
// masks the rollout (index_mismatch), even when every acknowledged line
// hashes to its digest. TestStateIndexDigestMismatch's "midline" case fails
// through its empty entry_digests too; here only the line end is wrong,
// and without the check the rollout was delivered.
func TestStateIndexSizeMustEndALine(t *testing.T) {
	lines, digests := chainDigests("mid")
	first := len(lines[0]) + 1
	for _, c := range []struct {
		name    string
		digests map[string]string
		indexed int
	}{
		{"inside line 1", map[string]string{"t1": digests["t1"]}, 7},
		{"inside line 2", digests, first + 9},
		{"line 2 without its newline", digests, first + len(lines[1])},
		{"line 1 without its newline", map[string]string{"t1": digests["t1"]}, len(lines[0])},
	} {
		t.Run(c.name, func(t *testing.T) {
			dir := indexedStore(t, "mid", c.digests, func([]byte) int { return c.indexed })
			wantMask(t, finalizeRID(t, dir, "mid"), ReasonIndexMismatch, "indexed_size "+itoa(c.indexed)+" does not end a line")
		})
	}
	// The same store indexed at a line end is delivered: the cases above
	// fail on the line end alone.
	for _, indexed := range []int{first, first + len(lines[1]) + 1} {
		d := map[string]string{"t1": digests["t1"]}
		if indexed > first {
			d = digests
		}
		dir := indexedStore(t, "mid", d, func([]byte) int { return indexed })
		if fin := finalizeRID(t, dir, "mid"); fin.Masked {
			t.Errorf("indexed_size %d (a line end): masked: %s", indexed, fin.Metrics.Error)
		}
	}
}

// TestStateIndexTailConflictsWithDigest: a line in the unacknowledged
// tail whose model call id has an acknowledged digest that its bytes do
// not match is a conflicting durable payload (the state recorded another
// payload for that call), not a lost line: conflicting_payloads, naming
// the line.
func TestStateIndexTailConflictsWithDigest(t *testing.T) {
	lines, digests := chainDigests("tailconflict")
	other := twoTurnCalls()[1]
	other.RolloutID = "tailconflict"
	other.GenerationTokenIDs = toks(12, 14)
	d := map[string]string{"t1": digests["t1"], "t2": lineDigest(other.AppendJSON(nil))}
	dir := indexedStore(t, "tailconflict", d, func([]byte) int { return len(lines[0]) + 1 })
	wantMask(t, finalizeRID(t, dir, "tailconflict"), ReasonConflictingPayloads, `"t2"`, "line 2", "acknowledged in the state index")
}

// TestAcknowledgedLineIsNeverTorn: a last line that is not JSON is a torn
// write (dropped, the rollout incomplete) only in the unacknowledged tail.
// Before indexed_size it was written in full once: garbage there is damage
// that masks the rollout, naming the line, not a write still in progress.
func TestAcknowledgedLineIsNeverTorn(t *testing.T) {
	for _, c := range []struct {
		name, state string
		torn        bool
	}{
		{"acknowledged", "", false},
		{"in the tail", `{"indexed_size":0,"entry_digests":{}}`, true},
	} {
		t.Run(c.name, func(t *testing.T) {
			dir := frozenStore(t, "garbled", twoTurnCalls())
			path := filepath.Join(dir, "garbled"+SuffixEntries)
			data, _ := os.ReadFile(path)
			second := bytes.IndexByte(data, '\n') + 1
			copy(data[second:], "@@@@") // same length, no longer JSON
			if err := os.WriteFile(path, data, 0o644); err != nil {
				t.Fatal(err)
			}
			if c.state != "" {
				os.WriteFile(filepath.Join(dir, "garbled"+SuffixState), []byte(c.state), 0o644)
			}
			r, err := NewReader(dir)
			if err != nil {
				t.Fatal(err)
			}
			snap, err := r.Snapshot("garbled")
			if c.torn {
				if err != nil || !snap.Incomplete || len(snap.Entries) != 1 {
					t.Fatalf("a torn tail line: snapshot %+v, %v; want the first entry, incomplete", snap, err)
				}
				return
			}
			var d *CaptureDamage
			if !errors.As(err, &d) || d.Reason != ReasonInvalidCapture || !strings.Contains(err.Error(), "garbled"+SuffixEntries+":2:") {
				t.Fatalf("garbage in an acknowledged line: %v (snapshot %+v), want %s naming file:2", err, snap, ReasonInvalidCapture)
			}
		})
	}
}
