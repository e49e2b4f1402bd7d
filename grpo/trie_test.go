package grpo

import (
	"fmt"
	"math/rand/v2"
	"slices"
	"testing"

	"github.com/google/go-cmp/cmp"
	"github.com/tracegrpo/tracegrpo/kernels"
)

// randTrieRows returns rows whose tokens are root-to-node paths of a random
// token tree: depth 1..depth, 1..branch children, segments of 0..seg tokens
// (a child of 0 tokens shares all of its parent: a trace that is a prefix of
// another, or an identical one), children that may start with the same
// token as a sibling (they share part of a segment). Masks are random:
// eligible tokens, masked ones, rows with a zero sample mask, and inert
// [pad, pad] rows.
func randTrieRows(r *rand.Rand, depth, branch, seg, vocab int) []Row {
	var rows []Row
	var grow func(prefix []int32, d int)
	grow = func(prefix []int32, d int) {
		n := r.IntN(seg + 1)
		if d == 1 {
			n = max(n, 2) // a trace has at least 2 tokens
		}
		toks := slices.Clone(prefix)
		for range n {
			toks = append(toks, int32(r.IntN(vocab)))
		}
		if len(toks) >= 2 && (d == depth || r.IntN(3) == 0) {
			for range 1 + r.IntN(2) { // sometimes twice: identical traces
				rows = append(rows, randRow(r, toks))
			}
		}
		if d < depth {
			for range 1 + r.IntN(branch) {
				grow(toks, d+1)
			}
		}
	}
	for range 1 + r.IntN(3) {
		grow(nil, 1)
	}
	for range r.IntN(3) {
		rows = append(rows, Row{TokenIDs: []int32{0, 0}, TokenMask: []int8{0, 0}, GenLogprobs: []float64{0, 0}})
	}
	r.Shuffle(len(rows), func(i, j int) { rows[i], rows[j] = rows[j], rows[i] })
	for i := range rows {
		rows[i].TraceID = fmt.Sprintf("t%d", i)
	}
	return rows
}

func randRow(r *rand.Rand, toks []int32) Row {
	row := Row{TokenIDs: toks, TokenMask: make([]int8, len(toks)), GenLogprobs: make([]float64, len(toks)), SampleMask: 1, Valid: true}
	if r.IntN(6) == 0 {
		row.SampleMask = 0
	}
	for i := 1; i < len(toks); i++ {
		if r.IntN(2) == 0 {
			row.TokenMask[i] = 1
			row.GenLogprobs[i] = -r.Float64()
		}
	}
	return row
}

// treeEnds returns the subtree ends of a packed tree (its kernels.Tree.Ends)
// by walking Parent.
func treeEnds(pt PackedTree) []int32 {
	NS := len(pt.Parent)
	ends := make([]int32, NS)
	for s := NS - 1; s >= 0; s-- {
		ends[s] = max(ends[s], pt.Segs[s+1])
		if p := pt.Parent[s]; p >= 0 {
			ends[p] = max(ends[p], ends[s])
		}
	}
	return ends
}

// context returns the tokens a packed position sees: its ancestors' and its
// segment's up to and including it.
func (pt PackedTree) context(pos int32) []int32 {
	s, _ := slices.BinarySearch(pt.Segs, pos+1)
	s-- // the segment holding pos
	var chain []int32
	for a := int32(s); a >= 0; a = pt.Parent[a] {
		chain = append(chain, a)
	}
	var ctx []int32
	for i := len(chain) - 1; i > 0; i-- {
		ctx = append(ctx, pt.Tokens[pt.Segs[chain[i]]:pt.Segs[chain[i]+1]]...)
	}
	return append(ctx, pt.Tokens[pt.Segs[s]:pos+1]...)
}

