package model

import (
	"fmt"
	"math"
	"path/filepath"
	"slices"
	"testing"

	"github.com/google/go-cmp/cmp"
	"github.com/tracegrpo/tracegrpo/internal/safetensors"
	"github.com/tracegrpo/tracegrpo/kernels/cpu"
)

// Tolerances against the float64 PyTorch goldens. The Go model runs in
// float32 through two layers and sums over 512 logits; at these sizes the
// observed worst errors are 1.4e-5 abs for logprobs (values up to ~25) and
// 6.5e-5 abs for gradients (values up to ~10), so these leave a ~3× margin.
const (
	logprobAtol = 5e-5
	logprobRtol = 1e-5
	gradAtol    = 1e-4
	gradRtol    = 1e-3
)

// goldenVariants are the small PyTorch goldens (two layers, 34 tokens in 5
// sequences, vocabulary 512); every model test runs on them.
var goldenVariants = []string{
	"qwen3_untied", "qwen3_tied", "llama_untied", "llama_tied",
	"qwen2_untied", "qwen2_tied", "qwen2_untied_bf16", "qwen2_tied_f32",
}

// longVariants are Llama 3.1 (factor 8) and Llama 3.2 (factor 32) RoPE
// scaling on a one-layer, one-head model with a sequence of 32775 tokens,
// so positions reach 32774 (four times Llama 3's original 8192).
var longVariants = []string{"llama31_long", "llama32_long"}

// longMinScaledGap is the least max |logprob − logprob_unscaled| a long
// golden must show: the scaling changes the result by far more than the
// tolerance, so a model that ignored it would fail.
const longMinScaledGap = 100 * logprobAtol

type golden struct {
	f *safetensors.File
}

func openGoldenFile(t *testing.T, variant string) golden {
	t.Helper()
	f, err := safetensors.Open(filepath.Join("testdata", variant, "golden.safetensors"))
	if err != nil {
		t.Fatalf("%v (regenerate with /usr/bin/python3 scripts/golden_model.py)", err)
	}
	t.Cleanup(func() { f.Close() })
	return golden{f}
}

func (g golden) f32(t *testing.T, name string) []float32 {
	t.Helper()
	ti, ok := g.f.Tensor(name)
	if !ok {
		t.Fatalf("golden has no tensor %q", name)
	}
	out := make([]float32, ti.NumElements())
	if err := g.f.ReadF32(name, out); err != nil {
		t.Fatal(err)
	}
	return out
}

func (g golden) i32(t *testing.T, name string) []int32 {
	t.Helper()
	ti, _ := g.f.Tensor(name)
	b := make([]byte, ti.End-ti.Begin)
	if err := g.f.ReadRaw(name, b); err != nil {
		t.Fatal(err)
	}
	out := make([]int32, len(b)/4)
	for i := range out {
		out[i] = int32(uint32(b[4*i]) | uint32(b[4*i+1])<<8 | uint32(b[4*i+2])<<16 | uint32(b[4*i+3])<<24)
	}
	return out
}

// compareClose reports elements with |got−want| > atol + rtol·|want|, with the
// max abs and rel errors and the first mismatches.
func compareClose(t *testing.T, what string, got, want []float32, atol, rtol float64) {
	t.Helper()
	if len(got) != len(want) {
		t.Errorf("%s: %d values, want %d", what, len(got), len(want))
		return
	}
	var maxAbs, maxRel float64
	var bad []string
	nbad := 0
	for i := range want {
		g, w := float64(got[i]), float64(want[i])
		d := math.Abs(g - w)
		if math.IsNaN(g) {
			d = math.Inf(1)
		}
		maxAbs = math.Max(maxAbs, d)
		if w != 0 {
			maxRel = math.Max(maxRel, d/math.Abs(w))
		}
		if d > atol+rtol*math.Abs(w) {
			nbad++
			if len(bad) < 5 {
				bad = append(bad, fmt.Sprintf("[%d] got %.7g want %.7g", i, g, w))
			}
		}
	}
	if nbad > 0 {
		t.Errorf("%s: %d of %d values outside atol %g + rtol %g (max abs %.3g, max rel %.3g); first: %v",
			what, nbad, len(want), atol, rtol, maxAbs, maxRel, bad)
	}
}

