//go:build cgo

package cuda

// Nemotron-H's ops (kernels.Mamba): csrc/mamba.cu. Every call over a tree
// first runs tree_check (the rules of kernels.Tree, a data error when one
// breaks), and the conv's backward mamba_tree_anc (each segment's context
// start) into scratch. The scan's forward on a bf16 xbc is the chunked SSD
// on tensor cores (ssd_fwd.go, csrc/ssd_fwd.cu), else the sequential
// recurrence, one block per head (see csrc/mamba.cu); its backward is the
// chunked SSD algorithm of csrc/ssd_bwd.cu over the chunks of mambaQ tokens
// that start at the checkpoints the sequential forward it reruns leaves in
// scratch (ssd_scan_fwd_bf16 writes the same checkpoints, to the same
// layout). mamba.cu's sequential ssm_scan_bwd, which it replaced, is its
// reference in ssd_bwd_test.go.

import (
	"fmt"

	"github.com/tracegrpo/tracegrpo/kernels"
)

// The limits of csrc/mamba.cu.
const (
	mambaThreads = 256 // MB_THREADS
	mambaMaxKW   = 8   // MB_MAXKW
	mambaEPT     = 32  // MB_EPT: MP·DS ≤ mambaThreads·mambaEPT
	mambaMaxMP   = 256 // MB_MAXMP
)

func checkMambaTree(op string, tree kernels.Tree, T int) {
	want(tree.Offs, kernels.I32, tree.NS+1, op+" tree.Offs")
	want(tree.Parent, kernels.I32, tree.NS, op+" tree.Parent")
	want(tree.Ends, kernels.I32, tree.NS, op+" tree.Ends")
	if tree.NS < 1 && T > 0 {
		panic(fmt.Sprintf("cuda: %s: %d tokens in a tree of no segments", op, T))
	}
}

func checkConv(op string, T, CD, KW int) {
	if T < 0 || CD <= 0 || KW < 1 || KW > mambaMaxKW {
		panic(fmt.Sprintf("cuda: %s: T=%d CD=%d KW=%d (want 1 ≤ KW ≤ %d)", op, T, CD, KW, mambaMaxKW))
	}
}

// optBias is bias's pointer and view (none when empty).
func optBias(op string, bias kernels.Buf, n int) (uint64, []kernels.Buf) {
	if bias.N == 0 {
		return 0, nil
	}
	want(bias, kernels.F32, n, op)
	return pa(bias), []kernels.Buf{bias}
}

func treeBufs(tree kernels.Tree) []kernels.Buf {
	return []kernels.Buf{tree.Offs, tree.Parent, tree.Ends}
}

// Conv1D implements kernels.Mamba.
func (b *Backend) Conv1D(out, inp, weight, bias kernels.Buf, tree kernels.Tree, T, CD, KW int) {
	checkConv("Conv1D", T, CD, KW)
	checkMambaTree("Conv1D", tree, T)
	operands("Conv1D out", out)
	want(out, out.DType, T*CD, "Conv1D out")
	want(inp, kernels.F32, T*CD, "Conv1D inp")
	want(weight, kernels.F32, CD*KW, "Conv1D weight")
	bp, bv := optBias("Conv1D bias", bias, CD)
	if T == 0 {
		return
	}
	name := "conv1d_fwd"
	if out.DType == kernels.BF16 {
		name = "conv1d_fwd_bf16out"
	}
	defer b.lock()()
	b.treeCheck(tree, T)
	c := rw(append(reads(inp, weight, tree.Offs, tree.Parent), bv...), out).with(int64(T)*int64(CD)*int64(2*KW+4), 0)
	b.elementwise(name, c, T*CD, pa(out), pa(inp), pa(weight), bp, pa(tree.Offs), pa(tree.Parent), ia(tree.NS), ia(T), ia(CD), ia(KW))
}

