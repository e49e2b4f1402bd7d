package cpu

// TreeAttention against an independent float64 reference over random trees
// (finite-difference checked), against Attention over each segment's
// root-to-segment path (the unshared packing), and a forest of roots against
// Attention itself.

import (
	"fmt"
	"math"
	"math/rand/v2"
	"testing"

	"github.com/tracegrpo/tracegrpo/kernels"
	"github.com/tracegrpo/tracegrpo/kernels/internal/randtree"
)

// testTree is a tree's host arrays.
type testTree struct {
	offs, parent, ends []int32
	maxLen, maxCtx     int
}

func (tr testTree) T() int  { return int(tr.offs[len(tr.offs)-1]) }
func (tr testTree) NS() int { return len(tr.parent) }

// randTree returns randtree.Random's forest as a testTree.
func randTree(r *rand.Rand, maxDepth, maxBranch, maxSeg int) testTree {
	tr := randtree.Random(r, maxDepth, maxBranch, maxSeg)
	return testTree{offs: tr.Offs, parent: tr.Parent, ends: tr.Ends, maxLen: tr.MaxLen, maxCtx: tr.MaxCtx}
}

// context returns the tokens segment s's queries see, in context order: its
// ancestors' root first, then its own.
func (tr testTree) context(s int) []int {
	var chain []int
	for p := s; p >= 0; p = int(tr.parent[p]) {
		chain = append(chain, p)
	}
	var ctx []int
	for i := len(chain) - 1; i >= 0; i-- {
		for j := tr.offs[chain[i]]; j < tr.offs[chain[i]+1]; j++ {
			ctx = append(ctx, int(j))
		}
	}
	return ctx
}

func (tr testTree) upload(e *env) kernels.Tree {
	return kernels.Tree{Offs: e.i32(tr.offs), Parent: e.i32(tr.parent), Ends: e.i32(tr.ends), NS: tr.NS(), MaxLen: tr.maxLen, MaxCtx: tr.maxCtx}
}

// treeAttn64 is the row-by-row float64 reference: each query's scores over
// its context (ancestors, then its own segment up to itself), a textbook
// softmax.
func treeAttn64(tr testTree, q, k, v []float64, NH, NKV, HD int) (out, lse []float64) {
	T := tr.T()
	out, lse = make([]float64, T*NH*HD), make([]float64, T*NH)
	for s := range tr.NS() {
		ctx := tr.context(s)
		own := len(ctx) - int(tr.offs[s+1]-tr.offs[s])
		for i := own; i < len(ctx); i++ {
			t := ctx[i]
			for h := 0; h < NH; h++ {
				kvh := h / (NH / NKV)
				w := make([]float64, i+1)
				m := math.Inf(-1)
				for j := range w {
					tj := ctx[j]
					w[j] = dot64(q[(t*NH+h)*HD:(t*NH+h+1)*HD], k[(tj*NKV+kvh)*HD:(tj*NKV+kvh+1)*HD]) / math.Sqrt(float64(HD))
					m = max(m, w[j])
				}
				var z float64
				for _, x := range w {
					z += math.Exp(x - m)
				}
				lse[t*NH+h] = m + math.Log(z)
				for j, x := range w {
					p := math.Exp(x - lse[t*NH+h])
					tj := ctx[j]
					for d := 0; d < HD; d++ {
						out[(t*NH+h)*HD+d] += p * v[(tj*NKV+kvh)*HD+d]
					}
				}
			}
		}
	}
	return out, lse
}

