package bench

// The floating-point work of the matrix-shaped ops, for --profile's rates:
// 2 FLOPs (a multiply and an add) per term of each product the op computes.
//
//	Matmul                out (T,OC) = inp (T,C)·weightᵀ            2·T·C·OC
//	MatmulBackward        dinp and/or dweight, one product each     2·T·C·OC each
//	TokenLogprob          logits (T,V) = hidden (T,C)·weightᵀ       2·T·C·V
//	TokenLogprobBackward  the logits again, dhidden, dweight        2·T·C·V each
//	Attention             S = Q·Kᵀ and O = P·V per head, causal      4·NH·HD·Σ L(L+1)/2
//	AttentionBackward     S again, dP, dV, dQ, dK                    2.5 × Attention's
//
// Attention counts only the causal half each query attends to (its keys up
// to itself), whatever blocks of the masked half a backend computes.

import "github.com/tracegrpo/tracegrpo/kernels"

func matmulFLOPs(T, C, OC int) float64 { return 2 * float64(T) * float64(C) * float64(OC) }

func matmulBackwardFLOPs(dinp, dweight kernels.Buf, T, C, OC int) float64 {
	return float64(present(dinp)+present(dweight)) * matmulFLOPs(T, C, OC)
}

// tokenLogprobBackwardFLOPs: the backward recomputes the logits from
// hidden and weight (it keeps only lse), then forms what was asked.
func tokenLogprobBackwardFLOPs(dhidden, dweight kernels.Buf, T, C, V int) float64 {
	n := present(dhidden) + present(dweight)
	if n == 0 {
		return 0
	}
	return float64(1+n) * matmulFLOPs(T, C, V)
}

func attentionFLOPs(lens []int, NH, HD int) float64 {
	var pairs float64
	for _, L := range lens {
		pairs += float64(L) * float64(L+1) / 2
	}
	return 4 * float64(NH) * float64(HD) * pairs
}

func attentionBackwardFLOPs(lens []int, NH, HD int) float64 {
	return 2.5 * attentionFLOPs(lens, NH, HD)
}

// present is 1 for a buffer an op is asked to write, 0 for an empty one.
func present(b kernels.Buf) int {
	if b.N > 0 {
		return 1
	}
	return 0
}

// seqLens reads the sequence lengths of seqs from the backend (before the
// op is timed).
func (p *timedBackend) seqLens(seqs kernels.Seqs) []int {
	if seqs.S <= 0 || seqs.CuSeqlens.N < seqs.S+1 {
		return nil
	}
	cu := make([]int32, seqs.S+1)
	p.Backend.DownloadI32(cu, seqs.CuSeqlens.Slice(0, seqs.S+1))
	lens := make([]int, seqs.S)
	for s := range lens {
		lens[s] = int(cu[s+1] - cu[s])
	}
	return lens
}