// TestBuildTreeProperties: over random tries (depth 1–5, branching 1–8,
// shared lengths from nothing to everything), the packed tree is a
// well-formed kernels.Tree; every packed token's context is a prefix of a
// row, and every distinct prefix of a row is packed exactly once; every
// needed log-probability comes from a pair whose row's context is exactly
// the trace's tokens before it and whose label is the trace's token; pairs
// are distinct and each one is needed; Traces counts the rows through each
// packed position.
func TestBuildTreeProperties(t *testing.T) {
	r := rand.New(rand.NewPCG(70, 70))
	for it := range 60 {
		depth, branch := 1+it%5, 1+r.IntN(8)
		seg := []int{0, 1, 3, 20}[r.IntN(4)]
		if depth*branch > 16 {
			seg = min(seg, 3)
		}
		rows := randTrieRows(r, depth, branch, seg, []int{2, 5, 50}[r.IntN(3)])
		t.Run(fmt.Sprintf("depth%d_branch%d_seg%d_rows%d", depth, branch, seg, len(rows)), func(t *testing.T) {
			b := &Batch{Rows: rows}
			idx := make([]int, len(rows))
			for i := range idx {
				idx[i] = i
			}
			pt := BuildTree(b, idx)
			T := len(pt.Tokens)
			maxLen, maxCtx := 0, 0
			for s := range pt.Parent {
				maxLen = max(maxLen, int(pt.Segs[s+1]-pt.Segs[s]))
				maxCtx = max(maxCtx, len(pt.context(pt.Segs[s+1]-1)))
			}
			if err := kernels.CheckTree(pt.Segs, pt.Parent, treeEnds(pt), T, maxLen, maxCtx, make([]int32, len(pt.Parent))); err != nil {
				t.Fatalf("not a kernels.Tree: %v", err)
			}
			// Every distinct row prefix exactly once.
			prefixes := map[string]bool{}
			for _, row := range rows {
				for i := 1; i <= len(row.TokenIDs); i++ {
					prefixes[fmt.Sprint(row.TokenIDs[:i])] = true
				}
			}
			seen := map[string]bool{}
			for p := range int32(T) {
				k := fmt.Sprint(pt.context(p))
				if !prefixes[k] {
					t.Fatalf("packed position %d's context %s is no row's prefix", p, k)
				}
				if seen[k] {
					t.Fatalf("prefix %s packed twice", k)
				}
				seen[k] = true
			}
			if len(seen) != len(prefixes) {
				t.Fatalf("%d distinct prefixes, %d packed tokens", len(prefixes), T)
			}
			// Pairs.
			used := make([]bool, len(pt.PairRows))
			pairSet := map[[2]int32]bool{}
			for p := range pt.PairRows {
				key := [2]int32{pt.PairRows[p], pt.PairLabels[p]}
				if pairSet[key] {
					t.Fatalf("pair %v twice", key)
				}
				pairSet[key] = true
			}
			trace := 0
			for j, ri := range pt.Rows {
				row := &rows[ri]
				trace += len(row.TokenIDs)
				for i := range row.TokenIDs {
					p := pt.Pair[j][i]
					if !needAt(row, i) {
						if p != -1 {
							t.Fatalf("row %d position %d: pair %d where no log-probability is read", ri, i, p)
						}
						continue
					}
					used[p] = true
					if got := pt.context(pt.PairRows[p]); !slices.Equal(got, row.TokenIDs[:i]) || pt.PairLabels[p] != row.TokenIDs[i] {
						t.Fatalf("row %d position %d: pair (context %v, label %d), want (%v, %d)", ri, i, got, pt.PairLabels[p], row.TokenIDs[:i], row.TokenIDs[i])
					}
				}
			}
			for p, u := range used {
				if !u {
					t.Fatalf("pair %d is read by no row", p)
				}
			}
			if pt.TraceTokens != trace {
				t.Errorf("TraceTokens %d, want %d", pt.TraceTokens, trace)
			}
			// Traces: the rows whose tokens begin with each packed
			// position's context.
			if len(pt.Traces) != T {
				t.Fatalf("%d trace counts for %d packed tokens", len(pt.Traces), T)
			}
			for p := range int32(T) {
				ctx, n := pt.context(p), int32(0)
				for _, row := range rows {
					if len(row.TokenIDs) >= len(ctx) && slices.Equal(row.TokenIDs[:len(ctx)], ctx) {
						n++
					}
				}
				if pt.Traces[p] != n {
					t.Fatalf("packed position %d (context %v) is held by %d rows, Traces says %d", p, ctx, n, pt.Traces[p])
				}
			}
		})
	}
}

