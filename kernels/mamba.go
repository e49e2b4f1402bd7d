package kernels

import "math"

// The ops of Nemotron-H's hybrid layers (transformers' NemotronHForCausalLM):
// the Mamba-2 mixer and the squared-ReLU MLPs. A Mamba-2 mixer on T tokens:
//
//	zxbcdt (T, DI + CD + MH) = ln · Win_projᵀ                    (Matmul)
//	z, xBC, dt = its columns [0, DI), [DI, DI+CD), [DI+CD, DI+CD+MH)
//	xbc (T,CD) = silu(causal depthwise conv of xBC)              Conv1D
//	x, B, C = xbc's columns [0, DI), [DI, DI+G·DS), [DI+G·DS, CD)
//	y (T,MH,MP) = the selective scan of x with dt, A, B, C, D      SSMScan
//	g (T,DI) = GatedRMSNorm(y, z)                                GatedRMSNorm
//	out (T,C) = g · Wout_projᵀ                                    (Matmul)
//
// The letters of these ops, beside the package's: MH Mamba heads
// (mamba_num_heads), MP a head's dimension (mamba_head_dim), DI = MH·MP
// (d_inner), G groups of B and C (n_groups; group g serves the MH/G
// contiguous heads [g·MH/G, (g+1)·MH/G)), DS the state size
// (ssm_state_size), KW the conv window (conv_kernel), CD = DI + 2·G·DS the
// conv's channels.
//
// # Sequences and trees
//
// Conv1D and SSMScan run over a packed Tree (tree.go): a packed micro-batch
// of sequences is the forest of roots alone (Parent −1, Ends[s] =
// Offs[s+1]). The context of a token is its ancestors' tokens, root first,
// then its own segment's up to it; "the token before t" is the previous
// token of that context: t−1 inside a segment, the last token of the
// parent segment at a segment's first token, none at a root's first token.
// The conv window and the SSM state therefore start from zero at every
// sequence (root) and carry across a branch point into every child: a
// child's first token sees its parent's last KW−1 pre-conv rows (walking
// further up when the parent is shorter) and starts from the parent's final
// state. A backward sums, for each token, the gradients of every token that
// read it (its own segment's and every descendant's): the prefix receives
// the sum of its children's gradients.
//
// # Determinism
//
// Every op is deterministic: sums over tokens (weight gradients, the
// gradients of a token read by several descendants) run in orders fixed by
// the shapes and the tree, never with float atomics, so a backend gives the
// same bits on every run.
//
// A backend that runs Nemotron-H implements Mamba besides Ops and Experts;
// package model finds it by type assertion and refuses a nemotron_h config,
// naming the backend, on a backend without it.

// Scan is the shape and the constants of a Mamba-2 scan.
type Scan struct {
	MH, MP, G, DS int
	// Chunk is the chunk length of the chunked (SSD) algorithm: the
	// config's chunk_size. A backend may run another length or none: the
	// results are those of the sequential recurrence up to rounding,
	// whatever the chunking.
	Chunk int
	// DtMin and DtMax are time_step_limit: dt is clamped to
	// [DtMin, DtMax] after the softplus. (0, +Inf), the default, leaves it
	// unclamped.
	DtMin, DtMax float32
}

// DI is d_inner, MH·MP; CD is the conv's channels, DI + 2·G·DS.
func (s Scan) DI() int { return s.MH * s.MP }

// CD is the conv's channel count, DI + 2·G·DS.
func (s Scan) CD() int { return s.MH*s.MP + 2*s.G*s.DS }

// Softplus is the time step's softplus as torch and mamba_ssm compute it:
// x itself above the threshold 20, else log(1 + exp(x)).
func Softplus(x float64) float64 {
	if x > 20 {
		return x
	}
	return math.Log1p(math.Exp(x))
}

