package config

import (
	"errors"
	"strings"
	"testing"
)

// TestFusedAdamMomentDtypes: TransformerEngine's FusedAdam with both
// moments in bfloat16 (NeMo RL's exp_avg_dtype recipes) or both in float32
// is accepted; moments of different dtypes (TE requires both equal),
// float16 or FP8 moments (scaled per tensor, not implemented), and
// exp_avg_dtype on torch.optim.AdamW (which takes no such argument) are
// refused naming the key.
func TestFusedAdamMomentDtypes(t *testing.T) {
	for _, c := range []struct {
		name, opt, m, v string
		bf16            bool
		refuse          string // the key refused; "" accepts
	}{
		{"fused bf16", TEFusedAdam, "torch.bfloat16", "torch.bfloat16", true, ""},
		{"fused float32", TEFusedAdam, "torch.float32", "float32", false, ""},
		{"fused unset", TEFusedAdam, "", "", false, ""},
		{"torch float32", TorchAdamW, "torch.float32", "", false, ""},
		{"fused mixed", TEFusedAdam, "torch.bfloat16", "torch.float32", false, "policy.optimizer.kwargs.exp_avg_sq_dtype"},
		{"fused float16", TEFusedAdam, "torch.float16", "torch.float16", false, "policy.optimizer.kwargs.exp_avg_dtype"},
		{"fused fp8", TEFusedAdam, "torch.bfloat16", "torch.uint8", false, "policy.optimizer.kwargs.exp_avg_sq_dtype"},
		{"torch bf16", TorchAdamW, "torch.bfloat16", "torch.bfloat16", false, "policy.optimizer.kwargs.exp_avg_dtype"},
		{"another optimizer", "torch.optim.SGD", "", "", false, "policy.optimizer.name"},
	} {
		t.Run(c.name, func(t *testing.T) {
			cfg := Default()
			cfg.Policy.MegatronCfg.Enabled = false
			cfg.Policy.Optimizer = &TorchOptimizer{Name: c.opt, Kwargs: AdamWKwargs{LR: 1e-6, WeightDecay: 0.1, Betas: []float64{0.9, 0.999}, Eps: 1e-8,
				ExpAvgDtype: c.m, ExpAvgSqDtype: c.v}}
			o, _, err := cfg.Optim()
			if c.refuse == "" {
				if err != nil {
					t.Fatal(err)
				}
				if o.BF16Moments != c.bf16 || o.Class != c.opt {
					t.Errorf("class %q bf16 moments %v, want %q %v", o.Class, o.BF16Moments, c.opt, c.bf16)
				}
				return
			}
			var r *Refusal
			if !errors.As(err, &r) || r.Key != c.refuse {
				t.Fatalf("error %v, want a refusal of %s", err, c.refuse)
			}
			if !strings.Contains(r.Error(), c.refuse) {
				t.Errorf("refusal %q does not name %s", r.Error(), c.refuse)
			}
		})
	}
}
