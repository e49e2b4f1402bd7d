package rollout

import "github.com/tracegrpo/tracegrpo/gym"

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
	e := gym.NewCallEntry(c.RolloutID, c.CallID, g.Model, c.Prompt, c.Generation, c.Logprobs, c.ParentCallID, c.ResponseID)
	e.CreatedAt = g.clock
	return g.W.Put(e)
}

// Finish freezes the rollout's capture.
func (g *GymRecorder) Finish(rolloutID string) error { return g.W.Freeze(rolloutID) }
