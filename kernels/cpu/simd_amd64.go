//go:build amd64 && !purego

package cpu

import (
	"fmt"
	"strings"
	"time"
)

//go:generate go run ./internal/asmgen/cmd -out gen_kernels_amd64.s

// hasAsm says whether this build has the assembly kernels.
const hasAsm = true

func cpuid(eaxArg, ecxArg uint32) (eax, ebx, ecx, edx uint32)
func xgetbv() (eax, edx uint32)

//go:noescape
func kernel12x32AVX512(k int, a, b, c *float32, ldc int, acc int)

//go:noescape
func kernel12x32AVX2(k int, a, b, c *float32, ldc int, acc int)

//go:noescape
func expScaleShiftAVX2(x *float32, n int, scale, shift float32) float32

func fmaPeakAVX512(n int)
func fmaPeakAVX2(n int)

// hostFacts reads the CPU's vendor, family, model, brand and usable vector
// extensions.
func hostFacts() CPUFacts {
	var f CPUFacts
	maxID, b, c, d := cpuid(0, 0)
	f.Vendor = regString(b, d, c)
	if maxID >= 1 {
		eax1, _, ecx1, _ := cpuid(1, 0)
		f.Family = int(eax1>>8) & 0xf
		f.Model = int(eax1>>4) & 0xf
		if f.Family == 0xf {
			f.Family += int(eax1>>20) & 0xff
		}
		if f.Family == 0x6 || f.Family >= 0xf {
			f.Model += (int(eax1>>16) & 0xf) << 4
		}
		if maxID >= 7 && ecx1&(1<<27) != 0 { // OSXSAVE
			fma := ecx1&(1<<12) != 0
			xcr0, _ := xgetbv()
			_, ebx7, _, _ := cpuid(7, 0)
			f.AVX2 = xcr0&0x6 == 0x6 && fma && ebx7&(1<<5) != 0
			f.AVX512 = f.AVX2 && xcr0&0xe6 == 0xe6 && ebx7&(1<<16) != 0
		}
	}
	if maxExt, _, _, _ := cpuid(0x80000000, 0); maxExt >= 0x80000004 {
		var s []string
		for leaf := uint32(0x80000002); leaf <= 0x80000004; leaf++ {
			a, b, c, d := cpuid(leaf, 0)
			s = append(s, regString(a, b, c, d))
		}
		f.Brand = strings.Join(strings.Fields(strings.TrimRight(strings.Join(s, ""), "\x00")), " ")
	}
	return f
}

// regString is the bytes of registers r, little-endian, in order.
func regString(r ...uint32) string {
	b := make([]byte, 0, 4*len(r))
	for _, x := range r {
		b = append(b, byte(x), byte(x>>8), byte(x>>16), byte(x>>24))
	}
	return strings.TrimRight(string(b), "\x00")
}

// calibrateAVX512 times the two assembly micro-kernels on L1-resident
// panels, alternating, and says whether AVX-512 is faster (best of 5 rounds
// each, about 10 ms in all). Only a CPU with AVX-512 that the vendor/family
// table does not know runs it.
func calibrateAVX512() (bool, string) {
	const k, calls = gemmKC, 64
	a, b, c := make([]float32, k*gemmMR), make([]float32, k*gemmNR), make([]float32, gemmMR*gemmNR)
	best := func(kern microKernel, cur time.Duration) time.Duration {
		t0 := time.Now()
		for i := 0; i < calls; i++ {
			kern(k, &a[0], &b[0], &c[0], gemmNR, 1)
		}
		return min(cur, time.Since(t0))
	}
	t512, t2 := time.Hour, time.Hour
	for round := 0; round < 5; round++ {
		t512 = best(kernel12x32AVX512, t512)
		t2 = best(kernel12x32AVX2, t2)
	}
	gflops := func(d time.Duration) float64 { return 2 * gemmMR * gemmNR * k * calls / d.Seconds() / 1e9 }
	return t512 < t2, fmt.Sprintf("micro-kernel avx512 %.0f GFLOP/s, avx2 %.0f GFLOP/s on one thread", gflops(t512), gflops(t2))
}
