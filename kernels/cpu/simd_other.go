//go:build !amd64 || purego

package cpu

func detectSIMD() (avx2fma, avx512 bool) { return false, false }

func kernel12x32AVX512(k int, a, b, c *float32, ldc int, acc int) { panic("unreachable") }
func kernel12x32AVX2(k int, a, b, c *float32, ldc int, acc int)   { panic("unreachable") }

func expScaleShiftAVX2(x *float32, n int, scale, shift float32) float32 { panic("unreachable") }
