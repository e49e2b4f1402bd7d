// attention.cu: causal grouped-query attention over packed sequences, fp32,
// FlashAttention-style (online softmax over key tiles; the T×T score matrix is
// never stored). Decode is in attention_decode.cu.
//
//   attention_fwd:   out (T,NH,HD) = softmax(scale·q·kᵀ + causal mask)·v   (=)
//                    lse (T,NH) = log-sum-exp of each query's scaled scores (=)
//   attention_bwd_dot:  D (T,NH) = Σ_d dout·out                           (=)
//   attention_bwd_dq:   dq (T,NH,HD) = scale·Σ_j ds_j·k_j                 (=)
//   attention_bwd_dkdv: dk (T,NKV,HD) = scale·Σ_i ds_i·q_i,
//                       dv (T,NKV,HD) = Σ_i p_i·dout_i  (over the group's heads) (=)
//     with p = exp(scale·q·k − lse), ds = p·(dout·v − D)
//
// q, out, dq, dout (T,NH,HD); k, v, dk, dv (T,NKV,HD); cu (S+1) I32 holds
// the sequence offsets (kernels.Seqs). Sequence s is tokens [cu[s], cu[s+1]),
// positions restart at 0, and a query at position i sees keys 0..i of its own
// sequence. Query head h reads key/value head h/(NH/NKV). HD <= 128.
// Offsets that do not run from 0 to T, or a sequence longer than Seqs.MaxLen
// or of negative length, set TG_ERR_SEQS (the outputs are then unspecified).
//
// Work split: block = 128 threads = 4 warps; a lane owns head dimensions
// d = lane + 32·j, j < 4, of the rows its warp accumulates. Each warp works
// on several rows at once so that one shared-memory read of a key (or query)
// element feeds several FMAs:
//   fwd:  grid (ceil(MaxLen/16), S, NH); a warp owns 4 query rows; for each
//         tile of 32 keys, lane j scores key j against the 4 rows, the warp
//         does the online softmax update per row, and p is broadcast by
//         shuffle for p·V.
//   dq:   grid (ceil(MaxLen/8), S, NH); 2 query rows per warp, same pattern.
//   dkdv: grid (ceil(MaxLen/8), S, NKV); 2 key rows per warp; lane i scores
//         query i of a 32-query tile against both keys, for every query head
//         of the group.
// Every output element is written by one warp in a fixed order: the backward
// pass is deterministic (no atomics). Blocks past the end of a short sequence
// return at once. Shared memory stays under the 48 KiB a block gets without
// opting in (HD = 128: fwd 40.5 KiB, dq 41.1 KiB, dkdv 41.4 KiB).
#include "common.cuh"
#include "bf16.cuh"

#define ATT_THREADS 128
#define ATT_WARPS 4
#define ATT_MAXJ 4  // HD <= 32·ATT_MAXJ
#define BC 32       // keys per tile (one per lane)
#define FWD_R 4     // query rows per warp, forward
#define FWD_BR (ATT_WARPS * FWD_R)
#define DQ_R 2      // query rows per warp, dq
#define DQ_BR (ATT_WARPS * DQ_R)
#define DK_R 2      // key rows per warp, dkdv
#define DK_BC (ATT_WARPS * DK_R)
#define BQ 32       // queries per dkdv tile (one per lane)

// Flags TG_ERR_SEQS for sequence s of length len when it is negative or
// longer than maxlen (Seqs.MaxLen, which sized the grid), or, for s = 0,
// when cu[0] != 0 or cu[S] != T: the checks kernels/cpu makes.
__device__ __forceinline__ void check_seq(const int* cu, int s, int S, int T, int maxlen, int len,
                                          int* flags) {
  if (len < 0 || len > maxlen || (s == 0 && (cu[0] != 0 || cu[S] != T))) atomicOr(flags, TG_ERR_SEQS);
}

template <class TI, class TO>
__device__ __forceinline__ void att_fwd(TO* out, float* lse, const TI* q, const TI* k, const TI* v,
                                        const int* cu, int S, int T, int maxlen, int NH, int NKV,
                                        int HD, float scale, int* flags) {
  TG_DYN_SMEM(float, sm);
  const int s = blockIdx.y, h = blockIdx.z, kvh = h / (NH / NKV);
  const int start = cu[s], len = cu[s + 1] - start;
  if (blockIdx.x == 0 && threadIdx.x == 0) check_seq(cu, s, S, T, maxlen, len, flags);
  if (start < 0 || len < 0 || start + len > T) return;  // flagged; never read outside q, k, v
  const int q0 = blockIdx.x * FWD_BR;
  if (q0 >= len) return;  // whole block
  const int HDP = HD + 1;
  float* Qs = sm;                // (FWD_BR, HD), pre-scaled
  float* Ks = Qs + FWD_BR * HD;  // (BC, HDP)
  float* Vs = Ks + BC * HDP;     // (BC, HD)
  const int tid = threadIdx.x, lane = tid & 31, warp = tid >> 5;
  const int r0 = warp * FWD_R;  // the warp's first row in the block

  for (int i = tid; i < FWD_BR * HD; i += ATT_THREADS) {
    int r = i / HD, d = i % HD, qi = q0 + r;
    Qs[i] = qi < len ? ld_f(q, ((long long)(start + qi) * NH + h) * HD + d) * scale : 0.f;
  }
  float m[FWD_R], l[FWD_R], acc[FWD_R][ATT_MAXJ];
#pragma unroll
  for (int rr = 0; rr < FWD_R; rr++) {
    m[rr] = -TG_INF;
    l[rr] = 0.f;
#pragma unroll
    for (int j = 0; j < ATT_MAXJ; j++) acc[rr][j] = 0.f;
  }
  const int nkeys = min(len, q0 + FWD_BR);  // keys the last row of the block sees
  for (int k0 = 0; k0 < nkeys; k0 += BC) {
    __syncthreads();  // Q loaded; the previous tile is consumed
    for (int i = tid; i < BC * HD; i += ATT_THREADS) {
      int r = i / HD, d = i % HD, kj = k0 + r;
      float kv = 0.f, vv = 0.f;
      if (kj < len) {
        long long off = ((long long)(start + kj) * NKV + kvh) * HD + d;
        kv = ld_f(k, off);
        vv = ld_f(v, off);
      }
      Ks[r * HDP + d] = kv;
      Vs[r * HD + d] = vv;
    }
    __syncthreads();
    // Scores of key k0+lane against the warp's rows.
    float sc[FWD_R];
#pragma unroll
    for (int rr = 0; rr < FWD_R; rr++) sc[rr] = 0.f;
    const float* kr = Ks + lane * HDP;
    const float* qr = Qs + r0 * HD;
    for (int d = 0; d < HD; d++) {
      const float kd = kr[d];
#pragma unroll
      for (int rr = 0; rr < FWD_R; rr++) sc[rr] += qr[rr * HD + d] * kd;
    }
    const int kj = k0 + lane;
    float p[FWD_R];
#pragma unroll
    for (int rr = 0; rr < FWD_R; rr++) {
      const int qi = q0 + r0 + rr;
      if (!(qi < len && kj <= qi)) sc[rr] = -TG_INF;
      const float mnew = fmaxf(m[rr], warp_max(sc[rr]));
      p[rr] = sc[rr] == -TG_INF ? 0.f : expf(sc[rr] - mnew);
      const float alpha = m[rr] == -TG_INF ? 0.f : expf(m[rr] - mnew);
      l[rr] = l[rr] * alpha + warp_sum(p[rr]);
      m[rr] = mnew;
#pragma unroll
      for (int j = 0; j < ATT_MAXJ; j++) acc[rr][j] *= alpha;
    }
    for (int jj = 0; jj < BC; jj++) {
      float vd[ATT_MAXJ];
#pragma unroll
      for (int j = 0; j < ATT_MAXJ; j++) {
        int d = lane + 32 * j;
        vd[j] = d < HD ? Vs[jj * HD + d] : 0.f;
      }
#pragma unroll
      for (int rr = 0; rr < FWD_R; rr++) {
        const float pj = __shfl_sync(TG_FULL, p[rr], jj);
#pragma unroll
        for (int j = 0; j < ATT_MAXJ; j++) acc[rr][j] += pj * vd[j];
      }
    }
  }
#pragma unroll
  for (int rr = 0; rr < FWD_R; rr++) {
    const int qi = q0 + r0 + rr;
    if (qi < len) {
      const long long row = (long long)(start + qi) * NH + h;
      const float inv = 1.f / l[rr];  // l >= 1: key qi itself is always seen
#pragma unroll
      for (int j = 0; j < ATT_MAXJ; j++) {
        int d = lane + 32 * j;
        if (d < HD) st_f(out, row * HD + d, acc[rr][j] * inv);
      }
      if (lane == 0) lse[row] = m[rr] + logf(l[rr]);
    }
  }
}

