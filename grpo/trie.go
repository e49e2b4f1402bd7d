package grpo

import (
	"fmt"
	"slices"
)

// The step's token trie (shared-prefix training). The traces of a step share
// prefixes: a task group's K generations share the prompt, a rollout's
// traces share the system prompt, the tools and the earlier turns. Merged by
// exact token-id equality from position 0, they form a trie; packed as a
// tree (each segment once, its queries attending to its ancestors' keys),
// every shared prefix is computed once, forward and backward, instead of
// once per trace.
//
// Nothing of the loss changes. Every trace keeps its own row, its tokens,
// masks, behaviour log-probabilities, advantage and ownership; only where
// its log-probabilities come from changes. Trace position i's
// log-probability is log p(token i | tokens 0..i−1): the model's hidden
// state at the packed position of token i−1 (the pair's row) scored against
// token i (its label). Inside a segment that label is the next packed token,
// but the last token of a shared segment is followed by a different token
// in each child: its hidden state is scored once per child label needed, so
// the LM head runs over (row, label) pairs, not over packed positions. Two
// traces that need the same pair (identical prefixes and next token, e.g.
// two equal generations) read the same log-probability, and their
// gradients add.

// PackedTree is one micro-batch of rows packed as a token trie: what
// model.ForwardTree runs. Segment s holds Tokens[Segs[s]:Segs[s+1]];
// segments are in depth-first preorder (children ordered by their first
// token id), Parent[s] is −1 for a root.
type PackedTree struct {
	Rows   []int   // the batch rows it packs, in lexicographic order of their tokens
	Tokens []int32 // (T) the computed tokens
	Segs   []int32 // (NS+1) segment offsets
	Parent []int32 // (NS) parent segment, −1 for a root
	// PairRows[p] is the packed position whose hidden state predicts
	// PairLabels[p]: the LM head's (row, label) pairs (P of them).
	PairRows, PairLabels []int32
	// Pair[j][i] is the pair that gives row Rows[j]'s log-probability at
	// position i, −1 where it is not needed (position 0, tokens without
	// loss).
	Pair [][]int32
	// TraceTokens is the tokens of its rows: what packing each row as its
	// own sequence computes. prefix_reuse is TraceTokens / len(Tokens).
	TraceTokens int
	// Traces[t] is the number of its rows that hold packed position t (a
	// shared prefix's tokens once per row through them): what the
	// selection biases' expert load counts (model.Tree.Traces).
	Traces []int32
}

// TreeLimits bound one micro-batch of a tree packing: the model's
// activations hold MaxTokens computed tokens (and the LM head as many
// pairs) and MaxSegs segments.
type TreeLimits struct {
	MaxTokens, MaxSegs int
}

// needAt reports whether row r's log-probability at position i is read: a
// loss position of a trained row.
func needAt(r *Row, i int) bool { return i > 0 && r.TokenMask[i] != 0 && r.SampleMask > 0 }

// PackTrees packs rows (indices into b.Rows, each at most lim.MaxTokens
// tokens) into micro-batches of token tries.
//
// The rows are ordered lexicographically by their token ids, which is a
// depth-first order of the step's trie: each subtree's rows are
// consecutive, and a row shares with the row just before it the longest
// prefix it shares with any row before it. They are then packed greedily in
// that order: a row joins the current micro-batch while the micro-batch's
// computed tokens (its rows' tokens, each shared prefix once: a row adds its
// length minus its common prefix with the previous row), its segments (a row
// adds at most two) and its LM-head pairs (a row adds at most its loss
// positions) fit lim; otherwise it starts the next micro-batch. A tree
// larger than a micro-batch is so split at branch points, between two
// consecutive subtrees: the prefix above the split is computed once per
// part instead of once per row, and greedy filling in depth-first order
// keeps each part's rows as close in the trie as the budget allows, with
// the fewest parts any split of that order into runs can have. The packing
// depends only on the rows, never on their order in b.
func PackTrees(b *Batch, rows []int, lim TreeLimits) ([]PackedTree, error) {
	order := slices.Clone(rows)
	slices.SortFunc(order, func(x, y int) int {
		if c := slices.Compare(b.Rows[x].TokenIDs, b.Rows[y].TokenIDs); c != 0 {
			return c
		}
		return x - y // equal traces in batch order
	})
	var out []PackedTree
	var cur []int
	toks, segs, pairs := 0, 0, 0
	for k, r := range order {
		row := &b.Rows[r]
		n := len(row.TokenIDs)
		if n > lim.MaxTokens || lim.MaxSegs < 2 {
			return nil, fmt.Errorf("grpo: pack trees: row %d (trace %q) has %d tokens, a micro-batch %d tokens and %d segments", r, row.TraceID, n, lim.MaxTokens, lim.MaxSegs)
		}
		need := 0
		for i := range row.TokenIDs {
			if needAt(row, i) {
				need++
			}
		}
		add := n
		if len(cur) > 0 {
			add -= commonPrefix(b.Rows[order[k-1]].TokenIDs, row.TokenIDs)
		}
		if len(cur) > 0 && (toks+add > lim.MaxTokens || segs+2 > lim.MaxSegs || pairs+need > lim.MaxTokens) {
			out = append(out, BuildTree(b, cur))
			cur, toks, segs, pairs, add = nil, 0, 0, 0, n
		}
		cur = append(cur, r)
		toks, segs, pairs = toks+add, segs+2, pairs+need
	}
	if len(cur) > 0 {
		out = append(out, BuildTree(b, cur))
	}
	return out, nil
}

