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
//   qk_norm_rope_bwd_{f32,bf16}out_gT_cN: its backward, written straight into
//          the q|k|v GEMM's packed gradient dqkv (T, (NH+2·NKV)·HD) as its
//          backward consumes it (kernels.QKNormRopeBackwarder): for each q
//          and k head row, dy = its row of dq or dk rotated back (rope's
//          sign −1), then with norms dx = r·dy·w − r³·raw/HD · Σ dy·w·raw
//          (r its rstd), dweight partial (=) Σ_rows dy·raw·r; v's rows of
//          dv copied. dqkv (=) rounded to its dtype. Without norms (qw
//          null) dx = dy. dq, dk and dv are only read.
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


// ---------------------------------------------------------------------------
// The backward of qk_norm_rope, as rmsnorm.cu's group kernels take the
// norm's backward: groups of G threads (G a power of two, 4..32, so a group
// is a warp or part of one) each own a head row at a time, thread i of a
// group holding columns 4(i + G·j) .. +3 of the row's first half and the
// same columns of its second half for j < NCH: the pairs rope rotates
// together sit in one thread, so the rotation needs no shuffle. Row r of
// the T·(NH+2·NKV) head rows (t = r / H3, head h = r % H3) is head h of
// token t, and also row r of dqkv seen as (T·H3, HD): q's heads, then k's,
// then v's. Block b works on rows [b·R, (b+1)·R), GROUPS rows at a time;
// each thread sums its columns' q and k weight-gradient terms over its rows
// in row order, the block adds its groups' sums in group order into its
// rows of qpart and kpart (G_blocks, HD), and rmsnorm_dw_reduce adds those
// in block order. The grid depends on T, the heads and HD only
// (qkRopeBwdGrid), so the bits of the weight gradients are the same on
// every run and every GPU. No atomics but the error flag.
#define QB_THREADS 256

template <int G>
__device__ __forceinline__ float qb_group_sum(float v) {
#pragma unroll
  for (int o = G / 2; o > 0; o >>= 1) v += __shfl_xor_sync(TG_FULL, v, o);
  return v;
}

// The 4 columns c..c+3 of a half row (c % 4 == 0) as floats: one 16-byte
// load (vec), else scalar loads of the columns below half (the rest 0).
__device__ __forceinline__ void qb_load(const float* p, int c, int half, bool vec, float r[4]) {
  if (vec) {
    if (c < half) {
      ld4(p + c, r);
    } else {
#pragma unroll
      for (int e = 0; e < 4; e++) r[e] = 0.f;
    }
    return;
  }
#pragma unroll
  for (int e = 0; e < 4; e++) r[e] = c + e < half ? p[c + e] : 0.f;
}
template <class TO>
__device__ __forceinline__ void qb_store(TO* p, int c, int half, bool vec, const float r[4]) {
  if (vec) {
    if (c < half) st_f4(p + c, r);
    return;
  }
#pragma unroll
  for (int e = 0; e < 4; e++)
    if (c + e < half) st_f(p, c + e, r[e]);
}