// Mamba are the ops of Nemotron-H's Mamba-2 mixers and squared-ReLU MLPs
// (see the top of this file).
type Mamba interface {
	// Conv1D: the causal depthwise convolution of the Mamba-2 mixer with
	// its activation, over a packed tree (see the top of this file):
	//
	//	pre[t, c] = bias[c] + Σ_{k<KW} weight[c, k] · inp[prev^(KW−1−k)(t), c]
	//	out (T,CD) = silu(pre) = pre·σ(pre)                               =
	//
	// where prev^j(t) is the j-th token before t in its context (prev^0(t)
	// = t) and a missing one reads 0: transformers' nn.Conv1d with KW−1
	// zeros of left padding, continued across branch points. weight (CD,KW)
	// F32 is conv1d.weight (CD,1,KW); bias (CD) F32, or empty (N == 0)
	// for none. inp (T,CD) F32 holds the pre-conv xBC rows; out is
	// F32|BF16 (the scan's operand).
	Conv1D(out, inp, weight, bias Buf, tree Tree, T, CD, KW int)
	// Conv1DBackward: from dout (T,CD) F32 = ∂L/∂out, with g = dout·silu'(pre)
	// (pre recomputed from inp),
	//
	//	dinp (T,CD) =     dinp[r, c] = Σ_{(t,k): prev^(KW−1−k)(t) = r} weight[c,k]·g[t,c]
	//	dweight (CD,KW) += Σ_t g[t,c] · inp[prev^(KW−1−k)(t), c]
	//	dbias (CD) +=     Σ_t g[t,c]  (skipped when empty)
	//
	// A row r is read by the next KW−1 tokens of its context: the rest of
	// its segment and, near a segment's end, every descendant's first
	// tokens; dinp sums all of them.
	Conv1DBackward(dinp, dweight, dbias, dout, inp, weight, bias Buf, tree Tree, T, CD, KW int)

	// SSMScan: the Mamba-2 selective scan (the SSD layer) over a packed
	// tree. For each token t, head h of group g = h/(MH/G), p < MP, n < DS:
	//
	//	dt[t,h]  = clamp(Softplus(dtRaw[t,h] + dtBias[h]), s.DtMin, s.DtMax)
	//	A[h]     = −exp(aLog[h])
	//	S_t[h]   = exp(dt[t,h]·A[h]) · S_prev(t)[h] + dt[t,h] · x[t,h,:] ⊗ B[t,g,:]   (MP,DS)
	//	y[t,h,p] = Σ_n C[t,g,n]·S_t[h,p,n] + d[h]·x[t,h,p]                            =
	//
	// where S_prev(t) is the state after the token before t in its
	// context (zero at a root's first token): a child segment starts from
	// its parent's final state. x, B and C are the column ranges of xbc
	// (T,CD) F32|BF16 (see the top of this file), read as fp32. dtRaw (T,MH)
	// F32 is in_proj's dt column; dtBias, aLog, d (MH) F32. y (T,MH,MP) F32.
	// final (NS,MH,MP,DS) F32, unless empty (N == 0), = each segment's
	// final state S after its last token (the sampler's prefill keeps it).
	// The math is fp32 (a CUDA backend may round the operands of its
	// tensor-core products to bf16 when xbc is bf16). kernels/cpu aligns
	// its chunks to context positions (multiples of s.Chunk from the
	// root's first token) and runs a child's first chunk again from the
	// boundary before it, so that a tree's outputs are its paths' run as
	// packed sequences bit for bit; other backends may differ from that by
	// rounding.
	SSMScan(y, final, xbc, dtRaw, dtBias, aLog, d Buf, tree Tree, T int, s Scan)
	// SSMScanBackward: from dy (T,MH,MP) F32 = ∂L/∂y, the gradients of
	// SSMScan's inputs:
	//
	//	dxbc (T,CD) F32 =  ∂L/∂x, ∂L/∂B, ∂L/∂C in xbc's columns (B and C
	//	                   summed over the heads of their group)
	//	ddtRaw (T,MH) F32 = ∂L/∂dtRaw: through the clamp (zero where
	//	                   Softplus(dtRaw+dtBias) < DtMin or > DtMax) and
	//	                   the softplus (σ(dtRaw+dtBias), 1 above 20)
	//	ddtBias (MH) +=    Σ_t ddtRaw[t,h]
	//	daLog (MH) +=      Σ_t ∂L/∂A[h]·dt[t,h]·… through A = −exp(aLog)
	//	dd (MH) +=         Σ_{t,p} dy[t,h,p]·x[t,h,p]
	//
	// The state's gradient flows backwards through each segment and, at a
	// branch point, the parent's final state receives the sum of its
	// children's initial-state gradients (in child order). The sums over
	// tokens run in an order fixed by the tree.
	SSMScanBackward(dxbc, ddtRaw, ddtBias, daLog, dd, dy, xbc, dtRaw, dtBias, aLog, d Buf, tree Tree, T int, s Scan)

	// Conv1DDecode: one new token for each of B sequences against its conv
	// window, the decoding form of Conv1D. window (B,KW−1,CD) F32 holds
	// each sequence's last KW−1 pre-conv rows, oldest first (zeros before
	// its first token). out (B,CD) = silu(bias + Σ_{k<KW−1} weight[:,k] ·
	// window[b,k] + weight[:,KW−1] · inp[b]); then window shifts by one row
	// and takes inp[b] (B,CD) F32 as its newest. out is F32|BF16.
	Conv1DDecode(out, window, inp, weight, bias Buf, B, CD, KW int)
	// SSMDecode: one new token for each of B sequences, the decoding form
	// of SSMScan: state (B,MH,MP,DS) F32 is updated in place to S_t and
	// y (B,MH,MP) F32 = C·S_t + d·x, from xbc (B,CD) F32|BF16 and
	// dtRaw (B,MH) F32.
	SSMDecode(y, state, xbc, dtRaw, dtBias, aLog, d Buf, B int, s Scan)

	// GatedRMSNorm: transformers' Zamba2RMSNormGated (the gate before the
	// norm) over rows of D in groups of GS (D/GS groups a row):
	//
	//	u = y·silu(z);  rstd (N, D/GS) = 1/sqrt(mean over the group of u² + eps)
	//	out (N,D) = weight ⊙ u·rstd                                          =
	//
	// y and z (N,D) F32; weight (D) F32; out F32|BF16 (out_proj's input).
	GatedRMSNorm(out, rstd, y, z, weight Buf, N, D, GS int, eps float32)
	// GatedRMSNormBackward: dy (N,D) =, dz (N,D) =, dweight (D) += from
	// dout (N,D) F32 and GatedRMSNorm's rstd.
	GatedRMSNormBackward(dy, dz, dweight, dout, y, z, weight, rstd Buf, N, D, GS int)

	// ReLU2: out (N) = relu(inp)² (transformers' "relu2", the MLPs' and
	// experts' activation). inp is F32|BF16 (a GEMM's output), out
	// F32|BF16 (the next GEMM's input).
	ReLU2(out, inp Buf, N int)
	// ReLU2Backward: dinp (N) F32 = 2·relu(inp)·dout, dout (N) F32.
	// dinp may be dout (in place: package model's experts run it so).
	ReLU2Backward(dinp, dout, inp Buf, N int)
}
