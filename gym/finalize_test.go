package gym

import (
	"encoding/json"
	"errors"
	"io"
	"os"
	"path/filepath"
	"reflect"
	"slices"
	"strings"
	"testing"

	"github.com/google/go-cmp/cmp"
)

func parseRec(t *testing.T, s string) *Record {
	t.Helper()
	r, err := ParseRecord([]byte(s))
	if err != nil {
		t.Fatal(err)
	}
	r.File, r.Line = "rollouts.jsonl", 7
	return r
}

func TestCorrelation(t *testing.T) {
	cases := []struct {
		rec  string
		want string
		err  error
	}{
		{`{"_ng_task_index":3,"_ng_rollout_index":1}`, "3-1", nil},
		{`{"_ng_task_index":3,"_ng_rollout_index":1,"_ng_attempt_index":0}`, "3-1", nil},
		{`{"_ng_task_index":3,"_ng_rollout_index":1,"_ng_attempt_index":2}`, "3-1-a2", nil},
		{`{"_ng_rollout_id":"step7.g2-r5","_ng_task_index":3,"_ng_rollout_index":1}`, "step7.g2-r5", nil},
		{`{"_ng_rollout_id":"x","_ng_attempt_index":1}`, "x-a1", nil},
		{`{"_ng_rollout_id":null,"_ng_task_index":0,"_ng_rollout_index":0}`, "0-0", nil},
		{`{"_ng_task_index":3}`, "", ErrNoCorrelationKey},
		{`{"reward":1}`, "", ErrNoCorrelationKey},
		{`{"_ng_rollout_id":"../x"}`, "", ErrBadRolloutID},
		{`{"_ng_rollout_id":""}`, "", ErrBadRolloutID},
		{`{"_ng_rollout_id":"a/b","_ng_task_index":1,"_ng_rollout_index":2}`, "", ErrBadRolloutID},
		{`{"_ng_task_index":-1,"_ng_rollout_index":2}`, "", ErrBadRolloutID},
	}
	for _, tc := range cases {
		got, err := RolloutIDFromRecord(parseRec(t, tc.rec))
		if got != tc.want || !errors.Is(err, tc.err) {
			t.Errorf("%s: got %q %v, want %q %v", tc.rec, got, err, tc.want, tc.err)
		}
		if err != nil && !strings.Contains(err.Error(), "rollouts.jsonl:7") {
			t.Errorf("%s: error does not name file and line: %v", tc.rec, err)
		}
	}
	for _, rec := range []string{`{"_ng_task_index":1.0,"_ng_rollout_index":2}`, `{"_ng_task_index":true,"_ng_rollout_index":2}`,
		`{"_ng_rollout_id":5}`, `{"_ng_task_index":"1","_ng_rollout_index":2}`} {
		_, err := RolloutIDFromRecord(parseRec(t, rec))
		if err == nil || !strings.Contains(err.Error(), "rollouts.jsonl:7: field _ng_") {
			t.Errorf("%s: %v", rec, err)
		}
	}
}

