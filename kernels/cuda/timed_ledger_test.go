//go:build cgo

package cuda

import (
	"fmt"
	"strings"
	"testing"
	"time"
)

// TestTimedLedgerEmu: a timed ledger gives every launch a device time (on
// the emulator a launch runs when it is queued, so each is positive), their
// sum fits the wall time around them, and the ledger otherwise equals the
// untimed one of the same ops; an untimed ledger measures nothing.
func TestTimedLedgerEmu(t *testing.T) {
	b := emuBackend(t, Options{})
	x, _ := b.Alloc(F32, 1<<14)
	defer b.Free(x)
	out, _ := b.Alloc(F32, 1)
	defer b.Free(out)
	ops := func() {
		b.Fill(x, 2)
		for range 3 {
			b.Scale(x, 1.5)
		}
		b.SumSquares(out, x)
	}
	b.StartLedger()
	ops()
	plain := b.TakeLedger()
	t0 := time.Now()
	b.StartTimedLedger()
	ops()
	timed := b.TakeLedger()
	wall := time.Since(t0).Seconds()
	if err := b.Sync(); err != nil {
		t.Fatal(err)
	}
	if len(timed) != len(plain) || len(timed) < 5 {
		t.Fatalf("timed ledger: %d launches, untimed %d (want the same, at least 5)", len(timed), len(plain))
	}
	var sum float64
	for i, l := range timed {
		if !(l.Measured > 0) {
			t.Errorf("launch %d (%s %s): measured %v s, want > 0", i, l.Op, l.Kernel, l.Measured)
		}
		sum += l.Measured
		m := l
		m.Measured = 0
		if m.Kernel != plain[i].Kernel || m.Op != plain[i].Op || m.Read != plain[i].Read || m.Grid != plain[i].Grid {
			t.Errorf("launch %d: timed %+v, untimed %+v", i, m, plain[i])
		}
		if plain[i].Measured != 0 {
			t.Errorf("untimed launch %d measured %v s", i, plain[i].Measured)
		}
	}
	if sum > wall {
		t.Errorf("the launches' measured times add up to %.6f s, more than the %.6f s around them", sum, wall)
	}
	// Each ledger starts afresh: a second timed one has its own events.
	b.StartTimedLedger()
	b.Scale(x, 1)
	if again := b.TakeLedger(); len(again) != 1 || !(again[0].Measured > 0) {
		t.Errorf("a second timed ledger: %+v", again)
	}
	if err := b.Sync(); err != nil {
		t.Fatal(err)
	}
}

// TestTimedLedgerMeter: on the metering device (nothing runs) the timed
// ledger records the same launches, each measured 0, without an error.
func TestTimedLedgerMeter(t *testing.T) {
	be, err := OpenMeter(Options{})
	if err != nil {
		t.Fatal(err)
	}
	b := be.(*Backend)
	defer b.Close()
	x, _ := b.Alloc(F32, 1<<20)
	defer b.Free(x)
	b.StartTimedLedger()
	b.Fill(x, 1)
	b.Scale(x, 2)
	led := b.TakeLedger()
	if err := b.Sync(); err != nil {
		t.Fatal(err)
	}
	if len(led) != 2 || led[0].Measured != 0 || led[1].Measured != 0 {
		t.Errorf("timed ledger on the meter: %+v", led)
	}
}

// TestCompare: Compare's tables add the measured times by part and by op,
// and their ratios to the prediction.
func TestCompare(t *testing.T) {
	led := []Launch{
		{Op: "Matmul", Kernel: "gemm", Kind: KindGEMM, FLOPs: 2 << 40, Measured: 0.004, GEMM: &GemmCall{M: 8192, N: 8192, K: 8192}},
		{Op: "Matmul", Kernel: "gemm", Kind: KindGEMM, FLOPs: 2 << 40, Measured: 0.006, GEMM: &GemmCall{M: 8192, N: 8192, K: 8192}},
		{Op: "Fill", Kernel: "fill", Kind: KindSIMT, Grid: [3]int{1024, 1, 1}, Block: 256, Write: 1 << 30, Measured: 0.001},
	}
	p := H200.PredictLedger(led, nil)
	text := p.Compare(0)
	if !strings.HasPrefix(text, CompareHeader) {
		t.Fatalf("Compare does not start with %q:\n%s", CompareHeader, text)
	}
	if got := p.Measured(); got < 0.011-1e-12 || got > 0.011+1e-12 {
		t.Errorf("Measured = %v, want 0.011", got)
	}
	mm := p.Estimates[0].Seconds + p.Estimates[1].Seconds
	for _, want := range []string{
		"| layer GEMMs (cuBLAS) | 2 | " + f2(1e3*mm) + " | 10.00 | " + f2(0.010/mm) + " |",
		"| Matmul | 2 | " + f2(1e3*mm) + " | 10.00 | " + f2(0.010/mm) + " | flops |",
		"| Fill | 1 | " + f2(1e3*p.Estimates[2].Seconds) + " | 1.00 | " + f2(0.001/p.Estimates[2].Seconds) + " | " + p.Estimates[2].Bound + " |",
		"| **step** | 3 | " + f2(1e3*p.Seconds) + " | 11.00 |",
	} {
		if !strings.Contains(text, want) {
			t.Errorf("Compare lacks %q:\n%s", want, text)
		}
	}
	// The ops by measured time: Matmul (10 ms) before Fill (1 ms).
	if strings.Index(text, "| Matmul |") > strings.Index(text, "| Fill |") {
		t.Errorf("ops not ordered by measured time:\n%s", text)
	}
}

