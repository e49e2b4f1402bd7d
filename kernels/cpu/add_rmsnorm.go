package cpu

// AddRMSNorm: the residual add fused with the RMSNorm after it
// (kernels.AddRMSNormer), here exactly Add then RMSNorm:
//
//	sum (N,C)  = a + b                                  = (may alias a or b)
//	out (N,C)  = sum · rstd · weight (C)                =
//	rstd (N)   = 1 / sqrt(mean_c sum² + eps)            =

import "github.com/tracegrpo/tracegrpo/kernels"

// AddRMSNorm implements kernels.AddRMSNormer.
// Shapes: sum, a, b (N,C); out (N,C) F32|BF16; rstd (N); weight (C).
func (b *Backend) AddRMSNorm(sum, out, rstd, x, y, weight kernels.Buf, N, C int, eps float32) {
	b.Add(sum, x, y, N*C)
	b.RMSNorm(out, rstd, sum, weight, N, C, eps)
}
