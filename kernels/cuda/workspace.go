package cuda

// The scratch the CUDA ops allocate for themselves (Backend.work), sized by
// the functions below, which the ops call and PlanWorkspace sums: the memory
// plan counts it from the same code, with no GPU and without cgo.

import (
	"os"

	"github.com/tracegrpo/tracegrpo/kernels"
)

// Names of the scratch buffers: each holds the largest request made of it.
const (
	workAttnD        = "attention D"
	workAttnDS       = "attention dS"
	workDecode       = "decode partials"
	workBias         = "bias_partials"
	workNorm         = "rmsnorm dweight partials"
	workLogits       = "logits"
	workLogprobState = "logprob state"
	workExpertCounts = "expert counts"
	workMamba        = "mamba"
	workMinBytes     = 256 // the least work allocates
)

// reduceBlocks is SumSquares' number of partial sums, fixed so that its
// order does not depend on the device; the backend keeps them, and a flag
// word for data errors, for its lifetime (fixedWork bytes).
const (
	reduceBlocks = 256
	fixedWork    = 4 + 8*reduceBlocks
)

// ltWorkspace is the workspace every cuBLASLt GEMM may use (the size NVIDIA
// recommends for Hopper), allocated once when cuBLASLt loads (blaslt.go)
// and passed, whole, to the heuristic and to every call: an algorithm the
// heuristic chose under it, and so the GEMM's bits, stay fixed.
const ltWorkspace = 32 << 20

// ltNone as Options.BlasLtLib (or $TRACEGRPO_CUDA_BLASLT) keeps the GEMMs
// on cublasGemmEx.
const ltNone = "none"

// ltPlanned reports whether a backend opened with opt counts cuBLASLt's
// workspace: unless cuBLASLt is off, a plan made without a device counts
// it (a device whose cuBLASLt does not load holds 32 MiB less).
func ltPlanned(opt Options) bool {
	if opt.BlasLtLib == "" {
		return os.Getenv("TRACEGRPO_CUDA_BLASLT") != ltNone
	}
	return opt.BlasLtLib != ltNone
}

// biasRows is TG_BIAS_ROWS of csrc/bias.cu: rows per partial sum.
const biasRows = 256

// The backward norm's blocks (csrc/rmsnorm.cu): at most normBwdBlocks of
// normBwdThreads threads, each keeping a row of dweight partials. Their
// number depends on N and C only, never on the device, so the reduction
// order, and with it the bits of dweight, are the same on every GPU.
const (
	normBwdBlocks  = 1024
	normBwdThreads = 256
)

// normBwdShape is the group kernel of C columns: T threads a row (a power
// of two from 8 to 256), each holding nch chunks of 8 columns; ok is false
// beyond 8192 columns (the general kernel then runs).
func normBwdShape(C int) (T, nch int, ok bool) {
	switch per := (C + 7) / 8; {
	case per <= normBwdThreads:
		T = 8
		for T < per {
			T *= 2
		}
		return T, 1, true
	case C <= 4096:
		return normBwdThreads, 2, true
	case C <= 8192:
		return normBwdThreads, 4, true
	}
	return 0, 0, false
}

// normBwdGrid is the backward norm's grid for N rows of C: G blocks of R
// consecutive rows (the last may have fewer), at most normBwdBlocks, and no
// more than there are rounds of rows a block works on at once.
func normBwdGrid(N, C int) (G, R int) {
	rows := 1
	if T, _, ok := normBwdShape(C); ok {
		rows = normBwdThreads / T
	}
	G = max(1, min((N+rows-1)/rows, normBwdBlocks))
	R = (N + G - 1) / G
	return (N + R - 1) / R, R
}

// qkRopeBwdShape is QKNormRopeBackward's group kernel for heads of HD: G
// threads a row (a power of two from 4 to 32), each holding nch chunks of
// 4 columns of either half of the row (HD ≤ 8·32·4 = 1024).
func qkRopeBwdShape(HD int) (G, nch int) {
	per := (HD + 7) / 8 // column pairs of 4 a row needs
	G = 4
	for G < per && G < 32 {
		G *= 2
	}
	nch = 1
	for G*nch < per {
		nch *= 2
	}
	return G, nch
}

// qkRopeBwdGrid is QKNormRopeBackward's grid over N head rows of HD: B
// blocks of R consecutive rows (the last may have fewer), as normBwdGrid
// forms it: a function of N and HD alone, so the weight gradients' bits are
// too.
func qkRopeBwdGrid(N, HD int) (B, R int) {
	G, _ := qkRopeBwdShape(HD)
	rows := normBwdThreads / G
	B = max(1, min((N+rows-1)/rows, normBwdBlocks))
	R = (N + B - 1) / B
	return (N + R - 1) / R, R
}

