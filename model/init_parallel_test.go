package model

import (
	"math"
	"path/filepath"
	"runtime"
	"slices"
	"testing"

	"github.com/tracegrpo/tracegrpo/kernels/cpu"
)

// TestInitRandomParallel: the weights do not depend on how many cores draw
// them, follow InitRandom's rules (the rule-given values equal, the drawn
// ones with its moments), and differ by seed and between the chunks of one
// tensor (each chunk its own stream); a Mamba-2 hybrid's special
// parameters included.
func TestInitRandomParallel(t *testing.T) {
	for _, name := range []string{"qwen3_untied", "nh_blocks"} {
		t.Run(name, func(t *testing.T) {
			b := cpu.New(1)
			defer b.Close()
			cfg, err := LoadConfig(filepath.Join("testdata", name, "config.json"))
			if err != nil {
				t.Fatal(err)
			}
			if name == "qwen3_untied" {
				cfg.VocabSize = 2*initChunk/cfg.HiddenSize + 17 // an embedding of two chunks and a partial one
			}
			m, err := New(b, cfg, Options{MaxTokens: 4})
			if err != nil {
				t.Fatal(err)
			}
			defer m.Close()
			procs := runtime.GOMAXPROCS(1)
			m.InitRandomParallel(7)
			one := m.ParamsHost()
			runtime.GOMAXPROCS(4)
			m.InitRandomParallel(7)
			four := m.ParamsHost()
			runtime.GOMAXPROCS(procs)
			if !slices.Equal(one, four) {
				t.Fatal("InitRandomParallel: 1 and 4 cores drew different weights")
			}
			m.InitRandomParallel(8)
			if slices.Equal(one, m.ParamsHost()) {
				t.Fatal("seeds 7 and 8 gave the same weights")
			}
			m.InitRandom(7)
			seq := m.ParamsHost()
			random := 0
			for _, p := range m.Table().Params {
				a, s := one[p.Offset:p.Offset+p.N], seq[p.Offset:p.Offset+p.N]
				drawn := p.Init == InitDtBias || p.Init == InitConv || (p.Init != InitALog && !p.Bias && !p.Buffer && len(p.Shape) > 1)
				if !drawn {
					if !slices.Equal(a, s) {
						t.Errorf("%s: InitRandomParallel's values differ from InitRandom's rule", p.Name)
					}
					continue
				}
				random++
				if slices.Equal(a, s) {
					t.Errorf("%s: the parallel draw equals the sequential stream", p.Name)
				}
				ma, va := moments(a)
				ms, vs := moments(s)
				// Six standard errors of the difference of two means and of
				// two variances (normal draws: var(s²) = 2σ⁴/n).
				n := float64(len(a))
				if math.Abs(ma-ms) > 6*math.Sqrt(2*vs/n) || math.Abs(va-vs) > 6*vs*math.Sqrt(4/n) {
					t.Errorf("%s: mean %g variance %g, InitRandom's %g and %g", p.Name, ma, va, ms, vs)
				}
				if p.N > initChunk && slices.Equal(a[:initChunk/2], a[initChunk:initChunk+initChunk/2]) {
					t.Errorf("%s: two chunks drew the same values", p.Name)
				}
			}
			if random == 0 {
				t.Fatal("no drawn parameter")
			}
		})
	}
}

func moments(x []float32) (mean, variance float64) {
	var s, q float64
	for _, v := range x {
		s += float64(v)
		q += float64(v) * float64(v)
	}
	n := float64(len(x))
	return s / n, q/n - (s/n)*(s/n)
}
