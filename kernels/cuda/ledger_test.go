//go:build cgo

package cuda

import (
	"fmt"
	"math"
	"strings"
	"testing"

	"github.com/tracegrpo/tracegrpo/kernels"
)

// The ledger's counts against each op's arithmetic: the bytes an op must
// move (every input read once, every output written once, an accumulated
// output both) and the FLOPs its products need, written here from the ops'
// definitions in kernels.Ops, not from the launch sites. A launch site
// that forgets an operand, or a kernel change that moves more than its
// launch says, fails here (or in TestLedgerWritesEmu, which counts the
// bytes each launch really changes on the emulator).

// meterBackend opens the metering device.
func meterBackend(t *testing.T) *Backend {
	t.Helper()
	be, err := OpenMeter(Options{})
	if err != nil {
		t.Fatal(err)
	}
	b := be.(*Backend)
	t.Cleanup(func() { b.Close() })
	return b
}

// opLedger runs f with the ledger on and returns what it recorded, each
// launch checked to name op as its caller.
func opLedger(t *testing.T, b *Backend, op string, f func()) []Launch {
	t.Helper()
	b.StartLedger()
	f()
	got := b.TakeLedger()
	if len(got) == 0 {
		t.Fatalf("%s: no launch recorded", op)
	}
	for _, l := range got {
		if l.Op != op {
			t.Errorf("%s: launch of %s recorded as op %q", op, l.Kernel, l.Op)
		}
	}
	return got
}

type sums struct{ read, write, flops int64 }

func sumOf(ls []Launch) sums {
	var s sums
	for _, l := range ls {
		s.read += l.Read
		s.write += l.Write
		s.flops += l.FLOPs
	}
	return s
}

// within checks lo ≤ got ≤ hi.
func within(t *testing.T, what string, got, lo, hi int64) {
	t.Helper()
	if got < lo || got > hi {
		t.Errorf("%s = %d, want in [%d, %d]", what, got, lo, hi)
	}
}

func TestLedgerGEMMs(t *testing.T) {
	b := meterBackend(t)
	for _, sh := range []struct{ T, C, OC int }{{4096, 2048, 6144}, {37, 64, 96}} {
		T, C, OC := int64(sh.T), int64(sh.C), int64(sh.OC)
		inp, _ := b.Alloc(kernels.BF16, sh.T*sh.C)
		w, _ := b.Alloc(kernels.BF16, sh.OC*sh.C)
		out, _ := b.Alloc(kernels.BF16, sh.T*sh.OC)
		dinp, _ := b.Alloc(kernels.F32, sh.T*sh.C)
		dw, _ := b.Alloc(kernels.F32, sh.OC*sh.C)
		name := fmt.Sprintf("T=%d C=%d OC=%d", sh.T, sh.C, sh.OC)
		s := sumOf(opLedger(t, b, "Matmul", func() { b.Matmul(out, inp, w, sh.T, sh.C, sh.OC) }))
		if want := (sums{2 * (T*C + OC*C), 2 * T * OC, 2 * T * C * OC}); s != want {
			t.Errorf("Matmul %s: ledger %+v, want %+v", name, s, want)
		}
		// dinp += dout·W, dW += doutᵀ·inp: each reads its operands and
		// reads and writes its fp32 accumulator.
		s = sumOf(opLedger(t, b, "MatmulBackward", func() { b.MatmulBackward(dinp, dw, out, inp, w, sh.T, sh.C, sh.OC) }))
		if want := (sums{2*(OC*C+T*OC) + 4*T*C + 2*(T*C+T*OC) + 4*OC*C, 4*T*C + 4*OC*C, 4 * T * C * OC}); s != want {
			t.Errorf("MatmulBackward %s: ledger %+v, want %+v", name, s, want)
		}
		// dinp = dout·W (beta = 0) reads no dinp.
		s = sumOf(opLedger(t, b, "MatmulBackwardFresh", func() { b.MatmulBackwardFresh(dinp, dw, out, inp, w, sh.T, sh.C, sh.OC) }))
		if want := (sums{2*(OC*C+T*OC) + 2*(T*C+T*OC) + 4*OC*C, 4*T*C + 4*OC*C, 4 * T * C * OC}); s != want {
			t.Errorf("MatmulBackwardFresh %s: ledger %+v, want %+v", name, s, want)
		}
		for _, x := range []kernels.Buf{inp, w, out, dinp, dw} {
			b.Free(x)
		}
	}
}