// Conv1DBackward implements kernels.Mamba.
func (b *Backend) Conv1DBackward(dinp, dweight, dbias, dout, inp, weight, bias kernels.Buf, tree kernels.Tree, T, CD, KW int) {
	checkConv("Conv1DBackward", T, CD, KW)
	checkMambaTree("Conv1DBackward", tree, T)
	want(dinp, kernels.F32, T*CD, "Conv1DBackward dinp")
	want(dweight, kernels.F32, CD*KW, "Conv1DBackward dweight")
	want(dout, kernels.F32, T*CD, "Conv1DBackward dout")
	want(inp, kernels.F32, T*CD, "Conv1DBackward inp")
	want(weight, kernels.F32, CD*KW, "Conv1DBackward weight")
	bp, bv := optBias("Conv1DBackward bias", bias, CD)
	var dbv []kernels.Buf
	if bp != 0 {
		want(dbias, kernels.F32, CD, "Conv1DBackward dbias")
		dbv = []kernels.Buf{dbias}
	}
	if T == 0 {
		return
	}
	defer b.lock()()
	b.treeCheck(tree, T)
	nch := convChunks(T)
	w := b.work(workMamba, convWork(T, CD, KW, tree.NS))
	if w == 0 {
		return
	}
	anc := w
	pw := w + uintptr(4*tree.NS)
	pbias := pw + uintptr(4*nch*CD*KW)
	b.launch("mamba_tree_anc", rw(reads(tree.Offs, tree.Parent)).plus(0, 4*int64(tree.NS)), 1, 1, 1, 32, 0,
		pu(anc), pa(tree.Offs), pa(tree.Parent), ia(tree.NS))
	g := int64(T) * int64(CD) * int64(2*KW+8) // a token's pre-activation and silu'
	in := append(reads(dout, inp, weight), bv...)
	b.elementwise("conv1d_bwd_dinp", rw(append(in, treeBufs(tree)...), dinp).plus(4*int64(tree.NS), 0).with(int64(KW)*g, 0), T*CD,
		pa(dinp), pa(dout), pa(inp), pa(weight), bp, pa(tree.Offs), pa(tree.Parent), pa(tree.Ends), pu(anc), ia(tree.NS), ia(T), ia(CD), ia(KW))
	tiles := ceilDiv(CD, mambaThreads)
	var pbArg uint64
	partB := int64(0)
	if bp != 0 {
		pbArg, partB = pu(pbias), 4*int64(nch)*int64(CD)
	}
	partW := 4 * int64(nch) * int64(CD) * int64(KW)
	b.launch("conv1d_bwd_dw", rw(append(in, tree.Offs, tree.Parent)).plus(0, partW+partB).with(g+2*int64(T)*int64(CD)*int64(KW), 0),
		tiles*nch, 1, 1, mambaThreads, 0,
		pu(pw), pbArg, pa(dout), pa(inp), pa(weight), bp, pa(tree.Offs), pa(tree.Parent), ia(tree.NS), ia(T), ia(CD), ia(KW))
	b.elementwise("bias_backward_reduce", rw(reads(dweight), dweight).plus(partW, 0).with(partW/4, 0), CD*KW,
		pa(dweight), pu(pw), ia(nch), ia(CD*KW))
	if bp != 0 {
		b.elementwise("bias_backward_reduce", rw(dbv, dbv...).plus(partB, 0).with(partB/4, 0), CD,
			pa(dbias), pu(pbias), ia(nch), ia(CD))
	}
}

// Conv1DDecode implements kernels.Mamba.
func (b *Backend) Conv1DDecode(out, window, inp, weight, bias kernels.Buf, B, CD, KW int) {
	checkConv("Conv1DDecode", B, CD, KW)
	operands("Conv1DDecode out", out)
	want(out, out.DType, B*CD, "Conv1DDecode out")
	want(window, kernels.F32, B*(KW-1)*CD, "Conv1DDecode window")
	want(inp, kernels.F32, B*CD, "Conv1DDecode inp")
	want(weight, kernels.F32, CD*KW, "Conv1DDecode weight")
	bp, bv := optBias("Conv1DDecode bias", bias, CD)
	name := "conv1d_decode"
	if out.DType == kernels.BF16 {
		name = "conv1d_decode_bf16out"
	}
	defer b.lock()()
	c := rw(append(reads(window, inp, weight), bv...), out, window).with(int64(B)*int64(CD)*int64(2*KW+4), 0)
	b.elementwise(name, c, B*CD, pa(out), pa(window), pa(inp), pa(weight), bp, ia(B), ia(CD), ia(KW))
}

