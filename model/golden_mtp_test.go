package model

import (
	"fmt"
	"math"
	"path/filepath"
	"testing"

	"github.com/tracegrpo/tracegrpo/kernels"
	"github.com/tracegrpo/tracegrpo/kernels/cpu"
)

// mtpVariants are the multi-token prediction goldens of
// scripts/golden_mtp.py (PyTorch, float64, written from Megatron-Core's
// multi_token_prediction.py over golden_nemotronh.py's Nemotron-H): a
// Super-shaped backbone with latent MoE and the "*E" MTP block at 2
// depths, repeated and not, detached and not; and a single-MoE-block
// pattern at 3 depths with BF16 weights and group-limited routing.
var mtpVariants = []string{"mtp_rep_det", "mtp_rep", "mtp_sep_det", "mtp_sep", "mtp_e3"}

// loadMTPModel loads a golden MTP model trained as its golden says.
func loadMTPModel(t *testing.T, variant string, b *cpu.Backend, g golden, opt Options) *Model {
	t.Helper()
	dir := filepath.Join("testdata", variant)
	cfg, err := LoadConfig(filepath.Join(dir, "config.json"))
	if err != nil {
		t.Fatal(err)
	}
	shape := g.i32(t, "mtp")
	cfg, err = cfg.WithMTP(MTPTraining{Depths: int(shape[0]), Repeated: shape[1] != 0, Detach: shape[2] != 0})
	if err != nil {
		t.Fatal(err)
	}
	m, err := New(b, cfg, opt)
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(m.Close)
	if err := m.LoadHF(dir); err != nil {
		t.Fatal(err)
	}
	return m
}

// TestGoldenMTP runs each golden batch through ForwardMTP and BackwardMTP
// (with the golden's coefficients: Megatron's MTP loss scaling for one
// micro-batch) and compares the main and every depth's log-probabilities
// and every parameter's gradient, the MTP blocks' included; the detached
// variants' embedding and LM head gradients are the main loss's alone.
func TestGoldenMTP(t *testing.T) {
	for _, v := range mtpVariants {
		for _, rc := range []bool{false, true} {
			t.Run(fmt.Sprintf("%s/recompute=%v", v, rc), func(t *testing.T) {
				b := cpu.New(2)
				defer b.Close()
				g := openGoldenFile(t, v)
				m := loadMTPModel(t, v, b, g, Options{MaxTokens: 40, MaxSeqs: 8, Recompute: rc})
				tokens, cu, coef, mask := g.i32(t, "tokens"), g.i32(t, "cu_seqlens"), g.f32(t, "coef"), g.i32(t, "mask")
				need := make([]bool, len(mask))
				for i, x := range mask {
					need[i] = x != 0
				}
				D := m.Config().MTP.Depths
				// The masked forward computes the targets that carry loss
				// only (0 elsewhere).
				_, _, mtpM, err := m.ForwardMTP(tokens, cu, g.f32(t, "temperature")[0], need)
				if err != nil {
					t.Fatal(err)
				}
				for d := range D {
					want := g.f32(t, fmt.Sprintf("mtp.lp.%d", d+1))
					for i := range want {
						if need[i] && math.Abs(float64(mtpM[d][i]-want[i])) > logprobAtol+logprobRtol*math.Abs(float64(want[i])) {
							t.Fatalf("depth %d token %d: the masked forward gives %g, the golden %g", d+1, i, mtpM[d][i], want[i])
						}
						if !need[i] && mtpM[d][i] != 0 {
							t.Fatalf("depth %d token %d: masked out, got %g", d+1, i, mtpM[d][i])
						}
					}
				}
				lp, ent, mtp, err := m.ForwardMTP(tokens, cu, g.f32(t, "temperature")[0], nil)
				if err != nil {
					t.Fatal(err)
				}
				compareClose(t, "logprob", lp, g.f32(t, "logprob"), logprobAtol, logprobRtol)
				compareClose(t, "entropy", ent, g.f32(t, "entropy"), logprobAtol, logprobRtol)
				worstLp := 0.0
				dmtp := make([][]float32, D)
				for d := range D {
					want := g.f32(t, fmt.Sprintf("mtp.lp.%d", d+1))
					compareClose(t, fmt.Sprintf("depth %d logprob", d+1), mtp[d], want, logprobAtol, logprobRtol)
					worstLp = math.Max(worstLp, maxAbsDiff(mtp[d], want))
					dmtp[d] = append([]float32(nil), g.f32(t, fmt.Sprintf("mtp.coef.%d", d+1))...)
				}
				m.ZeroGrad()
				if err := m.BackwardMTP(coef, dmtp); err != nil {
					t.Fatal(err)
				}
				grads := make([]float32, m.Table().Total)
				b.DownloadF32(grads, m.Grads())
				worst, worstName, nmtp := 0.0, "", 0
				for _, p := range m.Table().Params {
					got, want := grads[p.Offset:p.Offset+p.N], g.f32(t, "grad."+p.Name)
					compareClose(t, "grad."+p.Name, got, want, gradAtol, gradRtol)
					if len(p.Name) > 4 && p.Name[:4] == "mtp." {
						nmtp++
					}
					for i := range want {
						if f := math.Abs(float64(got[i]-want[i])) / (gradAtol + gradRtol*math.Abs(float64(want[i]))); f > worst {
							worst, worstName = f, p.Name
						}
					}
				}
				if nmtp == 0 {
					t.Fatal("the model has no mtp.* parameters")
				}
				t.Logf("max |Δ logprob| %.3g, max |Δ depth logprob| %.3g; %d MTP tensors; worst gradient element at %.1f%% of its tolerance (%s)",
					maxAbsDiff(lp, g.f32(t, "logprob")), worstLp, nmtp, 100*worst, worstName)
			})
		}
	}
}

// TestMTPPlainBackwardSkipsDepths: a Backward after ForwardMTP (no depth
// gradients) gives the main loss's gradient alone, the same bits as after
// ForwardMasked.
func TestMTPPlainBackwardSkipsDepths(t *testing.T) {
	b := cpu.New(2)
	defer b.Close()
	g := openGoldenFile(t, "mtp_rep")
	m := loadMTPModel(t, "mtp_rep", b, g, Options{MaxTokens: 40, MaxSeqs: 8})
	tokens, cu, coef := g.i32(t, "tokens"), g.i32(t, "cu_seqlens"), g.f32(t, "coef")
	run := func(mtp bool) []float32 {
		var err error
		if mtp {
			_, _, _, err = m.ForwardMTP(tokens, cu, 0.8, nil)
		} else {
			_, _, err = m.ForwardMasked(tokens, cu, 0.8, nil)
		}
		if err != nil {
			t.Fatal(err)
		}
		m.ZeroGrad()
		if err := m.Backward(coef); err != nil {
			t.Fatal(err)
		}
		out := make([]float32, m.Table().Total)
		b.DownloadF32(out, m.Grads())
		return out
	}
	a, c := run(true), run(false)
	for i := range a {
		if a[i] != c[i] {
			t.Fatalf("element %d: %g after ForwardMTP, %g after ForwardMasked", i, a[i], c[i])
		}
	}
	if err := m.BackwardMTP(coef, nil); err == nil {
		t.Fatal("BackwardMTP after ForwardMasked: no error")
	}
	_ = kernels.F32
}
