//go:build cgo

package cuda

// Add and Accumulate: csrc/residual.cu.

import "github.com/tracegrpo/tracegrpo/kernels"

// Add implements kernels.Ops: out (N) = a + b; out may alias a or b.
func (b *Backend) Add(out, x, y kernels.Buf, N int) {
	want(out, kernels.F32, N, "Add out")
	want(x, kernels.F32, N, "Add a")
	want(y, kernels.F32, N, "Add b")
	defer b.lock()()
	b.elementwise("add", rw(reads(x, y), out).with(int64(N), 32), N, pa(out), pa(x), pa(y), la(N))
}

// Accumulate implements kernels.Ops: dst (N) += src (N).
func (b *Backend) Accumulate(dst, src kernels.Buf, N int) {
	want(dst, kernels.F32, N, "Accumulate dst")
	want(src, kernels.F32, N, "Accumulate src")
	defer b.lock()()
	b.elementwise("accumulate", rw(reads(dst, src), dst).with(int64(N), 32), N, pa(dst), pa(src), la(N))
}
