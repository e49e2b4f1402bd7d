package trainer

import (
	"bytes"
	"fmt"
	"math"
	"path/filepath"
	"testing"

	"github.com/tracegrpo/tracegrpo/checkpoint"
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

// fusedAdamBF16 switches the built-in job to policy.optimizer with
// TransformerEngine's FusedAdam and bfloat16 moments (the optimizer of
// NeMo RL's exp_avg_dtype recipes).
var fusedAdamBF16 = []string{
	"--set", "policy.megatron_cfg.enabled=false", "--set", "policy.dtensor_cfg.enabled=true",
	"--set", "policy.optimizer.name=transformer_engine.pytorch.optimizers.fused_adam.FusedAdam",
	"--set", "policy.optimizer.kwargs.lr=3e-3", "--set", "policy.optimizer.kwargs.weight_decay=0.01",
	"--set", "policy.optimizer.kwargs.betas=[0.9,0.999]", "--set", "policy.optimizer.kwargs.eps=1e-8",
	"--set", "policy.optimizer.kwargs.exp_avg_dtype=torch.bfloat16",
	"--set", "policy.optimizer.kwargs.exp_avg_sq_dtype=torch.bfloat16",
}

// TestBF16MomentsResumeBitExact: with bf16 Adam moments a run crashed
// after step k and resumed ends bit-identical to the uninterrupted run
// (weights, moments, metrics): the checkpoint keeps the moments as
// float32, as FusedAdam's state_dict casts them, and resume rounds them
// back exactly. The moments are bf16 values (the checkpoint's float32
// holds no bit below bf16's), and training with them differs from
// float32 moments.
func TestBF16MomentsResumeBitExact(t *testing.T) {
	const n = 4
	ref := t.TempDir()
	mustTrain(t, trainArgs(ref, n, fusedAdamBF16...)...)
	for _, k := range []int{2, 3} {
		t.Run(fmt.Sprintf("crash after step %d", k), func(t *testing.T) {
			exactResume(t, ref, n, k, fusedAdamBF16)
		})
	}
	st, err := checkpoint.Load(filepath.Join(ref, "checkpoints", checkpoint.StepDir(n)), checkpoint.LoadOptions{})
	if err != nil {
		t.Fatal(err)
	}
	nonzero := 0
	for _, x := range st.Optimizer {
		for _, f := range x.F32 {
			if b := math.Float32bits(f); b&0xffff != 0 {
				t.Fatalf("%s holds %v (bits %#x): not a bf16 value", x.Name, f, b)
			} else if f != 0 {
				nonzero++
			}
		}
	}
	if nonzero == 0 {
		t.Fatal("every moment is zero: the test trains nothing")
	}
	f32 := t.TempDir()
	mustTrain(t, trainArgs(f32, n, fusedAdamBF16[:len(fusedAdamBF16)-4]...)...)
	if bytes.Equal(checkpointBytes(t, ref, n, checkpoint.ModelFile), checkpointBytes(t, f32, n, checkpoint.ModelFile)) {
		t.Error("float32 and bfloat16 moments train the same weights")
	}
}

// TestFilteredOutTokensHaveNoGradient: under top_k 1 every sampled token
// of the external captures falls outside the training filter (none is its
// position's argmax), so NeMo RL's loss is a constant of the masked
// logprobs (−A·1 per token) and, with no KL term, the gradient is exactly
// zero.
func TestFilteredOutTokensHaveNoGradient(t *testing.T) {
	dir := t.TempDir()
	recs, caps := gymFixture(t, dir)
	out := t.TempDir()
	args := append([]string{"--out", out, "--steps", "1", "--rollouts", recs, "--captures", caps}, externalSets...)
	mustTrain(t, append(args, "--set", "policy.generation.top_k=1", "--set", "loss_fn.reference_policy_kl_penalty=0")...)
	m := metricsNoTimes(t, out)[0]
	if m.FilterMaskedTokens != m.EligibleTokens || m.EligibleTokens == 0 {
		t.Fatalf("filter_masked_tokens %d of %d eligible: the fixture no longer has every token outside top_k 1", m.FilterMaskedTokens, m.EligibleTokens)
	}
	if m.GradNorm != 0 {
		t.Errorf("grad norm %v, want 0: a masked token's logprob is a constant", m.GradNorm)
	}
}