// treeAttnBwd64 is the float64 reference backward; absK, absV receive, for
// each dk and dv element, the sum of the absolute values of the terms it
// sums (the scale of its rounding error).
func treeAttnBwd64(tr testTree, dout, out, lse, q, k, v []float64, NH, NKV, HD int) (dq, dk, dv, absK, absV []float64) {
	T := tr.T()
	dq, dk, dv = make([]float64, T*NH*HD), make([]float64, T*NKV*HD), make([]float64, T*NKV*HD)
	absK, absV = make([]float64, T*NKV*HD), make([]float64, T*NKV*HD)
	scale := 1 / math.Sqrt(float64(HD))
	for s := range tr.NS() {
		ctx := tr.context(s)
		own := len(ctx) - int(tr.offs[s+1]-tr.offs[s])
		for i := own; i < len(ctx); i++ {
			t := ctx[i]
			for h := 0; h < NH; h++ {
				kvh := h / (NH / NKV)
				row := (t*NH + h) * HD
				D := dot64(dout[row:row+HD], out[row:row+HD])
				for j := 0; j <= i; j++ {
					kv := (ctx[j]*NKV + kvh) * HD
					p := math.Exp(dot64(q[row:row+HD], k[kv:kv+HD])*scale - lse[t*NH+h])
					ds := p * (dot64(dout[row:row+HD], v[kv:kv+HD]) - D)
					for d := 0; d < HD; d++ {
						dq[row+d] += ds * scale * k[kv+d]
						dk[kv+d] += ds * scale * q[row+d]
						dv[kv+d] += p * dout[row+d]
						absK[kv+d] += math.Abs(ds * scale * q[row+d])
						absV[kv+d] += math.Abs(p * dout[row+d])
					}
				}
			}
		}
	}
	return
}

func TestTreeAttentionGradFD(t *testing.T) {
	r := rand.New(rand.NewPCG(60, 60))
	for it := range 4 {
		tr := randTree(r, 3, 3, 4)
		NH, NKV, HD := 4, 2, 3
		if it%2 == 1 {
			NH, NKV = 2, 2
		}
		T := tr.T()
		q, k, v := randVec(r, T*NH*HD, 1), randVec(r, T*NKV*HD, 1), randVec(r, T*NKV*HD, 1)
		wo := randVec(r, T*NH*HD, 1)
		loss := func() float64 { out, _ := treeAttn64(tr, q, k, v, NH, NKV, HD); return dot64(out, wo) }
		out, lse := treeAttn64(tr, q, k, v, NH, NKV, HD)
		dq, dk, dv, _, _ := treeAttnBwd64(tr, wo, out, lse, q, k, v, NH, NKV, HD)
		checkClose(t, "dq", dq, fdGrad(q, loss), fdAtol, fdRtol)
		checkClose(t, "dk", dk, fdGrad(k, loss), fdAtol, fdRtol)
		checkClose(t, "dv", dv, fdGrad(v, loss), fdAtol, fdRtol)
	}
}

// treeCase is one random tree with its head shape.
type treeCase struct {
	tr          testTree
	NH, NKV, HD int
}

// randTreeCases draws trees of depth 1 to 5 and branching 1 to 8 with
// segments short and long (several query blocks), and head shapes with and
// without grouped queries.
func randTreeCases(r *rand.Rand, n int) []treeCase {
	var cs []treeCase
	for it := range n {
		depth := 1 + it%5
		branch := 1 + r.IntN(8)
		seg := []int{3, 20, 70}[r.IntN(3)]
		if depth*branch > 12 {
			seg = min(seg, 8) // keep the tree's size bounded
		}
		tr := randTree(r, depth, branch, seg)
		for tr.T() > 600 {
			tr = randTree(r, depth, branch, seg)
		}
		NKV := []int{1, 2, 4}[r.IntN(3)]
		cs = append(cs, treeCase{tr, NKV * []int{1, 2, 4}[r.IntN(3)], NKV, []int{2, 6, 16, 40}[r.IntN(4)]})
	}
	return cs
}

func (c treeCase) String() string {
	return fmt.Sprintf("NS%d_T%d_ctx%d_NH%d_NKV%d_HD%d", c.tr.NS(), c.tr.T(), c.tr.maxCtx, c.NH, c.NKV, c.HD)
}

