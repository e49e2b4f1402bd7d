package gym

import (
	"encoding/json"
	"errors"
	"os"
	"testing"

	"github.com/google/go-cmp/cmp"
)

// TestBuildersMatchIndependentPython compares both builders and the
// projection with scripts/golden_traces.py, an independent Python
// implementation of spec §3.1-§3.3 and §2.5, on the worked example and 200
// seeded random call graphs (retries, deltas, missing parents, bad proofs,
// redeliveries, terminals).
func TestBuildersMatchIndependentPython(t *testing.T) {
	b, err := os.ReadFile("testdata/golden_traces.json")
	if err != nil {
		t.Fatal(err)
	}
	var g struct {
		Metadata map[string]any `json:"metadata"`
		Cases    []struct {
			Name          string            `json:"name"`
			Terminal      string            `json:"terminal"`
			Entries       []json.RawMessage `json:"entries"`
			PrefixMerging json.RawMessage   `json:"prefix_merging"`
			PerRequest    json.RawMessage   `json:"per_request"`
		} `json:"cases"`
	}
	if err := json.Unmarshal(b, &g); err != nil {
		t.Fatal(err)
	}
	if g.Metadata["script"] != "scripts/golden_traces.py" || g.Metadata["seed"] == nil {
		t.Fatalf("golden metadata: %v", g.Metadata)
	}
	delivered := 0
	for _, c := range g.Cases {
		entries := make([]TokenEntry, len(c.Entries))
		for i, raw := range c.Entries {
			e, err := DecodeTokenEntry(raw)
			if err != nil {
				t.Fatalf("%s: entry %d: %v", c.Name, i, err)
			}
			entries[i] = *e
		}
		for _, bc := range []struct {
			builder string
			want    json.RawMessage
		}{{BuilderPrefixMerging, c.PrefixMerging}, {BuilderPerRequest, c.PerRequest}} {
			out, err := Build(bc.builder, entries, c.Terminal)
			var env *TrainingTraceBatch
			if err == nil {
				env, err = ProjectTrainingTraces("r", out)
			}
			if string(bc.want) == `"masked"` {
				var me *MaskError
				if !errors.As(err, &me) {
					t.Errorf("%s/%s: Python masks, Go delivers (err %v)", c.Name, bc.builder, err)
				}
				continue
			}
			if err != nil {
				t.Errorf("%s/%s: Python delivers, Go: %v", c.Name, bc.builder, err)
				continue
			}
			want, err := DecodeTrainingTraces(bc.want)
			if err != nil {
				t.Fatalf("%s/%s: golden envelope invalid: %v", c.Name, bc.builder, err)
			}
			if d := cmp.Diff(want, env); d != "" {
				t.Errorf("%s/%s: (-python +go)\n%s", c.Name, bc.builder, d)
			}
			delivered++
		}
	}
	if delivered < 100 {
		t.Fatalf("only %d delivered envelopes compared", delivered)
	}
}
