//go:build cgo

package cuda

// Matmul and MatmulBackward: cuBLAS (cublasGemmEx), no kernel file. The
// row-major products are issued as column-major GEMMs on the transposes,
// as llm.c does: out (T,OC) = inp (T,C)·Wᵀ is outᵀ = W·inpᵀ.

import (
	"fmt"

	"github.com/tracegrpo/tracegrpo/kernels"
)

// cudaDataType_t and cublasComputeType_t values (library_types.h, cublas_api.h).
const (
	cudaR32F         = 0
	cudaR16BF        = 14
	computeF32       = 68 // CUBLAS_COMPUTE_32F
	computeF32TF32   = 77 // CUBLAS_COMPUTE_32F_FAST_TF32
	maxGemmDimension = 1<<31 - 1
)

// gemm is column-major C (m,n) = alpha·op(A)·op(B) + beta·C, A holding nA and
// B nB contiguous elements of type dt (F32 or BF16; both the same), C of
// type ct (F32 or BF16). F32 operands run in b.opt.Matmul's arithmetic;
// BF16 operands (mixed precision) multiply on bf16 tensor cores with fp32
// accumulation. The caller holds b.mu.
func (b *Backend) gemm(ta, tb bool, m, n, k int, alpha float32, dt kernels.DType, A uintptr, lda, nA int,
	B uintptr, ldb, nB int, beta float32, ct kernels.DType, Cp uintptr, ldc int) {
	b.gemmD(ta, tb, m, n, k, alpha, dt, A, lda, nA, B, ldb, nB, beta, ct, Cp, ldc, Cp, ldc)
}

// gemmD is gemm with the result in D (m,n) of type ct, leading dimension
// ldd: D = alpha·op(A)·op(B) + beta·C. D ≠ C is the residual epilogue
// (C and D contiguous: ldc = ldd = m); C is then only read. On cuBLASLt
// it is one call; on cublasGemmEx, C copied into D, then the GEMM into D.
func (b *Backend) gemmD(ta, tb bool, m, n, k int, alpha float32, dt kernels.DType, A uintptr, lda, nA int,
	B uintptr, ldb, nB int, beta float32, ct kernels.DType, Cp uintptr, ldc int, D uintptr, ldd int) {
	if m == 0 || n == 0 {
		return
	}
	if m > maxGemmDimension || n > maxGemmDimension || k > maxGemmDimension {
		panic(fmt.Sprintf("cuda: gemm %d×%d×%d exceeds int32", m, n, k))
	}
	residual := D != Cp
	if residual && (ldc != m || ldd != m) {
		panic(fmt.Sprintf("cuda: gemm residual with ldc %d, ldd %d, m %d (want contiguous)", ldc, ldd, m))
	}
	cType := cudaR32F
	if ct == kernels.BF16 {
		cType = cudaR16BF
	}
	if k == 0 || (residual && b.d.lt == nil) {
		// D = beta·C: nothing (C is D), zeros, or C copied into D.
		switch {
		case residual && beta != 0:
			if beta != 1 {
				panic("cuda: gemm residual with beta other than 0 or 1")
			}
			b.copyDtoD(D, Cp, m*n*ct.Size())
		case beta == 0:
			b.led.record(Launch{Kernel: "memset", Kind: KindCopy, Write: int64(m) * int64(n) * int64(ct.Size()), Inflight: 16})
			for j := 0; j < n; j++ {
				if ct == kernels.BF16 {
					b.fail("cuMemsetD8Async", b.d.memset8(D+uintptr(2*j*ldd), 0, 2*m))
				} else {
					b.fail("cuMemsetD32Async", b.d.memset32(D+uintptr(4*j*ldd), 0, m))
				}
			}
		}
		if k == 0 {
			return
		}
		Cp, ldc, residual = D, ldd, false
	}
	at, bt, compute := cudaR32F, cudaR32F, computeF32
	switch {
	case dt == kernels.BF16:
		at, bt = cudaR16BF, cudaR16BF
	case b.opt.Matmul == MatmulTF32:
		compute = computeF32TF32
	case b.opt.Matmul == MatmulBF16:
		A = b.toBF16("gemm A (bf16)", A, nA)
		B = b.toBF16("gemm B (bf16)", B, nB)
		if A == 0 || B == 0 {
			return
		}
		at, bt = cudaR16BF, cudaR16BF
	}
	abType := kernels.F32
	if at == cudaR16BF {
		abType = kernels.BF16
	}
	call := GemmCall{TransA: ta, TransB: tb, M: m, N: n, K: k, AB: abType, C: ct, Beta: beta}
	if residual {
		call.Epilogue = epilogueResidual
	}
	what := func(api string) string { return fmt.Sprintf("%s %dx%dx%d", api, m, n, k) }
	if b.d.lt != nil {
		key := ltKey{ta: ta, tb: tb, m: m, n: n, k: k, lda: lda, ldb: ldb, ldc: ldc, ldd: ldd, ab: at, cd: cType, compute: compute,
			alA: alignOf(A), alB: alignOf(B), alC: alignOf(Cp), alD: alignOf(D), residual: residual}
		plan, code := b.d.ltPlanFor(key)
		if code != 0 {
			b.failBlas(what("cublasLtMatmulAlgoGetHeuristic"), code)
			return
		}
		if plan.found {
			call.Lt = true
			b.recordGemm(call)
			b.failBlas(what("cublasLtMatmul"), b.d.ltMatmul(plan, alpha, A, B, beta, Cp, D))
			return
		}
		// No algorithm for this GEMM: cublasGemmEx, as without cuBLASLt.
		if residual {
			b.copyDtoD(D, Cp, m*n*ct.Size())
			Cp, ldc, call.Epilogue = D, ldd, ""
		}
	}
	b.recordGemm(call)
	b.failBlas(what("cublasGemmEx"),
		b.d.gemm(ta, tb, m, n, k, alpha, A, at, lda, B, bt, ldb, beta, Cp, cType, ldc, compute))
}