template <int G, int NCH, class TO>
__device__ __forceinline__ void qk_norm_rope_bwd_groups(TO* dqkv, float* qpart, float* kpart, const float* dq,
                                                        const float* dk, const float* dv, const float* qraw,
                                                        const float* kraw, const float* qrstd,
                                                        const float* krstd, const float* qw, const float* kw,
                                                        const int* pos, const float* cos_t, const float* sin_t,
                                                        int T, int NH, int NKV, int HD, int P, int R, int vec,
                                                        int* flags) {
  constexpr int GROUPS = QB_THREADS / G, W = 8 * G * NCH;  // W: the most columns a group covers
  __shared__ float dws[GROUPS * W];                       // each group's q (then k) weight-gradient sums
  const int grp = threadIdx.x / G, li = threadIdx.x % G, half = HD / 2, H3 = NH + 2 * NKV;
  const bool v = vec != 0, norm = qw != nullptr;
  const long long N = (long long)T * H3;
  float wq[NCH][8], wk[NCH][8], dwq[NCH][8], dwk[NCH][8];
#pragma unroll
  for (int j = 0; j < NCH; j++) {
    const int c = 4 * (li + G * j);
#pragma unroll
    for (int e = 0; e < 8; e++) wq[j][e] = wk[j][e] = dwq[j][e] = dwk[j][e] = 0.f;
    if (norm) {
      qb_load(qw, c, half, v, wq[j]);
      qb_load(qw + half, c, half, v, wq[j] + 4);
      qb_load(kw, c, half, v, wk[j]);
      qb_load(kw + half, c, half, v, wk[j] + 4);
    }
  }
  const long long r0 = (long long)blockIdx.x * R, r1 = min(N, r0 + R);
  for (long long base = r0; base < r1; base += GROUPS) {
    const long long row = base + grp;
    const bool live = row < r1;
    const int t = live ? (int)(row / H3) : 0, h = live ? (int)(row - (long long)t * H3) : 0;
    // kind: 0 q, 1 k, 2 v; src its row of dq, dk or dv; raw, w its norm's.
    const int kind = h < NH ? 0 : h < NH + NKV ? 1 : 2;
    const long long srow = kind == 0 ? (long long)t * NH + h : (long long)t * NKV + (h - NH - (kind == 2 ? NKV : 0));
    const float* src = (kind == 0 ? dq : kind == 1 ? dk : dv) + srow * HD;
    const bool rot = live && kind < 2, nrm = rot && norm;
    int p = live ? pos[t] : 0;
    const bool inside = p >= 0 && p < P;
    if (rot && !inside && li == 0 && h == 0) atomicOr(flags, TG_ERR_ROPEPOS);
    if (!inside) p = 0;
    const float* cs = cos_t + (long long)p * half;
    const float* sn = sin_t + (long long)p * half;
    const float* x = (kind == 0 ? qraw : kraw) + srow * HD;
    float g[NCH][8], xr[NCH][8];
    float dot = 0.f;
#pragma unroll
    for (int j = 0; j < NCH; j++) {
      const int c = 4 * (li + G * j);
#pragma unroll
      for (int e = 0; e < 8; e++) g[j][e] = xr[j][e] = 0.f;
      if (live) {
        qb_load(src, c, half, v, g[j]);
        qb_load(src + half, c, half, v, g[j] + 4);
      }
      if (rot && inside) {
        float ck[4], sk[4];
        qb_load(cs, c, half, v, ck);
        qb_load(sn, c, half, v, sk);
#pragma unroll
        for (int e = 0; e < 4; e++) {
          const float a = g[j][e], b = g[j][e + 4];
          g[j][e] = a * ck[e] + b * sk[e];
          g[j][e + 4] = b * ck[e] - a * sk[e];
        }
      }
      if (nrm) {
        qb_load(x, c, half, v, xr[j]);
        qb_load(x + half, c, half, v, xr[j] + 4);
        const float* w = kind == 0 ? wq[j] : wk[j];
#pragma unroll
        for (int e = 0; e < 8; e++) dot += g[j][e] * w[e] * xr[j][e];
      }
    }
    // Every lane of the warp shuffles (its row of any kind, or none).
    dot = qb_group_sum<G>(dot);
    if (!live) continue;
    const float r = nrm ? (kind == 0 ? qrstd : krstd)[srow] : 0.f;
    const float k = r * r * r * dot / (float)HD;
    TO* o = dqkv + row * HD;
#pragma unroll
    for (int j = 0; j < NCH; j++) {
      const int c = 4 * (li + G * j);
      float dx[8];
      if (nrm) {
        const float* w = kind == 0 ? wq[j] : wk[j];
        float* dw = kind == 0 ? dwq[j] : dwk[j];
#pragma unroll
        for (int e = 0; e < 8; e++) {
          dx[e] = r * g[j][e] * w[e] - k * xr[j][e];
          dw[e] += g[j][e] * xr[j][e] * r;
        }
      } else {
#pragma unroll
        for (int e = 0; e < 8; e++) dx[e] = g[j][e];
      }
      qb_store(o, c, half, v, dx);
      qb_store(o + half, c, half, v, dx + 4);
    }
  }
  if (!norm) return;
  // The block's partial rows: its groups' sums added in group order, q's
  // then k's through the same shared array.
  for (int which = 0; which < 2; which++) {
    float* part = which == 0 ? qpart : kpart;
    __syncthreads();  // the previous readers of dws are done
#pragma unroll
    for (int j = 0; j < NCH; j++) {
      const int c = 4 * (li + G * j);
#pragma unroll
      for (int e = 0; e < 4; e++)
        if (c + e < half) {
          dws[grp * W + c + e] = which == 0 ? dwq[j][e] : dwk[j][e];
          dws[grp * W + half + c + e] = which == 0 ? dwq[j][e + 4] : dwk[j][e + 4];
        }
    }
    __syncthreads();
    for (int c = threadIdx.x; c < HD; c += QB_THREADS) {
      float s = 0.f;
      for (int gi = 0; gi < GROUPS; gi++) s += dws[gi * W + c];
      part[(long long)blockIdx.x * HD + c] = s;
    }
  }
}

