package cuda

import "testing"

// TestLogitsScratchFor: the LM head's scratch is an eighth of the memory a
// run's plan leaves free, at least the 128 MiB default and at most 2 GiB,
// in whole MiB; at 2 GiB the bench shape (8 × 4096 tokens, Qwen3's
// 151,936-token vocabulary) runs 10 forward chunks and 14 backward ones
// (bf16 operands: fp32 logits and their bf16 dz share the scratch), where
// the 128 MiB default ran 149 and 224.
func TestLogitsScratchFor(t *testing.T) {
	for _, c := range []struct {
		headroom int64
		want     int
	}{
		{0, defaultLogitsScratch},
		{-5 << 30, defaultLogitsScratch},
		{1 << 30, defaultLogitsScratch},
		{10 << 30, (10 << 30) / 8 / 4},
		{10<<30 + 12345, (10 << 30) / 8 / 4},
		{80 << 30, maxLogitsScratch},
	} {
		if got := LogitsScratchFor(c.headroom); got != c.want || got%(1<<18) != 0 {
			t.Errorf("LogitsScratchFor(%d) = %d, want %d (whole MiB)", c.headroom, got, c.want)
		}
	}
	const T, V = 8 * 4096, 151936
	chunks := func(vc int) int { return (V + vc - 1) / vc }
	for _, c := range []struct {
		limit    int
		fwd, bwd int
	}{{0, 149, 224}, {maxLogitsScratch, 10, 14}} {
		vc := vocabChunk(c.limit, T, V)
		if f, b := chunks(vc), chunks(bf16DzChunk(vc)); f != c.fwd || b != c.bwd {
			t.Errorf("scratch %d: %d forward and %d backward chunks, want %d and %d", c.limit, f, b, c.fwd, c.bwd)
		}
	}
}
