// Package gym reads NeMo Gym token-ID captures and turns them into training
// traces exactly as NeMo Gym and NeMo RL do (spec docs/multitrace-grpo.md
// §1–§3, §8): TokenEntry schema v3, the capture digest, the file capture store,
// rollout correlation, the prefix_merging and per_request builders, the
// training_traces v1 envelope and rollout finalization.
//
// The package deals in names, tokens and bytes only; it imports no model code.
package gym
