package main

import (
	"bytes"
	"encoding/json"
	"os"
	"path/filepath"
	"slices"
	"strings"
	"syscall"
	"testing"

	"github.com/tracegrpo/tracegrpo/gym"
)

func stampedCall(rid, id string, prompt, gen []int32, parent string) *gym.TokenEntry {
	e := &gym.TokenEntry{SchemaVersion: 3, RolloutID: rid, ModelCallID: id, Model: "policy",
		PromptTokenIDs: prompt, GenerationTokenIDs: gen}
	for i := range gen {
		e.GenerationLogProbs = append(e.GenerationLogProbs, -0.5-float64(i))
	}
	e.Stamp()
	if parent == "" {
		r := gym.ParentRoot
		e.ParentResolution = &r
	} else {
		r := gym.ParentResolved
		e.ParentResolution, e.ParentCallID = &r, &parent
	}
	return e
}

// tracesFixture writes a capture store and a rollouts file: rollout 0-0 is
// the spec §3.4 example, 0-1 is incomplete (a dangling intent), 0-2 has
// nothing captured.
func tracesFixture(t *testing.T, extraRecord string) (captures, rollouts string) {
	t.Helper()
	dir := t.TempDir()
	captures = filepath.Join(dir, "captures")
	w, err := gym.NewWriter(captures)
	if err != nil {
		t.Fatal(err)
	}
	w.SetFsync(false)
	for _, e := range []*gym.TokenEntry{
		stampedCall("0-0", "a", []int32{1, 2}, []int32{10, 11}, ""),
		stampedCall("0-0", "b", []int32{1, 2, 10, 11, 3}, []int32{12}, "a"),
		stampedCall("0-0", "c", []int32{1, 2, 10, 11, 4}, []int32{13, 14}, "a"),
		stampedCall("0-0", "d", []int32{5, 6}, []int32{15}, ""),
		stampedCall("0-1", "a", []int32{1}, []int32{2}, ""),
	} {
		if err := w.Put(e); err != nil {
			t.Fatal(err)
		}
	}
	if err := w.BeginCall("0-1", "lost"); err != nil {
		t.Fatal(err)
	}
	rollouts = filepath.Join(dir, "rollouts.jsonl")
	recs := `{"reward":1.0,"response":{"output":[]},"_ng_task_index":0,"_ng_rollout_index":0}
{"reward":0.0,"_ng_task_index":0,"_ng_rollout_index":1,"training_traces":{"stale":true}}
{"reward":0.5,"_ng_task_index":0,"_ng_rollout_index":2}
` + extraRecord
	if err := os.WriteFile(rollouts, []byte(recs), 0o644); err != nil {
		t.Fatal(err)
	}
	return captures, rollouts
}

func TestTracesCommand(t *testing.T) {
	for _, builder := range []string{gym.BuilderPrefixMerging, gym.BuilderPerRequest} {
		t.Run(builder, func(t *testing.T) {
			captures, rollouts := tracesFixture(t, "")
			out := filepath.Join(filepath.Dir(rollouts), "out.jsonl")
			var stdout, stderr bytes.Buffer
			code := run([]string{"traces", "--captures", captures, "--rollouts", rollouts, "--builder", builder,
				"--out", out, "--rebuild"}, &stdout, &stderr)
			if code != 0 {
				t.Fatalf("exit %d: %s", code, stderr.String())
			}
			b, _ := os.ReadFile(out)
			lines := strings.Split(strings.TrimSpace(string(b)), "\n")
			if len(lines) != 3 {
				t.Fatalf("%d output lines", len(lines))
			}
			var recs []map[string]any
			for _, l := range lines {
				var m map[string]any
				if err := json.Unmarshal([]byte(l), &m); err != nil {
					t.Fatal(err)
				}
				recs = append(recs, m)
			}
			env, ok := recs[0]["training_traces"].(map[string]any)
			wantTraces := map[string]int{gym.BuilderPrefixMerging: 3, gym.BuilderPerRequest: 4}[builder]
			if !ok || len(env["traces"].([]any)) != wantTraces || env["builder"] != builder || recs[0]["reward"] != 1.0 {
				t.Fatalf("rollout 0-0: %v", recs[0])
			}
			if recs[1]["mask_sample"] != true || recs[1]["training_traces"] != nil ||
				recs[1]["_ng_token_capture"].(map[string]any)["reason"] != gym.ReasonCaptureIncomplete {
				t.Fatalf("rollout 0-1: %v", recs[1])
			}
			if recs[2]["mask_sample"] != true || recs[2]["_ng_token_capture"].(map[string]any)["reason"] != gym.ReasonNothingRecorded {
				t.Fatalf("rollout 0-2: %v", recs[2])
			}
			for _, want := range []string{"3 rollouts, 1 delivered", "masked capture_incomplete", "masked nothing_recorded"} {
				if !strings.Contains(stderr.String(), want) {
					t.Fatalf("summary lacks %q:\n%s", want, stderr.String())
				}
			}
			// Feeding the output back validates the attached envelopes.
			stdout.Reset()
			stderr.Reset()
			code = run([]string{"traces", "--captures", captures, "--rollouts", out}, &stdout, &stderr)
			if code != 0 || !strings.Contains(stderr.String(), "(1 already attached)") {
				t.Fatalf("re-run exit %d: %s", code, stderr.String())
			}
			if stdout.String() != string(b) {
				t.Fatalf("re-run changed records:\n%s\nvs\n%s", stdout.String(), b)
			}
		})
	}
}

