package trainer

import (
	"math"
	"testing"
)

// TestFilteredLogprobsMatchTheSampler runs the built-in job under
// policy.generation top_k/top_p with a KL penalty. Its sampler draws from
// NeMo RL's filtered distribution (kernels.SampleRow) and the training
// head computes the same filter at the same weights, so:
//   - no eligible token falls outside the training filter
//     (filter_masked_tokens 0),
//   - the sampler's logprobs are the training head's to float32 rounding:
//     token_mult_prob_error = mean exp|lp_gen − lp_old| is 1 within 1e-5,
//     where with the training filter off (trainUnfiltered) it is
//     measurably above 1,
//   - step 1's KL is 0: the KL term reads the unfiltered current logprobs
//     against the unfiltered reference (NeMo RL's curr_logprobs_unfiltered),
//     which are the same weights there; the filtered ones would not be.
func TestFilteredLogprobsMatchTheSampler(t *testing.T) {
	filter := []string{"--set", "policy.generation.top_k=8", "--set", "policy.generation.top_p=0.8",
		"--set", "loss_fn.reference_policy_kl_penalty=0.05"}
	out := t.TempDir()
	mustTrain(t, trainArgs(out, 3, filter...)...)
	ms := metricsNoTimes(t, out)
	for _, m := range ms {
		if m.FilterMaskedTokens != 0 {
			t.Errorf("step %d: %d eligible tokens outside the training filter, want 0 (the sampler drew them under the same filter)", m.Step, m.FilterMaskedTokens)
		}
		if d := math.Abs(float64(m.TokenMultProbErr) - 1); !(d < 1e-5) {
			t.Errorf("step %d: token_mult_prob_error %v, want 1 within 1e-5 (the sampler's logprobs are the filtered ones)", m.Step, m.TokenMultProbErr)
		}
	}
	if ms[0].KL != 0 {
		t.Errorf("step 1 KL %v, want 0: the unfiltered logprobs of the policy are the reference's", ms[0].KL)
	}
	if !(ms[2].KL > 0) {
		t.Errorf("step 3 KL %v, want > 0 after two updates", ms[2].KL)
	}

	trainUnfiltered = true
	defer func() { trainUnfiltered = false }()
	off := t.TempDir()
	mustTrain(t, trainArgs(off, 1, filter...)...)
	m := metricsNoTimes(t, off)[0]
	if !(float64(m.TokenMultProbErr) > 1+1e-3) {
		t.Errorf("unfiltered training: token_mult_prob_error %v, want above 1 + 1e-3 (the filtered sampler's logprobs are renormalized)", m.TokenMultProbErr)
	}
	t.Logf("token_mult_prob_error: %.9g with the filter in training, %.6g without; entropy %.4g against %.4g", float64(ms[0].TokenMultProbErr), float64(m.TokenMultProbErr), float64(ms[0].Entropy), float64(m.Entropy))
}

// TestFilteredOutTokensAreMasked trains external captures, whose tokens
// were not drawn by this model, under top_k 16 (of 32): about half the sampled tokens fall
// outside the training filter. NeMo RL's mask_out_neg_inf_logprobs makes
// their −inf log-probabilities 0 with no gradient (the loss would refuse
// a −inf on a loss token), and counts them.
func TestFilteredOutTokensAreMasked(t *testing.T) {
	dir := t.TempDir()
	recs, caps := gymFixture(t, dir)
	out := t.TempDir()
	args := append([]string{"--out", out, "--steps", "1", "--rollouts", recs, "--captures", caps}, externalSets...)
	mustTrain(t, append(args, "--set", "policy.generation.top_k=16")...)
	m := metricsNoTimes(t, out)[0]
	if !(m.FilterMaskedTokens > 0 && m.FilterMaskedTokens < m.EligibleTokens) {
		t.Errorf("filter_masked_tokens %d of %d eligible: want some but not all (top_k 16 keeps half the vocabulary)", m.FilterMaskedTokens, m.EligibleTokens)
	}
	if math.IsNaN(float64(m.Loss)) || math.IsInf(float64(m.Loss), 0) || math.IsNaN(float64(m.GradNorm)) {
		t.Errorf("loss %v, grad norm %v: want finite", m.Loss, m.GradNorm)
	}
}
