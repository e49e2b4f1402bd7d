package cpu

// gemm: the matrix product every matmul-shaped op is built on.
//
//	C (M,N) = or += op(A) (M,K) · op(B) (K,N)
//
// A is stored row-major with leading dimension lda: (M,K) normally, (K,M) when
// transA. B likewise: (K,N) normally, (N,K) when transB. C is (M,N) with
// leading dimension ldc. acc selects += over =.
//
// gemm runs on the calling goroutine; ops parallelise over tiles of C. For
// float32 with worker scratch it uses the packed path of gemm_fast.go (SIMD
// micro-kernel where the CPU has one, else the Go one); the float64
// instantiation the tests use is gemmRef. Both sum each element's K products in a fixed order that
// depends only on K, so results never depend on the thread count.

// gemmRef is the straightforward reference: each element is one left-to-right
// dot product over K, then stored or added to C.
func gemmRef[F Float](transA, transB bool, M, N, K int, A []F, lda int, B []F, ldb int, C []F, ldc int, acc bool) {
	for i := 0; i < M; i++ {
		c := C[i*ldc : i*ldc+N]
		for j := range c {
			var s F
			for k := 0; k < K; k++ {
				var a, b F
				if transA {
					a = A[k*lda+i]
				} else {
					a = A[i*lda+k]
				}
				if transB {
					b = B[j*ldb+k]
				} else {
					b = B[k*ldb+j]
				}
				s += a * b
			}
			if acc {
				c[j] += s
			} else {
				c[j] = s
			}
		}
	}
}

// gemm dispatches to the fast float32 path when there is one.
func gemm[F Float](ws *wscratch, transA, transB bool, M, N, K int, A []F, lda int, B []F, ldb int, C []F, ldc int, acc bool) {
	if M <= 0 || N <= 0 {
		return
	}
	if K <= 0 {
		if !acc {
			for i := 0; i < M; i++ {
				clear(C[i*ldc : i*ldc+N])
			}
		}
		return
	}
	if isF32[F]() && ws != nil {
		gemmFast(ws, transA, transB, M, N, K, asF32(A), lda, asF32(B), ldb, asF32(C), ldc, acc)
		return
	}
	gemmRef(transA, transB, M, N, K, A, lda, B, ldb, C, ldc, acc)
}
