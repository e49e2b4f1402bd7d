package cpu

// RouterTopK: a sparse layer's choice of experts (kernels.Experts).
//
//	forward:  probs (T,E)   = softmax(logits (T,E)) in float64, rounded    =
//	          experts (T,K) = the K largest probs[t], descending, ties to  =
//	                          the lower expert id
//	          weights (T,K) = probs[t, experts[t, j]] (÷ their float64 sum =
//	                          when r.Norm)
//	backward: dp[e] = dprobs[e] + Σ_j [experts[t,j] = e]·g_j, with        =
//	          g_j = (dweights[t,j] − Σ_i dweights[t,i]·weights[t,i]) / S
//	          under r.Norm (S = Σ_j probs[t, experts[t,j]]), else dweights;
//	          dlogits (T,E) = p ⊙ (dp − Σ_e p_e·dp_e), in float64
//
// The sigmoid router (r.Sigmoid, Nemotron-H):
//
//	forward:  probs = s = σ(logits) in float64, rounded                  =
//	          c = s + bias (one float32 add), by group when Groups > 1:
//	          a group scores the float32 sum of its two largest c, the
//	          TopGroups best groups stay and the others' c become 0
//	          experts = the K largest c, descending, ties to the lower id  =
//	          weights = Scale·s_e / (Σ_j s_{e_j} + 1e-20) under r.Norm,
//	          else Scale·s_e, in float64                                  =
//	backward: ds[e] = dprobs[e] + Σ_j [e_j = e]·g_j, with
//	          g_j = (Scale/S')·(dweights_j − Σ_i dweights_i·weights_i/Scale)
//	          under r.Norm (S' = Σ_j s_{e_j} + 1e-20), else Scale·dweights_j;
//	          dlogits = s·(1 − s)·ds, in float64                           =
//
// Rows are independent: split by row, thread-count invariant. The selection
// is a K-fold scan of the row (K ≤ E; routers use K ≤ 8 of up to a few
// hundred experts).

import (
	"fmt"
	"math"

	"github.com/tracegrpo/tracegrpo/kernels"
)

const routerRowGrain = 16

// routerRow computes one row's probs, experts and weights; bias (E) is
// the sigmoid router's selection bias or nil, choice (E) scratch.
func routerRow(probs, weights []float32, experts []int32, logits, bias, choice []float32, r kernels.Router) {
	if r.Sigmoid {
		sigmoidRow(probs, weights, experts, logits, bias, choice, r)
		return
	}
	mx := math.Inf(-1)
	for _, z := range logits {
		mx = math.Max(mx, float64(z))
	}
	var sum float64
	for _, z := range logits {
		sum += math.Exp(float64(z) - mx)
	}
	for e, z := range logits {
		probs[e] = float32(math.Exp(float64(z)-mx) / sum)
	}
	var sel float64
	for j := 0; j < r.K; j++ {
		best := -1
		for e, p := range probs {
			if taken(experts[:j], e) {
				continue
			}
			if best < 0 || p > probs[best] {
				best = e
			}
		}
		experts[j] = int32(best)
		sel += float64(probs[best])
	}
	for j, e := range experts[:r.K] {
		if r.Norm {
			weights[j] = float32(float64(probs[e]) / sel)
		} else {
			weights[j] = probs[e]
		}
	}
}

