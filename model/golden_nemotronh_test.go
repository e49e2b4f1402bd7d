package model

import (
	"fmt"
	"math"
	"slices"
	"testing"

	"github.com/tracegrpo/tracegrpo/kernels"
	"github.com/tracegrpo/tracegrpo/kernels/cpu"
)

// nhVariants are the Nemotron-H goldens of scripts/golden_nemotronh.py
// (PyTorch, float64, written from transformers' NemotronHForCausalLM):
// every block kind, n_groups > 1, group-limited routing with a selection
// bias and the time-step clamp, Super's latent MoE, BF16 weights with
// transformers' __init__ spellings and a Python-JSON Infinity, on
// sequences the chunk size does not divide.
var nhVariants = []string{"nh_blocks", "nh_groups", "nh_latent", "nh_bf16"}

// TestGoldenNemotronH runs each golden batch through the model and compares
// logprobs, entropies, the loss, every sparse block's chosen experts
// (exactly) and weights, and every parameter's gradient.
func TestGoldenNemotronH(t *testing.T) {
	for _, v := range nhVariants {
		for _, rc := range []bool{false, true} {
			t.Run(fmt.Sprintf("%s/recompute=%v", v, rc), func(t *testing.T) {
				b := cpu.New(2)
				defer b.Close()
				g := openGoldenFile(t, v)
				tokens, cu, coef := g.i32(t, "tokens"), g.i32(t, "cu_seqlens"), g.f32(t, "coef")
				m := loadTestModel(t, v, b, Options{MaxTokens: 40, MaxSeqs: 8, Recompute: rc})
				defer m.Close()
				lp, ent, err := m.Forward(tokens, cu, g.f32(t, "temperature")[0])
				if err != nil {
					t.Fatal(err)
				}
				compareClose(t, "logprob", lp, g.f32(t, "logprob"), logprobAtol, logprobRtol)
				compareClose(t, "entropy", ent, g.f32(t, "entropy"), logprobAtol, logprobRtol)
				var loss float64
				for i := range lp {
					loss += float64(coef[i]) * float64(lp[i])
				}
				compareClose(t, "loss", []float32{float32(loss)}, g.f32(t, "loss"), logprobAtol, logprobRtol)
				checkHybridRoutes(t, m, b, g)
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
				t.Logf("max |Δ logprob| %.3g, |Δ entropy| %.3g; worst gradient element at %.1f%% of its tolerance (%s)",
					maxAbsDiff(lp, g.f32(t, "logprob")), maxAbsDiff(ent, g.f32(t, "entropy")), 100*worst, worstName)
			})
		}
	}
}

// checkHybridRoutes compares each sparse block's chosen experts (exactly)
// and weights with the golden's.
func checkHybridRoutes(t *testing.T, m *Model, b *cpu.Backend, g golden) {
	t.Helper()
	cfg := m.Config()
	T, K := m.lastT, cfg.MoE.TopK
	for l := range m.la {
		if !cfg.SparseLayer(l) {
			continue
		}
		got := make([]int32, T*K)
		b.DownloadI32(got, m.la[l].moe.rexp.Slice(0, T*K))
		if want := g.i32(t, fmt.Sprintf("route.L%d.experts", l)); !slices.Equal(got, want) {
			t.Errorf("block %d: chosen experts differ from the golden's:\n got %v\nwant %v", l, got, want)
		}
		if m.opt.Recompute {
			continue // the weights are one block's shared activations
		}
		w := make([]float32, T*K)
		b.DownloadF32(w, m.la[l].moe.rw.Slice(0, T*K))
		compareClose(t, fmt.Sprintf("block %d routing weights", l), w, g.f32(t, fmt.Sprintf("route.L%d.weights", l)), 1e-6, 1e-5)
	}
	_ = kernels.F32
}
