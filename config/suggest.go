package config

import (
	"fmt"
	"reflect"
	"sort"
	"strings"
	"sync"
	"sync/atomic"

	"github.com/tracegrpo/tracegrpo/internal/nearest"
)

// The nearest known key, for a typo's message. The known keys are every
// key path of the schema, of the key table and of NeMo RL's GRPO schema and
// recipes (gen_nemorl_keys.tsv), held sorted by length: a search looks at
// the keys whose length is within its best distance so far, and a
// distance computation stops once it cannot beat it. A typo (distance 1
// to 3) costs a few hundred short comparisons, not one full edit distance
// per known key (~2.7 ms a key with 1,300 keys), and a load computes at
// most maxSuggestions of them: a recipe of 20,000 unknown keys costs what
// 20 do.

// maxSuggestions is how many unknown keys of one load get a nearest key.
const maxSuggestions = 20

// work counts what mapping lookups cost, for the tests (which count the
// work rather than time it; nearest.Cells counts the suggestions').
var work struct {
	keyProbes atomic.Int64 // mapping keys compared by mapIndex
}

// keyIndex holds the known keys by length.
type keyIndex struct {
	byLen [][]string // byLen[n]: the known keys of n bytes, sorted
}

var (
	knownOnce sync.Once
	known     *keyIndex
)

func knownKeys() *keyIndex {
	knownOnce.Do(func() { known = newKeyIndex(knownPaths()) })
	return known
}

func newKeyIndex(keys []string) *keyIndex {
	ix := &keyIndex{}
	seen := map[string]bool{}
	for _, k := range keys {
		if k == "" || seen[k] || strings.Contains(k, "*") {
			continue
		}
		seen[k] = true
		for len(ix.byLen) <= len(k) {
			ix.byLen = append(ix.byLen, nil)
		}
		ix.byLen[len(k)] = append(ix.byLen[len(k)], k)
	}
	for _, b := range ix.byLen {
		sort.Strings(b)
	}
	return ix
}

// nearest is the known key nearest to p by edit distance (the first in
// sorted order among equals), and the distance; "" when none is known.
// p's own ancestors do not count: checkpointing.x is two edits from
// checkpointing, but "did you mean checkpointing?" names the section the
// user wrote, not a key they meant.
func (ix *keyIndex) nearest(p string) (string, int) {
	best, bd := "", maxTypo(p)
	for d := 0; d <= bd; d++ {
		lo, hi := len(p)-d, len(p)+d
		if lo < 0 && hi >= len(ix.byLen) {
			break
		}
		for _, n := range []int{lo, hi} {
			if n < 0 || n >= len(ix.byLen) {
				continue
			}
			for _, k := range ix.byLen[n] {
				if n < len(p) && p[n] == '.' && p[:n] == k {
					continue // an ancestor of p
				}
				if dist, ok := nearest.Within(p, k, bd+1); ok && (dist < bd || best == "" || k < best) {
					best, bd = k, dist
				}
			}
			if d == 0 {
				break // lo == hi
			}
		}
	}
	return best, bd
}

// maxTypo is the largest edit distance at which a known key counts as
// what p meant: 3, or one in six bytes of a long key.
func maxTypo(p string) int { return max(3, len(p)/6) }

// knownPaths are every key path of the schema, of the key table and of
// NeMo RL's schema and recipes.
func knownPaths() []string {
	var out []string
	var walk func(t reflect.Type, path string)
	walk = func(t reflect.Type, path string) {
		for t.Kind() == reflect.Pointer || (t.Kind() == reflect.Slice && t.Elem().Kind() == reflect.Struct) {
			t = t.Elem()
		}
		if t.Kind() != reflect.Struct {
			return
		}
		for i := 0; i < t.NumField(); i++ {
			name, _, _ := strings.Cut(t.Field(i).Tag.Get("yaml"), ",")
			p := join(path, name)
			out = append(out, p)
			walk(t.Field(i).Type, p)
		}
	}
	walk(reflect.TypeOf(Config{}), "")
	for _, r := range keyRules {
		out = append(out, r.Key)
	}
	out = append(out, nemoRLKeyPaths()...)
	return out
}

// Nearest is the known key nearest to key path p, or "". The known keys
// have no list indices; p's are put back where p has them, so that the
// key can be written as it is (policy.scheduler.0.kwargs.total_iter:
// policy.scheduler.0.kwargs.total_iters, not policy.scheduler.kwargs...).
func Nearest(p string) string {
	k, _ := knownKeys().nearest(normPath(p))
	return withIndices(p, k)
}

// withIndices is key k with the list indices of path p put back at p's
// positions, when k has as many other segments as p; else k.
func withIndices(p, k string) string {
	if k == "" || !strings.Contains(p, ".") {
		return k
	}
	ps, ks := splitPath(p), splitPath(k)
	out := make([]string, 0, len(ps))
	j := 0
	for _, seg := range ps {
		if _, ok := index(seg); ok {
			out = append(out, seg)
			continue
		}
		if j == len(ks) {
			return k
		}
		out = append(out, ks[j])
		j++
	}
	if j != len(ks) || len(out) == len(ks) {
		return k
	}
	return strings.Join(out, ".")
}

// suggest is " (nearest known key: K)" for key path p, or "".
func suggest(p string) string {
	if k := Nearest(p); k != "" {
		return fmt.Sprintf(" (nearest known key: %s)", k)
	}
	return ""
}

// suggester hands out at most maxSuggestions suggestions (one load's).
type suggester struct{ n int }

// suggest is suggest(p) while the budget lasts, then "".
func (s *suggester) suggest(p string) string {
	if k := s.nearest(p); k != "" {
		return fmt.Sprintf(" (nearest known key: %s)", k)
	}
	return ""
}

// nearest is Nearest(p) while the budget lasts, then "".
func (s *suggester) nearest(p string) string {
	if s.n >= maxSuggestions {
		return ""
	}
	s.n++
	return Nearest(p)
}