func TestRecordPreservesFields(t *testing.T) {
	src := `{"z":1, "response":{"id":"x","output":[{"type":"message"}]},"reward":0.5,"a":[1,2.50],"mask_sample":false}`
	r := parseRec(t, src)
	r.Set("training_traces", json.RawMessage(`{"k":1}`))
	r.Set("reward", json.RawMessage(`0.5`))
	r.Delete("mask_sample")
	want := `{"z":1,"response":{"id":"x","output":[{"type":"message"}]},"reward":0.5,"a":[1,2.50],"training_traces":{"k":1}}`
	if got := string(r.AppendJSON(nil)); got != want {
		t.Fatalf("got  %s\nwant %s", got, want)
	}
	if v, err := r.Reward(); err != nil || v != 0.5 {
		t.Fatalf("reward %v %v", v, err)
	}
	for _, bad := range []string{`[]`, `{"a":1,"a":2}`, `{"a":}`, `{"a":1}{}`} {
		if _, err := ParseRecord([]byte(bad)); err == nil {
			t.Errorf("accepted %s", bad)
		}
	}
	for _, tc := range []struct {
		rec      string
		mask     bool
		instance bool
		bad      bool
	}{
		{`{}`, false, false, false},
		{`{"mask_sample":true,"instance_config":{"mask_sample":true}}`, true, true, false},
		{`{"instance_config":{"other":1}}`, false, false, false},
		{`{"mask_sample":1}`, false, false, true},
	} {
		r := parseRec(t, tc.rec)
		m, err1 := r.MaskSample()
		im, err2 := r.InstanceMaskSample()
		if (err1 != nil) != tc.bad || m != tc.mask || im != tc.instance || err2 != nil {
			t.Errorf("%s: mask %v %v instance %v %v", tc.rec, m, err1, im, err2)
		}
	}
	if _, err := parseRec(t, `{"reward":"1"}`).Reward(); err == nil || !strings.Contains(err.Error(), "field reward") {
		t.Fatalf("string reward: %v", err)
	}
}

func TestRecordReaderStreams(t *testing.T) {
	in := "{\"a\":1}\n\n  \n{\"b\":2}\n{\"c\":3}"
	rr := NewRecordReader(strings.NewReader(in), "f.jsonl")
	var lines []int
	for {
		r, err := rr.Next()
		if err == io.EOF {
			break
		}
		if err != nil {
			t.Fatal(err)
		}
		lines = append(lines, r.Line)
	}
	if d := cmp.Diff([]int{1, 4, 5}, lines); d != "" {
		t.Fatalf("(-want +got)\n%s", d)
	}
	if rr.Offset() != int64(len(in)) {
		t.Fatalf("offset %d", rr.Offset())
	}
	rr = NewRecordReader(strings.NewReader("{\"a\":1}\n{\"b\":2,}\n"), "f.jsonl")
	rr.Next()
	if _, err := rr.Next(); err == nil || !strings.HasPrefix(err.Error(), "f.jsonl:2:") {
		t.Fatalf("bad line error: %v", err)
	}
}

// writeCapture puts entries into a fresh store and returns writer and dir.
func writeCapture(t *testing.T, rid string, entries []TokenEntry) (*Writer, string) {
	t.Helper()
	w, dir := newTestWriter(t)
	for i := range entries {
		e := entries[i]
		e.RolloutID = rid
		if err := w.BeginCall(rid, e.ModelCallID); err != nil {
			t.Fatal(err)
		}
		mustPut(t, w, &e)
	}
	return w, dir
}

func withRollout(entries []TokenEntry, rid string) []TokenEntry {
	out := make([]TokenEntry, len(entries))
	for i, e := range entries {
		e.RolloutID = rid
		out[i] = e
	}
	return out
}

const finalRecord = `{"responses_create_params":{"input":"hi"},"response":{"id":"resp-1","output":[{"type":"message","text":"ok"}]},"reward":1.0,"_ng_task_index":4,"_ng_rollout_index":2}`

