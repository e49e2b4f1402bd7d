// cast.cu: fp32 ↔ bf16 conversion (kernels.Ops Convert; the bf16 weight copy
// of mixed precision), round to nearest even, NaN kept quiet. The CPU
// counterpart is kernels/cpu/convert.go.
//
//   f32_to_bf16:  dst (N) BF16 bits = round(src (N))   (=)
//   bf16_to_f32:  dst (N) = widen(src (N) BF16 bits)   (=, exact)
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

extern "C" __global__ void bf16_to_f32(float* dst, const unsigned short* src, long long N) {
  TG_FOR(i, N) { dst[i] = __int_as_float((int)((unsigned int)src[i] << 16)); }
}
