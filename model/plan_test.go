package model

import (
	"cmp"
	"fmt"
	"slices"
	"testing"

	gocmp "github.com/google/go-cmp/cmp"
	"github.com/tracegrpo/tracegrpo/kernels"
	"github.com/tracegrpo/tracegrpo/kernels/cpu"
)

// shapeRecorder is the CPU backend recording the shape of every op a
// backend sizes scratch for (kernels.Workload's kinds), as the ops are
// called: what a model really runs, to hold its PlanWorkload to.
type shapeRecorder struct {
	*cpu.Backend
	gemms   map[kernels.GEMM]bool // by shape with Backward false: whether a backward ran
	heads   map[kernels.Head]bool
	norms   map[kernels.RowNorm]bool
	biases  map[kernels.GEMM]bool
	attn    map[kernels.Attn]bool
	trees   map[kernels.TreeAttn]bool
	grouped map[kernels.GroupedGEMM]bool
	routes  map[kernels.Route]bool
	scans   map[kernels.ScanShape]bool
	convs   map[kernels.ConvShape]bool
}

func newShapeRecorder(b *cpu.Backend) *shapeRecorder {
	return &shapeRecorder{Backend: b, gemms: map[kernels.GEMM]bool{}, heads: map[kernels.Head]bool{}, norms: map[kernels.RowNorm]bool{},
		biases: map[kernels.GEMM]bool{}, attn: map[kernels.Attn]bool{}, trees: map[kernels.TreeAttn]bool{},
		grouped: map[kernels.GroupedGEMM]bool{}, routes: map[kernels.Route]bool{}, scans: map[kernels.ScanShape]bool{}, convs: map[kernels.ConvShape]bool{}}
}

// note records shape k, marking it backward when bwd.
func note[K comparable](m map[K]bool, k K, bwd bool) { m[k] = m[k] || bwd }

func (r *shapeRecorder) Matmul(out, inp, weight kernels.Buf, T, C, OC int) {
	note(r.gemms, kernels.GEMM{T: T, C: C, OC: OC}, false)
	r.Backend.Matmul(out, inp, weight, T, C, OC)
}

func (r *shapeRecorder) MatmulBackward(dinp, dweight, dout, inp, weight kernels.Buf, T, C, OC int) {
	note(r.gemms, kernels.GEMM{T: T, C: C, OC: OC}, true)
	r.Backend.MatmulBackward(dinp, dweight, dout, inp, weight, T, C, OC)
}

func (r *shapeRecorder) MatmulBackwardFresh(dinp, dweight, dout, inp, weight kernels.Buf, T, C, OC int) {
	note(r.gemms, kernels.GEMM{T: T, C: C, OC: OC}, true)
	r.Backend.MatmulBackwardFresh(dinp, dweight, dout, inp, weight, T, C, OC)
}

func (r *shapeRecorder) BiasBackward(dbias, dout kernels.Buf, T, OC int) {
	note(r.biases, kernels.GEMM{T: T, OC: OC}, false)
	r.Backend.BiasBackward(dbias, dout, T, OC)
}

func (r *shapeRecorder) TokenLogprob(logprob, entropy, lse, hidden, weight, targets kernels.Buf, T, C, V int, invTemp float32) {
	note(r.heads, kernels.Head{T: T, C: C, V: V, BF16: hidden.DType == kernels.BF16}, false)
	r.Backend.TokenLogprob(logprob, entropy, lse, hidden, weight, targets, T, C, V, invTemp)
}

func (r *shapeRecorder) TokenLogprobBackward(dhidden, dweight, dlogprob, hidden, weight, targets, lse kernels.Buf, T, C, V int, invTemp float32) {
	note(r.heads, kernels.Head{T: T, C: C, V: V, BF16: hidden.DType == kernels.BF16}, true)
	r.Backend.TokenLogprobBackward(dhidden, dweight, dlogprob, hidden, weight, targets, lse, T, C, V, invTemp)
}

func (r *shapeRecorder) RMSNorm(out, rstd, inp, weight kernels.Buf, N, C int, eps float32) {
	note(r.norms, kernels.RowNorm{N: N, C: C}, false)
	r.Backend.RMSNorm(out, rstd, inp, weight, N, C, eps)
}

func (r *shapeRecorder) AddRMSNorm(sum, out, rstd, a, b, weight kernels.Buf, N, C int, eps float32) {
	note(r.norms, kernels.RowNorm{N: N, C: C}, false)
	r.Backend.AddRMSNorm(sum, out, rstd, a, b, weight, N, C, eps)
}

