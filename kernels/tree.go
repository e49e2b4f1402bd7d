package kernels

import "fmt"

// Tree describes a micro-batch packed as a forest of token segments (a token
// trie, built by package grpo from the traces of a step): segment s holds the
// tokens [Offs[s], Offs[s+1]) of the packed stream. Its queries attend
// causally within the segment and to every token of its ancestors, the
// segments on the path from its root; its positions continue from its
// parent's. Segments are numbered in depth-first preorder, so the descendants
// of s are the segments that follow it up to the end of its subtree, and they
// hold the tokens [Offs[s+1], Ends[s]).
//
// A forest of roots alone (Parent all −1, Ends[s] = Offs[s+1]) is a varlen
// batch: TreeAttention over it is Attention over Seqs with the same offsets.
//
// A well-formed tree (CheckTree) satisfies, for every segment s, with
// T = Offs[NS] and p = Parent[s]:
//
//  1. Offs[0] = 0 and Offs[s] < Offs[s+1]: no segment is empty; every
//     segment is at most MaxLen tokens;
//  2. −1 ≤ p < s;
//  3. Offs[s+1] ≤ Ends[s] ≤ T, and Ends[s] is T or the start of a segment;
//  4. if Offs[s+1] < Ends[s] (s has descendants), Parent[s+1] = s;
//  5. Ends[s] ≤ E, where E = Ends[p] (T for a root); if Ends[s] < E, the
//     segment that starts at Ends[s] is s's next sibling: its parent is p;
//  6. s's context (its tokens and its ancestors') is at most MaxCtx tokens.
//
// Rules 3–5 make Ends agree with Parent: each segment's subtree is the run
// of segments its Ends closes, and the one after is a sibling or an
// ancestor's sibling. Backends check these rules on the device where they
// run; a tree that breaks one is a data error (sticky; the outputs are then
// unspecified).
type Tree struct {
	Offs   Buf // (NS+1) I32 segment offsets: Offs[0] = 0, Offs[NS] = T
	Parent Buf // (NS) I32 the parent segment (< s), −1 for a root
	Ends   Buf // (NS) I32 the token after s's last descendant (Offs[s+1] for a leaf)
	NS     int // segments
	MaxLen int // longest segment, for launch sizing
	MaxCtx int // longest context: a segment's tokens and all its ancestors', for scratch sizing
}

// CheckTree checks the rules of Tree on host copies of its buffers for a
// packed stream of T tokens, and returns the error that names the first
// segment and rule broken, or nil. It writes each segment's ancestors'
// tokens (where its context starts: its first token's position) into
// anc (NS). Each backend enforces the same rules.
func CheckTree(offs, parent, ends []int32, T, maxLen, maxCtx int, anc []int32) error {
	NS := len(parent)
	if len(offs) != NS+1 || len(ends) != NS || len(anc) != NS {
		return fmt.Errorf("tree: %d offsets, %d parents, %d ends and %d ancestor counts; want NS+1, NS, NS and NS", len(offs), NS, len(ends), len(anc))
	}
	if offs[0] != 0 || int(offs[NS]) != T {
		return fmt.Errorf("tree: offsets run from %d to %d, want 0 to T=%d", offs[0], offs[NS], T)
	}
	// startOf returns the segment that starts at token x, or NS for x = T,
	// or −1 when no segment starts there.
	startOf := func(x int32) int {
		lo, hi := 0, NS
		for lo < hi {
			mid := (lo + hi) / 2
			if offs[mid] < x {
				lo = mid + 1
			} else {
				hi = mid
			}
		}
		if offs[lo] != x {
			return -1
		}
		return lo
	}
	for s := range NS {
		n := int(offs[s+1]) - int(offs[s])
		if n < 1 || n > maxLen {
			return fmt.Errorf("tree: segment %d spans [%d, %d), want 1 to MaxLen=%d tokens", s, offs[s], offs[s+1], maxLen)
		}
	}
	for s := range NS {
		if p := int(parent[s]); p < -1 || p >= s {
			return fmt.Errorf("tree: segment %d has parent %d, want -1 or a segment before it (depth-first preorder)", s, p)
		}
	}
	for s := range NS {
		p := int(parent[s])
		e := ends[s]
		if e < offs[s+1] || int(e) > T || startOf(e) < 0 {
			return fmt.Errorf("tree: segment %d ends its subtree at token %d, want T=%d or a segment start from %d on", s, e, T, offs[s+1])
		}
		if e > offs[s+1] && parent[s+1] != int32(s) {
			return fmt.Errorf("tree: segment %d has descendants up to token %d, but segment %d after it has parent %d, not %d",
				s, e, s+1, parent[s+1], s)
		}
		E := int32(T)
		if p >= 0 {
			E = ends[p]
		}
		if e > E {
			return fmt.Errorf("tree: segment %d's subtree ends at token %d, after its parent %d's at %d", s, e, p, E)
		}
		if e < E {
			if n := startOf(e); parent[n] != int32(p) {
				return fmt.Errorf("tree: segment %d after segment %d's subtree has parent %d, want %d (a sibling)", n, s, parent[n], p)
			}
		}
		anc[s] = 0
		if p >= 0 {
			anc[s] = anc[p] + offs[p+1] - offs[p]
		}
		if ctx := int(anc[s] + offs[s+1] - offs[s]); ctx > maxCtx {
			return fmt.Errorf("tree: segment %d has a context of %d tokens, more than MaxCtx=%d", s, ctx, maxCtx)
		}
	}
	return nil
}