// causalPairs is Σ L(L+1)/2 over sequences of len L: the (query, key)
// pairs causal attention scores, per head.
func causalPairs(lens ...int) int64 {
	var n int64
	for _, L := range lens {
		n += int64(L) * int64(L+1) / 2
	}
	return n
}

func TestLedgerAttention(t *testing.T) {
	b := meterBackend(t)
	for _, sh := range []struct{ S, L, NH, NKV, HD int }{{8, 4096, 16, 8, 128}, {2, 1024, 4, 2, 64}} {
		T := sh.S * sh.L
		q, _ := b.Alloc(kernels.BF16, T*sh.NH*sh.HD)
		k, _ := b.Alloc(kernels.BF16, T*sh.NKV*sh.HD)
		v, _ := b.Alloc(kernels.BF16, T*sh.NKV*sh.HD)
		out, _ := b.Alloc(kernels.BF16, T*sh.NH*sh.HD)
		lse, _ := b.Alloc(kernels.F32, T*sh.NH)
		cu, _ := b.Alloc(kernels.I32, sh.S+1)
		dq, _ := b.Alloc(kernels.F32, T*sh.NH*sh.HD)
		dk, _ := b.Alloc(kernels.F32, T*sh.NKV*sh.HD)
		dv, _ := b.Alloc(kernels.F32, T*sh.NKV*sh.HD)
		seqs := kernels.Seqs{CuSeqlens: cu, S: sh.S, MaxLen: sh.L}
		lens := make([]int, sh.S)
		for i := range lens {
			lens[i] = sh.L
		}
		pairs := causalPairs(lens...) * int64(sh.NH)
		// Tiles cover the diagonal whole: at most one tile of 128 rows
		// more per query row than the causal pairs.
		waste := int64(sh.S) * int64(sh.L) * 128 * int64(sh.NH)
		hd := int64(sh.HD)
		name := fmt.Sprintf("S=%d L=%d NH=%d HD=%d", sh.S, sh.L, sh.NH, sh.HD)
		// Forward: S = QKᵀ and O = PV, 2·HD operations each per pair.
		s := sumOf(opLedger(t, b, "Attention", func() { b.Attention(out, lse, q, k, v, seqs, sh.NH, sh.NKV, sh.HD) }))
		within(t, "Attention "+name+" FLOPs", s.flops, 4*hd*pairs, 4*hd*(pairs+waste))
		in := bytesOf(q, k, v)
		within(t, "Attention "+name+" bytes read", s.read, in, in+bytesOf(cu)+4*int64(T*sh.NH))
		within(t, "Attention "+name+" bytes written", s.write, bytesOf(out, lse), bytesOf(out, lse))
		// Backward: S, dP = dO·Vᵀ, dV = Pᵀ·dO, dK = dSᵀ·Q, dQ = dS·K, 5
		// products and no more: dq is dS·K from the dS scratch, S and dP are
		// not recomputed (which would make 7).
		s = sumOf(opLedger(t, b, "AttentionBackward", func() {
			b.AttentionBackward(dq, dk, dv, out, out, lse, q, k, v, seqs, sh.NH, sh.NKV, sh.HD)
		}))
		within(t, "AttentionBackward "+name+" FLOPs", s.flops, 10*hd*pairs, 10*hd*(pairs+waste))
		// The bf16 dS of every causal pair, written once by the dkdv kernel
		// and read once by dq's; a row is rounded up to whole 64-key blocks.
		dsMin, dsMax := 2*pairs, 2*(pairs+64*int64(T*sh.NH))
		minRead := bytesOf(out, out, lse, q, k, v)
		// The dot and the dkdv kernel each read their operands, dq's K.
		within(t, "AttentionBackward "+name+" bytes read", s.read, minRead+dsMin, 3*minRead+dsMax)
		within(t, "AttentionBackward "+name+" bytes written", s.write, bytesOf(dq, dk, dv)+dsMin, bytesOf(dq, dk, dv)+4*int64(T*sh.NH)+dsMax)
		// Over attnDSMaxBytes (a long context's scratch): the tensor-core
		// kernels that recompute S and dP for dq, 7 products, and no dS
		// written or read.
		old := attnDSMaxBytes
		attnDSMaxBytes = 0
		fb := opLedger(t, b, "AttentionBackward", func() {
			b.AttentionBackward(dq, dk, dv, out, out, lse, q, k, v, seqs, sh.NH, sh.NKV, sh.HD)
		})
		attnDSMaxBytes = old
		for _, l := range fb {
			if l.Kernel != "attention_bwd_dot_bf16" && !strings.HasSuffix(l.Kernel, tcKernel(sh.HD, "_tc_hd64", "_tc_hd128")) {
				t.Errorf("AttentionBackward %s over the dS cap: launched %s, not a tensor-core kernel", name, l.Kernel)
			}
		}
		s = sumOf(fb)
		within(t, "AttentionBackward "+name+" over the dS cap FLOPs", s.flops, 14*hd*pairs, 14*hd*(pairs+waste))
		within(t, "AttentionBackward "+name+" over the dS cap bytes read", s.read, minRead, 3*minRead)
		within(t, "AttentionBackward "+name+" over the dS cap bytes written", s.write, bytesOf(dq, dk, dv), bytesOf(dq, dk, dv)+4*int64(T*sh.NH))
		for _, x := range []kernels.Buf{q, k, v, out, lse, cu, dq, dk, dv} {
			b.Free(x)
		}
	}
}