// epilogueResidual is GemmCall.Epilogue of a GEMM that adds a residual C
// into a separate D (beta = 1).
const epilogueResidual = "residual"

// recordGemm puts a GEMM in the ledger: 2·m·n·k operations; A and B read
// once, C written (and read too when beta is not 0).
func (b *Backend) recordGemm(g GemmCall) {
	if !b.led.on {
		return
	}
	m, n, k := int64(g.M), int64(g.N), int64(g.K)
	ab, c := int64(g.AB.Size()), int64(g.C.Size())
	read := (m*k + k*n) * ab
	if g.Beta != 0 {
		read += m * n * c
	}
	b.led.record(Launch{Kernel: "gemm", Kind: KindGEMM, Read: read, Write: m * n * c, FLOPs: 2 * m * n * k, Inflight: 16, GEMM: &g})
}

// toBF16 casts n floats at src into the named scratch buffer.
func (b *Backend) toBF16(name string, src uintptr, n int) uintptr {
	dst := b.work(name, 2*n)
	if dst != 0 {
		b.elementwise("f32_to_bf16", cost{read: 4 * int64(n), write: 2 * int64(n), inflight: 32}, n, pu(dst), pu(src), la(n))
	}
	return dst
}

// operands checks that bufs share one dtype, F32 or BF16, and returns it.
func operands(op string, bufs ...kernels.Buf) kernels.DType {
	dt := bufs[0].DType
	if dt != kernels.F32 && dt != kernels.BF16 {
		panic(fmt.Sprintf("cuda: %s of %s operands", op, dt))
	}
	for _, x := range bufs[1:] {
		if x.DType != dt {
			panic(fmt.Sprintf("cuda: %s: operands of %s and %s (they must share one dtype)", op, dt, x.DType))
		}
	}
	return dt
}

