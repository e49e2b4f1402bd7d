package cpu

// SIMD path selection: which micro-kernel computes the packed gemm
// (gemm_fast.go), chosen once at start-up for the machine.
//
// # Paths and rounding paths
//
// There are three micro-kernel paths. avx512 and avx2 are the generated
// assembly kernels of gen_kernels_amd64.s; go is the portable kernel. The two
// assembly kernels compute every element of C the same way: one fused
// multiply-add per k, in k order, starting from zero, for each K block of
// gemmKC, the block sums then added to C in block order. They are therefore
// bit-identical (TestKernelsMatchScalarModel and TestGemmMatchesScalarModel
// check each against a scalar model of exactly that, TestFMAPathsBitIdentical
// every op on both), and which of them runs is a matter of speed only:
// together they are the rounding path "fma". The go kernel rounds the product
// and the sum separately, and the elementwise ops use expf instead of the
// AVX2 vector exp: rounding path "go".
//
// How the Go compiler rounds the rest of the package also matters: on arm64,
// and on amd64 built with GOAMD64=v3 or later, it fuses a·b+c into one FMA
// where the source allows it. So a rounding path names the kernel family
// and the compilation target: "fma-amd64", "fma-amd64.v3", "go-amd64",
// "go-arm64". Equal rounding paths mean bit-identical results for any thread
// count; a run resumed under another one says so (trainer/ckpt.go).
//
// # The choice
//
// TRACEGRPO_CPU_SIMD=avx512|avx2|go forces a path (an error if the CPU cannot
// run it, or for any other value). Otherwise the CPU's vendor and family
// decide, by the table below: the AVX-512 kernel where cores execute 512-bit
// FMAs at full width (Intel; AMD Zen 5 desktop and server), AVX2 where they
// split them into two 256-bit halves (AMD Zen 4, where BenchmarkMicroKernel
// measured AVX-512 slower; Zen 5 mobile). A CPU with AVX-512 that the
// table does not know gets a short calibration (both kernels timed on
// L1-resident panels, the faster chosen); since both round the same, a
// calibration that picks differently from one start to the next changes
// speed, never results. The start-up line prints the path and the reason
// (SIMD.String).

import (
	"errors"
	"fmt"
	"os"
	"runtime"
	"strings"
)

// CPUFacts is what the selection reads from the CPU (cpuid and xgetbv on
// amd64); tests inject their own.
type CPUFacts struct {
	Vendor string // cpuid leaf 0: "GenuineIntel", "AuthenticAMD", ...
	Family int    // display family (base + extended)
	Model  int    // display model (extended model folded in)
	Brand  string // processor brand string, trimmed
	AVX2   bool   // AVX2 and FMA3, with the OS saving ymm state
	AVX512 bool   // AVX-512F, with the OS saving zmm state
}

func (f CPUFacts) String() string {
	name := f.Brand
	if name == "" {
		name = "unknown CPU"
	}
	if f.Vendor == "" {
		return name
	}
	return fmt.Sprintf("%s (%s family %d model %d)", name, f.Vendor, f.Family, f.Model)
}

// SIMD is the micro-kernel path a process runs and why.
type SIMD struct {
	Path     string   // "avx512", "avx2" or "go": the micro-kernel
	Rounding string   // rounding path (see the package comment above)
	Reason   string   // why this path, for the start-up line
	CPU      CPUFacts // the host as the selection saw it
	// Err is set when TRACEGRPO_CPU_SIMD asks for something the CPU cannot
	// run or names no path; Path is then the one chosen without it.
	Err error
}

// String is the start-up line's account: path, CPU, reason, rounding path.
func (s SIMD) String() string {
	return fmt.Sprintf("SIMD %s on %s: %s; rounding path %s", s.Path, s.CPU, s.Reason, s.Rounding)
}

// ErrSIMDEnv is the error of a TRACEGRPO_CPU_SIMD the CPU cannot honour.
var ErrSIMDEnv = errors.New("cpu: TRACEGRPO_CPU_SIMD")

// simdEnv is the environment variable that forces a path.
const simdEnv = "TRACEGRPO_CPU_SIMD"

// simd is this process's choice; the package's kernels follow it.
var simd = chooseSIMD(hostFacts(), os.Getenv(simdEnv), calibrateAVX512)

func init() { applySIMD(simd.Path) }

// SIMDChoice returns the path this process runs, why, and any error in
// TRACEGRPO_CPU_SIMD (commands refuse to start on it).
func SIMDChoice() SIMD { return simd }

// Features names the SIMD path this process uses ("avx512", "avx2" or "go").
func (b *Backend) Features() string { return simd.Path }

// RoundingPath names how this backend's results round (kernels.Numerics):
// two backends with the same rounding path give bit-identical results.
func (b *Backend) RoundingPath() string { return simd.Rounding }

// KernelPath says which micro-kernel runs on which CPU (kernels.Numerics;
// the reason, which may hold a calibration's timings, is left out so that
// the same host names the same kernel path every time).
func (b *Backend) KernelPath() string {
	return fmt.Sprintf("%s kernel on %s", simd.Path, simd.CPU)
}

// useVecExp selects the AVX2 vector exp in expScaleShift (rounding path
// fma).
var useVecExp bool

// applySIMD points the gemm and the exp at path's kernels.
func applySIMD(path string) {
	switch path {
	case "avx512":
		kernel12x32, useVecExp = kernel12x32AVX512, true
	case "avx2":
		kernel12x32, useVecExp = kernel12x32AVX2, true
	default:
		kernel12x32, useVecExp = kernel12x32Go, false
	}
}