func TestTracesCommandErrors(t *testing.T) {
	cases := []struct {
		name, extra string
		args        []string
		code        int
		want        string
	}{
		{"no key", `{"reward":1}` + "\n", nil, 1, "rollouts.jsonl:4: gym: no capture correlation key"},
		{"malformed id", `{"_ng_rollout_id":"a/../b"}` + "\n", nil, 1, `rollouts.jsonl:4: field _ng_rollout_id: gym: malformed rollout id`},
		{"bad json", `{"reward":1,}` + "\n", nil, 1, "rollouts.jsonl:4:"},
		{"bad index type", `{"_ng_task_index":1.5,"_ng_rollout_index":0}` + "\n", nil, 1, "rollouts.jsonl:4: field _ng_task_index: expected an integer, found number 1.5"},
		{"bad builder", "", []string{"--builder", "main_chain"}, 2, "--builder must be"},
	}
	for _, tc := range cases {
		t.Run(tc.name, func(t *testing.T) {
			captures, rollouts := tracesFixture(t, tc.extra)
			var stdout, stderr bytes.Buffer
			args := append([]string{"traces", "--rebuild", "--captures", captures, "--rollouts", rollouts}, tc.args...)
			code := run(args, &stdout, &stderr)
			if code != tc.code || !strings.Contains(stderr.String(), tc.want) {
				t.Fatalf("exit %d, stderr:\n%s\nwant %d and %q", code, stderr.String(), tc.code, tc.want)
			}
		})
	}
	var stdout, stderr bytes.Buffer
	if code := run([]string{"traces", "--rollouts", "x"}, &stdout, &stderr); code != 2 {
		t.Fatalf("missing --captures: exit %d", code)
	}
	if code := run([]string{"traces", "--help"}, &stdout, &stderr); code != 0 || !strings.Contains(stdout.String(), "--builder") {
		t.Fatalf("--help: exit %d %s", code, stdout.String())
	}
}

// §10.2 item 16: prefix_merging is the default builder; the output does not
// depend on --jobs; a stale attached envelope that violates the wire
// contract is an error naming the file, line and field (without --rebuild).
func TestTracesDefaultsJobsAndAttachedEnvelope(t *testing.T) {
	captures, rollouts := tracesFixture(t, "")
	var outs []string
	for _, jobs := range []string{"1", "3"} {
		var stdout, stderr bytes.Buffer
		if code := run([]string{"traces", "--rebuild", "--jobs", jobs, "--captures", captures, "--rollouts", rollouts}, &stdout, &stderr); code != 0 {
			t.Fatalf("jobs %s: exit %d %s", jobs, code, stderr.String())
		}
		outs = append(outs, stdout.String())
	}
	if outs[0] != outs[1] {
		t.Fatal("output depends on --jobs")
	}
	if !strings.Contains(outs[0], `"builder":"prefix_merging"`) {
		t.Fatalf("default builder is not prefix_merging: %.300s", outs[0])
	}
	var stdout, stderr bytes.Buffer
	code := run([]string{"traces", "--captures", captures, "--rollouts", rollouts}, &stdout, &stderr)
	if code != 1 || !strings.Contains(stderr.String(), "rollouts.jsonl:2: field training_traces:") ||
		!strings.Contains(stderr.String(), "field stale: unknown field") {
		t.Fatalf("exit %d: %s", code, stderr.String())
	}
	// The record before the bad one was still written.
	if n := strings.Count(stdout.String(), "\n"); n != 1 {
		t.Fatalf("%d records written before the error", n)
	}
}

