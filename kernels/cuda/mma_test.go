//go:build cgo

package cuda

import (
	"math/rand/v2"
	"os"
	"strings"
	"testing"

	"github.com/tracegrpo/tracegrpo/kernels"
	"github.com/tracegrpo/tracegrpo/kernels/cpu"
	"github.com/tracegrpo/tracegrpo/kernels/kerneltest"
)

// tolMMA: a 16-term dot product of bf16 values (exact products) plus an
// fp32 addend, accumulated in fp32 by the tensor core (in double, rounded
// once, by the emulator): a few fp32 ulps of the O(4) sums.
var tolMMA = kerneltest.Tol{Atol: 1e-5, Rtol: 1e-5}

// mmaLayoutCheck runs csrc/mma_selftest.cu's kernels on b with random
// operands and returns a description of every result that disagrees with a
// float64 matrix product ("" when all agree).
func mmaLayoutCheck(t *testing.T, b *Backend, seed uint64) string {
	t.Helper()
	rng := rand.New(rand.NewPCG(seed, 0x3aa))
	bf := func(n int) ([]uint16, []float64) {
		bits, vals := make([]uint16, n), make([]float64, n)
		for i := range bits {
			bits[i] = cpu.F32ToBF16(float32(rng.NormFloat64()))
			vals[i] = float64(cpu.BF16ToF32(bits[i]))
		}
		return bits, vals
	}
	aBits, A := bf(16 * 16)  // (16,16) row-major
	btBits, Bt := bf(8 * 16) // (8,16): Bt[n][k] = B[k][n]
	bBits := make([]uint16, 16*8)
	for k := range 16 {
		for n := range 8 {
			bBits[k*8+n] = btBits[n*16+k]
		}
	}
	C := make([]float32, 16*8)
	for i := range C {
		C[i] = float32(rng.NormFloat64())
	}
	want := func(zeroRows int) []float32 {
		out := make([]float32, 16*8)
		for r := range 16 {
			for n := range 8 {
				s := float64(C[r*8+n])
				if r < 16-zeroRows {
					for k := range 16 {
						s += A[r*16+k] * Bt[n*16+k]
					}
				}
				out[r*8+n] = float32(s)
			}
		}
		return out
	}
	alloc := func(dt kernels.DType, n int) kernels.Buf {
		x, err := b.Alloc(dt, n)
		if err != nil {
			t.Fatal(err)
		}
		t.Cleanup(func() { b.Free(x) })
		return x
	}
	a, bt, bb, c := alloc(kernels.BF16, 256), alloc(kernels.BF16, 128), alloc(kernels.BF16, 128), alloc(F32, 128)
	d, d1, d2 := alloc(F32, 128), alloc(F32, 128), alloc(F32, 128)
	b.UploadBF16(a, aBits)
	b.UploadBF16(bt, btBits)
	b.UploadBF16(bb, bBits)
	b.UploadF32(c, C)
	func() {
		defer b.lock()()
		b.launch("mma_selftest_frag", 1, 1, 1, 32, 0, pa(d), pa(a), pa(bt), pa(c))
		b.launch("mma_selftest_ldmatrix", 1, 1, 1, 32, 0, pa(d1), pa(d2), pa(a), pa(bt), pa(bb), pa(c))
	}()
	var msgs []string
	for _, r := range []struct {
		name string
		buf  kernels.Buf
		want []float32
	}{
		{"mma from lane fragments", d, want(0)},
		{"mma from ldmatrix (cp.async, rows 12-15 zero-filled)", d1, want(4)},
		{"mma from ldmatrix.trans", d2, want(4)},
	} {
		got := make([]float32, 128)
		b.DownloadF32(got, r.buf)
		if msg := kerneltest.Compare(r.want, got, tolMMA); msg != "" {
			msgs = append(msgs, r.name+": "+msg)
		}
	}
	if err := b.Sync(); err != nil {
		t.Fatal(err)
	}
	return strings.Join(msgs, "\n")
}

// TestMMALayoutEmu: the emulated mma.sync, ldmatrix and cp.async compute a
// float64 matrix product from fragments laid out as the PTX ISA says, on
// several random operand sets.
func TestMMALayoutEmu(t *testing.T) {
	b := emuBackend(t, Options{})
	for seed := range uint64(4) {
		if msg := mmaLayoutCheck(t, b, seed); msg != "" {
			t.Errorf("seed %d:\n%s", seed, msg)
		}
	}
}

// TestMMALayoutMutantEmu: the same check on an emulator whose A-fragment
// lane mapping is wrong (built with -DTG_EMU_MMA_MUTANT) must fail, so the
// check above can tell a right layout from a wrong one.
func TestMMALayoutMutantEmu(t *testing.T) {
	drv, blas, skip, err := buildEmuVariant("mutant", []string{"-DTG_EMU_MMA_MUTANT"}, []string{"csrc/mma_selftest.cu"})
	if skip != "" {
		skipNoEmu(t, skip)
	}
	if err != nil {
		t.Fatal(err)
	}
	b, err := OpenBackend(Options{DriverLib: drv, BlasLib: blas, kernelFiles: []string{"csrc/gen_mma_selftest.ptx"}})
	if err != nil {
		t.Fatal(err)
	}
	defer b.Close()
	msg := mmaLayoutCheck(t, b, 1)
	if msg == "" {
		t.Fatal("an emulator with a wrong A-fragment layout passed the layout check")
	}
	if !strings.Contains(msg, "mma from lane fragments") || !strings.Contains(msg, "ldmatrix.trans") {
		t.Errorf("the wrong layout was not caught by every variant:\n%s", msg)
	}
}

// TestMMALayoutGPU: the same kernels on device 0, so the emulator's model
// of the instructions is checked against the hardware.
func TestMMALayoutGPU(t *testing.T) {
	b, err := OpenBackend(Options{})
	if err != nil {
		if os.Getenv("TRACEGRPO_REQUIRE_GPU") == "1" {
			t.Fatalf("no CUDA device: %v", err)
		}
		t.Skipf("no CUDA device: %v", err)
	}
	defer b.Close()
	for seed := range uint64(4) {
		if msg := mmaLayoutCheck(t, b, seed); msg != "" {
			t.Errorf("seed %d:\n%s", seed, msg)
		}
	}
}
