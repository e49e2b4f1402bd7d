// Package checked is size arithmetic in int64 that refuses instead of
// wrapping. Memory plans, arena layouts and byte counts are products and
// sums of sizes a user controls (config.json, a recipe, --rows, --seq): a
// product that wraps around turns a run that cannot fit into one that
// "needs 20 MiB". Every such computation goes through Mul and Add (or a
// Sum), and an overflow becomes an error naming what overflowed.
package checked

import (
	"errors"
	"fmt"
	"math"
	"math/bits"
)

// ErrOverflow is wrapped by every error about a size that does not fit.
var ErrOverflow = errors.New("size overflows int64")

// Mul returns a·b; ok is false when either is negative or the product
// exceeds math.MaxInt64.
func Mul(a, b int64) (int64, bool) {
	if a < 0 || b < 0 {
		return 0, false
	}
	hi, lo := bits.Mul64(uint64(a), uint64(b))
	if hi != 0 || lo > math.MaxInt64 {
		return 0, false
	}
	return int64(lo), true
}

// Add returns a+b; ok is false when either is negative or the sum exceeds
// math.MaxInt64.
func Add(a, b int64) (int64, bool) {
	if a < 0 || b < 0 || a > math.MaxInt64-b {
		return 0, false
	}
	return a + b, true
}

// Product returns the product of xs (1 for none); ok as for Mul.
func Product(xs ...int64) (int64, bool) {
	p := int64(1)
	for _, x := range xs {
		var ok bool
		if p, ok = Mul(p, x); !ok {
			return 0, false
		}
	}
	return p, true
}

// Sum accumulates non-negative sizes. Once a term is negative or the total
// overflows, the sum stays overflowed: Value reports it once, at the end,
// instead of every addition being checked by its caller.
type Sum struct {
	n    int64
	over bool
}

// Add adds x (a negative x is an overflow: a size that already wrapped).
func (s *Sum) Add(x int64) {
	if s.over {
		return
	}
	v, ok := Add(s.n, x)
	if !ok {
		s.n, s.over = 0, true
		return
	}
	s.n = v
}

// AddProduct adds the product of xs.
func (s *Sum) AddProduct(xs ...int64) {
	p, ok := Product(xs...)
	if !ok {
		s.over, s.n = true, 0
		return
	}
	s.Add(p)
}

// Value returns the sum, and false when it overflowed.
func (s Sum) Value() (int64, bool) { return s.n, !s.over }

// Overflow is the error for what overflowed: "the memory plan's total",
// say. It wraps ErrOverflow.
func Overflow(what string, args ...any) error {
	return fmt.Errorf("%s: %w", fmt.Sprintf(what, args...), ErrOverflow)
}
