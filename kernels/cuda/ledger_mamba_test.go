//go:build cgo

package cuda

import (
	"bufio"
	"math"
	"math/rand"
	"os"
	"path/filepath"
	"strconv"
	"strings"
	"testing"

	"github.com/tracegrpo/tracegrpo/kernels"
)

// TestLedgerWritesMambaEmu runs Nemotron-H's ops and the sigmoid router on
// the emulator with its write log on (the bytes of device memory each
// launch really changed) and checks every launch against its ledger
// entry, as TestLedgerWritesEmu does for a training step: a launch site
// that forgets an output or a scratch it fills fails here.
func TestLedgerWritesMambaEmu(t *testing.T) {
	log := filepath.Join(t.TempDir(), "writes.log")
	t.Setenv("TRACEGRPO_EMU_WRITELOG", log)
	b := emuBackend(t, Options{})
	rng := rand.New(rand.NewSource(5))
	f := func(n int) kernels.Buf {
		x, err := b.Alloc(kernels.F32, n)
		if err != nil {
			t.Fatal(err)
		}
		v := make([]float32, n)
		for i := range v {
			v[i] = float32(rng.NormFloat64())
		}
		b.UploadF32(x, v)
		return x
	}
	i32 := func(v ...int32) kernels.Buf {
		x, err := b.Alloc(kernels.I32, len(v))
		if err != nil {
			t.Fatal(err)
		}
		b.UploadI32(x, v)
		return x
	}
	// A tree: a root of 70 tokens with two children of 3 and 40.
	const T, NS = 113, 3
	tree := kernels.Tree{Offs: i32(0, 70, 73, 113), Parent: i32(-1, 0, 0), Ends: i32(113, 73, 113), NS: NS, MaxLen: 70, MaxCtx: 110}
	sc := kernels.Scan{MH: 4, MP: 8, G: 2, DS: 16, Chunk: 16, DtMax: float32(math.Inf(1))}
	CD, KW := sc.CD(), 4
	inp, out, w, bias := f(T*CD), f(T*CD), f(CD*KW), f(CD)
	dinp, dout, dw, db := f(T*CD), f(T*CD), f(CD*KW), f(CD)
	dtRaw, hb, ha, hd := f(T*sc.MH), f(sc.MH), f(sc.MH), f(sc.MH)
	y, final, dy := f(T*sc.DI()), f(NS*sc.DI()*sc.DS), f(T*sc.DI())
	dxbc, ddt, dhb, dha, dhd := f(T*CD), f(T*sc.MH), f(sc.MH), f(sc.MH), f(sc.MH)
	gy, gz, gw, gout, rstd := f(T*sc.DI()), f(T*sc.DI()), f(sc.DI()), f(T*sc.DI()), f(T*2)
	gdy, gdz, gdw := f(T*sc.DI()), f(T*sc.DI()), f(sc.DI())
	const E, K = 16, 4
	logits, probs, weights, rbias, dweights, dl := f(T*E), f(T*E), f(T*K), f(E), f(T*K), f(T*E)
	experts := i32(make([]int32, T*K)...)
	win, dec, state := f(2*(KW-1)*CD), f(2*CD), f(2*sc.DI()*sc.DS)
	r := kernels.Router{K: K, Norm: true, Sigmoid: true, Bias: rbias, Groups: 4, TopGroups: 2, Scale: 2.5}
	if err := b.Sync(); err != nil {
		t.Fatal(err)
	}
	skip := len(writeLines(t, log))
	b.StartLedger()
	b.Conv1D(out, inp, w, bias, tree, T, CD, KW)
	b.Conv1DBackward(dinp, dw, db, dout, inp, w, bias, tree, T, CD, KW)
	b.SSMScan(y, final, out, dtRaw, hb, ha, hd, tree, T, sc)
	b.SSMScan(y, kernels.Buf{}, out, dtRaw, hb, ha, hd, tree, T, sc)
	out16, err := b.Alloc(kernels.BF16, T*CD)
	if err != nil {
		t.Fatal(err)
	}
	b.Convert(out16, out)
	b.SSMScan(y, final, out16, dtRaw, hb, ha, hd, tree, T, sc) // the chunked SSD (ssd_fwd.cu)
	b.SSMScan(y, kernels.Buf{}, out16, dtRaw, hb, ha, hd, tree, T, sc)
	b.SSMScanBackward(dxbc, ddt, dhb, dha, dhd, dy, out, dtRaw, hb, ha, hd, tree, T, sc)
	b.GatedRMSNorm(gout, rstd, gy, gz, gw, T, sc.DI(), sc.DI()/2, 1e-5)
	b.GatedRMSNormBackward(gdy, gdz, gdw, gout, gy, gz, gw, rstd, T, sc.DI(), sc.DI()/2)
	b.ReLU2(gdy, gy, T*sc.DI())
	b.ReLU2Backward(gdz, gout, gy, T*sc.DI())
	b.RouterTopK(probs, weights, experts, logits, T, E, r)
	b.RouterTopKBackward(dl, dweights, probs, weights, experts, logits.Slice(0, E), T, E, r)
	b.Conv1DDecode(dec, win, inp.Slice(0, 2*CD), w, bias, 2, CD, KW)
	b.SSMDecode(y.Slice(0, 2*sc.DI()), state, dec, dtRaw.Slice(0, 2*sc.MH), hb, ha, hd, 2, sc)
	ledger := b.TakeLedger()
	if err := b.Sync(); err != nil {
		t.Fatal(err)
	}
	logged := writeLines(t, log)[skip:]
	var mine []Launch
	for _, l := range ledger {
		if l.Kind != KindGEMM && l.Kernel != "memset" {
			mine = append(mine, l)
		}
	}
	if len(logged) != len(mine) {
		t.Fatalf("%d launches in the write log, %d in the ledger", len(logged), len(mine))
	}
	for i, l := range mine {
		name, n, ok := strings.Cut(logged[i], " ")
		bytes, err := strconv.ParseInt(n, 10, 64)
		if !ok || err != nil {
			t.Fatalf("write log line %q", logged[i])
		}
		if name != l.Kernel {
			t.Fatalf("launch %d: the log has %s, the ledger %s (op %s)", i, name, l.Kernel, l.Op)
		}
		if bytes > l.Write {
			t.Errorf("launch %d: %s (op %s) changed %d bytes of device memory, its ledger entry writes %d", i, l.Kernel, l.Op, bytes, l.Write)
		}
	}
	t.Logf("%d launches checked against the write log", len(mine))
}

func writeLines(t *testing.T, path string) []string {
	t.Helper()
	f, err := os.Open(path)
	if os.IsNotExist(err) {
		return nil
	}
	if err != nil {
		t.Fatal(err)
	}
	defer f.Close()
	var out []string
	sc := bufio.NewScanner(f)
	for sc.Scan() {
		out = append(out, sc.Text())
	}
	return out
}
