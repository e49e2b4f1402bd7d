package model

import (
	"fmt"
	"math"
	"slices"
	"strconv"
	"strings"
	"testing"

	"github.com/tracegrpo/tracegrpo/kernels"
	"github.com/tracegrpo/tracegrpo/kernels/cpu"
)

// moeVariants are the Qwen3-MoE goldens of scripts/golden_moe.py: 16
// experts, k = 1, 2 and 8, norm_topk_prob on and off, dense layers
// interleaved (mlp_only_layers, decoder_sparse_step), the load-balancing
// loss on and off, F32 and BF16 weights, the Hub's per-expert tensors and
// transformers v5's fused ones, and experts whose routers tie exactly.
var moeVariants = []string{
	"moe_k2_norm", "moe_k2_nonorm_v5", "moe_k1", "moe_k1_norm_aux", "moe_k8_interleaved", "moe_k8_step2",
}

// moeRouterLossTol: the load-balancing loss is a sum of E products of two
// means over the sparse layers' rows (counts exact); the float32
// probabilities (softmax in float64, rounded) against float64's move it
// by ~1e-7 relative.
const moeRouterLossTol = 1e-6

// TestGoldenMoE runs each MoE golden batch through the model and compares
// logprobs, entropies, the loss, the load-balancing loss, the experts
// every token chose in every sparse layer (ties included) with their
// weights, and every parameter's gradient (router, experts and the shared
// layers), with the dense models' tolerances.
func TestGoldenMoE(t *testing.T) {
	for _, v := range moeVariants {
		t.Run(v, func(t *testing.T) {
			b := cpu.New(2)
			defer b.Close()
			g := openGoldenFile(t, v)
			tokens, cu := g.i32(t, "tokens"), g.i32(t, "cu_seqlens")
			coef := g.f32(t, "coef")
			m := loadTestModel(t, v, b, Options{MaxTokens: 40, MaxSeqs: 8})
			defer m.Close()
			cfg := m.Config()
			if !cfg.Sparse() {
				t.Fatalf("config is not sparse: %+v", cfg.MoE)
			}
			lp, ent, err := m.Forward(tokens, cu, g.f32(t, "temperature")[0])
			if err != nil {
				t.Fatal(err)
			}
			compareClose(t, "logprob", lp, g.f32(t, "logprob"), logprobAtol, logprobRtol)
			compareClose(t, "entropy", ent, g.f32(t, "entropy"), logprobAtol, logprobRtol)
			aux, ok := m.RouterLoss()
			if !ok {
				t.Fatal("RouterLoss reports no loss for a sparse model")
			}
			compareClose(t, "router_loss", []float32{float32(aux)}, g.f32(t, "router_loss"), 0, moeRouterLossTol)
			checkRoutes(t, m, b, g)
			checkGoldenTies(t, g)
			var loss float64
			for i := range lp {
				loss += float64(coef[i]) * float64(lp[i])
			}
			if cfg.MoE.OutputRouterLogits {
				loss += cfg.MoE.RouterAuxLossCoef * aux
				m.SetRouterLossWeight(float32(cfg.MoE.RouterAuxLossCoef))
			}
			compareClose(t, "loss", []float32{float32(loss)}, g.f32(t, "loss"), logprobAtol, logprobRtol)

			m.ZeroGrad()
			if err := m.Backward(coef); err != nil {
				t.Fatal(err)
			}
			grads := make([]float32, m.Table().Total)
			b.DownloadF32(grads, m.Grads())
			worst, worstName := 0.0, ""
			for _, p := range m.Table().Params {
				got, want := grads[p.Offset:p.Offset+p.N], g.f32(t, "grad."+p.Name)
				compareClose(t, "grad."+p.Name, got, want, gradAtol, gradRtol)
				for i := range want {
					if f := math.Abs(float64(got[i]-want[i])) / (gradAtol + gradRtol*math.Abs(float64(want[i]))); f > worst {
						worst, worstName = f, p.Name
					}
				}
			}
			t.Logf("max |Δ logprob| %.3g, |Δ entropy| %.3g, |Δ router loss| %.3g; worst gradient element at %.1f%% of its tolerance (%s)",
				maxAbsDiff(lp, g.f32(t, "logprob")), maxAbsDiff(ent, g.f32(t, "entropy")), math.Abs(aux-float64(g.f32(t, "router_loss")[0])), 100*worst, worstName)
		})
	}
}

// checkRoutes compares the experts each sparse layer chose (exactly) and
// their weights with the golden's.
func checkRoutes(t *testing.T, m *Model, b *cpu.Backend, g golden) {
	t.Helper()
	cfg := m.Config()
	T, K := m.lastT, cfg.MoE.TopK
	for l := range m.la {
		if !cfg.SparseLayer(l) {
			continue
		}
		want := g.i32(t, fmt.Sprintf("route.L%d.experts", l))
		got := make([]int32, T*K)
		b.DownloadI32(got, m.la[l].moe.rexp.Slice(0, T*K))
		if m.opt.Recompute {
			continue // every layer shares one layer's activations
		}
		if !slices.Equal(got, want) {
			t.Errorf("layer %d: chosen experts differ from the golden's:\n got %v\nwant %v", l, got, want)
		}
		w := make([]float32, T*K)
		b.DownloadF32(w, m.la[l].moe.rw.Slice(0, T*K))
		compareClose(t, fmt.Sprintf("layer %d routing weights", l), w, g.f32(t, fmt.Sprintf("route.L%d.weights", l)), 1e-6, 1e-5)
	}
}

