// Package kernels defines the compute backend interface that the model and the
// optimizer run on. It holds no math and no cgo: kernels/cpu is the pure-Go
// reference implementation, kernels/cuda runs the same ops on an NVIDIA GPU, and
// kernels/kerneltest checks any backend against kernels/cpu.
//
// # Buffers
//
// A Buf is a small value naming a run of elements inside one backend
// allocation: {Handle, Off, N, DType}. Slice cuts a view; it never copies. The
// model cuts every view once from its parameter and activation tables and
// allocates nothing inside the step loop.
//
// # Errors
//
// Ops do not return errors. A backend that hits a failure (a launch error, an
// out-of-memory inside an op) records the first one and keeps it; Sync waits for
// all queued work and returns that sticky error, then clears it, like
// bufio.Writer. Shape or dtype misuse is a programmer error and panics.
//
// # Conventions
//
// Shapes are written outermost first with these letters: T tokens of a packed
// micro-batch, C model width, OC output width, NH query heads, NKV key/value
// heads, HD head dimension, V vocabulary, I MLP width, S packed sequences,
// B decode batch. Each op documents whether an output is assigned (=) or
// accumulated (+=). Gradients carry a d prefix. All float buffers are F32
// unless an op says otherwise; token ids, positions and sequence offsets are
// I32.
//
// # bfloat16
//
// For mixed-precision training some ops also take BF16 buffers (bfloat16
// bits): the GEMM and attention operands, and the outputs that feed them.
// An op marked "F32|BF16" accepts either for that argument; arguments
// marked "same" must share one dtype. The math is fp32 whatever the storage
// (BF16 inputs are widened exactly), and a BF16 output is rounded once, to
// nearest even. Accumulated (+=) outputs, gradients of weights and
// statistics (lse, rstd, logprob) are always F32. kernels/cpu implements
// every BF16 variant by widening into fp32 and rounding the outputs: the
// reference the CUDA kernels (tensor cores) are checked against.
//
// # Optional fused paths
//
// Fast paths that fuse ops, or move work onto the backend, are small
// interfaces a backend may also implement (fused.go: AddRMSNormer,
// RopeConverter, TokenSampler), found by type assertion; callers fall back
// to the core ops when a backend lacks one. kernels/cpu implements each.
package kernels

import (
	"fmt"
	"math"
)

// DType is an element type of a buffer.
type DType uint8

// The element types a backend stores.
const (
	F32 DType = iota + 1
	BF16
	I32
)

// Size returns the size of one element in bytes.
func (d DType) Size() int {
	switch d {
	case F32, I32:
		return 4
	case BF16:
		return 2
	}
	panic(fmt.Sprintf("kernels: unknown dtype %d", d))
}

func (d DType) String() string {
	switch d {
	case F32:
		return "f32"
	case BF16:
		return "bf16"
	case I32:
		return "i32"
	}
	return fmt.Sprintf("dtype(%d)", d)
}

// Buf names N elements of type DType starting at element Off of the backend
// allocation Handle. Handle is backend-specific (an allocation index on the
// CPU, a device pointer on CUDA) and is meaningful only to the backend that
// made it.
type Buf struct {
	Handle uintptr
	Off    int
	N      int
	DType  DType
}

// Slice returns the view of n elements starting at element off of b.
// It panics if the view does not lie inside b.
func (b Buf) Slice(off, n int) Buf {
	if off < 0 || n < 0 || off+n > b.N {
		panic(fmt.Sprintf("kernels: Slice(%d, %d) of a %d-element buffer", off, n, b.N))
	}
	return Buf{Handle: b.Handle, Off: b.Off + off, N: n, DType: b.DType}
}

// Seqs describes the packed sequences of a micro-batch: sequence s holds tokens
// [cu[s], cu[s+1]) of the packed stream, attends only within itself, and its
// positions restart at 0 (like FlashAttention's varlen cu_seqlens).
type Seqs struct {
	CuSeqlens Buf // (S+1) I32, CuSeqlens[0] = 0, CuSeqlens[S] = T
	S         int // number of sequences
	MaxLen    int // longest sequence, for launch sizing
}

