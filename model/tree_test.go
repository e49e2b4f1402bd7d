package model

import (
	"fmt"
	"math"
	"math/rand/v2"
	"slices"
	"strings"
	"testing"

	"github.com/tracegrpo/tracegrpo/grpo"
	"github.com/tracegrpo/tracegrpo/kernels"
	"github.com/tracegrpo/tracegrpo/kernels/cpu"
)

// randTrieBatch returns rows whose tokens are root-to-node paths of a random
// token tree (depth 1..depth, 1..branch children per node, segments of
// 0..seg tokens: a child of 0 tokens repeats its parent, a trace that is a
// prefix of another or equal to it), with random loss masks: eligible and
// masked tokens, rows with a zero sample mask, and inert [pad, pad] rows.
func randTrieBatch(r *rand.Rand, depth, branch, seg, V, maxRows int) *grpo.Batch {
	b := &grpo.Batch{}
	var grow func(prefix []int32, d int)
	grow = func(prefix []int32, d int) {
		if len(b.Rows) >= maxRows {
			return
		}
		n := r.IntN(seg + 1)
		if d == 1 {
			n = max(n, 2)
		}
		toks := slices.Clone(prefix)
		for range n {
			toks = append(toks, int32(r.IntN(V)))
		}
		if d == depth || r.IntN(3) == 0 {
			row := grpo.Row{TokenIDs: toks, TokenMask: make([]int8, len(toks)), GenLogprobs: make([]float64, len(toks)), SampleMask: 1, Valid: true}
			if r.IntN(6) == 0 {
				row.SampleMask, row.Valid = 0, false
			}
			for i := 1; i < len(toks); i++ {
				if r.IntN(3) > 0 {
					row.TokenMask[i] = 1
				}
			}
			b.Rows = append(b.Rows, row)
		}
		if d < depth {
			for range 1 + r.IntN(branch) {
				grow(toks, d+1)
			}
		}
	}
	for range 1 + r.IntN(2) {
		grow(nil, 1)
	}
	b.Rows = append(b.Rows, grpo.Row{TokenIDs: []int32{0, 0}, TokenMask: []int8{0, 0}, GenLogprobs: []float64{0, 0}})
	r.Shuffle(len(b.Rows), func(i, j int) { b.Rows[i], b.Rows[j] = b.Rows[j], b.Rows[i] })
	return b
}

// modelTree is a packed tree in the model's input form.
func modelTree(pt grpo.PackedTree) Tree {
	return Tree{Tokens: pt.Tokens, Segs: pt.Segs, Parent: pt.Parent, Rows: pt.PairRows, Labels: pt.PairLabels}
}

// sharedVsUnshared is one batch run both ways on a model: every row packed
// as its own sequence (Forward) and the rows packed as one tree
// (ForwardTree), with the same dL/dlogprob on every loss position.
type sharedVsUnshared struct {
	lpFlat, lpTree, entFlat, entTree []float32 // at the loss positions, in row order
	gFlat, gTree                     []float32
	computed, traced                 int
}

