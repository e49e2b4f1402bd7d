//go:build cgo

package cuda

// SwiGLU and SwiGLUBackward: csrc/swiglu.cu.

import "github.com/tracegrpo/tracegrpo/kernels"

// SwiGLU implements kernels.Ops: out (N) = silu(gate)·up. gate, up
// F32|BF16 (same), out F32|BF16.
func (b *Backend) SwiGLU(out, gate, up kernels.Buf, N int) {
	dt := operands("SwiGLU gate, up", gate, up)
	operands("SwiGLU out", out)
	want(out, out.DType, N, "SwiGLU out")
	want(gate, dt, N, "SwiGLU gate")
	want(up, dt, N, "SwiGLU up")
	name := swigluKernels[[2]kernels.DType{dt, out.DType}]
	defer b.lock()()
	// Two 8-element loads a thread a step (csrc/swiglu.cu).
	b.elementwise(name, rw(reads(gate, up), out).with(8*int64(N), 16*dt.Size()), N, pa(out), pa(gate), pa(up), la(N))
}

// SwiGLUBackward implements kernels.Ops: dgate (N) =, dup (N) =. gate, up
// F32|BF16 (same); dout, dgate, dup F32.
func (b *Backend) SwiGLUBackward(dgate, dup, dout, gate, up kernels.Buf, N int) {
	dt := operands("SwiGLUBackward gate, up", gate, up)
	want(dgate, kernels.F32, N, "SwiGLUBackward dgate")
	want(dup, kernels.F32, N, "SwiGLUBackward dup")
	want(dout, kernels.F32, N, "SwiGLUBackward dout")
	want(gate, dt, N, "SwiGLUBackward gate")
	want(up, dt, N, "SwiGLUBackward up")
	name := "swiglu_bwd"
	if dt == kernels.BF16 {
		name = "swiglu_bwd_bf16"
	}
	defer b.lock()()
	b.elementwise(name, rw(reads(dout, gate, up), dgate, dup).with(12*int64(N), 32+16*dt.Size()), N, pa(dgate), pa(dup), pa(dout), pa(gate), pa(up), la(N))
}

// swigluKernels names SwiGLU's kernel by (operand, output) dtype.
var swigluKernels = map[[2]kernels.DType]string{
	{kernels.F32, kernels.F32}: "swiglu_fwd", {kernels.BF16, kernels.BF16}: "swiglu_fwd_bf16",
	{kernels.BF16, kernels.F32}: "swiglu_fwd_bf16_f32out", {kernels.F32, kernels.BF16}: "swiglu_fwd_f32_bf16out",
}