// TestTracesOutIsNeverAnInput: --out naming the rollouts file (by the same
// path, another spelling, a hard or a symbolic link) is refused and the
// input keeps every byte; it was truncated to 0 bytes with exit 0.
func TestTracesOutIsNeverAnInput(t *testing.T) {
	caps, recs := tracesFixture(t, "")
	orig, err := os.ReadFile(recs)
	if err != nil {
		t.Fatal(err)
	}
	dir := filepath.Dir(recs)
	hard, sym := filepath.Join(dir, "hard.jsonl"), filepath.Join(dir, "sym.jsonl")
	os.Link(recs, hard)
	os.Symlink(recs, sym)
	for _, out := range []string{recs, filepath.Join(dir, ".", "x", "..", filepath.Base(recs)), hard, sym} {
		var stderr bytes.Buffer
		code := run([]string{"traces", "--captures", caps, "--rollouts", recs, "--out", out}, &bytes.Buffer{}, &stderr)
		if code != 2 || !strings.Contains(stderr.String(), "output is one of the inputs") {
			t.Errorf("--out %s: exit %d, %q; want a usage error", out, code, stderr.String())
		}
		if b, _ := os.ReadFile(recs); !bytes.Equal(b, orig) {
			t.Fatalf("--out %s changed the input to %d bytes", out, len(b))
		}
	}
}

// TestTracesFailureLeavesNoPartialOutput: a run that fails part-way (a bad
// record after good ones) leaves the previous output untouched and no
// temporary file behind; before, the good records' lines were left in a
// truncated output.
func TestTracesFailureLeavesNoPartialOutput(t *testing.T) {
	caps, recs := tracesFixture(t, `{"reward": 1, "_ng_task_index": "zero"}`+"\n")
	dir := t.TempDir()
	out := filepath.Join(dir, "out.jsonl")
	os.WriteFile(out, []byte("previous\n"), 0o644)
	var stderr bytes.Buffer
	if code := run([]string{"traces", "--captures", caps, "--rollouts", recs, "--out", out, "--jobs", "1"}, &bytes.Buffer{}, &stderr); code != 1 {
		t.Fatalf("exit %d, want 1: %s", code, stderr.String())
	}
	if !strings.Contains(stderr.String(), "nothing written to") {
		t.Errorf("error does not say the output was not written: %s", stderr.String())
	}
	if b, _ := os.ReadFile(out); string(b) != "previous\n" {
		t.Errorf("a failed run changed the output: %q", b)
	}
	if ents, _ := os.ReadDir(dir); len(ents) != 1 {
		t.Errorf("files left in the output directory: %v", ents)
	}
}

// TestTracesMasksDamagedRollouts: damage to one rollout's capture files (a
// schema-2 line, a corrupt state file, a FIFO, a corrupt .zst) masks that
// rollout with a reason code counted on stderr; every record still gets its
// output line and the run exits 0. A record without a correlation key
// stays a hard error.
func TestTracesMasksDamagedRollouts(t *testing.T) {
	extra := `{"reward":1.0,"_ng_task_index":0,"_ng_rollout_index":3}
{"reward":1.0,"_ng_task_index":0,"_ng_rollout_index":4}
{"reward":1.0,"_ng_task_index":0,"_ng_rollout_index":5}
{"reward":1.0,"_ng_task_index":0,"_ng_rollout_index":6}
`
	captures, rollouts := tracesFixture(t, extra)
	good, err := os.ReadFile(filepath.Join(captures, "0-0"+gym.SuffixEntries))
	if err != nil {
		t.Fatal(err)
	}
	as := func(rid string) []byte {
		return bytes.ReplaceAll(good, []byte(`"rollout_id":"0-0"`), []byte(`"rollout_id":"`+rid+`"`))
	}
	base := func(rid string) string { return filepath.Join(captures, rid) }
	os.WriteFile(base("0-3")+gym.SuffixEntries, bytes.ReplaceAll(as("0-3"), []byte(`"schema_version":3`), []byte(`"schema_version":2`)), 0o644)
	os.WriteFile(base("0-4")+gym.SuffixEntries, as("0-4"), 0o644)
	os.WriteFile(base("0-4")+gym.SuffixState, []byte("{not json"), 0o644)
	if err := syscall.Mkfifo(base("0-5")+gym.SuffixEntries, 0o644); err != nil {
		t.Fatal(err)
	}
	os.WriteFile(base("0-6")+gym.SuffixEntriesZst, []byte("\x28\xb5\x2f\xfd\x00garbage"), 0o644)
	var stdout, stderr bytes.Buffer
	if code := run([]string{"traces", "--rebuild", "--captures", captures, "--rollouts", rollouts}, &stdout, &stderr); code != 0 {
		t.Fatalf("exit %d: %s", code, stderr.String())
	}
	lines := strings.Split(strings.TrimSpace(stdout.String()), "\n")
	if len(lines) != 7 {
		t.Fatalf("%d output lines for 7 records", len(lines))
	}
	want := []string{"", gym.ReasonCaptureIncomplete, gym.ReasonNothingRecorded, gym.ReasonUnsupportedSchema,
		gym.ReasonInvalidState, gym.ReasonNotRegularFile, gym.ReasonInvalidCapture}
	for i, l := range lines {
		var m struct {
			Mask    bool `json:"mask_sample"`
			Capture struct {
				Reason string `json:"reason"`
			} `json:"_ng_token_capture"`
		}
		if err := json.Unmarshal([]byte(l), &m); err != nil {
			t.Fatal(err)
		}
		if m.Capture.Reason != want[i] || m.Mask != (want[i] != "") {
			t.Errorf("record %d: mask %v reason %q, want %q", i+1, m.Mask, m.Capture.Reason, want[i])
		}
	}
	for _, r := range want[1:] {
		if !strings.Contains(stderr.String(), "masked "+r) {
			t.Errorf("summary does not count %s:\n%s", r, stderr.String())
		}
	}
}

