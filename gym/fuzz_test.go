package gym

import (
	"bytes"
	"encoding/json"
	"errors"
	"fmt"
	"math/rand/v2"
	"os"
	"path/filepath"
	"slices"
	"strings"
	"testing"

	"github.com/google/go-cmp/cmp"
	"github.com/google/go-cmp/cmp/cmpopts"
)

// seedLines adds every line of a testdata/seeds file to the fuzz corpus.
func seedLines(f *testing.F, name string) {
	f.Helper()
	b, err := os.ReadFile("testdata/seeds/" + name)
	if err != nil {
		f.Fatal(err)
	}
	for _, l := range bytes.Split(b, []byte{'\n'}) {
		if len(l) > 0 {
			f.Add(l)
		}
	}
}

// FuzzDecodeTokenEntry: no panic; anything accepted is valid JSON, passes
// Validate, and survives an encode/decode round trip unchanged.
func FuzzDecodeTokenEntry(f *testing.F) {
	seedLines(f, "token_entries.jsonl")
	// Schema-1 lines as Gym main's store wrote them.
	paths, _ := filepath.Glob("testdata/gymmain/captures/*.tokens.jsonl")
	for _, p := range paths {
		b, err := os.ReadFile(p)
		if err != nil {
			f.Fatal(err)
		}
		for _, l := range bytes.Split(b, []byte{'\n'}) {
			if len(l) > 0 {
				f.Add(l)
			}
		}
	}
	f.Fuzz(func(t *testing.T, data []byte) {
		e, err := DecodeTokenEntry(data)
		if err != nil {
			if e != nil {
				t.Fatal("entry returned with an error")
			}
			return
		}
		if !json.Valid(data) {
			t.Fatalf("accepted invalid JSON %q", data)
		}
		if err := e.Validate(); err != nil {
			t.Fatalf("accepted an entry that fails Validate: %v", err)
		}
		enc := e.AppendJSON(nil)
		if !json.Valid(enc) {
			t.Fatalf("encoded invalid JSON %q", enc)
		}
		back, err := DecodeTokenEntry(enc)
		if err != nil {
			t.Fatalf("re-decode: %v\n%s", err, enc)
		}
		if d := cmp.Diff(e, back, cmpopts.EquateEmpty()); d != "" {
			t.Fatalf("round trip (-first +second)\n%s", d)
		}
	})
}

// FuzzDecodeTrainingTraces: no panic; anything accepted is valid JSON,
// satisfies every invariant, and round-trips exactly.
func FuzzDecodeTrainingTraces(f *testing.F) {
	seedLines(f, "envelopes.jsonl")
	f.Fuzz(func(t *testing.T, data []byte) {
		b, err := DecodeTrainingTraces(data)
		if err != nil {
			if !errors.Is(err, ErrInvalidEnvelope) {
				t.Fatalf("error does not wrap ErrInvalidEnvelope: %v", err)
			}
			return
		}
		if !json.Valid(data) {
			t.Fatalf("accepted invalid JSON %q", data)
		}
		if err := b.Validate(); err != nil {
			t.Fatalf("decoded envelope fails Validate: %v", err)
		}
		back, err := DecodeTrainingTraces(b.AppendJSON(nil))
		if err != nil {
			t.Fatalf("re-decode: %v", err)
		}
		if d := cmp.Diff(b, back); d != "" {
			t.Fatalf("round trip (-first +second)\n%s", d)
		}
	})
}

