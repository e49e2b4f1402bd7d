package gym

import (
	"encoding/json"
	"errors"
	"math"
	"math/rand/v2"
	"os"
	"strings"
	"testing"

	"github.com/google/go-cmp/cmp"
	"github.com/google/go-cmp/cmp/cmpopts"
)

// goldenDigests is gym/testdata/golden_digest.json, written by
// scripts/golden_digest.py (Python hashlib).
type goldenDigests struct {
	Metadata map[string]any `json:"metadata"`
	Vectors  []struct {
		Name   string  `json:"name"`
		Tokens []int64 `json:"tokens"`
		Digest string  `json:"digest"`
	} `json:"vectors"`
}

func TestComputeDigestMatchesPythonHashlib(t *testing.T) {
	b, err := os.ReadFile("testdata/golden_digest.json")
	if err != nil {
		t.Fatal(err)
	}
	var g goldenDigests
	if err := json.Unmarshal(b, &g); err != nil {
		t.Fatal(err)
	}
	if g.Metadata["script"] != "scripts/golden_digest.py" || g.Metadata["library"] == nil || g.Metadata["seed"] == nil {
		t.Fatalf("golden metadata lacks script/library/seed: %v", g.Metadata)
	}
	if len(g.Vectors) < 10 {
		t.Fatalf("only %d golden vectors", len(g.Vectors))
	}
	for _, v := range g.Vectors {
		toks := make([]int32, len(v.Tokens))
		for i, x := range v.Tokens {
			toks[i] = int32(x)
		}
		if got := ComputeDigest(toks); got != v.Digest {
			t.Errorf("%s: ComputeDigest = %s, want %s", v.Name, got, v.Digest)
		}
		// The split form used by the builders agrees at every split point.
		for _, cut := range []int{0, len(toks) / 2, len(toks)} {
			if got, ok := digestOfConcat(toks[:cut], toks[cut:]); !ok || got != v.Digest {
				t.Errorf("%s: digestOfConcat split %d = %s, want %s", v.Name, cut, got, v.Digest)
			}
		}
	}
}

func TestComputeDigestRejectsNegative(t *testing.T) {
	if _, ok := ComputeDigestChecked([]int32{1, -1}); ok {
		t.Fatal("negative token accepted")
	}
	defer func() {
		if recover() == nil {
			t.Fatal("ComputeDigest did not panic on a negative token")
		}
	}()
	ComputeDigest([]int32{-5})
}

const validEntryLine = `{"schema_version":3,"rollout_id":"r1","model_call_id":"c1","model":"m",` +
	`"prompt_token_ids":[1,2],"generation_token_ids":[10,11],"generation_log_probs":[-0.5,-1.25],` +
	`"parent_resolution":"root","created_at":12.5}`

func TestDecodeTokenEntryValid(t *testing.T) {
	e, err := DecodeTokenEntry([]byte(validEntryLine))
	if err != nil {
		t.Fatal(err)
	}
	root := ParentRoot
	want := &TokenEntry{SchemaVersion: 3, RolloutID: "r1", ModelCallID: "c1", Model: "m",
		PromptTokenIDs: []int32{1, 2}, GenerationTokenIDs: []int32{10, 11}, GenerationLogProbs: []float64{-0.5, -1.25},
		ParentResolution: &root, CreatedAt: 12.5}
	if d := cmp.Diff(want, e); d != "" {
		t.Fatalf("(-want +got)\n%s", d)
	}
}

func TestDecodeTokenEntryDefaultsAndExtras(t *testing.T) {
	line := `{"rollout_id":"r","model_call_id":"c","prompt_token_ids":[],"generation_token_ids":[],` +
		`"generation_log_probs":[],"future_field":{"b":[1, 2.5],"a":null},"note":"x"}`
	e, err := DecodeTokenEntry([]byte(line))
	if err != nil {
		t.Fatal(err)
	}
	if e.SchemaVersion != 3 || e.Model != "" || e.CumLen != nil || e.PromptIsDelta {
		t.Fatalf("defaults wrong: %+v", e)
	}
	if string(e.Extra["future_field"]) != `{"b":[1,2.5],"a":null}` || string(e.Extra["note"]) != `"x"` {
		t.Fatalf("extras not preserved: %q", e.Extra)
	}
	// Round trip: the encoded line decodes to the same entry, extras included.
	back, err := DecodeTokenEntry(e.AppendJSON(nil))
	if err != nil {
		t.Fatal(err)
	}
	if d := cmp.Diff(e, back, cmpopts.EquateEmpty()); d != "" {
		t.Fatalf("round trip (-want +got)\n%s", d)
	}
	if !strings.Contains(string(e.AppendJSON(nil)), `"future_field":{"b":[1,2.5],"a":null}`) {
		t.Fatalf("extra not re-encoded verbatim: %s", e.AppendJSON(nil))
	}
}

