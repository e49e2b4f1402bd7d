package grpo

import (
	"fmt"
	"math"
	"strings"
	"testing"
)

// TestRatioClipCBoundAsNeMoRL: NeMo RL asserts ratio_clip_c > 1
// (ClippedPGLossFn: "ratio_clip_c must exceed 1"), so the bound itself is
// refused and the next float above it is accepted; so is null (no dual
// clipping). Infinity and NaN are refused (no finite bound).
func TestRatioClipCBoundAsNeMoRL(t *testing.T) {
	above := math.Nextafter(1, 2)
	for _, c := range []struct {
		value string
		ok    bool
	}{
		{"1", false},
		{"1.0", false},
		{fmt.Sprintf("%.17g", math.Nextafter(1, 0)), false},
		{"0.5", false},
		{"-3", false},
		{".inf", false},
		{".nan", false},
		{fmt.Sprintf("%.17g", above), true},
		{"3", true},
		{"null", true},
	} {
		t.Run(c.value, func(t *testing.T) {
			cfg := loadRecipe(t, recipes["base"], "loss_fn.ratio_clip_c="+c.value)
			_, err := NewLossOptions(&cfg.LossFn)
			cerr := CheckConfig(cfg)
			if c.ok {
				if err != nil || cerr != nil {
					t.Errorf("ratio_clip_c=%s refused: %v; %v", c.value, err, cerr)
				}
				return
			}
			for _, e := range []error{err, cerr} {
				if e == nil || !strings.Contains(e.Error(), "loss_fn.ratio_clip_c") || !strings.Contains(e.Error(), "> 1") {
					t.Errorf("ratio_clip_c=%s: %v; want a refusal naming loss_fn.ratio_clip_c and > 1", c.value, e)
				}
			}
		})
	}
	if cfg := loadRecipe(t, recipes["base"], fmt.Sprintf("loss_fn.ratio_clip_c=%.17g", above)); cfg.LossFn.RatioClipC == nil || *cfg.LossFn.RatioClipC != above {
		t.Fatalf("the recipe did not carry ratio_clip_c=%v", above)
	}
}