// qkRopeBwdWork is QKNormRopeBackward's scratch with norms: its blocks'
// rows of q and of k weight-gradient partials (in workNorm, which the ops
// use one after another).
func qkRopeBwdWork(T, NH, NKV, HD int) int {
	B, _ := qkRopeBwdGrid(T*(NH+2*NKV), HD)
	return 2 * 4 * B * HD
}

// defaultLogitsScratch is Options.LogitsScratch's default, in elements.
const defaultLogitsScratch = 32 << 20

// maxLogitsScratch is the most elements LogitsScratchFor gives (2 GiB of
// fp32 logits): a wider chunk saves the LM head little more (at 2 GiB the
// bench shape, 8 × 4096 tokens of Qwen3's 151,936-token vocabulary, runs
// 10 forward and 14 backward vocabulary chunks where 128 MiB ran 149 and
// 224, each backward chunk rewriting the fp32 dhidden).
const maxLogitsScratch = 512 << 20

// LogitsScratchFor is the logits scratch, in fp32 elements, for a device
// with headroom bytes free beyond a run's plan: an eighth of them, at
// least the default (128 MiB) and at most maxLogitsScratch (2 GiB), in
// whole MiB. It needs no GPU: train and make gpu-model size it alike.
func LogitsScratchFor(headroom int64) int {
	el := headroom / 8 / 4
	el = min(max(el, defaultLogitsScratch), maxLogitsScratch)
	return int(el) &^ (1<<18 - 1) // whole MiB of fp32
}

// attnDWork is AttentionBackward's rowsum(dout·out), one float per query row.
func attnDWork(T, NH int) int { return 4 * T * NH }

// The dS scratch of the packed tensor-core backward (csrc/attention_family.cuh's
// attn_ds): per query head, each token's row of bf16 dS against the keys of
// its sequence up to its own, rounded up to whole 64-key blocks. The row of
// position p holds 64·(p/64+1) keys, so a sequence of L tokens needs
// attnDSRows(L) elements a head; every token gets attnDSStride(MaxLen), the
// mean row of the longest sequence rounded up to 8 elements (16 bytes), so
// that each sequence's rows start at its first token's stride and no two
// sequences overlap.
func attnDSRows(L int) int64 {
	b, r := int64(L/64), int64(L%64)
	return 2048*b*(b+1) + 64*r*(b+1)
}

// attnDSStride is the dS elements a token, for sequences of at most maxLen.
func attnDSStride(maxLen int) int {
	if maxLen <= 0 {
		return 0
	}
	n := (attnDSRows(maxLen) + int64(maxLen) - 1) / int64(maxLen)
	return int((n + 7) &^ 7)
}

// attnDSWork is the dS scratch's bytes for T tokens of NH query heads in
// sequences of at most maxLen.
func attnDSWork(T, NH, maxLen int) int { return 2 * T * NH * attnDSStride(maxLen) }

// attnDSMaxBytes bounds the dS scratch: a packed bf16 backward whose
// scratch (attnDSWork) would exceed it runs the recomputing kernels
// (attention_bwd_dq_bf16 and attention_bwd_dkdv_bf16, which need no
// scratch) instead, so long contexts (one 32K-token sequence at 16 heads
// would need 17 GB) do not lose their card to it. The bench shape (8 ×
// 4096 tokens, 16 heads: 2.2 GB) stays under it. A variable so tests can
// lower it.
var attnDSMaxBytes int64 = 4 << 30

// attnDSFits reports whether the packed backward keeps dS in the scratch
// (and dq = dS·K from it): the one predicate of AttentionBackward's
// dispatch and of workspaceSizes, so the plan is what the backend
// allocates.
func attnDSFits(T, NH, maxLen int) bool {
	return int64(attnDSWork(T, NH, maxLen)) <= attnDSMaxBytes
}

// attnDSBytes is the dS the backward writes (and its dq kernel reads),
// taking every sequence maxLen long (T/maxLen of them) as the ledger's
// attention counts do: exact for equal lengths, an upper bound otherwise.
func attnDSBytes(T, NH, maxLen int) int64 {
	if maxLen <= 0 {
		return 0
	}
	return int64(float64(T) / float64(maxLen) * float64(attnDSRows(maxLen)) * float64(NH) * 2)
}

