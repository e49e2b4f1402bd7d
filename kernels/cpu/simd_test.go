package cpu

import (
	"errors"
	"fmt"
	"math"
	"math/big"
	"math/rand/v2"
	"os"
	"slices"
	"strconv"
	"strings"
	"testing"

	"github.com/google/go-cmp/cmp"
)

// simdPaths lists the paths this CPU can run: the chosen one first.
func simdPaths() []string {
	paths := []string{simd.Path}
	for _, p := range []string{"avx512", "avx2", "go"} {
		if _, ok := availableKernels()[p]; ok && p != simd.Path {
			paths = append(paths, p)
		}
	}
	return paths
}

// usePath switches the package's kernels to path until t ends.
func usePath(t testing.TB, path string) {
	t.Helper()
	applySIMD(path)
	t.Cleanup(func() { applySIMD(simd.Path) })
}

// Injected CPUs for the selection table.
var (
	zen4    = CPUFacts{Vendor: "AuthenticAMD", Family: 0x19, Model: 0x11, Brand: "AMD EPYC 9654", AVX2: true, AVX512: true}
	zen3    = CPUFacts{Vendor: "AuthenticAMD", Family: 0x19, Model: 0x01, Brand: "AMD EPYC 7763", AVX2: true}
	turin   = CPUFacts{Vendor: "AuthenticAMD", Family: 0x1a, Model: 0x02, Brand: "AMD EPYC", AVX2: true, AVX512: true}
	granite = CPUFacts{Vendor: "AuthenticAMD", Family: 0x1a, Model: 0x44, Brand: "AMD Ryzen 9 9950X", AVX2: true, AVX512: true}
	strix   = CPUFacts{Vendor: "AuthenticAMD", Family: 0x1a, Model: 0x24, Brand: "AMD Ryzen AI 9 HX 370", AVX2: true, AVX512: true}
	krackan = CPUFacts{Vendor: "AuthenticAMD", Family: 0x1a, Model: 0x60, Brand: "AMD Ryzen AI 7 350", AVX2: true, AVX512: true}
	xeon    = CPUFacts{Vendor: "GenuineIntel", Family: 6, Model: 0x55, Brand: "Intel(R) Xeon(R) CPU @ 2.00GHz", AVX2: true, AVX512: true}
	alder   = CPUFacts{Vendor: "GenuineIntel", Family: 6, Model: 0x97, Brand: "12th Gen Intel(R) Core(TM) i9-12900K", AVX2: true}
	oldCPU  = CPUFacts{Vendor: "GenuineIntel", Family: 6, Model: 0x2a, Brand: "Intel(R) Core(TM) i7-2600"}
	zen6    = CPUFacts{Vendor: "AuthenticAMD", Family: 0x1b, Model: 0x00, Brand: "AMD future", AVX2: true, AVX512: true}
	hygon   = CPUFacts{Vendor: "HygonGenuine", Family: 0x18, Model: 0x04, Brand: "Hygon C86", AVX2: true, AVX512: true}
)

