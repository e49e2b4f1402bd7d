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

extern "C" __global__ void __launch_bounds__(ATT_THREADS)
    attention_fwd(float* out, float* lse, const float* q, const float* k, const float* v,
                  const int* cu, int S, int T, int maxlen, int NH, int NKV, int HD, float scale,
                  int* flags) {
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
    Qs[i] = qi < len ? q[((long long)(start + qi) * NH + h) * HD + d] * scale : 0.f;
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
        kv = k[off];
        vv = v[off];
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
        if (d < HD) out[row * HD + d] = acc[rr][j] * inv;
      }
      if (lane == 0) lse[row] = m[rr] + logf(l[rr]);
    }
  }
}

// D (T·NH) = Σ_d dout·out, one warp per row.
extern "C" __global__ void attention_bwd_dot(float* D, const float* dout, const float* out,
                                             long long rows, int HD) {
  const int lane = threadIdx.x & 31;
  const long long nwarps = (long long)gridDim.x * (blockDim.x >> 5);
  for (long long row = (long long)blockIdx.x * (blockDim.x >> 5) + (threadIdx.x >> 5); row < rows;
       row += nwarps) {
    float s = 0.f;
    for (int d = lane; d < HD; d += 32) s += dout[row * HD + d] * out[row * HD + d];
    s = warp_sum(s);
    if (lane == 0) D[row] = s;
  }
}

extern "C" __global__ void __launch_bounds__(ATT_THREADS)
    attention_bwd_dq(float* dq, const float* dout, const float* lse, const float* D,
                     const float* q, const float* k, const float* v, const int* cu, int S,
                     int T, int maxlen, int NH, int NKV, int HD, float scale, int* flags) {
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
    Qs[i] = qi < len ? q[off] * scale : 0.f;
    dOs[i] = qi < len ? dout[off] : 0.f;
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
        kv = k[off];
        vv = v[off];
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

extern "C" __global__ void __launch_bounds__(ATT_THREADS)
    attention_bwd_dkdv(float* dk, float* dv, const float* dout, const float* lse, const float* D,
                       const float* q, const float* k, const float* v, const int* cu, int S,
                       int T, int maxlen, int NH, int NKV, int HD, float scale, int* flags) {
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
      kv = k[off];
      vv = v[off];
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
          qv = q[off] * scale;
          gv = dout[off];
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
