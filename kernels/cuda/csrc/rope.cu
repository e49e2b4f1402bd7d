// rope.cu: rotary position embedding, Hugging Face "rotate half" convention,
// from precomputed tables.
//
//   rope:  x (T,H,HD) rotated in place (=): for i < HD/2, with
//          c = cos_t[pos[t]·HD/2 + i], s = sin_t[pos[t]·HD/2 + i] from tables (P, HD/2),
//          (x[i], x[i+HD/2]) ← (x[i]·c − x[i+HD/2]·s, x[i+HD/2]·c + x[i]·s)
//   RopeBackward is the same kernel with sign = −1 (the inverse rotation).
//   rope_bf16out: out (T,H,HD) bf16 = x rotated, rounded (=; x unchanged): the
//          rotation fused with the cast to attention's bf16 operands
//          (kernels.RopeConverter; rope_f32out is its fp32 form).
//
// pos (T) I32. The tables are computed once on the host (package model), so
// the kernel does no transcendental math. One warp per (t, h) row (one
// division per row, none per element), lanes across the row's pairs. A
// position outside [0, P) leaves its row unrotated (copied to out) and sets
// TG_ERR_ROPEPOS in flags (reported by Sync).
#include "bf16.cuh"
#include "common.cuh"

template <class TO>
__device__ __forceinline__ void rope_rows(TO* out, const float* x, const int* pos, const float* cos_t,
                                          const float* sin_t, int T, int H, int HD, int P, float sign,
                                          int* flags) {
  const int half = HD / 2, lane = threadIdx.x & 31;
  const long long rows = (long long)T * H, nwarps = (long long)gridDim.x * (blockDim.x >> 5);
  for (long long r = (long long)blockIdx.x * (blockDim.x >> 5) + (threadIdx.x >> 5); r < rows; r += nwarps) {
    const int t = (int)(r / H);
    const int p = pos[t];
    const float* xr = x + r * HD;
    TO* o = out + r * HD;
    if (p < 0 || p >= P) {
      if (lane == 0 && r == (long long)t * H) atomicOr(flags, TG_ERR_ROPEPOS);
      for (int k = lane; k < HD; k += 32) st_f(o, k, xr[k]);
      continue;
    }
    const float* c = cos_t + (long long)p * half;
    const float* s = sin_t + (long long)p * half;
    for (int k = lane; k < half; k += 32) {
      const float a = xr[k], b = xr[k + half], ck = c[k], sk = sign * s[k];
      st_f(o, k, a * ck - b * sk);
      st_f(o, k + half, b * ck + a * sk);
    }
  }
}

extern "C" __global__ void rope(float* x, const int* pos, const float* cos_t, const float* sin_t, int T,
                                int H, int HD, int P, float sign, int* flags) {
  rope_rows(x, x, pos, cos_t, sin_t, T, H, HD, P, sign, flags);
}

extern "C" __global__ void rope_f32out(float* out, const float* x, const int* pos, const float* cos_t,
                                       const float* sin_t, int T, int H, int HD, int P, int* flags) {
  rope_rows(out, x, pos, cos_t, sin_t, T, H, HD, P, 1.f, flags);
}

extern "C" __global__ void rope_bf16out(tg_bf16* out, const float* x, const int* pos, const float* cos_t,
                                        const float* sin_t, int T, int H, int HD, int P, int* flags) {
  rope_rows(out, x, pos, cos_t, sin_t, T, H, HD, P, 1.f, flags);
}
