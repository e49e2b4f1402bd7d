package kernels

// The ops of sparse (mixture-of-experts) layers. A sparse layer routes each
// of T tokens to K of E experts, each an MLP with its own weights:
//
//	router:   logits (T,E) = x·Wgᵀ (Matmul), then RouterTopK → the K experts
//	          of each token and their weights
//	permute:  ExpertRoute sorts the N = T·K (token, expert) assignments by
//	          expert (a stable counting sort); ExpertGather copies each
//	          assignment's input row into expert-contiguous order
//	experts:  GroupedMatmul runs every expert's GEMM over its own rows
//	          (gate|up, then down), SwiGLU between them
//	combine:  ExpertCombine sums each token's K expert outputs, weighted
//
// An assignment is i = t·K + j: token t's j-th expert (experts[t, j]).
// ExpertRoute's order (N) lists the assignments in expert-contiguous order
// (order[p] = i), slot (N) is its inverse (slot[i] = p), and offsets (E+1)
// delimit each expert's rows: expert e owns positions [offsets[e],
// offsets[e+1]) of every permuted (N, ·) buffer. An expert may own no row
// (an empty expert): its GEMMs do nothing and its weight gradient is not
// touched.
//
// Every op is deterministic: sums run in a fixed order that depends only on
// the shapes and the routing (no float atomics), so a backend gives the same
// bits on every run.
//
// A backend that runs sparse models implements Experts besides Ops;
// package model finds it by type assertion and refuses a sparse config on a
// backend without it.

// Router is how RouterTopK chooses and weighs experts. The zero value of a
// field is the Qwen3-MoE/Mixtral choice; a sparse family with another
// router adds a field here and a branch in the router kernels, nothing
// else.
//
// Sigmoid is Nemotron-H's router (transformers' NemotronHMoE.
// route_tokens_to_experts, DeepSeek-V3's): scores s = σ(logits) in fp32;
// the choice ranks s + Bias (e_score_correction_bias), first by group when
// Groups > 1, while the weights are the unbiased scores of the chosen,
// renormalised when Norm, times Scale.
type Router struct {
	K    int  // experts per token (num_experts_per_tok), 1 ≤ K ≤ E
	Norm bool // renormalise the K weights to sum to one (norm_topk_prob)

	// Sigmoid scores experts with a sigmoid in place of the softmax.
	Sigmoid bool
	// Bias (E) F32, unless empty (N == 0), is added to the sigmoid scores
	// for the choice of experts only (Sigmoid only).
	Bias Buf
	// Groups > 1 limits the choice to TopGroups of Groups contiguous
	// groups of E/Groups experts (n_group, topk_group; Sigmoid only).
	Groups, TopGroups int
	// Scale multiplies the sigmoid router's weights
	// (routed_scaling_factor); 0 means 1.
	Scale float32
}