func TestTreeAttentionRandomTrees(t *testing.T) {
	r := rand.New(rand.NewPCG(61, 61))
	for _, c := range randTreeCases(r, 15) {
		t.Run(c.String(), func(t *testing.T) {
			e := newEnv(t, 1+r.IntN(3))
			T, NH, NKV, HD := c.tr.T(), c.NH, c.NKV, c.HD
			q, k, v := round32(randVec(r, T*NH*HD, 1.5)), round32(randVec(r, T*NKV*HD, 1.5)), round32(randVec(r, T*NKV*HD, 1))
			dout := round32(randVec(r, T*NH*HD, 1))
			tree := c.tr.upload(e)
			out, lse := e.zeros(T*NH*HD), e.zeros(T*NH)
			dq, dk, dv := e.f32(randVec(r, T*NH*HD, 1)), e.f32(randVec(r, T*NKV*HD, 1)), e.f32(randVec(r, T*NKV*HD, 1))
			qb, kb, vb := e.f32(q), e.f32(k), e.f32(v)
			e.b.TreeAttention(out, lse, qb, kb, vb, tree, NH, NKV, HD)
			e.b.TreeAttentionBackward(dq, dk, dv, e.f32(dout), out, lse, qb, kb, vb, tree, NH, NKV, HD)
			e.sync()
			wout, wlse := treeAttn64(c.tr, q, k, v, NH, NKV, HD)
			wdq, wdk, wdv, _, _ := treeAttnBwd64(c.tr, dout, wout, wlse, q, k, v, NH, NKV, HD)
			checkClose(t, "out", e.get(out), wout, f32Atol, f32Rtol)
			checkClose(t, "lse", e.get(lse), wlse, f32Atol, f32Rtol)
			checkClose(t, "dq", e.get(dq), wdq, f32Atol*2, f32Rtol)
			// A shared key sums over every descendant's queries: up to a few
			// thousand terms of float32 rounding.
			checkClose(t, "dk", e.get(dk), wdk, f32Atol*8, f32Rtol)
			checkClose(t, "dv", e.get(dv), wdv, f32Atol*8, f32Rtol)
		})
	}
}

// u32 is float32's unit roundoff, 2^-24.
const u32 = 1.0 / (1 << 24)