// The fp32 path, and the path of bf16 operands the tensor-core kernels do
// not take (another head dimension, unaligned views): bf16 is widened as it
// is loaded into shared memory.
#define ATT_FWD_ARGS                                                                            \
  const int *cu, int S, int T, int maxlen, int NH, int NKV, int HD, float scale, int *flags
#define ATT_FWD_CALL cu, S, T, maxlen, NH, NKV, HD, scale, flags
extern "C" __global__ void __launch_bounds__(ATT_THREADS)
    attention_fwd(float* out, float* lse, const float* q, const float* k, const float* v, ATT_FWD_ARGS) {
  att_fwd(out, lse, q, k, v, ATT_FWD_CALL);
}
extern "C" __global__ void __launch_bounds__(ATT_THREADS)
    attention_fwd_bf16out(tg_bf16* out, float* lse, const float* q, const float* k, const float* v,
                          ATT_FWD_ARGS) {
  att_fwd(out, lse, q, k, v, ATT_FWD_CALL);
}
extern "C" __global__ void __launch_bounds__(ATT_THREADS)
    attention_fwd_bf16(tg_bf16* out, float* lse, const tg_bf16* q, const tg_bf16* k, const tg_bf16* v,
                       ATT_FWD_ARGS) {
  att_fwd(out, lse, q, k, v, ATT_FWD_CALL);
}
extern "C" __global__ void __launch_bounds__(ATT_THREADS)
    attention_fwd_bf16_f32out(float* out, float* lse, const tg_bf16* q, const tg_bf16* k,
                              const tg_bf16* v, ATT_FWD_ARGS) {
  att_fwd(out, lse, q, k, v, ATT_FWD_CALL);
}

// D (T·NH) = Σ_d dout·out, one warp per row.
template <class TI>
__device__ __forceinline__ void att_bwd_dot(float* D, const TI* dout, const TI* out, long long rows,
                                            int HD) {
  const int lane = threadIdx.x & 31;
  const long long nwarps = (long long)gridDim.x * (blockDim.x >> 5);
  for (long long row = (long long)blockIdx.x * (blockDim.x >> 5) + (threadIdx.x >> 5); row < rows;
       row += nwarps) {
    float s = 0.f;
    for (int d = lane; d < HD; d += 32) s += ld_f(dout, row * HD + d) * ld_f(out, row * HD + d);
    s = warp_sum(s);
    if (lane == 0) D[row] = s;
  }
}
extern "C" __global__ void attention_bwd_dot(float* D, const float* dout, const float* out,
                                             long long rows, int HD) {
  att_bwd_dot(D, dout, out, rows, HD);
}
extern "C" __global__ void attention_bwd_dot_bf16(float* D, const tg_bf16* dout, const tg_bf16* out,
                                                  long long rows, int HD) {
  att_bwd_dot(D, dout, out, rows, HD);
}