// Experts are the ops of sparse layers (see the top of this file).
type Experts interface {
	// RouterTopK: for each row t of logits (T,E) F32,
	//   probs (T,E) F32 =   softmax(logits[t]), computed in float64 and
	//                       rounded to float32;
	//   experts (T,K) I32 = the K largest probs[t] as stored (float32), in
	//                       descending order, ties broken towards the lower
	//                       expert id (as torch.topk orders equal values on
	//                       the CPU);
	//   weights (T,K) F32 = those probs, divided by their float64 sum when
	//                       r.Norm.
	//
	// With r.Sigmoid (Nemotron-H):
	//   probs (T,E) F32 =   σ(logits[t]) in float64, rounded to float32
	//                       (the scores s);
	//   c = s + r.Bias      the choice scores, one float32 addition (as
	//                       torch adds the fp32 bias; s where Bias is empty);
	//   groups (Groups > 1): a group's score is the float32 sum of its two
	//                       largest c; the TopGroups largest groups are kept (ties
	//                       to the lower group id) and every expert of
	//                       another group takes c = 0 (transformers'
	//                       masked_fill with 0.0, not −∞);
	//   experts (T,K) I32 = the K largest c, descending, ties to the lower
	//                       expert id;
	//   weights (T,K) F32 = Scale·s[e_j] / (Σ_j s[e_j] + 1e-20) when r.Norm,
	//                       else Scale·s[e_j], in float64, rounded.
	RouterTopK(probs, weights, experts, logits Buf, T, E int, r Router)
	// RouterTopKBackward: dlogits (T,E) = ∂L/∂logits from dweights (T,K)
	// F32 = ∂L/∂weights, through the renormalisation (r.Norm) and the
	// softmax, in float64. dprobs (E) F32, unless empty (N == 0), is added
	// to ∂L/∂probs[t, e] of every row t: the gradient of a loss on the
	// router's mean probabilities (the load-balancing loss). probs, weights
	// and experts are RouterTopK's outputs. dlogits is F32|BF16 (the router
	// GEMM's backward operand). With r.Sigmoid the weights' gradient flows
	// through the renormalisation and the scale to s, then
	// dlogits = s·(1−s)·∂L/∂s; the bias and the choice carry none.
	RouterTopKBackward(dlogits, dweights, probs, weights, experts, dprobs Buf, T, E int, r Router)

	// ExpertRoute sorts the N = T·K assignments of experts (T,K) I32 by
	// expert, stably (assignment order within an expert):
	//   offsets (E+1) I32 = offsets[e] = Σ_{e'<e} count(e'), offsets[E] = N;
	//   order (N) I32 =     the assignments in expert-contiguous order;
	//   slot (N) I32 =      the inverse: slot[order[p]] = p.
	// An expert id outside [0, E) is a data error reported at Sync; that
	// assignment goes to expert 0, so the outputs stay a permutation.
	ExpertRoute(offsets, order, slot, experts Buf, T, K, E int)

	// ExpertGather: dst (N,C) = src[order[p] / K] for every position p: each
	// assignment's token row, in expert-contiguous order. src (T,C) and dst
	// are F32|BF16, converted as Convert does.
	ExpertGather(dst, src, order Buf, T, K, C int)
	// ExpertGatherBackward: dsrc (T,C) F32 += Σ_j ddst[slot[t·K + j]] for
	// j = 0..K−1 in that order; ddst (N,C) F32.
	ExpertGatherBackward(dsrc, ddst, slot Buf, T, K, C int)

	// ExpertCombine: out (T,C) F32 = Σ_j weights[t, j] · y[slot[t·K + j]],
	// j = 0..K−1 in that order, from the experts' outputs y (N,C) F32.
	ExpertCombine(out, y, weights, slot Buf, T, K, C int)
	// ExpertCombineBackward: for dout (T,C) F32 = ∂L/∂out,
	//   dy (N,C) =           dy[p] = weights[i] · dout[i / K], i = order[p]
	//                        (F32|BF16: the down GEMM's backward operand);
	//   dweights (T,K) F32 = dweights[t, j] = dout[t] · y[slot[t·K + j]].
	ExpertCombineBackward(dy, dweights, dout, y, weights, order, slot Buf, T, K, C int)

	// GroupedMatmul: out[p] (OC) = inp[p] (C) · weight[e] (OC,C)ᵀ for every
	// position p of expert e (offsets as ExpertRoute writes them), for
	// out (N,OC), inp (N,C), weight (E,OC,C): one Matmul per expert over its
	// own rows. inp and weight are F32|BF16, same; out is F32|BF16.
	GroupedMatmul(out, inp, weight, offsets Buf, N, C, OC, E int)
	// GroupedMatmulBackward: dinp (N,C) += dout·weight[e] row by row;
	// dweight (E,OC,C) += Σ_{p of e} dout[p]ᵀ·inp[p], each expert summing
	// its rows in position order; an empty expert's dweight is untouched. A
	// zero-length dinp or dweight skips that half. dout, inp and weight are
	// F32|BF16, same; dinp and dweight are F32.
	GroupedMatmulBackward(dinp, dweight, dout, inp, weight, offsets Buf, N, C, OC, E int)
}