// TestLedgerElementwise: the ops that touch each element a fixed number of
// times state exactly those bytes.
func TestLedgerElementwise(t *testing.T) {
	b := meterBackend(t)
	const N, C = 4096, 2048
	f := func(n int) kernels.Buf {
		x, err := b.Alloc(kernels.F32, n)
		if err != nil {
			t.Fatal(err)
		}
		return x
	}
	h := func(n int) kernels.Buf {
		x, err := b.Alloc(kernels.BF16, n)
		if err != nil {
			t.Fatal(err)
		}
		return x
	}
	x, y, z, w := f(N*C), f(N*C), f(N*C), f(N*C)
	xh, yh, zh := h(N*C), h(N*C), h(N*C)
	weight, rstd := f(C), f(N)
	pos, _ := b.Alloc(kernels.I32, N)
	cos, sin := f(N*64), f(N*64)
	const nc = int64(N) * C
	cases := []struct {
		op          string
		run         func()
		read, write int64
	}{
		{"Add", func() { b.Add(x, y, z, N*C) }, 8 * nc, 4 * nc},
		{"Accumulate", func() { b.Accumulate(x, y, N*C) }, 8 * nc, 4 * nc},
		{"Fill", func() { b.Fill(x, 0) }, 0, 4 * nc},
		{"Scale", func() { b.Scale(x, 2) }, 4 * nc, 4 * nc},
		{"Copy", func() { b.Copy(x, y) }, 4 * nc, 4 * nc},
		{"Convert", func() { b.Convert(xh, x) }, 4 * nc, 2 * nc},
		{"SwiGLU", func() { b.SwiGLU(xh, yh, zh, N*C) }, 4 * nc, 2 * nc},
		{"SwiGLUBackward", func() { b.SwiGLUBackward(x, y, z, yh, zh, N*C) }, 8 * nc, 8 * nc},
		// gu (N, C) bf16 holds N rows of C/2 gate then C/2 up values.
		{"SwiGLURows", func() { b.SwiGLURows(xh.Slice(0, N*C/2), yh, N, C/2) }, 2 * nc, nc},
		{"SwiGLURowsBackward", func() { b.SwiGLURowsBackward(xh, x.Slice(0, N*C/2), yh, N, C/2) }, 2*nc + 2*nc, 2 * nc},
		{"CopyCols", func() { b.CopyCols(xh, x, N, C/2, C, C) }, 2 * nc, nc},
		{"RMSNorm", func() { b.RMSNorm(xh, rstd, x, weight, N, C, 1e-6) }, 4*nc + 4*C, 2*nc + 4*N},
		{"AddRMSNorm", func() { b.AddRMSNorm(x, xh, rstd, y, z, weight, N, C, 1e-6) }, 8*nc + 4*C, 4*nc + 2*nc + 4*N},
		{"AdamW", func() { b.AdamW(x, y, z, w, kernels.AdamWStep{}) }, 16 * nc, 12 * nc},
		{"RopeConvert", func() { b.RopeConvert(xh, x, pos, cos, sin, N, C/128, 128) }, 4*nc + 4*N + 2*4*N*64, 2 * nc},
	}
	// QKNormRope over N rows of qkv (C = 16 heads of 128: 8 q, 4 k, 4 v):
	// qkv, the weights, pos and the cos/sin rows read; the raw heads, the
	// rstds and the bf16 q, k, v written.
	qkvRows, qwt, kwt := x.Slice(0, N*16*128), weight.Slice(0, 128), weight.Slice(128, 128)
	qkCase := struct {
		op          string
		run         func()
		read, write int64
	}{"QKNormRope", func() {
		b.QKNormRope(xh.Slice(0, N*8*128), yh.Slice(0, N*4*128), zh.Slice(0, N*4*128), y.Slice(0, N*8*128), z.Slice(0, N*4*128),
			w.Slice(0, N*8), w.Slice(N*8, N*4), qkvRows, qwt, kwt, pos, cos, sin, N, 8, 4, 128, 1e-6)
	}, 4*N*16*128 + 2*4*128 + 4*N + 2*4*N*64, 2*N*16*128 + 4*N*12*128 + 4*N*12}
	cases = append(cases, qkCase)
	for _, c := range cases {
		s := sumOf(opLedger(t, b, c.op, c.run))
		if s.read != c.read || s.write != c.write {
			t.Errorf("%s: ledger reads %d, writes %d bytes; the op reads %d, writes %d", c.op, s.read, s.write, c.read, c.write)
		}
	}
	// The backward norm's weight gradient goes through per-block partials:
	// at most normBwdBlocks rows of C floats written and read again.
	s := sumOf(opLedger(t, b, "RMSNormBackward", func() { b.RMSNormBackward(x, weight, y, z, weight, rstd, N, C) }))
	minRead, minWrite := 12*nc+4*C+4*C+4*N, 4*nc+4*C
	within(t, "RMSNormBackward bytes read", s.read, minRead, minRead+normBwdBlocks*4*C)
	within(t, "RMSNormBackward bytes written", s.write, minWrite, minWrite+normBwdBlocks*4*C)
	// QKNormRopeBackward over N tokens of 8 q, 4 k and 4 v heads of 128
	// into a bf16 dqkv: dq, dk, dv, the raw heads, their rstds, the
	// weights, pos and the cos/sin rows read, dqkv written, both weight
	// gradients accumulated (read and written), through at most
	// normBwdBlocks rows of partials each; without norms, the rotation and
	// the copies alone.
	const hd = 128
	dwq, dwk := f(hd), f(hd)
	qkb := func(norm bool) func() {
		return func() {
			var qraw, kraw, qrstd, krstd, qw, kw, dqw, dkw kernels.Buf
			if norm {
				qraw, kraw, qrstd, krstd = y.Slice(0, N*8*hd), z.Slice(0, N*4*hd), w.Slice(0, N*8), w.Slice(N*8, N*4)
				qw, kw, dqw, dkw = weight.Slice(0, hd), weight.Slice(hd, hd), dwq, dwk
			}
			b.QKNormRopeBackward(xh.Slice(0, N*16*hd), dqw, dkw, x.Slice(0, N*8*hd), x.Slice(N*8*hd, N*4*hd), x.Slice(N*12*hd, N*4*hd),
				qraw, kraw, qrstd, krstd, qw, kw, pos, cos, sin, N, 8, 4, hd)
		}
	}
	const nq = int64(N) * 16 * hd
	s = sumOf(opLedger(t, b, "QKNormRopeBackward", qkb(false)))
	if want := 4*nq + 4*N + 2*4*N*64; s.read != want || s.write != 2*nq {
		t.Errorf("QKNormRopeBackward without norms: ledger reads %d, writes %d bytes; the op reads %d, writes %d", s.read, s.write, want, 2*nq)
	}
	s = sumOf(opLedger(t, b, "QKNormRopeBackward", qkb(true)))
	// Its partials: the grid's B rows of q's and of k's, written, then
	// read by the two reduces.
	B, _ := qkRopeBwdGrid(N*16, hd)
	part := 2 * int64(B) * hd * 4
	read, write := 4*nq+4*nq*12/16+4*N*12+2*4*hd+4*N+2*4*N*64+2*4*hd+part, 2*nq+2*4*hd+part
	flops := int64(13)*N*12*hd + part/4 // 13 a q/k element; the reduces' one a partial
	if s.read != read || s.write != write || s.flops != flops {
		t.Errorf("QKNormRopeBackward: ledger reads %d, writes %d bytes, %d FLOPs; the op reads %d, writes %d, %d FLOPs", s.read, s.write, s.flops, read, write, flops)
	}
}