// AdamRule is the arithmetic of an AdamW update: which optimizer's
// order of operations and rounding it reproduces.
type AdamRule uint8

const (
	// TorchAdamW is torch.optim.AdamW (single-tensor, torch 1.13):
	//
	//	g  = grad · GradScale
	//	p  = p · (1 − LR·WeightDecay)
	//	m  = β1·m + (1−β1)·g
	//	v  = β2·v + (1−β2)·g²
	//	p  = p − (LR/BiasCorrection1) · m / (sqrt(v)/sqrt(BiasCorrection2) + Eps)
	//
	// with 1−βK computed in float64 and rounded once (OneMinusBetaK), as
	// torch does with its Python-double β. Moments are F32.
	TorchAdamW AdamRule = iota
	// FusedAdam is TransformerEngine's FusedAdam in its default AdamW mode
	// (adam_w_mode, bias_correction; transformer_engine/common/
	// multi_tensor/adam.cu at NVIDIA/TransformerEngine d0067d0, AdamFunctor
	// lines 329-340), every scalar a float32 (the kernel's arguments):
	//
	//	g  = grad · GradScale
	//	m  = β1·m + (1−β1)·g                 (1−β1 in float32)
	//	v  = β2·v + (1−β2)·g·g
	//	u  = (m/BiasCorrection1) / (sqrt(v/BiasCorrection2) + Eps) + WeightDecay·p
	//	p  = p − LR·u
	//
	// in float32 (MATH_T), the moments read from and stored to their dtype
	// (F32, or BF16 rounded to nearest even: exp_avg_dtype and
	// exp_avg_sq_dtype torch.bfloat16, which TE requires to be equal) and
	// BiasCorrectionK = float32(1 − pow(float64(βK), step)) (adam.cu's
	// host code, lines 594-597).
	FusedAdam
)

func (r AdamRule) String() string {
	switch r {
	case TorchAdamW:
		return "torch.optim.AdamW"
	case FusedAdam:
		return "transformer_engine FusedAdam"
	}
	return fmt.Sprintf("AdamRule(%d)", uint8(r))
}

// AdamWStep holds the scalars of one AdamW update (decoupled weight decay)
// under Rule (see AdamRule for each rule's order of operations).
// BiasCorrectionK is 1 − βK^step. Build steps with NewAdamWStep.
type AdamWStep struct {
	Rule                               AdamRule
	LR, Beta1, Beta2, Eps, WeightDecay float32
	OneMinusBeta1, OneMinusBeta2       float32
	BiasCorrection1, BiasCorrection2   float32
	GradScale                          float32
}

// NewAdamWStep returns the scalars of update number step (1-based) under
// rule: for TorchAdamW each computed in float64 and rounded once to
// float32; for FusedAdam as TransformerEngine forms them (β, LR, Eps and
// the decay rounded to float32 first, 1 − β in float32, the bias
// corrections from the float32 β in float64).
func NewAdamWStep(rule AdamRule, lr, beta1, beta2, eps, weightDecay float64, step int64, gradScale float64) AdamWStep {
	k := float64(step)
	if rule == FusedAdam {
		b1, b2 := float32(beta1), float32(beta2)
		return AdamWStep{Rule: rule,
			LR: float32(lr), Beta1: b1, Beta2: b2, Eps: float32(eps), WeightDecay: float32(weightDecay),
			OneMinusBeta1: 1 - b1, OneMinusBeta2: 1 - b2,
			BiasCorrection1: float32(1 - math.Pow(float64(b1), k)), BiasCorrection2: float32(1 - math.Pow(float64(b2), k)),
			GradScale: float32(gradScale),
		}
	}
	return AdamWStep{Rule: rule,
		LR: float32(lr), Beta1: float32(beta1), Beta2: float32(beta2), Eps: float32(eps),
		WeightDecay:   float32(weightDecay),
		OneMinusBeta1: float32(1 - beta1), OneMinusBeta2: float32(1 - beta2),
		BiasCorrection1: float32(1 - math.Pow(beta1, k)), BiasCorrection2: float32(1 - math.Pow(beta2, k)),
		GradScale: float32(gradScale),
	}
}