// sigmoidRow is routerRow for the sigmoid router.
func sigmoidRow(probs, weights []float32, experts []int32, logits, bias, choice []float32, r kernels.Router) {
	E := len(logits)
	for e, z := range logits {
		probs[e] = float32(1 / (1 + math.Exp(-float64(z))))
		choice[e] = probs[e]
		if bias != nil {
			choice[e] = probs[e] + bias[e]
		}
	}
	if r.Groups > 1 {
		gs := E / r.Groups
		// A group's score: the sum of its two largest choice scores.
		var keep [maxRouterGroups]bool
		var score [maxRouterGroups]float32
		for g := 0; g < r.Groups; g++ {
			row := choice[g*gs : (g+1)*gs]
			a, b := -1, -1
			for i := range row {
				switch {
				case a < 0 || row[i] > row[a]:
					a, b = i, a
				case b < 0 || row[i] > row[b]:
					b = i
				}
			}
			score[g] = row[a] + row[b]
		}
		for k := 0; k < r.TopGroups; k++ {
			best := -1
			for g := 0; g < r.Groups; g++ {
				if !keep[g] && (best < 0 || score[g] > score[best]) {
					best = g
				}
			}
			keep[best] = true
		}
		for g := 0; g < r.Groups; g++ {
			if !keep[g] {
				clear(choice[g*gs : (g+1)*gs]) // transformers' masked_fill(…, 0.0)
			}
		}
	}
	var sel float64
	for j := 0; j < r.K; j++ {
		best := -1
		for e, c := range choice {
			if taken(experts[:j], e) {
				continue
			}
			if best < 0 || c > choice[best] {
				best = e
			}
		}
		experts[j] = int32(best)
		sel += float64(probs[best])
	}
	scale := float64(routerScale(r))
	for j, e := range experts[:r.K] {
		if r.Norm {
			weights[j] = float32(scale * float64(probs[e]) / (sel + 1e-20))
		} else {
			weights[j] = float32(scale * float64(probs[e]))
		}
	}
}

// maxRouterGroups bounds Router.Groups (DeepSeek-V3 has 8; the model caps
// n_group at this).
const maxRouterGroups = 64

// routerScale is r.Scale, 1 when unset.
func routerScale(r kernels.Router) float32 {
	if r.Scale == 0 {
		return 1
	}
	return r.Scale
}

func taken(chosen []int32, e int) bool {
	for _, c := range chosen {
		if int(c) == e {
			return true
		}
	}
	return false
}

// routerRowBackward computes one row's dlogits into dl (float64 scratch of
// E, then rounded by the caller).
func routerRowBackward(dl []float64, dweights, probs, weights []float32, experts []int32, dprobs []float32, r kernels.Router) {
	for e := range dl {
		dl[e] = 0
		if dprobs != nil {
			dl[e] = float64(dprobs[e])
		}
	}
	if r.Sigmoid {
		scale := float64(routerScale(r))
		if r.Norm {
			var s, dot float64
			for j, e := range experts[:r.K] {
				s += float64(probs[e])
				dot += float64(dweights[j]) * float64(weights[j])
			}
			s += 1e-20
			for j, e := range experts[:r.K] {
				dl[e] += scale / s * (float64(dweights[j]) - dot/scale)
			}
		} else {
			for j, e := range experts[:r.K] {
				dl[e] += scale * float64(dweights[j])
			}
		}
		for e, p := range probs {
			q := float64(p)
			dl[e] *= q * (1 - q)
		}
		return
	}
	if r.Norm {
		var s, dot float64
		for j, e := range experts[:r.K] {
			s += float64(probs[e])
			dot += float64(dweights[j]) * float64(weights[j])
		}
		for j, e := range experts[:r.K] {
			dl[e] += (float64(dweights[j]) - dot) / s
		}
	} else {
		for j, e := range experts[:r.K] {
			dl[e] += float64(dweights[j])
		}
	}
	var dot float64
	for e, p := range probs {
		dot += float64(p) * dl[e]
	}
	for e, p := range probs {
		dl[e] = float64(p) * (dl[e] - dot)
	}
}

type routerTask struct {
	probs, weights, logits []float32
	bias                   []float32   // the sigmoid router's selection bias, or nil
	choice                 [][]float32 // per worker (E)
	experts                []int32
	dlogits, dweights      []float32 // backward
	dprobs                 []float32 // backward, nil: none
	dl                     [][]float64
	E                      int
	r                      kernels.Router
	bwd                    bool
}

func (t *routerTask) run(w, lo, hi int) {
	E, K := t.E, t.r.K
	for row := lo; row < hi; row++ {
		p := t.probs[row*E : (row+1)*E]
		ex := t.experts[row*K : (row+1)*K]
		wt := t.weights[row*K : (row+1)*K]
		if !t.bwd {
			var choice []float32
			if t.choice != nil {
				choice = t.choice[w][:E]
			}
			routerRow(p, wt, ex, t.logits[row*E:(row+1)*E], t.bias, choice, t.r)
			continue
		}
		dl := t.dl[w]
		routerRowBackward(dl, t.dweights[row*K:(row+1)*K], p, wt, ex, t.dprobs, t.r)
		out := t.dlogits[row*E : (row+1)*E]
		for e, v := range dl {
			out[e] = float32(v)
		}
	}
}

