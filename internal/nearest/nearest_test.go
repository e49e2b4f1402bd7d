package nearest

import (
	"math/rand/v2"
	"testing"
)

// full is the textbook edit distance, the reference.
func full(a, b string) int {
	d := make([][]int, len(a)+1)
	for i := range d {
		d[i] = make([]int, len(b)+1)
		d[i][0] = i
	}
	for j := range d[0] {
		d[0][j] = j
	}
	for i := 1; i <= len(a); i++ {
		for j := 1; j <= len(b); j++ {
			c := d[i-1][j-1]
			if a[i-1] != b[j-1] {
				c++
			}
			d[i][j] = min(c, d[i-1][j]+1, d[i][j-1]+1)
		}
	}
	return d[len(a)][len(b)]
}

// TestWithinIsTheEditDistance: on random strings over a small alphabet, for
// every limit, Within returns the edit distance exactly when it is below the
// limit and says no otherwise.
func TestWithinIsTheEditDistance(t *testing.T) {
	rng := rand.New(rand.NewPCG(1, 2))
	word := func() string {
		b := make([]byte, rng.IntN(12))
		for i := range b {
			b[i] = "abc._"[rng.IntN(5)]
		}
		return string(b)
	}
	for n := 0; n < 20000; n++ {
		a, b := word(), word()
		want := full(a, b)
		if got := Distance(a, b); got != want {
			t.Fatalf("Distance(%q, %q) = %d, want %d", a, b, got, want)
		}
		limit := rng.IntN(8) + 1
		got, ok := Within(a, b, limit)
		if ok != (want < limit) || ok && got != want {
			t.Fatalf("Within(%q, %q, %d) = %d, %v; the distance is %d", a, b, limit, got, ok, want)
		}
	}
}

// TestOfPicksTheNearestFirst: Of returns the first candidate at the least
// distance, nothing at or beyond the limit, and costs fewer cells under a
// tight limit than the full tables would.
func TestOfPicksTheNearestFirst(t *testing.T) {
	cands := []string{"bench", "config", "export", "plan", "plot", "score", "traces", "verify"}
	for _, c := range []struct {
		word, want string
		limit      int
	}{
		{"tracse", "traces", 3},
		{"plna", "plan", 3},
		{"ploot", "plot", 3},
		{"frobnicate", "", 3},
		{"plat", "plan", 3}, // plan and plot are both 1 away: the first wins
	} {
		if got, _ := Of(c.word, cands, c.limit); got != c.want {
			t.Errorf("Of(%q) = %q, want %q", c.word, got, c.want)
		}
	}
	long := make([]byte, 200)
	for i := range long {
		long[i] = 'a' + byte(i%26)
	}
	c0 := Cells.Load()
	Within(string(long), string(long[1:]), 3)
	if cells := Cells.Load() - c0; cells > 200*5 {
		t.Errorf("a limit of 3 on 200-byte strings computed %d cells (the band is 5 wide)", cells)
	}
}