template <class TI>
__device__ __forceinline__ void att_bwd_dq(float* dq, const TI* dout, const float* lse, const float* D,
                                           const TI* q, const TI* k, const TI* v, const int* cu,
                                           int S, int T, int maxlen, int NH, int NKV, int HD,
                                           float scale, int* flags) {
  TG_DYN_SMEM(float, sm);
  const int s = blockIdx.y, h = blockIdx.z, kvh = h / (NH / NKV);
  const int start = cu[s], len = cu[s + 1] - start;
  if (blockIdx.x == 0 && threadIdx.x == 0) check_seq(cu, s, S, T, maxlen, len, flags);
  if (start < 0 || len < 0 || start + len > T) return;  // flagged; never read outside q, k, v
  const int q0 = blockIdx.x * DQ_BR;
  if (q0 >= len) return;
  const int HDP = HD + 1;
  float* Qs = sm;                // (DQ_BR, HD), pre-scaled
  float* dOs = Qs + DQ_BR * HD;  // (DQ_BR, HD)
  float* Ks = dOs + DQ_BR * HD;  // (BC, HDP)
  float* Vs = Ks + BC * HDP;     // (BC, HDP)
  const int tid = threadIdx.x, lane = tid & 31, warp = tid >> 5;
  const int r0 = warp * DQ_R;
  for (int i = tid; i < DQ_BR * HD; i += ATT_THREADS) {
    int r = i / HD, d = i % HD, qi = q0 + r;
    long long off = ((long long)(start + qi) * NH + h) * HD + d;
    Qs[i] = qi < len ? ld_f(q, off) * scale : 0.f;
    dOs[i] = qi < len ? ld_f(dout, off) : 0.f;
  }
  float Li[DQ_R], Di[DQ_R], acc[DQ_R][ATT_MAXJ];
#pragma unroll
  for (int rr = 0; rr < DQ_R; rr++) {
    const int qi = q0 + r0 + rr;
    const long long row = (long long)(start + qi) * NH + h;
    Li[rr] = qi < len ? lse[row] : 0.f;
    Di[rr] = qi < len ? D[row] : 0.f;
#pragma unroll
    for (int j = 0; j < ATT_MAXJ; j++) acc[rr][j] = 0.f;
  }
  const int nkeys = min(len, q0 + DQ_BR);
  for (int k0 = 0; k0 < nkeys; k0 += BC) {
    __syncthreads();
    for (int i = tid; i < BC * HD; i += ATT_THREADS) {
      int r = i / HD, d = i % HD, kj = k0 + r;
      float kv = 0.f, vv = 0.f;
      if (kj < len) {
        long long off = ((long long)(start + kj) * NKV + kvh) * HD + d;
        kv = ld_f(k, off);
        vv = ld_f(v, off);
      }
      Ks[r * HDP + d] = kv;
      Vs[r * HDP + d] = vv;
    }
    __syncthreads();
    const int kj = k0 + lane;
    float sc[DQ_R], dp[DQ_R];
#pragma unroll
    for (int rr = 0; rr < DQ_R; rr++) sc[rr] = dp[rr] = 0.f;
    const float* kr = Ks + lane * HDP;
    const float* vr = Vs + lane * HDP;
    const float* qr = Qs + r0 * HD;
    const float* gr = dOs + r0 * HD;
    for (int d = 0; d < HD; d++) {
      const float kd = kr[d], vd = vr[d];
#pragma unroll
      for (int rr = 0; rr < DQ_R; rr++) {
        sc[rr] += qr[rr * HD + d] * kd;
        dp[rr] += gr[rr * HD + d] * vd;
      }
    }
    float ds[DQ_R];
#pragma unroll
    for (int rr = 0; rr < DQ_R; rr++) {
      const int qi = q0 + r0 + rr;
      ds[rr] = (qi < len && kj <= qi) ? expf(sc[rr] - Li[rr]) * (dp[rr] - Di[rr]) : 0.f;
    }
    for (int jj = 0; jj < BC; jj++) {
      float kd[ATT_MAXJ];
#pragma unroll
      for (int j = 0; j < ATT_MAXJ; j++) {
        int d = lane + 32 * j;
        kd[j] = d < HD ? Ks[jj * HDP + d] : 0.f;
      }
#pragma unroll
      for (int rr = 0; rr < DQ_R; rr++) {
        const float dsj = __shfl_sync(TG_FULL, ds[rr], jj);
#pragma unroll
        for (int j = 0; j < ATT_MAXJ; j++) acc[rr][j] += dsj * kd[j];
      }
    }
  }
#pragma unroll
  for (int rr = 0; rr < DQ_R; rr++) {
    const int qi = q0 + r0 + rr;
    if (qi < len) {
      const long long row = (long long)(start + qi) * NH + h;
#pragma unroll
      for (int j = 0; j < ATT_MAXJ; j++) {
        int d = lane + 32 * j;
        if (d < HD) dq[row * HD + d] = acc[rr][j] * scale;
      }
    }
  }
}

#define ATT_BWD_ARGS                                                                               \
  const int *cu, int S, int T, int maxlen, int NH, int NKV, int HD, float scale, int *flags
#define ATT_BWD_CALL cu, S, T, maxlen, NH, NKV, HD, scale, flags
extern "C" __global__ void __launch_bounds__(ATT_THREADS)
    attention_bwd_dq(float* dq, const float* dout, const float* lse, const float* D, const float* q,
                     const float* k, const float* v, ATT_BWD_ARGS) {
  att_bwd_dq(dq, dout, lse, D, q, k, v, ATT_BWD_CALL);
}
extern "C" __global__ void __launch_bounds__(ATT_THREADS)
    attention_bwd_dq_bf16(float* dq, const tg_bf16* dout, const float* lse, const float* D,
                          const tg_bf16* q, const tg_bf16* k, const tg_bf16* v, ATT_BWD_ARGS) {
  att_bwd_dq(dq, dout, lse, D, q, k, v, ATT_BWD_CALL);
}