// biasWork is BiasBackward's partial sums: one row per chunk of biasRows.
func biasWork(T, OC int) int { return 4 * ((T + biasRows - 1) / biasRows) * OC }

// normWork is RMSNormBackward's dweight partials: one row per block.
func normWork(N, C int) int {
	G, _ := normBwdGrid(N, C)
	return 4 * G * C
}

// expertCountsWork is ExpertRoute's count of each of E experts.
func expertCountsWork(E int) int { return 4 * E }

// decodeSplits returns AttentionDecode's rows per split (option, 0: 256,
// rounded down to a multiple of 32) and the number of splits of Tmax rows.
func decodeSplits(option, Tmax int) (split, nsplit int) {
	split = option
	if split <= 0 {
		split = 256
	}
	split = max(32, split/32*32)
	return split, max(1, (Tmax+split-1)/split)
}

// decodeWork is AttentionDecode's partial results: per (sequence, head,
// split) a running max, a sum and HD accumulators.
func decodeWork(B, NH, HD, nsplit int) int { return 4 * B * NH * nsplit * (HD + 2) }

// vocabChunk is the vocabulary chunk width for T rows: as wide as a logits
// scratch of limit elements (0: the default) allows, a multiple of 32.
func vocabChunk(limit, T, V int) int {
	if limit <= 0 {
		limit = defaultLogitsScratch
	}
	return min(V, max(32, limit/max(T, 1)/32*32))
}

// bf16DzChunk is TokenLogprobBackward's chunk width on BF16 operands, where
// the logits scratch of a Vc-wide fp32 chunk holds a narrower fp32 chunk
// and its bf16 dz (6 bytes a logit, so at most two thirds of Vc): a
// multiple of 4 from Vc = 6 on, so that the dz rows stay 16-byte aligned.
// Vc ≥ 2 (a one-token vocabulary has no gradient).
func bf16DzChunk(Vc int) int {
	if Vc >= 6 {
		return Vc * 2 / 3 / 4 * 4
	}
	return Vc * 2 / 3
}

// filterRows is the filtered head's block of whole rows for T rows of V
// logits: as many as a logits scratch of limit elements (0: the default)
// of fp32 logits holds, at 4 bytes a logit, or 6 with bf16 operands (the
// backward's bf16 dz sits after them), at least one row, at most T. The
// forward and the backward form the same blocks.
func filterRows(limit, T, V int, dt kernels.DType) int {
	if limit <= 0 {
		limit = defaultLogitsScratch
	}
	per := 4 * V
	if dt == kernels.BF16 {
		per = 6 * V
	}
	return max(1, min(T, 4*limit/per))
}

// filterWork is the filtered head's scratch for blocks of Tr rows.
func filterWork(Tr, V int, dt kernels.DType) int {
	if dt == kernels.BF16 {
		return 6 * Tr * V
	}
	return 4 * Tr * V
}

// PlanWorkspace returns the bytes the CUDA backend opened with opt
// allocates for itself running w (its fixed buffers, cuBLASLt's workspace
// (ltPlanned) and its ops' scratch,
// all of it at once when ReserveWorkspace ran), in the GEMM modes the model
// asks for (the fp32-buffer bf16 cast of MatmulBF16 is not counted: the
// trainer's mixed precision passes bf16 buffers). It needs no GPU.
func PlanWorkspace(w kernels.Workload, opt Options) int64 {
	total := int64(fixedWork)
	if ltPlanned(opt) {
		total += ltWorkspace
	}
	for _, n := range workspaceSizes(w, opt) {
		total += int64(n)
	}
	return total
}

