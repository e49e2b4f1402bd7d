package main

import (
	"crypto/sha256"
	"encoding/hex"
	"encoding/json"
	"os"
	"path/filepath"
	"strings"
	"testing"

	"github.com/tracegrpo/tracegrpo/trainer"
)

// repoPaths makes docs' repository-relative paths relative to this
// package's directory.
func repoPaths(args []string) []string {
	for i, a := range args {
		for _, dir := range []string{"testdata/", "model/", "config/"} {
			if strings.HasPrefix(a, dir) {
				args[i] = "../../" + a
			}
		}
	}
	return args
}

// TestGymSampleTrains runs docs/loop.md's sample command as it is written
// (its --out in a temporary directory): NeMo Gym's blackjack rollouts train
// whole, none masked, each rollout one trace (a second call continues the
// first), and every captured generation token is eligible once.
func TestGymSampleTrains(t *testing.T) {
	args := repoPaths(docCommand(t, "docs/loop.md", "## A real sample", "bin/train --rollouts"))
	out := filepath.Join(t.TempDir(), "run")
	for i, a := range args {
		if a == "runs/gym-sample" {
			args[i] = out
		}
	}
	mustTrain(t, append(args, "--backend", "cpu", "--quiet")...)
	ms, _, err := trainer.ReadMetrics(filepath.Join(out, "metrics.jsonl"))
	if err != nil || len(ms) != 1 {
		t.Fatalf("%d metric lines, %v", len(ms), err)
	}
	// The generation tokens Gym's store holds, and the provenance: the
	// records are Gym's, byte for byte.
	gen, calls := 0, 0
	caps, _ := filepath.Glob("../../testdata/gym-sample/captures/*.tokens.jsonl")
	for _, f := range caps {
		for _, line := range readJSONL[map[string]any](t, f) {
			gen += len(line["generation_token_ids"].([]any))
			calls++
		}
	}
	var prov struct {
		Gym   map[string]map[string]any `json:"gym"`
		Calls map[string]int            `json:"calls_per_rollout"`
	}
	b, _ := os.ReadFile("../../testdata/gym-sample/PROVENANCE.json")
	if err := json.Unmarshal(b, &prov); err != nil {
		t.Fatal(err)
	}
	recs, _ := os.ReadFile("../../testdata/gym-sample/rollouts.jsonl")
	sum := sha256.Sum256(recs)
	src := prov.Gym["environments/blackjack/data/example_rollouts.jsonl"]
	if src["sha256"] != hex.EncodeToString(sum[:]) || src["commit"] == nil {
		t.Errorf("rollouts.jsonl is not Gym's file as PROVENANCE.json records it (%v)", src)
	}
	m := ms[0]
	t.Logf("gym-sample: %d rollouts, %d calls, %d traces, %d eligible tokens, loss %v, reward %v", m.LogicalRollouts, calls, m.Traces, m.EligibleTokens, m.Loss, m.RewardMean)
	if m.LogicalRollouts != 5 || m.MaskedRollouts != 0 || m.Traces != 5 || calls != 7 || m.EligibleTokens != gen || float64(m.Loss) == 0 {
		t.Errorf("the sample trained %d rollouts (%d masked %v), %d traces, %d eligible tokens of %d generated over %d calls, loss %v",
			m.LogicalRollouts, m.MaskedRollouts, m.MaskReasons, m.Traces, m.EligibleTokens, gen, calls, m.Loss)
	}
}
