package cpu

// The packed gemm (BLIS-style) behind every float32 matrix product.
//
// For each block of kc ≤ gemmKC columns of K, op(A) (M,kc) is packed into
// row panels of gemmMR rows (k-major: panel[k·MR + r]) and op(B) (kc,N) into
// column panels of gemmNR columns (panel[k·NR + c]), both zero-padded to whole
// panels; the micro-kernel then computes each MR×NR block of C with the K loop
// innermost in registers and adds it to C (or stores it, for the first K block
// of an assigning product). The caller's output tiles (≤ tileM × tileN, see
// matmul.go) keep the packed B block in L2 and one packed A panel in L1.
//
// Each C element is the sum over K blocks, in order, of a k-ordered sum inside
// the kernel: the order depends only on K, the rounding only on the rounding
// path of the kernel chosen at start-up (simd.go).

const (
	gemmMR = 12
	gemmNR = 32
	gemmKC = 256
	gemmNC = 512 // columns per packed B block (kc·NC·4 bytes = 512 KiB of L2)
)

// microKernel computes the MR×NR block C += or = Apanel·Bpanel over k steps.
// a: (k, MR) packed; b: (k, NR) packed; c: row-major with leading dimension
// ldc; acc ≠ 0 adds to C, acc = 0 overwrites it.
type microKernel func(k int, a, b, c *float32, ldc int, acc int)

// kernel12x32 is the micro-kernel in use (see simd.go).
var kernel12x32 microKernel = kernel12x32Go

// kernel12x32Go is the portable micro-kernel. It walks the 12×32 block in
// sub-blocks of 4 rows × 2 columns whose eight sums stay in registers over
// the whole k loop (the arithmetic is the same: each element's products in
// k order from zero, then added to or stored in C). The conversion in the
// inner loop rounds each product before the sum, so that no compiler fuses
// them (arm64 and GOAMD64=v3 would): rounding path go is the same
// everywhere.
func kernel12x32Go(k int, a, b, c *float32, ldc int, acc int) {
	as := unsafeSlice(a, k*gemmMR)
	bs := unsafeSlice(b, k*gemmNR)
	cs := unsafeSlice(c, (gemmMR-1)*ldc+gemmNR)
	for r0 := 0; r0 < gemmMR; r0 += 4 {
		for c0 := 0; c0 < gemmNR; c0 += 2 {
			var s00, s01, s10, s11, s20, s21, s30, s31 float32
			for p := 0; p < k; p++ {
				ap := as[p*gemmMR+r0 : p*gemmMR+r0+4 : p*gemmMR+r0+4]
				bp := bs[p*gemmNR+c0 : p*gemmNR+c0+2 : p*gemmNR+c0+2]
				a0, a1, a2, a3, b0, b1 := ap[0], ap[1], ap[2], ap[3], bp[0], bp[1]
				s00 += float32(a0 * b0)
				s01 += float32(a0 * b1)
				s10 += float32(a1 * b0)
				s11 += float32(a1 * b1)
				s20 += float32(a2 * b0)
				s21 += float32(a2 * b1)
				s30 += float32(a3 * b0)
				s31 += float32(a3 * b1)
			}
			c0r := cs[r0*ldc+c0 : r0*ldc+c0+2 : r0*ldc+c0+2]
			c1r := cs[(r0+1)*ldc+c0 : (r0+1)*ldc+c0+2 : (r0+1)*ldc+c0+2]
			c2r := cs[(r0+2)*ldc+c0 : (r0+2)*ldc+c0+2 : (r0+2)*ldc+c0+2]
			c3r := cs[(r0+3)*ldc+c0 : (r0+3)*ldc+c0+2 : (r0+3)*ldc+c0+2]
			if acc != 0 {
				c0r[0], c0r[1] = c0r[0]+s00, c0r[1]+s01
				c1r[0], c1r[1] = c1r[0]+s10, c1r[1]+s11
				c2r[0], c2r[1] = c2r[0]+s20, c2r[1]+s21
				c3r[0], c3r[1] = c3r[0]+s30, c3r[1]+s31
			} else {
				c0r[0], c0r[1] = s00, s01
				c1r[0], c1r[1] = s10, s11
				c2r[0], c2r[1] = s20, s21
				c3r[0], c3r[1] = s30, s31
			}
		}
	}
}

