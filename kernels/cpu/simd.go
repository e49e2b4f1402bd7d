package cpu

import "os"

// SIMD path selection. At start-up the package picks the AVX2+FMA
// micro-kernel when the CPU and OS support it, else the portable Go one. The
// AVX-512 kernel is opt-in (TRACEGRPO_CPU_SIMD=avx512): on this project's
// AMD Zen 4 machines, which split 512-bit FMAs into two 256-bit halves, it
// measured slower than the AVX2 kernel (BenchmarkMicroKernel), and a choice
// that depends only on the instruction set keeps results reproducible across
// machines that have AVX2. TRACEGRPO_CPU_SIMD=avx2|go caps the choice. Results are bit-identical
// for a given path and any thread count; different paths round differently.
var simdPath = selectSIMD(os.Getenv("TRACEGRPO_CPU_SIMD"))

// useVecExp selects the AVX2 vector exp in expScaleShift.
var useVecExp bool

func selectSIMD(want string) string {
	avx2, avx512 := detectSIMD()
	useVecExp = avx2 && want != "go"
	switch {
	case avx512 && want == "avx512":
		kernel12x32 = kernel12x32AVX512
		return "avx512"
	case avx2 && (want == "" || want == "avx512" || want == "avx2"):
		kernel12x32 = kernel12x32AVX2
		return "avx2"
	}
	kernel12x32 = kernel12x32Go
	return "go"
}

// Features names the SIMD path this process uses ("avx512", "avx2" or "go").
func (b *Backend) Features() string { return simdPath }