// TestChooseSIMD: the vendor/family table, the calibration of CPUs it does
// not know, and TRACEGRPO_CPU_SIMD, with injected CPU facts.
func TestChooseSIMD(t *testing.T) {
	cases := []struct {
		name       string
		cpu        CPUFacts
		env        string
		calibrate  bool // what the calibration measures (AVX-512 faster)
		want       string
		calibrated bool   // whether the calibration must run
		reason     string // in the reason
		err        string // in the error ("" none)
	}{
		{name: "zen4 splits 512-bit FMAs", cpu: zen4, want: "avx2", reason: "Zen 4"},
		{name: "zen3 has no AVX-512", cpu: zen3, want: "avx2", reason: "no usable AVX-512"},
		{name: "zen5 server", cpu: turin, want: "avx512", reason: "family 26 (Zen 5) executes 512-bit FMAs at full width"},
		{name: "zen5 desktop", cpu: granite, want: "avx512", reason: "full width"},
		{name: "zen5 mobile strix", cpu: strix, want: "avx2", reason: "models 0x20-0x2f (Zen 5 mobile)"},
		{name: "zen5 mobile krackan", cpu: krackan, want: "avx2", reason: "models 0x60-0x6f (Zen 5 mobile)"},
		{name: "intel avx512", cpu: xeon, want: "avx512", reason: "Intel"},
		{name: "intel without avx512", cpu: alder, want: "avx2", reason: "no usable AVX-512"},
		{name: "no avx2", cpu: oldCPU, want: "go", reason: "no usable AVX2"},
		{name: "unknown family calibrates to avx512", cpu: zen6, calibrate: true, want: "avx512", calibrated: true, reason: "AuthenticAMD family 27 is not in the vendor/family table; calibrated: measured"},
		{name: "unknown vendor calibrates to avx2", cpu: hygon, calibrate: false, want: "avx2", calibrated: true, reason: "HygonGenuine family 24 is not in"},
		{name: "env forces go", cpu: turin, env: "go", want: "go", reason: "forced by TRACEGRPO_CPU_SIMD=go; the CPU alone would choose avx512"},
		{name: "env forces avx2 on zen5", cpu: turin, env: "avx2", want: "avx2", reason: "forced by TRACEGRPO_CPU_SIMD=avx2"},
		{name: "env forces avx512 on zen4", cpu: zen4, env: "avx512", want: "avx512", reason: "forced by TRACEGRPO_CPU_SIMD=avx512; the CPU alone would choose avx2"},
		{name: "env forces avx512 on zen3", cpu: zen3, env: "avx512", want: "avx2", err: "TRACEGRPO_CPU_SIMD=avx512: AMD EPYC 7763 (AuthenticAMD family 25 model 1) cannot run it (no AVX-512F usable"},
		{name: "env forces avx2 without it", cpu: oldCPU, env: "avx2", want: "go", err: "cannot run it (no AVX2 and FMA3 usable"},
		{name: "env names no path", cpu: turin, env: "AVX512", want: "avx512", err: `TRACEGRPO_CPU_SIMD="AVX512": want avx512, avx2 or go`},
		{name: "env forcing skips calibration's choice", cpu: zen6, env: "avx2", calibrate: true, want: "avx2", calibrated: true, reason: "the CPU alone would choose avx512"},
	}
	for _, c := range cases {
		t.Run(c.name, func(t *testing.T) {
			calls := 0
			cal := func() (bool, string) { calls++; return c.calibrate, "measured" }
			s := chooseSIMD(c.cpu, c.env, cal)
			want, calibrated := c.want, c.calibrated
			if !hasAsm { // a build without the assembly kernels runs go
				want, calibrated = "go", false
			}
			if s.Path != want {
				t.Errorf("path %s, want %s (reason %q)", s.Path, want, s.Reason)
			}
			if got := calls > 0; got != calibrated {
				t.Errorf("calibration ran %d times, want it to run: %v", calls, calibrated)
			}
			if hasAsm && c.reason != "" && !strings.Contains(s.Reason, c.reason) {
				t.Errorf("reason %q does not say %q", s.Reason, c.reason)
			}
			if s.Rounding != roundingPath(s.Path) {
				t.Errorf("rounding %q, want %q", s.Rounding, roundingPath(s.Path))
			}
			if c.err == "" {
				if s.Err != nil {
					t.Errorf("error %v, want none", s.Err)
				}
				return
			}
			if !errors.Is(s.Err, ErrSIMDEnv) || (hasAsm && !strings.Contains(s.Err.Error(), c.err)) {
				t.Errorf("error %v, want ErrSIMDEnv saying %q", s.Err, c.err)
			}
		})
	}
}

