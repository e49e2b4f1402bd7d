package kerneltest

import (
	"fmt"
	"math/rand/v2"

	"github.com/tracegrpo/tracegrpo/kernels"
	"github.com/tracegrpo/tracegrpo/kernels/internal/randtree"
)

// The tolerances of TreeAttention. A query sees its whole context
// (ancestors and its segment, up to a few hundred keys here), and a shared
// key's dk and dv sum over every query of every descendant in its group's
// heads (up to about two thousand terms here), each side in another order.
var (
	// TolTreeAttention: fp32 operands on both sides, Attention's tolerance
	// (TolAttention): the longer sums are of terms that partly cancel, and
	// float32 rounding of n terms grows as n·2^-24 of Σ|term| at worst.
	// Measured worst on the emulator: 8.6e-6 absolute (dv, 3% of this at
	// rtol 1e-4 on values ~1).
	TolTreeAttention = TolAttention
	// TolTreeAttentionBF16Grad: dk and dv from bf16 operands, where P and dS
	// are rounded to bf16 as mma operands (2^-9 relative each, see
	// TolAttentionBF16Grad), summed over a shared key's descendants: more
	// terms, whose rounding errors add with random signs (growing as √n).
	// Measured worst on the emulator: 1.1e-2 absolute (dv, 19% of this).
	TolTreeAttentionBF16Grad = Tol{Atol: 4e-2, Rtol: 2e-2}
)

// randomTree is the host arrays and sizes of a kernels.Tree.
type randomTree struct {
	offs, parent, ends []int32
	maxLen, maxCtx     int
}

// newRandomTree draws randtree.Random's forests until one has at most maxT
// tokens.
func newRandomTree(r *rand.Rand, maxDepth, maxBranch, maxSeg, maxT int) randomTree {
	for {
		if tr := randtree.Random(r, maxDepth, maxBranch, maxSeg); tr.T() <= maxT {
			return randomTree{offs: tr.Offs, parent: tr.Parent, ends: tr.Ends, maxLen: tr.MaxLen, maxCtx: tr.MaxCtx}
		}
	}
}

func (tr randomTree) T() int { return int(tr.offs[len(tr.parent)]) }

func (tr randomTree) String() string {
	return fmt.Sprintf("NS=%d T=%d maxLen=%d maxCtx=%d", len(tr.parent), tr.T(), tr.maxLen, tr.maxCtx)
}

// treeBufs uploads a tree's arrays; view returns the kernels.Tree on one
// side.
func treeBufs(s *suite, tr randomTree) func(view func(*pairBuf) kernels.Buf) kernels.Tree {
	offs, parent, ends := s.i32(tr.offs), s.i32(tr.parent), s.i32(tr.ends)
	return func(view func(*pairBuf) kernels.Buf) kernels.Tree {
		return kernels.Tree{Offs: view(offs), Parent: view(parent), Ends: view(ends), NS: len(tr.parent), MaxLen: tr.maxLen, MaxCtx: tr.maxCtx}
	}
}

func init() {
	cases = append(cases, treeCases...)
}

