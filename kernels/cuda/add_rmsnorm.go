//go:build cgo

package cuda

// AddRMSNorm: csrc/add_rmsnorm.cu (kernels.AddRMSNormer).

import "github.com/tracegrpo/tracegrpo/kernels"

// AddRMSNorm implements kernels.AddRMSNormer: sum (N,C) = a + b (=), out
// (N,C) = RMSNorm(sum) (=), rstd (N) =. out F32|BF16, the rest F32.
func (b *Backend) AddRMSNorm(sum, out, rstd, x, y, weight kernels.Buf, N, C int, eps float32) {
	want(sum, kernels.F32, N*C, "AddRMSNorm sum")
	want(x, kernels.F32, N*C, "AddRMSNorm a")
	want(y, kernels.F32, N*C, "AddRMSNorm b")
	operands("AddRMSNorm out", out)
	want(out, out.DType, N*C, "AddRMSNorm out")
	want(rstd, kernels.F32, N, "AddRMSNorm rstd")
	want(weight, kernels.F32, C, "AddRMSNorm weight")
	if N == 0 {
		return
	}
	name := "add_rmsnorm"
	if out.DType == kernels.BF16 {
		name = "add_rmsnorm_bf16"
	}
	defer b.lock()()
	c := rw(reads(x, y, weight), sum, out, rstd).with(5*int64(N)*int64(C), normInflight(C, sum, out, x, y, weight))
	b.launch(name, c, b.rowBlocks(N), 1, 1, normThreads(C), 0,
		pa(sum), pa(out), pa(rstd), pa(x), pa(y), pa(weight), ia(N), ia(C), fa(eps), normVec(C, sum, out, x, y, weight))
}

var _ kernels.AddRMSNormer = (*Backend)(nil)