// TestRoundingPaths: the two assembly kernels share one rounding path, the
// go kernel has another, and both name the compilation target.
func TestRoundingPaths(t *testing.T) {
	if roundingPath("avx512") != roundingPath("avx2") {
		t.Errorf("avx512 rounds as %s, avx2 as %s: want one rounding path", roundingPath("avx512"), roundingPath("avx2"))
	}
	if roundingPath("go") == roundingPath("avx2") {
		t.Errorf("go and avx2 share rounding path %s", roundingPath("go"))
	}
	for _, p := range []string{"avx512", "avx2", "go"} {
		if r := roundingPath(p); !strings.HasSuffix(r, "-"+goTarget) {
			t.Errorf("rounding path of %s is %q: it does not name the target %s", p, r, goTarget)
		}
	}
	s := chooseSIMD(turin, "", nil)
	if line := s.String(); !strings.Contains(line, "SIMD "+s.Path) || !strings.Contains(line, s.Reason) || !strings.Contains(line, "rounding path "+s.Rounding) {
		t.Errorf("start-up line %q lacks the path, the reason or the rounding path", line)
	}
}

// TestHostFacts: what cpuid says about this machine is self-consistent and
// the kernels it allows run.
func TestHostFacts(t *testing.T) {
	f := hostFacts()
	t.Logf("host: %s, AVX2 %v, AVX-512 %v; %s", f, f.AVX2, f.AVX512, simd)
	if !hasAsm {
		return
	}
	if f.Vendor == "" || f.Family == 0 {
		t.Errorf("cpuid gave vendor %q family %d", f.Vendor, f.Family)
	}
	if f.AVX512 && !f.AVX2 {
		t.Error("AVX-512 without AVX2")
	}
	if f != simd.CPU {
		t.Errorf("hostFacts %+v, the selection saw %+v", f, simd.CPU)
	}
	// Linux decodes cpuid itself: its account is an independent check of
	// the vendor, the family and model arithmetic and the usable vector
	// extensions (the kernel clears a flag the OS does not enable).
	info, err := os.ReadFile("/proc/cpuinfo")
	if err != nil {
		t.Logf("no /proc/cpuinfo (%v): the facts are not cross-checked", err)
		return
	}
	first := map[string]string{}
	for _, l := range strings.Split(string(info), "\n") {
		k, v, ok := strings.Cut(l, ":")
		if k = strings.TrimSpace(k); ok && first[k] == "" {
			first[k] = strings.TrimSpace(v)
		}
	}
	flags := " " + first["flags"] + " "
	want := CPUFacts{Vendor: first["vendor_id"], Brand: strings.Join(strings.Fields(first["model name"]), " "),
		AVX2: strings.Contains(flags, " avx2 ") && strings.Contains(flags, " fma "), AVX512: strings.Contains(flags, " avx512f ")}
	want.Family, _ = strconv.Atoi(first["cpu family"])
	want.Model, _ = strconv.Atoi(first["model"])
	if d := cmp.Diff(want, f); d != "" {
		t.Errorf("cpuid disagrees with /proc/cpuinfo (-cpuinfo +cpuid):\n%s", d)
	}
}

// fma32 is a·b+c rounded once to float32 (what VFMADD231PS computes per
// lane). math.FMA rounds the exact value to float64; rounding that to
// float32 is the exact value's rounding unless it landed exactly on a
// float32 midpoint (a float32 rounding boundary is a float64, so the exact
// value cannot lie across one from its float64 rounding), and those are
// settled exactly.
func fma32(a, b, c float32) float32 {
	r := math.FMA(float64(a), float64(b), float64(c))
	f := float32(r)
	d := r - float64(f)
	if d == 0 || math.IsInf(r, 0) || math.IsNaN(r) {
		return f
	}
	n := math.Nextafter32(f, float32(math.Copysign(math.Inf(1), d)))
	if 2*d != float64(n)-float64(f) {
		return f
	}
	x := new(big.Float).SetPrec(1024).SetFloat64(float64(a))
	x.Mul(x, new(big.Float).SetFloat64(float64(b)))
	x.Add(x, new(big.Float).SetFloat64(float64(c)))
	f, _ = x.Float32()
	return f
}

