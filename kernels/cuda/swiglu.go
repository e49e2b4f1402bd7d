//go:build cgo

package cuda

// SwiGLU and SwiGLUBackward, SwiGLURows and SwiGLURowsBackward:
// csrc/swiglu.cu.

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

// SwiGLURows implements kernels.Ops: out (R,I) = silu(gate)·up over gu
// (R,2I), row r's I gate values then its I up values. gu F32|BF16, out
// F32|BF16.
func (b *Backend) SwiGLURows(out, gu kernels.Buf, R, I int) {
	dt := operands("SwiGLURows gu", gu)
	operands("SwiGLURows out", out)
	want(out, out.DType, R*I, "SwiGLURows out")
	want(gu, dt, 2*R*I, "SwiGLURows gu")
	name := swigluRowsFwd[[2]kernels.DType{dt, out.DType}]
	defer b.lock()()
	// Two 8-element loads a thread a step (csrc/swiglu.cu).
	b.elementwise(name, rw(reads(gu), out).with(8*int64(R*I), 16*dt.Size()), R*I, pa(out), pa(gu), la(R), la(I))
}

// SwiGLURowsBackward implements kernels.Ops: dgu (R,2I) = row r's dgate
// then its dup, in dgu's dtype. gu F32|BF16, dgu F32|BF16, dout F32.
func (b *Backend) SwiGLURowsBackward(dgu, dout, gu kernels.Buf, R, I int) {
	dt := operands("SwiGLURowsBackward gu", gu)
	operands("SwiGLURowsBackward dgu", dgu)
	want(dgu, dgu.DType, 2*R*I, "SwiGLURowsBackward dgu")
	want(dout, kernels.F32, R*I, "SwiGLURowsBackward dout")
	want(gu, dt, 2*R*I, "SwiGLURowsBackward gu")
	name := swigluRowsBwd[[2]kernels.DType{dt, dgu.DType}]
	defer b.lock()()
	b.elementwise(name, rw(reads(dout, gu), dgu).with(12*int64(R*I), 32+16*dt.Size()), R*I, pa(dgu), pa(dout), pa(gu), la(R), la(I))
}

// swigluRowsFwd and swigluRowsBwd name the rows kernels by (gu, output)
// dtype.
var (
	swigluRowsFwd = map[[2]kernels.DType]string{
		{kernels.F32, kernels.F32}: "swiglu_rows_fwd", {kernels.BF16, kernels.BF16}: "swiglu_rows_fwd_bf16",
		{kernels.BF16, kernels.F32}: "swiglu_rows_fwd_bf16_f32out", {kernels.F32, kernels.BF16}: "swiglu_rows_fwd_f32_bf16out",
	}
	swigluRowsBwd = map[[2]kernels.DType]string{
		{kernels.F32, kernels.F32}: "swiglu_rows_bwd", {kernels.BF16, kernels.BF16}: "swiglu_rows_bwd_bf16",
		{kernels.BF16, kernels.F32}: "swiglu_rows_bwd_bf16_f32out", {kernels.F32, kernels.BF16}: "swiglu_rows_bwd_f32_bf16out",
	}
)