// checkScan panics on a misuse of a scan's shape.
func checkScan(op string, T int, s kernels.Scan) {
	if T < 0 || s.MH <= 0 || s.MP <= 0 || s.G <= 0 || s.DS <= 0 || s.Chunk <= 0 || s.MH%s.G != 0 ||
		!(s.DtMin >= 0) || !(s.DtMax >= s.DtMin) {
		panic(fmt.Sprintf("cuda: %s: T=%d %+v (want positive sizes, G dividing MH, 0 ≤ DtMin ≤ DtMax)", op, T, s))
	}
	if s.MP > mambaMaxMP || s.MP*s.DS > mambaThreads*mambaEPT {
		panic(fmt.Sprintf("cuda: %s: MP=%d DS=%d: the scan kernels hold at most %d state elements a head (MP ≤ %d)",
			op, s.MP, s.DS, mambaThreads*mambaEPT, mambaMaxMP))
	}
}

// scanSmem is the forward scan's shared memory: the state, x, B and C.
func scanSmem(s kernels.Scan) int { return 4 * (s.MP*s.DS + s.MP + 2*s.DS) }

// ssdMaxSmem is the most dynamic shared memory a block may opt in to on
// sm_80 (163 KiB), the oldest architecture the PTX is for.
const ssdMaxSmem = 163 << 10

// scanDt is the clamp's bounds as kernel arguments.
func scanDt(s kernels.Scan) (uint64, uint64) { return fa(s.DtMin), fa(s.DtMax) }

// scanFLOPs: a token's state update (3 a state element) and its output (2).
func scanFLOPs(T int, s kernels.Scan) int64 {
	return int64(T) * int64(s.MH) * int64(s.MP) * int64(s.DS) * 5
}

// SSMScan implements kernels.Mamba.
func (b *Backend) SSMScan(y, final, xbc, dtRaw, dtBias, aLog, d kernels.Buf, tree kernels.Tree, T int, s kernels.Scan) {
	checkScan("SSMScan", T, s)
	checkMambaTree("SSMScan", tree, T)
	dt := operands("SSMScan xbc", xbc)
	want(y, kernels.F32, T*s.DI(), "SSMScan y")
	want(xbc, dt, T*s.CD(), "SSMScan xbc")
	want(dtRaw, kernels.F32, T*s.MH, "SSMScan dtRaw")
	want(dtBias, kernels.F32, s.MH, "SSMScan dtBias")
	want(aLog, kernels.F32, s.MH, "SSMScan aLog")
	want(d, kernels.F32, s.MH, "SSMScan d")
	var fv []kernels.Buf
	if final.N > 0 {
		want(final, kernels.F32, tree.NS*s.DI()*s.DS, "SSMScan final")
		fv = []kernels.Buf{final}
	}
	if T == 0 {
		return
	}
	defer b.lock()()
	b.treeCheck(tree, T)
	fin := uintptr(0)
	finBytes := int64(0)
	if final.N > 0 {
		fin = ptr(final)
	} else {
		fin = b.work(workMamba, scanWork(T, tree.NS, s, false))
		if fin == 0 {
			return
		}
		finBytes = int64(tree.NS) * stateBytes(s)
	}
	lo, hi := scanDt(s)
	name := "ssm_scan_fwd"
	if dt == kernels.BF16 {
		name = "ssm_scan_fwd_bf16"
	}
	c := rw(reads(xbc, dtRaw, dtBias, aLog, d, tree.Offs, tree.Parent), append([]kernels.Buf{y}, fv...)...).
		plus(int64(tree.NS)*stateBytes(s), finBytes).with(scanFLOPs(T, s), 0)
	if ssdForward(dt, s) { // the chunked SSD on tensor cores (ssd_fwd.go)
		b.launch("ssd_scan_fwd_bf16", c.with(ssdFLOPs(T, s), 0), ceilDiv(s.MP, ssdPT), s.MH, 1, ssdThreads, ssdSmem,
			pa(y), pu(fin), 0, pa(xbc), pa(dtRaw), pa(dtBias), pa(aLog), pa(d), pa(tree.Offs), pa(tree.Parent),
			ia(tree.NS), ia(T), ia(s.MH), ia(s.MP), ia(s.G), ia(s.DS), lo, hi)
		return
	}
	b.launch(name, c, s.MH, 1, 1, mambaThreads, scanSmem(s),
		pa(y), pu(fin), 0, pa(xbc), pa(dtRaw), pa(dtBias), pa(aLog), pa(d), pa(tree.Offs), pa(tree.Parent),
		ia(tree.NS), ia(T), ia(s.MH), ia(s.MP), ia(s.G), ia(s.DS), lo, hi)
}

