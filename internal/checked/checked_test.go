package checked

import (
	"math"
	"math/big"
	"math/rand/v2"
	"testing"
)

// TestAgainstBigInts: Mul, Add and Product agree with math/big on random
// and edge operands: ok exactly when the true result is in [0, MaxInt64]
// and the operands are non-negative, and then the value is exact.
func TestAgainstBigInts(t *testing.T) {
	edges := []int64{0, 1, 2, 3, math.MaxInt32, math.MaxInt32 + 1, 1 << 31, 1 << 32, 3037000499, 3037000500,
		math.MaxInt64 / 2, math.MaxInt64/2 + 1, math.MaxInt64 - 1, math.MaxInt64, -1, math.MinInt64}
	rng := rand.New(rand.NewPCG(26, 1))
	xs := append([]int64(nil), edges...)
	for range 2000 {
		xs = append(xs, rng.Int64()>>rng.IntN(63), -rng.Int64N(1<<40))
	}
	max := big.NewInt(math.MaxInt64)
	check := func(name string, a, b, got int64, ok bool, want *big.Int) {
		t.Helper()
		wantOK := a >= 0 && b >= 0 && want.Sign() >= 0 && want.Cmp(max) <= 0
		if ok != wantOK || (ok && got != want.Int64()) {
			t.Fatalf("%s(%d, %d) = %d, %v; want %s, %v", name, a, b, got, ok, want, wantOK)
		}
	}
	for i, a := range xs {
		b := xs[(i*7919+13)%len(xs)]
		for _, pair := range [][2]int64{{a, b}, {b, a}, {a, a}} {
			x, y := pair[0], pair[1]
			p, ok := Mul(x, y)
			check("Mul", x, y, p, ok, new(big.Int).Mul(big.NewInt(x), big.NewInt(y)))
			p, ok = Product(x, y)
			check("Product", x, y, p, ok, new(big.Int).Mul(big.NewInt(x), big.NewInt(y)))
			s, ok := Add(x, y)
			check("Add", x, y, s, ok, new(big.Int).Add(big.NewInt(x), big.NewInt(y)))
		}
	}
}

// TestSumStaysOverflowed: a Sum that overflowed once reports it at the
// end, whatever is added after; a negative term (a size that wrapped
// before it got here) counts as an overflow.
func TestSumStaysOverflowed(t *testing.T) {
	for _, tc := range []struct {
		name  string
		terms func(*Sum)
		want  int64
		ok    bool
	}{
		{"small", func(s *Sum) { s.Add(3); s.AddProduct(4, 5) }, 23, true},
		{"none", func(*Sum) {}, 0, true},
		{"product overflows", func(s *Sum) { s.Add(1); s.AddProduct(1<<32, 1<<32); s.Add(1) }, 0, false},
		{"sum overflows", func(s *Sum) { s.Add(math.MaxInt64); s.Add(1); s.Add(0) }, 0, false},
		{"negative term", func(s *Sum) { s.Add(10); s.Add(-16) }, 0, false},
		{"at the limit", func(s *Sum) { s.Add(math.MaxInt64 - 1); s.Add(1) }, math.MaxInt64, true},
	} {
		var s Sum
		tc.terms(&s)
		if v, ok := s.Value(); v != tc.want || ok != tc.ok {
			t.Errorf("%s: Value() = %d, %v; want %d, %v", tc.name, v, ok, tc.want, tc.ok)
		}
	}
}
