//go:build !amd64 || purego

package cpu

// hasAsm says whether this build has the assembly kernels.
const hasAsm = false

func hostFacts() CPUFacts { return CPUFacts{} }

func calibrateAVX512() (bool, string) { panic("unreachable") }

func kernel12x32AVX512(k int, a, b, c *float32, ldc int, acc int) { panic("unreachable") }
func kernel12x32AVX2(k int, a, b, c *float32, ldc int, acc int)   { panic("unreachable") }

func expScaleShiftAVX2(x *float32, n int, scale, shift float32) float32 { panic("unreachable") }

func fmaPeakAVX512(n int) { panic("unreachable") }
func fmaPeakAVX2(n int)   { panic("unreachable") }