// §10.2 item 13: file source, writer source and direct build agree; the
// finalizer preserves response and reward; the capture stays until
// retirement; retire deletes the entries. Both builders.
func TestFinalizeSourcesAgreeAndPreserve(t *testing.T) {
	for _, b := range builders {
		t.Run(b, func(t *testing.T) {
			w, dir := writeCapture(t, "4-2", branchingCalls())
			want, _, err := BuildTrainingTraces(&Snapshot{RolloutID: "4-2", Entries: withRollout(branchingCalls(), "4-2")}, b, TerminalWitnesses{})
			if err != nil {
				t.Fatal(err)
			}
			r, _ := NewReader(dir)
			recFile := parseRec(t, finalRecord)
			fromFile, err := Finalize(recFile, r, b)
			if err != nil || fromFile.Masked {
				t.Fatalf("file source: %v %+v", err, fromFile)
			}
			recW := parseRec(t, finalRecord)
			fromWriter, err := Finalize(recW, w, b)
			if err != nil || fromWriter.Masked {
				t.Fatalf("writer source: %v %+v", err, fromWriter)
			}
			if d := cmp.Diff(want, fromFile.Envelope); d != "" {
				t.Fatalf("file source (-direct +file)\n%s", d)
			}
			if d := cmp.Diff(want, fromWriter.Envelope); d != "" {
				t.Fatalf("writer source (-direct +writer)\n%s", d)
			}
			// Everything but the added keys is byte-identical.
			for _, rec := range []*Record{recFile, recW} {
				orig := parseRec(t, finalRecord)
				for _, k := range orig.Keys() {
					a, _ := orig.Get(k)
					g, _ := rec.Get(k)
					if string(a) != string(g) {
						t.Fatalf("field %s changed: %s -> %s", k, a, g)
					}
				}
				if d := cmp.Diff(append(orig.Keys(), KeyTrainingTraces, KeyTokenCapture), rec.Keys()); d != "" {
					t.Fatalf("keys (-want +got)\n%s", d)
				}
				var m CaptureMetrics
				raw, _ := rec.Get(KeyTokenCapture)
				if err := json.Unmarshal(raw, &m); err != nil || m.NCalls != 4 || m.DeliveredFraction != 1 || m.Error != "" {
					t.Fatalf("metrics %s %v", raw, err)
				}
				env, ok, err := rec.TrainingTraces()
				if !ok || err != nil || env.RolloutID != "4-2" {
					t.Fatalf("attached envelope: %v %v", ok, err)
				}
			}
			// Finalizing keeps the capture; retiring the consumed snapshot deletes it.
			if _, err := os.Stat(filepath.Join(dir, "4-2"+SuffixEntries)); err != nil {
				t.Fatal("finalize removed the capture")
			}
			if !fromWriter.Retirable() {
				t.Fatal("successful build not retirable")
			}
			ok, err := w.Drop("4-2", fromWriter.SnapshotID, fromWriter.Version)
			if !ok || err != nil {
				t.Fatalf("retire: %v %v", ok, err)
			}
			if _, err := os.Stat(filepath.Join(dir, "4-2"+SuffixEntries)); !errors.Is(err, os.ErrNotExist) {
				t.Fatal("retire kept the entries")
			}
			// A record that already carries the envelope is validated, not rebuilt.
			pre, err := Finalize(recFile, nil, b)
			if err != nil || !pre.Prebuilt || pre.Masked {
				t.Fatalf("prebuilt: %v %+v", err, pre)
			}
		})
	}
}

// §10.2 item 14: an incomplete source masks and removes a stale envelope,
// and the snapshot is not retirable.
func TestFinalizeIncompleteMasksAndRemovesStale(t *testing.T) {
	for _, b := range builders {
		w, _ := writeCapture(t, "4-2", branchingCalls())
		if err := w.BeginCall("4-2", "lost-call"); err != nil {
			t.Fatal(err)
		}
		stale := custodyEnvelope()
		stale.RolloutID = "4-2"
		rec := parseRec(t, finalRecord)
		rec.Set(KeyTrainingTraces, stale.AppendJSON(nil))
		res, err := Refinalize(rec, w, b)
		if err != nil {
			t.Fatal(err)
		}
		if !res.Masked || res.Reason != ReasonCaptureIncomplete || res.Retirable() {
			t.Fatalf("%s: %+v", b, res)
		}
		if _, ok := rec.Get(KeyTrainingTraces); ok {
			t.Fatalf("%s: stale training_traces kept", b)
		}
		if v, _ := rec.Get(KeyMaskSample); string(v) != "true" {
			t.Fatalf("%s: mask_sample %s", b, v)
		}
		raw, _ := rec.Get(KeyTokenCapture)
		var m CaptureMetrics
		if err := json.Unmarshal(raw, &m); err != nil || m.Reason != ReasonCaptureIncomplete || !m.CaptureIncomplete ||
			!strings.Contains(m.Error, "incomplete") {
			t.Fatalf("%s: metrics %s", b, raw)
		}
	}
}

