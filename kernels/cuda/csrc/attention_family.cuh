// attention_family.cuh: the one causal attention over segments that
// attention.cu (packed sequences, kernels.Seqs) and tree_attention.cu
// (token trees, kernels.Tree) both run: forward and backward, fp32
// (FlashAttention style, online softmax over key tiles) and bf16 on tensor
// cores (FlashAttention-2 on mma.sync, attention_tc.cuh's tiles). A packed
// batch of sequences is the tree of roots alone: its kernels are these
// templates instantiated with a topology that has no parents and no
// descendants, so a fix here reaches both ops.
//
//   attn_fwd*:      out (T,NH,HD) = softmax(scale·q·kᵀ over the context)·v   (=)
//                   lse (T,NH) = log-sum-exp of each query's scaled scores    (=)
//   attn_bwd_dq*:   dq (T,NH,HD) = scale·Σ_j ds_j·k_j                         (=)
//   attn_bwd_dkdv*: dk (T,NKV,HD) = scale·Σ_i ds_i·q_i,
//                   dv (T,NKV,HD) = Σ_i p_i·dout_i  (every query that sees the key,
//                                                    over the group's heads)  (=)
//     with p = exp(scale·q·k − lse), ds = p·(dout·v − D), and D = rowsum(dout∘out)
//     from attention.cu's attention_bwd_dot.
//
// q, out, dq, dout (T,NH,HD); k, v, dk, dv (T,NKV,HD). Query head h reads
// key/value head h/(NH/NKV). HD <= 128. A query of segment s sees its
// ancestors' tokens and its own segment's up to itself.
//
// The topology (class Topo) is what the segments are; each kernel entry
// builds one from its arguments and passes it by reference:
//   bool seg(s, start, len)   block s's own segment [start, start+len);
//                             false: the offsets are broken (the topology
//                             flags it), the block returns at once
//   int  parent(s)            s's parent, or −1 at a root
//   void span(a, start, len)  an ancestor a's tokens
//   void desc(s, start, len, d0, dn)  s's descendants' tokens [d0, d0+dn)
// attention.cu's SeqTopo has no parents and no descendants (the compiler
// drops the walks); tree_attention.cu's TreeTopo reads offs, parent, ends.
//
// A forward or dq block (a tile of one segment's queries, one query head)
// walks its keys from its own segment up the parent chain to the root: its
// own keys up to the tile's last query, causally masked, then every key of
// each ancestor (the online softmax makes the order a matter of rounding
// only; it is fixed, so results are deterministic). A dkdv block (a tile of
// one segment's keys, one key/value head) walks the queries that see them,
// for each query head of the group: its own segment's from the tile's first
// key (causally masked), then the contiguous run of its descendants' tokens,
// unmasked. Every output element is accumulated by one block (one warp, one
// lane) in a fixed order: a shared prefix's dk and dv sum every descendant's
// queries in token order, with no atomics, so the backward pass is bitwise
// deterministic.
//
// fp32 work split (128 threads = 4 warps; a lane owns head dimensions
// lane + 32j, j < 4; each warp works on several rows at once so that one
// shared-memory read of a key or query element feeds several FMAs):
//   attn_fwd:      grid (ceil(MaxLen/16), S, NH); 4 query rows per warp; for
//                  each tile of 32 keys, lane j scores key j against the 4
//                  rows, the warp does the online softmax update per row, and
//                  p is broadcast by shuffle for p·V.
//   attn_bwd_dq:   grid (ceil(MaxLen/8), S, NH); 2 query rows per warp.
//   attn_bwd_dkdv: grid (ceil(MaxLen/8), S, NKV); 2 key rows per warp; lane
//                  i scores query i of a 32-query tile against both keys.
// Shared memory stays under the 48 KiB a block gets without opting in.
//
// Tensor-core work split (4 warps of 16 rows; attention_tc.cuh's tiles;
// scores scaled into the log2 domain once, sl2 = scale·log2 e):
//   attn_fwd_tc<HD, TO>: grid (ceil(MaxLen/64), S, NH); warp w owns query
//     rows 16w..16w+15 of the block's 64, keeps its Q fragments in
//     registers and, per tile of 64 keys: S = Q·Kᵀ (mma), the mask on the
//     tiles that need it, the online softmax per row (the 4 lanes of a row
//     combine by shuffles), then O += P·V with P packed to bf16 straight
//     from the accumulator registers. V's load overlaps S, the next tile's
//     K (in this range or the parent's) overlaps P·V. Heavy (late) query
//     tiles are scheduled first. out (bf16 or f32) =, lse (fp32) =.
//   attn_bwd_dq_tc<HD, NK>: grid (ceil(MaxLen/64), S, NH); warp w owns 16
//     query rows, Q and dO fragments in registers; per key tile (NK keys,
//     double-buffered across the ranges): S = Q·Kᵀ, dP = dO·Vᵀ,
//     dS = P∘(dP − D), dQ += dS·K; dq = scale·dQ (fp32) =.
//   attn_bwd_dkdv_tc<HD, NQ, DS>: grid (ceil(MaxLen/64), S, NKV); warp w
//     owns 16 key rows; for every query head of the group and query tile
//     (NQ queries, double-buffered with their lse and D) that sees the
//     block's keys: Sᵀ = K·Qᵀ, dPᵀ = V·dOᵀ, dV += Pᵀ·dO, dK += dSᵀ·Q;
//     dk = scale·dK, dv = dV (fp32) =. With DS (packed sequences) it also
//     stores each pair's dS, rounded to bf16 as the dK product uses it,
//     into the dS scratch (attn_ds).
//   attn_bwd_dq_ds_tc<HD>: packed sequences: dq = scale·dS·K from that
//     scratch, no S or dP recomputed (five products a tile pair in all).
// Trees keep attn_bwd_dq_tc, its own kernel instead of FlashAttention-2's
// atomic adds, at the cost of recomputing S and dP (seven): a tree query's
// keys are its ancestors' segments, which attn_ds's rows of 64-key blocks do
// not lay out. P and dS are rounded to bf16 as mma operands, as in
// FlashAttention-2.
#pragma once
#include "common.cuh"
#include "bf16.cuh"
#include "attention_tc.cuh"

