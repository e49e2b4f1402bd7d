package rollout

import (
	"encoding/hex"
	"fmt"
	"math/rand/v2"
	"slices"
)

// Completion is what the policy sampled for one prompt: the generated tokens
// (including the stop token when it stopped) and their log-probabilities under
// the sampling distribution, as an inference server reports them.
type Completion struct {
	Tokens   []int32
	Logprobs []float64
}

// Policy samples continuations of a batch of prompts, in order. rngs[i] is
// the random stream of prompt i's call alone (Streams.Sampling), so that a
// call's sample does not depend on the rest of the batch.
type Policy interface {
	Sample(prompts [][]int32, rngs []*rand.Rand) ([]Completion, error)
}

// RecordedCall is one finished model call, exactly as the model served it.
type RecordedCall struct {
	RolloutID    string
	CallID       string // 32 hex digits, like Gym's uuid4().hex
	ParentCallID string // "" for a root call
	ResponseID   string // the served response id
	Prompt       []int32
	Generation   []int32
	Logprobs     []float64
}

// Recorder receives the capture of every call, as Gym's capture middleware
// would: Begin before the request is dispatched (a durable intent), Record
// once the complete response is known, Finish when the episode is over.
type Recorder interface {
	Begin(rolloutID, callID string) error
	Record(c RecordedCall) error
	Finish(rolloutID string) error
}

// Spec is one logical rollout to run: its capture identity, its task group
// coordinates and the problem it plays.
type Spec struct {
	Step         int    // the GRPO step (1-based) the rollout belongs to
	RolloutID    string // the explicit _ng_rollout_id, assigned before dispatch
	TaskIndex    int    // the task group (_ng_task_index)
	RolloutIndex int    // index within the group (_ng_rollout_index)
	Task         string
	Instance     Instance
}

// Result is a finished logical rollout.
type Result struct {
	Spec
	Reward float64
	Calls  []RecordedCall
	// ContextOverflow says the episode ended because its next call's prompt
	// left the policy no room to generate (see ContextLimit): like an agent
	// whose context window overflows, it failed, with reward 0.
	ContextOverflow bool
}

// ContextLimit is implemented by a policy whose calls have a bounded
// context: MaxContext is the most tokens of prompt and generation together.
// Run ends an episode whose next prompt holds MaxContext tokens or more.
type ContextLimit interface {
	MaxContext() int
}

// TerminalResponseID is the response id of the episode's last call: the
// response the verifier scored.
func (r *Result) TerminalResponseID() string {
	if len(r.Calls) == 0 {
		return ""
	}
	return r.Calls[len(r.Calls)-1].ResponseID
}

// Record returns the rollout record as NeMo Gym's rollout collection writes
// it, ready for capture finalization: the correlation keys, the reward and
// the scored response's id.
func (r *Result) Record() map[string]any {
	rec := map[string]any{
		"_ng_task_index":    r.TaskIndex,
		"_ng_rollout_index": r.RolloutIndex,
		"_ng_rollout_id":    r.RolloutID,
		"reward":            r.Reward,
		"task":              r.Task,
		"response":          map[string]any{"id": r.TerminalResponseID()},
	}
	if r.ContextOverflow {
		rec["context_overflow"] = true
	}
	return rec
}

// Plan draws the logical rollouts of one GRPO step: prompts task groups of
// gens rollouts each. Task groups cycle through tasks; every rollout of a
// group plays the same instance, drawn from st.Instance(step, group).
// Rollout ids are unique across steps because they carry the step number,
// so indices may restart every step.
func Plan(tasks []Task, step, prompts, gens int, st Streams) []Spec {
	specs := make([]Spec, 0, prompts*gens)
	for p := 0; p < prompts; p++ {
		task := tasks[(step*prompts+p)%len(tasks)]
		inst := task.NewInstance(st.Instance(step, p))
		for g := 0; g < gens; g++ {
			specs = append(specs, Spec{
				Step:         step,
				RolloutID:    fmt.Sprintf("step%06d-%d-%d", step, p, g),
				TaskIndex:    p,
				RolloutIndex: g,
				Task:         task.Name(),
				Instance:     inst,
			})
		}
	}
	return specs
}

