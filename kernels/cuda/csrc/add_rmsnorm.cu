// add_rmsnorm.cu: the residual add fused with the RMSNorm that follows it
// (kernels.AddRMSNormer; the CPU reference is Add then RMSNorm).
//
//   add_rmsnorm{,_bf16}:  sum (N,C) = a + b                                  (=, may alias a or b)
//                         out (N,C) = sum·r·weight (C), rstd (N) = r =
//                         1/sqrt(mean(sum²) + eps)                            (=)
//
// One block per row (grid-stride over rows): the row's sum is written, then
// normalized by the row function RMSNorm uses (rmsnorm.cuh) reading it
// back, so the result is the bits of Add then RMSNorm on this backend, with
// one pass over a and b instead of three over the residual stream. out is
// fp32 or bf16 (the next GEMM's input); vec as in rmsnorm.cu.
#include "common.cuh"
#include "rmsnorm.cuh"

template <class TO>
__device__ __forceinline__ void add_rmsnorm_rows(float* sum, TO* out, float* rstd, const float* a,
                                                  const float* b, const float* weight, int N, int C,
                                                  float eps, int vec) {
  __shared__ float scratch[32];
  for (int row = blockIdx.x; row < N; row += gridDim.x) {
    const long long off = (long long)row * C;
    if (vec) {
      for (int c = 8 * threadIdx.x; c < C; c += 8 * blockDim.x) {
        float x[8], y[8];
        ld8(a + off + c, x);
        ld8(b + off + c, y);
#pragma unroll
        for (int i = 0; i < 8; i++) x[i] += y[i];
        st8(sum + off + c, x);
      }
    } else {
      for (int c = threadIdx.x; c < C; c += blockDim.x) sum[off + c] = a[off + c] + b[off + c];
    }
    // rms_row maps elements to threads as the loop above does: each thread
    // reads back only the sums it wrote, so no barrier is needed here.
    const float r = rms_row(out + off, sum + off, weight, C, eps, vec != 0, scratch);
    if (threadIdx.x == 0) rstd[row] = r;
  }
}

extern "C" __global__ void add_rmsnorm(float* sum, float* out, float* rstd, const float* a,
                                       const float* b, const float* weight, int N, int C, float eps,
                                       int vec) {
  add_rmsnorm_rows(sum, out, rstd, a, b, weight, N, C, eps, vec);
}

extern "C" __global__ void add_rmsnorm_bf16(float* sum, tg_bf16* out, float* rstd, const float* a,
                                            const float* b, const float* weight, int N, int C,
                                            float eps, int vec) {
  add_rmsnorm_rows(sum, out, rstd, a, b, weight, N, C, eps, vec);
}
