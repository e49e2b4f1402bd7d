// rmsnorm.cuh: the row of RMSNorm's forward that rmsnorm.cu and
// add_rmsnorm.cu share, so that the fused op gives the same bits as RMSNorm
// after Add.
#pragma once
#include "bf16.cuh"
#include "common.cuh"

// One row of out (C) = x·r·weight, r = 1/sqrt(mean(x²) + eps), returned.
// Every thread of the block calls it; vec: C % 8 == 0 and x, weight, out
// 16-byte aligned (8 elements per thread per step, 16-byte accesses), the
// sum of squares then taken 8 consecutive elements per thread.
template <class TO>
__device__ __forceinline__ float rms_row(TO* o, const float* x, const float* weight, int C, float eps,
                                         bool vec, float* scratch) {
  float ss = 0.f;
  if (vec) {
    for (int c = 8 * threadIdx.x; c < C; c += 8 * blockDim.x) {
      float v[8];
      ld8(x + c, v);
#pragma unroll
      for (int i = 0; i < 8; i++) ss += v[i] * v[i];
    }
  } else {
    for (int c = threadIdx.x; c < C; c += blockDim.x) ss += x[c] * x[c];
  }
  ss = block_sum(ss, scratch);
  const float r = 1.f / sqrtf(ss / (float)C + eps);
  if (vec) {
    for (int c = 8 * threadIdx.x; c < C; c += 8 * blockDim.x) {
      float v[8], w[8];
      ld8(x + c, v);
      ld8(weight + c, w);
#pragma unroll
      for (int i = 0; i < 8; i++) v[i] = v[i] * r * w[i];
      st8(o + c, v);
    }
  } else {
    for (int c = threadIdx.x; c < C; c += blockDim.x) st_f(o, c, x[c] * r * weight[c]);
  }
  return r;
}
