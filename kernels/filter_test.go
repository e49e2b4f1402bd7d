package kernels

import (
	"math"
	"math/rand/v2"
	"slices"
	"sort"
	"testing"

	"github.com/tracegrpo/tracegrpo/kernels/internal/nemorlgolden"
)

// TestFilterCutMatchesNeMoRL: FilterCut keeps exactly the tokens NeMo RL's
// own apply_top_k_top_p keeps (scripts/nemorl_topk_topp.py, run under
// Debian's torch), on every row of every case, ties at both thresholds
// included; NeMo RL raises exactly where top_k > V.
func TestFilterCutMatchesNeMoRL(t *testing.T) {
	g := nemorlgolden.Load(t, "testdata/nemorl_topk_topp.json")
	var sc FilterScratch
	rows, ties, kties, errs := 0, 0, 0, 0
	for _, c := range g.Cases {
		k := 0
		if c.TopK != nil {
			k = *c.TopK
		}
		if c.Error != "" {
			errs++
			if !(k > c.V) {
				t.Errorf("%s: NeMo RL raised (%s) with top_k %d <= V %d", c.Name, c.Error, k, c.V)
			}
			continue
		}
		if k > c.V {
			t.Errorf("%s: NeMo RL did not raise with top_k %d > V %d", c.Name, k, c.V)
		}
		f := TopKTopP{TopK: k, TopP: c.TopP}
		for r := 0; r < c.Rows; r++ {
			z := c.Scaled(r) // raw / temperature in float32, as logits.div_ does
			cut := FilterCut(z, f, &sc)
			for i, x := range z {
				if got, want := cut.Keeps(i, x), c.Keep(r, i); got != want {
					t.Fatalf("%s row %d: token %d (logit %g): kept %v, NeMo RL %v (cut %+v, NeMo RL keeps %d)", c.Name, r, i, x, got, want, cut, c.Kept[r])
				}
			}
			rows++
			if c.TieAtBoundary(r) {
				ties++
			}
			if k > 0 && c.Kept[r] > k {
				kties++
			}
		}
	}
	t.Logf("%d cases, %d rows (%d with a tie group straddling the top-p boundary, %d keeping more than top_k for ties at its threshold), %d NeMo RL errors (top_k > V); NeMo RL %s, torch %s",
		len(g.Cases), rows, ties, kties, errs, g.Meta.NeMoRLCommit[:12], g.Meta.Torch)
	if ties < 20 || kties < 20 {
		t.Errorf("%d rows straddle the top-p boundary with a tie group, %d keep ties past top_k: the golden does not exercise ties", ties, kties)
	}
}

// refCut is the filter by a full sort, with the same fixed-point weights:
// ascending by (logit, id), the top-k threshold, then the first ascending
// position whose cumulative weight exceeds thr·S.
func refCut(z []float32, f TopKTopP) []bool {
	V := len(z)
	keep := make([]bool, V)
	order := make([]int, V)
	for i := range order {
		order[i] = i
	}
	sort.SliceStable(order, func(a, b int) bool { return Key(z[order[a]]) < Key(z[order[b]]) })
	lo := 0 // positions below lo are dropped
	if f.topK(V) {
		tk := Key(z[order[V-f.TopK]])
		for lo < V && Key(z[order[lo]]) < tk {
			lo++
		}
	}
	if f.topP() {
		zmax := z[order[V-1]]
		var S uint64
		for _, i := range order[lo:] {
			S += FixedWeight(z[i], zmax)
		}
		thr := uint64(float64(f.Threshold()) * float64(S))
		var acc uint64
		j := lo
		for ; j < V-1; j++ {
			acc += FixedWeight(z[order[j]], zmax)
			if acc > thr {
				break
			}
		}
		lo = j
	}
	for _, i := range order[lo:] {
		keep[i] = true
	}
	return keep
}

// TestFilterCutMatchesSort: the radix select keeps what a full sort keeps,
// on random rows from flat to peaked, with heavy ties, ±0 and one token.
func TestFilterCutMatchesSort(t *testing.T) {
	r := rand.New(rand.NewPCG(32, 36))
	var sc FilterScratch
	for it := range 2000 {
		V := []int{1, 2, 3, 17, 256, 257, 1000, 3001}[r.IntN(8)]
		scale := math.Exp(r.NormFloat64() * 2)
		z := make([]float32, V)
		levels := 1 + r.IntN(8)
		for i := range z {
			switch it % 4 {
			case 0:
				z[i] = float32(r.NormFloat64() * scale)
			case 1: // ties
				z[i] = float32(math.Round(r.NormFloat64()*float64(levels)) * scale)
			case 2: // ±0 and a few values
				z[i] = []float32{0, float32(math.Copysign(0, -1)), 1, -1}[r.IntN(4)]
			default: // a peaked row with a long flat tail
				z[i] = float32(-30 + r.NormFloat64()*0.01)
				if r.IntN(50) == 0 {
					z[i] = float32(r.NormFloat64() * 3)
				}
			}
		}
		f := TopKTopP{
			TopK: []int{0, -1, 1, 2, 5, V - 1, V, V + 1}[r.IntN(8)],
			TopP: []float64{1, 0, 0.05, 0.5, 0.9, 0.95, 0.999, 1e-9, r.Float64()}[r.IntN(9)],
		}
		cut := FilterCut(z, f, &sc)
		want := refCut(z, f)
		n := 0
		for i, x := range z {
			if cut.Keeps(i, x) != want[i] {
				t.Fatalf("iteration %d (V %d, %+v): token %d (logit %g): kept %v, the full sort %v (cut %+v)", it, V, f, i, x, cut.Keeps(i, x), want[i], cut)
			}
			if want[i] {
				n++
			}
		}
		if n == 0 {
			t.Fatalf("iteration %d: nothing kept", it)
		}
	}
}

// TestKeyOrder: Key is monotone and KeyValue inverts it.
func TestKeyOrder(t *testing.T) {
	xs := []float32{float32(math.Inf(-1)), -3e38, -1, -1e-45, float32(math.Copysign(0, -1)), 0, 1e-45, 1, 3e38, float32(math.Inf(1))}
	for i := 1; i < len(xs); i++ {
		if a, b := Key(xs[i-1]), Key(xs[i]); a > b || (a == b && xs[i-1] != xs[i]) {
			t.Errorf("Key(%g) = %#x, Key(%g) = %#x: out of order", xs[i-1], a, xs[i], b)
		}
	}
	for _, x := range xs {
		if got := KeyValue(Key(x)); got != x {
			t.Errorf("KeyValue(Key(%g)) = %g", x, got)
		}
	}
	if !slices.Equal([]uint32{Key(0)}, []uint32{Key(float32(math.Copysign(0, -1)))}) {
		t.Error("-0 and +0 have different keys")
	}
}
