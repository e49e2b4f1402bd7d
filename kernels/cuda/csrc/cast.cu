// cast.cu: fp32 → bf16 conversion for the bf16 GEMM path (Options.Matmul =
// MatmulBF16), round to nearest even, NaN kept quiet. No CPU counterpart:
// the CPU backend has no bf16 compute.
//
//   f32_to_bf16:  dst (N) BF16 bits = round(src (N))   (=)
#include "common.cuh"

extern "C" __global__ void f32_to_bf16(unsigned short* dst, const float* src, long long N) {
  TG_FOR(i, N) {
    unsigned int u = __float_as_uint(src[i]);
    if ((u & 0x7fffffffu) > 0x7f800000u) {
      dst[i] = (unsigned short)((u >> 16) | 0x40u);  // NaN
    } else {
      u += 0x7fffu + ((u >> 16) & 1u);
      dst[i] = (unsigned short)(u >> 16);
    }
  }
}