// TestLedgerMamba: Nemotron-H's ops (kernels.Mamba) and the sigmoid
// router, from their definitions: every operand read once, every output
// written once (an accumulated one both), the scan's 5 FLOPs a state
// element a token (the update's 3, the output's 2).
func TestLedgerMamba(t *testing.T) {
	b := meterBackend(t)
	alloc := func(dt kernels.DType, n int) kernels.Buf {
		x, err := b.Alloc(dt, n)
		if err != nil {
			t.Fatal(err)
		}
		return x
	}
	f := func(n int) kernels.Buf { return alloc(kernels.F32, n) }
	const N, D, GS = 4096, 4096, 512
	const nd = int64(N) * D
	x, y, z, w := f(N*D), f(N*D), f(N*D), f(D)
	xh := alloc(kernels.BF16, N*D)
	rstd := f(N * D / GS)
	cases := []struct {
		op                 string
		run                func()
		read, write, flops int64
	}{
		{"ReLU2", func() { b.ReLU2(xh, x, N*D) }, 4 * nd, 2 * nd, 2 * nd},
		{"ReLU2Backward", func() { b.ReLU2Backward(y, z, xh, N*D) }, 6 * nd, 4 * nd, 3 * nd},
		{"GatedRMSNorm", func() { b.GatedRMSNorm(xh, rstd, y, z, w, N, D, GS, 1e-5) }, 8*nd + 4*D, 2*nd + 4*nd/GS, 14 * nd},
	}
	for _, c := range cases {
		s := sumOf(opLedger(t, b, c.op, c.run))
		if s.read != c.read || s.write != c.write || s.flops != c.flops {
			t.Errorf("%s: ledger reads %d, writes %d bytes, %d FLOPs; the op reads %d, writes %d, %d FLOPs", c.op, s.read, s.write, s.flops, c.read, c.write, c.flops)
		}
	}
	// The norm's backward: its five (N,D) operands, weight and rstd read,
	// dy and dz written, dweight accumulated through per-chunk partials
	// (a second pass over dout, y, z and rstd).
	s := sumOf(opLedger(t, b, "GatedRMSNormBackward", func() { b.GatedRMSNormBackward(x, y, w, z, x, y, w, rstd, N, D, GS) }))
	part := int64(4*D) * int64((N+mambaRows-1)/mambaRows)
	minRead, minWrite := 12*nd+4*D+4*nd/GS+4*D, 8*nd+4*D
	within(t, "GatedRMSNormBackward bytes read", s.read, minRead, minRead+12*nd+4*nd/GS+part)
	within(t, "GatedRMSNormBackward bytes written", s.write, minWrite, minWrite+part)

	// A packed micro-batch of 4 sequences: the tree's three buffers.
	const T, NS = 4096, 4
	offs, parent, ends := alloc(kernels.I32, NS+1), alloc(kernels.I32, NS), alloc(kernels.I32, NS)
	tree := kernels.Tree{Offs: offs, Parent: parent, Ends: ends, NS: NS, MaxLen: T, MaxCtx: T}
	treeBytes := int64(4 * (3*NS + 1))
	sc := kernels.Scan{MH: 64, MP: 64, G: 8, DS: 128, Chunk: 128, DtMax: float32(math.Inf(1))}
	CD, KW := sc.CD(), 4
	inp, out := f(T*CD), alloc(kernels.BF16, T*CD)
	cw, cb := f(CD*KW), f(CD)
	tcd := int64(T) * int64(CD)
	s = sumOf(opLedger(t, b, "Conv1D", func() { b.Conv1D(out, inp, cw, cb, tree, T, CD, KW) }))
	within(t, "Conv1D bytes read", s.read, 4*tcd+4*int64(CD*KW)+4*int64(CD), 4*tcd+4*int64(CD*KW)+4*int64(CD)+2*treeBytes)
	if s.write != 2*tcd || s.flops < 2*int64(KW)*tcd {
		t.Errorf("Conv1D: writes %d bytes, %d FLOPs; want %d bytes, at least %d FLOPs", s.write, s.flops, 2*tcd, 2*int64(KW)*tcd)
	}
	dinp, dout, dcw, dcb := f(T*CD), f(T*CD), f(CD*KW), f(CD)
	s = sumOf(opLedger(t, b, "Conv1DBackward", func() { b.Conv1DBackward(dinp, dcw, dcb, dout, inp, cw, cb, tree, T, CD, KW) }))
	if minR, minW := 8*tcd+8*int64(CD*KW)+8*int64(CD), 4*tcd+4*int64(CD*KW)+4*int64(CD); s.read < minR || s.write < minW || s.flops < 4*int64(KW)*tcd {
		t.Errorf("Conv1DBackward: reads %d, writes %d bytes, %d FLOPs; want at least %d, %d, %d", s.read, s.write, s.flops, minR, minW, 4*int64(KW)*tcd)
	}

	xbc := alloc(kernels.BF16, T*CD)
	dtRaw, hb, ha, hd := f(T*sc.MH), f(sc.MH), f(sc.MH), f(sc.MH)
	ys, final := f(T*sc.DI()), f(NS*sc.DI()*sc.DS)
	state := int64(4) * int64(sc.DI()) * int64(sc.DS)
	ins := 2*tcd + 4*int64(T*sc.MH) + 12*int64(sc.MH)
	ssd := opLedger(t, b, "SSMScan", func() { b.SSMScan(ys, final, xbc, dtRaw, hb, ha, hd, tree, T, sc) })
	s = sumOf(ssd)
	want5 := 5 * int64(T) * int64(sc.DI()) * int64(sc.DS)
	// The chunked SSD on tensor cores (bf16 xbc): per chunk of 64 tokens
	// and head, the products of its four p-tiles of 16 columns (64/16):
	// C·S0ᵀ (64×128·128×16) and Xwᵀ·B (16×64·64×128) twice each (hi, lo),
	// C·Bᵀ's 10 causal 16×16 tiles over 128, and those tiles times X
	// (16×16·16×16) twice.
	perChunk := int64(2*2*64*128*16 + 2*10*16*16*128 + 2*2*10*16*16*16 + 2*2*16*64*128)
	if wantSSD := int64(T/64) * int64(sc.MH) * 4 * perChunk; s.flops != wantSSD || len(ssd) != 2 || ssd[1].Kernel != "ssd_scan_fwd_bf16" ||
		ssd[1].Grid != [3]int{4, sc.MH, 1} || ssd[1].Smem != ssdSmem {
		t.Errorf("SSMScan (bf16): %d FLOPs in %+v, want %d in tree_check and one ssd_scan_fwd_bf16 of grid (4, %d, 1) and %d bytes of shared memory", s.flops, ssd, wantSSD, sc.MH, ssdSmem)
	}
	// An fp32 xbc, or a state over 128, keeps the sequential recurrence.
	// (Each SSMScan first checks the tree: tree_check.)
	xf := f(T * CD)
	if seq := opLedger(t, b, "SSMScan", func() { b.SSMScan(ys, final, xf, dtRaw, hb, ha, hd, tree, T, sc) }); len(seq) != 2 ||
		seq[1].Kernel != "ssm_scan_fwd" || seq[1].FLOPs != want5 {
		t.Errorf("SSMScan (fp32): %+v, want tree_check and one ssm_scan_fwd of %d FLOPs (5 a state element a token)", seq, want5)
	}
	big := kernels.Scan{MH: 8, MP: 16, G: 1, DS: 256, Chunk: 128, DtMax: sc.DtMax}
	if seq := opLedger(t, b, "SSMScan", func() {
		b.SSMScan(f(T*big.DI()), kernels.Buf{}, alloc(kernels.BF16, T*big.CD()), f(T*8), f(8), f(8), f(8), tree, T, big)
	}); len(seq) != 2 || seq[1].Kernel != "ssm_scan_fwd_bf16" {
		t.Errorf("SSMScan (bf16, DS 256): %+v, want tree_check and one ssm_scan_fwd_bf16", seq)
	}
	within(t, "SSMScan bytes written", s.write, 4*int64(T*sc.DI())+NS*state, 4*int64(T*sc.DI())+NS*state)
	within(t, "SSMScan bytes read", s.read, ins, ins+2*treeBytes+NS*state)
	dxbc, ddt := f(T*CD), f(T*sc.MH)
	s = sumOf(opLedger(t, b, "SSMScanBackward", func() {
		b.SSMScanBackward(dxbc, ddt, hb, ha, hd, ys, xbc, dtRaw, hb, ha, hd, tree, T, sc)
	}))
	outs := 4*tcd + 4*int64(T*sc.MH) + 12*int64(sc.MH)
	if s.read < ins+4*int64(T*sc.DI())+12*int64(sc.MH) || s.write < outs || s.flops < 2*want5 {
		t.Errorf("SSMScanBackward: reads %d, writes %d bytes, %d FLOPs; want at least %d, %d, %d", s.read, s.write, s.flops,
			ins+4*int64(T*sc.DI())+12*int64(sc.MH), outs, 2*want5)
	}

	const E, K = 128, 6
	logits, probs, weights := f(T*E), f(T*E), f(T*K)
	experts, bias := alloc(kernels.I32, T*K), f(E)
	r := kernels.Router{K: K, Norm: true, Sigmoid: true, Bias: bias, Scale: 2.5}
	s = sumOf(opLedger(t, b, "RouterTopK", func() { b.RouterTopK(probs, weights, experts, logits, T, E, r) }))
	if s.read != 4*T*E+4*E || s.write != 4*T*E+8*T*K {
		t.Errorf("RouterTopK (sigmoid): reads %d, writes %d bytes; the op reads %d, writes %d", s.read, s.write, 4*T*E+4*E, 4*T*E+8*T*K)
	}
}
