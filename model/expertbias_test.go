package model

import (
	"fmt"
	"math/rand/v2"
	"path/filepath"
	"slices"
	"strings"
	"testing"

	"github.com/tracegrpo/tracegrpo/grpo"
	"github.com/tracegrpo/tracegrpo/kernels"
	"github.com/tracegrpo/tracegrpo/kernels/cpu"
)

// flatLoad is a model's expert load, every bias's counts concatenated.
func flatLoad(m *Model) []int64 {
	var out []int64
	for _, c := range m.TakeExpertLoad() {
		out = append(out, c...)
	}
	return out
}

// streamOf packs every row of b as its own sequence.
func streamOf(b *grpo.Batch) (tokens, cu []int32) {
	cu = []int32{0}
	for _, row := range b.Rows {
		tokens = append(tokens, row.TokenIDs...)
		cu = append(cu, int32(len(tokens)))
	}
	return tokens, cu
}

// TestExpertLoadTreeMatchesUnshared: over random tries, the tokens routed
// to each expert of each router by a training pass over the batch packed
// as one tree (Tree.Traces from grpo.BuildTree) equal those of every row
// packed as its own sequence, exactly: a shared token counts once per
// trace that holds it. Counting each packed position once (no Traces)
// differs wherever a prefix is shared, and each router's total is K per
// trace token.
func TestExpertLoadTreeMatchesUnshared(t *testing.T) {
	b := cpu.New(2)
	defer b.Close()
	r := rand.New(rand.NewPCG(35, 17))
	shared := 0
	for _, v := range []string{"nh_groups", "nh_latent"} {
		for _, o := range []Options{{}, {Recompute: true}} {
			o.MaxTokens, o.MaxSeqs, o.MaxSeqLen, o.Tree = 600, 200, 120, true
			m := loadTestModel(t, v, b, o)
			K := m.Config().MoE.TopK
			for it := range 6 {
				batch := randTrieBatch(r, 4, 4, 6, m.Config().VocabSize, 24)
				tokens, cu := streamOf(batch)
				if len(tokens) > o.MaxTokens {
					continue
				}
				flat, err := countPass(m, func() (int, error) {
					lp, _, err := m.Forward(tokens, cu, 1)
					return len(lp), err
				})
				if err != nil {
					t.Fatal(err)
				}
				rows := make([]int, len(batch.Rows))
				for i := range rows {
					rows[i] = i
				}
				pt := grpo.BuildTree(batch, rows)
				tr := modelTree(pt)
				tr.Traces = pt.Traces
				tree, err := countPass(m, func() (int, error) {
					lp, _, err := m.ForwardTree(tr, 1)
					return len(lp), err
				})
				if err != nil {
					t.Fatal(err)
				}
				if !slices.Equal(flat, tree) {
					t.Fatalf("%s %+v batch %d: the tree's expert load differs from the rows':\n tree %v\n rows %v", v, o, it, tree, flat)
				}
				for j, c := range chunk(flat, m.Config().MoE.NumExperts) {
					if s := sum64(c); s != int64(K*len(tokens)) {
						t.Errorf("%s: router %d counted %d assignments for %d tokens × %d", v, j, s, len(tokens), K)
					}
				}
				tr.Traces = nil
				once, err := countPass(m, func() (int, error) {
					lp, _, err := m.ForwardTree(tr, 1)
					return len(lp), err
				})
				if err != nil {
					t.Fatal(err)
				}
				if len(pt.Tokens) < len(tokens) {
					shared++
					if slices.Equal(once, flat) {
						t.Errorf("%s batch %d: counting each packed position once gives the rows' load though %d of %d tokens are shared", v, it, len(tokens)-len(pt.Tokens), len(tokens))
					}
				}
			}
			m.Close()
		}
	}
	if shared == 0 {
		t.Fatal("no batch shared a prefix: the test shows nothing")
	}
}

// countPass runs a forward (which must not count) and a backward with a
// zero gradient (which does) and returns the load of the backward.
func countPass(m *Model, forward func() (int, error)) ([]int64, error) {
	m.TakeExpertLoad()
	n, err := forward()
	if err != nil {
		return nil, err
	}
	if l := flatLoad(m); sum64(l) != 0 {
		return nil, fmt.Errorf("a forward without backward counted %d assignments", sum64(l))
	}
	m.ZeroGrad()
	if err := m.Backward(make([]float32, n)); err != nil {
		return nil, err
	}
	return flatLoad(m), nil
}

