package trainer

import (
	"encoding/json"
	"fmt"
	"math"
	"os"
	"path/filepath"
	"slices"
	"strings"
	"testing"

	"github.com/tracegrpo/tracegrpo/checkpoint"
)

// hybridDir writes, under tmp, the MTP golden's tiny Super-shaped
// Nemotron-H (Mamba, latent sparse and attention blocks: "ME*E") without its
// multi-token prediction: config.json less the MTP keys, the same weights
// (the mtp.* tensors are skipped on load, as transformers skips them).
func hybridDir(t *testing.T, tmp string) string {
	t.Helper()
	raw, err := os.ReadFile(filepath.Join(mtpGoldenDir, "config.json"))
	if err != nil {
		t.Fatal(err)
	}
	var cfg map[string]any
	if err := json.Unmarshal(raw, &cfg); err != nil {
		t.Fatal(err)
	}
	delete(cfg, "num_nextn_predict_layers")
	delete(cfg, "mtp_hybrid_override_pattern")
	dir := filepath.Join(tmp, "nemotron-h")
	if err := os.MkdirAll(dir, 0o755); err != nil {
		t.Fatal(err)
	}
	out, _ := json.MarshalIndent(cfg, "", "  ")
	if err := os.WriteFile(filepath.Join(dir, "config.json"), out, 0o644); err != nil {
		t.Fatal(err)
	}
	w, err := os.ReadFile(filepath.Join(mtpGoldenDir, "model.safetensors"))
	if err != nil {
		t.Fatal(err)
	}
	if err := os.WriteFile(filepath.Join(dir, "model.safetensors"), w, 0o644); err != nil {
		t.Fatal(err)
	}
	return dir
}

// hybridArgs are the MTP golden's two steps of external rollouts (their
// second calls second traces whose first calls' tokens the first traces
// own: prefixes a trie shares) on the Nemotron-H of hybridDir, with the
// golden's settings less its MTP ones.
func hybridArgs(g mtpGolden, caps, steps, dir, out string, extra ...string) []string {
	args := []string{"--out", out, "--steps", "2", "--quiet", "--rollouts", steps, "--captures", caps, "--init-from", dir,
		"--set", "checkpointing.save_period=1"}
	for _, k := range slices.Sorted(func(yield func(string) bool) {
		for k := range g.Sets {
			if !yield(k) {
				return
			}
		}
	}) {
		if strings.HasPrefix(k, "policy.megatron_cfg.mtp_") {
			continue
		}
		args = append(args, "--set", fmt.Sprintf("%s=%v", k, g.Sets[k]))
	}
	return append(args, extra...)
}

// TestHybridTreesTrainLikeUnshared: under policy.shared_prefix=auto a
// Nemotron-H model's traces are packed as token tries (every shared prefix
// computed once: fewer computed tokens than trace tokens), and its two
// steps end with the metrics and weights of packing each trace alone
// (shared_prefix=off), within float32 summation order.
func TestHybridTreesTrainLikeUnshared(t *testing.T) {
	tmp := t.TempDir()
	g, caps, steps := loadMTPGolden(t, tmp)
	dir := hybridDir(t, tmp)
	auto, off := filepath.Join(tmp, "auto"), filepath.Join(tmp, "off")
	mustTrain(t, hybridArgs(g, caps, steps, dir, auto, "--set", "policy.train_micro_batch_size=8")...)
	mustTrain(t, hybridArgs(g, caps, steps, dir, off, "--set", "policy.train_micro_batch_size=8", "--shared-prefix", "off")...)
	ma, mo := metricsNoTimes(t, auto), metricsNoTimes(t, off)
	if len(ma) != 2 || len(mo) != 2 {
		t.Fatalf("%d and %d metric lines, want 2", len(ma), len(mo))
	}
	for s := range 2 {
		a, o := ma[s], mo[s]
		if !(a.ComputedTokens < a.TrainTokens) || o.ComputedTokens != o.TrainTokens || a.TrainTokens != o.TrainTokens {
			t.Errorf("step %d: auto computed %d of %d trace tokens, off %d of %d: want a trie under auto, every token under off",
				s+1, a.ComputedTokens, a.TrainTokens, o.ComputedTokens, o.TrainTokens)
		}
		checkGoldenMetrics(t, s+1, 1e-5, []goldenMetric{
			{"loss", float64(a.Loss), float64(o.Loss)},
			{"grad_norm", float64(a.GradNorm), float64(o.GradNorm)},
		})
		wa, wo := stepTensors(t, auto, s+1)[checkpoint.KindWeights], stepTensors(t, off, s+1)[checkpoint.KindWeights]
		d, where := maxAbsDiff(wa, wo)
		if !(d <= 1e-6) {
			t.Errorf("step %d: the trie run's weights differ from the unshared run's by %.3g at %s", s+1, d, where)
		}
		t.Logf("step %d: %d computed tokens for %d trace tokens; loss %.9g vs %.9g, grad_norm %.9g vs %.9g; largest weight difference %.3g",
			s+1, a.ComputedTokens, a.TrainTokens, a.Loss, o.Loss, a.GradNorm, o.GradNorm, d)
		if math.IsNaN(float64(a.Loss)) {
			t.Errorf("step %d: loss NaN", s+1)
		}
	}
}