template <class TI>
__device__ __forceinline__ void att_bwd_dkdv(float* dk, float* dv, const TI* dout, const float* lse,
                                             const float* D, const TI* q, const TI* k, const TI* v,
                                             const int* cu, int S, int T, int maxlen, int NH,
                                             int NKV, int HD, float scale, int* flags) {
  TG_DYN_SMEM(float, sm);
  const int s = blockIdx.y, kvh = blockIdx.z, G = NH / NKV;
  const int start = cu[s], len = cu[s + 1] - start;
  if (blockIdx.x == 0 && threadIdx.x == 0) check_seq(cu, s, S, T, maxlen, len, flags);
  if (start < 0 || len < 0 || start + len > T) return;  // flagged; never read outside q, k, v
  const int k0 = blockIdx.x * DK_BC;
  if (k0 >= len) return;
  const int HDP = HD + 1;
  float* Ks = sm;                 // (DK_BC, HD)
  float* Vs = Ks + DK_BC * HD;    // (DK_BC, HD)
  float* Qs = Vs + DK_BC * HD;    // (BQ, HDP), pre-scaled
  float* dOs = Qs + BQ * HDP;     // (BQ, HDP)
  float* Ls = dOs + BQ * HDP;     // (BQ)
  float* Ds = Ls + BQ;            // (BQ)
  const int tid = threadIdx.x, lane = tid & 31, warp = tid >> 5;
  const int r0 = warp * DK_R;  // the warp's first key row in the block
  for (int i = tid; i < DK_BC * HD; i += ATT_THREADS) {
    int r = i / HD, d = i % HD, kj = k0 + r;
    float kv = 0.f, vv = 0.f;
    if (kj < len) {
      long long off = ((long long)(start + kj) * NKV + kvh) * HD + d;
      kv = ld_f(k, off);
      vv = ld_f(v, off);
    }
    Ks[i] = kv;
    Vs[i] = vv;
  }
  float adk[DK_R][ATT_MAXJ], adv[DK_R][ATT_MAXJ];
#pragma unroll
  for (int rr = 0; rr < DK_R; rr++)
#pragma unroll
    for (int j = 0; j < ATT_MAXJ; j++) adk[rr][j] = adv[rr][j] = 0.f;
  for (int g = 0; g < G; g++) {
    const int h = kvh * G + g;
    for (int i0 = k0; i0 < len; i0 += BQ) {
      __syncthreads();  // K/V loaded; the previous query tile is consumed
      for (int i = tid; i < BQ * HD; i += ATT_THREADS) {
        int r = i / HD, d = i % HD, qi = i0 + r;
        float qv = 0.f, gv = 0.f;
        if (qi < len) {
          long long off = ((long long)(start + qi) * NH + h) * HD + d;
          qv = ld_f(q, off) * scale;
          gv = ld_f(dout, off);
        }
        Qs[r * HDP + d] = qv;
        dOs[r * HDP + d] = gv;
      }
      for (int r = tid; r < BQ; r += ATT_THREADS) {
        int qi = i0 + r;
        long long row = (long long)(start + qi) * NH + h;
        Ls[r] = qi < len ? lse[row] : 0.f;
        Ds[r] = qi < len ? D[row] : 0.f;
      }
      __syncthreads();
      // Query i0+lane against the warp's key rows.
      const int qi = i0 + lane;
      float sc[DK_R], dp[DK_R];
#pragma unroll
      for (int rr = 0; rr < DK_R; rr++) sc[rr] = dp[rr] = 0.f;
      const float* qr = Qs + lane * HDP;
      const float* gr = dOs + lane * HDP;
      const float* kr = Ks + r0 * HD;
      const float* vr = Vs + r0 * HD;
      for (int d = 0; d < HD; d++) {
        const float qd = qr[d], gd = gr[d];
#pragma unroll
        for (int rr = 0; rr < DK_R; rr++) {
          sc[rr] += qd * kr[rr * HD + d];
          dp[rr] += gd * vr[rr * HD + d];
        }
      }
      float p[DK_R], ds[DK_R];
#pragma unroll
      for (int rr = 0; rr < DK_R; rr++) {
        const int kj = k0 + r0 + rr;
        if (kj < len && qi < len && qi >= kj) {
          p[rr] = expf(sc[rr] - Ls[lane]);
          ds[rr] = p[rr] * (dp[rr] - Ds[lane]);
        } else {
          p[rr] = ds[rr] = 0.f;
        }
      }
      for (int ii = 0; ii < BQ; ii++) {
        float gd[ATT_MAXJ], qd[ATT_MAXJ];
#pragma unroll
        for (int j = 0; j < ATT_MAXJ; j++) {
          int d = lane + 32 * j;
          gd[j] = d < HD ? dOs[ii * HDP + d] : 0.f;
          qd[j] = d < HD ? Qs[ii * HDP + d] : 0.f;  // Qs holds scale·q
        }
#pragma unroll
        for (int rr = 0; rr < DK_R; rr++) {
          const float pi = __shfl_sync(TG_FULL, p[rr], ii);
          const float dsi = __shfl_sync(TG_FULL, ds[rr], ii);
#pragma unroll
          for (int j = 0; j < ATT_MAXJ; j++) {
            adv[rr][j] += pi * gd[j];
            adk[rr][j] += dsi * qd[j];
          }
        }
      }
    }
  }
#pragma unroll
  for (int rr = 0; rr < DK_R; rr++) {
    const int kj = k0 + r0 + rr;
    if (kj < len) {
      const long long row = (long long)(start + kj) * NKV + kvh;
#pragma unroll
      for (int j = 0; j < ATT_MAXJ; j++) {
        int d = lane + 32 * j;
        if (d < HD) {
          dk[row * HD + d] = adk[rr][j];
          dv[row * HD + d] = adv[rr][j];
        }
      }
    }
  }
}

extern "C" __global__ void __launch_bounds__(ATT_THREADS)
    attention_bwd_dkdv(float* dk, float* dv, const float* dout, const float* lse, const float* D,
                       const float* q, const float* k, const float* v, ATT_BWD_ARGS) {
  att_bwd_dkdv(dk, dv, dout, lse, D, q, k, v, ATT_BWD_CALL);
}
extern "C" __global__ void __launch_bounds__(ATT_THREADS)
    attention_bwd_dkdv_bf16(float* dk, float* dv, const tg_bf16* dout, const float* lse,
                            const float* D, const tg_bf16* q, const tg_bf16* k, const tg_bf16* v,
                            ATT_BWD_ARGS) {
  att_bwd_dkdv(dk, dv, dout, lse, D, q, k, v, ATT_BWD_CALL);
}

