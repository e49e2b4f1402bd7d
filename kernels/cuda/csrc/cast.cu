// cast.cu: fp32 ↔ bf16 conversion (kernels.Ops Convert; the bf16 weight copy
// of mixed precision), round to nearest even, NaN kept quiet. The CPU
// counterpart is kernels/cpu/convert.go.
//
//   f32_to_bf16:  dst (N) BF16 bits = round(src (N))   (=)
//   bf16_to_f32:  dst (N) = widen(src (N) BF16 bits)   (=, exact)
//
// 8 elements a thread a step where both buffers are 16-byte aligned (two
// 16-byte fp32 accesses, one bf16), the tail one at a time; every element
// rounds through tg_round (one NaN rule on every path).
#include "bf16.cuh"
#include "common.cuh"

extern "C" __global__ void f32_to_bf16(tg_bf16* dst, const float* src, long long N) {
  long long done = 0;
  if (tg_aligned16(dst) && tg_aligned16(src)) {
    TG_FOR(i, N / 8) {
      float r[8];
      ld8(src + 8 * i, r);
      uint4 v;
      v.x = (unsigned)tg_round(r[0]) | (unsigned)tg_round(r[1]) << 16;
      v.y = (unsigned)tg_round(r[2]) | (unsigned)tg_round(r[3]) << 16;
      v.z = (unsigned)tg_round(r[4]) | (unsigned)tg_round(r[5]) << 16;
      v.w = (unsigned)tg_round(r[6]) | (unsigned)tg_round(r[7]) << 16;
      TG_CHECK_ALIGN(dst + 8 * i, 16);
      *(uint4*)(dst + 8 * i) = v;
    }
    done = N / 8 * 8;
  }
  TG_FOR(k, N - done) dst[done + k] = tg_round(src[done + k]);
}

extern "C" __global__ void bf16_to_f32(float* dst, const tg_bf16* src, long long N) {
  long long done = 0;
  if (tg_aligned16(dst) && tg_aligned16(src)) {
    TG_FOR(i, N / 8) {
      float r[8];
      ld8(src + 8 * i, r);
      st8(dst + 8 * i, r);
    }
    done = N / 8 * 8;
  }
  TG_FOR(k, N - done) dst[done + k] = tg_widen(src[done + k]);
}