func TestFMA32(t *testing.T) {
	// 1 + 2⁻²⁴ is a float32 midpoint; a·b = 1 + 2⁻²⁴ + 2⁻⁴⁸ lies above it
	// by less than half a float64 ulp, so math.FMA rounds it onto the
	// midpoint and a double rounding would go down to 1.
	x, y := float32(1+1.0/(1<<23)), float32(1+1.0/(1<<23)) // (1+2⁻²³)² = 1 + 2⁻²² + 2⁻⁴⁶
	if got, want := fma32(x, y, 0), float32(1+1.0/(1<<22)); got != want {
		t.Errorf("fma32(%v, %v, 0) = %v, want %v", x, y, got, want)
	}
	// 2⁻²⁴·(1+2⁻²³) + 1: exact 1 + 2⁻²⁴ + 2⁻⁴⁷, above the midpoint 1 + 2⁻²⁴:
	// rounds up to 1 + 2⁻²³; the float64 FMA keeps 2⁻⁴⁷ (53 bits suffice).
	p, q := float32(1.0/(1<<24)), float32(1+1.0/(1<<23))
	if got, want := fma32(p, q, 1), float32(1+1.0/(1<<23)); got != want {
		t.Errorf("fma32(%v, %v, 1) = %v, want %v", p, q, got, want)
	}
	// Midpoint after the float64 rounding: a·b+c = 1 + 2⁻²⁴ + 2⁻⁸⁰ needs
	// 81 bits; float64 rounds it to the midpoint 1 + 2⁻²⁴, which ties to
	// even (1) unless settled exactly (1 + 2⁻²³).
	p2, q2 := float32(1.0/(1<<24)), float32(1+1.0/(1<<23))
	c2 := float32(1 - 1.0/(1<<24)) // 1 − 2⁻²⁴
	// p2·q2 + c2 = 2⁻²⁴ + 2⁻⁴⁷ + 1 − 2⁻²⁴ = 1 + 2⁻⁴⁷: far from a midpoint.
	if got, want := fma32(p2, q2, c2), float32(1); got != want {
		t.Errorf("fma32(%v, %v, %v) = %v, want %v", p2, q2, c2, got, want)
	}
	// Against the exact computation on random inputs of every magnitude.
	r := rand.New(rand.NewPCG(7, 7))
	for i := 0; i < 20000; i++ {
		a, b, c := randF32(r), randF32(r), randF32(r)
		x := new(big.Float).SetPrec(1024).SetFloat64(float64(a))
		x.Mul(x, new(big.Float).SetFloat64(float64(b)))
		x.Add(x, new(big.Float).SetFloat64(float64(c)))
		want, _ := x.Float32()
		if got := fma32(a, b, c); math.Float32bits(got) != math.Float32bits(want) && !(got == 0 && want == 0) {
			t.Fatalf("fma32(%g, %g, %g) = %g, exact rounding %g", a, b, c, got, want)
		}
	}
}

// randF32 is a random float32 with a random sign, mantissa and an exponent
// within ±40 (so products and sums stay normal).
func randF32(r *rand.Rand) float32 {
	m := 1 + r.Float64()
	return float32(math.Ldexp(m, r.IntN(81)-40) * float64(1-2*r.IntN(2)))
}

// kernelModel is the scalar model of a micro-kernel path: each C element's
// k products summed in k order from zero (fused, or product then sum
// rounded separately), then stored or added to C.
func kernelModel(fused bool, k int, a, b, c []float32, ldc int, acc bool) {
	for r := 0; r < gemmMR; r++ {
		for j := 0; j < gemmNR; j++ {
			var s float32
			for p := 0; p < k; p++ {
				if fused {
					s = fma32(a[p*gemmMR+r], b[p*gemmNR+j], s)
				} else {
					s += float32(a[p*gemmMR+r] * b[p*gemmNR+j])
				}
			}
			if acc {
				c[r*ldc+j] += s
			} else {
				c[r*ldc+j] = s
			}
		}
	}
}

