package kernels

import "math"

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

// FreshMatmulBackward is MatmulBackward with dinp assigned, not
// accumulated: a gradient that is fresh needs no Fill first (a GPU runs
// the product with beta = 0, one pass over dinp fewer).
type FreshMatmulBackward interface {
	// MatmulBackwardFresh: dinp (T,C) = dout·weight; dweight (OC,C) +=
	// doutᵀ·inp. Otherwise as MatmulBackward (dtypes, a zero-length dinp
	// or dweight skipped), except that dinp may be BF16 too: the fp32
	// result rounded once (a gradient whose consumer takes bf16 needs no
	// cast pass); dinp may hold anything before.
	MatmulBackwardFresh(dinp, dweight, dout, inp, weight Buf, T, C, OC int)
}

// MatmulAdder fuses a residual add into the GEMM before it: a GPU runs it
// as the GEMM's epilogue (beta = 1, the residual as C, the output as D),
// so the sum needs no pass of its own.
type MatmulAdder interface {
	// MatmulAdd: out (T,OC) = res (T,OC) + inp (T,C)·weight (OC,C)ᵀ (=;
	// out may be res). inp and weight share one dtype (F32|BF16), as
	// Matmul takes them; out and res share one (F32|BF16). The product
	// (as Matmul forms it, in fp32) and res are added in fp32 and rounded
	// once into out's dtype (on the CPU and F32, the bits of Matmul then
	// Add; a GPU's GEMM may sum the product in another order).
	MatmulAdd(out, res, inp, weight Buf, T, C, OC int)
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

// QKNormRoper makes Qwen3's attention inputs from the fused q|k|v GEMM's
// output as it lies, in one pass: the q/k norms, RoPE and the cast to
// attention's operands, v cast alongside; no split copies, no fp32 q and
// k in between.
type QKNormRoper interface {
	// QKNormRope: row t of qkv (T, (NH+2·NKV)·HD) F32 holds q's NH heads,
	// then k's NKV, then v's NKV, HD values each. qraw (T,NH,HD) F32 = q's
	// heads and kraw (T,NKV,HD) F32 = k's (=); qrstd (T,NH) and
	// krstd (T,NKV) = as RMSNorm computes them over each head row with qw,
	// kw (HD) F32 and eps; q (T,NH,HD) and k (T,NKV,HD) = the normed rows
	// rotated as Rope rotates them by pos (T) I32 and the tables cos, sin
	// (P, HD/2), rounded as Convert rounds into q's dtype (F32|BF16); v
	// (T,NKV,HD) = v's heads in v's dtype (q, k and v share one). A row
	// whose position is outside the tables is left unrotated and reported
	// at Sync, as Rope leaves it.
	QKNormRope(q, k, v, qraw, kraw, qrstd, krstd, qkv, qw, kw, pos, cos, sin Buf, T, NH, NKV, HD int, eps float32)
}

// QKNormRopeBackwarder is QKNormRoper's backward, written straight into
// the packed gradient the q|k|v GEMM's backward consumes: no split copies,
// no fp32 dq and dk in between (it serves models without q/k norms too:
// RoPE's backward and the packing alone).
type QKNormRopeBackwarder interface {
	// QKNormRopeBackward: row t of dqkv (T, (NH+2·NKV)·HD) F32|BF16 =
	// q's NH head gradients, then k's NKV, then v's NKV, rounded as
	// Convert rounds into dqkv's dtype. A q head's: its row of dq
	// (T,NH,HD) F32 rotated back as RopeBackward rotates it by pos (T) I32
	// and the tables cos, sin (P, HD/2), then, with q/k norms, through the
	// norm as RMSNormBackward takes it with qraw (T,NH,HD), qw (HD) and
	// qrstd (T,NH) (dqw (HD) += its weight gradient); k's alike from dk
	// (T,NKV,HD), kraw, kw, krstd, dkw; v's dv (T,NKV,HD) F32 as it is.
	// Without norms qw, kw, qraw, kraw, qrstd, krstd, dqw and dkw are
	// zero-length. dq and dk are scratch: their contents afterwards are
	// unspecified. HD ≤ QKNormRopeBackwardMaxHD. A row whose position is
	// outside the tables is not rotated and is reported at Sync, as
	// RopeBackward leaves it.
	QKNormRopeBackward(dqkv, dqw, dkw, dq, dk, dv, qraw, kraw, qrstd, krstd, qw, kw, pos, cos, sin Buf, T, NH, NKV, HD int)
}

// QKNormRopeBackwardMaxHD is the widest head QKNormRopeBackward takes (a
// GPU keeps a head row's values in registers); the model runs the split
// path for wider heads.
const QKNormRopeBackwardMaxHD = 1024

// AdamChunk is one piece of a multi-tensor AdamW step: elements
// [Off, Off+N) of the arenas, all in one parameter group (Group, which
// the non-finite check reports) with weight decay or without.
type AdamChunk struct {
	Off   int64
	N     int32
	Group int32
	Decay bool
}

// AdamChunkWords is the I32 words a chunk takes in a device chunk table:
// Off's low and high halves, N, and Group<<1 | Decay.
const AdamChunkWords = 4

// EncodeAdamChunks writes chunks as a chunk table (AdamChunkWords I32 words
// each) for AdamWMulti.
func EncodeAdamChunks(chunks []AdamChunk) []int32 {
	out := make([]int32, 0, AdamChunkWords*len(chunks))
	for _, c := range chunks {
		d := int32(0)
		if c.Decay {
			d = 1
		}
		out = append(out, int32(uint32(c.Off)), int32(uint32(uint64(c.Off)>>32)), c.N, c.Group<<1|d)
	}
	return out
}

// MultiAdamW is a whole optimizer step's AdamW over many parameter groups
// in one pass, with the gradient clip and both non-finite checks on the
// backend: the update needs no host round trip after the gradient norm,
// and the new weights no second pass to be checked.
type MultiAdamW interface {
	// AdamWMulti: from sums (nsums) F32, the groups' Σ g² (after any
	// all-reduce), in float64: S = Σ_i sums[i] (i ascending), norm =
	// sqrt(S). If norm is not finite nothing changes and flags[0] = 1.
	// Otherwise flags[0] = 0, flags[1] holds the float32 bits of the clip
	// factor c = float32(ClipScale(norm, maxNorm)) (torch's
	// clip_grad_norm_), and every chunk of table (nchunks chunks,
	// EncodeAdamChunks) is updated as AdamW updates it with step
	// (GradScale = c; step.WeightDecay on the Decay chunks, 0 on the
	// others). flags (2+groups) I32 =: flags[2+g] = 1 when an updated
	// weight of group g is not finite or its square overflows float32
	// (|p| ≥ 2⁶⁴), else 0.
	// param and grad are F32; m and v as AdamW takes them under the rule.
	AdamWMulti(param, grad, m, v, sums, table, flags Buf, nsums, nchunks int, step AdamWStep, maxNorm float64)
}

// ClipScale is AdamWMulti's clip factor for the gradient norm norm: the
// host's and every backend's computation of it, in float64.
func ClipScale(norm, maxNorm float64) float64 {
	if maxNorm <= 0 {
		return 1
	}
	return math.Min(1, maxNorm/(norm+1e-6))
}

// WeightTooLarge reports whether a weight fails AdamWMulti's check: not
// finite, or too large to square in float32.
func WeightTooLarge(p float32) bool {
	a := math.Abs(float64(p))
	return !(a < 1<<64)
}
