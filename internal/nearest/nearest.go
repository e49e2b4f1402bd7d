// Package nearest finds the closest of known names to a mistyped one, by
// edit distance (Levenshtein: insertions, deletions and substitutions of
// bytes, each costing 1).
//
// Within computes only what can stay under a limit: the band of cells
// within limit of the diagonal, stopping at a row whose every cell has
// reached it. A search that tightens its limit to the best distance so far
// therefore costs a few short comparisons per candidate, not one full
// len(a)×len(b) table each. Cells counts the cells computed, for tests that
// count work rather than time it.
package nearest

import "sync/atomic"

// Cells counts the edit-distance cells computed by Within (all callers).
var Cells atomic.Int64

// Within is the edit distance of a and b when it is below limit (ok).
func Within(a, b string, limit int) (int, bool) {
	if d := len(a) - len(b); d >= limit || -d >= limit {
		return 0, false
	}
	inf := limit // a cell at the limit cannot lead below it
	prev := make([]int, len(b)+1)
	cur := make([]int, len(b)+1)
	for j := range prev {
		prev[j] = min(j, inf)
	}
	cells := 0
	defer func() { Cells.Add(int64(cells)) }()
	for i := 1; i <= len(a); i++ {
		lo, hi := max(1, i-limit+1), min(len(b), i+limit-1)
		cur[0] = min(i, inf)
		rowMin := inf
		if lo == 1 {
			rowMin = cur[0]
		} else {
			cur[lo-1] = inf
		}
		for j := lo; j <= hi; j++ {
			c := prev[j-1]
			if a[i-1] != b[j-1] {
				c++
			}
			c = min(c, prev[j]+1, cur[j-1]+1, inf)
			cur[j] = c
			rowMin = min(rowMin, c)
		}
		if hi < len(b) {
			cur[hi+1] = inf
		}
		cells += hi - lo + 1
		if rowMin >= limit {
			return 0, false
		}
		prev, cur = cur, prev
	}
	return prev[len(b)], prev[len(b)] < limit
}

// Distance is the edit distance of a and b.
func Distance(a, b string) int {
	d, _ := Within(a, b, max(len(a), len(b))+1)
	return d
}

// Of is the candidate nearest to word (the first among equals) and its
// distance, or "" when none is below limit.
func Of(word string, candidates []string, limit int) (string, int) {
	best, bd := "", limit
	for _, c := range candidates {
		if d, ok := Within(word, c, bd); ok {
			best, bd = c, d
		}
	}
	return best, bd
}