// roundingPath is the rounding path of a micro-kernel path in this build.
func roundingPath(path string) string {
	family := "go"
	if path == "avx512" || path == "avx2" {
		family = "fma"
	}
	return family + "-" + goTarget
}

// goTarget names the compilation target as far as rounding goes: the
// architecture, and on amd64 whether the compiler fuses multiply-adds
// (GOAMD64=v3 and later; see target_amd64v3.go).
var goTarget = func() string {
	if runtime.GOARCH == "amd64" && goFusesAMD64 {
		return "amd64.v3"
	}
	return runtime.GOARCH
}()

// widthRule is one row of the vendor/family table: on these CPUs with
// AVX-512, whether the AVX-512 kernel is the faster one, and why.
type widthRule struct {
	vendor         string
	family         int
	modelLo, model int // inclusive model range; 0, 0xff for all
	avx512         bool
	why            string
}

// widthRules is the vendor/family table, first match wins. Zen 5 mobile
// (Strix Point, models 0x20-0x2f; Krackan Point, 0x60-0x6f) keeps Zen 4's
// 256-bit datapath; Zen 5 server and desktop (Turin, Granite Ridge) and
// Strix Halo have full 512-bit units.
//
// Measured: on an AMD EPYC of family 26 model 2 (Zen 5, 2 cores) the FMA
// peak loops run 2.1x as fast with zmm as with ymm (MeasurePeak), and the
// bench step took 0.6x the avx2 path's time on the avx512 path; on the
// project's Zen 4 hosts the AVX-512 kernel measured slower than AVX2; on an
// Intel Xeon @ 2.0 GHz (issue 39) avx512 took 5.7 s a step against 7.8 s.
var widthRules = []widthRule{
	{"AuthenticAMD", 0x19, 0, 0xff, false, "AMD family 25 (Zen 4) splits each 512-bit FMA into two 256-bit halves; the AVX-512 kernel measured slower there"},
	{"AuthenticAMD", 0x1a, 0x20, 0x2f, false, "AMD family 26 models 0x20-0x2f (Zen 5 mobile) split each 512-bit FMA into two 256-bit halves"},
	{"AuthenticAMD", 0x1a, 0x60, 0x6f, false, "AMD family 26 models 0x60-0x6f (Zen 5 mobile) split each 512-bit FMA into two 256-bit halves"},
	{"AuthenticAMD", 0x1a, 0, 0xff, true, "AMD family 26 (Zen 5) executes 512-bit FMAs at full width"},
	{"GenuineIntel", -1, 0, 0xff, true, "Intel cores with AVX-512 execute 512-bit FMAs natively"},
}

// chooseSIMD picks the path for CPU f under the environment value env.
// calibrate times the AVX-512 kernel against the AVX2 one for CPUs the
// table does not know (true: AVX-512 is faster) and says what it measured.
func chooseSIMD(f CPUFacts, env string, calibrate func() (bool, string)) SIMD {
	s := SIMD{CPU: f}
	s.Path, s.Reason = autoPath(f, calibrate)
	switch env {
	case "":
	case "avx512", "avx2", "go":
		ok := env == "go" || (env == "avx2" && f.AVX2) || (env == "avx512" && f.AVX512)
		if !ok {
			s.Err = fmt.Errorf("%w=%s: %s cannot run it (%s); unset it to use %s", ErrSIMDEnv, env, f, missing(f, env), s.Path)
			break
		}
		s.Path, s.Reason = env, fmt.Sprintf("forced by %s=%s; the CPU alone would choose %s", simdEnv, env, s.Path)
	default:
		s.Err = fmt.Errorf("%w=%q: want avx512, avx2 or go (or unset it: the path is then chosen for the CPU)", ErrSIMDEnv, env)
	}
	s.Rounding = roundingPath(s.Path)
	return s
}

// missing says what CPU f lacks for path.
func missing(f CPUFacts, path string) string {
	switch {
	case !hasAsm:
		return fmt.Sprintf("this build (%s) has no assembly kernels", goTarget)
	case path == "avx512":
		return "no AVX-512F usable: the CPU or the OS lacks it"
	default:
		return "no AVX2 and FMA3 usable: the CPU or the OS lacks them"
	}
}

// autoPath is the path chosen for f without TRACEGRPO_CPU_SIMD.
func autoPath(f CPUFacts, calibrate func() (bool, string)) (path, why string) {
	switch {
	case !hasAsm:
		return "go", fmt.Sprintf("this build (%s) has no assembly kernels", goTarget)
	case !f.AVX2:
		return "go", "the CPU has no usable AVX2 and FMA3"
	case !f.AVX512:
		return "avx2", "the CPU has AVX2 and FMA3 but no usable AVX-512"
	}
	for _, r := range widthRules {
		if r.vendor == f.Vendor && (r.family < 0 || r.family == f.Family) && f.Model >= r.modelLo && f.Model <= r.model {
			if r.avx512 {
				return "avx512", r.why
			}
			return "avx2", r.why
		}
	}
	faster, measured := calibrate()
	why = fmt.Sprintf("%s family %d is not in the vendor/family table; calibrated: %s", orUnknown(f.Vendor), f.Family, measured)
	if faster {
		return "avx512", why
	}
	return "avx2", why
}

func orUnknown(s string) string {
	if strings.TrimSpace(s) == "" {
		return "unknown vendor"
	}
	return s
}
