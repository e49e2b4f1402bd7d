//go:build cgo

package cuda

// RouterTopK and RouterTopKBackward: csrc/router_topk.cu.

import (
	"fmt"

	"github.com/tracegrpo/tracegrpo/kernels"
)

// routerMaxExperts is 32·RT_MAXJ of csrc/router_topk.cu: a lane keeps its
// experts' probabilities in registers.
const routerMaxExperts = 512

// routerRows is RT_WARPS: rows per block (one warp each).
const routerRows = 8

func checkRouter(op string, T, E int, r kernels.Router) {
	if T < 0 || E <= 0 || r.K < 1 || r.K > E {
		panic(fmt.Sprintf("cuda: %s: T=%d E=%d K=%d (want 1 ≤ K ≤ E)", op, T, E, r.K))
	}
	if E > routerMaxExperts {
		panic(fmt.Sprintf("cuda: %s: %d experts, more than the router kernel's %d", op, E, routerMaxExperts))
	}
	if !r.Sigmoid && (r.Bias.N > 0 || r.Groups > 1 || r.Scale != 0) {
		panic(fmt.Sprintf("cuda: %s: a selection bias, groups or a scale need the sigmoid router: %+v", op, r))
	}
	if r.Groups > 1 && (r.Groups > routerMaxGroups || E%r.Groups != 0 || E/r.Groups < 2 || r.TopGroups < 1 || r.TopGroups > r.Groups ||
		r.K > r.TopGroups*(E/r.Groups)) {
		panic(fmt.Sprintf("cuda: %s: E=%d K=%d Groups=%d TopGroups=%d (want ≤ %d groups of at least 2 experts, 1 ≤ TopGroups ≤ Groups, K ≤ the kept experts)",
			op, E, r.K, r.Groups, r.TopGroups, routerMaxGroups))
	}
	if r.Bias.N > 0 {
		want(r.Bias, kernels.F32, E, op+" bias")
	}
}

// routerMaxGroups is RT_MAXGROUPS of csrc/router_topk.cu.
const routerMaxGroups = 64

// routerScale is r.Scale, 1 when unset.
func routerScale(r kernels.Router) float32 {
	if r.Scale == 0 {
		return 1
	}
	return r.Scale
}

// sigmoidGroups is the group count the kernel takes (1: no groups).
func sigmoidGroups(r kernels.Router) int { return max(1, r.Groups) }

func boolArg(v bool) uint64 {
	if v {
		return 1
	}
	return 0
}

// RouterTopK implements kernels.Experts: probs (T,E) =, weights (T,K) =,
// experts (T,K) I32 =, from logits (T,E); all F32 but experts.
func (b *Backend) RouterTopK(probs, weights, experts, logits kernels.Buf, T, E int, r kernels.Router) {
	checkRouter("RouterTopK", T, E, r)
	want(probs, kernels.F32, T*E, "RouterTopK probs")
	want(weights, kernels.F32, T*r.K, "RouterTopK weights")
	want(experts, kernels.I32, T*r.K, "RouterTopK experts")
	want(logits, kernels.F32, T*E, "RouterTopK logits")
	if T == 0 {
		return
	}
	defer b.lock()()
	if r.Sigmoid {
		var bias []kernels.Buf
		var bp uint64
		if r.Bias.N > 0 {
			bias, bp = []kernels.Buf{r.Bias}, pa(r.Bias)
		}
		c := rw(append(reads(logits), bias...), probs, weights, experts).with(8*int64(T)*int64(E), 0)
		b.launch("router_sigmoid_fwd", c, b.rowBlocks((T+routerRows-1)/routerRows), 1, 1, 32*routerRows, 0,
			pa(probs), pa(weights), pa(experts), pa(logits), bp, ia(T), ia(E), ia(r.K), boolArg(r.Norm),
			ia(sigmoidGroups(r)), ia(r.TopGroups), fa(routerScale(r)))
		return
	}
	b.launch("router_topk_fwd", rw(reads(logits), probs, weights, experts).with(8*int64(T)*int64(E), 0), b.rowBlocks((T+routerRows-1)/routerRows), 1, 1, 32*routerRows, 0,
		pa(probs), pa(weights), pa(experts), pa(logits), ia(T), ia(E), ia(r.K), boolArg(r.Norm))
}

// RouterTopKBackward implements kernels.Experts: dlogits (T,E) = (F32|BF16)
// from dweights (T,K), with dprobs (E) added to every row's ∂L/∂probs
// unless empty.
func (b *Backend) RouterTopKBackward(dlogits, dweights, probs, weights, experts, dprobs kernels.Buf, T, E int, r kernels.Router) {
	checkRouter("RouterTopKBackward", T, E, r)
	operands("RouterTopKBackward dlogits", dlogits)
	want(dlogits, dlogits.DType, T*E, "RouterTopKBackward dlogits")
	want(dweights, kernels.F32, T*r.K, "RouterTopKBackward dweights")
	want(probs, kernels.F32, T*E, "RouterTopKBackward probs")
	want(weights, kernels.F32, T*r.K, "RouterTopKBackward weights")
	want(experts, kernels.I32, T*r.K, "RouterTopKBackward experts")
	var dp uint64
	if dprobs.N > 0 {
		want(dprobs, kernels.F32, E, "RouterTopKBackward dprobs")
		dp = pa(dprobs)
	}
	if T == 0 {
		return
	}
	name := "router_topk_bwd"
	if dlogits.DType == kernels.BF16 {
		name = "router_topk_bwd_bf16"
	}
	defer b.lock()()
	c := rw(reads(dweights, probs, weights, experts, dprobs), dlogits).with(8*int64(T)*int64(E), 0)
	if r.Sigmoid {
		name = "router_sigmoid_bwd"
		if dlogits.DType == kernels.BF16 {
			name = "router_sigmoid_bwd_bf16"
		}
		b.launch(name, c, b.rowBlocks((T+routerRows-1)/routerRows), 1, 1, 32*routerRows, 0,
			pa(dlogits), pa(dweights), pa(probs), pa(weights), pa(experts), dp, ia(T), ia(E), ia(r.K), boolArg(r.Norm), fa(routerScale(r)))
		return
	}
	b.launch(name, c, b.rowBlocks((T+routerRows-1)/routerRows), 1, 1, 32*routerRows, 0,
		pa(dlogits), pa(dweights), pa(probs), pa(weights), pa(experts), dp, ia(T), ia(E), ia(r.K), boolArg(r.Norm))
}
