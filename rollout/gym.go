package rollout

import (
	"encoding/json"

	"github.com/tracegrpo/tracegrpo/gym"
)

// GymRecorder records calls into a NeMo Gym capture store exactly as Gym's
// capture middleware would: an intent before dispatch, then one schema-3
// TokenEntry per call with the full prompt, the sampled tokens and their
// logprobs, the request-time parent decision (root, or resolved to the call
// it continues) and the cumulative proofs (cum_len, digest), and a freeze when
// the episode ends.
type GymRecorder struct {
	W *gym.Writer
	// Model is the served model name written into every entry.
	Model string
	// clock stamps created_at deterministically (it is non-semantic).
	clock float64
}

// Begin writes the call's intent before it is dispatched.
func (g *GymRecorder) Begin(rolloutID, callID string) error {
	return g.W.BeginCall(rolloutID, callID)
}

// Clear removes a rollout's captures before it is dispatched.
func (g *GymRecorder) Clear(rolloutID string) error { return g.W.Clear(rolloutID) }

// Record writes the call's TokenEntry.
func (g *GymRecorder) Record(c RecordedCall) error {
	g.clock++
	res := gym.ParentRoot
	var parent *string
	if c.ParentCallID != "" {
		res = gym.ParentResolved
		p := c.ParentCallID
		parent = &p
	}
	resp := c.ResponseID
	item, _ := json.Marshal(map[string]any{"type": "message", "role": "assistant", "id": c.ResponseID})
	zero := 0
	e := &gym.TokenEntry{
		SchemaVersion:      gym.TokenEntrySchemaVersion,
		RolloutID:          c.RolloutID,
		ModelCallID:        c.CallID,
		Model:              g.Model,
		PromptTokenIDs:     c.Prompt,
		GenerationTokenIDs: c.Generation,
		GenerationLogProbs: c.Logprobs,
		OutputItems:        []json.RawMessage{item},
		TokenItemIndex:     &zero,
		ResponseID:         &resp,
		CreatedAt:          g.clock,
		ParentCallID:       parent,
		ParentResolution:   &res,
	}
	e.Stamp()
	return g.W.Put(e)
}

// Finish freezes the rollout's capture.
func (g *GymRecorder) Finish(rolloutID string) error { return g.W.Freeze(rolloutID) }
