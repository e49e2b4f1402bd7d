// rope.cu: rotary position embedding, Hugging Face "rotate half" convention,
// from precomputed tables.
//
//   rope:  x (T,H,HD) rotated in place (=): for i < HD/2, with
//          c = cos_t[pos[t]·HD/2 + i], s = sin_t[pos[t]·HD/2 + i] from tables (P, HD/2),
//          (x[i], x[i+HD/2]) ← (x[i]·c − x[i+HD/2]·s, x[i+HD/2]·c + x[i]·s)
//   RopeBackward is the same kernel with sign = −1 (the inverse rotation).
//
// pos (T) I32. The tables are computed once on the host (package model), so
// the kernel does no transcendental math. A position outside [0, P) leaves
// its row unchanged and sets TG_ERR_ROPEPOS in flags (reported by Sync).
#include "common.cuh"

extern "C" __global__ void rope(float* x, const int* pos, const float* cos_t, const float* sin_t,
                                int T, int H, int HD, int P, float sign, int* flags) {
  int half = HD / 2;
  TG_FOR(i, (long long)T * H * half) {
    int k = (int)(i % half);
    long long th = i / half;
    int t = (int)(th / H);
    int p = pos[t];
    if (p < 0 || p >= P) {
      if (k == 0) atomicOr(flags, TG_ERR_ROPEPOS);
      continue;
    }
    long long at = (long long)p * half + k;
    const float c = cos_t[at], s = sign * sin_t[at];
    float* q = x + th * HD;
    float a = q[k], b = q[k + half];
    q[k] = a * c - b * s;
    q[k + half] = b * c + a * s;
  }
}