// TestTracesPassesGymRecordThrough: a record Gym already finalized passes
// through train traces with every field byte-identical (Python's json.dumps
// spacing inside values, \u escapes, 1.0 floats, key order); with --rebuild
// every field tracegrpo does not own is byte-identical.
func TestTracesPassesGymRecordThrough(t *testing.T) {
	captures, rollouts := tracesFixture(t, "")
	var stdout, stderr bytes.Buffer
	if code := run([]string{"traces", "--rebuild", "--captures", captures, "--rollouts", rollouts}, &stdout, &stderr); code != 0 {
		t.Fatalf("exit %d: %s", code, stderr.String())
	}
	first := strings.SplitN(stdout.String(), "\n", 2)[0]
	built, err := gym.ParseRecord([]byte(first))
	if err != nil {
		t.Fatal(err)
	}
	env, _ := built.Get(gym.KeyTrainingTraces)
	gymLine := `{"z_last": {"a": [1, 2.50, 1.0], "s": "caf\u00e9 \ud83d\ude00"}, "reward": 1.0, "response": {"id": "resp-1", "output": []}, ` +
		`"_ng_task_index": 0, "_ng_rollout_index": 0, "mask_sample": false, ` +
		`"_ng_token_capture": {"n_calls": 4, "delivered_fraction": 1.0, "parent_link_failures": {}, "error": null}, ` +
		`"training_traces": ` + string(env) + `}` + "\n"
	in := filepath.Join(t.TempDir(), "gym.jsonl")
	os.WriteFile(in, []byte(gymLine), 0o644)
	src, _ := gym.ParseRecord([]byte(gymLine))
	for _, rebuild := range []bool{false, true} {
		stdout.Reset()
		args := []string{"traces", "--captures", captures, "--rollouts", in}
		if rebuild {
			args = append(args, "--rebuild")
		}
		if code := run(args, &stdout, &stderr); code != 0 {
			t.Fatalf("rebuild=%v: exit %d: %s", rebuild, code, stderr.String())
		}
		out, err := gym.ParseRecord(bytes.TrimSpace(stdout.Bytes()))
		if err != nil {
			t.Fatal(err)
		}
		if !slices.Equal(src.Keys(), out.Keys()) {
			t.Fatalf("rebuild=%v: keys %v, want %v", rebuild, out.Keys(), src.Keys())
		}
		for _, k := range src.Keys() {
			owned := k == gym.KeyTrainingTraces || k == gym.KeyMaskSample || k == gym.KeyTokenCapture
			a, _ := src.Get(k)
			b, _ := out.Get(k)
			if (!rebuild || !owned) && !bytes.Equal(a, b) {
				t.Errorf("rebuild=%v: field %s changed:\n got %s\nwant %s", rebuild, k, b, a)
			}
		}
	}
}