func (r *shapeRecorder) RMSNormBackward(dinp, dweight, dout, inp, weight, rstd kernels.Buf, N, C int) {
	note(r.norms, kernels.RowNorm{N: N, C: C}, true)
	r.Backend.RMSNormBackward(dinp, dweight, dout, inp, weight, rstd, N, C)
}

func (r *shapeRecorder) Attention(out, lse, q, k, v kernels.Buf, seqs kernels.Seqs, NH, NKV, HD int) {
	T := q.N / (NH * HD)
	note(r.attn, kernels.Attn{T: T, NH: NH, NKV: NKV, HD: HD, MaxLen: seqs.MaxLen}, false)
	r.Backend.Attention(out, lse, q, k, v, seqs, NH, NKV, HD)
}

func (r *shapeRecorder) AttentionBackward(dq, dk, dv, dout, out, lse, q, k, v kernels.Buf, seqs kernels.Seqs, NH, NKV, HD int) {
	T := q.N / (NH * HD)
	note(r.attn, kernels.Attn{T: T, NH: NH, NKV: NKV, HD: HD, MaxLen: seqs.MaxLen}, true)
	r.Backend.AttentionBackward(dq, dk, dv, dout, out, lse, q, k, v, seqs, NH, NKV, HD)
}

func (r *shapeRecorder) TreeAttention(out, lse, q, k, v kernels.Buf, tree kernels.Tree, NH, NKV, HD int) {
	T := q.N / (NH * HD)
	note(r.trees, kernels.TreeAttn{T: T, NH: NH, NKV: NKV, HD: HD, MaxLen: tree.MaxLen, MaxCtx: tree.MaxCtx}, false)
	r.Backend.TreeAttention(out, lse, q, k, v, tree, NH, NKV, HD)
}

func (r *shapeRecorder) TreeAttentionBackward(dq, dk, dv, dout, out, lse, q, k, v kernels.Buf, tree kernels.Tree, NH, NKV, HD int) {
	T := q.N / (NH * HD)
	note(r.trees, kernels.TreeAttn{T: T, NH: NH, NKV: NKV, HD: HD, MaxLen: tree.MaxLen, MaxCtx: tree.MaxCtx}, true)
	r.Backend.TreeAttentionBackward(dq, dk, dv, dout, out, lse, q, k, v, tree, NH, NKV, HD)
}

func (r *shapeRecorder) GroupedMatmul(out, inp, weight, offsets kernels.Buf, N, C, OC, E int) {
	note(r.grouped, kernels.GroupedGEMM{N: N, C: C, OC: OC, E: E}, false)
	r.Backend.GroupedMatmul(out, inp, weight, offsets, N, C, OC, E)
}

func (r *shapeRecorder) GroupedMatmulBackward(dinp, dweight, dout, inp, weight, offsets kernels.Buf, N, C, OC, E int) {
	note(r.grouped, kernels.GroupedGEMM{N: N, C: C, OC: OC, E: E}, true)
	r.Backend.GroupedMatmulBackward(dinp, dweight, dout, inp, weight, offsets, N, C, OC, E)
}

func (r *shapeRecorder) ExpertRoute(offsets, order, slot, experts kernels.Buf, T, K, E int) {
	note(r.routes, kernels.Route{T: T, K: K, E: E}, false)
	r.Backend.ExpertRoute(offsets, order, slot, experts, T, K, E)
}

func (r *shapeRecorder) SSMScan(y, final, xbc, dtRaw, dtBias, aLog, d kernels.Buf, tree kernels.Tree, T int, s kernels.Scan) {
	note(r.scans, kernels.ScanShape{T: T, MaxSegs: tree.NS, MaxLen: tree.MaxLen, MaxCtx: tree.MaxCtx, Scan: s}, false)
	r.Backend.SSMScan(y, final, xbc, dtRaw, dtBias, aLog, d, tree, T, s)
}

func (r *shapeRecorder) SSMScanBackward(dxbc, ddtRaw, ddtBias, daLog, dd, dy, xbc, dtRaw, dtBias, aLog, d kernels.Buf, tree kernels.Tree, T int, s kernels.Scan) {
	note(r.scans, kernels.ScanShape{T: T, MaxSegs: tree.NS, MaxLen: tree.MaxLen, MaxCtx: tree.MaxCtx, Scan: s}, true)
	r.Backend.SSMScanBackward(dxbc, ddtRaw, ddtBias, daLog, dd, dy, xbc, dtRaw, dtBias, aLog, d, tree, T, s)
}

func (r *shapeRecorder) Conv1D(out, inp, weight, bias kernels.Buf, tree kernels.Tree, T, CD, KW int) {
	note(r.convs, kernels.ConvShape{T: T, CD: CD, KW: KW}, false)
	r.Backend.Conv1D(out, inp, weight, bias, tree, T, CD, KW)
}

