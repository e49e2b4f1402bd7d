// copy_cols.cu: the strided 2-D copy (kernels.Ops CopyCols) that splits a
// fused q|k|v or gate|up projection output into its parts and packs their
// gradients back, converting fp32 ↔ bf16 as cast.cu does. The CPU
// counterpart is kernels/cpu/copy_cols.go.
//
//   copy_cols_<dst>_<src>:  dst[r·ds + j] = src[r·ss + j], r < R, j < W   (=)
#include "common.cuh"

__device__ __forceinline__ unsigned short cc_to_bf16(float f) {
  unsigned int u = __float_as_uint(f);
  if ((u & 0x7fffffffu) > 0x7f800000u) return (unsigned short)((u >> 16) | 0x40u);
  u += 0x7fffu + ((u >> 16) & 1u);
  return (unsigned short)(u >> 16);
}

__device__ __forceinline__ float cc_to_f32(unsigned short h) {
  return __int_as_float((int)((unsigned int)h << 16));
}

__device__ __forceinline__ float cc_same(float x) { return x; }
__device__ __forceinline__ unsigned short cc_same(unsigned short x) { return x; }

// Kernels are spelled out one by one (no macro): the emulator finds them
// by their extern "C" __global__ declarations.
template <typename D, typename S, D (*conv)(S)>
__device__ __forceinline__ void copy_cols(D* dst, const S* src, long long R, long long W, long long ds, long long ss) {
  TG_FOR(i, R * W) {
    long long r = i / W, j = i - r * W;
    dst[r * ds + j] = conv(src[r * ss + j]);
  }
}

extern "C" __global__ void copy_cols_f32_f32(float* dst, const float* src, long long R, long long W,
                                             long long ds, long long ss) {
  copy_cols<float, float, cc_same>(dst, src, R, W, ds, ss);
}

extern "C" __global__ void copy_cols_bf16_bf16(unsigned short* dst, const unsigned short* src, long long R,
                                               long long W, long long ds, long long ss) {
  copy_cols<unsigned short, unsigned short, cc_same>(dst, src, R, W, ds, ss);
}

extern "C" __global__ void copy_cols_bf16_f32(unsigned short* dst, const float* src, long long R, long long W,
                                              long long ds, long long ss) {
  copy_cols<unsigned short, float, cc_to_bf16>(dst, src, R, W, ds, ss);
}

extern "C" __global__ void copy_cols_f32_bf16(float* dst, const unsigned short* src, long long R, long long W,
                                              long long ds, long long ss) {
  copy_cols<float, unsigned short, cc_to_f32>(dst, src, R, W, ds, ss);
}