func runSharedVsUnshared(t *testing.T, m *Model, b *grpo.Batch, seed uint64) sharedVsUnshared {
	t.Helper()
	r := rand.New(rand.NewPCG(seed, 7))
	var res sharedVsUnshared
	rows := make([]int, len(b.Rows))
	var tokens, cu []int32
	var need []bool
	cu = append(cu, 0)
	for i := range rows {
		rows[i] = i
		row := &b.Rows[i]
		tokens = append(tokens, row.TokenIDs...)
		cu = append(cu, int32(len(tokens)))
		for k := range row.TokenIDs {
			need = append(need, row.TokenMask[k] != 0 && row.SampleMask > 0)
		}
	}
	// dL/dlogprob on each loss position.
	coef := make([]float32, len(tokens))
	for i, n := range need {
		if n {
			coef[i] = float32(r.NormFloat64())
		}
	}
	lp, ent, err := m.ForwardMasked(tokens, cu, 0.9, need)
	if err != nil {
		t.Fatal(err)
	}
	for i, n := range need {
		if n {
			res.lpFlat, res.entFlat = append(res.lpFlat, lp[i]), append(res.entFlat, ent[i])
		}
	}
	m.ZeroGrad()
	if err := m.Backward(coef); err != nil {
		t.Fatal(err)
	}
	res.gFlat = make([]float32, m.Table().Total)
	m.Backend().DownloadF32(res.gFlat, m.Grads())

	pt := grpo.BuildTree(b, rows)
	res.computed, res.traced = len(pt.Tokens), pt.TraceTokens
	lpT, entT, err := m.ForwardTree(modelTree(pt), 0.9)
	if err != nil {
		t.Fatal(err)
	}
	dpair := make([]float32, len(pt.PairRows))
	at := 0
	for j := range pt.Rows { // BuildTree keeps the rows' order
		for i, p := range pt.Pair[j] {
			if p >= 0 {
				res.lpTree, res.entTree = append(res.lpTree, lpT[p]), append(res.entTree, entT[p])
				dpair[p] += coef[at+i]
			}
		}
		at += len(b.Rows[j].TokenIDs)
	}
	m.ZeroGrad()
	if err := m.Backward(dpair); err != nil {
		t.Fatal(err)
	}
	res.gTree = make([]float32, m.Table().Total)
	m.Backend().DownloadF32(res.gTree, m.Grads())
	if err := m.Backend().Sync(); err != nil {
		t.Fatal(err)
	}
	return res
}

// treeGradTol is the relative error, ‖Δg‖/‖g‖ per parameter tensor, of the
// shared step's gradients against the unshared step's. The forward is
// bit-identical (TestTreeMatchesUnshared checks), and so are the gradient
// terms; a shared token's gradient is summed once, from every trace that
// holds it, where the unshared step sums its copies' contributions
// separately into each weight gradient. Reordering a float32 sum of n terms
// changes it by at most 2·n·2^-24·Σ|term|; the terms of one weight gradient
// element partly cancel (Σ|term| is about √n times |sum| for random signs),
// and these batches sum up to ~10^3 terms through 2 layers, so ~1e-4 at
// worst. Measured worst: see the test log (TRACEGRPO_TREE_REPORT).
const treeGradTol = 2e-4

// Under bf16 mixed precision the gradients entering the GEMMs and attention
// are rounded to bf16 (2^-9 relative): a shared row's gradient is rounded
// once, after its traces' contributions are summed, where the unshared step
// rounds each copy's, K roundings of terms that partly cancel against one
// (about √K·2^-9 relative to the sum: 5% for the 50 equal traces of some
// batches here). The unshared bf16 step is then no reference for the
// shared one; both are held to the fp32 step instead, with
// TestBF16StepCloseToF32's tolerance for a gradient.
const treeGradTolBF16vsF32 = 0.06

// treeGradTolHybridBF16 bounds ‖Δg‖/‖g‖ between a Nemotron-H model's
// shared and unshared bf16 steps. Their forwards are bit-identical; the
// backward rounds each gradient entering a GEMM to bf16 once per shared
// row against once per copy (treeGradTolBF16vsF32's K roundings), and
// the few loss positions of a small trie, with dL/dlogprob of random
// signs, leave sums of terms that cancel to a tenth of their size (the
// Mamba mixer's D, dt_bias, conv: measured up to 0.061 of ‖g‖).
const treeGradTolHybridBF16 = 0.1

// treeGradFloorBF16 is treeGradFloor under bf16: the rounding noise of a
// gradient whose exact value is (near) zero follows the bf16 operands'
// 2^-9, about a thousandth of the gradient's scale.
const treeGradFloorBF16 = 2e-3

// treeGradFloor scales the whole gradient's norm into an absolute allowance
// for each tensor's ‖Δg‖: a parameter whose exact gradient is (near) zero,
// such as q and k where every query sees one key (softmax is then invariant
// to them), holds rounding noise on both sides, of the size of the terms it
// sums, not of its own near-zero norm. Measured: such noise up to 7e-8 of
// the whole gradient's norm.
const treeGradFloor = 1e-6

