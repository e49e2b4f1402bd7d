package gym

import (
	"bytes"
	"encoding/json"
	"errors"
	"io"
	"os"
	"path/filepath"
	"strings"
	"testing"

	"github.com/google/go-cmp/cmp"
)

// gymMainRecord is what Gym main's finalizer left on a record
// (testdata/gymmain/gym_finalized.jsonl).
type gymMainRecord struct {
	Scenario   string `json:"scenario"`
	MaskSample *bool  `json:"mask_sample"`
	Capture    struct {
		NCalls              int     `json:"n_calls"`
		Chains              *int    `json:"chains"`
		Roots               *int    `json:"roots"`
		QuarantinedCalls    int     `json:"quarantined_calls"`
		QuarantinedFraction float64 `json:"quarantined_fraction"`
		DeliveredFraction   float64 `json:"delivered_fraction"`
		Captured            int     `json:"generated_tokens_captured"`
		Delivered           int     `json:"generated_tokens_delivered"`
		EmptyGeneration     int     `json:"empty_generation_calls"`
		CaptureIncomplete   bool    `json:"capture_incomplete"`
		Error               string  `json:"error"`
	} `json:"_ng_token_capture"`
	Response struct {
		Output []struct {
			Prompt   []int32   `json:"prompt_token_ids"`
			Gen      []int32   `json:"generation_token_ids"`
			Logprobs []float64 `json:"generation_log_probs"`
			Routed   any       `json:"routed_experts"`
		} `json:"output"`
	} `json:"response"`
}

// gymMainReason is the mask reason tracegrpo gives for what made Gym main's
// finalizer mask a record, read from Gym's own evidence on it.
func gymMainReason(g *gymMainRecord) string {
	c := &g.Capture
	switch {
	case c.CaptureIncomplete:
		return ReasonCaptureIncomplete
	case c.Error == "capture contains no token records":
		return ReasonNothingRecorded
	case strings.Contains(c.Error, "no safe trainable chain"):
		return ReasonNoTrainableCalls
	case c.Error != "":
		return "unmapped Gym error " + c.Error
	case c.Roots != nil && c.Chains != nil && (*c.Roots != 1 || *c.Chains != 1):
		return ReasonMultipleChains
	}
	// consumer.py masks a single chain only for unresolved retries.
	return ReasonUnresolvedCustody
}

// gymMainDepartures are the scenarios where tracegrpo masks what Gym main
// delivers, with the reason (docs/gym.md, Departures).
var gymMainDepartures = map[string]string{
	"routed_experts": ReasonRoutedExperts,
}

