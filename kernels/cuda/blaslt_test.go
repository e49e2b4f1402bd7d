//go:build cgo

package cuda

import (
	"math/rand/v2"
	"slices"
	"strings"
	"testing"

	"github.com/google/go-cmp/cmp"
	"github.com/tracegrpo/tracegrpo/kernels"
	"github.com/tracegrpo/tracegrpo/kernels/cpu"
	"github.com/tracegrpo/tracegrpo/kernels/kerneltest"
)

// TestBlasLtLoadsEmu: the backend finds the emulator's cuBLASLt beside its
// cuBLAS, holds its 32 MiB workspace (which its plan counts), and runs
// the GEMMs on it; with BlasLtLib "none" they run on cublasGemmEx, with no
// workspace, and the ledger says which.
func TestBlasLtLoadsEmu(t *testing.T) {
	lt := emuBackend(t, Options{})
	ex := emuBackend(t, Options{BlasLtLib: ltNone})
	if p := lt.Info().BlasLtPath; !strings.HasSuffix(p, "libfakecublasLt.so") {
		t.Fatalf("BlasLtPath = %q, want the emulator's libfakecublasLt.so beside its cuBLAS", p)
	}
	if p := ex.Info().BlasLtPath; p != "" {
		t.Fatalf(`BlasLtPath with BlasLtLib "none" = %q, want ""`, p)
	}
	if !strings.Contains(lt.Info().String(), "GEMMs on cuBLASLt") || !strings.Contains(ex.Info().String(), "GEMMs on cublasGemmEx") {
		t.Errorf("Info strings do not say where the GEMMs run:\n%s\n%s", lt.Info(), ex.Info())
	}
	lLive, _ := lt.Allocated()
	eLive, _ := ex.Allocated()
	if lLive-eLive != ltWorkspace {
		t.Errorf("cuBLASLt backend holds %d bytes at open, GemmEx one %d: want %d more", lLive, eLive, ltWorkspace)
	}
	var w kernels.Workload
	if d := lt.PlanWorkspace(w) - ex.PlanWorkspace(w); d != ltWorkspace {
		t.Errorf("plans differ by %d bytes, want the workspace's %d", d, ltWorkspace)
	}
	if PlanWorkspace(w, Options{}) != lt.PlanWorkspace(w) {
		t.Errorf("a plan made without a device (%d) does not count the workspace the cuBLASLt backend holds (%d)",
			PlanWorkspace(w, Options{}), lt.PlanWorkspace(w))
	}
	for _, c := range []struct {
		b  *Backend
		lt bool
	}{{lt, true}, {ex, false}} {
		T, C, OC := 5, 8, 3
		inp, _ := c.b.Alloc(F32, T*C)
		wt, _ := c.b.Alloc(F32, OC*C)
		out, _ := c.b.Alloc(F32, T*OC)
		sum, _ := c.b.Alloc(F32, T*OC)
		c.b.StartLedger()
		c.b.Matmul(out, inp, wt, T, C, OC)
		c.b.MatmulAdd(sum, out, inp, wt, T, C, OC)
		c.b.MatmulAdd(out, out, inp, wt, T, C, OC) // in place: C is D, no epilogue
		led := c.b.TakeLedger()
		if err := c.b.Sync(); err != nil {
			t.Fatal(err)
		}
		var gemms []GemmCall
		for _, l := range led {
			if l.GEMM != nil {
				gemms = append(gemms, *l.GEMM)
			}
		}
		want := []GemmCall{
			{TransA: true, M: OC, N: T, K: C, AB: F32, C: F32, Lt: c.lt},
			{TransA: true, M: OC, N: T, K: C, AB: F32, C: F32, Beta: 1, Lt: c.lt, Epilogue: epilogueResidual},
			{TransA: true, M: OC, N: T, K: C, AB: F32, C: F32, Beta: 1, Lt: c.lt},
		}
		if !c.lt {
			// On cublasGemmEx the residual is copied into out, then
			// accumulated.
			want[1].Epilogue = ""
		}
		if !slices.Equal(gemms, want) {
			t.Errorf("lt=%v: GEMMs in the ledger %v, want %v", c.lt, gemms, want)
		}
	}
}

// TestBlasLtConformanceGemmExEmu runs the GEMM cases of the conformance
// suite with cuBLASLt off: the fallback (cublasGemmEx, the residual
// copied into out first) against the CPU. TestConformanceEmu runs them
// on cuBLASLt.
func TestBlasLtConformanceGemmExEmu(t *testing.T) {
	b := emuBackend(t, Options{BlasLtLib: ltNone})
	kerneltest.RunOptions(t, func() kernels.Backend { return noClose{b} },
		kerneltest.Options{Reduced: true, Cases: []string{"Matmul", "MatmulBackwardFresh", "MatmulAdd", "MatmulBF16"}})
}

