package rollout

import (
	"encoding/json"
	"testing"

	"github.com/tracegrpo/tracegrpo/gym"
)

// TestCapturesBuildUnderBothBuilders records oracle and random episodes into a
// real Gym capture store, finalizes every rollout record through the same
// reader and builders that external captures use, and checks the trace
// counts each task promises and that both builders own the same tokens.
func TestCapturesBuildUnderBothBuilders(t *testing.T) {
	wantTraces := map[string]map[string]int{
		gym.BuilderPrefixMerging: {"calc": 1, "branch": 2, "compact": 2},
		gym.BuilderPerRequest:    {"calc": 2, "branch": 3, "compact": 3},
	}
	for _, pol := range []struct {
		name   string
		policy Policy
	}{{"oracle", oracle{}}, {"random", randomPolicy{}}} {
		dir := t.TempDir()
		w, err := gym.NewWriter(dir)
		if err != nil {
			t.Fatal(err)
		}
		w.SetFsync(false)
		specs := Plan(allTasks(t), 7, 6, 3, Streams{Seed: 1})
		res, err := Run(pol.policy, &GymRecorder{W: w, Model: "tiny"}, specs, Streams{Seed: 3})
		if err != nil {
			t.Fatal(err)
		}
		reader, err := gym.NewReader(dir)
		if err != nil {
			t.Fatal(err)
		}
		for _, r := range res {
			owned := map[string]map[string][]int32{}
			for _, builder := range []string{gym.BuilderPrefixMerging, gym.BuilderPerRequest} {
				rec := recordOf(t, &r)
				fin, err := gym.Finalize(rec, reader, builder)
				if err != nil {
					t.Fatalf("%s %s %s: %v", pol.name, r.RolloutID, builder, err)
				}
				if fin.Masked {
					t.Fatalf("%s %s %s: masked (%s)", pol.name, r.RolloutID, builder, fin.Reason)
				}
				n := len(fin.Envelope.Traces)
				// A random calc episode without a tool call has one call.
				want := wantTraces[builder][r.Task]
				if r.Task == "calc" && len(r.Calls) == 1 {
					want = 1
				}
				if r.Task == "compact" && len(r.Calls) == 2 {
					want = 2
				}
				if n != want {
					t.Errorf("%s %s (%s) %s: %d traces, want %d", pol.name, r.RolloutID, r.Task, builder, n, want)
				}
				owned[builder] = ownedTokens(fin.Envelope)
			}
			for id, toks := range owned[gym.BuilderPrefixMerging] {
				if got := owned[gym.BuilderPerRequest][id]; !equal32(got, toks) {
					t.Errorf("%s: call %s owns %v under prefix_merging but %v under per_request", r.RolloutID, id, toks, got)
				}
			}
			if len(owned[gym.BuilderPrefixMerging]) != len(r.Calls) {
				t.Errorf("%s: %d calls own spans, want every one of %d", r.RolloutID, len(owned[gym.BuilderPrefixMerging]), len(r.Calls))
			}
		}
	}
}

// TestClearBeforeRedispatch re-runs the same step into the same store, as a
// resumed trainer does: the second attempt must replace the first.
func TestClearBeforeRedispatch(t *testing.T) {
	dir := t.TempDir()
	w, _ := gym.NewWriter(dir)
	w.SetFsync(false)
	rec := &GymRecorder{W: w, Model: "tiny"}
	specs := Plan(allTasks(t), 0, 3, 2, Streams{Seed: 1})
	if _, err := Run(randomPolicy{}, rec, specs, Streams{Seed: 3}); err != nil {
		t.Fatal(err)
	}
	res, err := Run(oracle{}, rec, specs, Streams{Seed: 6})
	if err != nil {
		t.Fatalf("second attempt at the same rollout ids: %v", err)
	}
	reader, _ := gym.NewReader(dir)
	for _, r := range res {
		snap, err := reader.Snapshot(r.RolloutID)
		if err != nil {
			t.Fatal(err)
		}
		if len(snap.Entries) != len(r.Calls) {
			t.Errorf("%s: %d entries in the store, want the second attempt's %d", r.RolloutID, len(snap.Entries), len(r.Calls))
		}
	}
}

func recordOf(t *testing.T, r *Result) *gym.Record {
	t.Helper()
	b, err := json.Marshal(r.Record())
	if err != nil {
		t.Fatal(err)
	}
	rec, err := gym.ParseRecord(b)
	if err != nil {
		t.Fatal(err)
	}
	return rec
}

func ownedTokens(b *gym.TrainingTraceBatch) map[string][]int32 {
	out := map[string][]int32{}
	for _, tr := range b.Traces {
		for _, s := range tr.SampledSpans {
			out[s.ModelCallID] = tr.TokenIDs[s.Start:s.End]
		}
	}
	return out
}

func equal32(a, b []int32) bool {
	if len(a) != len(b) {
		return false
	}
	for i := range a {
		if a[i] != b[i] {
			return false
		}
	}
	return true
}
