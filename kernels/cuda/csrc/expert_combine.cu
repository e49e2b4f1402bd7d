// expert_combine.cu: the inverse permutation with the routing weights
// (kernels.Experts), and its backward.
//
//   expert_combine:        out (T,C) = Σ_j w[t,j] · y[slot[t·K + j]], j in order  (=)
//   expert_combine_bwd_dy*: dy (N,C) = w[i] · dout[i / K], i = order[p]          (=)
//   expert_combine_bwd_dw: dweights (T,K) = dout[t] · y[slot[t·K + j]]           (=)
//
// One block per row (grid-stride over rows). The forward sums a token's K
// rows in j order from zero, as kernels/cpu does; the dot products of
// expert_combine_bwd_dw run over C in thread-strided partial sums combined
// by block_sum's fixed tree: deterministic. dy is fp32 or bf16 (the down
// GEMM's backward operand under mixed precision). An index outside its
// range (a routing already flagged by expert_route) contributes nothing.
#include "bf16.cuh"
#include "common.cuh"

extern "C" __global__ void expert_combine(float* out, const float* y, const float* w, const int* slot, int T, int K,
                                          int C) {
  const long long N = (long long)T * K;
  for (int t = blockIdx.x; t < T; t += gridDim.x) {
    for (int c = threadIdx.x; c < C; c += blockDim.x) {
      float a = 0.f;
      for (int j = 0; j < K; j++) {
        const int p = slot[(long long)t * K + j];
        if (p >= 0 && p < N) a += w[(long long)t * K + j] * y[(long long)p * C + c];
      }
      out[(long long)t * C + c] = a;
    }
  }
}

template <class TO>
__device__ __forceinline__ void combine_dy(TO* dy, const float* dout, const float* w, const int* order, int T, int K,
                                           int C) {
  const long long N = (long long)T * K;
  for (long long p = blockIdx.x; p < N; p += gridDim.x) {
    const int i = order[p];
    const bool ok = i >= 0 && i < N;
    const float wi = ok ? w[i] : 0.f;
    const long long s = ok ? (long long)(i / K) * C : 0;
    for (int c = threadIdx.x; c < C; c += blockDim.x) st_f(dy, p * C + c, ok ? wi * dout[s + c] : 0.f);
  }
}

extern "C" __global__ void expert_combine_bwd_dy(float* dy, const float* dout, const float* w, const int* order, int T,
                                                 int K, int C) {
  combine_dy(dy, dout, w, order, T, K, C);
}
extern "C" __global__ void expert_combine_bwd_dy_bf16(tg_bf16* dy, const float* dout, const float* w,
                                                      const int* order, int T, int K, int C) {
  combine_dy(dy, dout, w, order, T, K, C);
}

extern "C" __global__ void expert_combine_bwd_dw(float* dw, const float* dout, const float* y, const int* slot, int T,
                                                 int K, int C) {
  __shared__ float scratch[32];
  const long long N = (long long)T * K;
  for (int t = blockIdx.x; t < T; t += gridDim.x) {
    for (int j = 0; j < K; j++) {
      const int p = slot[(long long)t * K + j];
      float a = 0.f;
      if (p >= 0 && p < N) {
        for (int c = threadIdx.x; c < C; c += blockDim.x) a += dout[(long long)t * C + c] * y[(long long)p * C + c];
      }
      a = block_sum(a, scratch);
      if (threadIdx.x == 0) dw[(long long)t * K + j] = a;
    }
  }
}