// TestBlasLtBitwiseRerunEmu: every GEMM is planned once, at its first
// call, and reruns with the plan's algorithm and the fixed workspace, so
// a step's GEMMs give the same bits every time. The emulator's heuristic
// offers another algorithm (another split of K, other bits) at each
// query, so a backend that asked again would not rerun bitwise.
func TestBlasLtBitwiseRerunEmu(t *testing.T) {
	b := emuBackend(t, Options{})
	rng := rand.New(rand.NewPCG(36, 4))
	type mm struct{ T, C, OC int }
	shapes := []mm{{37, 64, 33}, {16, 300, 8}, {5, 17, 70}}
	up := func(dt kernels.DType, n int) kernels.Buf {
		x, err := b.Alloc(dt, n)
		if err != nil {
			t.Fatal(err)
		}
		v := make([]float32, n)
		for i := range v {
			v[i] = float32(rng.NormFloat64())
		}
		if dt == kernels.BF16 {
			h := make([]uint16, n)
			for i, f := range v {
				h[i] = cpu.F32ToBF16(f)
			}
			b.UploadBF16(x, h)
		} else {
			b.UploadF32(x, v)
		}
		return x
	}
	var bufs [][]kernels.Buf // per shape: inp, w, res, dout, inp16, w16, dout16
	for _, s := range shapes {
		bufs = append(bufs, []kernels.Buf{up(F32, s.T*s.C), up(F32, s.OC*s.C), up(F32, s.T*s.OC), up(F32, s.T*s.OC),
			up(kernels.BF16, s.T*s.C), up(kernels.BF16, s.OC*s.C), up(kernels.BF16, s.T*s.OC)})
	}
	step := func() [][]float32 {
		var got [][]float32
		for i, s := range shapes {
			x := bufs[i]
			out, _ := b.Alloc(F32, s.T*s.OC)
			sum, _ := b.Alloc(F32, s.T*s.OC)
			dinp, _ := b.Alloc(kernels.BF16, s.T*s.C)
			dw, _ := b.Alloc(F32, s.OC*s.C)
			b.Matmul(out, x[0], x[1], s.T, s.C, s.OC)
			b.MatmulAdd(sum, x[2], x[0], x[1], s.T, s.C, s.OC)
			b.MatmulBackwardFresh(dinp, dw, x[6], x[4], x[5], s.T, s.C, s.OC)
			for _, o := range []kernels.Buf{out, sum, dinp, dw} {
				h := make([]float32, o.N)
				if o.DType == kernels.BF16 {
					u := make([]uint16, o.N)
					b.DownloadBF16(u, o)
					for j := range u {
						h[j] = cpu.BF16ToF32(u[j])
					}
				} else {
					b.DownloadF32(h, o)
				}
				got = append(got, h)
				b.Free(o)
			}
		}
		if err := b.Sync(); err != nil {
			t.Fatal(err)
		}
		return got
	}
	first := step()
	planned := b.d.lt.queries
	if planned != len(b.d.lt.plans) {
		t.Fatalf("%d heuristic queries for %d plans: want one each", planned, len(b.d.lt.plans))
	}
	split := 0
	for _, p := range b.d.lt.plans {
		if !p.found {
			t.Errorf("a GEMM found no algorithm on the emulator")
		}
		if p.p.res.algo[1] != 1 {
			split++
		}
	}
	if split == 0 {
		t.Fatalf("no plan split K: the rerun below could not tell a re-planned GEMM")
	}
	for r := range 3 {
		again := step()
		for i := range first {
			for j := range first[i] {
				if first[i][j] != again[i][j] && !(first[i][j] != first[i][j] && again[i][j] != again[i][j]) {
					t.Fatalf("rerun %d: output %d element %d = %v, first run %v: not bitwise", r+1, i, j, again[i][j], first[i][j])
				}
			}
		}
	}
	if b.d.lt.queries != planned {
		t.Errorf("the reruns asked the heuristic %d more times: every GEMM must keep its first plan", b.d.lt.queries-planned)
	}
}

// TestLedgerMatmulAddMeter: MatmulAdd and a bf16 fresh dinp in the ledger,
// against their arithmetic: one cuBLASLt GEMM each, 2·T·C·OC FLOPs, the
// operands read once, the residual read (its dtype's bytes) and the output
// written in its own dtype (bf16: half the bytes of fp32).
func TestLedgerMatmulAddMeter(t *testing.T) {
	be, err := OpenMeter(Options{})
	if err != nil {
		t.Fatal(err)
	}
	b := be.(*Backend)
	defer b.Close()
	T, C, OC := 96, 64, 40
	for _, c := range []struct{ ab, out kernels.DType }{{F32, F32}, {kernels.BF16, F32}, {kernels.BF16, kernels.BF16}} {
		inp, _ := b.Alloc(c.ab, T*C)
		w, _ := b.Alloc(c.ab, OC*C)
		res, _ := b.Alloc(c.out, T*OC)
		out, _ := b.Alloc(c.out, T*OC)
		dout, _ := b.Alloc(c.ab, T*OC)
		dinp, _ := b.Alloc(kernels.BF16, T*C)
		b.StartLedger()
		b.MatmulAdd(out, res, inp, w, T, C, OC)
		if c.ab == kernels.BF16 {
			b.MatmulBackwardFresh(dinp, kernels.Buf{}, dout, inp, w, T, C, OC)
		}
		led := b.TakeLedger()
		ab, o := int64(c.ab.Size()), int64(c.out.Size())
		want := []Launch{{Op: "MatmulAdd", Kernel: "gemm", Kind: KindGEMM, Read: int64(T*C+OC*C)*ab + int64(T*OC)*o, Write: int64(T*OC) * o,
			FLOPs: int64(2 * T * C * OC), Inflight: 16,
			GEMM: &GemmCall{TransA: true, M: OC, N: T, K: C, AB: c.ab, C: c.out, Beta: 1, Lt: true, Epilogue: epilogueResidual}}}
		if c.ab == kernels.BF16 {
			want = append(want, Launch{Op: "MatmulBackwardFresh", Kernel: "gemm", Kind: KindGEMM, Read: int64(OC*C+T*OC) * 2, Write: int64(T*C) * 2,
				FLOPs: int64(2 * T * C * OC), Inflight: 16, GEMM: &GemmCall{M: C, N: T, K: OC, AB: kernels.BF16, C: kernels.BF16, Lt: true}})
		}
		if d := cmp.Diff(want, led); d != "" {
			t.Errorf("%s->%s: ledger (-want +got):\n%s", c.ab, c.out, d)
		}
	}
	if err := b.Sync(); err != nil {
		t.Fatal(err)
	}
}