func (r *shapeRecorder) Conv1DBackward(dinp, dweight, dbias, dout, inp, weight, bias kernels.Buf, tree kernels.Tree, T, CD, KW int) {
	note(r.convs, kernels.ConvShape{T: T, CD: CD, KW: KW}, true)
	r.Backend.Conv1DBackward(dinp, dweight, dbias, dout, inp, weight, bias, tree, T, CD, KW)
}

// workload is what was recorded, each shape once, sorted.
func (r *shapeRecorder) workload() kernels.Workload {
	var w kernels.Workload
	for k, b := range r.gemms {
		k.Backward = b
		w.GEMMs = append(w.GEMMs, k)
	}
	for k, b := range r.heads {
		k.Backward = b
		w.Heads = append(w.Heads, k)
	}
	for k, b := range r.norms {
		k.Backward = b
		w.RowNorms = append(w.RowNorms, k)
	}
	for k := range r.biases {
		w.Biases = append(w.Biases, k)
	}
	for k, b := range r.attn {
		k.Backward = b
		w.Attention = append(w.Attention, k)
	}
	for k, b := range r.trees {
		k.Backward = b
		w.Trees = append(w.Trees, k)
	}
	for k, b := range r.grouped {
		k.Backward = b
		w.Grouped = append(w.Grouped, k)
	}
	for k := range r.routes {
		w.Routes = append(w.Routes, k)
	}
	for k, b := range r.scans {
		k.Backward = b
		w.Scans = append(w.Scans, k)
	}
	for k, b := range r.convs {
		k.Backward = b
		w.Convs = append(w.Convs, k)
	}
	return canonical(w)
}

// canonical is w with each list deduplicated and sorted (by its printed
// form), nil where empty.
func canonical(w kernels.Workload) kernels.Workload {
	w.GEMMs = sortedSet(w.GEMMs)
	w.Heads = sortedSet(w.Heads)
	w.RowNorms = sortedSet(w.RowNorms)
	w.Biases = sortedSet(w.Biases)
	w.Attention = sortedSet(w.Attention)
	w.Trees = sortedSet(w.Trees)
	w.Decode = sortedSet(w.Decode)
	w.Grouped = sortedSet(w.Grouped)
	w.Routes = sortedSet(w.Routes)
	w.Scans = sortedSet(w.Scans)
	w.Convs = sortedSet(w.Convs)
	w.SumSquares = sortedSet(w.SumSquares)
	return w
}

func sortedSet[T comparable](xs []T) []T {
	seen := map[T]bool{}
	var out []T
	for _, x := range xs {
		if !seen[x] {
			seen[x] = true
			out = append(out, x)
		}
	}
	slices.SortFunc(out, func(a, b T) int { return cmp.Compare(fmt.Sprintf("%+v", a), fmt.Sprintf("%+v", b)) })
	return out
}

// TestHybridWorkloadIsWhatRuns: a tiny Nemotron-H model's PlanWorkload
// (which sizes a backend's scratch in the memory plan) lists exactly the
// op shapes the model calls in a training step at its largest micro-batch
// (MaxSeqs sequences of MaxSeqLen tokens), every block kind of the
// pattern with its own shapes (the Mamba mixer's in_proj/out_proj GEMMs,
// conv and scan, attention with its head_dim, the squared-ReLU MLP
// without a gate, the router, grouped experts, shared expert and latent
// projections), no more and no fewer: fp32 and bf16, with and without
// activation checkpointing, and forward-only.
func TestHybridWorkloadIsWhatRuns(t *testing.T) {
	const S, L = 3, 7
	for _, v := range []string{"nh_blocks", "nh_groups", "nh_latent"} {
		cfg, err := LoadConfig("testdata/" + v + "/config.json")
		if err != nil {
			t.Fatal(err)
		}
		for _, c := range []struct {
			name string
			opt  Options
		}{
			{"f32", Options{}},
			{"bf16_recompute", Options{Precision: kernels.BF16, Recompute: true}},
			{"forward_only", Options{ForwardOnly: true}},
		} {
			t.Run(v+"/"+c.name, func(t *testing.T) {
				opt := c.opt
				opt.MaxTokens, opt.MaxSeqs, opt.MaxSeqLen = S*L, S, L
				b := cpu.New(2)
				defer b.Close()
				rec := newShapeRecorder(b)
				m, err := New(rec, cfg, opt)
				if err != nil {
					t.Fatal(err)
				}
				defer m.Close()
				m.InitRandom(7)
				tokens := make([]int32, S*L)
				for i := range tokens {
					tokens[i] = int32((i*37 + 5) % cfg.VocabSize)
				}
				if _, _, err := m.Forward(tokens, []int32{0, L, 2 * L, 3 * L}, 1); err != nil {
					t.Fatal(err)
				}
				if !opt.ForwardOnly {
					dl := make([]float32, len(tokens))
					for i := range dl {
						dl[i] = 0.1
					}
					if err := m.Backward(dl); err != nil {
						t.Fatal(err)
					}
				}
				if err := b.Sync(); err != nil {
					t.Fatal(err)
				}
				plan, err := PlanWorkload(cfg, opt)
				if err != nil {
					t.Fatal(err)
				}
				if d := gocmp.Diff(canonical(plan), rec.workload()); d != "" {
					t.Errorf("PlanWorkload against the ops the step ran (-plan +ran):\n%s", d)
				}
			})
		}
	}
}