// ---------------------------------------------------------------------------
// The tensor-core path: bf16 q, k, v (and dout, out), head_dim 64 or 128,
// FlashAttention-2 style on mma.sync m16n8k16 with fp32 accumulation.
//
// Every tile is a (rows, HD) bf16 block of one head staged in shared memory
// with rows HD+8 elements apart (16 bytes of padding make the 8 row
// addresses of an ldmatrix hit different banks), loaded by cp.async in
// 16-byte chunks; chunk c of a tile is row c / (HD/8), column (c % (HD/8))·8
// with HD/8 a compile-time power of two (a shift and a mask, no division).
// Rows past the sequence are zero-filled. Scores are scaled into the log2
// domain once (sl2 = scale·log2 e) so the softmax uses exp2.
//
//   attention_fwd_tc_hdD_{bf16,f32}out: grid (ceil(MaxLen/64), S, NH), 4
//     warps; warp w owns query rows 16w..16w+15 of the block's 64, keeps its
//     Q fragments in registers and, per tile of 64 keys: S = Q·Kᵀ (mma),
//     the causal/length mask on the tiles that need it, the online softmax
//     per row (the 4 lanes of a row combine by shuffles), then O += P·V with
//     P packed to bf16 straight from the accumulator registers. V's load
//     overlaps S, the next K's overlaps P·V. Heavy (late) query tiles are
//     scheduled first. out (bf16 or f32) =, lse (fp32) =.
//   attention_bwd_dot_bf16 (above): D (T,NH) = Σ_d dout·out             (=)
//   attention_bwd_dq_tc_hdD: grid (ceil(MaxLen/64), S, NH); warp w owns 16
//     query rows, Q and dO fragments in registers; per key tile (BCQ keys,
//     double-buffered): S = Q·Kᵀ, dP = dO·Vᵀ, dS = P∘(dP − D), dQ += dS·K;
//     dq = scale·dQ (fp32) =.
//   attention_bwd_dkdv_tc_hdD: grid (ceil(MaxLen/64), S, NKV); warp w owns
//     16 key rows; for every query head of the group and query tile (BQK
//     queries, double-buffered with its lse and D) at or after the block's
//     first key: Sᵀ = K·Qᵀ, dPᵀ = V·dOᵀ, dV += Pᵀ·dO, dK += dSᵀ·Q;
//     dk = scale·dK, dv = dV (fp32) =.
// The backward pass is deterministic: every output element is accumulated
// by one warp in a fixed order (no atomics; dq is its own kernel instead of
// FlashAttention-2's atomic adds, at the cost of recomputing S and dP).
// P and dS are rounded to bf16 as mma operands, as in FlashAttention-2.
// ---------------------------------------------------------------------------
#include "attention_tc.cuh"

template <int HD, class TO>
__device__ __forceinline__ void att_fwd_tc(TO* out, float* lse, const tg_bf16* q, const tg_bf16* k,
                                           const tg_bf16* v, const int* cu, int S, int T, int maxlen,
                                           int NH, int NKV, float sl2, int* flags) {
  constexpr int MQ = TC_ROWS, NK = 64, LD = HD + 8, KS = HD / 16, NT = NK / 8, DT = HD / 8;
  TG_DYN_SMEM_ALIGNED(tg_bf16, sm_tc);
  tg_bf16* Qs = sm_tc;            // (MQ, LD)
  tg_bf16* Ks = Qs + MQ * LD;  // (NK, LD)
  tg_bf16* Vs = Ks + NK * LD;  // (NK, LD)
  const int s = blockIdx.y, h = blockIdx.z, kvh = h / (NH / NKV);
  const int start = cu[s], len = cu[s + 1] - start;
  if (blockIdx.x == 0 && threadIdx.x == 0) check_seq(cu, s, S, T, maxlen, len, flags);
  if (start < 0 || len < 0 || start + len > T) return;  // flagged; never read outside q, k, v
  const int q0 = (gridDim.x - 1 - blockIdx.x) * MQ;    // the longest rows first
  if (q0 >= len) return;
  const int lane = threadIdx.x & 31, warp = threadIdx.x >> 5, g = lane >> 2, t = lane & 3;
  tc_load<MQ, HD>(Qs, q, start + q0, len - q0, NH, h);
  tc_load<NK, HD>(Ks, k, start, len, NKV, kvh);
  cp_async_commit();
  cp_async_wait<0>();
  __syncthreads();
  unsigned qf[KS][4];
#pragma unroll
  for (int kk = 0; kk < KS; kk++) tc_frag_a<HD>(qf[kk], Qs, warp * 16, kk * 16, lane);
  float o[DT][4], m[2] = {-TG_INF, -TG_INF}, l[2] = {0.f, 0.f};
#pragma unroll
  for (int j = 0; j < DT; j++) o[j][0] = o[j][1] = o[j][2] = o[j][3] = 0.f;
  const int row0 = q0 + warp * 16 + g;  // this lane's rows: row0 and row0 + 8
  const int nkeys = min(len, q0 + MQ);
  for (int k0 = 0; k0 < nkeys; k0 += NK) {
    tc_load<NK, HD>(Vs, v, start + k0, len - k0, NKV, kvh);
    cp_async_commit();
    float sc[NT][4];
#pragma unroll
    for (int j = 0; j < NT; j++) sc[j][0] = sc[j][1] = sc[j][2] = sc[j][3] = 0.f;
#pragma unroll
    for (int kk = 0; kk < KS; kk++) {
#pragma unroll
      for (int jp = 0; jp < NT / 2; jp++) {
        unsigned b[4];
        tc_frag_b<HD>(b, Ks, jp * 16, kk * 16, lane);
        mma_bf16_16816(sc[2 * jp], qf[kk], b);
        mma_bf16_16816(sc[2 * jp + 1], qf[kk], b + 2);
      }
    }
    if (k0 + NK > q0 + warp * 16 || k0 + NK > len) {  // the diagonal or the end in this tile
#pragma unroll
      for (int j = 0; j < NT; j++)
#pragma unroll
        for (int i = 0; i < 4; i++) {
          const int key = k0 + 8 * j + 2 * t + (i & 1), row = row0 + 8 * (i >> 1);
          if (key > row || key >= len) sc[j][i] = -TG_INF;
        }
    }
#pragma unroll
    for (int r = 0; r < 2; r++) {
      float mx = -TG_INF;
#pragma unroll
      for (int j = 0; j < NT; j++) mx = fmaxf(mx, fmaxf(sc[j][2 * r], sc[j][2 * r + 1]));
      mx = fmaxf(mx, __shfl_xor_sync(TG_FULL, mx, 1));
      mx = fmaxf(mx, __shfl_xor_sync(TG_FULL, mx, 2));
      const float mnew = fmaxf(m[r], mx * sl2);
      const float muse = mnew == -TG_INF ? 0.f : mnew;  // a row with nothing seen yet
      const float alpha = exp2f(m[r] - muse);
      m[r] = mnew;
      float ls = 0.f;
#pragma unroll
      for (int j = 0; j < NT; j++) {
        sc[j][2 * r] = exp2f(fmaf(sc[j][2 * r], sl2, -muse));
        sc[j][2 * r + 1] = exp2f(fmaf(sc[j][2 * r + 1], sl2, -muse));
        ls += sc[j][2 * r] + sc[j][2 * r + 1];
      }
      l[r] = l[r] * alpha + ls;  // this lane's part of the row sum
#pragma unroll
      for (int j = 0; j < DT; j++) {
        o[j][2 * r] *= alpha;
        o[j][2 * r + 1] *= alpha;
      }
    }
    cp_async_wait<0>();  // V landed
    __syncthreads();     // and every warp is done with K
    if (k0 + NK < nkeys) tc_load<NK, HD>(Ks, k, start + k0 + NK, len - k0 - NK, NKV, kvh);
    cp_async_commit();
#pragma unroll
    for (int kk = 0; kk < NK / 16; kk++) {
      unsigned a[4];
      tc_pack_a(a, sc[2 * kk], sc[2 * kk + 1]);
#pragma unroll
      for (int jp = 0; jp < DT / 2; jp++) {
        unsigned b[4];
        tc_frag_bt<HD>(b, Vs, kk * 16, jp * 16, lane);
        mma_bf16_16816(o[2 * jp], a, b);
        mma_bf16_16816(o[2 * jp + 1], a, b + 2);
      }
    }
    cp_async_wait<0>();  // the next K landed
    __syncthreads();     // and every warp is done with V
  }
#pragma unroll
  for (int r = 0; r < 2; r++) {
    l[r] += __shfl_xor_sync(TG_FULL, l[r], 1);
    l[r] += __shfl_xor_sync(TG_FULL, l[r], 2);
    const int qi = row0 + 8 * r;
    if (qi < len) {
      const long long row = (long long)(start + qi) * NH + h;
      const float inv = 1.f / l[r];  // l >= 1: key qi itself is always seen
#pragma unroll
      for (int j = 0; j < DT; j++) {
        st_f(out, row * HD + 8 * j + 2 * t, o[j][2 * r] * inv);
        st_f(out, row * HD + 8 * j + 2 * t + 1, o[j][2 * r + 1] * inv);
      }
      if (t == 0) lse[row] = m[r] * TC_LN2 + logf(l[r]);
    }
  }
}

