// scatter.cu: ScatterRows.
//
//   scatter_rows*:  dst[idx[i], :] = src[i, :]   for src (N,W), idx (N), dst (R,W)   (=)
//
// dst and src are fp32 or bf16 (scatter_rows_<dst>_<src>: a bf16 KV cache
// written from fp32 or bf16 keys), converted as Convert does. One block per
// source row (grid-stride over rows), threads across the row. An index
// outside [0, R) writes nothing and sets TG_ERR_SCATTER in flags. Two rows
// with the same index race (the interface leaves that undefined).
#include "bf16.cuh"
#include "common.cuh"

template <class TD, class TS>
__device__ __forceinline__ void scatter(TD* dst, const TS* src, const int* idx, int N, int W, int R,
                                        int* flags) {
  for (int r = blockIdx.x; r < N; r += gridDim.x) {
    const int d = idx[r];
    if (d < 0 || d >= R) {
      if (threadIdx.x == 0) atomicOr(flags, TG_ERR_SCATTER);
      continue;
    }
    for (int c = threadIdx.x; c < W; c += blockDim.x)
      st_f(dst, (long long)d * W + c, ld_f(src, (long long)r * W + c));
  }
}

extern "C" __global__ void scatter_rows(float* dst, const float* src, const int* idx, int N, int W,
                                        int R, int* flags) {
  scatter(dst, src, idx, N, W, R, flags);
}
extern "C" __global__ void scatter_rows_bf16_f32(tg_bf16* dst, const float* src, const int* idx, int N,
                                                 int W, int R, int* flags) {
  scatter(dst, src, idx, N, W, R, flags);
}
extern "C" __global__ void scatter_rows_bf16_bf16(tg_bf16* dst, const tg_bf16* src, const int* idx,
                                                  int N, int W, int R, int* flags) {
  scatter(dst, src, idx, N, W, R, flags);
}
extern "C" __global__ void scatter_rows_f32_bf16(float* dst, const tg_bf16* src, const int* idx, int N,
                                                 int W, int R, int* flags) {
  scatter(dst, src, idx, N, W, R, flags);
}