// TestTreeMatchesUnshared is the equality property: over random tries
// (depth 1–5, branching 1–8, shared lengths from nothing to everything,
// loss tokens eligible, masked and padded), packing a batch as a token tree
// gives every loss position the log-probability and entropy of packing each
// trace as its own sequence, bit for bit on the CPU, and the same
// gradients within summation order (treeGradTol), on each architecture,
// with and without recomputation. Under bf16 mixed precision the forward
// is bit-identical too, and the shared step's gradients are as close to
// the fp32 step's as bf16 allows (treeGradTolBF16vsF32).
func TestTreeMatchesUnshared(t *testing.T) {
	b := cpu.New(2)
	defer b.Close()
	r := rand.New(rand.NewPCG(80, 80))
	var worst, worstHybrid, worstBF16, worstBF16Flat, worstHybridBF16 float64
	positions := 0
	for _, v := range []string{"qwen3_tied", "qwen2_untied", "llama_tied", "nh_blocks", "nh_groups", "nh_latent", "nh_bf16"} {
		for _, o := range []Options{{}, {Recompute: true}, {Precision: kernels.BF16}} {
			o.MaxTokens, o.MaxSeqs, o.MaxSeqLen, o.Tree = 1200, 300, 200, true
			m := loadTestModel(t, v, b, o)
			var ref *Model // the fp32 model the bf16 one is held to
			if o.Precision == kernels.BF16 {
				o.Precision = kernels.F32
				ref = loadTestModel(t, v, b, o)
				o.Precision = kernels.BF16
			}
			for it := range 8 {
				depth, branch := 1+(it+len(v))%5, 1+r.IntN(8)
				seg := []int{0, 4, 16, 30}[r.IntN(4)]
				if depth*branch > 10 {
					seg = min(seg, 6)
				}
				batch := randTrieBatch(r, depth, branch, seg, m.Config().VocabSize, 60)
				seed := r.Uint64()
				name := fmt.Sprintf("%s_recompute%v_%s_depth%d_branch%d_seg%d", v, o.Recompute, o.Precision, depth, branch, seg)
				t.Run(name, func(t *testing.T) {
					res := runSharedVsUnshared(t, m, batch, seed)
					for i := range res.lpFlat {
						if math.Float32bits(res.lpFlat[i]) != math.Float32bits(res.lpTree[i]) ||
							math.Float32bits(res.entFlat[i]) != math.Float32bits(res.entTree[i]) {
							t.Fatalf("loss position %d: tree logprob %v entropy %v, unshared %v %v", i, res.lpTree[i], res.entTree[i], res.lpFlat[i], res.entFlat[i])
						}
					}
					positions += len(res.lpFlat)
					t.Logf("computed %d tokens for %d trace tokens, %d loss positions", res.computed, res.traced, len(res.lpFlat))
					if ref == nil {
						floor := treeGradFloor * norm(res.gFlat)
						for _, p := range m.Table().Params {
							d := dist(res.gTree[p.Offset:p.Offset+p.N], res.gFlat[p.Offset:p.Offset+p.N])
							g := norm(res.gFlat[p.Offset : p.Offset+p.N])
							e := d / (treeGradTol*g + floor) // the share of the allowance used
							if treeGradTol*g+floor == 0 && d == 0 {
								e = 0 // no loss position: every gradient is 0 both ways
							}
							worst = max(worst, e)
							if m.Config().Hybrid() {
								worstHybrid = max(worstHybrid, e)
							}
							if !(e <= 1) {
								t.Errorf("%s: ‖Δg‖ = %.3g > %g·‖g‖ + %.3g (‖g‖ = %.3g)", p.Name, d, treeGradTol, floor, g)
							}
						}
						return
					}
					want := runSharedVsUnshared(t, ref, batch, seed)
					floor := treeGradFloorBF16 * norm(want.gFlat)
					for _, p := range m.Table().Params {
						g := want.gFlat[p.Offset : p.Offset+p.N]
						dTree := dist(res.gTree[p.Offset:p.Offset+p.N], g)
						dFlat := dist(res.gFlat[p.Offset:p.Offset+p.N], g)
						allow := treeGradTolBF16vsF32*norm(g) + floor
						if allow == 0 {
							continue // no loss position
						}
						if m.Config().Hybrid() {
							// Nemotron-H under bf16 is farther from its fp32 step than
							// the allowance, shared and unshared alike (rounded scan
							// operands; a near-tie of the sigmoid router picks other
							// experts): the shared step is held to the unshared one,
							// within treeGradTolHybridBF16.
							gb := res.gFlat[p.Offset : p.Offset+p.N]
							dTree, allow = dist(res.gTree[p.Offset:p.Offset+p.N], gb), treeGradTolHybridBF16*norm(gb)+treeGradFloorBF16*norm(res.gFlat)
							worstHybridBF16 = max(worstHybridBF16, dTree/allow)
							if !(dTree <= allow) {
								t.Errorf("%s: the shared bf16 gradient is %.3g from the unshared bf16 one (‖g‖ = %.3g), over %g·‖g‖ + %.3g",
									p.Name, dTree, norm(gb), treeGradTolHybridBF16, treeGradFloorBF16*norm(res.gFlat))
							}
							continue
						}
						worstBF16, worstBF16Flat = max(worstBF16, dTree/allow), max(worstBF16Flat, dFlat/allow)
						if !(dTree <= allow) {
							t.Errorf("%s: the shared bf16 gradient is %.3g from the fp32 one (‖g‖ = %.3g), over %g·‖g‖ + %.3g; the unshared bf16 one %.3g",
								p.Name, dTree, norm(g), treeGradTolBF16vsF32, floor, dFlat)
						}
					}
				})
			}
			m.Close()
			if ref != nil {
				ref.Close()
			}
		}
	}
	if positions < 1000 {
		t.Errorf("the batches held %d loss positions in all; the property needs more", positions)
	}
	t.Logf("fp32: worst share of the gradient allowance (%g·‖g‖ + %g·‖G‖) used: %.3g (Nemotron-H: %.3g)", treeGradTol, treeGradFloor, worst, worstHybrid)
	t.Logf("bf16 against fp32: worst share of the allowance (%g·‖g‖ + %g·‖G‖) used: shared %.3g, unshared %.3g", treeGradTolBF16vsF32, treeGradFloorBF16, worstBF16, worstBF16Flat)
	t.Logf("Nemotron-H bf16, shared against unshared: worst share of the allowance (%g·‖g‖ + %g·‖G‖) used: %.3g", treeGradTolHybridBF16, treeGradFloorBF16, worstHybridBF16)
}

