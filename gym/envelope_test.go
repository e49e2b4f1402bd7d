package gym

import (
	"encoding/json"
	"errors"
	"math"
	"strings"
	"testing"

	"github.com/google/go-cmp/cmp"
)

// custodyEnvelope is a valid two-trace envelope: the merged trace [1..6]
// with spans (2,3),(4,6) is split as in spec §10.1 item 7 plus a sibling.
func custodyEnvelope() *TrainingTraceBatch {
	return &TrainingTraceBatch{SchemaVersion: 1, RolloutID: "r", Builder: BuilderPrefixMerging, Traces: []TrainingTrace{
		{TraceID: "r:b", ModelCallIDs: []string{"a", "b"}, TokenIDs: toks(1, 2, 3, 4, 5, 6),
			GenerationLogprobs: []float64{0, 0, -0.5, 0, -0.25, -0.125}, LossMask: []int8{0, 0, 1, 0, 1, 1},
			SampledSpans: []SampledSpan{{"a", 2, 3}, {"b", 4, 6}}},
		{TraceID: "r:c", ModelCallIDs: []string{"c"}, TokenIDs: toks(7, 8, 9),
			GenerationLogprobs: []float64{0, -1, -2}, LossMask: []int8{0, 1, 1},
			SampledSpans: []SampledSpan{{"c", 1, 3}}},
	}}
}

func cloneEnvelope(b *TrainingTraceBatch) *TrainingTraceBatch {
	out, err := DecodeTrainingTraces(b.AppendJSON(nil))
	if err != nil {
		panic(err)
	}
	return out
}

func TestEnvelopeValidAndRoundTrip(t *testing.T) {
	b := custodyEnvelope()
	if err := b.Validate(); err != nil {
		t.Fatal(err)
	}
	raw, err := json.Marshal(b)
	if err != nil {
		t.Fatal(err)
	}
	if !strings.Contains(string(raw), `"generation_logprobs":[0.0,0.0,-0.5,0.0,-0.25,-0.125]`) {
		t.Fatalf("logprobs not written as floats: %s", raw)
	}
	var back TrainingTraceBatch
	if err := json.Unmarshal(raw, &back); err != nil {
		t.Fatal(err)
	}
	if d := cmp.Diff(*b, back); d != "" {
		t.Fatalf("(-want +got)\n%s", d)
	}
	// The encoding agrees with encoding/json's reading of the same struct.
	var generic map[string]any
	if err := json.Unmarshal(raw, &generic); err != nil || generic["builder"] != "prefix_merging" {
		t.Fatalf("generic decode: %v %v", err, generic)
	}
}