extern "C" __global__ void __launch_bounds__(TC_THREADS, 2)
    attention_fwd_tc_hd64_bf16out(tg_bf16* out, float* lse, const tg_bf16* q, const tg_bf16* k, const tg_bf16* v,
        const int* cu, int S, int T, int maxlen, int NH, int NKV, float sl2, int* flags) {
  att_fwd_tc<64, tg_bf16>(out, lse, q, k, v, cu, S, T, maxlen, NH, NKV, sl2, flags);
}
extern "C" __global__ void __launch_bounds__(TC_THREADS, 2)
    attention_fwd_tc_hd64_f32out(float* out, float* lse, const tg_bf16* q, const tg_bf16* k, const tg_bf16* v,
        const int* cu, int S, int T, int maxlen, int NH, int NKV, float sl2, int* flags) {
  att_fwd_tc<64, float>(out, lse, q, k, v, cu, S, T, maxlen, NH, NKV, sl2, flags);
}
extern "C" __global__ void __launch_bounds__(TC_THREADS, 2)
    attention_fwd_tc_hd128_bf16out(tg_bf16* out, float* lse, const tg_bf16* q, const tg_bf16* k, const tg_bf16* v,
        const int* cu, int S, int T, int maxlen, int NH, int NKV, float sl2, int* flags) {
  att_fwd_tc<128, tg_bf16>(out, lse, q, k, v, cu, S, T, maxlen, NH, NKV, sl2, flags);
}
extern "C" __global__ void __launch_bounds__(TC_THREADS, 2)
    attention_fwd_tc_hd128_f32out(float* out, float* lse, const tg_bf16* q, const tg_bf16* k, const tg_bf16* v,
        const int* cu, int S, int T, int maxlen, int NH, int NKV, float sl2, int* flags) {
  att_fwd_tc<128, float>(out, lse, q, k, v, cu, S, T, maxlen, NH, NKV, sl2, flags);
}