// norm is ‖a‖₂, dist ‖a − b‖₂.
func norm(a []float32) float64 {
	var n float64
	for _, x := range a {
		n += float64(x) * float64(x)
	}
	return math.Sqrt(n)
}

func dist(a, b []float32) float64 {
	var d float64
	for i := range a {
		x := float64(a[i]) - float64(b[i])
		d += x * x
	}
	return math.Sqrt(d)
}

// TestTreeDeterministic: two tree steps of the same batch are bit-identical,
// and so are they on another thread count.
func TestTreeDeterministic(t *testing.T) {
	r := rand.New(rand.NewPCG(81, 81))
	batch := randTrieBatch(r, 4, 4, 8, 512, 30)
	var want []float32
	for _, th := range []int{1, 2, 3, 2} {
		b := cpu.New(th)
		m := loadTestModel(t, "qwen3_untied", b, Options{MaxTokens: 800, MaxSeqs: 200, Tree: true})
		res := runSharedVsUnshared(t, m, batch, 1)
		got := append(slices.Clone(res.gTree), res.lpTree...)
		if want == nil {
			want = got
		} else if !slices.EqualFunc(want, got, func(x, y float32) bool { return math.Float32bits(x) == math.Float32bits(y) }) {
			t.Errorf("%d threads: the tree step differs from the first run", th)
		}
		m.Close()
		b.Close()
	}
}

