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

// TestMoESizeCaps: the sparse sizes are capped like the dense ones:
// num_experts up to MaxExperts, num_experts_per_tok up to num_experts,
// moe_intermediate_size up to MaxIntermediateSize, and the experts of all
// sparse layers together up to MaxExpertMLPs; one past each is refused
// naming the field, and so are 2^24 and 2^40 (never wrapped into a small
// or negative count).
func TestMoESizeCaps(t *testing.T) {
	base := testConfig(t, "moe_k2_norm") // 2 sparse layers of 16 experts
	for _, tc := range []struct {
		field string
		max   int
		set   func(*Config, int)
	}{
		{"num_experts", MaxExperts, func(c *Config, v int) { c.MoE.NumExperts = v }},
		{"num_experts_per_tok", MaxExperts, func(c *Config, v int) { c.MoE.NumExperts, c.MoE.TopK = min(v, MaxExperts), v }},
		{"moe_intermediate_size", MaxIntermediateSize, func(c *Config, v int) { c.MoE.IntermediateSize = v }},
		// Every layer sparse, MaxExperts each: MaxExpertMLPs/MaxExperts
		// layers fit, one more does not.
		{"num_hidden_layers", MaxExpertMLPs / MaxExperts, func(c *Config, v int) {
			c.MoE.NumExperts, c.MoE.DecoderSparseStep, c.NumHiddenLayers = MaxExperts, 1, v
		}},
	} {
		for _, v := range []int{tc.max, tc.max + 1, 1 << 24, 1 << 40} {
			c := base
			tc.set(&c, v)
			err := c.Validate()
			if v <= tc.max && err != nil {
				t.Errorf("%s=%d (within the cap %d): %v", tc.field, v, tc.max, err)
			}
			if v > tc.max && (err == nil || !strings.Contains(err.Error(), tc.field)) {
				t.Errorf("%s=%d: %v, want a refusal naming %s", tc.field, v, err, tc.field)
			}
			if err != nil && negativeNumber.MatchString(err.Error()) {
				t.Errorf("%s=%d: a negative number in %q", tc.field, v, err)
			}
		}
	}
	for _, v := range []int{0, -1, -(1 << 40)} {
		c := base
		c.MoE.TopK = v
		if err := c.Validate(); err == nil || !strings.Contains(err.Error(), "num_experts_per_tok") {
			t.Errorf("num_experts_per_tok=%d: %v, want a refusal naming it", v, err)
		}
		c = base
		c.MoE.IntermediateSize = v
		if err := c.Validate(); err == nil || !strings.Contains(err.Error(), "moe_intermediate_size") {
			t.Errorf("moe_intermediate_size=%d: %v, want a refusal naming it", v, err)
		}
	}
}

// TestMoESizesRefuseOverflow: the largest sparse model the caps allow (64
// layers of 1024 experts of width 2^19, every expert taken by every token)
// plans a real micro-batch, and its activations for 2^31 tokens (T·K·Im =
// 2^60 elements) or a sampler's full batch are refused as an overflow,
// never wrapped. Its parameter count and active parameters are exact.
func TestMoESizesRefuseOverflow(t *testing.T) {
	big := testConfig(t, "moe_k2_norm")
	big.NumHiddenLayers, big.HiddenSize, big.IntermediateSize = MaxExpertMLPs/MaxExperts, MaxHiddenSize, MaxIntermediateSize
	big.MoE.NumExperts, big.MoE.TopK, big.MoE.IntermediateSize, big.MoE.DecoderSparseStep = MaxExperts, MaxExperts, MaxIntermediateSize, 1
	big.MoE.MLPOnlyLayers = nil
	if err := big.Validate(); err != nil {
		t.Fatalf("the largest sparse config within the caps: %v", err)
	}
	for _, tc := range []struct {
		name string
		plan func() error
	}{
		{"activations", func() error { _, err := PlanModel(big, Options{MaxTokens: MaxTokens}); return err }},
		{"activations, recompute", func() error { _, err := PlanModel(big, Options{MaxTokens: MaxTokens, Recompute: true}); return err }},
		{"sampler", func() error {
			_, err := PlanSampler(big, Options{MaxTokens: 8}, MaxSamplerBatch, MaxTokens)
			return err
		}},
	} {
		err := tc.plan()
		if !errors.Is(err, checked.ErrOverflow) {
			t.Errorf("%s: %v, want an overflow refusal", tc.name, err)
		}
		if err != nil && negativeNumber.MatchString(err.Error()) {
			t.Errorf("%s: a negative number in %q", tc.name, err)
		}
	}
	f, err := PlanModel(big, Options{MaxTokens: 64, Recompute: true})
	if err != nil || f.Total() <= 0 {
		t.Fatalf("the largest sparse model at 64 tokens: %+v, %v", f, err)
	}
	// Every parameter, counted here in int64: 64 layers of attention
	// (q, k, v, o; q/k norms; two layer norms), a router and 1024 experts
	// of 3·Im·C each, the embeddings, the final norm and the head.
	C, HD, NH, NKV, V := int64(big.HiddenSize), int64(big.HeadDim), int64(big.NumAttentionHeads), int64(big.NumKeyValueHeads), int64(big.VocabSize)
	E, Im, L := int64(MaxExperts), int64(MaxIntermediateSize), int64(big.NumHiddenLayers)
	layer := 2*NH*HD*C + 2*NKV*HD*C + 2*HD + 2*C + E*C + E*3*Im*C
	head := V * C
	if big.TieWordEmbeddings {
		head = 0
	}
	want := V*C + L*layer + C + head
	if got := int64(NewParamTable(big).Total); got != want || f.Weights != 4*want {
		t.Errorf("parameters %d (weights %d bytes), want %d (%d bytes)", got, f.Weights, want, 4*want)
	}
	if got := int64(ActiveParams(big)); got != want { // K = E: every expert is active
		t.Errorf("ActiveParams %d, want %d (every expert active)", got, want)
	}
}