// TestBuildTreeShapes: hand-made cases of the boundary token.
func TestBuildTreeShapes(t *testing.T) {
	row := func(toks []int32, need ...int) Row {
		r := Row{TokenIDs: toks, TokenMask: make([]int8, len(toks)), GenLogprobs: make([]float64, len(toks)), SampleMask: 1}
		for _, i := range need {
			r.TokenMask[i] = 1
		}
		return r
	}
	for _, c := range []struct {
		name               string
		rows               []Row
		tokens             []int32
		segs, parent       []int32
		pairRows, pairLabs []int32
	}{
		{"a group's prompt, two generations: the boundary row scores both labels",
			[]Row{row([]int32{1, 2, 3, 4, 5}, 3, 4), row([]int32{1, 2, 3, 7, 8}, 3, 4)},
			[]int32{1, 2, 3, 4, 5, 7, 8}, []int32{0, 3, 5, 7}, []int32{-1, 0, 0},
			[]int32{2, 3, 2, 5}, []int32{4, 5, 7, 8}},
		{"a trace that is a prefix of another: no extra segment",
			[]Row{row([]int32{1, 2, 3}, 2), row([]int32{1, 2, 3, 4}, 3)},
			[]int32{1, 2, 3, 4}, []int32{0, 4}, []int32{-1},
			[]int32{1, 2}, []int32{3, 4}},
		{"identical generations share their pairs",
			[]Row{row([]int32{1, 2, 3}, 1, 2), row([]int32{1, 2, 3}, 2)},
			[]int32{1, 2, 3}, []int32{0, 3}, []int32{-1},
			[]int32{0, 1}, []int32{2, 3}},
		{"nothing shared: a forest",
			[]Row{row([]int32{5, 6}, 1), row([]int32{1, 2}, 1)},
			[]int32{1, 2, 5, 6}, []int32{0, 2, 4}, []int32{-1, -1},
			[]int32{2, 0}, []int32{6, 2}},
		{"branch right after the first token",
			[]Row{row([]int32{1, 2}, 1), row([]int32{1, 3}, 1), row([]int32{1, 4, 5}, 2)},
			[]int32{1, 2, 3, 4, 5}, []int32{0, 1, 2, 3, 5}, []int32{-1, 0, 0, 0},
			[]int32{0, 0, 3}, []int32{2, 3, 5}},
	} {
		t.Run(c.name, func(t *testing.T) {
			b := &Batch{Rows: c.rows}
			idx := make([]int, len(c.rows))
			for i := range idx {
				idx[i] = i
			}
			pt := BuildTree(b, idx)
			for _, x := range []struct {
				what      string
				got, want []int32
			}{{"tokens", pt.Tokens, c.tokens}, {"segs", pt.Segs, c.segs}, {"parent", pt.Parent, c.parent},
				{"pair rows", pt.PairRows, c.pairRows}, {"pair labels", pt.PairLabels, c.pairLabs}} {
				if diff := cmp.Diff(x.want, x.got); diff != "" {
					t.Errorf("%s (-want +got):\n%s", x.what, diff)
				}
			}
		})
	}
}

