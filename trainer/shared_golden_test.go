package trainer

import (
	"path/filepath"
	"testing"

	"github.com/tracegrpo/tracegrpo/internal/safetensors"
)

// Bounds of TestSharedPrefixGRPOGolden: the trainer's float32 step against
// float64 PyTorch, as TestSparseGRPOGolden's (the same model size, rollouts,
// optimizer and clipping, without experts): the metrics are sums over ~100
// tokens (relative 1e-5); AdamW with eps 1e-4 turns float32 rounding of the
// clipped gradients (~1e-7 relative) into ≲ 1e-7 of weight a step, so 1e-6
// bounds two steps with room. Packing the rollouts as a trie changes only
// the order of float32 sums, well inside both. A boundary token scored
// against one child's label only, a prefix's key/value gradients missing a
// descendant's, or a pair's gradient not summed over equal traces moves
// the loss or weights by ~1e-3 or more.
const (
	sharedGoldenMetricRtol = 1e-5
	sharedGoldenWeightAtol = 1e-6
)

// TestSharedPrefixGRPOGolden: two GRPO steps of a tiny dense Qwen3 from
// external rollouts (NeMo Gym records and captures) whose traces share
// prefixes (each task group's prompt; two generations of a group share
// their first tokens; two are equal), with the micro-batch budget smaller
// than a group's trie (so it is split at branch points), end with the
// loss, KL, gradient norm and lr of each step and the weights after each
// step of scripts/golden_shared_grpo.py, which computes the same steps in
// float64 with every rollout as its own sequence: with
// policy.shared_prefix=auto (each shared prefix computed once: fewer
// computed than trace tokens) and off alike.
func TestSharedPrefixGRPOGolden(t *testing.T) {
	const dir = "testdata/shared_grpo"
	tmp := t.TempDir()
	g, caps, steps := loadGRPOGolden(t, dir, "scripts/golden_shared_grpo.py", tmp)
	gold, err := safetensors.Open(filepath.Join(dir, "golden.safetensors"))
	if err != nil {
		t.Fatal(err)
	}
	defer gold.Close()
	for _, mode := range []string{"auto", "off"} {
		t.Run(mode, func(t *testing.T) {
			out := filepath.Join(tmp, "run-"+mode)
			ms := trainGRPOGolden(t, g, dir, caps, steps, out, "--shared-prefix", mode)
			for s, want := range g.Steps {
				m := ms[s]
				if m.EligibleTokens != want.EligibleTokens || m.TrainTokens != want.TrainTokens {
					t.Errorf("step %d: eligible %d, train tokens %d; the golden's %d and %d", s+1, m.EligibleTokens, m.TrainTokens, want.EligibleTokens, want.TrainTokens)
				}
				switch {
				case mode == "auto" && !(m.ComputedTokens < m.TrainTokens):
					t.Errorf("step %d: %d computed tokens for %d trace tokens: the shared prefixes were not computed once", s+1, m.ComputedTokens, m.TrainTokens)
				case mode == "off" && m.ComputedTokens != m.TrainTokens:
					t.Errorf("step %d: %d computed tokens for %d trace tokens with sharing off", s+1, m.ComputedTokens, m.TrainTokens)
				}
				t.Logf("step %d: %d trace tokens, %d computed (prefix_reuse %.3f)", s+1, m.TrainTokens, m.ComputedTokens, float64(m.PrefixReuse))
				checkGoldenMetrics(t, s+1, sharedGoldenMetricRtol, []goldenMetric{
					{"loss", float64(m.Loss), want.Loss},
					{"kl", float64(m.KL), want.KL},
					{"grad_norm", float64(m.GradNorm), want.GradNorm},
					{"lr", float64(m.LR), want.LR},
				})
				checkGoldenWeights(t, gold, out, s+1, sharedGoldenWeightAtol)
			}
		})
	}
}