// The instances: (threads a row, chunks a thread) × dqkv's dtype.
extern "C" __global__ void __launch_bounds__(QB_THREADS)
    qk_norm_rope_bwd_f32out_g4_c1(float* dqkv, float* qpart, float* kpart, const float* dq, const float* dk,
                                  const float* dv, const float* qraw, const float* kraw, const float* qrstd,
                                  const float* krstd, const float* qw, const float* kw, const int* pos,
                                  const float* cos_t, const float* sin_t, int T, int NH, int NKV, int HD, int P,
                                  int R, int vec, int* flags) {
  qk_norm_rope_bwd_groups<4, 1>(dqkv, qpart, kpart, dq, dk, dv, qraw, kraw, qrstd, krstd, qw, kw, pos, cos_t, sin_t,
                                  T, NH, NKV, HD, P, R, vec, flags);
}
extern "C" __global__ void __launch_bounds__(QB_THREADS)
    qk_norm_rope_bwd_bf16out_g4_c1(tg_bf16* dqkv, float* qpart, float* kpart, const float* dq, const float* dk,
                                  const float* dv, const float* qraw, const float* kraw, const float* qrstd,
                                  const float* krstd, const float* qw, const float* kw, const int* pos,
                                  const float* cos_t, const float* sin_t, int T, int NH, int NKV, int HD, int P,
                                  int R, int vec, int* flags) {
  qk_norm_rope_bwd_groups<4, 1>(dqkv, qpart, kpart, dq, dk, dv, qraw, kraw, qrstd, krstd, qw, kw, pos, cos_t, sin_t,
                                  T, NH, NKV, HD, P, R, vec, flags);
}
extern "C" __global__ void __launch_bounds__(QB_THREADS)
    qk_norm_rope_bwd_f32out_g8_c1(float* dqkv, float* qpart, float* kpart, const float* dq, const float* dk,
                                  const float* dv, const float* qraw, const float* kraw, const float* qrstd,
                                  const float* krstd, const float* qw, const float* kw, const int* pos,
                                  const float* cos_t, const float* sin_t, int T, int NH, int NKV, int HD, int P,
                                  int R, int vec, int* flags) {
  qk_norm_rope_bwd_groups<8, 1>(dqkv, qpart, kpart, dq, dk, dv, qraw, kraw, qrstd, krstd, qw, kw, pos, cos_t, sin_t,
                                  T, NH, NKV, HD, P, R, vec, flags);
}
extern "C" __global__ void __launch_bounds__(QB_THREADS)
    qk_norm_rope_bwd_bf16out_g8_c1(tg_bf16* dqkv, float* qpart, float* kpart, const float* dq, const float* dk,
                                  const float* dv, const float* qraw, const float* kraw, const float* qrstd,
                                  const float* krstd, const float* qw, const float* kw, const int* pos,
                                  const float* cos_t, const float* sin_t, int T, int NH, int NKV, int HD, int P,
                                  int R, int vec, int* flags) {
  qk_norm_rope_bwd_groups<8, 1>(dqkv, qpart, kpart, dq, dk, dv, qraw, kraw, qrstd, krstd, qw, kw, pos, cos_t, sin_t,
                                  T, NH, NKV, HD, P, R, vec, flags);
}
extern "C" __global__ void __launch_bounds__(QB_THREADS)
    qk_norm_rope_bwd_f32out_g16_c1(float* dqkv, float* qpart, float* kpart, const float* dq, const float* dk,
                                  const float* dv, const float* qraw, const float* kraw, const float* qrstd,
                                  const float* krstd, const float* qw, const float* kw, const int* pos,
                                  const float* cos_t, const float* sin_t, int T, int NH, int NKV, int HD, int P,
                                  int R, int vec, int* flags) {
  qk_norm_rope_bwd_groups<16, 1>(dqkv, qpart, kpart, dq, dk, dv, qraw, kraw, qrstd, krstd, qw, kw, pos, cos_t, sin_t,
                                  T, NH, NKV, HD, P, R, vec, flags);
}
extern "C" __global__ void __launch_bounds__(QB_THREADS)
    qk_norm_rope_bwd_bf16out_g16_c1(tg_bf16* dqkv, float* qpart, float* kpart, const float* dq, const float* dk,
                                  const float* dv, const float* qraw, const float* kraw, const float* qrstd,
                                  const float* krstd, const float* qw, const float* kw, const int* pos,
                                  const float* cos_t, const float* sin_t, int T, int NH, int NKV, int HD, int P,
                                  int R, int vec, int* flags) {
  qk_norm_rope_bwd_groups<16, 1>(dqkv, qpart, kpart, dq, dk, dv, qraw, kraw, qrstd, krstd, qw, kw, pos, cos_t, sin_t,
                                  T, NH, NKV, HD, P, R, vec, flags);
}
extern "C" __global__ void __launch_bounds__(QB_THREADS)
    qk_norm_rope_bwd_f32out_g32_c1(float* dqkv, float* qpart, float* kpart, const float* dq, const float* dk,
                                  const float* dv, const float* qraw, const float* kraw, const float* qrstd,
                                  const float* krstd, const float* qw, const float* kw, const int* pos,
                                  const float* cos_t, const float* sin_t, int T, int NH, int NKV, int HD, int P,
                                  int R, int vec, int* flags) {
  qk_norm_rope_bwd_groups<32, 1>(dqkv, qpart, kpart, dq, dk, dv, qraw, kraw, qrstd, krstd, qw, kw, pos, cos_t, sin_t,
                                  T, NH, NKV, HD, P, R, vec, flags);
}
extern "C" __global__ void __launch_bounds__(QB_THREADS)
    qk_norm_rope_bwd_bf16out_g32_c1(tg_bf16* dqkv, float* qpart, float* kpart, const float* dq, const float* dk,
                                  const float* dv, const float* qraw, const float* kraw, const float* qrstd,
                                  const float* krstd, const float* qw, const float* kw, const int* pos,
                                  const float* cos_t, const float* sin_t, int T, int NH, int NKV, int HD, int P,
                                  int R, int vec, int* flags) {
  qk_norm_rope_bwd_groups<32, 1>(dqkv, qpart, kpart, dq, dk, dv, qraw, kraw, qrstd, krstd, qw, kw, pos, cos_t, sin_t,
                                  T, NH, NKV, HD, P, R, vec, flags);
}
extern "C" __global__ void __launch_bounds__(QB_THREADS)
    qk_norm_rope_bwd_f32out_g32_c2(float* dqkv, float* qpart, float* kpart, const float* dq, const float* dk,
                                  const float* dv, const float* qraw, const float* kraw, const float* qrstd,
                                  const float* krstd, const float* qw, const float* kw, const int* pos,
                                  const float* cos_t, const float* sin_t, int T, int NH, int NKV, int HD, int P,
                                  int R, int vec, int* flags) {
  qk_norm_rope_bwd_groups<32, 2>(dqkv, qpart, kpart, dq, dk, dv, qraw, kraw, qrstd, krstd, qw, kw, pos, cos_t, sin_t,
                                  T, NH, NKV, HD, P, R, vec, flags);
}
extern "C" __global__ void __launch_bounds__(QB_THREADS)
    qk_norm_rope_bwd_bf16out_g32_c2(tg_bf16* dqkv, float* qpart, float* kpart, const float* dq, const float* dk,
                                  const float* dv, const float* qraw, const float* kraw, const float* qrstd,
                                  const float* krstd, const float* qw, const float* kw, const int* pos,
                                  const float* cos_t, const float* sin_t, int T, int NH, int NKV, int HD, int P,
                                  int R, int vec, int* flags) {
  qk_norm_rope_bwd_groups<32, 2>(dqkv, qpart, kpart, dq, dk, dv, qraw, kraw, qrstd, krstd, qw, kw, pos, cos_t, sin_t,
                                  T, NH, NKV, HD, P, R, vec, flags);
}
extern "C" __global__ void __launch_bounds__(QB_THREADS)
    qk_norm_rope_bwd_f32out_g32_c4(float* dqkv, float* qpart, float* kpart, const float* dq, const float* dk,
                                  const float* dv, const float* qraw, const float* kraw, const float* qrstd,
                                  const float* krstd, const float* qw, const float* kw, const int* pos,
                                  const float* cos_t, const float* sin_t, int T, int NH, int NKV, int HD, int P,
                                  int R, int vec, int* flags) {
  qk_norm_rope_bwd_groups<32, 4>(dqkv, qpart, kpart, dq, dk, dv, qraw, kraw, qrstd, krstd, qw, kw, pos, cos_t, sin_t,
                                  T, NH, NKV, HD, P, R, vec, flags);
}
extern "C" __global__ void __launch_bounds__(QB_THREADS)
    qk_norm_rope_bwd_bf16out_g32_c4(tg_bf16* dqkv, float* qpart, float* kpart, const float* dq, const float* dk,
                                  const float* dv, const float* qraw, const float* kraw, const float* qrstd,
                                  const float* krstd, const float* qw, const float* kw, const int* pos,
                                  const float* cos_t, const float* sin_t, int T, int NH, int NKV, int HD, int P,
                                  int R, int vec, int* flags) {
  qk_norm_rope_bwd_groups<32, 4>(dqkv, qpart, kpart, dq, dk, dv, qraw, kraw, qrstd, krstd, qw, kw, pos, cos_t, sin_t,
                                  T, NH, NKV, HD, P, R, vec, flags);
}