// §10.3 / §2.7: zero-call captures are masked; missing or malformed
// correlation is an error; an invalid attached envelope is an error.
func TestFinalizeErrorsVersusMasks(t *testing.T) {
	_, dir := writeCapture(t, "4-2", branchingCalls())
	r, _ := NewReader(dir)
	res, err := Finalize(parseRec(t, `{"reward":0,"_ng_task_index":9,"_ng_rollout_index":9}`), r, BuilderPrefixMerging)
	if err != nil || !res.Masked || res.Reason != ReasonNothingRecorded {
		t.Fatalf("zero-call capture: %v %+v", err, res)
	}
	for _, tc := range []struct{ rec, want string }{
		{`{"reward":0}`, "rollouts.jsonl:7: gym: no capture correlation key"},
		{`{"reward":0,"_ng_rollout_id":"../../etc"}`, `rollouts.jsonl:7: field _ng_rollout_id: gym: malformed rollout id: "../../etc"`},
		{`{"reward":0,"_ng_rollout_id":"4-2","training_traces":{"schema_version":1,"rollout_id":"4-2","builder":"per_request","traces":[]}}`,
			"rollouts.jsonl:7: field training_traces: training_traces of rollout \"4-2\", field traces: must hold at least one trace"},
		{`{"reward":0,"_ng_rollout_id":"4-2","training_traces":` + string(custodyEnvelope().AppendJSON(nil)) + `}`,
			`envelope rollout_id "r" differs from the record's capture key "4-2"`},
	} {
		_, err := Finalize(parseRec(t, tc.rec), r, BuilderPrefixMerging)
		if err == nil || !strings.Contains(err.Error(), tc.want) {
			t.Errorf("%s:\n got %v\nwant %s", tc.rec, err, tc.want)
		}
	}
	// A capture line with NaN before another line masks the rollout
	// (invalid_capture); a schema-4 store masks it (unsupported_schema).
	os.WriteFile(filepath.Join(dir, "nan"+SuffixEntries), []byte(
		`{"rollout_id":"nan","model_call_id":"a","prompt_token_ids":[1],"generation_token_ids":[2],"generation_log_probs":[NaN]}`+"\n"+
			`{"rollout_id":"nan","model_call_id":"b","prompt_token_ids":[1],"generation_token_ids":[2],"generation_log_probs":[-1]}`+"\n"), 0o644)
	res, err = Finalize(parseRec(t, `{"_ng_rollout_id":"nan"}`), r, BuilderPerRequest)
	if err != nil || !res.Masked || res.Reason != ReasonInvalidCapture || !strings.Contains(res.Metrics.Error, "nan"+SuffixEntries+":1: field generation_log_probs[0]") {
		t.Fatalf("NaN capture: %v %+v", err, res)
	}
	os.WriteFile(filepath.Join(dir, "v4"+SuffixEntries),
		[]byte(`{"schema_version":4,"rollout_id":"v4","model_call_id":"a","prompt_token_ids":[1],"generation_token_ids":[2],"generation_log_probs":[-1]}`+"\n"), 0o644)
	res, err = Finalize(parseRec(t, `{"_ng_rollout_id":"v4"}`), r, BuilderPerRequest)
	if err != nil || !res.Masked || res.Reason != ReasonUnsupportedSchema || !strings.Contains(res.Metrics.Error, "v4"+SuffixEntries+":1: field schema_version") {
		t.Fatalf("schema 4 store: %v %+v", err, res)
	}
	// Upstream masks stay masked and lose a stale envelope.
	up := parseRec(t, `{"_ng_rollout_id":"4-2","mask_sample":true,"training_traces":{"x":1}}`)
	res, err = Finalize(up, r, BuilderPrefixMerging)
	if err != nil || !res.Masked || res.Reason != ReasonMaskedUpstream {
		t.Fatalf("upstream mask with a stale envelope: %v %+v", err, res)
	}
	if _, ok := up.Get(KeyTrainingTraces); ok {
		t.Fatal("stale envelope kept on an upstream-masked record")
	}
	up = parseRec(t, `{"_ng_rollout_id":"4-2","mask_sample":true,"_ng_token_capture":{"n_calls":0,"error":"nothing recorded"}}`)
	res, err = Finalize(up, r, BuilderPrefixMerging)
	if err != nil || !res.Masked || res.Reason != ReasonMaskedUpstream || res.Metrics.Error != "nothing recorded" {
		t.Fatalf("upstream mask: %v %+v", err, res)
	}
}

