package modelpolicy

import (
	"testing"

	"github.com/tracegrpo/tracegrpo/config"
)

// TestOptionsTopKOff: NeMo RL's (and vLLM's) top_k -1 or null switches
// top-k off, as it does for the training head; the sampler refused -1 at
// the first step's rollouts.
func TestOptionsTopKOff(t *testing.T) {
	ip := func(v int) *int { return &v }
	for _, c := range []struct {
		topK *int
		want int
	}{{nil, 0}, {ip(-1), 0}, {ip(-7), 0}, {ip(0), 0}, {ip(1), 1}, {ip(50), 50}} {
		g := config.Generation{Temperature: 1, TopP: 1, MaxNewTokens: 4, TopK: c.topK}
		if got := Options(g).TopK; got != c.want {
			t.Errorf("top_k %v: sampler TopK %d, want %d", c.topK, got, c.want)
		}
	}
}