#define AT_THREADS 128
#define AT_MAXJ 4  // HD <= 32·AT_MAXJ
#define AT_BC 32   // keys per tile (one per lane)
#define AT_FWD_R 4 // query rows per warp, forward
#define AT_FWD_BR (4 * AT_FWD_R)
#define AT_DQ_R 2  // query rows per warp, dq
#define AT_DQ_BR (4 * AT_DQ_R)
#define AT_DK_R 2  // key rows per warp, dkdv
#define AT_DK_BC (4 * AT_DK_R)
#define AT_BQ 32   // queries per dkdv tile (one per lane)

// ---------------------------------------------------------------------------
// fp32 (and the widening path of bf16 operands the tensor-core kernels do
// not take: another head dimension, unaligned views).

template <class TI, class TO, class Topo>
__device__ __forceinline__ void attn_fwd(TO* out, float* lse, const TI* q, const TI* k, const TI* v,
                                         const Topo& topo, int NH, int NKV, int HD, float scale) {
  TG_DYN_SMEM(float, sm);
  const int s = blockIdx.y, h = blockIdx.z, kvh = h / (NH / NKV);
  int start, len;
  if (!topo.seg(s, start, len)) return;  // (a flagged data error)
  const int q0 = blockIdx.x * AT_FWD_BR;
  if (q0 >= len) return;
  const int HDP = HD + 1;
  float* Qs = sm;                   // (AT_FWD_BR, HD), pre-scaled
  float* Ks = Qs + AT_FWD_BR * HD;  // (AT_BC, HDP)
  float* Vs = Ks + AT_BC * HDP;     // (AT_BC, HD)
  const int tid = threadIdx.x, lane = tid & 31, warp = tid >> 5;
  const int r0 = warp * AT_FWD_R;
  for (int i = tid; i < AT_FWD_BR * HD; i += AT_THREADS) {
    const int r = i / HD, d = i % HD, qi = q0 + r;
    Qs[i] = qi < len ? ld_f(q, ((long long)(start + qi) * NH + h) * HD + d) * scale : 0.f;
  }
  float m[AT_FWD_R], l[AT_FWD_R], acc[AT_FWD_R][AT_MAXJ];
#pragma unroll
  for (int rr = 0; rr < AT_FWD_R; rr++) {
    m[rr] = -TG_INF;
    l[rr] = 0.f;
#pragma unroll
    for (int j = 0; j < AT_MAXJ; j++) acc[rr][j] = 0.f;
  }
  // The keys: the own segment's up to the block's last query (causal), then
  // each ancestor's, all of them.
  int seg = s, kstart = start, klen = min(len, q0 + AT_FWD_BR);
  for (bool own = true;; own = false) {
    for (int k0 = 0; k0 < klen; k0 += AT_BC) {
      __syncthreads();  // Q loaded; the previous tile is consumed
      for (int i = tid; i < AT_BC * HD; i += AT_THREADS) {
        const int r = i / HD, d = i % HD, kj = k0 + r;
        float kv = 0.f, vv = 0.f;
        if (kj < klen) {
          const long long off = ((long long)(kstart + kj) * NKV + kvh) * HD + d;
          kv = ld_f(k, off);
          vv = ld_f(v, off);
        }
        Ks[r * HDP + d] = kv;
        Vs[r * HD + d] = vv;
      }
      __syncthreads();
      float sc[AT_FWD_R];
#pragma unroll
      for (int rr = 0; rr < AT_FWD_R; rr++) sc[rr] = 0.f;
      const float* kr = Ks + lane * HDP;
      const float* qr = Qs + r0 * HD;
      for (int d = 0; d < HD; d++) {
        const float kd = kr[d];
#pragma unroll
        for (int rr = 0; rr < AT_FWD_R; rr++) sc[rr] += qr[rr * HD + d] * kd;
      }
      const int kj = k0 + lane;
      float p[AT_FWD_R];
#pragma unroll
      for (int rr = 0; rr < AT_FWD_R; rr++) {
        const int qi = q0 + r0 + rr;
        if (!(qi < len && kj < klen && (!own || kj <= qi))) sc[rr] = -TG_INF;
        const float mnew = fmaxf(m[rr], warp_max(sc[rr]));
        p[rr] = sc[rr] == -TG_INF ? 0.f : expf(sc[rr] - mnew);
        const float alpha = m[rr] == -TG_INF ? 0.f : expf(m[rr] - mnew);
        l[rr] = l[rr] * alpha + warp_sum(p[rr]);
        m[rr] = mnew;
#pragma unroll
        for (int j = 0; j < AT_MAXJ; j++) acc[rr][j] *= alpha;
      }
      for (int jj = 0; jj < AT_BC; jj++) {
        float vd[AT_MAXJ];
#pragma unroll
        for (int j = 0; j < AT_MAXJ; j++) {
          const int d = lane + 32 * j;
          vd[j] = d < HD ? Vs[jj * HD + d] : 0.f;
        }
#pragma unroll
        for (int rr = 0; rr < AT_FWD_R; rr++) {
          const float pj = __shfl_sync(TG_FULL, p[rr], jj);
#pragma unroll
          for (int j = 0; j < AT_MAXJ; j++) acc[rr][j] += pj * vd[j];
        }
      }
    }
    seg = topo.parent(seg);
    if (seg < 0) break;
    topo.span(seg, kstart, klen);
  }
#pragma unroll
  for (int rr = 0; rr < AT_FWD_R; rr++) {
    const int qi = q0 + r0 + rr;
    if (qi < len) {
      const long long row = (long long)(start + qi) * NH + h;
      const float inv = 1.f / l[rr];  // l >= 1: key qi itself is always seen
#pragma unroll
      for (int j = 0; j < AT_MAXJ; j++) {
        const int d = lane + 32 * j;
        if (d < HD) st_f(out, row * HD + d, acc[rr][j] * inv);
      }
      if (lane == 0) lse[row] = m[rr] + logf(l[rr]);
    }
  }
}

