package model

import (
	"math"
	"math/rand/v2"
	"path/filepath"
	"testing"

	"github.com/tracegrpo/tracegrpo/kernels"
	"github.com/tracegrpo/tracegrpo/kernels/cpu"
)

// coreOnly hides every optional fused path of the backend it wraps
// (kernels/fused.go): the model runs the core ops they stand for.
type coreOnly struct{ kernels.Backend }

// TestFusedPathsSameBits: on the CPU backend, the model with the optional
// fused paths (QKNormRope and its backward, MatmulBackwardFresh,
// AddRMSNorm, RopeConvert) gives the logprobs and every gradient bit for
// bit as the model without them (their split forms: CopyCols, RMSNorm,
// RoPE and the casts, Fill and an accumulating backward product), in fp32
// and under mixed precision, for Qwen3 (q/k norms), Qwen2 (biases) and
// Llama (neither). kernels/cpu's fused paths round as the split ones do,
// so a difference is a path that computes something else.
func TestFusedPathsSameBits(t *testing.T) {
	for _, variant := range []string{"qwen3_untied", "qwen2_untied", "llama_untied"} {
		for _, prec := range []kernels.DType{kernels.F32, kernels.BF16} {
			dir := filepath.Join("testdata", variant)
			cfg, err := LoadConfig(filepath.Join(dir, "config.json"))
			if err != nil {
				t.Fatal(err)
			}
			r := rand.New(rand.NewPCG(7, uint64(prec)))
			lens := []int{9, 1, 17, 5}
			var tokens, cu []int32
			cu = append(cu, 0)
			for _, n := range lens {
				for range n {
					tokens = append(tokens, int32(r.IntN(cfg.VocabSize)))
				}
				cu = append(cu, int32(len(tokens)))
			}
			dl := make([]float32, len(tokens))
			for i := range dl {
				dl[i] = float32(r.NormFloat64())
			}
			run := func(core bool) (lp, grads []float32) {
				b := cpu.New(2)
				defer b.Close()
				var be kernels.Backend = b
				if core {
					be = coreOnly{b}
				}
				m, err := New(be, cfg, Options{MaxTokens: 64, MaxSeqs: 8, Precision: prec})
				if err != nil {
					t.Fatal(err)
				}
				defer m.Close()
				if err := m.LoadHF(dir); err != nil {
					t.Fatal(err)
				}
				if lp, _, err = m.Forward(tokens, cu, 1); err != nil {
					t.Fatal(err)
				}
				if err := m.Backward(dl); err != nil {
					t.Fatal(err)
				}
				grads = make([]float32, m.Grads().N)
				b.DownloadF32(grads, m.Grads())
				if err := b.Sync(); err != nil {
					t.Fatal(err)
				}
				return lp, grads
			}
			lpF, gF := run(false)
			lpC, gC := run(true)
			for _, c := range []struct {
				name      string
				got, want []float32
			}{{"logprobs", lpF, lpC}, {"gradients", gF, gC}} {
				for i := range c.want {
					if math.Float32bits(c.got[i]) != math.Float32bits(c.want[i]) {
						t.Errorf("%s %s: %s[%d] = %g with the fused paths, %g without", variant, prec, c.name, i, c.got[i], c.want[i])
						break
					}
				}
			}
		}
	}
}
