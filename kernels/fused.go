package kernels

// Optional fused fast paths. A backend may implement any of these small
// interfaces besides Ops; callers find them by type assertion and fall back
// to the core ops, which compute the same thing. kernels/cpu implements
// each (the reference kernels/kerneltest checks the others against).

// AddRMSNormer fuses the residual add with the RMSNorm that follows it:
// one pass over the residual stream instead of three.
type AddRMSNormer interface {
	// AddRMSNorm: sum (N,C) = a (N,C) + b (N,C) (=; sum may alias a or b),
	// then RMSNorm(out, rstd, sum, weight, N, C, eps): out (N,C) =,
	// rstd (N) =. The results are those of Add then RMSNorm on the same
	// backend. sum, a, b, weight and rstd are F32; out is F32|BF16.
	AddRMSNorm(sum, out, rstd, a, b, weight Buf, N, C int, eps float32)
}

// SampleParams are the sampling distribution's settings (model's
// SampleOptions without the stopping rules).
type SampleParams struct {
	// Temperature divides the logits; 0 means greedy (argmax, the lowest id
	// among equal maxima, logprob 0).
	Temperature float32
	// TopK and TopP filter the temperature-scaled logits as NeMo RL (and
	// vLLM) do (TopKTopP): TopK ≤ 0 and TopP 0 or 1 are off.
	TopK int
	TopP float64
}

// Filter is the top-k/top-p filter of p.
func (p SampleParams) Filter() TopKTopP { return TopKTopP{TopK: p.TopK, TopP: p.TopP} }

// TokenSampler draws the next token of each row on the backend, so that
// decoding moves only token ids and logprobs to the host, never the logits.
type TokenSampler interface {
	// SampleTokens: for each row b of logits (B,V) F32, tokens[b] (B) I32 =
	// and logprobs[b] (B) F32 = log q(tokens[b]) under the distribution it
	// was drawn from. u (2B) I32 holds row b's uniform in [0, 1) as the
	// bits of a float64, low word first (drawn on the host from the row's
	// own random stream). The draw:
	//
	//	z'_i = z_i · (1/Temperature)            (float32, as the LM head scales)
	//	K    = the tokens p.Filter() keeps of z' (FilterCut)
	//	w_i  = FixedWeight(z'_i, max z')        (2⁻⁴⁰ fixed point, exact sums)
	//	tok  = the first i ∈ K, in id order, with Σ_{j∈K, j≤i} w_j > u·Σ_K w
	//	       (the last of K if none, which rounding alone can cause)
	//	logprob = (z'_tok − max z') − log Σ_K exp(z'_j − max z')   (float64)
	//
	// The weights' sums are exact, so backends agree on the token; the
	// logprob's float64 sum runs in each backend's own order.
	SampleTokens(tokens, logprobs, logits, u Buf, B, V int, p SampleParams)
}

// RopeConverter fuses Rope with the conversion of its result: q and k
// rotated and rounded to attention's bf16 operands in one pass, the fp32
// input kept.
type RopeConverter interface {
	// RopeConvert: out (T,H,HD) = x (T,H,HD) rotated as Rope rotates it,
	// in out's dtype (F32|BF16, rounded as Convert does); x (F32) is
	// unchanged. A row whose position is outside the tables is copied
	// unrotated and reported at Sync, as Rope leaves it.
	RopeConvert(out, x, pos, cos, sin Buf, T, H, HD int)
}
