// Package modelpolicy samples rollout calls with a model: a rollout.Policy
// over model.Sampler's KV-cache decoding. The built-in job's in-process
// rollouts and the CPU generator of the loop protocol (loop/fakegen) both
// play the built-in tasks through it, so a generator samples exactly as the
// built-in job does.
package modelpolicy

import (
	"fmt"
	"math"
	"math/rand/v2"

	"github.com/tracegrpo/tracegrpo/config"
	"github.com/tracegrpo/tracegrpo/model"
	"github.com/tracegrpo/tracegrpo/rollout"
)

// Policy samples with a model's sampler.
type Policy struct {
	S   *model.Sampler
	Opt model.SampleOptions
	Max int // policy.max_total_sequence_length: prompt and generation
}

// Options are the sampling options of policy.generation, stopping at
// rollout.EOS; more calls than slots decode in turn, each finished slot
// taking the next waiting prompt (every call draws from its own random
// stream, so the samples do not depend on the slot count).
func Options(g config.Generation) model.SampleOptions {
	opt := model.SampleOptions{
		Temperature: float32(g.Temperature), TopP: g.TopP, MaxNewTokens: g.MaxNewTokens,
		StopTokens: []int32{rollout.EOS},
		Refill:     true,
	}
	// NeMo RL and vLLM switch top-k off with null or -1 (any top_k ≤ 0:
	// nemo_rl/algorithms/logits_sampling_utils.py), as the training head's
	// filter does; the sampler's off is 0.
	if g.TopK != nil && *g.TopK > 0 {
		opt.TopK = *g.TopK
	}
	return opt
}

// MaxContext implements rollout.ContextLimit: a call's prompt and
// generation fit one trace of policy.max_total_sequence_length tokens.
func (p *Policy) MaxContext() int { return p.Max }

// Sample implements rollout.Policy.
func (p *Policy) Sample(prompts [][]int32, rngs []*rand.Rand) ([]rollout.Completion, error) {
	out, err := p.S.Sample(prompts, p.Opt, rngs)
	if err != nil {
		return nil, err
	}
	cs := make([]rollout.Completion, len(out))
	for i, o := range out {
		lp := make([]float64, len(o.Logprobs))
		for j, x := range o.Logprobs {
			lp[j] = float64(x)
			if math.IsNaN(lp[j]) || math.IsInf(lp[j], 0) {
				return nil, fmt.Errorf("the policy sampled token %d of prompt %d with log-probability %v: its weights are not finite or its logits overflow (earlier non-finite updates were skipped; see skipped_update in metrics.jsonl)", j, i, x)
			}
		}
		cs[i] = rollout.Completion{Tokens: o.Tokens, Logprobs: lp}
	}
	return cs, nil
}
