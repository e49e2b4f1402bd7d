//go:build cgo

package cuda

// SwiGLU and SwiGLUBackward: csrc/swiglu.cu.

import "github.com/tracegrpo/tracegrpo/kernels"

// SwiGLU implements kernels.Ops: out (N) = silu(gate)·up.
func (b *Backend) SwiGLU(out, gate, up kernels.Buf, N int) {
	want(out, kernels.F32, N, "SwiGLU out")
	want(gate, kernels.F32, N, "SwiGLU gate")
	want(up, kernels.F32, N, "SwiGLU up")
	defer b.lock()()
	b.elementwise("swiglu_fwd", N, pa(out), pa(gate), pa(up), la(N))
}

// SwiGLUBackward implements kernels.Ops: dgate (N) =, dup (N) =.
func (b *Backend) SwiGLUBackward(dgate, dup, dout, gate, up kernels.Buf, N int) {
	want(dgate, kernels.F32, N, "SwiGLUBackward dgate")
	want(dup, kernels.F32, N, "SwiGLUBackward dup")
	want(dout, kernels.F32, N, "SwiGLUBackward dout")
	want(gate, kernels.F32, N, "SwiGLUBackward gate")
	want(up, kernels.F32, N, "SwiGLUBackward up")
	defer b.lock()()
	b.elementwise("swiglu_bwd", N, pa(dgate), pa(dup), pa(dout), pa(gate), pa(up), la(N))
}