// CheckMoments panics unless m and v are n elements of one dtype that rule
// keeps Adam's moments in (F32; BF16 too under FusedAdam); every
// backend's AdamW calls it (backend names the backend in the message).
func CheckMoments(backend string, m, v Buf, n int, rule AdamRule) {
	if m.DType != v.DType || m.N != n || v.N != n {
		panic(fmt.Sprintf("%s: AdamW moments %d %s and %d %s for %d parameters", backend, m.N, m.DType, v.N, v.DType, n))
	}
	if m.DType != F32 && !(m.DType == BF16 && rule == FusedAdam) {
		panic(fmt.Sprintf("%s: AdamW with %s moments under %v", backend, m.DType, rule))
	}
}

// CheckCopyCols panics unless CopyCols's arguments are consistent; every
// backend calls it first (backend names the backend in the message).
func CheckCopyCols(backend string, dst, src Buf, R, W, dstStride, srcStride int) {
	for _, x := range []Buf{dst, src} {
		if x.DType != F32 && x.DType != BF16 {
			panic(fmt.Sprintf("%s: CopyCols of a %s buffer", backend, x.DType))
		}
	}
	if R < 0 || W < 0 || dstStride < W || srcStride < W {
		panic(fmt.Sprintf("%s: CopyCols of %d rows of %d with strides %d and %d", backend, R, W, dstStride, srcStride))
	}
	if R == 0 || W == 0 {
		return
	}
	if need := (R-1)*dstStride + W; dst.N < need {
		panic(fmt.Sprintf("%s: CopyCols dst has %d elements, %d rows of %d, %d apart, need %d", backend, dst.N, R, W, dstStride, need))
	}
	if need := (R-1)*srcStride + W; src.N < need {
		panic(fmt.Sprintf("%s: CopyCols src has %d elements, %d rows of %d, %d apart, need %d", backend, src.N, R, W, srcStride, need))
	}
}

// Memory is the allocation and transfer half of a backend.
type Memory interface {
	// Name is a short backend name such as "cpu" or "cuda".
	Name() string
	// Alloc returns a zeroed buffer of n elements.
	Alloc(dt DType, n int) (Buf, error)
	// Free releases a buffer returned by Alloc (not a Slice of one).
	Free(b Buf)
	// UploadF32/UploadI32 copy host data into dst; len(src) must equal dst.N.
	UploadF32(dst Buf, src []float32)
	UploadI32(dst Buf, src []int32)
	// DownloadF32/DownloadI32 wait for queued work and copy src to the host.
	DownloadF32(dst []float32, src Buf)
	DownloadI32(dst []int32, src Buf)
	// Sync waits for all queued work and returns the first error recorded
	// since the previous Sync, or nil.
	Sync() error
}