func checkRouter(op string, T, E int, r kernels.Router) {
	if T < 0 || E <= 0 || r.K < 1 || r.K > E {
		panic(fmt.Sprintf("cpu: %s: T=%d E=%d K=%d (want 1 ≤ K ≤ E)", op, T, E, r.K))
	}
	if !r.Sigmoid && (r.Bias.N > 0 || r.Groups > 1 || r.Scale != 0) {
		panic(fmt.Sprintf("cpu: %s: a selection bias, groups or a scale need the sigmoid router: %+v", op, r))
	}
	if r.Groups > 1 && (r.Groups > maxRouterGroups || E%r.Groups != 0 || E/r.Groups < 2 || r.TopGroups < 1 || r.TopGroups > r.Groups ||
		r.K > r.TopGroups*(E/r.Groups)) {
		panic(fmt.Sprintf("cpu: %s: E=%d K=%d Groups=%d TopGroups=%d (want ≤ %d groups of at least 2 experts, 1 ≤ TopGroups ≤ Groups, K ≤ the kept experts)",
			op, E, r.K, r.Groups, r.TopGroups, maxRouterGroups))
	}
}

// RouterTopK implements kernels.Experts.
// Shapes: probs (T,E), weights (T,K), experts (T,K) I32, logits (T,E).
func (b *Backend) RouterTopK(probs, weights, experts, logits kernels.Buf, T, E int, r kernels.Router) {
	checkRouter("RouterTopK", T, E, r)
	t := &b.tasks.router
	*t = routerTask{
		probs: b.f32n(probs, T*E, "RouterTopK probs"), weights: b.f32n(weights, T*r.K, "RouterTopK weights"),
		experts: b.i32n(experts, T*r.K, "RouterTopK experts"), logits: b.f32n(logits, T*E, "RouterTopK logits"),
		E: E, r: r,
	}
	if r.Bias.N > 0 {
		t.bias = b.f32n(r.Bias, E, "RouterTopK bias")
	}
	if r.Sigmoid {
		if len(b.routerChoice) != b.threads || cap(b.routerChoice[0]) < E {
			b.routerChoice = make([][]float32, b.threads)
			for i := range b.routerChoice {
				b.routerChoice[i] = make([]float32, E)
			}
		}
		t.choice = b.routerChoice
	}
	b.pool.parallel(t, T, routerRowGrain)
	*t = routerTask{}
}

// RouterTopKBackward implements kernels.Experts.
// Shapes: dlogits (T,E) F32|BF16, dweights (T,K), probs (T,E), weights (T,K),
// experts (T,K) I32, dprobs (E) or empty.
func (b *Backend) RouterTopKBackward(dlogits, dweights, probs, weights, experts, dprobs kernels.Buf, T, E int, r kernels.Router) {
	checkRouter("RouterTopKBackward", T, E, r)
	t := &b.tasks.router
	*t = routerTask{
		dlogits: b.out(dlogits, T*E, "RouterTopKBackward dlogits"), dweights: b.f32n(dweights, T*r.K, "RouterTopKBackward dweights"),
		probs: b.f32n(probs, T*E, "RouterTopKBackward probs"), weights: b.f32n(weights, T*r.K, "RouterTopKBackward weights"),
		experts: b.i32n(experts, T*r.K, "RouterTopKBackward experts"), E: E, r: r, bwd: true,
	}
	if dprobs.N > 0 {
		t.dprobs = b.f32n(dprobs, E, "RouterTopKBackward dprobs")
	}
	if len(b.routerDL) != b.threads || cap(b.routerDL[0]) < E {
		b.routerDL = make([][]float64, b.threads)
		for i := range b.routerDL {
			b.routerDL[i] = make([]float64, E)
		}
	}
	t.dl = b.routerDL
	for i := range t.dl {
		t.dl[i] = t.dl[i][:E]
	}
	b.pool.parallel(t, T, routerRowGrain)
	b.done(dlogits, t.dlogits)
	*t = routerTask{}
}