// TestTreeAttentionMatchesPaths: packing a tree's segments once (with
// TreeAttention) equals packing every segment's root-to-segment path as its
// own sequence (with Attention, what the trainer runs without sharing).
// A query's out, lse and dq are bit-identical; a shared key's dk and dv sum
// the same terms as the sum, over every path that holds it, of its dk and dv
// there, in another order. Two float32 sums of the same n terms in different
// orders each differ from the exact sum by at most γ_n·Σ|terms| (γ_n ≈ n·u,
// u = 2^-24, the recursive summation bound), so they differ from each other
// by at most 2·n·u·Σ|terms|; n is every query that sees the key, in every
// head of its group.
func TestTreeAttentionMatchesPaths(t *testing.T) {
	r := rand.New(rand.NewPCG(62, 62))
	for _, c := range randTreeCases(r, 15) {
		t.Run(c.String(), func(t *testing.T) {
			e := newEnv(t, 2)
			tr, NH, NKV, HD := c.tr, c.NH, c.NKV, c.HD
			T := tr.T()
			q, k, v := round32(randVec(r, T*NH*HD, 1.5)), round32(randVec(r, T*NKV*HD, 1.5)), round32(randVec(r, T*NKV*HD, 1))
			dout := round32(randVec(r, T*NH*HD, 1))
			// The unshared packing: segment s's path as sequence s; its
			// own rows carry dout, its ancestors' copies none (each query
			// is trained once, in its own segment's path).
			var lens []int
			var src []int  // path row → tree token
			var owns []int // path row → 1 if the row is its segment's own
			for s := range tr.NS() {
				ctx := tr.context(s)
				own := len(ctx) - int(tr.offs[s+1]-tr.offs[s])
				lens = append(lens, len(ctx))
				for i, tok := range ctx {
					src = append(src, tok)
					owns = append(owns, b2i(i >= own))
				}
			}
			P := len(src)
			gather := func(x []float64, W int, mask bool) []float64 {
				y := make([]float64, P*W)
				for i, tok := range src {
					if !mask || owns[i] == 1 {
						copy(y[i*W:(i+1)*W], x[tok*W:(tok+1)*W])
					}
				}
				return y
			}
			tree := tr.upload(e)
			out, lse := e.zeros(T*NH*HD), e.zeros(T*NH)
			dq, dk, dv := e.zeros(T*NH*HD), e.zeros(T*NKV*HD), e.zeros(T*NKV*HD)
			qb, kb, vb := e.f32(q), e.f32(k), e.f32(v)
			e.b.TreeAttention(out, lse, qb, kb, vb, tree, NH, NKV, HD)
			e.b.TreeAttentionBackward(dq, dk, dv, e.f32(dout), out, lse, qb, kb, vb, tree, NH, NKV, HD)
			pout, plse := e.zeros(P*NH*HD), e.zeros(P*NH)
			pdq, pdk, pdv := e.zeros(P*NH*HD), e.zeros(P*NKV*HD), e.zeros(P*NKV*HD)
			pq, pk, pv := e.f32(gather(q, NH*HD, false)), e.f32(gather(k, NKV*HD, false)), e.f32(gather(v, NKV*HD, false))
			seqs := e.seqs(lens)
			e.b.Attention(pout, plse, pq, pk, pv, seqs, NH, NKV, HD)
			e.b.AttentionBackward(pdq, pdk, pdv, e.f32(gather(dout, NH*HD, true)), pout, plse, pq, pk, pv, seqs, NH, NKV, HD)
			e.sync()
			// Own rows: bit-identical.
			for _, x := range []struct {
				name       string
				tree, path kernels.Buf
				W          int
			}{{"out", out, pout, NH * HD}, {"lse", lse, plse, NH}, {"dq", dq, pdq, NH * HD}} {
				tv, pv := e.b.F32(x.tree), e.b.F32(x.path)
				bad := 0
				for i, tok := range src {
					if owns[i] == 0 {
						continue
					}
					for d := range x.W {
						if math.Float32bits(tv[tok*x.W+d]) != math.Float32bits(pv[i*x.W+d]) && bad < 3 {
							bad++
							t.Errorf("%s token %d [%d]: tree %v, its path %v", x.name, tok, d, tv[tok*x.W+d], pv[i*x.W+d])
						}
					}
				}
			}
			// Keys: the sum over the paths, within the summation bound.
			wout, wlse := treeAttn64(tr, q, k, v, NH, NKV, HD)
			_, _, _, absK, absV := treeAttnBwd64(tr, dout, wout, wlse, q, k, v, NH, NKV, HD)
			seen := make([]int, T) // queries (all heads of a group) that see each key
			for s := range tr.NS() {
				ctx := tr.context(s)
				own := len(ctx) - int(tr.offs[s+1]-tr.offs[s])
				for i := own; i < len(ctx); i++ {
					for j := 0; j <= i; j++ {
						seen[ctx[j]] += NH / NKV
					}
				}
			}
			for _, x := range []struct {
				name       string
				tree, path kernels.Buf
				abs        []float64
			}{{"dk", dk, pdk, absK}, {"dv", dv, pdv, absV}} {
				W := NKV * HD
				sumPaths := make([]float64, T*W)
				pv := e.b.F32(x.path)
				for i, tok := range src {
					for d := range W {
						sumPaths[tok*W+d] += float64(pv[i*W+d])
					}
				}
				tv := e.b.F32(x.tree)
				var worst float64
				for tok := range T {
					for d := range W {
						i := tok*W + d
						bound := 2*float64(seen[tok])*u32*x.abs[i] + 1e-30
						// sumPaths adds each path's float32 value in float64:
						// one more rounding of each, within the same bound.
						err := math.Abs(float64(tv[i]) - sumPaths[i])
						worst = max(worst, err/bound)
						if err > bound {
							t.Errorf("%s token %d [%d]: tree %v, Σ paths %v: |Δ| %.3g > bound %.3g (%d terms)", x.name, tok, d, tv[i], sumPaths[i], err, bound, seen[tok])
							break
						}
					}
				}
				t.Logf("%s: worst |Δ| is %.1f%% of the summation bound", x.name, 100*worst)
			}
		})
	}
}