func loadTestModel(t testing.TB, variant string, b *cpu.Backend, opt Options) *Model {
	t.Helper()
	return loadModelDir(t, filepath.Join("testdata", variant), b, opt)
}

func loadModelDir(t testing.TB, dir string, b *cpu.Backend, opt Options) *Model {
	t.Helper()
	cfg, err := LoadConfig(filepath.Join(dir, "config.json"))
	if err != nil {
		t.Fatal(err)
	}
	m, err := New(b, cfg, opt)
	if err != nil {
		t.Fatal(err)
	}
	if err := m.LoadHF(dir); err != nil {
		t.Fatal(err)
	}
	return m
}

// TestGoldenForwardBackward runs the PyTorch golden batch through the Go
// model and compares logprobs, entropy, the loss and every parameter's
// gradient (Qwen2's biases included).
func TestGoldenForwardBackward(t *testing.T) {
	for _, v := range append(slices.Clone(goldenVariants), longVariants...) {
		long := slices.Contains(longVariants, v)
		t.Run(v, func(t *testing.T) {
			b := cpu.New(2)
			defer b.Close()
			g := openGoldenFile(t, v)
			tokens, cu := g.i32(t, "tokens"), g.i32(t, "cu_seqlens")
			temp := g.f32(t, "temperature")[0]
			coef := g.f32(t, "coef")
			m := loadTestModel(t, v, b, Options{MaxTokens: max(40, len(tokens)), MaxSeqs: 8})
			defer m.Close()
			if long {
				checkLongGolden(t, g, m, tokens, cu)
			}
			lp, ent, err := m.Forward(tokens, cu, temp)
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

			m.ZeroGrad()
			if err := m.Backward(coef); err != nil {
				t.Fatal(err)
			}
			grads := make([]float32, m.Table().Total)
			b.DownloadF32(grads, m.Grads())
			nbias := 0
			for _, p := range m.Table().Params {
				compareClose(t, "grad."+p.Name, grads[p.Offset:p.Offset+p.N], g.f32(t, "grad."+p.Name), gradAtol, gradRtol)
				if p.Bias {
					nbias++
				}
			}
			if wantBias := 3 * m.Config().NumHiddenLayers; m.Config().QKVBias() && nbias != wantBias {
				t.Errorf("%d bias parameters, want %d (q, k and v of every layer)", nbias, wantBias)
			}
			if long {
				return // the accumulation check below would double the test's time
			}
			// Backward accumulates: a second pass doubles every gradient.
			if err := m.Backward(coef); err != nil {
				t.Fatal(err)
			}
			twice := make([]float32, m.Table().Total)
			b.DownloadF32(twice, m.Grads())
			for i := range grads {
				grads[i] *= 2
			}
			compareClose(t, "gradient after two Backward calls", twice, grads, 1e-6, 1e-5)
		})
	}
}

// checkLongGolden checks what makes a long golden meaningful: the sequence
// reaches position 32768, the model's inverse frequencies are PyTorch's bit
// for bit, and the scaling changes the logprobs far beyond the tolerance.
func checkLongGolden(t *testing.T, g golden, m *Model, tokens, cu []int32) {
	t.Helper()
	longest := 0
	for s := 0; s+1 < len(cu); s++ {
		longest = max(longest, int(cu[s+1]-cu[s]))
	}
	if longest <= 32768 {
		t.Fatalf("longest golden sequence has %d tokens: positions do not reach 32768", longest)
	}
	if m.Config().RopeScaling.Type != RopeLlama3 {
		t.Fatalf("config RoPE scaling %+v, want llama3", m.Config().RopeScaling)
	}
	want := g.f32(t, "rope.inv_freq")
	if d := cmp.Diff(want, RopeInvFreq(m.Config())); d != "" {
		t.Errorf("inv_freq (-pytorch +go):\n%s", d)
	}
	lp, unscaled := g.f32(t, "logprob"), g.f32(t, "logprob_unscaled")
	gap := 0.0
	for i := range lp {
		gap = math.Max(gap, math.Abs(float64(lp[i]-unscaled[i])))
	}
	if gap < longMinScaledGap {
		t.Fatalf("scaled and unscaled RoPE logprobs differ by at most %g: the golden cannot tell them apart", gap)
	}
	t.Logf("scaled vs unscaled RoPE: max |Δ logprob| %.3g", gap)
}