func chunk(x []int64, n int) [][]int64 {
	var out [][]int64
	for len(x) >= n {
		out = append(out, x[:n])
		x = x[n:]
	}
	return out
}

func sum64(x []int64) int64 {
	var s int64
	for _, v := range x {
		s += v
	}
	return s
}

// TestExpertLoadMTP: a training pass of a model with MTP counts its MTP
// blocks' routing too: each depth routes every token through its block, so
// a repeated block's router counts D·T·K assignments, a block per depth
// T·K each; the counts are the same with recomputation (which reuses one
// depth's buffers for every depth) as without, and a plain forward counts
// nothing.
func TestExpertLoadMTP(t *testing.T) {
	b := cpu.New(2)
	defer b.Close()
	r := rand.New(rand.NewPCG(38, 35))
	for _, v := range []string{"mtp_rep", "mtp_sep_det", "mtp_e3"} {
		cfg := mtpTestConfig(t, v)
		var loads [2][]int64
		tokens := make([]int32, 23)
		for j := range tokens {
			tokens[j] = int32(r.IntN(cfg.VocabSize))
		}
		for pass, rec := range []bool{false, true} {
			m, err := New(b, cfg, Options{MaxTokens: 64, MaxSeqs: 8, Recompute: rec})
			if err != nil {
				t.Fatal(err)
			}
			if err := m.LoadHF(filepath.Join("testdata", v)); err != nil {
				t.Fatal(err)
			}
			cu := []int32{0, 9, 23}
			T := len(tokens)
			_, _, mtp, err := m.ForwardMTP(tokens, cu, 1, nil)
			if err != nil {
				t.Fatal(err)
			}
			if l := flatLoad(m); sum64(l) != 0 {
				t.Fatalf("%s: the forward counted %d assignments", v, sum64(l))
			}
			dm := make([][]float32, len(mtp))
			for d := range dm {
				dm[d] = make([]float32, T)
			}
			if err := m.BackwardMTP(make([]float32, T), dm); err != nil {
				t.Fatal(err)
			}
			ids := m.ExpertBiases()
			load := m.TakeExpertLoad()
			K, D := cfg.MoE.TopK, cfg.MTP.Depths
			mtpBiases := 0
			for j, id := range ids {
				name := m.Table().Params[id].Name
				want := int64(T * K)
				if strings.HasPrefix(name, "mtp.") {
					mtpBiases++
					if cfg.MTP.Repeated {
						want *= int64(D)
					}
				}
				if s := sum64(load[j]); s != want {
					t.Errorf("%s (recompute %v): %s counted %d assignments, want %d", v, rec, name, s, want)
				}
				loads[pass] = append(loads[pass], load[j]...)
			}
			if mtpBiases == 0 {
				t.Fatalf("%s: no MTP selection bias", v)
			}
			m.Close()
		}
		if !slices.Equal(loads[0], loads[1]) {
			t.Errorf("%s: the load with recomputation differs:\n %v\n %v", v, loads[1], loads[0])
		}
	}
}

// TestExpertBiasStep: Megatron's update moves every expert below the mean
// load up by the rate, every one above it down, and one at the mean not at
// all, in fp32 (the mean's own rounding included: 7 tokens over 3 experts
// is 2.3333333 in fp32).
func TestExpertBiasStep(t *testing.T) {
	r := rand.New(rand.NewPCG(1, 2))
	for it := range 200 {
		E := 1 + r.IntN(40)
		count := make([]int64, E)
		bias := make([]float32, E)
		for e := range count {
			count[e] = int64(r.IntN(50))
			if it%3 == 0 {
				count[e] = int64(r.IntN(3)) // ties with the mean
			}
			bias[e] = float32(r.NormFloat64() * 0.1)
		}
		rate := float32(r.Float64() * 0.01)
		lo := r.IntN(E)
		got := slices.Clone(bias[lo:])
		ExpertBiasStep(got, count, lo, rate)
		var total int64
		for _, c := range count {
			total += c
		}
		mean := float32(total) / float32(E)
		for i, g := range got {
			c := float32(count[lo+i])
			want := bias[lo+i]
			switch {
			case c < mean:
				want += rate
			case c > mean:
				want -= rate
			}
			if g != want {
				t.Fatalf("E %d, counts %v, bias %v, rate %g: element %d is %g, want %g", E, count, bias, rate, lo+i, g, want)
			}
		}
	}
	b := []float32{0, 0, 0}
	ExpertBiasStep(b, []int64{3, 2, 2}, 0, 0.5)
	if !slices.Equal(b, []float32{-0.5, 0.5, 0.5}) {
		t.Errorf("counts 3, 2, 2: %v", b)
	}
}

