package cpu

// Matmul: a Hugging Face Linear without bias, and its two backward halves.
//
//	forward:  out (T,OC)     =  inp (T,C) · weight (OC,C)ᵀ
//	backward: dinp (T,C)     += dout (T,OC) · weight (OC,C)
//	          dweight (OC,C) += dout (T,OC)ᵀ · inp (T,C)
//
// Each product is split into fixed tiles of the output (tileM × tileN); one
// tile is one grain and sums its full K range in a fixed order, so all three
// are thread-count invariant.

import "github.com/tracegrpo/tracegrpo/kernels"

const (
	tileM = 192
	tileN = 256
)

// gemmTask runs one gemm split into output tiles.
type gemmTask struct {
	ws             []wscratch
	transA, transB bool
	M, N, K        int
	A              []float32 // (M,K) or (K,M) if transA, leading dim lda
	B              []float32 // (K,N) or (N,K) if transB, leading dim ldb
	C              []float32 // (M,N), leading dim ldc
	lda, ldb, ldc  int
	acc            bool
	nN             int
	pre            prepacked // op(A), op(B) packed whole when tiles share them
	np, mp, nkb    int
	packing        bool
}

func (t *gemmTask) run(w, lo, hi int) {
	if t.packing {
		nb := 0
		if t.pre.pb != nil {
			nb = t.nkb * t.np
		}
		for it := lo; it < hi; it++ {
			if it < nb {
				packBPanel(t.pre.pb, t.transB, t.B, t.ldb, t.N, t.K, it/t.np, it%t.np)
			} else {
				ia := it - nb
				packAPanel(t.pre.pa, t.transA, t.A, t.lda, t.M, t.K, ia/t.mp, ia%t.mp)
			}
		}
		return
	}
	for it := lo; it < hi; it++ {
		i0 := (it / t.nN) * tileM
		j0 := (it % t.nN) * tileN
		m := min(tileM, t.M-i0)
		n := min(tileN, t.N-j0)
		var a, b []float32
		if t.transA {
			a = t.A[i0:]
		} else {
			a = t.A[i0*t.lda:]
		}
		if t.transB {
			b = t.B[j0*t.ldb:]
		} else {
			b = t.B[j0:]
		}
		if t.pre.pa != nil || t.pre.pb != nil {
			gemmPacked(&t.ws[w], t.transA, t.transB, m, n, t.K, a, t.lda, b, t.ldb, &t.pre, i0, j0, t.C[i0*t.ldc+j0:], t.ldc, t.acc)
			continue
		}
		gemm(&t.ws[w], t.transA, t.transB, m, n, t.K, a, t.lda, b, t.ldb, t.C[i0*t.ldc+j0:], t.ldc, t.acc)
	}
}

// gemmShared returns the floats of op(A) and op(B) that parallelGemm packs
// once for all tiles of an (M,N,K) product (0: that operand is not
// prepacked): B when several rows of tiles share it, A when several
// columns do. PlanWorkspace sizes the shared slots with it.
func gemmShared(M, N, K int) (pa, pb int) {
	if K <= 0 || M <= 0 || N <= 0 {
		return 0, 0
	}
	if (M+tileM-1)/tileM > 1 {
		pb = packedBSize(N, K)
	}
	if (N+tileN-1)/tileN > 1 {
		pa = packedASize(M, K)
	}
	return pa, pb
}

// parallelGemm runs C (+)= op(A)·op(B) over the pool, tile by tile.
func (b *Backend) parallelGemm(transA, transB bool, M, N, K int, A []float32, lda int, B []float32, ldb int, C []float32, ldc int, acc bool) {
	if M <= 0 || N <= 0 {
		return
	}
	t := &b.tasks.gemm
	nM := (M + tileM - 1) / tileM
	nN := (N + tileN - 1) / tileN
	*t = gemmTask{ws: b.scratch.w, transA: transA, transB: transB, M: M, N: N, K: K,
		A: A, B: B, C: C, lda: lda, ldb: ldb, ldc: ldc, acc: acc, nN: nN}
	if pa, pb := gemmShared(M, N, K); pa > 0 || pb > 0 {
		// Pack op(B) once if several rows of tiles share it, op(A) once if
		// several columns of tiles do.
		t.np = (N + gemmNR - 1) / gemmNR
		t.mp = (M + gemmMR - 1) / gemmMR
		t.nkb = (K + gemmKC - 1) / gemmKC
		items := 0
		if pb > 0 {
			t.pre.npad = t.np * gemmNR
			t.pre.pb = b.scratch.getShared(sharedPackB, pb)
			items += t.nkb * t.np
		}
		if pa > 0 {
			t.pre.mpad = t.mp * gemmMR
			t.pre.pa = b.scratch.getShared(sharedPackA, pa)
			items += t.nkb * t.mp
		}
		t.packing = true
		b.pool.parallel(t, items, 4)
		t.packing = false
	}
	b.pool.parallel(t, nM*nN, 1)
	*t = gemmTask{}
}

