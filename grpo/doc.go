// Package grpo is the model-agnostic core of multi-trace GRPO (spec §4–§8,
// docs/multitrace-grpo.md): capability guards on the configuration, the
// expansion of logical rollouts into physical training rows, one advantage per
// logical rollout, and the clipped policy-gradient loss with its analytic
// gradient with respect to the per-token log-probabilities.
//
// It never imports the model: the loss consumes per-token log-probabilities and
// returns the loss, dLoss/dlogprob and metrics.
//
// # Alignment convention
//
// Every per-token array of a row is aligned with the row's TokenIDs: position t
// holds the value for token x_t. For log-probabilities this means
//
//	LP[t] = log p(x_t | x_0 .. x_{t-1})   for t >= 1,
//
// exactly like the envelope's generation_logprobs. Position 0 has no
// log-probability and never has loss: the envelope guarantees loss_mask[0] = 0,
// the loss ignores LP[0] and writes DLP[0] = 0. (NeMo RL stores the same values
// shifted by one — next_token_logprobs[:, t-1] with token_mask[:, 1:] — which is
// the same pairing of mask bit and log-probability.)
//
// # Normalization
//
// The step loss is the mean over the step's eligible tokens (spec §6.5):
//
//	L = Σ_{rows,t} (w·ℓ + kl)·m / (G_tok + 1e-8),   m = token_mask·sample_mask,
//
// where G_tok = Σ m over every row of the step (Batch.GTok), computed once per
// optimizer step. Loss evaluates any subset of rows (a micro-batch) against that
// global G_tok, so the losses and gradients of the micro-batches of any
// partition of the rows sum to the whole-batch loss and gradient. Metrics come
// back as partial sums (LossSums) that add across micro-batches and become
// means with LossSums.Metrics(G_tok).
//
// # Decisions where the sources are silent (INFERRED in the spec)
//
//   - Behaviour log-probabilities stay float64 (NeMo RL stores float32 copies):
//     custody is exact, not rounded.
//   - Padding rows take the advantage of logical rollout 0 (the spec's
//     A_logical[idx(row)] with idx 0); their sample mask is 0, so it is inert.
//   - Advantages are clipped to [advantage_clip_low, advantage_clip_high] after
//     the estimator, as the legacy loop does.
//   - gym_multi_trace on with a delivery other than all_traces is refused (both
//     sides must opt in).
//   - policy.megatron_cfg.enabled is not required: NeMo RL requires it only
//     because its PR patched the Megatron worker; tracegrpo has one engine and
//     normalizes both optimizer kinds (config.Optim).
//   - A truncated-importance-sampling type with importance correction off:
//     seq-mask-tis is accepted and inert (spec §8.1, §10.1 #9); tis and icepop
//     are refused (spec §6.3).
//   - Keys whose semantics tracegrpo does not implement are refused rather than
//     ignored: grpo.reward_scaling.enabled, loss_fn.use_kl_in_reward,
//     loss_fn.positive_example_nll_weight != 0 (its per-micro-batch
//     normalization breaks micro-batch invariance).
package grpo
