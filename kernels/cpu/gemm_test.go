package cpu

import (
	"fmt"
	"math/rand/v2"
	"testing"
)

// availableKernels lists the micro-kernels this CPU can run.
func availableKernels() map[string]microKernel {
	m := map[string]microKernel{"go": kernel12x32Go}
	if hasAsm && simd.CPU.AVX2 {
		m["avx2"] = kernel12x32AVX2
	}
	if hasAsm && simd.CPU.AVX512 {
		m["avx512"] = kernel12x32AVX512
	}
	return m
}

// TestGemmFastMatchesReference: the packed gemm with every available
// micro-kernel against gemmRef in float64, over all transposes, edge tiles
// (M, N not multiples of 12/32), several K blocks, strided operands, = and +=.
func TestGemmFastMatchesReference(t *testing.T) {
	saved := kernel12x32
	defer func() { kernel12x32 = saved }()
	shapes := []struct{ M, N, K int }{{1, 1, 1}, {12, 32, 5}, {13, 33, 7}, {25, 70, 300}, {7, 5, 513}, {5, 600, 30}, {14, 1100, 260}}
	for name, kern := range availableKernels() {
		kernel12x32 = kern
		for _, s := range shapes {
			for _, tr := range [][2]bool{{false, false}, {false, true}, {true, false}, {true, true}} {
				for _, acc := range []bool{false, true} {
					t.Run(fmt.Sprintf("%s/M%d_N%d_K%d_tA%v_tB%v_acc%v", name, s.M, s.N, s.K, tr[0], tr[1], acc), func(t *testing.T) {
						r := rand.New(rand.NewPCG(uint64(s.M), uint64(s.K)))
						lda, ldb, ldc := s.K+3, s.N+2, s.N+5
						if tr[0] {
							lda = s.M + 3
						}
						if tr[1] {
							ldb = s.K + 2
						}
						rowsA, rowsB := s.M, s.K
						if tr[0] {
							rowsA = s.K
						}
						if tr[1] {
							rowsB = s.N
						}
						A := round32(randVec(r, rowsA*lda, 1))
						B := round32(randVec(r, rowsB*ldb, 1))
						C := round32(randVec(r, s.M*ldc, 1))
						want := append([]float64(nil), C...)
						gemmRef(tr[0], tr[1], s.M, s.N, s.K, A, lda, B, ldb, want, ldc, acc)
						got := to32(C)
						var ws wscratch
						gemm(&ws, tr[0], tr[1], s.M, s.N, s.K, to32(A), lda, to32(B), ldb, got, ldc, acc)
						// Padding columns of C (beyond N in each row) are untouched.
						checkClose(t, "C", to64(got), want, f32Atol*float64(s.K)/16+1e-6, f32Rtol)
					})
				}
			}
		}
	}
}