var treeCases = []testCase{
	{"TreeAttention", func(s *suite) {
		// Random trees of depth 1 to 5 and branching 1 to 8, fp32
		// operands, the head shapes of Attention's case (fewer and smaller
		// trees for slow backends; under Options.Schedule, a rerun under
		// another schedule, the trees of depth 1, 3 and 5).
		n, maxT := 8, 400
		if s.reduced {
			n, maxT = 5, 160
		}
		for i := range n {
			if s.schedule && i%2 == 1 {
				continue
			}
			depth, branch := 1+i%5, 1+s.rng.IntN(8)
			seg := []int{3, 20, 70}[s.rng.IntN(3)]
			if depth*branch > 12 {
				seg = min(seg, 8)
			}
			tr := newRandomTree(s.rng, depth, branch, seg, maxT)
			h := headShapes[i%len(headShapes)]
			T := tr.T()
			tree := treeBufs(s, tr)
			q, k, v := s.randn(T*h.NH*h.HD, 1), s.randn(T*h.NKV*h.HD, 1), s.randn(T*h.NKV*h.HD, 1)
			out, lse := s.out(T*h.NH*h.HD), s.out(T*h.NH)
			dout := s.randn(T*h.NH*h.HD, 1)
			dq, dk, dv := s.out(T*h.NH*h.HD), s.out(T*h.NKV*h.HD), s.out(T*h.NKV*h.HD)
			both(s, func(b kernels.Backend, vw func(*pairBuf) kernels.Buf) {
				tb := tree(vw)
				b.TreeAttention(vw(out), vw(lse), vw(q), vw(k), vw(v), tb, h.NH, h.NKV, h.HD)
				b.TreeAttentionBackward(vw(dq), vw(dk), vw(dv), vw(dout), vw(out), vw(lse), vw(q), vw(k), vw(v), tb, h.NH, h.NKV, h.HD)
			})
			tag := fmt.Sprintf("depth≤%d branch≤%d %v NH=%d NKV=%d HD=%d", depth, branch, tr, h.NH, h.NKV, h.HD)
			s.check("TreeAttention out "+tag, out, TolTreeAttention)
			s.check("TreeAttention lse "+tag, lse, TolTreeAttention)
			s.check("TreeAttentionBackward dq "+tag, dq, TolTreeAttention)
			s.check("TreeAttentionBackward dk "+tag, dk, TolTreeAttention)
			s.check("TreeAttentionBackward dv "+tag, dv, TolTreeAttention)
		}
	}},
	{"TreeAttentionBF16", func(s *suite) {
		// bf16 q, k, v: the tensor-core kernels at head dimensions 64 and
		// 128 (segments that cross their 64-row tiles, GQA), then the
		// widening fallbacks (another head dimension, unaligned views).
		// Under Options.Schedule only the tensor-core shapes run: their
		// tiles, warps and blocks are what another schedule reorders.
		type shape struct {
			depth, branch, seg, maxT      int
			NH, NKV, HD                   int
			misaligned, reduced, schedule bool
		}
		shapes := []shape{
			{depth: 2, branch: 8, seg: 40, maxT: 400, NH: 4, NKV: 2, HD: 64, reduced: true, schedule: true},
			{depth: 5, branch: 2, seg: 70, maxT: 500, NH: 2, NKV: 1, HD: 128, reduced: true, schedule: true},
			{depth: 3, branch: 3, seg: 150, maxT: 700, NH: 6, NKV: 3, HD: 64},
			{depth: 4, branch: 4, seg: 10, maxT: 300, NH: 4, NKV: 4, HD: 128},
			{depth: 3, branch: 3, seg: 20, maxT: 200, NH: 4, NKV: 2, HD: 40, reduced: true},                   // widened: HD 40
			{depth: 3, branch: 3, seg: 20, maxT: 200, NH: 4, NKV: 2, HD: 64, misaligned: true, reduced: true}, // widened: unaligned views
		}
		for _, h := range shapes {
			if s.reduced && !h.reduced || s.schedule && !h.schedule {
				continue
			}
			tr := newRandomTree(s.rng, h.depth, h.branch, h.seg, h.maxT)
			T := tr.T()
			tree := treeBufs(s, tr)
			s.aligned = !h.misaligned
			q := s.randnBF16(T*h.NH*h.HD, 1)
			k := s.randnBF16(T*h.NKV*h.HD, 1)
			v := s.randnBF16(T*h.NKV*h.HD, 1)
			out32, lse := s.out(T*h.NH*h.HD), s.out(T*h.NH)
			out16 := s.randnBF16(T*h.NH*h.HD, 1)
			dout := s.randnBF16(T*h.NH*h.HD, 1)
			both(s, func(b kernels.Backend, vw func(*pairBuf) kernels.Buf) {
				tb := tree(vw)
				b.TreeAttention(vw(out32), vw(lse), vw(q), vw(k), vw(v), tb, h.NH, h.NKV, h.HD)
				b.TreeAttention(vw(out16), vw(lse), vw(q), vw(k), vw(v), tb, h.NH, h.NKV, h.HD)
			})
			tag := fmt.Sprintf("depth≤%d branch≤%d %v NH=%d NKV=%d HD=%d", h.depth, h.branch, tr, h.NH, h.NKV, h.HD)
			if h.misaligned {
				tag += " misaligned"
			}
			s.check("TreeAttention bf16 → f32 out "+tag, out32, TolAttentionBF16Out)
			s.check("TreeAttention bf16 → bf16 out "+tag, out16, TolAttentionBF16OutBF16)
			s.check("TreeAttention bf16 lse "+tag, lse, TolAttentionBF16LSE)
			// The backward pass of both backends from the reference's out
			// and lse, so that it is checked on its own.
			outR, lseR := s.bf16(s.download(s.ref, out16.r)), s.f32(s.download(s.ref, lse.r))
			dq, dk, dv := s.out(T*h.NH*h.HD), s.out(T*h.NKV*h.HD), s.out(T*h.NKV*h.HD)
			both(s, func(b kernels.Backend, vw func(*pairBuf) kernels.Buf) {
				b.TreeAttentionBackward(vw(dq), vw(dk), vw(dv), vw(dout), vw(outR), vw(lseR), vw(q), vw(k), vw(v), tree(vw), h.NH, h.NKV, h.HD)
			})
			s.check("TreeAttentionBackward bf16 dq "+tag, dq, TolAttentionBF16Grad)
			s.check("TreeAttentionBackward bf16 dk "+tag, dk, TolTreeAttentionBF16Grad)
			s.check("TreeAttentionBackward bf16 dv "+tag, dv, TolTreeAttentionBF16Grad)
			s.aligned = false
		}
	}},
	{"TreeAttentionBadTree", func(s *suite) {
		const NH, NKV, HD, T = 2, 1, 8, 10
		for _, c := range []struct {
			name               string
			offs, parent, ends []int32
			maxLen, maxCtx     int
		}{
			{"ends that disagree with parents", []int32{0, 3, 10}, []int32{-1, 0}, []int32{3, 10}, 7, 10},
			{"a parent after its child", []int32{0, 3, 10}, []int32{1, -1}, []int32{3, 10}, 7, 7},
			{"a segment longer than MaxLen", []int32{0, 3, 10}, []int32{-1, -1}, []int32{3, 10}, 6, 7},
			{"a context longer than MaxCtx", []int32{0, 3, 10}, []int32{-1, 0}, []int32{10, 10}, 7, 9},
			{"offsets not ending at T", []int32{0, 3, 9}, []int32{-1, -1}, []int32{3, 9}, 6, 6},
		} {
			tree := treeBufs(s, randomTree{offs: c.offs, parent: c.parent, ends: c.ends, maxLen: c.maxLen, maxCtx: c.maxCtx})
			q, k, v := s.randn(T*NH*HD, 1), s.randn(T*NKV*HD, 1), s.randn(T*NKV*HD, 1)
			out, lse := s.out(T*NH*HD), s.out(T*NH)
			both(s, func(b kernels.Backend, vw func(*pairBuf) kernels.Buf) {
				b.TreeAttention(vw(out), vw(lse), vw(q), vw(k), vw(v), tree(vw), NH, NKV, HD)
			})
			s.wantSyncError("TreeAttention with " + c.name)
			dq, dk, dv := s.out(T*NH*HD), s.out(T*NKV*HD), s.out(T*NKV*HD)
			both(s, func(b kernels.Backend, vw func(*pairBuf) kernels.Buf) {
				b.TreeAttentionBackward(vw(dq), vw(dk), vw(dv), vw(out), vw(out), vw(lse), vw(q), vw(k), vw(v), tree(vw), NH, NKV, HD)
			})
			s.wantSyncError("TreeAttentionBackward with " + c.name)
		}
	}},
}