// SSMScanBackward implements kernels.Mamba: the chunked SSD backward of
// csrc/ssd_bwd.cu from the states the forward it reruns leaves (each
// segment's final state, a checkpoint every mambaQ tokens of a segment):
// the chunk table, each chunk's own start-state gradient (ssd_bwd_local),
// the reverse inter-chunk recurrence (ssd_bwd_states), each chunk's
// gradients (ssd_bwd_chunk, a block per chunk and group summing dB, dC
// over the group's heads in head order into dxbc), and the per-head sums
// (ssd_bwd_params). bf16 xbc runs the products on tensor cores.
func (b *Backend) SSMScanBackward(dxbc, ddtRaw, ddtBias, daLog, dd, dy, xbc, dtRaw, dtBias, aLog, d kernels.Buf, tree kernels.Tree, T int, s kernels.Scan) {
	dt := checkScanBackward("SSMScanBackward", dxbc, ddtRaw, ddtBias, daLog, dd, dy, xbc, dtRaw, dtBias, aLog, d, tree, T, s)
	if T == 0 {
		return
	}
	defer b.lock()()
	b.treeCheck(tree, T)
	w := b.work(workMamba, scanWork(T, tree.NS, s, true))
	if w == 0 {
		return
	}
	l := ssdLayout(T, tree.NS, s)
	fin, ckpt, dS, dsin := w, w+l.ckpt, w+l.dS, w+l.dsin
	dec, part, ct0, cseg := w+l.dec, w+l.part, w+l.ct0, w+l.cseg
	st, NS, nck := stateBytes(s), int64(tree.NS), int64(l.nck)
	lo, hi := scanDt(s)
	fwd, local, chunk := "ssm_scan_fwd", "ssd_bwd_local", "ssd_bwd_chunk"
	xe := int64(4)
	if dt == kernels.BF16 {
		fwd, local, chunk, xe = "ssm_scan_fwd_bf16", "ssd_bwd_local_bf16", "ssd_bwd_chunk_bf16", 2
	}
	in := reads(xbc, dtRaw, dtBias, aLog, d, tree.Offs, tree.Parent)
	ckBytes := nck * st // at most
	b.launch(fwd, rw(in).plus(NS*st, NS*st+ckBytes).with(3*int64(T)*st/4, 0), s.MH, 1, 1, mambaThreads, scanSmem(s),
		0, pu(fin), pu(ckpt), pa(xbc), pa(dtRaw), pa(dtBias), pa(aLog), pa(d), pa(tree.Offs), pa(tree.Parent),
		ia(tree.NS), ia(T), ia(s.MH), ia(s.MP), ia(s.G), ia(s.DS), lo, hi)
	b.launch("ssd_bwd_chunks", rw(reads(tree.Offs)).plus(0, 8*nck), 1, 1, 1, 32, 0,
		pu(ct0), pu(cseg), pa(tree.Offs), ia(tree.NS), ia(l.nck))
	c := ssdCosts(T, tree.NS, s, xe)
	mh := int64(s.MH)
	b.launch(local, rw(reads(dy, dtRaw, dtBias, aLog, tree.Offs)).plus(c.localRead+8*nck, ckBytes+4*nck*mh).with(c.localFLOPs, 0),
		l.nck*s.MH, 1, 1, mambaThreads, ssdLocalSmem(s),
		pu(dS), pu(dec), pa(dy), pa(xbc), pa(dtRaw), pa(dtBias), pa(aLog), pu(ct0), pu(cseg), pa(tree.Offs),
		ia(s.MH), ia(s.MP), ia(s.G), ia(s.DS), lo, hi)
	PN := s.MP * s.DS
	b.launch("ssd_bwd_states", rw(reads(tree.Offs, tree.Parent, tree.Ends)).plus(ckBytes+NS*st+4*nck*mh, ckBytes+NS*st).with(2*(int64(T)*st/4)/mambaQ, 0),
		s.MH*ceilDiv(PN, mambaThreads), 1, 1, mambaThreads, 0,
		pu(dS), pu(dsin), pu(dec), pa(tree.Offs), pa(tree.Parent), pa(tree.Ends), ia(tree.NS), ia(s.MH), ia(PN))
	b.launch(chunk, rw(reads(dy, dtRaw, dtBias, aLog, d, tree.Offs), dxbc, ddtRaw).plus(c.chunkRead+2*ckBytes+8*nck, 12*nck*mh).with(c.chunkFLOPs, 0),
		l.nck*s.G, 1, 1, mambaThreads, ssdChunkSmem(s),
		pa(dxbc), pa(ddtRaw), pu(part), pu(ckpt), pu(dS), pa(dy), pa(xbc), pa(dtRaw), pa(dtBias), pa(aLog), pa(d),
		pu(ct0), pu(cseg), pa(tree.Offs), ia(s.MH), ia(s.MP), ia(s.G), ia(s.DS), lo, hi)
	b.launch("ssd_bwd_params", rw(reads(ddtBias, daLog, dd, aLog), ddtBias, daLog, dd).plus(12*nck*mh+4*nck, 0).with(3*nck*mh, 0),
		ceilDiv(s.MH, mambaThreads), 1, 1, mambaThreads, 0,
		pa(ddtBias), pa(daLog), pa(dd), pu(part), pu(ct0), pa(aLog), ia(s.MH), ia(l.nck))
}