// packA packs rows [0, m) and columns [k0, k0+kc) of op(A) into panels.
func packA(dst []float32, transA bool, A []float32, lda, m, k0, kc int) {
	for i0 := 0; i0 < m; i0 += gemmMR {
		mr := min(gemmMR, m-i0)
		p := dst[(i0/gemmMR)*kc*gemmMR : (i0/gemmMR+1)*kc*gemmMR]
		if transA {
			// A is (K,M): row k holds op(A)[:, k] contiguously.
			for k := 0; k < kc; k++ {
				src := A[(k0+k)*lda+i0 : (k0+k)*lda+i0+mr]
				d := p[k*gemmMR : k*gemmMR+gemmMR]
				copy(d, src)
				clear(d[mr:])
			}
			continue
		}
		if mr == gemmMR {
			// Twelve source rows read in step: contiguous writes.
			r0 := A[i0*lda+k0:][:kc]
			r1 := A[(i0+1)*lda+k0:][:kc]
			r2 := A[(i0+2)*lda+k0:][:kc]
			r3 := A[(i0+3)*lda+k0:][:kc]
			r4 := A[(i0+4)*lda+k0:][:kc]
			r5 := A[(i0+5)*lda+k0:][:kc]
			r6 := A[(i0+6)*lda+k0:][:kc]
			r7 := A[(i0+7)*lda+k0:][:kc]
			r8 := A[(i0+8)*lda+k0:][:kc]
			r9 := A[(i0+9)*lda+k0:][:kc]
			r10 := A[(i0+10)*lda+k0:][:kc]
			r11 := A[(i0+11)*lda+k0:][:kc]
			for k := 0; k < kc; k++ {
				d := p[k*gemmMR : k*gemmMR+gemmMR : k*gemmMR+gemmMR]
				d[0], d[1], d[2], d[3] = r0[k], r1[k], r2[k], r3[k]
				d[4], d[5], d[6], d[7] = r4[k], r5[k], r6[k], r7[k]
				d[8], d[9], d[10], d[11] = r8[k], r9[k], r10[k], r11[k]
			}
			continue
		}
		for r := 0; r < mr; r++ {
			src := A[(i0+r)*lda+k0 : (i0+r)*lda+k0+kc]
			for k, v := range src {
				p[k*gemmMR+r] = v
			}
		}
		for r := mr; r < gemmMR; r++ {
			for k := 0; k < kc; k++ {
				p[k*gemmMR+r] = 0
			}
		}
	}
}