// workspaceSizes returns the bytes of each named scratch buffer w needs.
func workspaceSizes(w kernels.Workload, opt Options) map[string]int {
	largest := map[string]int{}
	need := func(name string, bytes int) {
		if bytes > 0 {
			largest[name] = max(largest[name], max(bytes, workMinBytes))
		}
	}
	for _, a := range w.Attention {
		if a.Backward {
			need(workAttnD, attnDWork(a.T, a.NH))
			if a.BF16 && (a.HD == 64 || a.HD == 128) && attnDSFits(a.T, a.NH, a.MaxLen) { // the tensor-core backward
				need(workAttnDS, attnDSWork(a.T, a.NH, a.MaxLen))
			}
		}
	}
	for _, a := range w.Trees {
		if a.Backward {
			need(workAttnD, attnDWork(a.T, a.NH))
		}
	}
	for _, d := range w.Decode {
		_, nsplit := decodeSplits(opt.DecodeSplit, d.Tmax)
		need(workDecode, decodeWork(d.B, d.NH, d.HD, nsplit))
	}
	for _, b := range w.Biases {
		need(workBias, biasWork(b.T, b.OC))
	}
	for _, r := range w.RowNorms {
		if r.Backward {
			need(workNorm, normWork(r.N, r.C))
		}
	}
	for _, q := range w.QKRopes {
		if q.Norm {
			need(workNorm, qkRopeBwdWork(q.T, q.NH, q.NKV, q.HD))
		}
	}
	for _, r := range w.Routes {
		need(workExpertCounts, expertCountsWork(r.E))
	}
	// The Mamba ops share one buffer: the scan's states and checkpoints,
	// the conv's partials, and the gated norm's partials (over the scan's
	// T rows of d_inner).
	for _, sc := range w.Scans {
		need(workMamba, scanWork(sc.T, sc.MaxSegs, sc.Scan, sc.Backward))
		if sc.Backward {
			need(workMamba, gatedWork(sc.T, sc.Scan.DI()))
		}
	}
	for _, c := range w.Convs {
		if c.Backward {
			need(workMamba, convWork(c.T, c.CD, c.KW, c.T))
		}
	}
	for _, h := range w.Heads {
		need(workLogits, 4*h.T*vocabChunk(opt.LogitsScratch, h.T, h.V))
		need(workLogprobState, 16*h.T)
		if h.Filtered {
			dt := kernels.F32
			if h.BF16 {
				dt = kernels.BF16
			}
			need(workLogits, filterWork(filterRows(opt.LogitsScratch, h.T, h.V, dt), h.V, dt))
		}
	}
	return largest
}

// The Mamba ops' scratch (csrc/mamba.cu, mamba.go).
const (
	mambaRows = 256 // MB_ROWS: tokens (rows) per weight-gradient partial
	mambaQ    = 64  // MB_Q: tokens between the scan backward's checkpoints
)

// convChunks is the number of weight-gradient partials of T tokens.
func convChunks(T int) int { return max(1, (T+mambaRows-1)/mambaRows) }

// convWork is Conv1DBackward's scratch: the segments' context starts and
// the weight and bias partials.
func convWork(T, CD, KW, NS int) int { return 4*NS + 4*convChunks(T)*CD*(KW+1) }

// gatedWork is GatedRMSNormBackward's dweight partials.
func gatedWork(N, D int) int { return 4 * convChunks(N) * D }

// stateBytes is the bytes of one state of every head.
func stateBytes(s kernels.Scan) int64 { return 4 * int64(s.MH) * int64(s.MP) * int64(s.DS) }

// scanCkpts bounds the checkpoints of T tokens in NS segments: a segment
// of L tokens has ⌈L/mambaQ⌉.
func scanCkpts(T, NS int) int { return T/mambaQ + NS }

// scanWork is the scratch of a scan over T tokens in NS segments: the final
// states (when the caller keeps none), and for the backward (ssdLayout) the
// checkpoints and the chunks' state gradients (scanCkpts each), the
// initial-state gradients, the chunks' decays, partials and table:
//
//	NS·st + 2·(T/64 + NS)·st + NS·st + (T/64 + NS)·(16·MH + 8),  st = 4·MH·MP·DS
func scanWork(T, NS int, s kernels.Scan, backward bool) int {
	if backward {
		return int(ssdLayout(T, NS, s).total)
	}
	return int(int64(NS) * stateBytes(s))
}

// ssdLayout is SSMScanBackward's scratch (csrc/ssd_bwd.cu), offsets in
// bytes from its start: the final states (NS), the checkpoints and the
// chunks' state gradients (nck each, nck = scanCkpts bounding the
// chunks), the initial-state gradients (NS), the chunks' decays (nck,MH)
// and partials (nck,MH,3), and the chunk table (two nck int32).
type ssdScratch struct {
	nck                                         int
	ckpt, dS, dsin, dec, part, ct0, cseg, total uintptr
}

func ssdLayout(T, NS int, s kernels.Scan) ssdScratch {
	st, nck := uintptr(stateBytes(s)), scanCkpts(T, NS)
	n, mh := uintptr(nck), uintptr(s.MH)
	var l ssdScratch
	l.nck = nck
	l.ckpt = uintptr(NS) * st
	l.dS = l.ckpt + n*st
	l.dsin = l.dS + n*st
	l.dec = l.dsin + uintptr(NS)*st
	l.part = l.dec + 4*n*mh
	l.ct0 = l.part + 12*n*mh
	l.cseg = l.ct0 + 4*n
	l.total = l.cseg + 4*n
	return l
}