template <class TI, class Topo>
__device__ __forceinline__ void attn_bwd_dq(float* dq, const TI* dout, const float* lse, const float* D,
                                            const TI* q, const TI* k, const TI* v, const Topo& topo,
                                            int NH, int NKV, int HD, float scale) {
  TG_DYN_SMEM(float, sm);
  const int s = blockIdx.y, h = blockIdx.z, kvh = h / (NH / NKV);
  int start, len;
  if (!topo.seg(s, start, len)) return;  // (a flagged data error)
  const int q0 = blockIdx.x * AT_DQ_BR;
  if (q0 >= len) return;
  const int HDP = HD + 1;
  float* Qs = sm;                   // (AT_DQ_BR, HD), pre-scaled
  float* dOs = Qs + AT_DQ_BR * HD;  // (AT_DQ_BR, HD)
  float* Ks = dOs + AT_DQ_BR * HD;  // (AT_BC, HDP)
  float* Vs = Ks + AT_BC * HDP;     // (AT_BC, HDP)
  const int tid = threadIdx.x, lane = tid & 31, warp = tid >> 5;
  const int r0 = warp * AT_DQ_R;
  for (int i = tid; i < AT_DQ_BR * HD; i += AT_THREADS) {
    const int r = i / HD, d = i % HD, qi = q0 + r;
    const long long off = ((long long)(start + qi) * NH + h) * HD + d;
    Qs[i] = qi < len ? ld_f(q, off) * scale : 0.f;
    dOs[i] = qi < len ? ld_f(dout, off) : 0.f;
  }
  float Li[AT_DQ_R], Di[AT_DQ_R], acc[AT_DQ_R][AT_MAXJ];
#pragma unroll
  for (int rr = 0; rr < AT_DQ_R; rr++) {
    const int qi = q0 + r0 + rr;
    const long long row = (long long)(start + qi) * NH + h;
    Li[rr] = qi < len ? lse[row] : 0.f;
    Di[rr] = qi < len ? D[row] : 0.f;
#pragma unroll
    for (int j = 0; j < AT_MAXJ; j++) acc[rr][j] = 0.f;
  }
  int seg = s, kstart = start, klen = min(len, q0 + AT_DQ_BR);
  for (bool own = true;; own = false) {
    for (int k0 = 0; k0 < klen; k0 += AT_BC) {
      __syncthreads();
      for (int i = tid; i < AT_BC * HD; i += AT_THREADS) {
        const int r = i / HD, d = i % HD, kj = k0 + r;
        float kv = 0.f, vv = 0.f;
        if (kj < klen) {
          const long long off = ((long long)(kstart + kj) * NKV + kvh) * HD + d;
          kv = ld_f(k, off);
          vv = ld_f(v, off);
        }
        Ks[r * HDP + d] = kv;
        Vs[r * HDP + d] = vv;
      }
      __syncthreads();
      const int kj = k0 + lane;
      float sc[AT_DQ_R], dp[AT_DQ_R];
#pragma unroll
      for (int rr = 0; rr < AT_DQ_R; rr++) sc[rr] = dp[rr] = 0.f;
      const float* kr = Ks + lane * HDP;
      const float* vr = Vs + lane * HDP;
      const float* qr = Qs + r0 * HD;
      const float* gr = dOs + r0 * HD;
      for (int d = 0; d < HD; d++) {
        const float kd = kr[d], vd = vr[d];
#pragma unroll
        for (int rr = 0; rr < AT_DQ_R; rr++) {
          sc[rr] += qr[rr * HD + d] * kd;
          dp[rr] += gr[rr * HD + d] * vd;
        }
      }
      float ds[AT_DQ_R];
#pragma unroll
      for (int rr = 0; rr < AT_DQ_R; rr++) {
        const int qi = q0 + r0 + rr;
        ds[rr] = (qi < len && kj < klen && (!own || kj <= qi)) ? expf(sc[rr] - Li[rr]) * (dp[rr] - Di[rr]) : 0.f;
      }
      for (int jj = 0; jj < AT_BC; jj++) {
        float kd[AT_MAXJ];
#pragma unroll
        for (int j = 0; j < AT_MAXJ; j++) {
          const int d = lane + 32 * j;
          kd[j] = d < HD ? Ks[jj * HDP + d] : 0.f;
        }
#pragma unroll
        for (int rr = 0; rr < AT_DQ_R; rr++) {
          const float dsj = __shfl_sync(TG_FULL, ds[rr], jj);
#pragma unroll
          for (int j = 0; j < AT_MAXJ; j++) acc[rr][j] += dsj * kd[j];
        }
      }
    }
    seg = topo.parent(seg);
    if (seg < 0) break;
    topo.span(seg, kstart, klen);
  }
#pragma unroll
  for (int rr = 0; rr < AT_DQ_R; rr++) {
    const int qi = q0 + r0 + rr;
    if (qi < len) {
      const long long row = (long long)(start + qi) * NH + h;
#pragma unroll
      for (int j = 0; j < AT_MAXJ; j++) {
        const int d = lane + 32 * j;
        if (d < HD) dq[row * HD + d] = acc[rr][j] * scale;
      }
    }
  }
}