// TestUpdateExpertBias: UpdateExpertBias moves each selection bias (and
// nothing else) by its own counts, refuses a load of the wrong shape, and
// the next forward routes with the new bias (under bf16 mixed precision
// too: the bias is read in fp32).
func TestUpdateExpertBias(t *testing.T) {
	b := cpu.New(2)
	defer b.Close()
	for _, prec := range []kernels.DType{kernels.F32, kernels.BF16} {
		m := loadTestModel(t, "nh_groups", b, Options{MaxTokens: 16, Precision: prec})
		ids := m.ExpertBiases()
		E := m.Config().MoE.NumExperts
		if len(ids) != m.Config().CountLayers(LayerMoE) {
			t.Fatalf("%d selection biases for %d sparse blocks", len(ids), m.Config().CountLayers(LayerMoE))
		}
		if err := m.UpdateExpertBias(make([][]int64, len(ids)+1), 1); err == nil {
			t.Error("a load for too many biases was taken")
		}
		if err := m.UpdateExpertBias([][]int64{make([]int64, E), make([]int64, E-1)}[:len(ids)], 1); err == nil && len(ids) > 1 {
			t.Error("a load with too few experts was taken")
		}
		before := m.ParamsHost()
		load := make([][]int64, len(ids))
		for j := range load {
			load[j] = make([]int64, E)
			load[j][j] = 5 // expert j above the mean, the others below
		}
		tokens := []int32{1, 2, 3, 4, 5}
		lp0, _, err := m.Forward(tokens, []int32{0, 5}, 1)
		if err != nil {
			t.Fatal(err)
		}
		lp0 = slices.Clone(lp0)
		if err := m.UpdateExpertBias(load, 2); err != nil {
			t.Fatal(err)
		}
		after := m.ParamsHost()
		isBias := map[int]int{}
		for j, i := range ids {
			isBias[i] = j
		}
		for i, p := range m.Table().Params {
			x, y := before[p.Offset:p.Offset+p.N], after[p.Offset:p.Offset+p.N]
			j, ok := isBias[i]
			if !ok {
				if !slices.Equal(x, y) {
					t.Errorf("%s changed", p.Name)
				}
				continue
			}
			for e := range E {
				want := x[e] + 2
				if e == j {
					want = x[e] - 2
				}
				if y[e] != want {
					t.Errorf("%s[%d]: %g, want %g", p.Name, e, y[e], want)
				}
			}
		}
		lp1, _, err := m.Forward(tokens, []int32{0, 5}, 1)
		if err != nil {
			t.Fatal(err)
		}
		if slices.Equal(lp0, lp1) {
			t.Errorf("%v: the forward after a bias step of 2 routes as before", prec)
		}
		m.Close()
	}
}

// TestForwardTreeRejectsTraces: a tree's trace counts must cover every
// packed token, each held by at least one trace.
func TestForwardTreeRejectsTraces(t *testing.T) {
	b := cpu.New(1)
	defer b.Close()
	m := loadTestModel(t, "nh_groups", b, Options{MaxTokens: 16, MaxSeqs: 4, Tree: true})
	defer m.Close()
	tr := Tree{Tokens: []int32{1, 2, 3}, Segs: []int32{0, 3}, Parent: []int32{-1}, Rows: []int32{0}, Labels: []int32{2}}
	for _, c := range []struct {
		traces []int32
		want   string
	}{
		{[]int32{1, 1}, "2 trace counts for 3 packed tokens"},
		{[]int32{2, 0, 1}, "token 1 is held by 0 traces"},
	} {
		tr.Traces = c.traces
		if _, _, err := m.ForwardTree(tr, 1); err == nil || !strings.Contains(err.Error(), c.want) {
			t.Errorf("traces %v: %v, want %q", c.traces, err, c.want)
		}
	}
	tr.Traces = []int32{2, 2, 1}
	if _, _, err := m.ForwardTree(tr, 1); err != nil {
		t.Error(err)
	}
}
