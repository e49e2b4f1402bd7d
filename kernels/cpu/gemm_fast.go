package cpu

// useFastGemm selects the packed SIMD gemm for float32 (set in simd.go).
var useFastGemm = false

func gemmFast(ws *wscratch, transA, transB bool, M, N, K int, A []float32, lda int, B []float32, ldb int, C []float32, ldc int, acc bool) {
	gemmRef(transA, transB, M, N, K, A, lda, B, ldb, C, ldc, acc)
}
