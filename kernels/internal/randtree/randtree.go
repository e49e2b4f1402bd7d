// Package randtree draws random packed token trees for the kernels' tests:
// the host arrays of a kernels.Tree. It is its own package so that both
// kernels/cpu's tests and kernels/kerneltest (which imports kernels/cpu)
// draw the same trees from the same random stream.
package randtree

import "math/rand/v2"

// Tree is a forest in depth-first preorder: segment s holds tokens
// Offs[s]..Offs[s+1], its parent is Parent[s] (-1 for a root), and its
// subtree ends at token Ends[s]. MaxLen is the longest segment and MaxCtx
// the longest root-to-segment context.
type Tree struct {
	Offs, Parent, Ends []int32
	MaxLen, MaxCtx     int
}

// T is the number of tokens.
func (tr Tree) T() int { return int(tr.Offs[len(tr.Offs)-1]) }

// Random returns a forest of 1..3 roots: segments of 1..maxSeg tokens,
// each node above depth maxDepth with 0..maxBranch children.
func Random(r *rand.Rand, maxDepth, maxBranch, maxSeg int) Tree {
	tr := Tree{Offs: []int32{0}}
	var grow func(parent int32, depth, ctx int)
	grow = func(parent int32, depth, ctx int) {
		s := int32(len(tr.Parent))
		n := 1 + r.IntN(maxSeg)
		tr.Parent = append(tr.Parent, parent)
		tr.Ends = append(tr.Ends, 0)
		tr.Offs = append(tr.Offs, tr.Offs[s]+int32(n))
		tr.MaxLen, tr.MaxCtx = max(tr.MaxLen, n), max(tr.MaxCtx, ctx+n)
		if depth < maxDepth {
			for range r.IntN(maxBranch + 1) {
				grow(s, depth+1, ctx+n)
			}
		}
		tr.Ends[s] = tr.Offs[len(tr.Parent)]
	}
	for range 1 + r.IntN(3) {
		grow(-1, 1, 0)
	}
	return tr
}
