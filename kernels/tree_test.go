package kernels

import (
	"strings"
	"testing"
)

// TestCheckTree: every rule of Tree refuses the tree that breaks it, naming
// it, and well-formed trees pass.
func TestCheckTree(t *testing.T) {
	// A well-formed tree: 0 → {1 → {2}, 3}, then root 4.
	//   segment: 0     1     2     3     4
	//   tokens:  [0,3) [3,5) [5,6) [6,9) [9,10)
	good := func() (offs, parent, ends []int32) {
		return []int32{0, 3, 5, 6, 9, 10}, []int32{-1, 0, 1, 0, -1}, []int32{9, 6, 6, 9, 10}
	}
	for _, c := range []struct {
		name  string
		edit  func(offs, parent, ends []int32) (T, maxLen, maxCtx int)
		error string // "" for a good tree
	}{
		{"good", func(o, p, e []int32) (int, int, int) { return 10, 3, 6 }, ""},
		{"forest of roots", func(o, p, e []int32) (int, int, int) {
			copy(p, []int32{-1, -1, -1, -1, -1})
			copy(e, o[1:])
			return 10, 3, 3
		}, ""},
		{"offsets not ending at T", func(o, p, e []int32) (int, int, int) { return 11, 3, 6 }, "offsets run from 0 to 10, want 0 to T=11"},
		{"empty segment", func(o, p, e []int32) (int, int, int) { o[3] = 5; return 10, 4, 9 }, "segment 2 spans [5, 5)"},
		{"segment longer than MaxLen", func(o, p, e []int32) (int, int, int) { return 10, 2, 6 }, "segment 0 spans [0, 3), want 1 to MaxLen=2"},
		{"parent after the segment", func(o, p, e []int32) (int, int, int) { p[1] = 3; return 10, 3, 6 }, "segment 1 has parent 3"},
		{"parent below -1", func(o, p, e []int32) (int, int, int) { p[4] = -2; return 10, 3, 6 }, "segment 4 has parent -2"},
		{"end inside a segment", func(o, p, e []int32) (int, int, int) { e[3] = 8; return 10, 3, 6 }, "segment 3 ends its subtree at token 8"},
		{"end before its own tokens", func(o, p, e []int32) (int, int, int) { e[1] = 3; return 10, 3, 6 }, "segment 1 ends its subtree at token 3"},
		{"descendants that are not children", func(o, p, e []int32) (int, int, int) {
			// 3 claims root 4 as a descendant.
			e[3], e[0] = 10, 10
			return 10, 3, 6
		}, "segment 3 has descendants up to token 10, but segment 4 after it has parent -1, not 3"},
		{"subtree past its parent's", func(o, p, e []int32) (int, int, int) { e[2] = 9; e[1] = 6; return 10, 3, 6 }, "segment 2 has descendants up to token 9, but segment 3 after it has parent 0, not 2"},
		{"ends that skip a sibling", func(o, p, e []int32) (int, int, int) {
			// 0's subtree stops before its child 3.
			e[0] = 6
			return 10, 3, 6
		}, "segment 3 after segment 0's subtree has parent 0, want -1"},
		{"next segment not a sibling", func(o, p, e []int32) (int, int, int) {
			// 3 claims to be a child of 1, but 1's subtree ends at 2.
			p[3] = 1
			return 10, 3, 6
		}, "segment 3 after segment 1's subtree has parent 1, want 0"},
		{"context longer than MaxCtx", func(o, p, e []int32) (int, int, int) { return 10, 3, 5 }, "segment 2 has a context of 6 tokens, more than MaxCtx=5"},
	} {
		t.Run(c.name, func(t *testing.T) {
			o, p, e := good()
			T, maxLen, maxCtx := c.edit(o, p, e)
			err := CheckTree(o, p, e, T, maxLen, maxCtx, make([]int32, len(p)))
			switch {
			case c.error == "" && err != nil:
				t.Errorf("CheckTree: %v, want nil", err)
			case c.error != "" && err == nil:
				t.Errorf("CheckTree: nil, want an error with %q", c.error)
			case c.error != "" && !strings.Contains(err.Error(), c.error):
				t.Errorf("CheckTree: %v, want an error with %q", err, c.error)
			}
		})
	}
}

// TestCheckTreeAncestors: the ancestor token counts CheckTree writes are
// each segment's first context position.
func TestCheckTreeAncestors(t *testing.T) {
	offs, parent, ends := []int32{0, 3, 5, 6, 9, 10}, []int32{-1, 0, 1, 0, -1}, []int32{9, 6, 6, 9, 10}
	anc := make([]int32, 5)
	if err := CheckTree(offs, parent, ends, 10, 3, 6, anc); err != nil {
		t.Fatal(err)
	}
	want := []int32{0, 3, 5, 3, 0}
	for i := range want {
		if anc[i] != want[i] {
			t.Errorf("anc = %v, want %v", anc, want)
			break
		}
	}
}