template <class TI, class Topo>
__device__ __forceinline__ void attn_bwd_dkdv(float* dk, float* dv, const TI* dout, const float* lse,
                                              const float* D, const TI* q, const TI* k, const TI* v,
                                              const Topo& topo, int NH, int NKV, int HD, float scale) {
  TG_DYN_SMEM(float, sm);
  const int s = blockIdx.y, kvh = blockIdx.z, G = NH / NKV;
  int start, len, d0, dn;
  if (!topo.seg(s, start, len)) return;  // (a flagged data error)
  const int k0 = blockIdx.x * AT_DK_BC;
  if (k0 >= len) return;
  topo.desc(s, start, len, d0, dn);
  const int HDP = HD + 1;
  float* Ks = sm;                   // (AT_DK_BC, HD)
  float* Vs = Ks + AT_DK_BC * HD;   // (AT_DK_BC, HD)
  float* Qs = Vs + AT_DK_BC * HD;   // (AT_BQ, HDP), pre-scaled
  float* dOs = Qs + AT_BQ * HDP;    // (AT_BQ, HDP)
  float* Ls = dOs + AT_BQ * HDP;    // (AT_BQ)
  float* Ds = Ls + AT_BQ;           // (AT_BQ)
  const int tid = threadIdx.x, lane = tid & 31, warp = tid >> 5;
  const int r0 = warp * AT_DK_R;
  for (int i = tid; i < AT_DK_BC * HD; i += AT_THREADS) {
    const int r = i / HD, d = i % HD, kj = k0 + r;
    float kv = 0.f, vv = 0.f;
    if (kj < len) {
      const long long off = ((long long)(start + kj) * NKV + kvh) * HD + d;
      kv = ld_f(k, off);
      vv = ld_f(v, off);
    }
    Ks[i] = kv;
    Vs[i] = vv;
  }
  float adk[AT_DK_R][AT_MAXJ], adv[AT_DK_R][AT_MAXJ];
#pragma unroll
  for (int rr = 0; rr < AT_DK_R; rr++)
#pragma unroll
    for (int j = 0; j < AT_MAXJ; j++) adk[rr][j] = adv[rr][j] = 0.f;
  for (int g = 0; g < G; g++) {
    const int h = kvh * G + g;
    // The queries: the own segment's [k0, len) (causal), then the
    // descendants' [d0, d0+dn) (all see every key of the block), in tiles
    // of AT_BQ: a tile j0 < len2 (len rounded up to whole tiles from k0)
    // is the own segment's at j0, a later one the descendants' at j0 − len2.
    const int len2 = k0 + (len - k0 + AT_BQ - 1) / AT_BQ * AT_BQ;
    for (int j0 = k0; j0 < len2 + dn; j0 += AT_BQ) {
      {
        const bool own = j0 < len2;
        const int base = own ? start : d0, i0 = own ? j0 : j0 - len2, to = own ? len : dn;
        __syncthreads();  // K/V loaded; the previous query tile is consumed
        for (int i = tid; i < AT_BQ * HD; i += AT_THREADS) {
          const int r = i / HD, d = i % HD, qi = i0 + r;
          float qv = 0.f, gv = 0.f;
          if (qi < to) {
            const long long off = ((long long)(base + qi) * NH + h) * HD + d;
            qv = ld_f(q, off) * scale;
            gv = ld_f(dout, off);
          }
          Qs[r * HDP + d] = qv;
          dOs[r * HDP + d] = gv;
        }
        for (int r = tid; r < AT_BQ; r += AT_THREADS) {
          const int qi = i0 + r;
          const long long row = (long long)(base + qi) * NH + h;
          Ls[r] = qi < to ? lse[row] : 0.f;
          Ds[r] = qi < to ? D[row] : 0.f;
        }
        __syncthreads();
        const int qi = i0 + lane;
        float sc[AT_DK_R], dp[AT_DK_R];
#pragma unroll
        for (int rr = 0; rr < AT_DK_R; rr++) sc[rr] = dp[rr] = 0.f;
        const float* qr = Qs + lane * HDP;
        const float* gr = dOs + lane * HDP;
        const float* kr = Ks + r0 * HD;
        const float* vr = Vs + r0 * HD;
        for (int d = 0; d < HD; d++) {
          const float qd = qr[d], gd = gr[d];
#pragma unroll
          for (int rr = 0; rr < AT_DK_R; rr++) {
            sc[rr] += qd * kr[rr * HD + d];
            dp[rr] += gd * vr[rr * HD + d];
          }
        }
        float p[AT_DK_R], ds[AT_DK_R];
#pragma unroll
        for (int rr = 0; rr < AT_DK_R; rr++) {
          const int kj = k0 + r0 + rr;
          if (kj < len && qi < to && (!own || qi >= kj)) {
            p[rr] = expf(sc[rr] - Ls[lane]);
            ds[rr] = p[rr] * (dp[rr] - Ds[lane]);
          } else {
            p[rr] = ds[rr] = 0.f;
          }
        }
        for (int ii = 0; ii < AT_BQ; ii++) {
          float gd[AT_MAXJ], qd[AT_MAXJ];
#pragma unroll
          for (int j = 0; j < AT_MAXJ; j++) {
            const int d = lane + 32 * j;
            gd[j] = d < HD ? dOs[ii * HDP + d] : 0.f;
            qd[j] = d < HD ? Qs[ii * HDP + d] : 0.f;  // Qs holds scale·q
          }
#pragma unroll
          for (int rr = 0; rr < AT_DK_R; rr++) {
            const float pi = __shfl_sync(TG_FULL, p[rr], ii);
            const float dsi = __shfl_sync(TG_FULL, ds[rr], ii);
#pragma unroll
            for (int j = 0; j < AT_MAXJ; j++) {
              adv[rr][j] += pi * gd[j];
              adk[rr][j] += dsi * qd[j];
            }
          }
        }
      }
    }
  }
#pragma unroll
  for (int rr = 0; rr < AT_DK_R; rr++) {
    const int kj = k0 + r0 + rr;
    if (kj < len) {
      const long long row = (long long)(start + kj) * NKV + kvh;
#pragma unroll
      for (int j = 0; j < AT_MAXJ; j++) {
        const int d = lane + 32 * j;
        if (d < HD) {
          dk[row * HD + d] = adk[rr][j];
          dv[row * HD + d] = adv[rr][j];
        }
      }
    }
  }
}