// TestGymMainCaptures reads capture stores written by NeMo Gym main's own
// store (TokenEntry schema 1, scripts/gym_main_capture.py) and finalizes
// every record as Gym main's finalizer did: masked where Gym masked it, for
// the reason Gym's evidence gives; otherwise one trace whose tokens,
// logprobs and owned spans are exactly those of Gym's rebuilt
// response.output, and the same build metrics.
func TestGymMainCaptures(t *testing.T) {
	dir := filepath.Join("testdata", "gymmain")
	r, err := NewReader(filepath.Join(dir, "captures"))
	if err != nil {
		t.Fatal(err)
	}
	recs := readRecords(t, filepath.Join(dir, "rollouts.jsonl"))
	gymOut, err := os.ReadFile(filepath.Join(dir, "gym_finalized.jsonl"))
	if err != nil {
		t.Fatal(err)
	}
	lines := bytes.Split(bytes.TrimSpace(gymOut), []byte("\n"))
	if len(lines) != len(recs) || len(recs) < 10 {
		t.Fatalf("%d records, %d finalized by Gym", len(recs), len(lines))
	}
	delivered, masked := 0, 0
	for i, rec := range recs {
		var g gymMainRecord
		if err := json.Unmarshal(lines[i], &g); err != nil {
			t.Fatal(err)
		}
		t.Run(g.Scenario, func(t *testing.T) {
			snap, err := r.Snapshot(mustRolloutID(t, rec))
			if err == nil {
				for _, e := range snap.Entries {
					if e.SchemaVersion != TokenEntrySchemaV1 {
						t.Fatalf("call %s: schema_version %d, Gym main writes 1", e.ModelCallID, e.SchemaVersion)
					}
				}
			}
			for _, builder := range []string{BuilderPrefixMerging, BuilderPerRequest} {
				res, err := Finalize(cloneRecord(t, rec), r, builder)
				if err != nil {
					t.Fatalf("%s: %v", builder, err)
				}
				gymMasked := g.MaskSample != nil && *g.MaskSample
				if want, ok := gymMainDepartures[g.Scenario]; ok {
					if gymMasked || !res.Masked || res.Reason != want {
						t.Errorf("%s: departure: Gym masked %v, tracegrpo masked %v (%s), want masked %s", builder, gymMasked, res.Masked, res.Reason, want)
					}
					continue
				}
				if builder == BuilderPerRequest {
					// per_request trains each kept call on its full prompt; only
					// unresolved retries and damage mask it.
					if !gymMasked && res.Masked {
						t.Errorf("per_request masks (%s: %s) what Gym's prefix_merging delivers", res.Reason, res.Metrics.Error)
					}
					continue
				}
				m, c := res.Metrics, g.Capture
				if c.Chains != nil {
					// Gym built (whether it then masked or not): the same build.
					got := []any{m.NCalls, m.Chains, m.Roots, m.QuarantinedCalls, m.QuarantinedFraction, m.DeliveredFraction,
						m.GeneratedTokensCaptured, m.GeneratedTokensDelivered, m.EmptyGenerationCalls}
					want := []any{c.NCalls, *c.Chains, *c.Roots, c.QuarantinedCalls, c.QuarantinedFraction, c.DeliveredFraction,
						c.Captured, c.Delivered, c.EmptyGeneration}
					if d := cmp.Diff(want, got); d != "" && !c.CaptureIncomplete {
						t.Errorf("metrics n_calls, chains, roots, quarantined, fractions, tokens, empty (-Gym +tracegrpo)\n%s", d)
					}
				}
				if gymMasked {
					masked++
					if want := gymMainReason(&g); !res.Masked || res.Reason != want {
						t.Errorf("Gym masks (%+v); tracegrpo masked %v reason %q (%s), want %q", g.Capture, res.Masked, res.Reason, res.Metrics.Error, want)
					}
					continue
				}
				delivered++
				if res.Masked {
					t.Fatalf("Gym delivers; tracegrpo masks %s: %s", res.Reason, res.Metrics.Error)
				}
				if len(res.Envelope.Traces) != 1 {
					t.Fatalf("%d traces, Gym delivers one chain", len(res.Envelope.Traces))
				}
				tr := res.Envelope.Traces[0]
				var wantTok []int32
				var wantLP []float64
				var wantMask []int8
				for _, it := range g.Response.Output {
					if it.Gen == nil {
						continue
					}
					if !slicesEqual(it.Prompt[:len(wantTok)], wantTok) {
						t.Fatalf("Gym's output is not prefix-contiguous")
					}
					for range it.Prompt[len(wantTok):] {
						wantLP, wantMask = append(wantLP, 0), append(wantMask, 0)
					}
					wantTok = append(append([]int32(nil), it.Prompt...), it.Gen...)
					wantLP = append(wantLP, it.Logprobs...)
					for range it.Gen {
						wantMask = append(wantMask, 1)
					}
				}
				if d := cmp.Diff(wantTok, tr.TokenIDs); d != "" {
					t.Errorf("token ids (-Gym +tracegrpo)\n%s", d)
				}
				if d := cmp.Diff(wantLP, tr.GenerationLogprobs); d != "" {
					t.Errorf("logprobs (-Gym +tracegrpo)\n%s", d)
				}
				if d := cmp.Diff(wantMask, tr.LossMask); d != "" {
					t.Errorf("loss mask (-Gym +tracegrpo)\n%s", d)
				}
			}
		})
	}
	if delivered < 5 || masked < 5 {
		t.Fatalf("%d delivered, %d masked: the golden lost its cases", delivered, masked)
	}
}

func slicesEqual(a, b []int32) bool { return tokensEqual(a, b) }

func readRecords(t *testing.T, path string) []*Record {
	t.Helper()
	f, err := os.Open(path)
	if err != nil {
		t.Fatal(err)
	}
	defer f.Close()
	rr := NewRecordReader(f, path)
	var out []*Record
	for {
		rec, err := rr.Next()
		if err != nil {
			if errors.Is(err, io.EOF) {
				return out
			}
			t.Fatal(err)
		}
		if rec == nil {
			return out
		}
		out = append(out, rec)
	}
}

func cloneRecord(t *testing.T, rec *Record) *Record {
	t.Helper()
	c, err := ParseRecord(rec.AppendJSON(nil))
	if err != nil {
		t.Fatal(err)
	}
	return c
}

func mustRolloutID(t *testing.T, rec *Record) string {
	t.Helper()
	id, err := RolloutIDFromRecord(rec)
	if err != nil {
		t.Fatal(err)
	}
	return id
}

