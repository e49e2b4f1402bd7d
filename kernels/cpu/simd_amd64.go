//go:build amd64 && !purego

package cpu

//go:generate go run ./internal/asmgen/cmd -out gen_kernels_amd64.s

func cpuid(eaxArg, ecxArg uint32) (eax, ebx, ecx, edx uint32)
func xgetbv() (eax, edx uint32)

//go:noescape
func kernel12x32AVX512(k int, a, b, c *float32, ldc int, acc int)

//go:noescape
func kernel12x32AVX2(k int, a, b, c *float32, ldc int, acc int)

// detectSIMD reports which vector extensions the CPU and OS support.
func detectSIMD() (avx2fma, avx512 bool) {
	maxID, _, _, _ := cpuid(0, 0)
	if maxID < 7 {
		return false, false
	}
	_, _, ecx1, _ := cpuid(1, 0)
	osxsave := ecx1&(1<<27) != 0
	fma := ecx1&(1<<12) != 0
	if !osxsave {
		return false, false
	}
	xcr0, _ := xgetbv()
	_, ebx7, _, _ := cpuid(7, 0)
	avxOS := xcr0&0x6 == 0x6
	avx2fma = avxOS && fma && ebx7&(1<<5) != 0
	avx512 = avx2fma && xcr0&0xe6 == 0xe6 && ebx7&(1<<16) != 0
	return avx2fma, avx512
}

//go:noescape
func expScaleShiftAVX2(x *float32, n int, scale, shift float32) float32