// TestKernelsMatchScalarModel: every micro-kernel this CPU runs computes
// exactly, bit for bit, its rounding path's scalar model: the fma kernels
// one FMA per k from zero, the go kernel a rounded product and a rounded
// sum per k. Values span many magnitudes, so any other order, any split
// accumulator or any extra rounding shows.
func TestKernelsMatchScalarModel(t *testing.T) {
	for name, kern := range availableKernels() {
		fused := name != "go"
		for _, k := range []int{1, 2, 7, 64, gemmKC} {
			for _, acc := range []bool{false, true} {
				t.Run(fmt.Sprintf("%s/k%d/acc%v", name, k, acc), func(t *testing.T) {
					r := rand.New(rand.NewPCG(uint64(k), 3))
					a, b := make([]float32, k*gemmMR), make([]float32, k*gemmNR)
					for i := range a {
						a[i] = randF32(r)
					}
					for i := range b {
						b[i] = randF32(r)
					}
					const ldc = gemmNR + 3
					c := make([]float32, gemmMR*ldc)
					for i := range c {
						c[i] = randF32(r)
					}
					want := slices.Clone(c)
					kernelModel(fused, k, a, b, want, ldc, acc)
					flag := 0
					if acc {
						flag = 1
					}
					kern(k, &a[0], &b[0], &c[0], ldc, flag)
					for i := range want {
						if math.Float32bits(c[i]) != math.Float32bits(want[i]) {
							t.Fatalf("C[%d][%d] = %g, the model gives %g", i/ldc, i%ldc, c[i], want[i])
						}
					}
				})
			}
		}
	}
}

// gemmModel is the scalar model of the packed gemm on a rounding path: per
// element, each K block of gemmKC summed as kernelModel does, the blocks
// added to C (or the first stored) in order.
func gemmModel(fused bool, transA, transB bool, M, N, K int, A []float32, lda int, B []float32, ldb int, C []float32, ldc int, acc bool) {
	for i := 0; i < M; i++ {
		for j := 0; j < N; j++ {
			c := C[i*ldc+j]
			for k0 := 0; k0 < K; k0 += gemmKC {
				var s float32
				for k := k0; k < min(K, k0+gemmKC); k++ {
					ia, ib := i*lda+k, k*ldb+j
					if transA {
						ia = k*lda + i
					}
					if transB {
						ib = j*ldb + k
					}
					a, b := A[ia], B[ib]
					if fused {
						s = fma32(a, b, s)
					} else {
						s += float32(a * b)
					}
				}
				if acc || k0 > 0 {
					c += s
				} else {
					c = s
				}
			}
			C[i*ldc+j] = c
		}
	}
}