template <int HD, int NK>
__device__ __forceinline__ void att_bwd_dq_tc(float* dq, const tg_bf16* dout, const float* lse,
                                              const float* D, const tg_bf16* q, const tg_bf16* k,
                                              const tg_bf16* v, const int* cu, int S, int T,
                                              int maxlen, int NH, int NKV, float scale, float sl2,
                                              int* flags) {
  constexpr int MQ = TC_ROWS, LD = HD + 8, KS = HD / 16, NT = NK / 8, DT = HD / 8;
  TG_DYN_SMEM_ALIGNED(tg_bf16, sm_tc);
  tg_bf16* Qs = sm_tc;              // (MQ, LD)
  tg_bf16* dOs = Qs + MQ * LD;   // (MQ, LD)
  tg_bf16* Ks = dOs + MQ * LD;   // 2 × (NK, LD)
  tg_bf16* Vs = Ks + 2 * NK * LD; // 2 × (NK, LD)
  const int s = blockIdx.y, h = blockIdx.z, kvh = h / (NH / NKV);
  const int start = cu[s], len = cu[s + 1] - start;
  if (blockIdx.x == 0 && threadIdx.x == 0) check_seq(cu, s, S, T, maxlen, len, flags);
  if (start < 0 || len < 0 || start + len > T) return;
  const int q0 = (gridDim.x - 1 - blockIdx.x) * MQ;
  if (q0 >= len) return;
  const int lane = threadIdx.x & 31, warp = threadIdx.x >> 5, g = lane >> 2, t = lane & 3;
  tc_load<MQ, HD>(Qs, q, start + q0, len - q0, NH, h);
  tc_load<MQ, HD>(dOs, dout, start + q0, len - q0, NH, h);
  tc_load<NK, HD>(Ks, k, start, len, NKV, kvh);
  tc_load<NK, HD>(Vs, v, start, len, NKV, kvh);
  cp_async_commit();
  const int row0 = q0 + warp * 16 + g;
  float L2[2], Dr[2];
#pragma unroll
  for (int r = 0; r < 2; r++) {
    const int qi = row0 + 8 * r;
    const long long row = (long long)(start + qi) * NH + h;
    L2[r] = qi < len ? lse[row] * TC_LOG2E : 0.f;
    Dr[r] = qi < len ? D[row] : 0.f;
  }
  cp_async_wait<0>();
  __syncthreads();
  unsigned qf[KS][4], df[KS][4];
#pragma unroll
  for (int kk = 0; kk < KS; kk++) {
    tc_frag_a<HD>(qf[kk], Qs, warp * 16, kk * 16, lane);
    tc_frag_a<HD>(df[kk], dOs, warp * 16, kk * 16, lane);
  }
  float acc[DT][4];
#pragma unroll
  for (int j = 0; j < DT; j++) acc[j][0] = acc[j][1] = acc[j][2] = acc[j][3] = 0.f;
  const int nkeys = min(len, q0 + MQ);
  for (int k0 = 0, buf = 0; k0 < nkeys; k0 += NK, buf ^= 1) {
    const tg_bf16* Kb = Ks + buf * NK * LD;
    const tg_bf16* Vb = Vs + buf * NK * LD;
    if (k0 + NK < nkeys) {
      tc_load<NK, HD>(Ks + (buf ^ 1) * NK * LD, k, start + k0 + NK, len - k0 - NK, NKV, kvh);
      tc_load<NK, HD>(Vs + (buf ^ 1) * NK * LD, v, start + k0 + NK, len - k0 - NK, NKV, kvh);
    }
    cp_async_commit();
    float sc[NT][4], dp[NT][4];
#pragma unroll
    for (int j = 0; j < NT; j++)
#pragma unroll
      for (int i = 0; i < 4; i++) sc[j][i] = dp[j][i] = 0.f;
#pragma unroll
    for (int kk = 0; kk < KS; kk++) {
#pragma unroll
      for (int jp = 0; jp < NT / 2; jp++) {
        unsigned b[4];
        tc_frag_b<HD>(b, Kb, jp * 16, kk * 16, lane);
        mma_bf16_16816(sc[2 * jp], qf[kk], b);
        mma_bf16_16816(sc[2 * jp + 1], qf[kk], b + 2);
        tc_frag_b<HD>(b, Vb, jp * 16, kk * 16, lane);
        mma_bf16_16816(dp[2 * jp], df[kk], b);
        mma_bf16_16816(dp[2 * jp + 1], df[kk], b + 2);
      }
    }
    const bool edge = k0 + NK > q0 + warp * 16 || k0 + NK > len;
#pragma unroll
    for (int j = 0; j < NT; j++)
#pragma unroll
      for (int i = 0; i < 4; i++) {
        const int r = i >> 1, key = k0 + 8 * j + 2 * t + (i & 1), row = row0 + 8 * r;
        const float p = edge && (key > row || key >= len || row >= len)
                            ? 0.f
                            : exp2f(fmaf(sc[j][i], sl2, -L2[r]));
        sc[j][i] = p * (dp[j][i] - Dr[r]);  // dS
      }
#pragma unroll
    for (int kk = 0; kk < NK / 16; kk++) {
      unsigned a[4];
      tc_pack_a(a, sc[2 * kk], sc[2 * kk + 1]);
#pragma unroll
      for (int jp = 0; jp < DT / 2; jp++) {
        unsigned b[4];
        tc_frag_bt<HD>(b, Kb, kk * 16, jp * 16, lane);
        mma_bf16_16816(acc[2 * jp], a, b);
        mma_bf16_16816(acc[2 * jp + 1], a, b + 2);
      }
    }
    cp_async_wait<0>();  // the next K, V landed
    __syncthreads();     // and every warp is done with this buffer
  }
#pragma unroll
  for (int r = 0; r < 2; r++) {
    const int qi = row0 + 8 * r;
    if (qi < len) {
      const long long row = (long long)(start + qi) * NH + h;
#pragma unroll
      for (int j = 0; j < DT; j++) {
        dq[row * HD + 8 * j + 2 * t] = acc[j][2 * r] * scale;
        dq[row * HD + 8 * j + 2 * t + 1] = acc[j][2 * r + 1] * scale;
      }
    }
  }
}

extern "C" __global__ void __launch_bounds__(TC_THREADS, 2)
    attention_bwd_dq_tc_hd64(float* dq, const tg_bf16* dout, const float* lse, const float* D, const tg_bf16* q,
        const tg_bf16* k, const tg_bf16* v, const int* cu, int S, int T, int maxlen, int NH,
        int NKV, float scale, float sl2, int* flags) {
  att_bwd_dq_tc<64, 64>(dq, dout, lse, D, q, k, v, cu, S, T, maxlen, NH, NKV, scale, sl2, flags);
}
extern "C" __global__ void __launch_bounds__(TC_THREADS, 2)
    attention_bwd_dq_tc_hd128(float* dq, const tg_bf16* dout, const float* lse, const float* D, const tg_bf16* q,
        const tg_bf16* k, const tg_bf16* v, const int* cu, int S, int T, int maxlen, int NH,
        int NKV, float scale, float sl2, int* flags) {
  att_bwd_dq_tc<128, 32>(dq, dout, lse, D, q, k, v, cu, S, T, maxlen, NH, NKV, scale, sl2, flags);
}