// §10.2 item 17 (the ten wire-contract rejections) and §10.1 item 5 (the six
// bad-custody mutations), each checked on the struct validator and on the
// JSON decoder, with the field and position named.
func TestEnvelopeWireContractRejections(t *testing.T) {
	cases := []struct {
		name   string
		mutate func(b *TrainingTraceBatch)
		want   string // substring of the error: trace, field, position
	}{
		// §10.2 item 17
		{"double owner", func(b *TrainingTraceBatch) {
			b.Traces[1].ModelCallIDs = append(b.Traces[1].ModelCallIDs, "b")
			b.Traces[1].TokenIDs = append(b.Traces[1].TokenIDs, 1, 2)
			b.Traces[1].GenerationLogprobs = append(b.Traces[1].GenerationLogprobs, -1, -1)
			b.Traces[1].LossMask = append(b.Traces[1].LossMask, 1, 1)
			b.Traces[1].SampledSpans = append(b.Traces[1].SampledSpans, SampledSpan{"b", 3, 5})
		}, `trace 1 ("r:c"), field sampled_spans[1].model_call_id: call "b" already owns a span in trace 0`},
		{"span outside", func(b *TrainingTraceBatch) { b.Traces[1].SampledSpans[0].End = 4 }, `trace 1 ("r:c"), field sampled_spans[0]: span [1, 4) must satisfy start < end <= 3`},
		{"unowned mask bit", func(b *TrainingTraceBatch) { b.Traces[0].LossMask[3] = 1 }, `trace 0 ("r:b"), field loss_mask[3]: sampled spans must exactly cover`},
		{"first-token mask", func(b *TrainingTraceBatch) { b.Traces[1].LossMask[0] = 1 }, `field loss_mask[0]: the first position is conditioning`},
		{"NaN", func(b *TrainingTraceBatch) { b.Traces[0].GenerationLogprobs[4] = math.NaN() }, `field generation_logprobs[4]: must be finite`},
		{"length mismatch", func(b *TrainingTraceBatch) { b.Traces[0].LossMask = b.Traces[0].LossMask[:5] }, `lengths must match (6, 6, 5)`},
		{"duplicate call ids", func(b *TrainingTraceBatch) { b.Traces[0].ModelCallIDs = []string{"a", "b", "a"} }, `field model_call_ids[2]: duplicate model call id "a"`},
		{"overlapping spans", func(b *TrainingTraceBatch) {
			b.Traces[0].SampledSpans[0] = SampledSpan{"a", 2, 5}
			b.Traces[0].LossMask = []int8{0, 0, 1, 1, 1, 1}
		}, `overlaps another span at position 4`},
		{"duplicate trace ids", func(b *TrainingTraceBatch) { b.Traces[1].TraceID = "r:b" }, `field trace_id: duplicate trace id (also trace 0)`},
		{"referenced call with no owner", func(b *TrainingTraceBatch) { b.Traces[1].ModelCallIDs = []string{"c", "z"} }, `field model_call_ids[1]: call "z" is referenced but owns no span`},
		// §10.1 item 5
		{"schema_version 2", func(b *TrainingTraceBatch) { b.SchemaVersion = 2 }, `field schema_version: expected 1, found 2`},
		{"misaligned token_ids", func(b *TrainingTraceBatch) { b.Traces[0].TokenIDs = b.Traces[0].TokenIDs[:5] }, `lengths must match (5, 6, 6)`},
		{"span end out of range", func(b *TrainingTraceBatch) { b.Traces[0].SampledSpans[1].End = 7 }, `span [4, 7) must satisfy start < end <= 6`},
		{"duplicated trace", func(b *TrainingTraceBatch) {
			dup := b.Traces[1]
			dup.TraceID = "r:c-copy"
			b.Traces = append(b.Traces, dup)
		}, `trace 2 ("r:c-copy"), field sampled_spans[0].model_call_id: call "c" already owns a span`},
		// further invariants
		{"negative token", func(b *TrainingTraceBatch) { b.Traces[0].TokenIDs[1] = -1 }, `field token_ids[1]`},
		{"mask value 2", func(b *TrainingTraceBatch) { b.Traces[0].LossMask[2] = 2 }, `loss_mask[2]: must be 0 or 1`},
		{"span call not in trace", func(b *TrainingTraceBatch) { b.Traces[1].SampledSpans[0].ModelCallID = "a" }, `is not in this trace's model_call_ids`},
		{"span start 0", func(b *TrainingTraceBatch) { b.Traces[1].SampledSpans[0].Start = 0 }, `sampled_spans[0].start: must be >= 1`},
		{"no owned position", func(b *TrainingTraceBatch) {
			b.Traces[1].SampledSpans = nil
			b.Traces[1].LossMask = []int8{0, 0, 0}
			b.Traces[1].ModelCallIDs = nil
		}, `trace 1 ("r:c"), field sampled_spans: a trace must own at least one position`},
		{"empty trace id", func(b *TrainingTraceBatch) { b.Traces[0].TraceID = "" }, `field trace_id: must be a non-empty string`},
		{"bad builder", func(b *TrainingTraceBatch) { b.Builder = "main_chain" }, `field builder`},
		{"no traces", func(b *TrainingTraceBatch) { b.Traces = nil }, `field traces: must hold at least one trace`},
		{"empty rollout id", func(b *TrainingTraceBatch) { b.RolloutID = "" }, `field rollout_id`},
	}
	for _, tc := range cases {
		t.Run(tc.name, func(t *testing.T) {
			b := cloneEnvelope(custodyEnvelope())
			tc.mutate(b)
			err := b.Validate()
			if err == nil || !errors.Is(err, ErrInvalidEnvelope) || !strings.Contains(err.Error(), tc.want) {
				t.Fatalf("Validate: %v\nwant substring %q", err, tc.want)
			}
			if !strings.Contains(err.Error(), `rollout "`) {
				t.Fatalf("error does not name the rollout: %v", err)
			}
			// The same mutation through JSON (NaN has no JSON form; it is
			// checked by TestEnvelopeDecodeTypeExact).
			if tc.name == "NaN" {
				return
			}
			if _, err := DecodeTrainingTraces(b.AppendJSON(nil)); err == nil {
				t.Fatalf("DecodeTrainingTraces accepted the mutation")
			}
		})
	}
}

