//go:build cgo

package cuda

import (
	"fmt"
	"math"
	"os"
	"testing"

	"github.com/tracegrpo/tracegrpo/kernels"
)

// bf16RoundingCases are fp32 bit patterns and the bfloat16 each must round
// to, worked out by hand from the definition (nearest, ties to the even
// last bit; NaN stays NaN, made quiet), not from any implementation: the
// ties are exactly half a bf16 ulp from two neighbours.
var bf16RoundingCases = []struct {
	name string
	f32  uint32
	bf16 uint16
}{
	{"1.00390625, a tie, down to even 1.0", 0x3f808000, 0x3f80},
	{"1.01171875, a tie, up to even", 0x3f818000, 0x3f82},
	{"-1.00390625, a tie, down in magnitude", 0xbf808000, 0xbf80},
	{"-1.01171875, a tie, up in magnitude", 0xbf818000, 0xbf82},
	{"just above the tie", 0x3f808001, 0x3f81},
	{"just below the tie", 0x3f807fff, 0x3f80},
	{"a tie carrying into the exponent", 0x3fff8000, 0x4000},
	{"a tie above the largest finite, to infinity", 0x7f7f8000, 0x7f80},
	{"below that tie, the largest finite", 0x7f7f7fff, 0x7f7f},
	{"a subnormal tie, down to zero", 0x00008000, 0x0000},
	{"a subnormal tie, up to even", 0x00018000, 0x0002},
	{"-0", 0x80000000, 0x8000},
	{"+inf", 0x7f800000, 0x7f80},
	{"-inf", 0xff800000, 0xff80},
	{"a quiet NaN", 0x7fc00001, 0x7fc0},
	{"a signalling NaN, made quiet", 0x7f800001, 0x7fc0},
	{"a NaN whose payload would round to infinity", 0x7f808000, 0x7fc0},
}

// checkBF16Rounding rounds bf16RoundingCases to bf16 on b through the
// kernels' device rounding (csrc/bf16.cuh's tg_round, which every bf16
// output of a kernel is stored through: CopyCols F32 → BF16 calls it alone)
// and through Convert (csrc/cast.cu's own copy), widens the results back
// exactly and compares bits.
func checkBF16Rounding(t *testing.T, b *Backend) {
	n := len(bf16RoundingCases)
	src := make([]float32, n)
	for i, c := range bf16RoundingCases {
		src[i] = math.Float32frombits(c.f32)
	}
	alloc := func(dt kernels.DType) kernels.Buf {
		x, err := b.Alloc(dt, n)
		if err != nil {
			t.Fatal(err)
		}
		t.Cleanup(func() { b.Free(x) })
		return x
	}
	x := alloc(kernels.F32)
	b.UploadF32(x, src)
	for _, path := range []struct {
		name  string
		round func(dst, src kernels.Buf)
	}{
		{"CopyCols (bf16.cuh tg_round)", func(dst, src kernels.Buf) { b.CopyCols(dst, src, 1, n, n, n) }},
		{"Convert (cast.cu)", b.Convert},
	} {
		t.Run(path.name, func(t *testing.T) {
			h, back := alloc(kernels.BF16), alloc(kernels.F32)
			path.round(h, x)
			b.CopyCols(back, h, 1, n, n, n) // widening is exact
			got := make([]float32, n)
			b.DownloadF32(got, back)
			if err := b.Sync(); err != nil {
				t.Fatal(err)
			}
			for i, c := range bf16RoundingCases {
				g := math.Float32bits(got[i])
				if g != uint32(c.bf16)<<16 {
					t.Errorf("%s: %#08x rounds to %s, want %#04x", c.name, c.f32, bits16(g), c.bf16)
				}
			}
		})
	}
}

// bits16 shows a widened bf16 result: its 16 bits, or the fp32 bits when
// the low half is not zero (then the widening was not exact).
func bits16(u uint32) string {
	if u&0xffff != 0 {
		return fmt.Sprintf("fp32 %#08x (not a widened bf16)", u)
	}
	return fmt.Sprintf("%#04x", u>>16)
}

// TestBF16RoundsTiesToEvenEmu: the device rounding to bf16, compiled from
// the real csrc/ by the emulator, rounds ties to even (1.00390625 to
// 0x3f80, not 0x3f81), overflows to infinity, and keeps NaN a quiet NaN.
// The kernels' outputs are otherwise tested on random data, where ties
// almost never occur.
func TestBF16RoundsTiesToEvenEmu(t *testing.T) {
	checkBF16Rounding(t, emuBackend(t, Options{}))
}

// TestBF16RoundsTiesToEvenGPU: the same on CUDA device 0.
func TestBF16RoundsTiesToEvenGPU(t *testing.T) {
	b, err := OpenBackend(Options{})
	if err != nil {
		if os.Getenv("TRACEGRPO_REQUIRE_GPU") == "1" {
			t.Fatalf("no CUDA device: %v", err)
		}
		t.Skipf("no CUDA device: %v", err)
	}
	t.Cleanup(func() { b.Close() })
	checkBF16Rounding(t, b)
}