// TestGemmMatchesScalarModel: the whole packed product (packing, edge
// tiles, K blocks, output tiles over the pool) on every path equals its
// rounding path's scalar model bit for bit, so every fma path gives the
// same bits as every other.
func TestGemmMatchesScalarModel(t *testing.T) {
	// Every transpose and = / += on small shapes; the big one (several
	// output tiles both ways, so op(A) and op(B) are packed once for all
	// tiles, and two K blocks) as Matmul's three products use it.
	type gcase struct {
		M, N, K        int
		transA, transB bool
		acc            bool
	}
	var cases []gcase
	for _, s := range []struct{ M, N, K int }{{13, 33, 7}, {25, 70, 300}} {
		for _, tr := range [][2]bool{{false, false}, {false, true}, {true, false}, {true, true}} {
			for _, acc := range []bool{false, true} {
				cases = append(cases, gcase{s.M, s.N, s.K, tr[0], tr[1], acc})
			}
		}
	}
	cases = append(cases, gcase{193, 257, 300, false, true, false}, gcase{193, 257, 300, false, false, true}, gcase{193, 257, 300, true, false, true})
	for _, c := range cases {
		t.Run(fmt.Sprintf("M%d_N%d_K%d_tA%v_tB%v_acc%v", c.M, c.N, c.K, c.transA, c.transB, c.acc), func(t *testing.T) {
			r := rand.New(rand.NewPCG(uint64(c.M), uint64(c.K)))
			lda, ldb, ldc := c.K+3, c.N+2, c.N+5
			rowsA, rowsB := c.M, c.K
			if c.transA {
				lda, rowsA = c.M+3, c.K
			}
			if c.transB {
				ldb, rowsB = c.K+2, c.N
			}
			A, B, C0 := to32(randVec(r, rowsA*lda, 1)), to32(randVec(r, rowsB*ldb, 1)), to32(randVec(r, c.M*ldc, 1))
			want := map[bool][]float32{} // by fused
			for _, path := range simdPaths() {
				fused := path != "go"
				if want[fused] == nil {
					want[fused] = slices.Clone(C0)
					gemmModel(fused, c.transA, c.transB, c.M, c.N, c.K, A, lda, B, ldb, want[fused], ldc, c.acc)
				}
				usePath(t, path)
				C := slices.Clone(C0)
				newEnv(t, 3).b.parallelGemm(c.transA, c.transB, c.M, c.N, c.K, A, lda, B, ldb, C, ldc, c.acc)
				for i, w := range want[fused] {
					if math.Float32bits(C[i]) != math.Float32bits(w) {
						t.Errorf("%s: C[%d][%d] = %g, the model gives %g", path, i/ldc, i%ldc, C[i], w)
						break
					}
				}
			}
		})
	}
}

// TestFMAPathsBitIdentical: every op gives the same bits on every path of
// one rounding path (avx512 and avx2), so choosing between them for speed
// never changes a result.
func TestFMAPathsBitIdentical(t *testing.T) {
	var fma []string
	for _, p := range simdPaths() {
		if roundingPath(p) == roundingPath("avx2") {
			fma = append(fma, p)
		}
	}
	if len(fma) < 2 {
		t.Skipf("this CPU runs one fma path (%v): nothing to compare", fma)
	}
	slices.Sort(fma)
	for _, oc := range opCases(1) {
		t.Run(oc.name, func(t *testing.T) {
			var want map[string][]float32
			for _, p := range fma {
				usePath(t, p)
				got := oc.run(newEnv(t, 2), rand.New(rand.NewPCG(23, 23)), false)
				if want == nil {
					want = got
					continue
				}
				for name, w := range want {
					g := got[name]
					for i := range w {
						if math.Float32bits(g[i]) != math.Float32bits(w[i]) {
							t.Errorf("%s: %s[%d] = %v, %s gave %v", p, name, i, g[i], fma[0], w[i])
							break
						}
					}
				}
			}
		})
	}
}

// TestMeasurePeak: the peak loops run and report a positive rate for every
// width this CPU has (no timing is asserted).
func TestMeasurePeak(t *testing.T) {
	peaks := MeasurePeak(2, 1)
	want := len(peakLoops(simd.CPU))
	if len(peaks) != want {
		t.Fatalf("%d peaks, want %d", len(peaks), want)
	}
	for _, p := range peaks {
		t.Logf("%s: %.1f GFLOP/s per thread, %.1f on %d threads", p.Width, p.PerThread, p.Concurrent, p.Threads)
		if !(p.PerThread > 0 && p.Concurrent > 0) || p.GFLOPS() < p.Concurrent || p.GFLOPS() < 2*p.PerThread {
			t.Errorf("%s: implausible peak %+v", p.Width, p)
		}
	}
}
