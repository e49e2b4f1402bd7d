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
	if r.Sigmoid || r.Bias.N > 0 || r.Groups > 1 || r.Scale != 0 {
		// Nemotron-H's router comes with its Mamba ops (kernels.Mamba),
		// which this backend does not have yet: model refuses the family
		// before any call reaches here.
		panic(fmt.Sprintf("cuda: %s: the sigmoid router (bias, groups, scale) is not implemented: %+v", op, r))
	}
}

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
	b.launch(name, c, b.rowBlocks((T+routerRows-1)/routerRows), 1, 1, 32*routerRows, 0,
		pa(dlogits), pa(dweights), pa(probs), pa(weights), pa(experts), dp, ia(T), ia(E), ia(r.K), boolArg(r.Norm))
}
