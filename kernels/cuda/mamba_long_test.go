//go:build cgo

package cuda

import (
	"math/rand"
	"testing"

	"github.com/tracegrpo/tracegrpo/kernels"
	"github.com/tracegrpo/tracegrpo/kernels/cpu"
	"github.com/tracegrpo/tracegrpo/kernels/kerneltest"
)

// TestMambaWeightGradsLongEmu: the conv's and the gated norm's weight
// gradients over more rows than one partial holds (mambaRows): their
// per-chunk partials summed in chunk order equal kernels/cpu's. The
// conformance suite's shapes fit in one chunk.
func TestMambaWeightGradsLongEmu(t *testing.T) {
	b := emuBackend(t, Options{maxBlocks: 3})
	ref := cpu.New(2)
	defer ref.Close()
	rng := rand.New(rand.NewSource(9))
	type pair struct{ r, d kernels.Buf }
	randn := func(n int) pair {
		v := make([]float32, n)
		for i := range v {
			v[i] = float32(rng.NormFloat64())
		}
		r, _ := ref.Alloc(kernels.F32, n)
		d, err := b.Alloc(kernels.F32, n)
		if err != nil {
			t.Fatal(err)
		}
		ref.UploadF32(r, v)
		b.UploadF32(d, v)
		return pair{r, d}
	}
	i32 := func(v ...int32) pair {
		r, _ := ref.Alloc(kernels.I32, len(v))
		d, _ := b.Alloc(kernels.I32, len(v))
		ref.UploadI32(r, v)
		b.UploadI32(d, v)
		return pair{r, d}
	}
	check := func(what string, p pair) {
		t.Helper()
		want, got := make([]float32, p.r.N), make([]float32, p.d.N)
		ref.DownloadF32(want, p.r)
		b.DownloadF32(got, p.d)
		if msg := kerneltest.Compare(want, got, kerneltest.TolReduce); msg != "" {
			t.Errorf("%s: %s", what, msg)
		}
	}
	// 700 tokens: a sequence of 600 and one of 100.
	const T, CD, KW = 700, 12, 4
	offs, parent, ends := i32(0, 600, 700), i32(-1, -1), i32(600, 700)
	tr := func(v func(pair) kernels.Buf) kernels.Tree {
		return kernels.Tree{Offs: v(offs), Parent: v(parent), Ends: v(ends), NS: 2, MaxLen: 600, MaxCtx: 600}
	}
	inp, w, bias, dout := randn(T*CD), randn(CD*KW), randn(CD), randn(T*CD)
	dinp, dw, db := randn(T*CD), randn(CD*KW), randn(CD)
	const D, GS = 16, 8
	y, z, gw, gout, rstd, gdy, gdz, gdw := randn(T*D), randn(T*D), randn(D), randn(T*D), randn(T*D/GS), randn(T*D), randn(T*D), randn(D)
	gdo := randn(T * D)
	for _, be := range []struct {
		m kernels.Mamba
		v func(pair) kernels.Buf
	}{{ref, func(p pair) kernels.Buf { return p.r }}, {b, func(p pair) kernels.Buf { return p.d }}} {
		m, v := be.m, be.v
		m.Conv1DBackward(v(dinp), v(dw), v(db), v(dout), v(inp), v(w), v(bias), tr(v), T, CD, KW)
		m.GatedRMSNorm(v(gout), v(rstd), v(y), v(z), v(gw), T, D, GS, 1e-5)
		m.GatedRMSNormBackward(v(gdy), v(gdz), v(gdw), v(gdo), v(y), v(z), v(gw), v(rstd), T, D, GS)
	}
	if err := b.Sync(); err != nil {
		t.Fatal(err)
	}
	check("Conv1DBackward dinp", dinp)
	check("Conv1DBackward dweight +=", dw)
	check("Conv1DBackward dbias +=", db)
	check("GatedRMSNormBackward dweight +=", gdw)
	check("GatedRMSNormBackward dy", gdy)
}