// checkScanBackward checks SSMScanBackward's arguments and returns xbc's
// dtype.
func checkScanBackward(op string, dxbc, ddtRaw, ddtBias, daLog, dd, dy, xbc, dtRaw, dtBias, aLog, d kernels.Buf, tree kernels.Tree, T int, s kernels.Scan) kernels.DType {
	checkScan(op, T, s)
	if ssdChunkSmem(s) > ssdMaxSmem {
		panic(fmt.Sprintf("cuda: %s: MP=%d DS=%d: the scan backward's %d bytes of shared memory are over sm_80's %d",
			op, s.MP, s.DS, ssdChunkSmem(s), ssdMaxSmem))
	}
	checkMambaTree(op, tree, T)
	dt := operands(op+" xbc", xbc)
	want(dxbc, kernels.F32, T*s.CD(), op+" dxbc")
	want(ddtRaw, kernels.F32, T*s.MH, op+" ddtRaw")
	for _, v := range []struct {
		b    kernels.Buf
		name string
	}{{ddtBias, "ddtBias"}, {daLog, "daLog"}, {dd, "dd"}, {dtBias, "dtBias"}, {aLog, "aLog"}, {d, "d"}} {
		want(v.b, kernels.F32, s.MH, op+" "+v.name)
	}
	want(dy, kernels.F32, T*s.DI(), op+" dy")
	want(xbc, dt, T*s.CD(), op+" xbc")
	want(dtRaw, kernels.F32, T*s.MH, op+" dtRaw")
	return dt
}

// ssdCost is the chunked backward's reads and FLOPs that depend on the
// shapes, counted as if every chunk held mambaQ rows (exact when the
// segments' lengths are multiples of it; an upper bound otherwise): xe is
// xbc's element size.
type ssdCost struct {
	localRead, localFLOPs, chunkRead, chunkFLOPs int64
}