// Matmul implements kernels.Ops.
// Shapes: out (T,OC), inp (T,C), weight (OC,C).
func (b *Backend) Matmul(out, inp, weight kernels.Buf, T, C, OC int) {
	same("Matmul inp, weight", inp, weight)
	o := b.out(out, T*OC, "Matmul out")      // (T,OC) F32|BF16
	x := b.in(inp, T*C, "Matmul inp")        // (T,C) F32|BF16
	w := b.in(weight, OC*C, "Matmul weight") // (OC,C) F32|BF16
	b.parallelGemm(false, true, T, OC, C, x, C, w, C, o, OC, false)
	b.done(out, o)
}

// MatmulBackward implements kernels.Ops.
// Shapes: dinp (T,C) or empty, dweight (OC,C) or empty, dout (T,OC), inp (T,C), weight (OC,C).
func (b *Backend) MatmulBackward(dinp, dweight, dout, inp, weight kernels.Buf, T, C, OC int) {
	dx := b.f32opt(dinp, T*C, "MatmulBackward dinp")        // (T,C)
	dw := b.f32opt(dweight, OC*C, "MatmulBackward dweight") // (OC,C)
	if dx == nil && dw == nil {
		return
	}
	d := b.in(dout, T*OC, "MatmulBackward dout") // (T,OC) F32|BF16
	if dx != nil {
		same("MatmulBackward dout, weight", dout, weight)
		w := b.in(weight, OC*C, "MatmulBackward weight") // (OC,C) F32|BF16
		b.parallelGemm(false, false, T, C, OC, d, OC, w, C, dx, C, true)
	}
	if dw != nil {
		same("MatmulBackward dout, inp", dout, inp)
		x := b.in(inp, T*C, "MatmulBackward inp") // (T,C) F32|BF16
		b.parallelGemm(true, false, OC, C, T, d, OC, x, C, dw, C, true)
	}
}

// MatmulBackwardFresh implements kernels.FreshMatmulBackward: dinp cleared,
// then MatmulBackward, so the bits are those of Fill then MatmulBackward.
// A BF16 dinp is that fp32 result rounded once.
func (b *Backend) MatmulBackwardFresh(dinp, dweight, dout, inp, weight kernels.Buf, T, C, OC int) {
	if dinp.DType == kernels.BF16 && dinp.N != 0 {
		dx := b.out(dinp, T*C, "MatmulBackwardFresh dinp") // (T,C), fp32 slot
		clear(dx)
		same("MatmulBackwardFresh dout, weight", dout, weight)
		d := b.in(dout, T*OC, "MatmulBackward dout")     // (T,OC) F32|BF16
		w := b.in(weight, OC*C, "MatmulBackward weight") // (OC,C) F32|BF16
		b.parallelGemm(false, false, T, C, OC, d, OC, w, C, dx, C, true)
		b.done(dinp, dx)
		dinp = kernels.Buf{}
	} else if dx := b.f32opt(dinp, T*C, "MatmulBackwardFresh dinp"); dx != nil {
		clear(dx)
	}
	b.MatmulBackward(dinp, dweight, dout, inp, weight, T, C, OC)
}

var _ kernels.FreshMatmulBackward = (*Backend)(nil)

// MatmulAdd implements kernels.MatmulAdder: the product formed as Matmul
// forms it, then res added and the sum rounded once into out.
// Shapes: out, res (T,OC), inp (T,C), weight (OC,C).
func (b *Backend) MatmulAdd(out, res, inp, weight kernels.Buf, T, C, OC int) {
	same("MatmulAdd inp, weight", inp, weight)
	same("MatmulAdd out, res", out, res)
	x := b.in(inp, T*C, "Matmul inp")        // (T,C) F32|BF16
	w := b.in(weight, OC*C, "Matmul weight") // (OC,C) F32|BF16
	o := b.out(out, T*OC, "MatmulAdd out")   // (T,OC) F32|BF16
	p := o
	if out.Handle == res.Handle && out.Off < res.Off+res.N && res.Off < out.Off+out.N {
		p = b.bf16Slot("MatmulAdd product", T*OC) // out overlaps res: the product apart
	}
	b.parallelGemm(false, true, T, OC, C, x, C, w, C, p, OC, false)
	r := b.in(res, T*OC, "MatmulAdd res") // (T,OC) F32|BF16
	for i := range o {
		o[i] = p[i] + r[i]
	}
	b.done(out, o)
}

var _ kernels.MatmulAdder = (*Backend)(nil)