// Matmul implements kernels.Ops: out (T,OC) = inp (T,C) · weight (OC,C)ᵀ;
// inp and weight F32|BF16, out F32|BF16.
func (b *Backend) Matmul(out, inp, weight kernels.Buf, T, C, OC int) {
	dt := operands("Matmul", inp, weight)
	want(out, out.DType, T*OC, "Matmul out")
	operands("Matmul out", out)
	want(inp, dt, T*C, "Matmul inp")
	want(weight, dt, OC*C, "Matmul weight")
	defer b.lock()()
	b.gemm(true, false, OC, T, C, 1, dt, ptr(weight), C, OC*C, ptr(inp), C, T*C, 0, out.DType, ptr(out), OC)
}

// MatmulAdd implements kernels.MatmulAdder: out (T,OC) = res (T,OC) +
// inp (T,C) · weight (OC,C)ᵀ, one GEMM with beta = 1 whose C is res and
// whose D is out (cuBLASLt; on cublasGemmEx res is copied into out
// first). inp and weight F32|BF16; out and res F32|BF16, one dtype.
func (b *Backend) MatmulAdd(out, res, inp, weight kernels.Buf, T, C, OC int) {
	dt := operands("MatmulAdd", inp, weight)
	operands("MatmulAdd out, res", out, res)
	want(out, out.DType, T*OC, "MatmulAdd out")
	want(res, out.DType, T*OC, "MatmulAdd res")
	want(inp, dt, T*C, "MatmulAdd inp")
	want(weight, dt, OC*C, "MatmulAdd weight")
	defer b.lock()()
	b.gemmD(true, false, OC, T, C, 1, dt, ptr(weight), C, OC*C, ptr(inp), C, T*C, 1, out.DType, ptr(res), OC, ptr(out), OC)
}

var _ kernels.MatmulAdder = (*Backend)(nil)

// MatmulBackward implements kernels.Ops: dinp (T,C) += dout·weight;
// dweight (OC,C) += doutᵀ·inp; a zero-length dinp or dweight is skipped.
// dout, inp, weight F32|BF16; dinp, dweight F32.
func (b *Backend) MatmulBackward(dinp, dweight, dout, inp, weight kernels.Buf, T, C, OC int) {
	b.matmulBackward(dinp, dweight, dout, inp, weight, T, C, OC, 1)
}

// MatmulBackwardFresh implements kernels.FreshMatmulBackward: dinp (T,C) =
// dout·weight (a beta = 0 GEMM, F32|BF16: a BF16 dinp is the fp32 result
// rounded once, by the GEMM), dweight (OC,C) += doutᵀ·inp.
func (b *Backend) MatmulBackwardFresh(dinp, dweight, dout, inp, weight kernels.Buf, T, C, OC int) {
	b.matmulBackward(dinp, dweight, dout, inp, weight, T, C, OC, 0)
}

var _ kernels.FreshMatmulBackward = (*Backend)(nil)

// matmulBackward is MatmulBackward with dinp's beta: 1 accumulates, 0
// assigns.
func (b *Backend) matmulBackward(dinp, dweight, dout, inp, weight kernels.Buf, T, C, OC int, beta float32) {
	dt := operands("MatmulBackward dout", dout)
	want(dout, dt, T*OC, "MatmulBackward dout")
	defer b.lock()()
	if dinp.N != 0 {
		want(weight, dt, OC*C, "MatmulBackward weight")
		if beta == 0 && dinp.DType == kernels.BF16 {
			want(dinp, kernels.BF16, T*C, "MatmulBackwardFresh dinp")
		} else {
			want(dinp, kernels.F32, T*C, "MatmulBackward dinp")
		}
		b.gemm(false, false, C, T, OC, 1, dt, ptr(weight), C, OC*C, ptr(dout), OC, T*OC, beta, dinp.DType, ptr(dinp), C)
	}
	if dweight.N != 0 {
		want(inp, dt, T*C, "MatmulBackward inp")
		want(dweight, kernels.F32, OC*C, "MatmulBackward dweight")
		b.gemm(false, true, C, OC, T, 1, dt, ptr(inp), C, T*C, ptr(dout), OC, T*OC, 1, kernels.F32, ptr(dweight), C)
	}
}
