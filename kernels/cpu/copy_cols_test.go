package cpu

import (
	"fmt"
	"math/rand/v2"
	"testing"

	"github.com/tracegrpo/tracegrpo/kernels"
)

// TestCopyColsProperty checks CopyCols against its definition on random
// shapes, strides, offsets and dtype pairs, over 1 and 3 threads: every
// element of each row block is the source element (converted with
// Convert's rounding), and nothing outside the blocks changes.
func TestCopyColsProperty(t *testing.T) {
	r := rand.New(rand.NewPCG(11, 12))
	for _, threads := range []int{1, 3} {
		b := New(threads)
		defer b.Close()
		for trial := range 300 {
			R, W := r.IntN(40), 1+r.IntN(70)
			ds, ss := W+r.IntN(20), W+r.IntN(20)
			if trial%7 == 0 {
				W = elemGrain + 3 // rows wider than a grain
				ds, ss = W, W+5
			}
			doff, soff := r.IntN(9), r.IntN(9)
			dN, sN := doff+max(0, (R-1)*ds+W), soff+max(0, (R-1)*ss+W)
			dt := [2]kernels.DType{kernels.F32, kernels.BF16}
			ddt, sdt := dt[r.IntN(2)], dt[r.IntN(2)]
			src := randomBuf(t, b, r, sdt, sN)
			dst := randomBuf(t, b, r, ddt, dN)
			before := widen(b, dst)
			srcv := widen(b, src)
			b.CopyCols(dst.Slice(doff, dN-doff), src.Slice(soff, sN-soff), R, W, ds, ss)
			got := widen(b, dst)
			want := append([]float32(nil), before...)
			for i := range R {
				for j := range W {
					x := srcv[soff+i*ss+j]
					if ddt == kernels.BF16 {
						x = BF16ToF32(F32ToBF16(x))
					}
					want[doff+i*ds+j] = x
				}
			}
			tag := fmt.Sprintf("threads %d trial %d: %s ← %s R=%d W=%d ds=%d ss=%d", threads, trial, ddt, sdt, R, W, ds, ss)
			for i := range want {
				if got[i] != want[i] {
					t.Fatalf("%s: element %d = %v, want %v", tag, i, got[i], want[i])
				}
			}
			b.Free(src)
			b.Free(dst)
		}
	}
}

func randomBuf(t *testing.T, b *Backend, r *rand.Rand, dt kernels.DType, n int) kernels.Buf {
	buf, err := b.Alloc(dt, n)
	if err != nil {
		t.Fatal(err)
	}
	if dt == kernels.F32 {
		for i := range b.F32(buf) {
			b.F32(buf)[i] = float32(r.NormFloat64())
		}
	} else {
		for i := range b.BF16(buf) {
			b.BF16(buf)[i] = F32ToBF16(float32(r.NormFloat64()))
		}
	}
	return buf
}

func widen(b *Backend, buf kernels.Buf) []float32 {
	if buf.DType == kernels.F32 {
		return append([]float32(nil), b.F32(buf)...)
	}
	out := make([]float32, buf.N)
	for i, x := range b.BF16(buf) {
		out[i] = BF16ToF32(x)
	}
	return out
}

// TestCopyColsRefusesBadShapes: a block that runs past either buffer, or a
// stride below the width, is a programmer error and panics, naming it.
func TestCopyColsRefusesBadShapes(t *testing.T) {
	b := New(1)
	defer b.Close()
	small, _ := b.Alloc(kernels.F32, 10)
	big, _ := b.Alloc(kernels.F32, 100)
	for _, c := range []struct {
		dst, src     kernels.Buf
		R, W, ds, ss int
		want         string
	}{
		{big, small, 3, 4, 4, 4, "src has 10 elements"}, {small, big, 2, 4, 8, 4, "dst has 10 elements"},
		{big, big, 2, 4, 3, 4, "strides 3 and 4"},
	} {
		func() {
			defer func() {
				msg := fmt.Sprint(recover())
				if msg == "<nil>" || !contains(msg, c.want) {
					t.Errorf("CopyCols R=%d W=%d strides %d,%d: panic %q, want one containing %q", c.R, c.W, c.ds, c.ss, msg, c.want)
				}
			}()
			b.CopyCols(c.dst, c.src, c.R, c.W, c.ds, c.ss)
		}()
	}
}
