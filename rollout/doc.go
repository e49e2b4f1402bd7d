// Package rollout holds tracegrpo's built-in agentic tasks and the runner that
// plays their episodes with the current policy.
//
// Every episode makes several model calls, and the tasks are chosen so that
// the capture builders see each shape the trainer must handle:
//
//   - calc: a tool call, then an answer that continues the same context
//     (prefix_merging: one trace; per_request: two).
//   - branch: one call, then two sub-questions forking from its context
//     (prefix_merging: two traces sharing the first call, which only one owns;
//     per_request: three).
//   - compact: a call, then a fresh context holding only the model's own
//     summary — not a prefix continuation — and a tool round after it
//     (prefix_merging: two traces; per_request: three).
//
// A verifier scores each episode in [0, 1] with partial credit per turn, so a
// tiny model trained from scratch gets a gradient from its first step.
//
// The runner plays all episodes of a step in lockstep rounds, batching every
// pending call of a round into one policy request in a fixed order; for a
// seeded policy the whole step is deterministic. It reports every call to a
// Recorder as NeMo Gym's capture middleware records it (intent, entry,
// freeze); GymRecorder writes Gym's capture store, which the trainer then
// reads back through the same reader and builders as external captures.
//
// The package never imports the model: a Policy is anything that samples.
package rollout