// TestGymMainLinesRoundTrip: every line Gym main's store wrote decodes as
// schema 1 and encodes back to the same bytes (Gym's sorted-key orjson
// line), its lineage-looking extras kept verbatim and unread.
func TestGymMainLinesRoundTrip(t *testing.T) {
	paths, err := filepath.Glob(filepath.Join("testdata", "gymmain", "captures", "*"+SuffixEntries))
	if err != nil || len(paths) < 10 {
		t.Fatalf("%d capture files: %v", len(paths), err)
	}
	lookalikes := 0
	for _, p := range paths {
		b, err := os.ReadFile(p)
		if err != nil {
			t.Fatal(err)
		}
		for i, line := range bytes.Split(bytes.TrimSuffix(b, []byte("\n")), []byte("\n")) {
			e, err := DecodeTokenEntry(line)
			if err != nil {
				t.Fatalf("%s:%d: %v", p, i+1, err)
			}
			if e.SchemaVersion != TokenEntrySchemaV1 || e.hasLineage() {
				t.Fatalf("%s:%d: schema %d, lineage %v", p, i+1, e.SchemaVersion, e.hasLineage())
			}
			for _, k := range []string{"parent_call_id", "digest", "parent_resolution", "cum_len", "prompt_is_delta", "response_id"} {
				if _, ok := e.Extra[k]; ok {
					lookalikes++
				}
			}
			if got := e.AppendJSON(nil); !bytes.Equal(got, line) {
				t.Fatalf("%s:%d: re-encoded\n%s\nGym wrote\n%s", p, i+1, got, line)
			}
		}
	}
	if lookalikes != 6 {
		t.Fatalf("%d lineage-looking extras, the golden writes 6", lookalikes)
	}
}

// TestSchemaV1Rules: a schema-1 entry never sets schema-3 fields, a
// snapshot mixing schema 1 and 3 lines is masked (unsupported_schema), and a
// schema-1 entry written by the package is a Gym main line.
func TestSchemaV1Rules(t *testing.T) {
	pid := "p"
	bad := TokenEntry{SchemaVersion: TokenEntrySchemaV1, RolloutID: "r", ModelCallID: "c", ParentCallID: &pid}
	if err := bad.Validate(); err == nil || !strings.Contains(err.Error(), "schema-1 entry carries no schema-3 fields") {
		t.Fatalf("schema 1 with parent_call_id: %v", err)
	}
	v1 := TokenEntry{SchemaVersion: TokenEntrySchemaV1, RolloutID: "r", ModelCallID: "a", PromptTokenIDs: []int32{1, 2},
		GenerationTokenIDs: []int32{3}, GenerationLogProbs: []float64{-1},
		Extra: map[string]json.RawMessage{"parent_call_id": json.RawMessage(`"x"`)}}
	line := string(v1.AppendJSON(nil))
	want := `{"created_at":0.0,"generation_log_probs":[-1.0],"generation_token_ids":[3],"model":"","model_call_id":"a","output_items":[],"parent_call_id":"x","prompt_token_ids":[1,2],"rollout_id":"r","routed_experts":null,"schema_version":1,"token_item_index":null}`
	if line != want {
		t.Fatalf("schema-1 line\n%s\nwant\n%s", line, want)
	}
	v3 := v1
	v3.SchemaVersion, v3.ModelCallID, v3.Extra = TokenEntrySchemaVersion, "b", nil
	v3.PromptTokenIDs = []int32{1, 2, 3, 4}
	for _, entries := range [][]TokenEntry{{v1, v3}, {v3, v1}} {
		_, _, err := BuildTrainingTraces(&Snapshot{RolloutID: "r", Entries: entries}, BuilderPrefixMerging, TerminalWitnesses{})
		var me *MaskError
		if !errors.As(err, &me) || me.Reason != ReasonUnsupportedSchema || !strings.Contains(me.Msg, "mixes TokenEntry schema_version 1 and 3") {
			t.Fatalf("mixed schemas: %v", err)
		}
	}
}

// TestSchemaV1Repeats: a byte-identical repeat of a call's line (Gym's
// idempotent put never writes one, a copied store may hold it) is read once,
// not taken for a retry of itself.
func TestSchemaV1Repeats(t *testing.T) {
	r, err := NewReader(filepath.Join("testdata", "gymmain", "captures"))
	if err != nil {
		t.Fatal(err)
	}
	snap, err := r.Snapshot("0-1") // chain2
	if err != nil || len(snap.Entries) != 2 {
		t.Fatalf("chain2: %v", err)
	}
	want, _, err := BuildTrainingTraces(snap, BuilderPrefixMerging, TerminalWitnesses{})
	if err != nil {
		t.Fatal(err)
	}
	rep := *snap
	rep.Entries = append(append([]TokenEntry(nil), snap.Entries...), snap.Entries...)
	got, _, err := BuildTrainingTraces(&rep, BuilderPrefixMerging, TerminalWitnesses{})
	if err != nil {
		t.Fatalf("repeated lines: %v", err)
	}
	if d := cmp.Diff(want, got); d != "" {
		t.Fatalf("repeats change the envelope (-once +twice)\n%s", d)
	}
}