// packB packs rows [k0, k0+kc) and columns [0, n) of op(B) into panels.
func packB(dst []float32, transB bool, B []float32, ldb, n, k0, kc int) {
	for j0 := 0; j0 < n; j0 += gemmNR {
		nr := min(gemmNR, n-j0)
		p := dst[(j0/gemmNR)*kc*gemmNR : (j0/gemmNR+1)*kc*gemmNR]
		if !transB {
			for k := 0; k < kc; k++ {
				d := p[k*gemmNR : k*gemmNR+gemmNR]
				copy(d, B[(k0+k)*ldb+j0:(k0+k)*ldb+j0+nr])
				clear(d[nr:])
			}
			continue
		}
		// B is (N,K): column j of op(B) is row j of B. Eight source rows
		// are read in step so each write is 8 contiguous floats.
		c8 := 0
		for ; c8+8 <= nr; c8 += 8 {
			r0 := B[(j0+c8)*ldb+k0:][:kc]
			r1 := B[(j0+c8+1)*ldb+k0:][:kc]
			r2 := B[(j0+c8+2)*ldb+k0:][:kc]
			r3 := B[(j0+c8+3)*ldb+k0:][:kc]
			r4 := B[(j0+c8+4)*ldb+k0:][:kc]
			r5 := B[(j0+c8+5)*ldb+k0:][:kc]
			r6 := B[(j0+c8+6)*ldb+k0:][:kc]
			r7 := B[(j0+c8+7)*ldb+k0:][:kc]
			for k := 0; k < kc; k++ {
				d := p[k*gemmNR+c8 : k*gemmNR+c8+8 : k*gemmNR+c8+8]
				d[0], d[1], d[2], d[3] = r0[k], r1[k], r2[k], r3[k]
				d[4], d[5], d[6], d[7] = r4[k], r5[k], r6[k], r7[k]
			}
		}
		for c := c8; c < nr; c++ {
			src := B[(j0+c)*ldb+k0 : (j0+c)*ldb+k0+kc]
			for k, v := range src {
				p[k*gemmNR+c] = v
			}
		}
		for c := nr; c < gemmNR; c++ {
			for k := 0; k < kc; k++ {
				p[k*gemmNR+c] = 0
			}
		}
	}
}

func gemmFast(ws *wscratch, transA, transB bool, M, N, K int, A []float32, lda int, B []float32, ldb int, C []float32, ldc int, acc bool) {
	gemmPacked(ws, transA, transB, M, N, K, A, lda, B, ldb, nil, 0, 0, C, ldc, acc)
}

// prepacked holds op(A) and/or op(B) of a whole product packed once
// (packedASize/packedBSize layouts), shared by all tiles; nil means the tile
// packs that operand itself. kb, when set, is the K that pb was packed for,
// which may exceed the product's: a product over a prefix of K reads the
// first rows of each panel (attention's P·V over a query block's keys, with
// the values of the whole sequence packed once).
type prepacked struct {
	pa, pb     []float32
	mpad, npad int
	kb         int
}

// packBWhole packs op(B) (K,N) whole into pb (packedBSize(N, K) floats).
func packBWhole(pb []float32, transB bool, B []float32, ldb, N, K int) {
	for kb := 0; kb*gemmKC < K; kb++ {
		for jp := 0; jp*gemmNR < N; jp++ {
			packBPanel(pb, transB, B, ldb, N, K, kb, jp)
		}
	}
}

// packedASize returns the length of op(A) (M,K) packed whole: for each K
// block starting at k0, its panels occupy Mpad·kc floats from k0·Mpad, panel
// ip at ip·kc·MR within the block.
func packedASize(M, K int) int {
	return ((M + gemmMR - 1) / gemmMR) * gemmMR * K
}

// packAPanel packs panel ip of K block kb of op(A) into its place in pa.
func packAPanel(pa []float32, transA bool, A []float32, lda, M, K, kb, ip int) {
	mpad := ((M + gemmMR - 1) / gemmMR) * gemmMR
	k0 := kb * gemmKC
	kc := min(gemmKC, K-k0)
	i0 := ip * gemmMR
	mr := min(gemmMR, M-i0)
	dst := pa[k0*mpad+ip*kc*gemmMR : k0*mpad+(ip+1)*kc*gemmMR]
	var src []float32
	if transA {
		src = A[i0:]
	} else {
		src = A[i0*lda:]
	}
	packA(dst, transA, src, lda, mr, k0, kc)
}

// packedBSize returns the length of op(B) (K,N) packed whole: for each K
// block starting at k0, its panels occupy Npad·kc floats from k0·Npad, panel
// jp at jp·kc·NR within the block.
func packedBSize(N, K int) int {
	return ((N + gemmNR - 1) / gemmNR) * gemmNR * K
}