// checkGoldenTies checks that the golden has ties at the k-th place, where
// the tie-breaking rule decides which expert runs.
func checkGoldenTies(t *testing.T, g golden) {
	t.Helper()
	split, err := strconv.Atoi(g.f.Metadata()["tie_rows_at_kth_place"])
	if err != nil || split == 0 {
		t.Errorf("golden metadata tie_rows_at_kth_place = %q: the golden has no tie at the k-th place (regenerate with scripts/golden_moe.py)", g.f.Metadata()["tie_rows_at_kth_place"])
	}
}

// TestMoERecomputeIsExact: activation checkpointing recomputes each sparse
// layer's routing and experts in the backward pass; logprobs and
// gradients are bit-identical.
func TestMoERecomputeIsExact(t *testing.T) {
	for _, v := range []string{"moe_k2_norm", "moe_k8_step2"} {
		t.Run(v, func(t *testing.T) {
			b := cpu.New(2)
			defer b.Close()
			g := openGoldenFile(t, v)
			tokens, cu, coef := g.i32(t, "tokens"), g.i32(t, "cu_seqlens"), g.f32(t, "coef")
			var lps, grads [2][]float32
			for i, rc := range []bool{false, true} {
				m := loadTestModel(t, v, b, Options{MaxTokens: 40, MaxSeqs: 8, Recompute: rc})
				lp, _, err := m.Forward(tokens, cu, 0.7)
				if err != nil {
					t.Fatal(err)
				}
				lps[i] = slices.Clone(lp)
				m.SetRouterLossWeight(0.01)
				if err := m.Backward(coef); err != nil {
					t.Fatal(err)
				}
				grads[i] = make([]float32, m.Table().Total)
				b.DownloadF32(grads[i], m.Grads())
				m.Close()
			}
			if !slices.Equal(lps[0], lps[1]) || !bitsEqual(grads[0], grads[1]) {
				t.Errorf("Recompute changed the results (logprobs equal: %v)", slices.Equal(lps[0], lps[1]))
			}
		})
	}
}

func bitsEqual(a, b []float32) bool {
	if len(a) != len(b) {
		return false
	}
	for i := range a {
		if math.Float32bits(a[i]) != math.Float32bits(b[i]) {
			return false
		}
	}
	return true
}

// TestMoEFreezeRouter: with Options.FreezeRouter the routers get no
// gradient, and every other gradient is unchanged (the gradient still
// flows through the routing weights into the hidden states).
func TestMoEFreezeRouter(t *testing.T) {
	b := cpu.New(2)
	defer b.Close()
	v := "moe_k2_norm"
	g := openGoldenFile(t, v)
	tokens, cu, coef := g.i32(t, "tokens"), g.i32(t, "cu_seqlens"), g.f32(t, "coef")
	var grads [2][]float32
	var table *ParamTable
	for i, freeze := range []bool{false, true} {
		m := loadTestModel(t, v, b, Options{MaxTokens: 40, MaxSeqs: 8, FreezeRouter: freeze})
		if _, _, err := m.Forward(tokens, cu, 0.7); err != nil {
			t.Fatal(err)
		}
		if err := m.Backward(coef); err != nil {
			t.Fatal(err)
		}
		grads[i] = make([]float32, m.Table().Total)
		b.DownloadF32(grads[i], m.Grads())
		table = m.Table()
		m.Close()
	}
	routers := 0
	for _, p := range table.Params {
		a, f := grads[0][p.Offset:p.Offset+p.N], grads[1][p.Offset:p.Offset+p.N]
		if p.Router {
			routers++
			if slices.ContainsFunc(f, func(x float32) bool { return x != 0 }) {
				t.Errorf("%s: frozen router has a gradient", p.Name)
			}
			if !slices.ContainsFunc(a, func(x float32) bool { return x != 0 }) {
				t.Errorf("%s: the unfrozen router has no gradient: the test cannot tell", p.Name)
			}
			continue
		}
		if !bitsEqual(a, f) {
			t.Errorf("%s: gradient changed by freezing the routers", p.Name)
		}
	}
	if routers != 2 {
		t.Errorf("%d router parameters, want 2 (one per sparse layer)", routers)
	}
}

// TestMoEBackendWithoutExperts: a sparse config on a backend without
// kernels.Experts is refused by name.
func TestMoEBackendWithoutExperts(t *testing.T) {
	b := cpu.New(1)
	defer b.Close()
	cfg, err := LoadConfig("testdata/moe_k2_norm/config.json")
	if err != nil {
		t.Fatal(err)
	}
	_, err = New(denseOnly{b}, cfg, Options{MaxTokens: 8})
	if err == nil || !strings.Contains(err.Error(), "kernels.Experts") {
		t.Fatalf("New on a backend without sparse ops: %v", err)
	}
}

// denseOnly hides the CPU backend's kernels.Experts.
type denseOnly struct{ kernels.Backend }