// TestPackTrees: every row is packed once; each micro-batch fits the
// limits; the packing does not depend on the rows' order; splits fall
// between consecutive subtrees and are greedy: the next micro-batch's first
// row would not have fit; and a budget that holds the whole trie packs it
// as one tree.
func TestPackTrees(t *testing.T) {
	r := rand.New(rand.NewPCG(71, 71))
	for it := range 40 {
		rows := randTrieRows(r, 1+it%5, 1+r.IntN(8), []int{1, 3, 20}[r.IntN(3)], 6)
		b := &Batch{Rows: rows}
		idx := make([]int, len(rows))
		longest := 0
		for i := range idx {
			idx[i] = i
			longest = max(longest, len(rows[i].TokenIDs))
		}
		lim := TreeLimits{MaxTokens: longest + r.IntN(3*longest+1), MaxSegs: 2 + r.IntN(20)}
		t.Run(fmt.Sprintf("rows%d_limit%d_%d", len(rows), lim.MaxTokens, lim.MaxSegs), func(t *testing.T) {
			trees, err := PackTrees(b, idx, lim)
			if err != nil {
				t.Fatal(err)
			}
			var got []int
			for _, pt := range trees {
				got = append(got, pt.Rows...)
				if len(pt.Tokens) > lim.MaxTokens || len(pt.PairRows) > lim.MaxTokens || len(pt.Parent) > lim.MaxSegs {
					t.Errorf("a micro-batch of %d tokens, %d pairs, %d segments: over %+v", len(pt.Tokens), len(pt.PairRows), len(pt.Parent), lim)
				}
			}
			slices.Sort(got)
			if diff := cmp.Diff(idx, got); diff != "" {
				t.Fatalf("rows packed (-want +got):\n%s", diff)
			}
			shuffled := slices.Clone(idx)
			r.Shuffle(len(shuffled), func(i, j int) { shuffled[i], shuffled[j] = shuffled[j], shuffled[i] })
			again, _ := PackTrees(b, shuffled, lim)
			if diff := cmp.Diff(trees, again); diff != "" {
				t.Errorf("packing depends on the rows' order (-in order +shuffled):\n%s", diff)
			}
			// Greedy: the next micro-batch's first row did not fit the
			// previous one by the packer's accounting (computed tokens
			// exactly; segments and pairs by their upper bounds, two
			// segments and its loss positions a row).
			for k := 1; k < len(trees); k++ {
				prev, first := trees[k-1], trees[k].Rows[0]
				merged := BuildTree(b, append(slices.Clone(prev.Rows), first))
				if len(merged.Tokens) <= lim.MaxTokens && 2*(len(prev.Rows)+1) <= lim.MaxSegs && sumNeed(rows, merged.Rows) <= lim.MaxTokens {
					t.Errorf("micro-batch %d ends before row %d, which fits it", k-1, first)
				}
			}
			whole := BuildTree(b, idx)
			if big, _ := PackTrees(b, idx, TreeLimits{MaxTokens: 1 << 20, MaxSegs: 1 << 20}); len(big) != 1 || len(big[0].Tokens) != len(whole.Tokens) {
				t.Errorf("an unbounded budget packs %d trees, want 1 of %d tokens", len(big), len(whole.Tokens))
			}
		})
	}
}

func countNeed(r *Row) int {
	n := 0
	for i := range r.TokenIDs {
		if needAt(r, i) {
			n++
		}
	}
	return n
}

func sumNeed(rows []Row, idx []int) int {
	n := 0
	for _, i := range idx {
		n += countNeed(&rows[i])
	}
	return n
}

// TestPackTreesSplitsAtBranchPoints: a group of K generations of P prompt
// tokens, S each, in a budget of two generations' worth: every part
// computes the prompt once.
func TestPackTreesSplitsAtBranchPoints(t *testing.T) {
	const P, K, S = 10, 7, 4
	var rows []Row
	for k := range K {
		toks := make([]int32, P+S)
		for i := range P {
			toks[i] = int32(i + 1)
		}
		for i := range S {
			toks[P+i] = int32(100 + 10*k + i)
		}
		rows = append(rows, Row{TokenIDs: toks, TokenMask: make([]int8, P+S), GenLogprobs: make([]float64, P+S), SampleMask: 1})
	}
	b := &Batch{Rows: rows}
	trees, err := PackTrees(b, []int{0, 1, 2, 3, 4, 5, 6}, TreeLimits{MaxTokens: P + 2*S, MaxSegs: 100})
	if err != nil {
		t.Fatal(err)
	}
	var sizes []int
	for _, pt := range trees {
		sizes = append(sizes, len(pt.Tokens))
	}
	if diff := cmp.Diff([]int{P + 2*S, P + 2*S, P + 2*S, P + S}, sizes); diff != "" {
		t.Errorf("computed tokens per micro-batch (-want +got):\n%s", diff)
	}
}