func f2(x float64) string { return fmt.Sprintf("%.2f", x) }

// TestLazyLoadEmu: with TRACEGRPO_CUDA_LOAD=lazy the backend opens with no
// kernel file loaded and loads each at the first launch of one of its
// kernels, once (compute-sanitizer then instruments only those); the ops
// compute as they do with every file loaded at Open, the default. An
// unknown value is refused at Open.
func TestLazyLoadEmu(t *testing.T) {
	t.Setenv(loadEnv, "lazy")
	b := emuBackend(t, Options{})
	if m := b.Modules(); len(m) != 0 {
		t.Fatalf("lazy: %d files loaded at Open, want none", len(m))
	}
	x, _ := b.Alloc(F32, 1000)
	defer b.Free(x)
	out, _ := b.Alloc(F32, 1)
	defer b.Free(out)
	b.Fill(x, 3)
	b.Fill(x, 3)
	b.SumSquares(out, x)
	got := make([]float32, 1)
	b.DownloadF32(got, out)
	if err := b.Sync(); err != nil || got[0] != 9000 {
		t.Fatalf("lazy: SumSquares of 1000 × 3 = %v, %v; want 9000", got[0], err)
	}
	var files []string
	for _, m := range b.Modules() {
		files = append(files, m.File)
	}
	if strings.Join(files, " ") != "csrc/gen_fill.ptx csrc/gen_reduce.ptx" {
		t.Errorf("lazy: loaded %v, want the fill and reduce files, once each", files)
	}
	if line := b.ModulesLine(); !strings.HasPrefix(line, "modules: 2 of ") || !strings.HasSuffix(line, "lazily: fill reduce") {
		t.Errorf("ModulesLine = %q", line)
	}

	t.Setenv(loadEnv, "")
	all := emuBackend(t, Options{})
	if line := all.ModulesLine(); !strings.HasPrefix(line, fmt.Sprintf("modules: %d of %d loaded", len(all.Modules()), len(all.Modules()))) || len(all.Modules()) < 20 {
		t.Errorf("default: ModulesLine = %q", line)
	}
	t.Setenv(loadEnv, "sometimes")
	drv, blas, _, _ := buildEmu()
	if _, err := OpenBackend(Options{DriverLib: drv, BlasLib: blas}); err == nil || !strings.Contains(err.Error(), loadEnv) {
		t.Errorf("%s=sometimes: Open error %v, want one naming the variable", loadEnv, err)
	}
}

// TestSM90aWhatIf: the what-if sm_90a device runs an HMMA kernel at
// cuBLAS's rate (twice mma.sync's) and bounds no kernel by the loads its
// threads keep in flight; a latency-bound launch on the H200 becomes bound
// by its bytes, and nothing else of the device changes.
func TestSM90aWhatIf(t *testing.T) {
	var hmma string
	for k, f := range sm90Facts {
		if f.HMMA > 0 {
			hmma = k
			break
		}
	}
	if hmma == "" {
		t.Fatal("no HMMA kernel in the sm_90 facts")
	}
	mma := Launch{Op: "Attention", Kernel: hmma, Kind: KindMMA, Grid: [3]int{132 * 64, 1, 1}, Block: 128, FLOPs: 1 << 44, Read: 1 << 20, Inflight: 16}
	a, b := H200.Predict(mma, nil), H200SM90a.Predict(mma, nil)
	if a.Bound != "flops" || b.Bound != "flops" || !near(a.Seconds, 2*b.Seconds) {
		t.Errorf("HMMA launch: H200 %v s (%s), sm_90a %v s (%s); want flops-bound, half the time", a.Seconds, a.Bound, b.Seconds, b.Bound)
	}
	// One block of a thread, 1 GiB read: latency-bound on the H200.
	slow := Launch{Op: "Fill", Kernel: "fill", Kind: KindSIMT, Grid: [3]int{1, 1, 1}, Block: 32, Read: 1 << 30, Inflight: 4}
	if e := H200.Predict(slow, nil); e.Bound != "latency" {
		t.Fatalf("H200: %+v, want latency-bound", e)
	}
	if e := H200SM90a.Predict(slow, nil); e.Bound != "bytes" || !near(e.Seconds, float64(1<<30)/H200.CopyBW) {
		t.Errorf("sm_90a: %v s bound by %s, want its bytes at the copy bandwidth", e.Seconds, e.Bound)
	}
	d := H200SM90a
	d.Name, d.MMARate, d.Latency = H200.Name, H200.MMARate, H200.Latency
	if d != H200 {
		t.Errorf("the what-if device differs from the H200 in more than MMARate and Latency:\n%+v\n%+v", d, H200)
	}
}
