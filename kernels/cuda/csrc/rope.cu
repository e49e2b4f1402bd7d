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
//   qk_norm_rope_{f32,bf16}out: Qwen3's attention inputs from the fused q|k|v
//          GEMM's output qkv (T, (NH+2·NKV)·HD) fp32 as it lies, in one pass
//          (kernels.QKNormRoper): for each q and k head row, raw (=) its HD
//          values, rstd (=) 1/sqrt(mean(raw²) + eps), out (=) raw·rstd·w
//          rotated as rope rotates it and rounded to out's dtype; v's rows
//          copied into v (=), rounded alike. No split copies, no fp32 q/k
//          in between.
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

// One warp per (t, head) row of qkv's NH + 2·NKV heads (q's, then k's,
// then v's). The sum of squares runs over the lanes in a fixed order
// (warp_sum), so reruns are bitwise equal.
template <class TO>
__device__ __forceinline__ void qk_norm_rope_rows(TO* q, TO* k, TO* v, float* qraw, float* kraw, float* qrstd,
                                                  float* krstd, const float* qkv, const float* qw,
                                                  const float* kw, const int* pos, const float* cos_t,
                                                  const float* sin_t, int T, int NH, int NKV, int HD, int P,
                                                  float eps, int* flags) {
  const int half = HD / 2, lane = threadIdx.x & 31, H3 = NH + 2 * NKV;
  const long long rows = (long long)T * H3, nwarps = (long long)gridDim.x * (blockDim.x >> 5);
  for (long long r = (long long)blockIdx.x * (blockDim.x >> 5) + (threadIdx.x >> 5); r < rows; r += nwarps) {
    const int t = (int)(r / H3), h = (int)(r - (long long)t * H3);
    const float* x = qkv + r * HD;
    if (h >= NH + NKV) {
      TO* o = v + ((long long)t * NKV + (h - NH - NKV)) * HD;
      for (int c = lane; c < HD; c += 32) st_f(o, c, x[c]);
      continue;
    }
    const bool isq = h < NH;
    const long long row = isq ? (long long)t * NH + h : (long long)t * NKV + (h - NH);
    float* raw = (isq ? qraw : kraw) + row * HD;
    TO* o = (isq ? q : k) + row * HD;
    const float* w = isq ? qw : kw;
    float ss = 0.f;
#pragma unroll 4
    for (int c = lane; c < HD; c += 32) {
      const float a = x[c];
      raw[c] = a;
      ss += a * a;
    }
    ss = warp_sum(ss);
    const float rs = 1.f / sqrtf(ss / (float)HD + eps);
    if (lane == 0) (isq ? qrstd : krstd)[row] = rs;
    const int p = pos[t];
    if (p < 0 || p >= P) {
      if (lane == 0 && h == 0) atomicOr(flags, TG_ERR_ROPEPOS);
      for (int c = lane; c < HD; c += 32) st_f(o, c, x[c] * rs * w[c]);
      continue;
    }
    const float* cs = cos_t + (long long)p * half;
    const float* sn = sin_t + (long long)p * half;
#pragma unroll 2
    for (int c = lane; c < half; c += 32) {
      const float a = x[c] * rs * w[c], b = x[c + half] * rs * w[c + half], ck = cs[c], sk = sn[c];
      st_f(o, c, a * ck - b * sk);
      st_f(o, c + half, b * ck + a * sk);
    }
  }
}

extern "C" __global__ void qk_norm_rope_f32out(float* q, float* k, float* v, float* qraw, float* kraw,
                                               float* qrstd, float* krstd, const float* qkv, const float* qw,
                                               const float* kw, const int* pos, const float* cos_t,
                                               const float* sin_t, int T, int NH, int NKV, int HD, int P,
                                               float eps, int* flags) {
  qk_norm_rope_rows(q, k, v, qraw, kraw, qrstd, krstd, qkv, qw, kw, pos, cos_t, sin_t, T, NH, NKV, HD, P, eps,
                    flags);
}

extern "C" __global__ void qk_norm_rope_bf16out(tg_bf16* q, tg_bf16* k, tg_bf16* v, float* qraw, float* kraw,
                                                float* qrstd, float* krstd, const float* qkv, const float* qw,
                                                const float* kw, const int* pos, const float* cos_t,
                                                const float* sin_t, int T, int NH, int NKV, int HD, int P,
                                                float eps, int* flags) {
  qk_norm_rope_rows(q, k, v, qraw, kraw, qrstd, krstd, qkv, qw, kw, pos, cos_t, sin_t, T, NH, NKV, HD, P, eps,
                    flags);
}