// Ops are the forward/backward op pairs of the transformer and the optimizer.
// The file that implements an op in each backend has the op's base name
// (kernels/cpu/rmsnorm.go, kernels/cuda/csrc/rmsnorm.cu).
type Ops interface {
	// Embedding: out (T,C) = wte (V,C) [tokens (T)].
	Embedding(out, wte, tokens Buf, T, C int)
	// EmbeddingBackward: dwte (V,C) += scatter-add of dout (T,C) at tokens (T).
	// Each dwte element adds its tokens' rows in token order (t = 0..T−1), so
	// every backend gives the same bits.
	EmbeddingBackward(dwte, dout, tokens Buf, T, C int)

	// RMSNorm over rows: out (N,C) = inp/rms(inp)·weight (C); rstd (N) = 1/rms.
	// rms = sqrt(mean(inp²) + eps). Qwen3's per-head q/k norm is this op with
	// N = T·NH and C = HD. out is F32|BF16 (the next GEMM's input type).
	RMSNorm(out, rstd, inp, weight Buf, N, C int, eps float32)
	// RMSNormBackward: dinp (N,C) +=, dweight (C) +=.
	RMSNormBackward(dinp, dweight, dout, inp, weight, rstd Buf, N, C int)

	// Matmul: out (T,OC) = inp (T,C) · weight (OC,C)ᵀ (a Hugging Face Linear).
	// inp and weight are F32|BF16, same; out is F32|BF16.
	Matmul(out, inp, weight Buf, T, C, OC int)
	// MatmulBackward: dinp (T,C) += dout (T,OC) · weight; dweight (OC,C) +=
	// doutᵀ · inp. A zero-length dinp or dweight (N == 0) skips that half.
	// dout, inp and weight are F32|BF16, same; dinp and dweight are F32.
	MatmulBackward(dinp, dweight, dout, inp, weight Buf, T, C, OC int)

	// AddBias: out (T,OC) += bias (OC) on every row (the bias of a Hugging
	// Face Linear, added after Matmul).
	AddBias(out, bias Buf, T, OC int)
	// BiasBackward: dbias (OC) += Σ_t dout (T,OC), summed in a fixed order
	// (deterministic for a given backend and shape).
	BiasBackward(dbias, dout Buf, T, OC int)

	// Rope rotates x (T,H,HD) in place by position pos (T) with Hugging Face's
	// "rotate half" convention: pair (i, i+HD/2) of row t turns by the angle
	// whose cosine and sine are cos[pos[t], i] and sin[pos[t], i], from tables
	// cos, sin (P, HD/2) that the caller computes once (package model fills
	// them from the config's RoPE: plain or Llama-3 scaled frequencies).
	// A position outside [0, P) is a data error: that row is left unchanged.
	Rope(x, pos, cos, sin Buf, T, H, HD int)
	// RopeBackward rotates dx (T,H,HD) in place by the inverse angles.
	RopeBackward(dx, pos, cos, sin Buf, T, H, HD int)

	// Attention: causal grouped-query attention over packed sequences with
	// scale 1/sqrt(HD). Query head h reads key/value head h/(NH/NKV).
	// out (T,NH,HD) =; lse (T,NH) = log-sum-exp of each query's scaled scores.
	// q, k and v are F32|BF16, same; out is F32|BF16; lse is F32.
	Attention(out, lse, q, k, v Buf, seqs Seqs, NH, NKV, HD int)
	// AttentionBackward: dq (T,NH,HD) =, dk (T,NKV,HD) =, dv (T,NKV,HD) =.
	// dout, out, q, k and v are F32|BF16, same; dq, dk, dv and lse are F32.
	AttentionBackward(dq, dk, dv, dout, out, lse, q, k, v Buf, seqs Seqs, NH, NKV, HD int)
	// TreeAttention: causal grouped-query attention over a packed token tree
	// (Tree), scale 1/sqrt(HD): a query of segment s sees its ancestors'
	// tokens, root first, then its own segment's up to itself. Query head h
	// reads key/value head h/(NH/NKV). out (T,NH,HD) =; lse (T,NH) =.
	// q, k and v are F32|BF16, same; out is F32|BF16; lse is F32.
	TreeAttention(out, lse, q, k, v Buf, tree Tree, NH, NKV, HD int)
	// TreeAttentionBackward: dq (T,NH,HD) =, dk (T,NKV,HD) =,
	// dv (T,NKV,HD) =. A key's dk and dv sum the contributions of every query
	// that sees it (its segment's later queries and all its descendants'),
	// in an order fixed by the tree's shape: the result is deterministic.
	// dout, out, q, k and v are F32|BF16, same; dq, dk, dv and lse are F32.
	TreeAttentionBackward(dq, dk, dv, dout, out, lse, q, k, v Buf, tree Tree, NH, NKV, HD int)
	// AttentionDecode: one query per sequence against a KV cache.
	// out (B,NH,HD) = attention of q (B,NH,HD) over kc, vc (B,Tmax,NKV,HD),
	// rows [0, lens[b]) of sequence b (the current token's k/v already written).
	// q, kc and vc are F32|BF16, same (a bf16 KV cache); out is F32.
	AttentionDecode(out, q, kc, vc, lens Buf, B, Tmax, NH, NKV, HD int)

	// SwiGLU: out (N) = silu(gate (N)) · up (N). gate and up are F32|BF16,
	// same; out is F32|BF16.
	SwiGLU(out, gate, up Buf, N int)
	// SwiGLUBackward: dgate (N) =, dup (N) =. gate and up are F32|BF16,
	// same; dout, dgate and dup are F32.
	SwiGLUBackward(dgate, dup, dout, gate, up Buf, N int)
	// SwiGLURows is SwiGLU over the gate|up GEMM's output as it lies, with
	// no split: row r of gu (R,2I) holds r's I gate values, then its I up
	// values. out (R,I) = silu(gate)·up, as SwiGLU computes it. gu is
	// F32|BF16; out is F32|BF16.
	SwiGLURows(out, gu Buf, R, I int)
	// SwiGLURowsBackward: dgu (R,2I) = row r's dgate, then its dup, as
	// SwiGLUBackward computes them, in dgu's dtype (F32|BF16, rounded as
	// Convert rounds): the gate|up GEMM's backward operand, already packed.
	// dout (R,I) is F32; gu as SwiGLURows.
	SwiGLURowsBackward(dgu, dout, gu Buf, R, I int)

	// Add: out (N) = a (N) + b (N). out may alias a or b.
	Add(out, a, b Buf, N int)
	// Accumulate: dst (N) += src (N).
	Accumulate(dst, src Buf, N int)

	// TokenLogprob: for each row t of hidden (T,C) with targets[t] ≥ 0, the
	// logits z = hidden[t]·weight (V,C)ᵀ · invTemp are formed in vocabulary
	// chunks (never all T×V at once) and
	//   logprob (T) = z[targets[t]] − logsumexp(z),  lse (T) = logsumexp(z),
	//   entropy (T) = −Σ softmax(z)·log softmax(z).
	// Rows with targets[t] < 0 get 0 in all three outputs. hidden and weight
	// are F32|BF16, same.
	TokenLogprob(logprob, entropy, lse, hidden, weight, targets Buf, T, C, V int, invTemp float32)
	// TokenLogprobBackward: given dlogprob (T), dhidden (T,C) += and
	// dweight (V,C) +=. Rows with targets[t] < 0 contribute nothing. hidden
	// and weight are F32|BF16, same; dhidden and dweight are F32.
	TokenLogprobBackward(dhidden, dweight, dlogprob, hidden, weight, targets, lse Buf, T, C, V int, invTemp float32)

	// ScatterRows: dst[idx[i], :] = src[i, :] for src (N,W), idx (N) I32.
	// dst and src are F32|BF16, converted as Convert does (a bf16 KV cache
	// written from fp32 keys and values rounds them).
	ScatterRows(dst, src, idx Buf, N, W int)
	// Fill: x = v.
	Fill(x Buf, v float32)
	// Copy: dst = src (same length).
	Copy(dst, src Buf)
	// Convert: dst (N) = src (N) in dst's dtype: F32 → BF16 rounds to
	// nearest even (NaN stays NaN), BF16 → F32 is exact, same dtype copies.
	// Mixed precision makes its bf16 copy of the weights with it once per
	// optimizer step.
	Convert(dst, src Buf)
	// CopyCols: dst[r·dstStride + j] = src[r·srcStride + j] for r < R,
	// j < W: a strided 2-D copy, each of dst and src F32|BF16 (converted as
	// Convert does). A view's offset picks the column: the model splits a
	// fused projection's output (T, q|k|v) into q, k and v with it, and
	// packs their gradients back. Both strides are at least W; dst and src
	// must not overlap.
	CopyCols(dst, src Buf, R, W, dstStride, srcStride int)
	// Scale: x *= s.
	Scale(x Buf, s float32)

	// AdamW updates param, m and v (N) in place from grad (N); see
	// AdamWStep and AdamRule. param and grad are F32; m and v are F32, or
	// BF16 (same) under FusedAdam.
	AdamW(param, grad, m, v Buf, step AdamWStep)
	// SumSquares: out (1) = Σ x², accumulated at least in fp32 with a fixed
	// reduction order (deterministic for a given backend and length).
	SumSquares(out, x Buf)
}

// Backend is a device: memory plus ops.
type Backend interface {
	Memory
	Ops
}