template <int HD, int NQ>
__device__ __forceinline__ void att_bwd_dkdv_tc(float* dk, float* dv, const tg_bf16* dout,
                                                const float* lse, const float* D, const tg_bf16* q,
                                                const tg_bf16* k, const tg_bf16* v, const int* cu,
                                                int S, int T, int maxlen, int NH, int NKV,
                                                float scale, float sl2, int* flags) {
  constexpr int MK = TC_ROWS, LD = HD + 8, KS = HD / 16, NT = NQ / 8, DT = HD / 8;
  TG_DYN_SMEM_ALIGNED(tg_bf16, sm_tc);
  tg_bf16* Ks = sm_tc;                // (MK, LD)
  tg_bf16* Vs = Ks + MK * LD;      // (MK, LD)
  tg_bf16* Qs = Vs + MK * LD;      // 2 × (NQ, LD)
  tg_bf16* dOs = Qs + 2 * NQ * LD; // 2 × (NQ, LD)
  float* Ls = (float*)(dOs + 2 * NQ * LD);  // 2 × (NQ): lse·log2 e
  float* Ds = Ls + 2 * NQ;                  // 2 × (NQ)
  const int s = blockIdx.y, kvh = blockIdx.z, G = NH / NKV;
  const int start = cu[s], len = cu[s + 1] - start;
  if (blockIdx.x == 0 && threadIdx.x == 0) check_seq(cu, s, S, T, maxlen, len, flags);
  if (start < 0 || len < 0 || start + len > T) return;
  const int k0 = blockIdx.x * MK;  // the first key blocks have the most work and go first
  if (k0 >= len) return;
  const int lane = threadIdx.x & 31, warp = threadIdx.x >> 5, g = lane >> 2, t = lane & 3;
  const int ntq = (len - k0 + NQ - 1) / NQ, nit = G * ntq;  // query tiles per head, in all
  tc_load<MK, HD>(Ks, k, start + k0, len - k0, NKV, kvh);
  tc_load<MK, HD>(Vs, v, start + k0, len - k0, NKV, kvh);
  tc_load<NQ, HD>(Qs, q, start + k0, len - k0, NH, kvh * G);
  tc_load<NQ, HD>(dOs, dout, start + k0, len - k0, NH, kvh * G);
  cp_async_commit();
  tc_load_stats<NQ>(Ls, Ds, lse, D, start + k0, len - k0, NH, kvh * G);
  cp_async_wait<0>();
  __syncthreads();
  float adk[DT][4], adv[DT][4];
#pragma unroll
  for (int j = 0; j < DT; j++)
#pragma unroll
    for (int i = 0; i < 4; i++) adk[j][i] = adv[j][i] = 0.f;
  const int key0 = k0 + warp * 16 + g;  // this lane's key rows: key0 and key0 + 8
  for (int it = 0, buf = 0; it < nit; it++, buf ^= 1) {
    const int i0 = k0 + (it % ntq) * NQ;
    if (it + 1 < nit) {
      const int hn = kvh * G + (it + 1) / ntq, in0 = k0 + ((it + 1) % ntq) * NQ;
      tc_load<NQ, HD>(Qs + (buf ^ 1) * NQ * LD, q, start + in0, len - in0, NH, hn);
      tc_load<NQ, HD>(dOs + (buf ^ 1) * NQ * LD, dout, start + in0, len - in0, NH, hn);
      tc_load_stats<NQ>(Ls + (buf ^ 1) * NQ, Ds + (buf ^ 1) * NQ, lse, D, start + in0, len - in0, NH, hn);
    }
    cp_async_commit();
    const tg_bf16* Qb = Qs + buf * NQ * LD;
    const tg_bf16* dOb = dOs + buf * NQ * LD;
    const float* Lb = Ls + buf * NQ;
    const float* Db = Ds + buf * NQ;
    float sc[NT][4], dp[NT][4];
#pragma unroll
    for (int j = 0; j < NT; j++)
#pragma unroll
      for (int i = 0; i < 4; i++) sc[j][i] = dp[j][i] = 0.f;
#pragma unroll
    for (int kk = 0; kk < KS; kk++) {
      unsigned ka[4], va[4];
      tc_frag_a<HD>(ka, Ks, warp * 16, kk * 16, lane);
      tc_frag_a<HD>(va, Vs, warp * 16, kk * 16, lane);
#pragma unroll
      for (int jp = 0; jp < NT / 2; jp++) {
        unsigned b[4];
        tc_frag_b<HD>(b, Qb, jp * 16, kk * 16, lane);
        mma_bf16_16816(sc[2 * jp], ka, b);
        mma_bf16_16816(sc[2 * jp + 1], ka, b + 2);
        tc_frag_b<HD>(b, dOb, jp * 16, kk * 16, lane);
        mma_bf16_16816(dp[2 * jp], va, b);
        mma_bf16_16816(dp[2 * jp + 1], va, b + 2);
      }
    }
    const bool edge = i0 < k0 + MK || i0 + NQ > len;
#pragma unroll
    for (int j = 0; j < NT; j++)
#pragma unroll
      for (int i = 0; i < 4; i++) {
        const int c = 8 * j + 2 * t + (i & 1), qi = i0 + c, key = key0 + 8 * (i >> 1);
        const float p = edge && (qi < key || qi >= len) ? 0.f : exp2f(fmaf(sc[j][i], sl2, -Lb[c]));
        sc[j][i] = p;
        dp[j][i] = p * (dp[j][i] - Db[c]);  // dS
      }
#pragma unroll
    for (int kk = 0; kk < NQ / 16; kk++) {
      unsigned pa[4], da[4];
      tc_pack_a(pa, sc[2 * kk], sc[2 * kk + 1]);
      tc_pack_a(da, dp[2 * kk], dp[2 * kk + 1]);
#pragma unroll
      for (int jp = 0; jp < DT / 2; jp++) {
        unsigned b[4];
        tc_frag_bt<HD>(b, dOb, kk * 16, jp * 16, lane);
        mma_bf16_16816(adv[2 * jp], pa, b);
        mma_bf16_16816(adv[2 * jp + 1], pa, b + 2);
        tc_frag_bt<HD>(b, Qb, kk * 16, jp * 16, lane);
        mma_bf16_16816(adk[2 * jp], da, b);
        mma_bf16_16816(adk[2 * jp + 1], da, b + 2);
      }
    }
    cp_async_wait<0>();  // the next query tile landed
    __syncthreads();     // and every warp is done with this one
  }
#pragma unroll
  for (int r = 0; r < 2; r++) {
    const int kj = key0 + 8 * r;
    if (kj < len) {
      const long long row = (long long)(start + kj) * NKV + kvh;
#pragma unroll
      for (int j = 0; j < DT; j++) {
        dk[row * HD + 8 * j + 2 * t] = adk[j][2 * r] * scale;
        dk[row * HD + 8 * j + 2 * t + 1] = adk[j][2 * r + 1] * scale;
        dv[row * HD + 8 * j + 2 * t] = adv[j][2 * r];
        dv[row * HD + 8 * j + 2 * t + 1] = adv[j][2 * r + 1];
      }
    }
  }
}

extern "C" __global__ void __launch_bounds__(TC_THREADS, 2)
    attention_bwd_dkdv_tc_hd64(float* dk, float* dv, const tg_bf16* dout, const float* lse, const float* D,
        const tg_bf16* q, const tg_bf16* k, const tg_bf16* v, const int* cu, int S, int T,
        int maxlen, int NH, int NKV, float scale, float sl2, int* flags) {
  att_bwd_dkdv_tc<64, 64>(dk, dv, dout, lse, D, q, k, v, cu, S, T, maxlen, NH, NKV, scale, sl2, flags);
}
extern "C" __global__ void __launch_bounds__(TC_THREADS, 2)
    attention_bwd_dkdv_tc_hd128(float* dk, float* dv, const tg_bf16* dout, const float* lse, const float* D,
        const tg_bf16* q, const tg_bf16* k, const tg_bf16* v, const int* cu, int S, int T,
        int maxlen, int NH, int NKV, float scale, float sl2, int* flags) {
  att_bwd_dkdv_tc<128, 32>(dk, dv, dout, lse, D, q, k, v, cu, S, T, maxlen, NH, NKV, scale, sl2, flags);
}