func ssdCosts(T, NS int, s kernels.Scan, xe int64) ssdCost {
	t, mh, g := int64(T), int64(s.MH), int64(s.G)
	P, N, Q := int64(s.MP), int64(s.DS), int64(mambaQ)
	return ssdCost{
		// Each head's C rows (its group's), and U = dYᵀ·diag(exp Λ)·C.
		localRead:  t * mh * N * xe,
		localFLOPs: 2 * t * mh * P * N,
		// B, C once a group; x a head; the group's dB, dC read and written
		// by every head but the first (written by all, in dxbc's count).
		chunkRead: t*g*2*N*xe + t*mh*P*xe + t*(mh-g)*2*N*4,
		// A group's G = C·Bᵀ; a head's dM = dY·Xᵀ, C·S0ᵀ, B·dS1ᵀ, dX (K = Q),
		// dC and dB (K = Q + MP each).
		chunkFLOPs: t*g*2*Q*N + t*mh*(2*Q*P+2*P*N+2*P*N+2*Q*P+4*(Q+P)*N),
	}
}

// ssdLocalSmem and ssdChunkSmem are the shared memory of ssd_bwd_local
// (dY, C, three vectors) and ssd_bwd_chunk (B, C, G, X, dY, dM, a product
// buffer, nine vectors, 32).
func ssdLocalSmem(s kernels.Scan) int { return 4 * (mambaQ*s.MP + mambaQ*s.DS + 3*mambaQ) }
func ssdChunkSmem(s kernels.Scan) int {
	return 4 * (2*mambaQ*s.DS + 2*mambaQ*mambaQ + 3*mambaQ*s.MP + 9*mambaQ + 32)
}

// SSMDecode implements kernels.Mamba.
func (b *Backend) SSMDecode(y, state, xbc, dtRaw, dtBias, aLog, d kernels.Buf, B int, s kernels.Scan) {
	checkScan("SSMDecode", B, s)
	dt := operands("SSMDecode xbc", xbc)
	want(y, kernels.F32, B*s.DI(), "SSMDecode y")
	want(state, kernels.F32, B*s.DI()*s.DS, "SSMDecode state")
	want(xbc, dt, B*s.CD(), "SSMDecode xbc")
	want(dtRaw, kernels.F32, B*s.MH, "SSMDecode dtRaw")
	want(dtBias, kernels.F32, s.MH, "SSMDecode dtBias")
	want(aLog, kernels.F32, s.MH, "SSMDecode aLog")
	want(d, kernels.F32, s.MH, "SSMDecode d")
	if B == 0 {
		return
	}
	lo, hi := scanDt(s)
	name := "ssm_decode"
	if dt == kernels.BF16 {
		name = "ssm_decode_bf16"
	}
	defer b.lock()()
	c := rw(reads(state, xbc, dtRaw, dtBias, aLog, d), y, state).with(scanFLOPs(B, s), 0)
	b.launch(name, c, B*s.MH, 1, 1, mambaThreads, 0,
		pa(y), pa(state), pa(xbc), pa(dtRaw), pa(dtBias), pa(aLog), pa(d), ia(B), ia(s.MH), ia(s.MP), ia(s.G), ia(s.DS), lo, hi)
}

func checkGated(op string, N, D, GS int) {
	if N < 0 || D <= 0 || GS <= 0 || D%GS != 0 {
		panic(fmt.Sprintf("cuda: %s: N=%d D=%d GS=%d (GS must divide D)", op, N, D, GS))
	}
}

// gatedBlocks is the gated norm's grid over N·D/GS (row, group) pairs.
func (b *Backend) gatedBlocks(n int) int { return b.gridBlocks(max(1, min(n, 64*b.d.info.SMs))) }

// GatedRMSNorm implements kernels.Mamba.
func (b *Backend) GatedRMSNorm(out, rstd, y, z, weight kernels.Buf, N, D, GS int, eps float32) {
	checkGated("GatedRMSNorm", N, D, GS)
	operands("GatedRMSNorm out", out)
	want(out, out.DType, N*D, "GatedRMSNorm out")
	want(rstd, kernels.F32, N*(D/GS), "GatedRMSNorm rstd")
	want(y, kernels.F32, N*D, "GatedRMSNorm y")
	want(z, kernels.F32, N*D, "GatedRMSNorm z")
	want(weight, kernels.F32, D, "GatedRMSNorm weight")
	if N == 0 {
		return
	}
	name := "gated_rmsnorm_fwd"
	if out.DType == kernels.BF16 {
		name = "gated_rmsnorm_fwd_bf16out"
	}
	defer b.lock()()
	c := rw(reads(y, z, weight), out, rstd).with(int64(N)*int64(D)*14, 0)
	b.launch(name, c, b.gatedBlocks(N*(D/GS)), 1, 1, mambaThreads, 0,
		pa(out), pa(rstd), pa(y), pa(z), pa(weight), ia(N), ia(D), ia(GS), fa(eps))
}

