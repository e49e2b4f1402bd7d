package gym

import (
	"encoding/json"
	"fmt"
	"strings"
	"testing"

	"github.com/google/go-cmp/cmp"
)

// messageItem is a Responses output item carrying text.
func messageItem(text string) json.RawMessage {
	return json.RawMessage(fmt.Sprintf(`{"type":"message","role":"assistant","content":[{"type":"output_text","text":%q}]}`, text))
}

// retryPair is two root calls with one prompt: the harness retried the
// first call, and only one generation reached the client.
func retryPair() []TokenEntry {
	a := call("a", toks(1, 2, 3), toks(10, 11), "")
	b := call("b", toks(1, 2, 3), toks(20, 21, 22), "")
	ra, rb := "resp-a", "resp-b"
	a.ResponseID, b.ResponseID = &ra, &rb
	a.OutputItems = []json.RawMessage{messageItem("A answers 4")}
	b.OutputItems = []json.RawMessage{messageItem("B answers 5")}
	return []TokenEntry{a, b}
}

func finalizeWith(t *testing.T, entries []TokenEntry, response string) *Finalized {
	t.Helper()
	rid := "7-0"
	_, dir := writeCapture(t, rid, entries)
	r, err := NewReader(dir)
	if err != nil {
		t.Fatal(err)
	}
	rec := parseRec(t, `{"_ng_task_index":7,"_ng_rollout_index":0,"reward":1.0,"response":`+response+`}`)
	fin, err := Finalize(rec, r, BuilderPrefixMerging)
	if err != nil {
		t.Fatal(err)
	}
	return fin
}

// TestContentWitnessRefusesMisattributedRetry is issue 11's first case:
// two retries share a prompt, the record's response.id is call a's but its
// output is call b's message. Gym's content witness names b, its
// response_id witness names a; they disagree, so nothing is attributed and
// the rollout is masked. Without the content witness, tracegrpo trained on
// a's tokens.
func TestContentWitnessRefusesMisattributedRetry(t *testing.T) {
	fin := finalizeWith(t, retryPair(), `{"id":"resp-a","output":[`+string(messageItem("B answers 5"))+`]}`)
	if !fin.Masked || fin.Reason != ReasonTerminalDisagreement {
		t.Fatalf("got masked=%v reason=%q, want masked with %s (envelope %+v)", fin.Masked, fin.Reason, ReasonTerminalDisagreement, fin.Envelope)
	}
	ta := fin.Metrics.TerminalAttribution
	if ta == nil || !strings.Contains(ta.Reason, "witness_disagreement[response_id=a;content_output=b]") {
		t.Fatalf("terminal_attribution does not record the disagreement: %+v", ta)
	}
}

// TestContentWitnessAloneResolvesRetry: with no response id, the content of
// the scored response names the kept retry, as in Gym; the abandoned
// sibling is quarantined and the kept one trains.
func TestContentWitnessAloneResolvesRetry(t *testing.T) {
	for _, tc := range []struct {
		name, response, want, method string
	}{
		{"own output", `{"output":[` + string(messageItem("B answers 5")) + `]}`, "b", "content_output"},
		{"merged transcript tail", `{"id":"","output":[{"role":"user","content":"q"},` + string(messageItem("B answers 5")) + `]}`, "b", "content_output"},
		{"unmatched id abstains", `{"id":"resp-zz","output":[` + string(messageItem("A answers 4")) + `]}`, "a", "content_output"},
	} {
		t.Run(tc.name, func(t *testing.T) {
			fin := finalizeWith(t, retryPair(), tc.response)
			if fin.Masked {
				t.Fatalf("masked: %s", fin.Metrics.Error)
			}
			if got := traceCallIDs(fin.Envelope); !cmp.Equal(got, [][]string{{tc.want}}) {
				t.Fatalf("traces %v, want only %s", got, tc.want)
			}
			if ta := fin.Metrics.TerminalAttribution; ta.CallID != tc.want || ta.Method != tc.method {
				t.Fatalf("attribution %+v, want %s by %s", ta, tc.want, tc.method)
			}
		})
	}
}

// TestContentWitnessCumulativeFingerprint: an entry's recorded
// continuation_fingerprint matches a full-transcript response; a stale
// fingerprint_version never does.
func TestContentWitnessCumulativeFingerprint(t *testing.T) {
	transcript := `[{"role":"assistant","content":"plan"},{"role":"tool","content":"r"},{"role":"assistant","content":"done"}]`
	list, err := parsePy([]byte(transcript), false)
	if err != nil {
		t.Fatal(err)
	}
	fp, err := assistantFingerprint(list.list)
	if err != nil || fp == "" {
		t.Fatal(fp, err)
	}
	for _, tc := range []struct {
		version *int
		want    string
	}{{nil, "b"}, {intp(FingerprintVersion), "b"}, {intp(2), ""}} {
		entries := retryPair()
		entries[1].ContinuationFingerprint = fp
		entries[1].FingerprintVersion = tc.version
		entries[0].OutputItems, entries[1].OutputItems = nil, nil
		att := ResolveTerminal(entries, TerminalWitnesses{HaveResponse: true, ResponseOutput: json.RawMessage(transcript)})
		if att.CallID != tc.want || (tc.want != "" && att.Method != "content_cumulative") {
			t.Errorf("version %v: %+v, want %q", tc.version, att, tc.want)
		}
	}
}

// TestContentWitnessCrashMasks: where Gym's fingerprint raises
// AttributeError (a string in tool_calls), Gym's attribution cannot finish;
// tracegrpo masks the rollout instead of guessing.
func TestContentWitnessCrashMasks(t *testing.T) {
	fin := finalizeWith(t, retryPair(), `{"id":"resp-a","output":[{"role":"assistant","tool_calls":["x"]}]}`)
	if !fin.Masked || fin.Reason != ReasonTerminalUnavailable || !strings.Contains(fin.Metrics.Error, "content_witness_raises") {
		t.Fatalf("got %+v", fin)
	}
}

func intp(v int) *int { return &v }