// TestForwardTreeRejects: malformed trees are errors naming what is wrong,
// not panics, and Backward after one is refused.
func TestForwardTreeRejects(t *testing.T) {
	b := cpu.New(1)
	defer b.Close()
	m := loadTestModel(t, "llama_untied", b, Options{MaxTokens: 8, MaxSeqs: 3, MaxSeqLen: 6, Tree: true})
	defer m.Close()
	good := func() Tree {
		return Tree{Tokens: []int32{1, 2, 3, 4, 5}, Segs: []int32{0, 2, 4, 5}, Parent: []int32{-1, 0, 0}, Rows: []int32{1, 1}, Labels: []int32{3, 5}}
	}
	for _, c := range []struct {
		name, want string
		edit       func(*Tree)
	}{
		{"too many tokens", "exceed Options.MaxTokens", func(tr *Tree) { tr.Tokens = make([]int32, 9); tr.Segs[3] = 9 }},
		{"too many segments", "exceed Options.MaxSeqs", func(tr *Tree) {
			tr.Segs, tr.Parent = []int32{0, 1, 2, 3, 5}, []int32{-1, -1, -1, -1}
		}},
		{"segments not ending at T", "run from 0 to 4", func(tr *Tree) { tr.Segs[3] = 4 }},
		{"an empty segment", "segment 1 spans [2, 2)", func(tr *Tree) { tr.Segs[1], tr.Segs[2] = 2, 2 }},
		{"a parent not on the path", "segment 2 has parent 0, which is not on the path", func(tr *Tree) {
			tr.Parent = []int32{-1, -1, 0}
		}},
		{"a context beyond MaxSeqLen", "context has 7 tokens", func(tr *Tree) {
			tr.Tokens, tr.Segs, tr.Parent = []int32{1, 2, 3, 4, 5, 6, 7}, []int32{0, 4, 7}, []int32{-1, 0}
		}},
		{"a token outside the vocabulary", "token 2: id 512", func(tr *Tree) { tr.Tokens[2] = 512 }},
		{"a pair row outside the tokens", "pair 1: row 5", func(tr *Tree) { tr.Rows[1] = 5 }},
		{"a label outside the vocabulary", "pair 0: label -1", func(tr *Tree) { tr.Labels[0] = -1 }},
		{"rows and labels of different lengths", "2 pair rows and 1 labels", func(tr *Tree) { tr.Labels = tr.Labels[:1] }},
	} {
		t.Run(c.name, func(t *testing.T) {
			tr := good()
			if _, _, err := m.ForwardTree(tr, 1); err != nil {
				t.Fatalf("the good tree: %v", err)
			}
			c.edit(&tr)
			_, _, err := m.ForwardTree(tr, 1)
			if err == nil || !strings.Contains(err.Error(), c.want) {
				t.Fatalf("error %v, want one containing %q", err, c.want)
			}
			if err := m.Backward([]float32{1, 1}); err == nil {
				t.Errorf("Backward after a refused ForwardTree accepted")
			}
		})
	}
	plain := loadTestModel(t, "llama_untied", b, Options{MaxTokens: 8, MaxSeqs: 3})
	defer plain.Close()
	if _, _, err := plain.ForwardTree(good(), 1); err == nil || !strings.Contains(err.Error(), "without Options.Tree") {
		t.Errorf("ForwardTree on a model built without Options.Tree: %v", err)
	}
}

// TestTreeNoAllocs: a warmed-up ForwardTree+Backward allocates nothing.
func TestTreeNoAllocs(t *testing.T) {
	b := cpu.New(2)
	defer b.Close()
	m := loadTestModel(t, "qwen3_untied", b, Options{MaxTokens: 200, MaxSeqs: 60, Tree: true})
	defer m.Close()
	batch := randTrieBatch(rand.New(rand.NewPCG(2, 2)), 3, 3, 6, 512, 12)
	rows := make([]int, len(batch.Rows))
	for i := range rows {
		rows[i] = i
	}
	tr := modelTree(grpo.BuildTree(batch, rows))
	dl := make([]float32, len(tr.Rows))
	for i := range dl {
		dl[i] = 0.1
	}
	step := func() {
		if _, _, err := m.ForwardTree(tr, 1); err != nil {
			t.Fatal(err)
		}
		if err := m.Backward(dl); err != nil {
			t.Fatal(err)
		}
	}
	step()
	if n := minAllocsPerRun(3, 5, step); n != 0 {
		t.Errorf("ForwardTree+Backward allocates %v times per step after warm-up", n)
	}
}