// Run plays the episodes of specs to completion in lockstep rounds: each
// round gathers every active episode's pending calls, in spec order, into
// one policy batch. Every rollout mints its model call ids from
// st.CallIDs and samples each call from st.Sampling, so a rollout's result
// depends on its spec and the policy only, not on the other specs run with
// it. A Recorder that also has a Clear(rolloutID string) error method is
// asked to clear each rollout id before anything is dispatched, as Gym does
// before reusing a key.
func Run(policy Policy, rec Recorder, specs []Spec, st Streams) ([]Result, error) {
	type active struct {
		ep       Episode
		calls    []RecordedCall
		ids      *rand.Rand
		issued   int // calls dispatched so far
		done     bool
		overflow bool
	}
	maxContext := 0
	if l, ok := policy.(ContextLimit); ok {
		maxContext = l.MaxContext()
	}
	eps := make([]active, len(specs))
	for i, s := range specs {
		eps[i].ep = s.Instance.NewEpisode()
		eps[i].ids = st.CallIDs(s.Step, s.TaskIndex, s.RolloutIndex)
		if c, ok := rec.(interface{ Clear(rolloutID string) error }); ok {
			if err := c.Clear(s.RolloutID); err != nil {
				return nil, fmt.Errorf("rollout: clear %s before dispatch: %w", s.RolloutID, err)
			}
		}
	}
	type pending struct {
		ep   int
		call Call
		id   string
		rng  *rand.Rand
	}
	for {
		var batch []pending
		for i := range eps {
			if eps[i].done {
				continue
			}
			calls := eps[i].ep.Next()
			for _, c := range calls {
				if maxContext > 0 && len(c.Prompt) >= maxContext {
					eps[i].overflow = true
					calls = nil
					break
				}
			}
			if len(calls) == 0 {
				eps[i].done = true
				if err := rec.Finish(specs[i].RolloutID); err != nil {
					return nil, fmt.Errorf("rollout: finish %s: %w", specs[i].RolloutID, err)
				}
				continue
			}
			s := specs[i]
			for _, c := range calls {
				rng := st.Sampling(s.Step, s.TaskIndex, s.RolloutIndex, eps[i].issued)
				eps[i].issued++
				batch = append(batch, pending{ep: i, call: c, id: newCallID(eps[i].ids), rng: rng})
			}
		}
		if len(batch) == 0 {
			break
		}
		prompts := make([][]int32, len(batch))
		rngs := make([]*rand.Rand, len(batch))
		for j, p := range batch {
			rngs[j] = p.rng
			if err := rec.Begin(specs[p.ep].RolloutID, p.id); err != nil {
				return nil, fmt.Errorf("rollout: begin call %s of %s: %w", p.id, specs[p.ep].RolloutID, err)
			}
			prompts[j] = p.call.Prompt
		}
		out, err := policy.Sample(prompts, rngs)
		if err != nil {
			return nil, fmt.Errorf("rollout: sample: %w", err)
		}
		if len(out) != len(batch) {
			return nil, fmt.Errorf("rollout: policy returned %d completions for %d prompts", len(out), len(batch))
		}
		gens := make(map[int][][]int32)
		for j, p := range batch {
			c := out[j]
			spec := specs[p.ep]
			if len(c.Tokens) == 0 || len(c.Tokens) != len(c.Logprobs) {
				return nil, fmt.Errorf("rollout: %s: policy returned %d tokens and %d logprobs (need equal, at least 1)",
					spec.RolloutID, len(c.Tokens), len(c.Logprobs))
			}
			a := &eps[p.ep]
			parent := ""
			if p.call.Parent >= 0 {
				if p.call.Parent >= len(a.calls) {
					return nil, fmt.Errorf("rollout: %s task %s: call continues call %d of %d finished calls",
						spec.RolloutID, spec.Task, p.call.Parent, len(a.calls))
				}
				pc := a.calls[p.call.Parent]
				if !isContinuation(pc, p.call.Prompt) {
					return nil, fmt.Errorf("rollout: %s task %s: call claims parent %s but its prompt does not extend the parent's tokens",
						spec.RolloutID, spec.Task, pc.CallID)
				}
				parent = pc.CallID
			}
			rc := RecordedCall{
				RolloutID:    spec.RolloutID,
				CallID:       p.id,
				ParentCallID: parent,
				ResponseID:   "resp_" + p.id,
				Prompt:       slices.Clone(p.call.Prompt),
				Generation:   slices.Clone(c.Tokens),
				Logprobs:     slices.Clone(c.Logprobs),
			}
			if err := rec.Record(rc); err != nil {
				return nil, fmt.Errorf("rollout: record call %s of %s: %w", p.id, spec.RolloutID, err)
			}
			a.calls = append(a.calls, rc)
			gens[p.ep] = append(gens[p.ep], rc.Generation)
		}
		for i := range eps {
			if g, ok := gens[i]; ok {
				eps[i].ep.Observe(g)
			}
		}
	}
	results := make([]Result, len(specs))
	for i, s := range specs {
		if eps[i].overflow {
			results[i] = Result{Spec: s, Calls: eps[i].calls, ContextOverflow: true}
			continue
		}
		r := eps[i].ep.Reward()
		if r < 0 || r > 1 {
			return nil, fmt.Errorf("rollout: %s task %s: reward %v outside [0, 1]", s.RolloutID, s.Task, r)
		}
		results[i] = Result{Spec: s, Reward: r, Calls: eps[i].calls}
	}
	return results, nil
}

// isContinuation reports whether prompt starts with parent's prompt and generation.
func isContinuation(parent RecordedCall, prompt []int32) bool {
	n := len(parent.Prompt) + len(parent.Generation)
	return len(prompt) > n &&
		slices.Equal(prompt[:len(parent.Prompt)], parent.Prompt) &&
		slices.Equal(prompt[len(parent.Prompt):n], parent.Generation)
}

// newCallID returns 32 hex digits from rng, shaped like uuid4().hex.
func newCallID(rng *rand.Rand) string {
	var b [16]byte
	for i := 0; i < 16; i += 8 {
		v := rng.Uint64()
		for j := 0; j < 8; j++ {
			b[i+j] = byte(v >> (8 * j))
		}
	}
	b[6] = b[6]&0x0f | 0x40 // version 4
	b[8] = b[8]&0x3f | 0x80 // RFC 4122 variant
	return hex.EncodeToString(b[:])
}
