// copy_cols.cu: the strided 2-D copy (kernels.Ops CopyCols) that splits a
// fused q|k|v or gate|up projection output into its parts and packs their
// gradients back, converting fp32 ↔ bf16 as cast.cu does. The CPU
// counterpart is kernels/cpu/copy_cols.go.
//
//   copy_cols_<dst>_<src>:  dst[r·ds + j] = src[r·ss + j], r < R, j < W   (=)
//
// The kernels are spelled out one by one (no macro): the emulator finds them
// by their extern "C" __global__ declarations.
#include "common.cuh"
#include "bf16.cuh"

__device__ __forceinline__ float cc_same(float x) { return x; }
__device__ __forceinline__ unsigned short cc_same(unsigned short x) { return x; }

// One block per row at a time (blocks stride over the rows), its threads
// over the row's columns: coalesced, and no index division.
template <typename D, typename S, D (*conv)(S)>
__device__ __forceinline__ void copy_cols(D* dst, const S* src, long long R, long long W, long long ds, long long ss) {
  for (long long r = blockIdx.x; r < R; r += gridDim.x) {
    D* d = dst + r * ds;
    const S* s = src + r * ss;
    for (long long j = threadIdx.x; j < W; j += blockDim.x) d[j] = conv(s[j]);
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
  copy_cols<unsigned short, float, tg_round>(dst, src, R, W, ds, ss);
}

extern "C" __global__ void copy_cols_f32_bf16(float* dst, const unsigned short* src, long long R, long long W,
                                              long long ds, long long ss) {
  copy_cols<float, unsigned short, tg_widen>(dst, src, R, W, ds, ss);
}
