// expert_gather.cu: a sparse layer's input rows in expert-contiguous order
// (kernels.Experts), and its backward.
//
//   expert_gather*:     dst (N,C) = src (T,C) [order[p] / K]                 (=)
//   expert_gather_bwd:  dsrc (T,C) += Σ_j ddst[slot[t·K + j]], j = 0..K−1    (+=)
//
// One block per row (grid-stride over rows), threads across the row. dst
// and src are fp32 or bf16 (expert_gather_<dst>_<src>), converted as
// Convert does. The backward adds each token's K rows in j order, as
// kernels/cpu does: the same bits. An index outside its range (a routing
// already flagged by expert_route) reads nothing.
#include "bf16.cuh"
#include "common.cuh"

template <class TD, class TS>
__device__ __forceinline__ void gather(TD* dst, const TS* src, const int* order, int T, int K, int C) {
  const long long N = (long long)T * K;
  for (long long p = blockIdx.x; p < N; p += gridDim.x) {
    const int i = order[p];
    if (i < 0 || i >= N) continue;
    const long long s = (long long)(i / K) * C;
    for (int c = threadIdx.x; c < C; c += blockDim.x) st_f(dst, p * C + c, ld_f(src, s + c));
  }
}

extern "C" __global__ void expert_gather(float* dst, const float* src, const int* order, int T, int K, int C) {
  gather(dst, src, order, T, K, C);
}
extern "C" __global__ void expert_gather_bf16_f32(tg_bf16* dst, const float* src, const int* order, int T, int K,
                                                  int C) {
  gather(dst, src, order, T, K, C);
}
extern "C" __global__ void expert_gather_bf16_bf16(tg_bf16* dst, const tg_bf16* src, const int* order, int T,
                                                   int K, int C) {
  gather(dst, src, order, T, K, C);
}
extern "C" __global__ void expert_gather_f32_bf16(float* dst, const tg_bf16* src, const int* order, int T, int K,
                                                  int C) {
  gather(dst, src, order, T, K, C);
}

extern "C" __global__ void expert_gather_bwd(float* dsrc, const float* ddst, const int* slot, int T, int K, int C) {
  const long long N = (long long)T * K;
  for (int t = blockIdx.x; t < T; t += gridDim.x) {
    for (int c = threadIdx.x; c < C; c += blockDim.x) {
      float a = dsrc[(long long)t * C + c];
      for (int j = 0; j < K; j++) {
        const int p = slot[(long long)t * K + j];
        if (p >= 0 && p < N) a += ddst[(long long)p * C + c];
      }
      dsrc[(long long)t * C + c] = a;
    }
  }
}