func b2i(b bool) int {
	if b {
		return 1
	}
	return 0
}

// TestTreeAttentionForestIsAttention: a forest of roots is a varlen batch;
// TreeAttention over it gives Attention's bits, forward and backward.
func TestTreeAttentionForestIsAttention(t *testing.T) {
	r := rand.New(rand.NewPCG(63, 63))
	lens := []int{1, 49, 3, 100, 17}
	const NH, NKV, HD = 4, 2, 16
	T := sum(lens)
	tr := testTree{offs: cuOf(lens)}
	for s, L := range lens {
		tr.parent = append(tr.parent, -1)
		tr.ends = append(tr.ends, tr.offs[s+1])
		tr.maxLen, tr.maxCtx = max(tr.maxLen, L), max(tr.maxCtx, L)
	}
	e := newEnv(t, 3)
	q, k, v := e.f32(randVec(r, T*NH*HD, 1)), e.f32(randVec(r, T*NKV*HD, 1)), e.f32(randVec(r, T*NKV*HD, 1))
	dout := e.f32(randVec(r, T*NH*HD, 1))
	res := map[string][]float32{}
	for _, tree := range []bool{false, true} {
		out, lse := e.zeros(T*NH*HD), e.zeros(T*NH)
		dq, dk, dv := e.zeros(T*NH*HD), e.zeros(T*NKV*HD), e.zeros(T*NKV*HD)
		if tree {
			tb := tr.upload(e)
			e.b.TreeAttention(out, lse, q, k, v, tb, NH, NKV, HD)
			e.b.TreeAttentionBackward(dq, dk, dv, dout, out, lse, q, k, v, tb, NH, NKV, HD)
		} else {
			seqs := e.seqs(lens)
			e.b.Attention(out, lse, q, k, v, seqs, NH, NKV, HD)
			e.b.AttentionBackward(dq, dk, dv, dout, out, lse, q, k, v, seqs, NH, NKV, HD)
		}
		e.sync()
		for name, b := range map[string]kernels.Buf{"out": out, "lse": lse, "dq": dq, "dk": dk, "dv": dv} {
			if !tree {
				res[name] = append([]float32(nil), e.b.F32(b)...)
				continue
			}
			sameBits(t, name, e.b.F32(b), res[name])
		}
	}
}

// TestTreeAttentionBadTree: a tree that breaks a rule of kernels.Tree is a
// sticky error, forward and backward.
func TestTreeAttentionBadTree(t *testing.T) {
	e := newEnv(t, 2)
	const NH, NKV, HD, T = 2, 1, 4, 6
	q, k, v := e.zeros(T*NH*HD), e.zeros(T*NKV*HD), e.zeros(T*NKV*HD)
	out, lse := e.zeros(T*NH*HD), e.zeros(T*NH)
	tree := testTree{offs: []int32{0, 2, 6}, parent: []int32{-1, 0}, ends: []int32{2, 6}, maxLen: 4, maxCtx: 6} // 0's subtree ends before its child
	e.b.TreeAttention(out, lse, q, k, v, tree.upload(e), NH, NKV, HD)
	if err := e.b.Sync(); err == nil {
		t.Errorf("TreeAttention of a tree whose ends disagree with its parents: no error")
	}
	e.b.TreeAttentionBackward(out, k, v, out, out, lse, q, k, v, tree.upload(e), NH, NKV, HD)
	if err := e.b.Sync(); err == nil {
		t.Errorf("TreeAttentionBackward of a tree whose ends disagree with its parents: no error")
	}
}