// TestScanPieces: a packed micro-batch of more sequences than one scan
// runs (scanPieceSegs) gives the log-probabilities of a single scan bit
// for bit, and its gradients within rounding (dt_bias, A_log and D sum
// piece by piece), on fp32 and bf16; every scan it runs is within the
// plan's ScanShape (its tokens, at most scanPieceSegs segments).
func TestScanPieces(t *testing.T) {
	cfg, err := LoadConfig("testdata/nh_blocks/config.json")
	if err != nil {
		t.Fatal(err)
	}
	lens := []int{3, 1, 5, 2, 4, 6, 2, 3, 1, 7, 2, 2, 5, 3, 4, 1, 2, 6, 3, 2, 4, 5, 1} // 23 sequences
	cu := []int32{0}
	for _, n := range lens {
		cu = append(cu, cu[len(cu)-1]+int32(n))
	}
	T := int(cu[len(cu)-1])
	tokens := make([]int32, T)
	for i := range tokens {
		tokens[i] = int32((i*29 + 3) % cfg.VocabSize)
	}
	for _, prec := range []kernels.DType{kernels.F32, kernels.BF16} {
		t.Run(prec.String(), func(t *testing.T) {
			opt := Options{MaxTokens: T, MaxSeqs: len(lens), MaxSeqLen: 8, Precision: prec}
			run := func(segs int) ([]float32, []float32, *shapeRecorder) {
				defer func(n int) { scanPieceSegs = n }(scanPieceSegs)
				scanPieceSegs = segs
				b := cpu.New(2)
				defer b.Close()
				rec := newShapeRecorder(b)
				m, err := New(rec, cfg, opt)
				if err != nil {
					t.Fatal(err)
				}
				defer m.Close()
				m.InitRandom(11)
				lp, _, err := m.Forward(tokens, cu, 1)
				if err != nil {
					t.Fatal(err)
				}
				lp = slices.Clone(lp)
				dl := make([]float32, T)
				for i := range dl {
					dl[i] = float32(i%5) * 0.1
				}
				if err := m.Backward(dl); err != nil {
					t.Fatal(err)
				}
				g := make([]float32, m.Grads().N)
				b.DownloadF32(g, m.Grads())
				return lp, g, rec
			}
			lp1, g1, _ := run(len(lens)) // one scan
			lp2, g2, rec := run(5)       // five pieces
			if !slices.Equal(lp1, lp2) {
				t.Errorf("logprobs in pieces differ from one scan:\n%v\n%v", lp1, lp2)
			}
			const atol, rtol = 1e-6, 1e-5 // a sum of five pieces against one
			worst := 0.0
			for i := range g1 {
				d := float64(g1[i] - g2[i])
				if d < 0 {
					d = -d
				}
				if lim := atol + rtol*float64(max(g1[i], -g1[i])); d > lim {
					t.Fatalf("gradient %d: %g in pieces, %g in one scan", i, g2[i], g1[i])
				}
				worst = max(worst, d)
			}
			t.Logf("largest gradient difference %.3g", worst)
			scans := 0
			for k := range rec.scans {
				scans++
				if k.MaxSegs > 5 || k.T > T {
					t.Errorf("a scan of %d segments, %d tokens: over the pieces' %d and the micro-batch's %d", k.MaxSegs, k.T, 5, T)
				}
			}
			if scans < 2 {
				t.Errorf("%d scan shapes ran, want the pieces'", scans)
			}
			defer func(n int) { scanPieceSegs = n }(scanPieceSegs)
			scanPieceSegs = 5
			plan, err := PlanWorkload(cfg, opt)
			if err != nil {
				t.Fatal(err)
			}
			if len(plan.Scans) != 1 || plan.Scans[0].MaxSegs != 5 || plan.Scans[0].T != T {
				t.Errorf("the plan's scans %+v, want one of %d tokens in at most 5 segments", plan.Scans, T)
			}
		})
	}
}