func TestDecodeTokenEntryRejects(t *testing.T) {
	base := map[string]string{
		"schema_version": "3", "rollout_id": `"r"`, "model_call_id": `"c"`,
		"prompt_token_ids": "[1,2]", "generation_token_ids": "[3]", "generation_log_probs": "[-0.1]",
	}
	build := func(over map[string]string) []byte {
		m := map[string]string{}
		for k, v := range base {
			m[k] = v
		}
		for k, v := range over {
			if v == "<drop>" {
				delete(m, k)
			} else {
				m[k] = v
			}
		}
		var sb strings.Builder
		sb.WriteString("{")
		first := true
		for _, k := range entryFieldNames {
			if v, ok := m[k]; ok {
				if !first {
					sb.WriteString(",")
				}
				first = false
				sb.WriteString(`"` + k + `":` + v)
			}
		}
		sb.WriteString("}")
		return []byte(sb.String())
	}
	cases := []struct {
		name  string
		over  map[string]string
		field string
		msg   string
	}{
		{"schema 2", map[string]string{"schema_version": "2"}, "schema_version", "schema_version 2, but this reader supports only 1 (NeMo Gym main's records) and 3"},
		{"schema 0", map[string]string{"schema_version": "0"}, "schema_version", "schema_version 0"},
		{"schema huge", map[string]string{"schema_version": "4294967297"}, "schema_version", "schema_version 4294967297"},
		{"schema 4", map[string]string{"schema_version": "4"}, "schema_version", "schema_version 4"},
		{"schema float", map[string]string{"schema_version": "3.0"}, "schema_version", "expected an integer, found number 3.0"},
		{"schema bool", map[string]string{"schema_version": "true"}, "schema_version", "expected an integer, found a boolean"},
		{"token float", map[string]string{"prompt_token_ids": "[1,2.0]"}, "prompt_token_ids[1]", "expected an integer"},
		{"token exponent", map[string]string{"prompt_token_ids": "[1e2]"}, "prompt_token_ids[0]", "expected an integer"},
		{"token bool", map[string]string{"generation_token_ids": "[true]"}, "generation_token_ids[0]", "found a boolean"},
		{"token negative", map[string]string{"prompt_token_ids": "[1,-3]"}, "prompt_token_ids[1]", "non-negative, found -3"},
		{"token over int32", map[string]string{"generation_token_ids": "[2147483648]"}, "generation_token_ids[0]", "does not fit int32"},
		{"token string", map[string]string{"prompt_token_ids": `["1"]`}, "prompt_token_ids[0]", "found a string"},
		{"logprob NaN", map[string]string{"generation_log_probs": "[NaN]"}, "generation_log_probs[0]", "non-finite"},
		{"logprob -Infinity", map[string]string{"generation_log_probs": "[-Infinity]"}, "generation_log_probs[0]", "non-finite"},
		{"logprob null", map[string]string{"generation_log_probs": "[null]"}, "generation_log_probs[0]", "found null"},
		{"logprob overflow", map[string]string{"generation_log_probs": "[1e999]"}, "generation_log_probs[0]", "not a finite float64"},
		{"length mismatch", map[string]string{"generation_log_probs": "[-0.1,-0.2]"}, "generation_log_probs", "same length (got 1 and 2)"},
		{"missing rollout", map[string]string{"rollout_id": "<drop>"}, "rollout_id", "required field is missing"},
		{"missing logprobs", map[string]string{"generation_log_probs": "<drop>"}, "generation_log_probs", "required"},
		{"rollout not string", map[string]string{"rollout_id": "7"}, "rollout_id", "expected a string"},
		{"cum_len float", map[string]string{"cum_len": "3.5"}, "cum_len", "expected an integer"},
		{"token_item_index out of range", map[string]string{"token_item_index": "0"}, "token_item_index", "outside output_items of length 0"},
		{"output item not object", map[string]string{"output_items": "[1]"}, "output_items[0]", "expected an object"},
		{"resolved without parent", map[string]string{"parent_resolution": `"resolved"`}, "parent_call_id", "requires parent_call_id"},
		{"root with parent", map[string]string{"parent_resolution": `"root"`, "parent_call_id": `"p"`}, "parent_call_id", "cannot carry parent_call_id"},
		{"bad resolution", map[string]string{"parent_resolution": `"maybe"`}, "parent_resolution", `found "maybe"`},
		{"delta not bool", map[string]string{"prompt_is_delta": "1"}, "prompt_is_delta", "expected a boolean"},
		{"model null", map[string]string{"model": "null"}, "model", "expected a string, found null"},
	}
	for _, tc := range cases {
		t.Run(tc.name, func(t *testing.T) {
			_, err := DecodeTokenEntry(build(tc.over))
			if err == nil {
				t.Fatalf("accepted %s", build(tc.over))
			}
			if !strings.Contains(err.Error(), tc.field) || !strings.Contains(err.Error(), tc.msg) {
				t.Fatalf("error %q does not name field %q and say %q", err, tc.field, tc.msg)
			}
		})
	}
	t.Run("schema sentinel", func(t *testing.T) {
		_, err := DecodeTokenEntry(build(map[string]string{"schema_version": "4"}))
		if !errors.Is(err, ErrSchemaVersion) {
			t.Fatalf("schema 4 error %v is not ErrSchemaVersion", err)
		}
	})
	for _, bad := range []string{``, `[]`, `{`, `{"rollout_id":"r",}`, `{"rollout_id":"r"} x`, `{"a":1,"a":2}`,
		`{"rollout_id":"\ud800x","model_call_id":"c","prompt_token_ids":[],"generation_token_ids":[],"generation_log_probs":[]}` + "\xff"} {
		if _, err := DecodeTokenEntry([]byte(bad)); err == nil {
			t.Errorf("accepted malformed %q", bad)
		}
	}
}

