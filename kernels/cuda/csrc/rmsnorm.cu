// rmsnorm.cu: RMSNorm over rows (also Qwen3's per-head q/k norm, N = T·NH, C = HD).
//
//   rmsnorm_fwd:  out (N,C) = inp·r·weight (C),  rstd (N) = r = 1/sqrt(mean(inp²) + eps)   (=)
//   rmsnorm_bwd:  dinp (N,C) += r·dout·w − r³·inp/C · Σ_c dout·w·inp                      (+=)
//                 dweight (C) += Σ_rows dout·inp·r                                        (+=)
//
// One block per row (grid-stride over rows), blockDim a multiple of 32. In the
// backward pass each block sums its rows' dweight in shared memory (C floats,
// when use_smem) and adds it to dweight with one atomicAdd per column, so the
// cross-block order is unspecified (equal to the CPU within rounding).
#include "common.cuh"

extern "C" __global__ void rmsnorm_fwd(float* out, float* rstd, const float* inp,
                                       const float* weight, int N, int C, float eps) {
  __shared__ float scratch[32];
  for (int row = blockIdx.x; row < N; row += gridDim.x) {
    const float* x = inp + (long long)row * C;
    float ss = 0.f;
    for (int c = threadIdx.x; c < C; c += blockDim.x) ss += x[c] * x[c];
    ss = block_sum(ss, scratch);
    float r = 1.f / sqrtf(ss / (float)C + eps);
    if (threadIdx.x == 0) rstd[row] = r;
    float* o = out + (long long)row * C;
    for (int c = threadIdx.x; c < C; c += blockDim.x) o[c] = x[c] * r * weight[c];
  }
}

extern "C" __global__ void rmsnorm_bwd(float* dinp, float* dweight, const float* dout,
                                       const float* inp, const float* weight, const float* rstd,
                                       int N, int C, int use_smem) {
  TG_DYN_SMEM(float, dw);  // (C) when use_smem
  __shared__ float scratch[32];
  if (use_smem) {
    for (int c = threadIdx.x; c < C; c += blockDim.x) dw[c] = 0.f;
  }
  for (int row = blockIdx.x; row < N; row += gridDim.x) {
    const float* x = inp + (long long)row * C;
    const float* g = dout + (long long)row * C;
    float r = rstd[row];
    float dot = 0.f;
    for (int c = threadIdx.x; c < C; c += blockDim.x) dot += g[c] * weight[c] * x[c];
    dot = block_sum(dot, scratch);
    float k = r * r * r * dot / (float)C;
    float* dx = dinp + (long long)row * C;
    for (int c = threadIdx.x; c < C; c += blockDim.x) {
      dx[c] += r * g[c] * weight[c] - k * x[c];
      float wg = g[c] * x[c] * r;
      if (use_smem) {
        dw[c] += wg;  // column c belongs to this thread alone
      } else {
        atomicAdd(&dweight[c], wg);
      }
    }
  }
  if (use_smem) {
    for (int c = threadIdx.x; c < C; c += blockDim.x) atomicAdd(&dweight[c], dw[c]);
  }
}
