//go:build cgo

package cuda

import (
	"fmt"
	"math"
	"math/rand/v2"
	"os"
	"strings"
	"testing"

	"github.com/tracegrpo/tracegrpo/kernels"
	"github.com/tracegrpo/tracegrpo/kernels/cpu"
)

// mmaULPs bounds how far mma.sync's D = A·B + C may be from the exact sum,
// in units of 2^-23·(|c| + Σ|a·b|): the 16 products of bf16 values are
// exact, and the tensor core adds them and the addend in at most 16 fp32
// steps, each off by less than one fp32 ulp of the partial sum whether it
// rounds to nearest (the emulator) or truncates (the hardware aligns the
// products to the largest exponent and drops the bits below). So the bound
// holds for any order and grouping of the additions, on either; a wrong
// fragment layout is off by O(1).
const mmaULPs = 17

// mmaCompare checks got (16,8) against the exact D = A·B + C (row-major A
// (16,16), Bt (8,16), C (16,8); rows from 16-zeroRows on take no product)
// within mmaULPs, and describes the first mismatches ("" when all agree).
func mmaCompare(A, Bt []float64, C []float32, zeroRows int, got []float32) string {
	var bad []string
	worst := 0.0
	for r := range 16 {
		for n := range 8 {
			want, mag := float64(C[r*8+n]), math.Abs(float64(C[r*8+n]))
			if r < 16-zeroRows {
				for k := range 16 {
					want += A[r*16+k] * Bt[n*16+k]
					mag += math.Abs(A[r*16+k] * Bt[n*16+k])
				}
			}
			bound := mmaULPs * 0x1p-23 * mag
			d := math.Abs(float64(got[r*8+n]) - want)
			worst = max(worst, d/bound)
			if !(d <= bound) && len(bad) < 4 {
				bad = append(bad, fmt.Sprintf("D[%d][%d] = %g, exact %g (|Δ| %.3g > %.3g)", r, n, got[r*8+n], want, d, bound))
			}
		}
	}
	if len(bad) == 0 {
		return ""
	}
	return fmt.Sprintf("%s; the worst is %.3g times the bound", strings.Join(bad, "; "), worst)
}

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
		b.launch("mma_selftest_frag", cost{}, 1, 1, 1, 32, 0, pa(d), pa(a), pa(bt), pa(c))
		b.launch("mma_selftest_ldmatrix", cost{}, 1, 1, 1, 32, 0, pa(d1), pa(d2), pa(a), pa(bt), pa(bb), pa(c))
	}()
	var msgs []string
	for _, r := range []struct {
		name     string
		buf      kernels.Buf
		zeroRows int
	}{
		{"mma from lane fragments", d, 0},
		{"mma from ldmatrix (cp.async, rows 12-15 zero-filled)", d1, 4},
		{"mma from ldmatrix.trans", d2, 4},
	} {
		got := make([]float32, 128)
		b.DownloadF32(got, r.buf)
		if err := b.Sync(); err != nil {
			t.Fatal(err)
		}
		if msg := mmaCompare(A, Bt, C, r.zeroRows, got); msg != "" {
			msgs = append(msgs, r.name+": "+msg)
		}
	}
	return strings.Join(msgs, "\n")
}

// TestMMAAccumulatesFP32Emu: the emulated mma.sync rounds its additions in
// fp32, as a tensor core does, instead of summing exactly: with the addend
// 2^24 (whose fp32 ulp is 2) and two products of 1, it gives 2^24, where
// an exact sum gives 2^24 + 2. The layout check's bound (mmaULPs) is then
// measured against a rounding emulator, not an exact one.
func TestMMAAccumulatesFP32Emu(t *testing.T) {
	b := emuBackend(t, Options{})
	one := cpu.F32ToBF16(1)
	aBits, btBits := make([]uint16, 16*16), make([]uint16, 8*16)
	aBits[0], aBits[1] = one, one   // A row 0: 1, 1, 0, ...
	btBits[0], btBits[1] = one, one // B column 0: 1, 1, 0, ...
	C := make([]float32, 16*8)
	C[0] = 1 << 24
	alloc := func(dt kernels.DType, n int) kernels.Buf {
		x, err := b.Alloc(dt, n)
		if err != nil {
			t.Fatal(err)
		}
		t.Cleanup(func() { b.Free(x) })
		return x
	}
	a, bt, c, d := alloc(kernels.BF16, 256), alloc(kernels.BF16, 128), alloc(F32, 128), alloc(F32, 128)
	b.UploadBF16(a, aBits)
	b.UploadBF16(bt, btBits)
	b.UploadF32(c, C)
	func() {
		defer b.lock()()
		b.launch("mma_selftest_frag", cost{}, 1, 1, 1, 32, 0, pa(d), pa(a), pa(bt), pa(c))
	}()
	got := make([]float32, 128)
	b.DownloadF32(got, d)
	if err := b.Sync(); err != nil {
		t.Fatal(err)
	}
	if got[0] != 1<<24 {
		t.Errorf("mma.sync of 2^24 + 1·1 + 1·1 = %.0f, want %d (fp32 steps; %d is the exact sum)", got[0], 1<<24, 1<<24+2)
	}
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
	t.Logf("device: %s", b.Info())
	t.Log(b.ModulesLine()) // gpu-check's preflight: the cubins loaded, nothing to JIT
	for seed := range uint64(4) {
		if msg := mmaLayoutCheck(t, b, seed); msg != "" {
			t.Errorf("seed %d:\n%s", seed, msg)
		}
	}
}