// TestTokenEntryRoundTripRandom encodes random entries and decodes them back.
func TestTokenEntryRoundTripRandom(t *testing.T) {
	rng := rand.New(rand.NewPCG(1, 2))
	for i := 0; i < 200; i++ {
		e := randomEntry(rng, "r-1", "c"+string(rune('a'+i%26)))
		back, err := DecodeTokenEntry(e.AppendJSON(nil))
		if err != nil {
			t.Fatalf("case %d: %v\n%s", i, err, e.AppendJSON(nil))
		}
		if d := cmp.Diff(e, back, cmpopts.EquateEmpty()); d != "" {
			t.Fatalf("case %d (-want +got)\n%s", i, d)
		}
	}
}

func randomEntry(rng *rand.Rand, rid, call string) *TokenEntry {
	e := &TokenEntry{SchemaVersion: 3, RolloutID: rid, ModelCallID: call, Model: "policy",
		CreatedAt: float64(rng.IntN(1<<30)) / 7}
	for n := rng.IntN(20); n > 0; n-- {
		e.PromptTokenIDs = append(e.PromptTokenIDs, int32(rng.Uint32()>>1))
	}
	for n := rng.IntN(10); n > 0; n-- {
		e.GenerationTokenIDs = append(e.GenerationTokenIDs, int32(rng.IntN(1<<17)))
		lp := -rng.ExpFloat64()
		if rng.IntN(5) == 0 {
			lp = math.Float64frombits(rng.Uint64()>>2 | 1<<63) // odd magnitudes
		}
		e.GenerationLogProbs = append(e.GenerationLogProbs, lp)
	}
	if rng.IntN(2) == 0 {
		e.Stamp()
		p := ParentRoot
		e.ParentResolution = &p
	}
	return e
}
