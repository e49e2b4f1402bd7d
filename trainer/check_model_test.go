package trainer

import (
	"encoding/json"
	"strings"
	"testing"

	"github.com/tracegrpo/tracegrpo/config"
	"github.com/tracegrpo/tracegrpo/model"
	"github.com/tracegrpo/tracegrpo/rollout"
)

// TestCheckModelTokenRanges: the built-in job needs every id of its tasks in
// the vocabulary (from rollout.VocabSize up), a run on Gym's rollouts does
// not; the padding token must be in it either way. Each refusal names its
// key (config.SplitRefusals sees it as a refusal).
func TestCheckModelTokenRanges(t *testing.T) {
	mc := func(vocab int, pad any) model.Config {
		c := model.Config{VocabSize: vocab, Extra: map[string]json.RawMessage{}}
		if pad != nil {
			b, _ := json.Marshal(pad)
			c.Extra["pad_token_id"] = b
		}
		return c
	}
	for _, c := range []struct {
		name    string
		mc      model.Config
		builtin bool
		key     string
	}{
		{"built-in, too small", mc(rollout.VocabSize-1, nil), true, "policy.hf_config_overrides.vocab_size"},
		{"built-in, just enough", mc(rollout.VocabSize, nil), true, ""},
		{"rollouts, small", mc(7, nil), false, ""},
		{"pad outside", mc(100, 100), false, "pad_token_id"},
		{"pad inside", mc(100, 99), false, ""},
	} {
		err := CheckModel(c.mc, c.builtin)
		refused, other := config.SplitRefusals(err)
		switch {
		case c.key == "" && err != nil:
			t.Errorf("%s: %v", c.name, err)
		case c.key != "" && (len(refused) != 1 || len(other) != 0 || refused[0].RefusedKey() != c.key || !strings.Contains(err.Error(), "vocabulary")):
			t.Errorf("%s: %v; want one refusal of %s", c.name, err, c.key)
		}
	}
}
