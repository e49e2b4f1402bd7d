package kernels

// Optional fused fast paths. A backend may implement any of these small
// interfaces besides Ops; callers find them by type assertion and fall back
// to the core ops, which compute the same thing. kernels/cpu implements
// each (the reference kernels/kerneltest checks the others against).

// AddRMSNormer fuses the residual add with the RMSNorm that follows it:
// one pass over the residual stream instead of three.
type AddRMSNormer interface {
	// AddRMSNorm: sum (N,C) = a (N,C) + b (N,C) (=; sum may alias a or b),
	// then RMSNorm(out, rstd, sum, weight, N, C, eps): out (N,C) =,
	// rstd (N) =. The results are those of Add then RMSNorm on the same
	// backend. sum, a, b, weight and rstd are F32; out is F32|BF16.
	AddRMSNorm(sum, out, rstd, a, b, weight Buf, N, C int, eps float32)
}