// TestTreeReference: the forward-only reference runs trees in the policy's
// workspace and gives the policy's log-probabilities at the same weights.
func TestTreeReference(t *testing.T) {
	b := cpu.New(2)
	defer b.Close()
	m := loadTestModel(t, "qwen2_untied", b, Options{MaxTokens: 400, MaxSeqs: 100, Tree: true})
	defer m.Close()
	ref, err := NewReference(m)
	if err != nil {
		t.Fatal(err)
	}
	defer ref.Close()
	batch := randTrieBatch(rand.New(rand.NewPCG(3, 3)), 3, 4, 8, 512, 20)
	rows := make([]int, len(batch.Rows))
	for i := range rows {
		rows[i] = i
	}
	tr := modelTree(grpo.BuildTree(batch, rows))
	want, _, err := m.ForwardTree(tr, 0.7)
	if err != nil {
		t.Fatal(err)
	}
	want = slices.Clone(want)
	got, _, err := ref.ForwardTree(tr, 0.7)
	if err != nil {
		t.Fatal(err)
	}
	if !slices.Equal(want, got) {
		t.Errorf("the reference's tree logprobs differ from the policy's")
	}
	if err := m.Backward(make([]float32, len(tr.Rows))); err != ErrNoForward {
		t.Errorf("Backward after the reference's forward: %v, want ErrNoForward", err)
	}
}

// TestGoldenSharedPrefix: the qwen3_shared golden's sequences share
// prefixes (a prompt's generations, two of them equal and one a prefix of
// another; an agent rollout branching at every turn). PyTorch ran each
// sequence alone (scripts/golden_model.py); packed as one token tree here,
// every logprob, entropy, the loss and every gradient agree with it within
// the unshared golden's tolerances.
func TestGoldenSharedPrefix(t *testing.T) {
	b := cpu.New(2)
	defer b.Close()
	g := openGoldenFile(t, "qwen3_shared")
	tokens, cu := g.i32(t, "tokens"), g.i32(t, "cu_seqlens")
	temp, coef := g.f32(t, "temperature")[0], g.f32(t, "coef")
	batch := &grpo.Batch{}
	for s := 0; s+1 < len(cu); s++ {
		seq := tokens[cu[s]:cu[s+1]]
		row := grpo.Row{TokenIDs: seq, TokenMask: make([]int8, len(seq)), GenLogprobs: make([]float64, len(seq)), SampleMask: 1, Valid: true}
		for i := 1; i < len(seq); i++ {
			row.TokenMask[i] = 1
		}
		batch.Rows = append(batch.Rows, row)
	}
	rows := make([]int, len(batch.Rows))
	for i := range rows {
		rows[i] = i
	}
	pt := grpo.BuildTree(batch, rows)
	if 2*len(pt.Tokens) > pt.TraceTokens {
		t.Fatalf("the golden's sequences share too little: %d tokens computed for %d", len(pt.Tokens), pt.TraceTokens)
	}
	m := loadTestModel(t, "qwen3_shared", b, Options{MaxTokens: len(tokens), MaxSeqs: 64, Tree: true})
	defer m.Close()
	lpP, entP, err := m.ForwardTree(modelTree(pt), temp)
	if err != nil {
		t.Fatal(err)
	}
	lp, ent := make([]float32, len(tokens)), make([]float32, len(tokens))
	dpair := make([]float32, len(lpP))
	var loss float64
	for j, r := range pt.Rows {
		for i, p := range pt.Pair[j] {
			if p >= 0 {
				at := int(cu[r]) + i
				lp[at], ent[at] = lpP[p], entP[p]
				loss += float64(coef[at]) * float64(lpP[p])
				dpair[p] += coef[at]
			}
		}
	}
	compareClose(t, "logprob", lp, g.f32(t, "logprob"), logprobAtol, logprobRtol)
	compareClose(t, "entropy", ent, g.f32(t, "entropy"), logprobAtol, logprobRtol)
	compareClose(t, "loss", []float32{float32(loss)}, g.f32(t, "loss"), logprobAtol, logprobRtol)
	m.ZeroGrad()
	if err := m.Backward(dpair); err != nil {
		t.Fatal(err)
	}
	grads := make([]float32, m.Table().Total)
	b.DownloadF32(grads, m.Grads())
	for _, p := range m.Table().Params {
		compareClose(t, "grad."+p.Name, grads[p.Offset:p.Offset+p.N], g.f32(t, "grad."+p.Name), gradAtol, gradRtol)
	}
	t.Logf("%d sequences, %d trace tokens packed as %d in %d segments, %d LM-head pairs", len(pt.Rows), pt.TraceTokens, len(pt.Tokens), len(pt.Parent), len(pt.PairRows))
}