// Attempts use -a{n} on both the writer's and the finalizer's side.
func TestFinalizeAttemptKey(t *testing.T) {
	_, dir := writeCapture(t, "job.x-a3", branchingCalls())
	r, _ := NewReader(dir)
	res, err := Finalize(parseRec(t, `{"_ng_rollout_id":"job.x","_ng_attempt_index":3}`), r, BuilderPerRequest)
	if err != nil || res.Masked || res.RolloutID != "job.x-a3" || len(res.Envelope.Traces) != 4 {
		t.Fatalf("%v %+v", err, res)
	}
}

// TestCaptureMetricsKeepGymFloatTypes: _ng_token_capture is written with
// Gym's JSON types: the fractions are floats (1.0, 0.0), never integers,
// the counts integers, capture_incomplete a boolean. encoding/json wrote
// "delivered_fraction":1, which a type-exact reader takes for an int.
func TestCaptureMetricsKeepGymFloatTypes(t *testing.T) {
	_, dir := writeCapture(t, "4-2", branchingCalls())
	r, _ := NewReader(dir)
	rec := parseRec(t, finalRecord)
	if _, err := Finalize(rec, r, BuilderPrefixMerging); err != nil {
		t.Fatal(err)
	}
	raw, _ := rec.Get(KeyTokenCapture)
	for _, want := range []string{`"delivered_fraction":1.0,`, `"quarantined_fraction":0.0,`, `"n_calls":4,`, `"capture_incomplete":false`} {
		if !strings.Contains(string(raw), want) {
			t.Errorf("_ng_token_capture %s lacks %s", raw, want)
		}
	}
	v, err := parsePy(raw, false)
	if err != nil {
		t.Fatal(err)
	}
	kinds := map[string]pyKind{"delivered_fraction": pyFloat, "quarantined_fraction": pyFloat, "n_calls": pyInt,
		"chains": pyInt, "generated_tokens_captured": pyInt, "capture_incomplete": pyBool, "parent_link_failures": pyDict}
	for k, want := range kinds {
		if got := v.get(k); got == nil || got.kind != want {
			t.Errorf("%s: %s, want %s", k, got.typeName(), (&pyValue{kind: want}).typeName())
		}
	}
	var back CaptureMetrics
	if err := json.Unmarshal(raw, &back); err != nil {
		t.Fatal(err)
	}
	if got := back.AppendJSON(nil); string(got) != string(raw) {
		t.Fatalf("round trip:\n got %s\nwant %s", got, raw)
	}
	// The hand-written AppendJSON writes every field the struct declares,
	// but an empty omitempty one (a field it forgot would round-trip
	// unnoticed above).
	var tags, keys []string
	cv := reflect.ValueOf(back)
	for i := range cv.NumField() {
		tag, opts, _ := strings.Cut(cv.Type().Field(i).Tag.Get("json"), ",")
		if tag != "" && tag != "-" && !(opts == "omitempty" && cv.Field(i).IsZero()) {
			tags = append(tags, tag)
		}
	}
	keys = append(keys, v.keys...)
	slices.Sort(tags)
	slices.Sort(keys)
	if d := cmp.Diff(tags, keys); d != "" {
		t.Errorf("AppendJSON's keys differ from CaptureMetrics' json fields (-fields +written):\n%s", d)
	}
}