// graphFromBytes turns fuzz bytes into a small call graph (at most 8 calls,
// tokens from a 4-symbol vocabulary so retries and shared prefixes happen).
func graphFromBytes(data []byte) []TokenEntry {
	next := func() byte {
		if len(data) == 0 {
			return 0
		}
		c := data[0]
		data = data[1:]
		return c
	}
	n := int(next()%8) + 1
	var out []TokenEntry
	for i := 0; i < n; i++ {
		ctl, ctl2 := next(), next()
		id := fmt.Sprintf("c%d", next()%32) // duplicates possible
		var prompt []int32
		parent := ""
		if len(out) > 0 && ctl&1 == 1 {
			p := out[int(next())%len(out)]
			parent = p.ModelCallID
			prompt = append(p.Cumulative(), prompt...)
			if p.PromptIsDelta {
				prompt = nil // a child of a delta only knows the delta suffix here
			}
		}
		k := int(next() % 4)
		if parent == "" && ctl2&32 == 0 {
			k++ // mostly non-empty root prompts
		}
		for ; k > 0; k-- {
			prompt = append(prompt, int32(next()%8))
		}
		var gen []int32
		for k := int(next() % 4); k > 0; k-- {
			gen = append(gen, int32(next()%4))
		}
		e := TokenEntry{SchemaVersion: 3, RolloutID: "r", ModelCallID: id, Model: "m",
			PromptTokenIDs: prompt, GenerationTokenIDs: gen}
		for k := range gen {
			e.GenerationLogProbs = append(e.GenerationLogProbs, -float64(next())/64-float64(k))
		}
		if ctl&2 == 0 {
			e.Stamp()
		}
		switch {
		case parent == "" && ctl&12 != 12:
			r := ParentRoot
			e.ParentResolution = &r
		case parent == "":
			r := ParentUnresolved
			if ctl2&1 == 0 {
				e.ParentResolution = &r
			}
		default:
			r := ParentResolved
			if ctl&24 == 24 {
				parent = "missing"
			}
			e.ParentResolution, e.ParentCallID = &r, &parent
			if ctl&16 != 0 && parent != "missing" {
				// a delta record of the same call
				for _, p := range out {
					if p.ModelCallID == parent && !p.PromptIsDelta && len(p.Cumulative()) <= len(prompt) {
						e.PromptTokenIDs = append([]int32(nil), prompt[len(p.Cumulative()):]...)
						e.PromptIsDelta = true
						break
					}
				}
			}
		}
		if ctl2&0xC6 == 0xC6 && e.CumLen != nil {
			bad := *e.CumLen + 1
			e.CumLen = &bad
		}
		if ctl2&24 == 24 && len(out) > 0 {
			out = append(out, out[int(next())%len(out)]) // redelivery
		}
		out = append(out, e)
	}
	return out
}

// checkEnvelope asserts every §2.5 invariant plus custody: each owned span
// holds exactly its call's captured generation and logprobs.
func checkEnvelope(t *testing.T, env *TrainingTraceBatch, entries []TokenEntry) map[string]ownedSample {
	t.Helper()
	if err := env.Validate(); err != nil {
		t.Fatalf("projected envelope invalid: %v", err)
	}
	if _, err := DecodeTrainingTraces(env.AppendJSON(nil)); err != nil {
		t.Fatalf("projected envelope does not decode: %v", err)
	}
	byID := map[string]*TokenEntry{}
	for i := range entries {
		if _, ok := byID[entries[i].ModelCallID]; !ok {
			byID[entries[i].ModelCallID] = &entries[i]
		}
	}
	owned := ownedSamples(env)
	for id, s := range owned {
		e := byID[id]
		if e == nil {
			t.Fatalf("owner %s is not a captured call", id)
		}
		if d := cmp.Diff(ownedSample{e.GenerationTokenIDs, e.GenerationLogProbs}, s); d != "" {
			t.Fatalf("call %s custody (-captured +owned)\n%s", id, d)
		}
	}
	return owned
}

// FuzzBuilders runs both builders over random small call graphs: no panic;
// success or refusal agrees between builders; on success every invariant
// holds, both own identical (tokens, logprobs) per call, and the envelope
// does not depend on the input order.
func FuzzBuilders(f *testing.F) {
	f.Add([]byte{3, 0, 1, 2, 1, 2, 3, 5, 1, 2, 1, 0, 1, 2, 1, 2, 9, 9})
	f.Add([]byte{7, 1, 2, 0, 2, 1, 1, 2, 3, 3, 0, 1, 2, 3, 17, 4, 0, 1, 1, 2, 0, 64, 5, 0, 1, 1, 1, 0})
	f.Add([]byte{1, 0, 0, 0, 0})
	f.Add([]byte{5, 1, 1, 0, 1, 0, 3, 2, 2, 1, 0, 0, 2, 1, 2, 3, 1, 2, 1, 1, 0, 1, 2, 3})
	f.Fuzz(func(t *testing.T, data []byte) {
		checkBuildersAgree(t, data)
	})
}

// checkBuildersAgree is the FuzzBuilders property; it reports whether the
// graph was delivered (not masked).
func checkBuildersAgree(t *testing.T, data []byte) bool {
	t.Helper()
	if len(data) > 256 {
		return false
	}
	entries := graphFromBytes(data)
	terminal := ""
	if len(data) > 0 && data[len(data)-1]%3 == 0 && len(entries) > 0 {
		terminal = entries[int(data[len(data)-1])%len(entries)].ModelCallID
	}
	var owned [2]map[string]ownedSample
	var reasons [2]string
	for bi, b := range builders {
		out, err := Build(b, entries, terminal)
		var env *TrainingTraceBatch
		if err == nil {
			env, err = ProjectTrainingTraces("r", out)
		}
		var me *MaskError
		if err != nil {
			if !errors.As(err, &me) {
				t.Fatalf("%s: non-mask error %v", b, err)
			}
			reasons[bi] = me.Reason
			continue
		}
		owned[bi] = checkEnvelope(t, env, entries)
		// Order independence.
		rev := make([]TokenEntry, len(entries))
		for i := range entries {
			rev[len(entries)-1-i] = entries[i]
		}
		out2, err := Build(b, rev, terminal)
		if err != nil {
			t.Fatalf("%s: reversed input refused: %v", b, err)
		}
		env2, err := ProjectTrainingTraces("r", out2)
		if err != nil {
			t.Fatalf("%s: reversed input refused: %v", b, err)
		}
		if !bytes.Equal(env.AppendJSON(nil), env2.AppendJSON(nil)) {
			t.Fatalf("%s: envelope depends on input order", b)
		}
	}
	if reasons[0] != reasons[1] {
		t.Fatalf("builders disagree: prefix_merging %q, per_request %q", reasons[0], reasons[1])
	}
	if d := cmp.Diff(owned[0], owned[1]); d != "" {
		t.Fatalf("owned samples differ (-prefix_merging +per_request)\n%s", d)
	}
	return owned[0] != nil
}