// GatedRMSNormBackward implements kernels.Mamba.
func (b *Backend) GatedRMSNormBackward(dy, dz, dweight, dout, y, z, weight, rstd kernels.Buf, N, D, GS int) {
	checkGated("GatedRMSNormBackward", N, D, GS)
	for _, v := range []struct {
		b    kernels.Buf
		name string
	}{{dy, "dy"}, {dz, "dz"}, {dout, "dout"}, {y, "y"}, {z, "z"}} {
		want(v.b, kernels.F32, N*D, "GatedRMSNormBackward "+v.name)
	}
	want(dweight, kernels.F32, D, "GatedRMSNormBackward dweight")
	want(weight, kernels.F32, D, "GatedRMSNormBackward weight")
	want(rstd, kernels.F32, N*(D/GS), "GatedRMSNormBackward rstd")
	if N == 0 {
		return
	}
	defer b.lock()()
	b.launch("gated_rmsnorm_bwd", rw(reads(dout, y, z, weight, rstd), dy, dz).with(int64(N)*int64(D)*30, 0),
		b.gatedBlocks(N*(D/GS)), 1, 1, mambaThreads, 0,
		pa(dy), pa(dz), pa(dout), pa(y), pa(z), pa(weight), pa(rstd), ia(N), ia(D), ia(GS))
	nch := convChunks(N)
	p := b.work(workMamba, gatedWork(N, D))
	if p == 0 {
		return
	}
	part := int64(gatedWork(N, D))
	b.launch("gated_rmsnorm_dw", rw(reads(dout, y, z, rstd)).plus(0, part).with(int64(N)*int64(D)*10, 0),
		ceilDiv(D, mambaThreads)*nch, 1, 1, mambaThreads, 0,
		pu(p), pa(dout), pa(y), pa(z), pa(rstd), ia(N), ia(D), ia(GS))
	b.elementwise("bias_backward_reduce", rw(reads(dweight), dweight).plus(part, 0).with(part/4, 0), D,
		pa(dweight), pu(p), ia(nch), ia(D))
}

// ReLU2 implements kernels.Mamba.
func (b *Backend) ReLU2(out, inp kernels.Buf, N int) {
	dt := operands("ReLU2 inp", inp)
	operands("ReLU2 out", out)
	want(out, out.DType, N, "ReLU2 out")
	want(inp, dt, N, "ReLU2 inp")
	name := relu2Kernels[[2]kernels.DType{dt, out.DType}]
	defer b.lock()()
	b.elementwise(name, rw(reads(inp), out).with(2*int64(N), 0), N, pa(out), pa(inp), la(N))
}

// ReLU2Backward implements kernels.Mamba.
func (b *Backend) ReLU2Backward(dinp, dout, inp kernels.Buf, N int) {
	dt := operands("ReLU2Backward inp", inp)
	want(dinp, kernels.F32, N, "ReLU2Backward dinp")
	want(dout, kernels.F32, N, "ReLU2Backward dout")
	want(inp, dt, N, "ReLU2Backward inp")
	name := "relu2_bwd"
	if dt == kernels.BF16 {
		name = "relu2_bwd_bf16"
	}
	defer b.lock()()
	b.elementwise(name, rw(reads(dout, inp), dinp).with(3*int64(N), 0), N, pa(dinp), pa(dout), pa(inp), la(N))
}

// relu2Kernels names ReLU2's kernel by (input, output) dtype.
var relu2Kernels = map[[2]kernels.DType]string{
	{kernels.F32, kernels.F32}: "relu2_fwd", {kernels.BF16, kernels.BF16}: "relu2_fwd_bf16",
	{kernels.BF16, kernels.F32}: "relu2_fwd_bf16_f32out", {kernels.F32, kernels.BF16}: "relu2_fwd_f32_bf16out",
}

var _ kernels.Mamba = (*Backend)(nil)
