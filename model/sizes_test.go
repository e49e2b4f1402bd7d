package model

import (
	"errors"
	"regexp"
	"strings"
	"testing"

	"github.com/tracegrpo/tracegrpo/internal/checked"
)

// TestConfigSizeCaps: every size of a config is accepted up to its cap and
// refused one past it, naming the field (issue 26: a million layers
// planned for minutes; sizes of 2^24 ran out of memory in the parameter
// table).
func TestConfigSizeCaps(t *testing.T) {
	base := testConfig(t, "qwen3_untied")
	for _, tc := range []struct {
		field string
		max   int
		set   func(*Config, int)
	}{
		{"num_hidden_layers", MaxLayers, func(c *Config, v int) { c.NumHiddenLayers = v }},
		{"hidden_size", MaxHiddenSize, func(c *Config, v int) { c.HiddenSize = v }},
		{"intermediate_size", MaxIntermediateSize, func(c *Config, v int) { c.IntermediateSize = v }},
		{"num_attention_heads", MaxHeads, func(c *Config, v int) { c.NumAttentionHeads, c.NumKeyValueHeads = v, 1 }},
		{"num_key_value_heads", MaxHeads, func(c *Config, v int) {
			if v <= MaxHeads {
				c.NumAttentionHeads = v
			}
			c.NumKeyValueHeads = v
		}},
		{"head_dim", MaxHeadDim, func(c *Config, v int) { c.HeadDim = v }},
		{"vocab_size", MaxVocabSize, func(c *Config, v int) { c.VocabSize = v }},
	} {
		// 2^24 of any size (a million layers) is past what a model can be,
		// whatever the caps are set to.
		for _, v := range []int{tc.max, tc.max + 1, 1000000, 1 << 24, 1 << 40} {
			c := base
			tc.set(&c, v)
			err := c.Validate()
			refuse := v > tc.max || v >= 1000000 && (tc.field == "num_hidden_layers" || v >= 1<<24)
			if !refuse && err != nil {
				t.Errorf("%s=%d (within the cap %d): %v", tc.field, v, tc.max, err)
			}
			if refuse && (err == nil || !strings.Contains(err.Error(), tc.field)) {
				t.Errorf("%s=%d: %v, want a refusal naming %s", tc.field, v, err, tc.field)
			}
		}
	}
}

// negativeNumber finds a negative integer in a message (a size that
// wrapped: "found -16", "alloc of -1341 f32 elements").
var negativeNumber = regexp.MustCompile(`(^|[^\w.])-[0-9]`)

// TestSizesRefuseOverflow: a micro-batch past int32 tokens and layouts
// whose sums pass the arena bound are refused (the checked.ErrOverflow of
// a named part), never wrapped into small or negative sizes.
func TestSizesRefuseOverflow(t *testing.T) {
	big := testConfig(t, "qwen3_untied")
	big.NumHiddenLayers, big.HiddenSize, big.IntermediateSize = MaxLayers, MaxHiddenSize, MaxIntermediateSize
	big.NumAttentionHeads, big.NumKeyValueHeads, big.HeadDim = MaxHeads, MaxHeads, MaxHeadDim
	for _, tc := range []struct {
		name     string
		plan     func() error
		overflow bool // else any refusal
	}{
		{"MaxTokens past int32", func() error { _, err := PlanModel(big, Options{MaxTokens: MaxTokens + 1}); return err }, false},
		{"MaxSeqLen past int32", func() error { _, err := PlanModel(big, Options{MaxTokens: 8, MaxSeqLen: 1 << 40}); return err }, false},
		{"activations", func() error { _, err := PlanModel(big, Options{MaxTokens: MaxTokens}); return err }, true},
		{"sampler KV cache", func() error {
			_, err := PlanSampler(big, Options{MaxTokens: 8}, MaxSamplerBatch, MaxTokens)
			return err
		}, true},
		{"sampler batch", func() error { _, err := PlanSampler(big, Options{MaxTokens: 8}, MaxSamplerBatch+1, 8); return err }, false},
	} {
		err := tc.plan()
		if err == nil || (tc.overflow && !errors.Is(err, checked.ErrOverflow)) {
			t.Errorf("%s: %v, want a refusal (overflow: %v)", tc.name, err, tc.overflow)
		}
		if err != nil && negativeNumber.MatchString(err.Error()) {
			t.Errorf("%s: a negative number in %q", tc.name, err)
		}
	}
	// Just under the caps, a micro-batch a real run could use plans.
	if f, err := PlanModel(big, Options{MaxTokens: 4096, Recompute: true}); err != nil || f.Total() <= 0 {
		t.Errorf("the largest model at 4096 tokens: %+v, %v", f, err)
	}
}