// TestBuildersAgreeOnRandomGraphs runs the FuzzBuilders property over 3000
// seeded random graphs in every plain go test run, and checks that the
// generator produces enough deliverable graphs for it to mean something.
func TestBuildersAgreeOnRandomGraphs(t *testing.T) {
	rng := rand.New(rand.NewPCG(11, 12))
	delivered := 0
	const n = 3000
	for i := 0; i < n; i++ {
		data := make([]byte, 8+rng.IntN(120))
		for j := range data {
			data[j] = byte(rng.Uint32())
		}
		if checkBuildersAgree(t, data) {
			delivered++
		}
	}
	if delivered < n/6 {
		t.Fatalf("only %d of %d random graphs were delivered", delivered, n)
	}
	t.Logf("%d of %d random graphs delivered", delivered, n)
}

// FuzzReadStoreLine feeds arbitrary bytes to the store reader as a whole
// entries file, without and with a state index over a prefix of it: no
// panic, an error never comes with a result, a torn tail never hides a bad
// acknowledged line, and every entry returned is valid.
func FuzzReadStoreLine(f *testing.F) {
	seedLines(f, "token_entries.jsonl")
	f.Fuzz(func(t *testing.T, data []byte) {
		for _, idx := range []*storeIndex{nil, indexOfPrefix(data)} {
			entries, torn, err := readEntries(data, "fuzz", idx)
			if err != nil && (torn || entries != nil) {
				t.Fatal("error together with a result")
			}
			var d *CaptureDamage
			if err != nil && !errors.As(err, &d) {
				t.Fatalf("error that is not capture damage: %v", err)
			}
			for i := range entries {
				if verr := entries[i].Validate(); verr != nil {
					t.Fatalf("entry %d invalid: %v", i, verr)
				}
			}
		}
	})
}

// indexOfPrefix acknowledges the lines of data's first half (up to a line
// end) as Gym's writer would have: their payload digests and byte count.
func indexOfPrefix(data []byte) *storeIndex {
	idx := &storeIndex{digests: map[string]string{}}
	end := bytes.LastIndexByte(data[:len(data)/2], '\n') + 1
	for _, raw := range bytes.Split(data[:end], []byte{'\n'}) {
		p := asciiStrip(raw)
		if len(p) == 0 {
			continue
		}
		e, err := DecodeTokenEntry(p)
		if err != nil {
			return idx
		}
		idx.digests[e.ModelCallID] = lineDigest(p)
	}
	idx.indexedSize = int64(end)
	return idx
}

// FuzzStateIndex feeds arbitrary bytes to the state-document parser (seeded
// with the state files Gym's writer produced in testdata/gymdiff): no
// panic, errors are capture damage, and an index is legacy exactly when
// entry_digests or indexed_size lack the types Gym requires.
func FuzzStateIndex(f *testing.F) {
	paths, _ := filepath.Glob("testdata/gymdiff/captures/*.tokens.state.json")
	for _, p := range paths {
		if b, err := os.ReadFile(p); err == nil {
			f.Add(b)
		}
	}
	f.Add([]byte(`{"indexed_size":true,"entry_digests":{"a":1}}`))
	f.Fuzz(func(t *testing.T, data []byte) {
		idx, err := parseStoreIndex(data, "state")
		if err != nil {
			var d *CaptureDamage
			if !errors.As(err, &d) || idx != nil {
				t.Fatalf("error %v is not capture damage (index %v)", err, idx)
			}
			return
		}
		if !idx.legacy && idx.digests == nil {
			t.Fatal("a non-legacy index without digests")
		}
		// The other direction, on strict JSON that encoding/json decodes
		// (Python's json reads it the same): typed digests (an object) and
		// indexed_size (an integer or a bool) make a non-legacy index.
		dec := json.NewDecoder(bytes.NewReader(data))
		dec.UseNumber()
		var doc map[string]any
		if dec.Decode(&doc) != nil || dec.More() {
			return
		}
		_, dictOK := doc["entry_digests"].(map[string]any)
		sizeOK := false
		switch v := doc["indexed_size"].(type) {
		case bool:
			sizeOK = true
		case json.Number:
			sizeOK = !strings.ContainsAny(string(v), ".eE")
		}
		if idx.legacy == (dictOK && sizeOK) {
			t.Fatalf("legacy %v, but entry_digests typed %v and indexed_size typed %v in %q", idx.legacy, dictOK, sizeOK, data)
		}
	})
}