// packBPanel packs panel jp of K block kb of op(B) into its place in pb.
func packBPanel(pb []float32, transB bool, B []float32, ldb, N, K, kb, jp int) {
	npad := ((N + gemmNR - 1) / gemmNR) * gemmNR
	k0 := kb * gemmKC
	kc := min(gemmKC, K-k0)
	j0 := jp * gemmNR
	nr := min(gemmNR, N-j0)
	dst := pb[k0*npad+jp*kc*gemmNR : k0*npad+(jp+1)*kc*gemmNR]
	var src []float32
	if transB {
		src = B[j0*ldb:]
	} else {
		src = B[j0:]
	}
	packB(dst, transB, src, ldb, nr, k0, kc)
}

// gemmPacked computes C (M,N) (+)= op(A)·op(B). Operands that pre does
// not hold are packed here, block by block; those it holds belong to a wider
// product whose tile this is, starting at row i0t and column j0t (multiples
// of MR and NR) of it.
func gemmPacked(ws *wscratch, transA, transB bool, M, N, K int, A []float32, lda int, B []float32, ldb int, pre *prepacked, i0t, j0t int, C []float32, ldc int, acc bool) {
	mp := (M + gemmMR - 1) / gemmMR
	kcMax := min(K, gemmKC)
	var pa, pb, paAll, pbAll []float32
	if pre != nil {
		paAll, pbAll = pre.pa, pre.pb
	}
	if paAll == nil {
		pa = ws.get(slotPackA, mp*gemmMR*kcMax)
	}
	if pbAll == nil {
		pb = ws.get(slotPackB, min(N+gemmNR-1, gemmNC)/gemmNR*gemmNR*kcMax)
	}
	tile := ws.get(slotTile, gemmMR*gemmNR)
	kern := kernel12x32
	for k0 := 0; k0 < K; k0 += gemmKC {
		kc := min(gemmKC, K-k0)
		kcb := kc // rows of a packed B panel of this K block
		if pbAll != nil && pre.kb > 0 {
			kcb = min(gemmKC, pre.kb-k0)
		}
		if paAll == nil {
			packA(pa, transA, A, lda, M, k0, kc)
		} else {
			pa = paAll[k0*pre.mpad+(i0t/gemmMR)*kc*gemmMR:]
		}
		add := 0
		if acc || k0 > 0 {
			add = 1
		}
		// Columns in blocks of gemmNC so a packed B block stays in L2.
		for n0 := 0; n0 < N; n0 += gemmNC {
			nc := min(gemmNC, N-n0)
			np := (nc + gemmNR - 1) / gemmNR
			if pbAll == nil {
				var src []float32
				if transB {
					src = B[n0*ldb:]
				} else {
					src = B[n0:]
				}
				packB(pb, transB, src, ldb, nc, k0, kc)
			} else {
				pb = pbAll[k0*pre.npad+((j0t+n0)/gemmNR)*kcb*gemmNR:]
			}
			for ip := 0; ip < mp; ip++ {
				i0 := ip * gemmMR
				mr := min(gemmMR, M-i0)
				ap := &pa[ip*kc*gemmMR]
				for jp := 0; jp < np; jp++ {
					j0 := n0 + jp*gemmNR
					nr := min(gemmNR, N-j0)
					bp := &pb[jp*kcb*gemmNR]
					if mr == gemmMR && nr == gemmNR {
						kern(kc, ap, bp, &C[i0*ldc+j0], ldc, add)
						continue
					}
					kern(kc, ap, bp, &tile[0], gemmNR, 0)
					for r := 0; r < mr; r++ {
						cr := C[(i0+r)*ldc+j0 : (i0+r)*ldc+j0+nr]
						tr := tile[r*gemmNR : r*gemmNR+nr]
						if add != 0 {
							for j := range cr {
								cr[j] += tr[j]
							}
						} else {
							copy(cr, tr)
						}
					}
				}
			}
		}
	}
}
