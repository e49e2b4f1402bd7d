// rmsnorm.cu: RMSNorm over rows (also Qwen3's per-head q/k norm, N = T·NH, C = HD).
//
//   rmsnorm_fwd{,_bf16}:  out (N,C) = inp·r·weight (C),  rstd (N) = r = 1/sqrt(mean(inp²) + eps)   (=)
//                 out fp32, or rounded to bf16 (the next GEMM's input: the
//                 cast fused into the norm); vec = 1 takes 16-byte accesses
//                 (C % 8 == 0, aligned rows; the launcher decides)
//   rmsnorm_bwd:  dinp (N,C) += r·dout·w − r³·inp/C · Σ_c dout·w·inp                      (+=)
//                 dweight (C) += Σ_rows dout·inp·r                                        (+=)
//
// One block per row (grid-stride over rows), blockDim a multiple of 32. The
// backward pass is deterministic: block g of G sums its rows' dweight
// contributions, in row order, into its own row of partial (G,C) (column c
// belongs to one thread), and rmsnorm_dw_reduce then adds the G partials to
// dweight in block order. G depends only on N (the Go side fixes it), never
// on the device, so a step's gradients are the same bits on every run and
// every GPU. No atomics.
#include "common.cuh"
#include "rmsnorm.cuh"

template <class TO>
__device__ __forceinline__ void rmsnorm_rows(TO* out, float* rstd, const float* inp, const float* weight,
                                             int N, int C, float eps, int vec) {
  __shared__ float scratch[32];
  for (int row = blockIdx.x; row < N; row += gridDim.x) {
    const float r = rms_row(out + (long long)row * C, inp + (long long)row * C, weight, C, eps, vec != 0, scratch);
    if (threadIdx.x == 0) rstd[row] = r;
  }
}

extern "C" __global__ void rmsnorm_fwd(float* out, float* rstd, const float* inp, const float* weight,
                                       int N, int C, float eps, int vec) {
  rmsnorm_rows(out, rstd, inp, weight, N, C, eps, vec);
}

extern "C" __global__ void rmsnorm_fwd_bf16(tg_bf16* out, float* rstd, const float* inp,
                                            const float* weight, int N, int C, float eps, int vec) {
  rmsnorm_rows(out, rstd, inp, weight, N, C, eps, vec);
}

extern "C" __global__ void rmsnorm_bwd(float* dinp, float* partial, const float* dout,
                                       const float* inp, const float* weight, const float* rstd,
                                       int N, int C) {
  __shared__ float scratch[32];
  float* dw = partial + (long long)blockIdx.x * C;  // (C): this block's row of partial
  for (int c = threadIdx.x; c < C; c += blockDim.x) dw[c] = 0.f;
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
      dw[c] += g[c] * x[c] * r;  // column c belongs to this thread alone
    }
  }
}

// dweight (C) += Σ_g partial[g][c] for g = 0..G−1 in order.
extern "C" __global__ void rmsnorm_dw_reduce(float* dweight, const float* partial, int G, int C) {
  TG_FOR(c, C) {
    float s = 0.f;
    for (int g = 0; g < G; g++) s += partial[(long long)g * C + c];
    dweight[c] += s;
  }
}