// FuzzPrefixMergingV1 runs the schema-1 build over random small call graphs
// (their lineage dropped, as Gym main's records carry none): no panic; the
// outcome and envelope do not depend on the capture order (Gym main's
// builder orders by tokens); a delivered rollout is one trace that owns
// every call on it exactly once, its loss mask 1 exactly on their
// generations; prefix_merging delivers only when per_request does.
func FuzzPrefixMergingV1(f *testing.F) {
	f.Add([]byte{3, 0, 1, 2, 1, 2, 3, 5, 1, 2, 1, 0, 1, 2, 1, 2, 9, 9})
	f.Add([]byte{7, 1, 2, 0, 2, 1, 1, 2, 3, 3, 0, 1, 2, 3, 17, 4, 0, 1, 1, 2, 0, 64, 5, 0, 1, 1, 1, 0})
	f.Add([]byte{2, 0, 0, 1, 1, 2, 2, 3, 1, 0, 2, 0, 1, 3, 1})
	f.Fuzz(func(t *testing.T, data []byte) {
		if len(data) > 256 {
			return
		}
		graph := graphFromBytes(data)
		seen := map[string]bool{}
		var entries []TokenEntry
		for i, g := range graph {
			if seen[g.ModelCallID] || g.PromptIsDelta {
				continue // the store refuses a reused call id; deltas are schema 5
			}
			seen[g.ModelCallID] = true
			entries = append(entries, TokenEntry{SchemaVersion: TokenEntrySchemaV1, RolloutID: g.RolloutID,
				ModelCallID: g.ModelCallID, Model: g.Model, PromptTokenIDs: g.PromptTokenIDs,
				GenerationTokenIDs: g.GenerationTokenIDs, GenerationLogProbs: g.GenerationLogProbs, CreatedAt: float64(i % 3)})
		}
		if len(entries) == 0 {
			return
		}
		build := func(es []TokenEntry, builder string) (*TrainingTraceBatch, error) {
			env, _, err := BuildTrainingTraces(&Snapshot{RolloutID: "r", Entries: es}, builder, TerminalWitnesses{})
			var me *MaskError
			if err != nil && !errors.As(err, &me) {
				t.Fatalf("not a mask: %v", err)
			}
			return env, err
		}
		env, err := build(entries, BuilderPrefixMerging)
		rev := append([]TokenEntry(nil), entries...)
		slices.Reverse(rev)
		env2, err2 := build(rev, BuilderPrefixMerging)
		if (err == nil) != (err2 == nil) || (err != nil && err.(*MaskError).Reason != err2.(*MaskError).Reason) {
			t.Fatalf("capture order changes the outcome: %v / %v", err, err2)
		}
		if d := cmp.Diff(env, env2); d != "" {
			t.Fatalf("capture order changes the envelope (-in order +reversed)\n%s", d)
		}
		if _, perr := build(entries, BuilderPerRequest); err == nil && perr != nil {
			t.Fatalf("prefix_merging delivers, per_request masks: %v", perr)
		}
		if err != nil {
			return
		}
		if len(env.Traces) != 1 {
			t.Fatalf("%d traces", len(env.Traces))
		}
		tr := env.Traces[0]
		byID := map[string]*TokenEntry{}
		for i := range entries {
			byID[entries[i].ModelCallID] = &entries[i]
		}
		ones := 0
		for _, m := range tr.LossMask {
			ones += int(m)
		}
		want := 0
		for _, sp := range tr.SampledSpans {
			e := byID[sp.ModelCallID]
			if !slices.Equal(tr.TokenIDs[sp.Start:sp.End], e.GenerationTokenIDs) ||
				!slices.Equal(tr.GenerationLogprobs[sp.Start:sp.End], e.GenerationLogProbs) ||
				!slices.Equal(tr.TokenIDs[:sp.Start], e.PromptTokenIDs) {
				t.Fatalf("span %+v is not call %s's prompt and generation", sp, sp.ModelCallID)
			}
			want += sp.End - sp.Start
		}
		if ones != want || len(tr.SampledSpans) != len(tr.ModelCallIDs) {
			t.Fatalf("loss mask has %d ones for %d owned tokens; %d spans for %d calls", ones, want, len(tr.SampledSpans), len(tr.ModelCallIDs))
		}
	})
}
