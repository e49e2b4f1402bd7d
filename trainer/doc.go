// Package trainer is tracegrpo's synchronous multi-trace GRPO loop, as a
// package that a command line, a test or another launcher can drive: New
// checks a run's configuration and inputs and builds the policy, the
// optimizer and the rollout source on the backend the caller chose; Run
// trains step after step (Run's body reads as the step: rollouts →
// finalize → rows and advantages → previous-policy log-probabilities →
// forward, loss and backward per micro-batch → one clipped AdamW update →
// scheduler tick counted in logical rollouts → checkpoint → metrics line).
//
// Invariants: every random stream and the rollout cursor are checkpointed,
// so --resume continues bit for bit; a run directory holds one run; nothing
// is trained on evidence that finalization masked; a signal ends the run
// after the step in progress with a checkpoint of it.
package trainer