// ---------------------------------------------------------------------------
// Tensor cores: bf16 q, k, v (and dout, out), head_dim 64 or 128, fp32
// accumulation; P and dS are rounded to bf16 as mma operands.

// The next 64-key tile of a forward or dq block's walk: the next in the
// range (kstart, klen) being walked, or the parent's first. It returns false
// at the root's last tile.
struct attn_walk {
  int seg, kstart, klen, k0;
  bool own;
};
template <int NK, class Topo>
__device__ __forceinline__ bool attn_walk_next(const attn_walk& c, attn_walk& n, const Topo& topo) {
  n = c;
  n.k0 = c.k0 + NK;
  if (n.k0 < c.klen) return true;
  n.seg = topo.parent(c.seg);
  if (n.seg < 0) return false;
  topo.span(n.seg, n.kstart, n.klen);
  n.k0 = 0;
  n.own = false;
  return true;
}

template <int HD, class TO, class Topo>
__device__ __forceinline__ void attn_fwd_tc(TO* out, float* lse, const tg_bf16* q, const tg_bf16* k,
                                            const tg_bf16* v, const Topo& topo, int NH, int NKV, float sl2) {
  constexpr int MQ = TC_ROWS, NK = 64, LD = HD + 8, KS = HD / 16, NT = NK / 8, DT = HD / 8;
  TG_DYN_SMEM_ALIGNED(tg_bf16, sm_tc);
  tg_bf16* Qs = sm_tc;         // (MQ, LD)
  tg_bf16* Ks = Qs + MQ * LD;  // (NK, LD)
  tg_bf16* Vs = Ks + NK * LD;  // (NK, LD)
  const int s = blockIdx.y, h = blockIdx.z, kvh = h / (NH / NKV);
  int start, len;
  if (!topo.seg(s, start, len)) return;  // (a flagged data error)
  const int q0 = (gridDim.x - 1 - blockIdx.x) * MQ;  // the longest rows first
  if (q0 >= len) return;
  const int lane = threadIdx.x & 31, warp = threadIdx.x >> 5, g = lane >> 2, t = lane & 3;
  attn_walk c = {s, start, min(len, q0 + MQ), 0, true};
  tc_load<MQ, HD>(Qs, q, start + q0, len - q0, NH, h);
  tc_load<NK, HD>(Ks, k, c.kstart, c.klen, NKV, kvh);
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
  for (;;) {
    tc_load<NK, HD>(Vs, v, c.kstart + c.k0, c.klen - c.k0, NKV, kvh);
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
    if (c.k0 + NK > c.klen || (c.own && c.k0 + NK > q0 + warp * 16)) {  // the end, or the diagonal
#pragma unroll
      for (int j = 0; j < NT; j++)
#pragma unroll
        for (int i = 0; i < 4; i++) {
          const int key = c.k0 + 8 * j + 2 * t + (i & 1), row = row0 + 8 * (i >> 1);
          if (key >= c.klen || (c.own && key > row)) sc[j][i] = -TG_INF;
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
    attn_walk n;
    const bool more = attn_walk_next<NK>(c, n, topo);
    cp_async_wait<0>();  // V landed
    __syncthreads();     // and every warp is done with K
    if (more) tc_load<NK, HD>(Ks, k, n.kstart + n.k0, n.klen - n.k0, NKV, kvh);
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
    if (!more) break;
    c = n;
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

template <int HD, int NK, class Topo>
__device__ __forceinline__ void attn_bwd_dq_tc(float* dq, const tg_bf16* dout, const float* lse,
                                               const float* D, const tg_bf16* q, const tg_bf16* k,
                                               const tg_bf16* v, const Topo& topo, int NH, int NKV,
                                               float scale, float sl2) {
  constexpr int MQ = TC_ROWS, LD = HD + 8, KS = HD / 16, NT = NK / 8, DT = HD / 8;
  TG_DYN_SMEM_ALIGNED(tg_bf16, sm_tc);
  tg_bf16* Qs = sm_tc;             // (MQ, LD)
  tg_bf16* dOs = Qs + MQ * LD;     // (MQ, LD)
  tg_bf16* Ks = dOs + MQ * LD;     // 2 × (NK, LD)
  tg_bf16* Vs = Ks + 2 * NK * LD;  // 2 × (NK, LD)
  const int s = blockIdx.y, h = blockIdx.z, kvh = h / (NH / NKV);
  int start, len;
  if (!topo.seg(s, start, len)) return;  // (a flagged data error)
  const int q0 = (gridDim.x - 1 - blockIdx.x) * MQ;
  if (q0 >= len) return;
  const int lane = threadIdx.x & 31, warp = threadIdx.x >> 5, g = lane >> 2, t = lane & 3;
  attn_walk c = {s, start, min(len, q0 + MQ), 0, true};
  tc_load<MQ, HD>(Qs, q, start + q0, len - q0, NH, h);
  tc_load<MQ, HD>(dOs, dout, start + q0, len - q0, NH, h);
  tc_load<NK, HD>(Ks, k, c.kstart, c.klen, NKV, kvh);
  tc_load<NK, HD>(Vs, v, c.kstart, c.klen, NKV, kvh);
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
  for (int buf = 0;; buf ^= 1) {
    const tg_bf16* Kb = Ks + buf * NK * LD;
    const tg_bf16* Vb = Vs + buf * NK * LD;
    attn_walk n;
    const bool more = attn_walk_next<NK>(c, n, topo);
    if (more) {
      tc_load<NK, HD>(Ks + (buf ^ 1) * NK * LD, k, n.kstart + n.k0, n.klen - n.k0, NKV, kvh);
      tc_load<NK, HD>(Vs + (buf ^ 1) * NK * LD, v, n.kstart + n.k0, n.klen - n.k0, NKV, kvh);
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
    const bool edge = c.k0 + NK > c.klen || (c.own && c.k0 + NK > q0 + warp * 16);
#pragma unroll
    for (int j = 0; j < NT; j++)
#pragma unroll
      for (int i = 0; i < 4; i++) {
        const int r = i >> 1, key = c.k0 + 8 * j + 2 * t + (i & 1), row = row0 + 8 * r;
        const float p = edge && (key >= c.klen || row >= len || (c.own && key > row))
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
    if (!more) break;
    c = n;
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

// Query tile it of a dkdv block's walk (for its head, it % ntq): the own
// segment's tiles from the block's first key (ntq_own of them), then the
// descendants' run. base is the tile's first packed row, rmax its rows, i0
// its first query's index in the own segment (own tiles only).
__device__ __forceinline__ void attn_qtile(int it, int ntq_own, int NQ, int start, int len, int k0, int d0,
                                           int dn, long long& base, int& rmax, int& i0, bool& own) {
  own = it < ntq_own;
  if (own) {
    i0 = k0 + it * NQ;
    base = start + i0;
    rmax = len - i0;
  } else {
    const int j0 = (it - ntq_own) * NQ;
    i0 = 0;
    base = d0 + j0;
    rmax = dn - j0;
  }
}

// The dS scratch of the packed-sequence backward (attn_bwd_dkdv_tc<..,
// true> writes it, attn_bwd_dq_ds_tc reads it): for query head h and query
// position p of the sequence that starts at packed row start, the row of
// bf16 dS against keys 0 .. 64·(p/64 + 1) − 1 of its sequence (a causal row
// rounded up to whole 64-key blocks; keys past p are 0) at
//   p0 + (h·T + start)·bt + attn_ds_row(p),
// bt (attnDSStride) elements a token being at least the mean row of a
// sequence of maxlen tokens, so that sequences' regions never overlap and
// every row stays inside its region. A sequence longer than maxlen (flagged
// TG_ERR_SEQS) is skipped by both kernels, so no write leaves the scratch.
struct attn_ds {
  tg_bf16* p;
  long long bt;
  int T, maxlen;
};
// The offset of position p's row in its sequence's region: the rows before
// it, 64·(b+1) keys each for the rows of 64-block b.
__device__ __forceinline__ long long attn_ds_row(int p) {
  const long long b = p >> 6, r = p & 63;
  return 2048 * b * (b + 1) + 64 * r * (b + 1);
}

template <int HD, int NQ, bool DS, class Topo>
__device__ __forceinline__ void attn_bwd_dkdv_tc(float* dk, float* dv, const tg_bf16* dout,
                                                 const float* lse, const float* D, const tg_bf16* q,
                                                 const tg_bf16* k, const tg_bf16* v, const Topo& topo,
                                                 int NH, int NKV, float scale, float sl2, attn_ds ds) {
  constexpr int MK = TC_ROWS, LD = HD + 8, KS = HD / 16, NT = NQ / 8, DT = HD / 8;
  TG_DYN_SMEM_ALIGNED(tg_bf16, sm_tc);
  tg_bf16* Ks = sm_tc;                      // (MK, LD)
  tg_bf16* Vs = Ks + MK * LD;               // (MK, LD)
  tg_bf16* Qs = Vs + MK * LD;               // 2 × (NQ, LD)
  tg_bf16* dOs = Qs + 2 * NQ * LD;          // 2 × (NQ, LD)
  float* Ls = (float*)(dOs + 2 * NQ * LD);  // 2 × (NQ): lse·log2 e
  float* Ds = Ls + 2 * NQ;                  // 2 × (NQ)
  const int s = blockIdx.y, kvh = blockIdx.z, G = NH / NKV;
  int start, len, d0, dn;
  if (!topo.seg(s, start, len)) return;  // (a flagged data error)
  if (DS && len > ds.maxlen) return;     // (flagged: its dS rows would leave the scratch)
  const int k0 = blockIdx.x * MK;  // the first key blocks have the most work and go first
  if (k0 >= len) return;
  topo.desc(s, start, len, d0, dn);
  const int lane = threadIdx.x & 31, warp = threadIdx.x >> 5, g = lane >> 2, t = lane & 3;
  const int nto = (len - k0 + NQ - 1) / NQ, ntq = nto + (dn + NQ - 1) / NQ, nit = G * ntq;
  long long base;
  int rmax, i0;
  bool own;
  tc_load<MK, HD>(Ks, k, start + k0, len - k0, NKV, kvh);
  tc_load<MK, HD>(Vs, v, start + k0, len - k0, NKV, kvh);
  attn_qtile(0, nto, NQ, start, len, k0, d0, dn, base, rmax, i0, own);
  tc_load<NQ, HD>(Qs, q, base, rmax, NH, kvh * G);
  tc_load<NQ, HD>(dOs, dout, base, rmax, NH, kvh * G);
  cp_async_commit();
  tc_load_stats<NQ>(Ls, Ds, lse, D, base, rmax, NH, kvh * G);
  cp_async_wait<0>();
  __syncthreads();
  float adk[DT][4], adv[DT][4];
#pragma unroll
  for (int j = 0; j < DT; j++)
#pragma unroll
    for (int i = 0; i < 4; i++) adk[j][i] = adv[j][i] = 0.f;
  const int key0 = k0 + warp * 16 + g;  // this lane's key rows: key0 and key0 + 8
  for (int it = 0, buf = 0; it < nit; it++, buf ^= 1) {
    const int cur0 = i0, curmax = rmax, hcur = kvh * G + it / ntq;
    const bool curown = own;
    if (it + 1 < nit) {
      const int hn = kvh * G + (it + 1) / ntq;
      attn_qtile((it + 1) % ntq, nto, NQ, start, len, k0, d0, dn, base, rmax, i0, own);
      tc_load<NQ, HD>(Qs + (buf ^ 1) * NQ * LD, q, base, rmax, NH, hn);
      tc_load<NQ, HD>(dOs + (buf ^ 1) * NQ * LD, dout, base, rmax, NH, hn);
      tc_load_stats<NQ>(Ls + (buf ^ 1) * NQ, Ds + (buf ^ 1) * NQ, lse, D, base, rmax, NH, hn);
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
    // Own tiles: the causal diagonal and the segment's end; the
    // descendants' run: its end.
    const bool edge = NQ > curmax || (curown && cur0 < k0 + MK);
#pragma unroll
    for (int j = 0; j < NT; j++)
#pragma unroll
      for (int i = 0; i < 4; i++) {
        const int c = 8 * j + 2 * t + (i & 1), key = key0 + 8 * (i >> 1);
        const float p = edge && (c >= curmax || (curown && cur0 + c < key)) ? 0.f
                                                                            : exp2f(fmaf(sc[j][i], sl2, -Lb[c]));
        sc[j][i] = p;
        dp[j][i] = p * (dp[j][i] - Db[c]);  // dS
      }
    if (DS) {  // dS as the dK product below rounds it, for attn_bwd_dq_ds_tc (own tiles only)
      tg_bf16* dsh = ds.p + ((long long)hcur * ds.T + start) * ds.bt + k0 + warp * 16 + g;
#pragma unroll
      for (int j = 0; j < NT; j++)
#pragma unroll
        for (int r = 0; r < 2; r++) {  // key rows key0 + 8r; queries c, c + 1
          const unsigned x = pack_bf16x2(dp[j][2 * r], dp[j][2 * r + 1]);
          const int c = 8 * j + 2 * t;
          if (c < curmax) dsh[attn_ds_row(cur0 + c) + 8 * r] = (tg_bf16)(x & 0xffffu);
          if (c + 1 < curmax) dsh[attn_ds_row(cur0 + c + 1) + 8 * r] = (tg_bf16)(x >> 16);
        }
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

// dq = scale·dS·K over packed sequences, from the dS scratch that
// attn_bwd_dkdv_tc<.., true> wrote (attn_ds): no S or dP recomputed. Grid
// (ceil(MaxLen/64), S, NH), the longest rows first; warp w owns query rows
// 16w..16w+15 of the block's 64 and, per 64-key block of its causal range
// (ascending, double-buffered: the dS tile (64, 72) and the K tile),
// dQ += dS·K with dS's A fragments from shared memory (ldmatrix) and K's
// through ldmatrix.trans. dq (fp32) =.
// Rows [q0, q0+64) of key block kb of a head's dS region dsh into dst
// (64, 72); rows at or past len are zero-filled.
__device__ __forceinline__ void tc_load_ds(tg_bf16* dst, const tg_bf16* dsh, int q0, int len, int kb) {
  constexpr unsigned CPR = 8, LD = 72;  // 64 keys: 8 chunks of 16 bytes a row
#pragma unroll
  for (unsigned i = 0; i < TC_ROWS * CPR / TC_THREADS; i++) {
    const unsigned c = threadIdx.x + i * TC_THREADS;
    const unsigned r = c / CPR, col = (c % CPR) * 8;
    const bool ok = q0 + (int)r < len;
    const tg_bf16* src = dsh + attn_ds_row(ok ? q0 + r : q0) + 64 * kb + col;
    cp_async16(dst + r * LD + col, src, ok ? 16 : 0);
  }
}

template <int HD, class Topo>
__device__ __forceinline__ void attn_bwd_dq_ds_tc(float* dq, const tg_bf16* k, const Topo& topo, int NH,
                                                  int NKV, float scale, attn_ds ds) {
  constexpr int MQ = TC_ROWS, NK = 64, LD = HD + 8, LDS = NK + 8, DT = HD / 8;
  TG_DYN_SMEM_ALIGNED(tg_bf16, sm_tc);
  tg_bf16* Ss = sm_tc;              // 2 × (MQ, LDS)
  tg_bf16* Ks = Ss + 2 * MQ * LDS;  // 2 × (NK, LD)
  const int s = blockIdx.y, h = blockIdx.z, kvh = h / (NH / NKV);
  int start, len;
  if (!topo.seg(s, start, len)) return;  // (a flagged data error)
  if (len > ds.maxlen) return;           // (flagged; its rows are not in the scratch)
  const int q0 = (gridDim.x - 1 - blockIdx.x) * MQ;
  if (q0 >= len) return;
  const int lane = threadIdx.x & 31, warp = threadIdx.x >> 5, g = lane >> 2, t = lane & 3;
  const tg_bf16* dsh = ds.p + ((long long)h * ds.T + start) * ds.bt;
  const int nkb = q0 / NK + 1;  // key blocks 0 .. q0/64: the causal range of rows q0 ..
  tc_load_ds(Ss, dsh, q0, len, 0);
  tc_load<NK, HD>(Ks, k, start, len, NKV, kvh);
  cp_async_commit();
  cp_async_wait<0>();
  __syncthreads();
  float acc[DT][4];
#pragma unroll
  for (int j = 0; j < DT; j++) acc[j][0] = acc[j][1] = acc[j][2] = acc[j][3] = 0.f;
  for (int kb = 0, buf = 0; kb < nkb; kb++, buf ^= 1) {
    if (kb + 1 < nkb) {
      tc_load_ds(Ss + (buf ^ 1) * MQ * LDS, dsh, q0, len, kb + 1);
      tc_load<NK, HD>(Ks + (buf ^ 1) * NK * LD, k, start + (kb + 1) * NK, len - (kb + 1) * NK, NKV, kvh);
    }
    cp_async_commit();
    const tg_bf16* Sb = Ss + buf * MQ * LDS;
    const tg_bf16* Kb = Ks + buf * NK * LD;
#pragma unroll
    for (int kk = 0; kk < NK / 16; kk++) {
      unsigned a[4];
      tc_frag_a<NK>(a, Sb, warp * 16, kk * 16, lane);
#pragma unroll
      for (int jp = 0; jp < DT / 2; jp++) {
        unsigned b[4];
        tc_frag_bt<HD>(b, Kb, kk * 16, jp * 16, lane);
        mma_bf16_16816(acc[2 * jp], a, b);
        mma_bf16_16816(acc[2 * jp + 1], a, b + 2);
      }
    }
    cp_async_wait<0>();  // the next tiles landed
    __syncthreads();     // and every warp is done with this buffer
  }
  const int row0 = q0 + warp * 16 + g;
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