func TestEnvelopeDecodeTypeExact(t *testing.T) {
	good := string(custodyEnvelope().AppendJSON(nil))
	cases := []struct {
		name, from, to, want string
	}{
		{"schema bool", `"schema_version":1`, `"schema_version":true`, `field schema_version: expected an integer, found a boolean`},
		{"schema float", `"schema_version":1`, `"schema_version":1.0`, `field schema_version: expected an integer, found number 1.0`},
		{"token bool", `"token_ids":[1,2`, `"token_ids":[true,2`, `trace 0 ("r:b"), field token_ids[0]: expected an integer, found a boolean`},
		{"token float", `"token_ids":[7,8`, `"token_ids":[7.0,8`, `field token_ids[0]: expected an integer`},
		{"mask bool", `"loss_mask":[0,1,1]`, `"loss_mask":[0,true,1]`, `field loss_mask[1]: expected an integer, found a boolean`},
		{"mask float", `"loss_mask":[0,1,1]`, `"loss_mask":[0,1.0,1]`, `field loss_mask[1]: expected an integer`},
		{"span start float", `"start":1,`, `"start":1.0,`, `sampled_spans[0].start: expected an integer`},
		{"span end bool", `"start":1,"end":3`, `"start":1,"end":true`, `sampled_spans[0].end: expected an integer, found a boolean`},
		{"logprob string", `-0.5,`, `"-0.5",`, `field generation_logprobs[2]: expected a finite number, found a string`},
		{"logprob NaN literal", `-0.5,`, `NaN,`, `generation_logprobs[2]`},
		{"logprob bool", `-0.5,`, `false,`, `found a boolean`},
		{"extra batch field", `"builder":`, `"extra":1,"builder":`, `field extra: unknown field`},
		{"extra trace field", `"trace_id":"r:c"`, `"trace_id":"r:c","weight":2`, `trace 1 ("r:c"), field weight: unknown field`},
		{"extra span field", `"end":6}`, `"end":6,"w":1}`, `sampled_spans[1].w: unknown field`},
		{"call id not string", `"model_call_ids":["c"]`, `"model_call_ids":[3]`, `field model_call_ids[0]: expected a string`},
		{"duplicate key", `"builder":"prefix_merging"`, `"builder":"prefix_merging","builder":"per_request"`, `duplicate key`},
		{"missing traces", `,"traces":[`, `,"x_traces":[`, `unknown field`},
	}
	for _, tc := range cases {
		t.Run(tc.name, func(t *testing.T) {
			if !strings.Contains(good, tc.from) {
				t.Fatalf("fixture lacks %q: %s", tc.from, good)
			}
			bad := strings.Replace(good, tc.from, tc.to, 1)
			_, err := DecodeTrainingTraces([]byte(bad))
			if err == nil || !strings.Contains(err.Error(), tc.want) {
				t.Fatalf("got %v\nwant substring %q\ninput %s", err, tc.want, bad)
			}
		})
	}
	// Logprobs may be JSON integers (Python int is accepted for float).
	b, err := DecodeTrainingTraces([]byte(strings.Replace(good, `[0.0,-1.0,-2.0]`, `[0,-1,-2]`, 1)))
	if err != nil || b.Traces[1].GenerationLogprobs[2] != -2 {
		t.Fatalf("integer logprobs: %v", err)
	}
	// schema_version may be omitted (it defaults to 1), the others may not.
	if _, err := DecodeTrainingTraces([]byte(strings.Replace(good, `"schema_version":1,`, ``, 1))); err != nil {
		t.Fatalf("omitted schema_version: %v", err)
	}
	if _, err := DecodeTrainingTraces([]byte(strings.Replace(good, `"builder":"prefix_merging",`, ``, 1))); err == nil ||
		!strings.Contains(err.Error(), "field builder: required field is missing") {
		t.Fatalf("omitted builder: %v", err)
	}
}