// commonPrefix is the length of the longest common prefix of a and b.
func commonPrefix(a, b []int32) int {
	n := min(len(a), len(b))
	for i := range n {
		if a[i] != b[i] {
			return i
		}
	}
	return n
}

// trieNode is a segment of the trie being built: tok are its tokens (a
// slice of a row's), kids its children in order of their first token.
type trieNode struct {
	tok    []int32
	parent int
	kids   []int
}

// BuildTree packs rows (indices into b.Rows) as one token trie: every
// common prefix of their token ids once, with segment boundaries only where
// the trie branches (a trace that ends inside a segment, or where another
// continues it, adds none). Rows keep their given order in Rows, Pair and
// the pairs' order; the segments depend only on the tokens.
func BuildTree(b *Batch, rows []int) PackedTree {
	nodes := []trieNode{{parent: -1}} // 0: the root above every trace
	kid := map[[2]int32]int{}         // (node, first token) → child
	// Inserted in decreasing lexicographic order, a trace comes after every
	// trace it is a prefix of, so it never ends a segment that a longer one
	// continues: the trie's segments are the same whatever the rows' order.
	ins := slices.Clone(rows)
	slices.SortFunc(ins, func(x, y int) int { return slices.Compare(b.Rows[y].TokenIDs, b.Rows[x].TokenIDs) })
	for _, r := range ins {
		seq := b.Rows[r].TokenIDs
		at, i := 0, 0
		for i < len(seq) {
			c, ok := kid[[2]int32{int32(at), seq[i]}]
			if !ok {
				c = len(nodes)
				nodes = append(nodes, trieNode{tok: seq[i:], parent: at})
				kid[[2]int32{int32(at), seq[i]}] = c
				nodes[at].kids = insertKid(nodes, nodes[at].kids, c)
				break
			}
			L := commonPrefix(nodes[c].tok, seq[i:])
			if L < len(nodes[c].tok) {
				if i+L == len(seq) {
					break // the row ends inside c: no boundary needed there
				}
				// The row branches inside c: split c into its first L
				// tokens, m, and the rest, a child of m.
				m := len(nodes)
				nodes = append(nodes, trieNode{tok: nodes[c].tok[:L], parent: at, kids: []int{c}})
				nodes[c].tok, nodes[c].parent = nodes[c].tok[L:], m
				kid[[2]int32{int32(at), seq[i]}] = m
				kid[[2]int32{int32(m), nodes[c].tok[0]}] = c
				for j, k := range nodes[at].kids {
					if k == c {
						nodes[at].kids[j] = m
					}
				}
				c = m
			}
			at, i = c, i+L
		}
	}
	// Depth-first preorder: segment numbers and offsets.
	pt := PackedTree{Rows: slices.Clone(rows), Segs: []int32{0}}
	seg := make([]int32, len(nodes))     // node → segment
	off := make([]int32, len(nodes))     // node → its first packed position
	stack := slices.Clone(nodes[0].kids) // reversed below: pop order = child order
	slices.Reverse(stack)
	for len(stack) > 0 {
		n := stack[len(stack)-1]
		stack = stack[:len(stack)-1]
		seg[n], off[n] = int32(len(pt.Parent)), int32(len(pt.Tokens))
		p := int32(-1)
		if nodes[n].parent > 0 {
			p = seg[nodes[n].parent]
		}
		pt.Parent = append(pt.Parent, p)
		pt.Tokens = append(pt.Tokens, nodes[n].tok...)
		pt.Segs = append(pt.Segs, int32(len(pt.Tokens)))
		for j := len(nodes[n].kids) - 1; j >= 0; j-- {
			stack = append(stack, nodes[n].kids[j])
		}
	}
	// Each row's packed positions, and its pairs.
	pt.Traces = make([]int32, len(pt.Tokens))
	pairOf := map[[2]int32]int32{}
	pos := []int32{}
	for _, r := range rows {
		row := &b.Rows[r]
		seq := row.TokenIDs
		pt.TraceTokens += len(seq)
		pos = pos[:0]
		for at, i := 0, 0; i < len(seq); {
			c := kid[[2]int32{int32(at), seq[i]}]
			for k := 0; k < len(nodes[c].tok) && i < len(seq); k++ {
				pos = append(pos, off[c]+int32(k))
				i++
			}
			at = c
		}
		for _, q := range pos {
			pt.Traces[q]++
		}
		pair := make([]int32, len(seq))
		for i := range seq {
			pair[i] = -1
			if !needAt(row, i) {
				continue
			}
			key := [2]int32{pos[i-1], seq[i]}
			p, ok := pairOf[key]
			if !ok {
				p = int32(len(pt.PairRows))
				pairOf[key] = p
				pt.PairRows = append(pt.PairRows, pos[i-1])
				pt.PairLabels = append(pt.PairLabels, seq[i])
			}
			pair[i] = p
		}
		pt.Pair = append(pt.Pair, pair)
	}
	return pt
}

// insertKid inserts child c into kids, ordered by first token.
func insertKid(nodes []trieNode, kids []int, c int) []int {
	j, _ := slices.BinarySearchFunc(kids, nodes[c].tok[0], func(k int, t int32) int { return int(nodes[k].tok[0]) - int(t) })
	return slices.Insert(kids, j, c)
}
