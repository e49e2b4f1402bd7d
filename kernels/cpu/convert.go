package cpu

// Convert and the bfloat16 storage of the BF16 op variants.
//
//	Convert:  dst (N) = src (N) in dst's dtype   =
//	          F32 → BF16 rounds to nearest even (NaN stays a quiet NaN),
//	          BF16 → F32 is exact, the same dtype copies.
//
// Every op that accepts BF16 buffers (kernels package doc) computes in fp32
// here: BF16 inputs are widened into scratch, the fp32 kernel runs, and a
// BF16 output is rounded once. This is the reference the CUDA backend's
// tensor-core paths are checked against; the CPU trains in fp32 itself.

import (
	"fmt"

	"github.com/tracegrpo/tracegrpo/internal/safetensors"
	"github.com/tracegrpo/tracegrpo/kernels"
)

// BF16ToF32 widens bfloat16 bits exactly (safetensors' conversion, which
// the weights are read with).
func BF16ToF32(u uint16) float32 { return safetensors.BF16ToF32(u) }

// F32ToBF16 rounds to the nearest bfloat16, ties to even; NaN stays a quiet
// NaN (as csrc/cast.cu, and as safetensors writes bf16 weights).
func F32ToBF16(f float32) uint16 { return safetensors.F32ToBF16(f) }

// Convert implements kernels.Ops.
// Shapes: dst, src (N), any of F32 and BF16.
func (b *Backend) Convert(dst, src kernels.Buf) {
	if dst.N != src.N {
		panic(fmt.Sprintf("cpu: Convert of %d elements into %d", src.N, dst.N))
	}
	switch {
	case dst.DType == src.DType && dst.DType == kernels.F32:
		copy(b.F32(dst), b.F32(src))
	case dst.DType == src.DType && dst.DType == kernels.BF16:
		copy(b.BF16(dst), b.BF16(src))
	case dst.DType == kernels.BF16 && src.DType == kernels.F32:
		d, s := b.BF16(dst), b.F32(src)
		for i, x := range s {
			d[i] = F32ToBF16(x)
		}
	case dst.DType == kernels.F32 && src.DType == kernels.BF16:
		d, s := b.F32(dst), b.BF16(src)
		for i, x := range s {
			d[i] = BF16ToF32(x)
		}
	default:
		panic(fmt.Sprintf("cpu: Convert %s → %s", src.DType, dst.DType))
	}
}

// in returns buf's n elements as float32: the F32 storage itself, or BF16
// widened into the scratch slot named what (valid until the op returns).
func (b *Backend) in(buf kernels.Buf, n int, what string) []float32 {
	if buf.DType != kernels.BF16 {
		return b.f32n(buf, n, what)
	}
	s := b.BF16(buf)
	if len(s) != n {
		panic(fmt.Sprintf("cpu: %s has %d elements, want %d", what, len(s), n))
	}
	w := b.bf16Slot(what, n)
	for i, x := range s {
		w[i] = BF16ToF32(x)
	}
	return w
}

// out returns where an assigned (=) output of n elements is computed: buf
// itself when F32, else an fp32 scratch slot that done then rounds into
// buf (no closure, so the BF16 variants allocate nothing per call either).
func (b *Backend) out(buf kernels.Buf, n int, what string) []float32 {
	if buf.DType != kernels.BF16 {
		return b.f32n(buf, n, what)
	}
	if d := b.BF16(buf); len(d) != n {
		panic(fmt.Sprintf("cpu: %s has %d elements, want %d", what, len(d), n))
	}
	return b.bf16Slot(what, n)
}

// done rounds the fp32 result w of an op into its BF16 output buf; for an
// F32 output, w is buf itself and there is nothing to do.
func (b *Backend) done(buf kernels.Buf, w []float32) {
	if buf.DType != kernels.BF16 {
		return
	}
	d := b.BF16(buf)
	for i, x := range w {
		d[i] = F32ToBF16(x)
	}
}

// same panics unless the buffers share one dtype (the kernels contract's
// "same").
func same(op string, bufs ...kernels.Buf) {
	for _, x := range bufs[1:] {
		if x.DType != bufs[0].DType {
			panic(fmt.Sprintf("cpu: %s: operands of %s and %s (they must share one dtype)", op, bufs[0].DType, x.DType))
		}
	}
}

// bf16Slot is an fp32 scratch slice for the BF16 variants, kept per name.
func (b *Backend) bf16Slot(what string, n int) []float32 {
	if b.bf16Scratch == nil {
		b.bf16Scratch = map[string][]float32{}
	}
	s := b.bf16Scratch[what]
	if cap(s) < n {
		s = make([]float32, n)
		b.bf16Scratch[what] = s
	}
	return s[:n]
}
