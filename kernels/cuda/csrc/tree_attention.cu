// tree_attention.cu: causal grouped-query attention over a packed token tree
// (kernels.Tree), forward and backward, fp32 (FlashAttention style, like
// attention.cu's) and bf16 on tensor cores (FlashAttention-2 on mma.sync,
// attention_tc.cuh's tiles). Attention over packed sequences is the tree of
// roots alone; attention.cu keeps its own kernels for it.
//
//   tree_check:     the rules of kernels.Tree, one thread per segment (TG_ERR_TREE)
//   tree_fwd*:      out (T,NH,HD) = softmax(scale·q·kᵀ over the context)·v   (=)
//                   lse (T,NH) = log-sum-exp of each query's scaled scores    (=)
//   tree_bwd_dq*:   dq (T,NH,HD) = scale·Σ_j ds_j·k_j                         (=)
//   tree_bwd_dkdv*: dk (T,NKV,HD) = scale·Σ_i ds_i·q_i,
//                   dv (T,NKV,HD) = Σ_i p_i·dout_i  (every query that sees the key,
//                                                    over the group's heads)  (=)
//     with p = exp(scale·q·k − lse), ds = p·(dout·v − D), and D = rowsum(dout∘out)
//     from attention.cu's attention_bwd_dot.
//
// q, out, dq, dout (T,NH,HD); k, v, dk, dv (T,NKV,HD); offs (NS+1), parent
// (NS), ends (NS) I32: segment s holds tokens [offs[s], offs[s+1]), its
// parent is parent[s] (−1 for a root), its descendants hold the tokens
// [offs[s+1], ends[s]) (segments in depth-first preorder). A query of s sees
// its ancestors' tokens and its own segment's up to itself. HD <= 128.
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
// Bad trees: tree_check sets TG_ERR_TREE for every rule kernels.CheckTree
// checks (the outputs are then unspecified). The attention kernels clamp the
// ranges they read to [0, T) and stop a parent walk at a parent that does
// not precede its child, so a bad tree can make them neither read outside
// their buffers nor loop.
//
// fp32 work split (as attention.cu's fp32 kernels; 128 threads, a lane owns
// head dimensions lane + 32j):
//   tree_fwd:      grid (ceil(MaxLen/16), NS, NH); 4 query rows per warp.
//   tree_bwd_dq:   grid (ceil(MaxLen/8), NS, NH); 2 query rows per warp.
//   tree_bwd_dkdv: grid (ceil(MaxLen/8), NS, NKV); 2 key rows per warp; lane
//                  i scores query i of a 32-query tile.
// Tensor-core work split (as attention.cu's; 4 warps of 16 rows):
//   tree_fwd_tc_hdD_{bf16,f32}out: grid (ceil(MaxLen/64), NS, NH); per tile
//     of 64 keys S = Q·Kᵀ, mask, online softmax, O += P·V; V's load overlaps
//     S, the next tile's K (in this range or the parent's) overlaps P·V.
//   tree_bwd_dq_tc_hdD: grid (ceil(MaxLen/64), NS, NH); K and V tiles
//     double-buffered across the ranges.
//   tree_bwd_dkdv_tc_hdD: grid (ceil(MaxLen/64), NS, NKV); query tiles (with
//     their lse and D) double-buffered across the two runs and the heads.
#include "common.cuh"
#include "bf16.cuh"
#include "attention_tc.cuh"

#define TR_THREADS 128
#define TR_MAXJ 4  // HD <= 32·TR_MAXJ
#define TR_BC 32   // keys per tile (one per lane)
#define TR_FWD_R 4
#define TR_FWD_BR (4 * TR_FWD_R)
#define TR_DQ_R 2
#define TR_DQ_BR (4 * TR_DQ_R)
#define TR_DK_R 2
#define TR_DK_BC (4 * TR_DK_R)
#define TR_BQ 32   // queries per dkdv tile (one per lane)

// Segment s's tokens [start, start+len), clamped into [0, T].
__device__ __forceinline__ void tree_seg(const int* offs, int s, int T, int& start, int& len) {
  const int a = min(max(offs[s], 0), T), b = min(max(offs[s + 1], a), T);
  start = a;
  len = b - a;
}

// The parent of s, or −1 at a root (and at a parent that does not precede
// s, which tree_check flags).
__device__ __forceinline__ int tree_parent(const int* parent, int s) {
  const int p = parent[s];
  return p >= 0 && p < s ? p : -1;
}

// The descendants' tokens of s, [d0, d0+dn), clamped into [0, T].
__device__ __forceinline__ void tree_desc(const int* ends, int s, int start, int len, int T, int& d0, int& dn) {
  d0 = start + len;
  dn = min(max(ends[s], d0), T) - d0;
}

// The segment that starts at token x, NS for x = offs[NS], or −1.
__device__ __forceinline__ int tree_start(const int* offs, int NS, int x) {
  int lo = 0, hi = NS;
  while (lo < hi) {
    const int mid = (lo + hi) >> 1;
    if (offs[mid] < x)
      lo = mid + 1;
    else
      hi = mid;
  }
  return offs[lo] == x ? lo : -1;
}

// The rules of kernels.Tree (kernels.CheckTree makes the same checks on the
// host). Grid-stride over segments; thread 0 also checks the offsets' ends.
extern "C" __global__ void tree_check(const int* offs, const int* parent, const int* ends, int NS, int T,
                                      int maxlen, int maxctx, int* flags) {
  if (blockIdx.x == 0 && threadIdx.x == 0 && (offs[0] != 0 || offs[NS] != T)) atomicOr(flags, TG_ERR_TREE);
  for (int s = blockIdx.x * blockDim.x + threadIdx.x; s < NS; s += gridDim.x * blockDim.x) {
    const int o0 = offs[s], o1 = offs[s + 1], p = parent[s], e = ends[s];
    bool bad = o1 - o0 < 1 || o1 - o0 > maxlen || p < -1 || p >= s || e < o1 || e > T;
    if (!bad) {
      // (Indices stay in range even when other segments break a rule.)
      const int E = p >= 0 ? ends[p] : T, n = tree_start(offs, NS, e);
      bad = n < 0 || (e > o1 && (s + 1 >= NS || parent[s + 1] != s)) || e > E ||
            (e < E && (n >= NS || parent[n] != p));
    }
    if (!bad) {
      int ctx = o1 - o0;
      for (int a = p; a >= 0;) {
        ctx += offs[a + 1] - offs[a];
        const int n = parent[a];
        if (n >= a || n < -1) {
          bad = true;
          break;
        }
        a = n;
      }
      bad = bad || ctx > maxctx;
    }
    if (bad) atomicOr(flags, TG_ERR_TREE);
  }
}

// ---------------------------------------------------------------------------
// fp32 (and the widening path of bf16 operands the tensor-core kernels do
// not take).

template <class TI, class TO>
__device__ __forceinline__ void tree_fwd(TO* out, float* lse, const TI* q, const TI* k, const TI* v,
                                         const int* offs, const int* parent, int T, int NH, int NKV,
                                         int HD, float scale) {
  TG_DYN_SMEM(float, sm);
  const int s = blockIdx.y, h = blockIdx.z, kvh = h / (NH / NKV);
  int start, len;
  tree_seg(offs, s, T, start, len);
  const int q0 = blockIdx.x * TR_FWD_BR;
  if (q0 >= len) return;
  const int HDP = HD + 1;
  float* Qs = sm;                   // (TR_FWD_BR, HD), pre-scaled
  float* Ks = Qs + TR_FWD_BR * HD;  // (TR_BC, HDP)
  float* Vs = Ks + TR_BC * HDP;     // (TR_BC, HD)
  const int tid = threadIdx.x, lane = tid & 31, warp = tid >> 5;
  const int r0 = warp * TR_FWD_R;
  for (int i = tid; i < TR_FWD_BR * HD; i += TR_THREADS) {
    const int r = i / HD, d = i % HD, qi = q0 + r;
    Qs[i] = qi < len ? ld_f(q, ((long long)(start + qi) * NH + h) * HD + d) * scale : 0.f;
  }
  float m[TR_FWD_R], l[TR_FWD_R], acc[TR_FWD_R][TR_MAXJ];
#pragma unroll
  for (int rr = 0; rr < TR_FWD_R; rr++) {
    m[rr] = -TG_INF;
    l[rr] = 0.f;
#pragma unroll
    for (int j = 0; j < TR_MAXJ; j++) acc[rr][j] = 0.f;
  }
  // The keys: the own segment's up to the block's last query (causal), then
  // each ancestor's, all of them.
  int seg = s, kstart = start, klen = min(len, q0 + TR_FWD_BR);
  for (bool own = true;; own = false) {
    for (int k0 = 0; k0 < klen; k0 += TR_BC) {
      __syncthreads();  // Q loaded; the previous tile is consumed
      for (int i = tid; i < TR_BC * HD; i += TR_THREADS) {
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
      float sc[TR_FWD_R];
#pragma unroll
      for (int rr = 0; rr < TR_FWD_R; rr++) sc[rr] = 0.f;
      const float* kr = Ks + lane * HDP;
      const float* qr = Qs + r0 * HD;
      for (int d = 0; d < HD; d++) {
        const float kd = kr[d];
#pragma unroll
        for (int rr = 0; rr < TR_FWD_R; rr++) sc[rr] += qr[rr * HD + d] * kd;
      }
      const int kj = k0 + lane;
      float p[TR_FWD_R];
#pragma unroll
      for (int rr = 0; rr < TR_FWD_R; rr++) {
        const int qi = q0 + r0 + rr;
        if (!(qi < len && kj < klen && (!own || kj <= qi))) sc[rr] = -TG_INF;
        const float mnew = fmaxf(m[rr], warp_max(sc[rr]));
        p[rr] = sc[rr] == -TG_INF ? 0.f : expf(sc[rr] - mnew);
        const float alpha = m[rr] == -TG_INF ? 0.f : expf(m[rr] - mnew);
        l[rr] = l[rr] * alpha + warp_sum(p[rr]);
        m[rr] = mnew;
#pragma unroll
        for (int j = 0; j < TR_MAXJ; j++) acc[rr][j] *= alpha;
      }
      for (int jj = 0; jj < TR_BC; jj++) {
        float vd[TR_MAXJ];
#pragma unroll
        for (int j = 0; j < TR_MAXJ; j++) {
          const int d = lane + 32 * j;
          vd[j] = d < HD ? Vs[jj * HD + d] : 0.f;
        }
#pragma unroll
        for (int rr = 0; rr < TR_FWD_R; rr++) {
          const float pj = __shfl_sync(TG_FULL, p[rr], jj);
#pragma unroll
          for (int j = 0; j < TR_MAXJ; j++) acc[rr][j] += pj * vd[j];
        }
      }
    }
    seg = tree_parent(parent, seg);
    if (seg < 0) break;
    tree_seg(offs, seg, T, kstart, klen);
  }
#pragma unroll
  for (int rr = 0; rr < TR_FWD_R; rr++) {
    const int qi = q0 + r0 + rr;
    if (qi < len) {
      const long long row = (long long)(start + qi) * NH + h;
      const float inv = 1.f / l[rr];  // l >= 1: key qi itself is always seen
#pragma unroll
      for (int j = 0; j < TR_MAXJ; j++) {
        const int d = lane + 32 * j;
        if (d < HD) st_f(out, row * HD + d, acc[rr][j] * inv);
      }
      if (lane == 0) lse[row] = m[rr] + logf(l[rr]);
    }
  }
}

#define TREE_ARGS const int *offs, const int *parent, int T, int NH, int NKV, int HD, float scale
#define TREE_CALL offs, parent, T, NH, NKV, HD, scale
extern "C" __global__ void __launch_bounds__(TR_THREADS)
    tree_fwd_f32(float* out, float* lse, const float* q, const float* k, const float* v, TREE_ARGS) {
  tree_fwd(out, lse, q, k, v, TREE_CALL);
}
extern "C" __global__ void __launch_bounds__(TR_THREADS)
    tree_fwd_f32_bf16out(tg_bf16* out, float* lse, const float* q, const float* k, const float* v, TREE_ARGS) {
  tree_fwd(out, lse, q, k, v, TREE_CALL);
}
extern "C" __global__ void __launch_bounds__(TR_THREADS)
    tree_fwd_bf16(tg_bf16* out, float* lse, const tg_bf16* q, const tg_bf16* k, const tg_bf16* v, TREE_ARGS) {
  tree_fwd(out, lse, q, k, v, TREE_CALL);
}
extern "C" __global__ void __launch_bounds__(TR_THREADS)
    tree_fwd_bf16_f32out(float* out, float* lse, const tg_bf16* q, const tg_bf16* k, const tg_bf16* v,
                         TREE_ARGS) {
  tree_fwd(out, lse, q, k, v, TREE_CALL);
}

template <class TI>
__device__ __forceinline__ void tree_bwd_dq(float* dq, const TI* dout, const float* lse, const float* D,
                                            const TI* q, const TI* k, const TI* v, const int* offs,
                                            const int* parent, int T, int NH, int NKV, int HD, float scale) {
  TG_DYN_SMEM(float, sm);
  const int s = blockIdx.y, h = blockIdx.z, kvh = h / (NH / NKV);
  int start, len;
  tree_seg(offs, s, T, start, len);
  const int q0 = blockIdx.x * TR_DQ_BR;
  if (q0 >= len) return;
  const int HDP = HD + 1;
  float* Qs = sm;                   // (TR_DQ_BR, HD), pre-scaled
  float* dOs = Qs + TR_DQ_BR * HD;  // (TR_DQ_BR, HD)
  float* Ks = dOs + TR_DQ_BR * HD;  // (TR_BC, HDP)
  float* Vs = Ks + TR_BC * HDP;     // (TR_BC, HDP)
  const int tid = threadIdx.x, lane = tid & 31, warp = tid >> 5;
  const int r0 = warp * TR_DQ_R;
  for (int i = tid; i < TR_DQ_BR * HD; i += TR_THREADS) {
    const int r = i / HD, d = i % HD, qi = q0 + r;
    const long long off = ((long long)(start + qi) * NH + h) * HD + d;
    Qs[i] = qi < len ? ld_f(q, off) * scale : 0.f;
    dOs[i] = qi < len ? ld_f(dout, off) : 0.f;
  }
  float Li[TR_DQ_R], Di[TR_DQ_R], acc[TR_DQ_R][TR_MAXJ];
#pragma unroll
  for (int rr = 0; rr < TR_DQ_R; rr++) {
    const int qi = q0 + r0 + rr;
    const long long row = (long long)(start + qi) * NH + h;
    Li[rr] = qi < len ? lse[row] : 0.f;
    Di[rr] = qi < len ? D[row] : 0.f;
#pragma unroll
    for (int j = 0; j < TR_MAXJ; j++) acc[rr][j] = 0.f;
  }
  int seg = s, kstart = start, klen = min(len, q0 + TR_DQ_BR);
  for (bool own = true;; own = false) {
    for (int k0 = 0; k0 < klen; k0 += TR_BC) {
      __syncthreads();
      for (int i = tid; i < TR_BC * HD; i += TR_THREADS) {
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
      float sc[TR_DQ_R], dp[TR_DQ_R];
#pragma unroll
      for (int rr = 0; rr < TR_DQ_R; rr++) sc[rr] = dp[rr] = 0.f;
      const float* kr = Ks + lane * HDP;
      const float* vr = Vs + lane * HDP;
      const float* qr = Qs + r0 * HD;
      const float* gr = dOs + r0 * HD;
      for (int d = 0; d < HD; d++) {
        const float kd = kr[d], vd = vr[d];
#pragma unroll
        for (int rr = 0; rr < TR_DQ_R; rr++) {
          sc[rr] += qr[rr * HD + d] * kd;
          dp[rr] += gr[rr * HD + d] * vd;
        }
      }
      float ds[TR_DQ_R];
#pragma unroll
      for (int rr = 0; rr < TR_DQ_R; rr++) {
        const int qi = q0 + r0 + rr;
        ds[rr] = (qi < len && kj < klen && (!own || kj <= qi)) ? expf(sc[rr] - Li[rr]) * (dp[rr] - Di[rr]) : 0.f;
      }
      for (int jj = 0; jj < TR_BC; jj++) {
        float kd[TR_MAXJ];
#pragma unroll
        for (int j = 0; j < TR_MAXJ; j++) {
          const int d = lane + 32 * j;
          kd[j] = d < HD ? Ks[jj * HDP + d] : 0.f;
        }
#pragma unroll
        for (int rr = 0; rr < TR_DQ_R; rr++) {
          const float dsj = __shfl_sync(TG_FULL, ds[rr], jj);
#pragma unroll
          for (int j = 0; j < TR_MAXJ; j++) acc[rr][j] += dsj * kd[j];
        }
      }
    }
    seg = tree_parent(parent, seg);
    if (seg < 0) break;
    tree_seg(offs, seg, T, kstart, klen);
  }
#pragma unroll
  for (int rr = 0; rr < TR_DQ_R; rr++) {
    const int qi = q0 + r0 + rr;
    if (qi < len) {
      const long long row = (long long)(start + qi) * NH + h;
#pragma unroll
      for (int j = 0; j < TR_MAXJ; j++) {
        const int d = lane + 32 * j;
        if (d < HD) dq[row * HD + d] = acc[rr][j] * scale;
      }
    }
  }
}

#define TREE_BWD_ARGS \
  const int *offs, const int *parent, const int *ends, int T, int NH, int NKV, int HD, float scale
extern "C" __global__ void __launch_bounds__(TR_THREADS)
    tree_bwd_dq_f32(float* dq, const float* dout, const float* lse, const float* D, const float* q,
                    const float* k, const float* v, TREE_BWD_ARGS) {
  tree_bwd_dq(dq, dout, lse, D, q, k, v, offs, parent, T, NH, NKV, HD, scale);
}
extern "C" __global__ void __launch_bounds__(TR_THREADS)
    tree_bwd_dq_bf16(float* dq, const tg_bf16* dout, const float* lse, const float* D, const tg_bf16* q,
                     const tg_bf16* k, const tg_bf16* v, TREE_BWD_ARGS) {
  tree_bwd_dq(dq, dout, lse, D, q, k, v, offs, parent, T, NH, NKV, HD, scale);
}

template <class TI>
__device__ __forceinline__ void tree_bwd_dkdv(float* dk, float* dv, const TI* dout, const float* lse,
                                              const float* D, const TI* q, const TI* k, const TI* v,
                                              const int* offs, const int* ends, int T, int NH, int NKV,
                                              int HD, float scale) {
  TG_DYN_SMEM(float, sm);
  const int s = blockIdx.y, kvh = blockIdx.z, G = NH / NKV;
  int start, len, d0, dn;
  tree_seg(offs, s, T, start, len);
  const int k0 = blockIdx.x * TR_DK_BC;
  if (k0 >= len) return;
  tree_desc(ends, s, start, len, T, d0, dn);
  const int HDP = HD + 1;
  float* Ks = sm;                   // (TR_DK_BC, HD)
  float* Vs = Ks + TR_DK_BC * HD;   // (TR_DK_BC, HD)
  float* Qs = Vs + TR_DK_BC * HD;   // (TR_BQ, HDP), pre-scaled
  float* dOs = Qs + TR_BQ * HDP;    // (TR_BQ, HDP)
  float* Ls = dOs + TR_BQ * HDP;    // (TR_BQ)
  float* Ds = Ls + TR_BQ;           // (TR_BQ)
  const int tid = threadIdx.x, lane = tid & 31, warp = tid >> 5;
  const int r0 = warp * TR_DK_R;
  for (int i = tid; i < TR_DK_BC * HD; i += TR_THREADS) {
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
  float adk[TR_DK_R][TR_MAXJ], adv[TR_DK_R][TR_MAXJ];
#pragma unroll
  for (int rr = 0; rr < TR_DK_R; rr++)
#pragma unroll
    for (int j = 0; j < TR_MAXJ; j++) adk[rr][j] = adv[rr][j] = 0.f;
  for (int g = 0; g < G; g++) {
    const int h = kvh * G + g;
    // The queries: the own segment's [k0, len) (causal), then the
    // descendants' [d0, d0+dn) (all see every key of the block), in tiles
    // of TR_BQ: a tile j0 < len2 (len rounded up to whole tiles from k0)
    // is the own segment's at j0, a later one the descendants' at j0 − len2.
    const int len2 = k0 + (len - k0 + TR_BQ - 1) / TR_BQ * TR_BQ;
    for (int j0 = k0; j0 < len2 + dn; j0 += TR_BQ) {
      {
        const bool own = j0 < len2;
        const int base = own ? start : d0, i0 = own ? j0 : j0 - len2, to = own ? len : dn;
        __syncthreads();  // K/V loaded; the previous query tile is consumed
        for (int i = tid; i < TR_BQ * HD; i += TR_THREADS) {
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
        for (int r = tid; r < TR_BQ; r += TR_THREADS) {
          const int qi = i0 + r;
          const long long row = (long long)(base + qi) * NH + h;
          Ls[r] = qi < to ? lse[row] : 0.f;
          Ds[r] = qi < to ? D[row] : 0.f;
        }
        __syncthreads();
        const int qi = i0 + lane;
        float sc[TR_DK_R], dp[TR_DK_R];
#pragma unroll
        for (int rr = 0; rr < TR_DK_R; rr++) sc[rr] = dp[rr] = 0.f;
        const float* qr = Qs + lane * HDP;
        const float* gr = dOs + lane * HDP;
        const float* kr = Ks + r0 * HD;
        const float* vr = Vs + r0 * HD;
        for (int d = 0; d < HD; d++) {
          const float qd = qr[d], gd = gr[d];
#pragma unroll
          for (int rr = 0; rr < TR_DK_R; rr++) {
            sc[rr] += qd * kr[rr * HD + d];
            dp[rr] += gd * vr[rr * HD + d];
          }
        }
        float p[TR_DK_R], ds[TR_DK_R];
#pragma unroll
        for (int rr = 0; rr < TR_DK_R; rr++) {
          const int kj = k0 + r0 + rr;
          if (kj < len && qi < to && (!own || qi >= kj)) {
            p[rr] = expf(sc[rr] - Ls[lane]);
            ds[rr] = p[rr] * (dp[rr] - Ds[lane]);
          } else {
            p[rr] = ds[rr] = 0.f;
          }
        }
        for (int ii = 0; ii < TR_BQ; ii++) {
          float gd[TR_MAXJ], qd[TR_MAXJ];
#pragma unroll
          for (int j = 0; j < TR_MAXJ; j++) {
            const int d = lane + 32 * j;
            gd[j] = d < HD ? dOs[ii * HDP + d] : 0.f;
            qd[j] = d < HD ? Qs[ii * HDP + d] : 0.f;  // Qs holds scale·q
          }
#pragma unroll
          for (int rr = 0; rr < TR_DK_R; rr++) {
            const float pi = __shfl_sync(TG_FULL, p[rr], ii);
            const float dsi = __shfl_sync(TG_FULL, ds[rr], ii);
#pragma unroll
            for (int j = 0; j < TR_MAXJ; j++) {
              adv[rr][j] += pi * gd[j];
              adk[rr][j] += dsi * qd[j];
            }
          }
        }
      }
    }
  }
#pragma unroll
  for (int rr = 0; rr < TR_DK_R; rr++) {
    const int kj = k0 + r0 + rr;
    if (kj < len) {
      const long long row = (long long)(start + kj) * NKV + kvh;
#pragma unroll
      for (int j = 0; j < TR_MAXJ; j++) {
        const int d = lane + 32 * j;
        if (d < HD) {
          dk[row * HD + d] = adk[rr][j];
          dv[row * HD + d] = adv[rr][j];
        }
      }
    }
  }
}

extern "C" __global__ void __launch_bounds__(TR_THREADS)
    tree_bwd_dkdv_f32(float* dk, float* dv, const float* dout, const float* lse, const float* D,
                      const float* q, const float* k, const float* v, TREE_BWD_ARGS) {
  tree_bwd_dkdv(dk, dv, dout, lse, D, q, k, v, offs, ends, T, NH, NKV, HD, scale);
}
extern "C" __global__ void __launch_bounds__(TR_THREADS)
    tree_bwd_dkdv_bf16(float* dk, float* dv, const tg_bf16* dout, const float* lse, const float* D,
                       const tg_bf16* q, const tg_bf16* k, const tg_bf16* v, TREE_BWD_ARGS) {
  tree_bwd_dkdv(dk, dv, dout, lse, D, q, k, v, offs, ends, T, NH, NKV, HD, scale);
}

// ---------------------------------------------------------------------------
// Tensor cores: bf16 q, k, v (and dout, out), head_dim 64 or 128, fp32
// accumulation; P and dS are rounded to bf16 as mma operands.

// The next 64-key tile of a forward or dq block's walk: the next in the
// range (kstart, klen) being walked, or the parent's first. It returns false
// at the root's last tile.
struct tree_walk {
  int seg, kstart, klen, k0;
  bool own;
};
template <int NK>
__device__ __forceinline__ bool tree_walk_next(const tree_walk& c, tree_walk& n, const int* offs,
                                               const int* parent, int T) {
  n = c;
  n.k0 = c.k0 + NK;
  if (n.k0 < c.klen) return true;
  n.seg = tree_parent(parent, c.seg);
  if (n.seg < 0) return false;
  tree_seg(offs, n.seg, T, n.kstart, n.klen);
  n.k0 = 0;
  n.own = false;
  return true;
}

template <int HD, class TO>
__device__ __forceinline__ void tree_fwd_tc(TO* out, float* lse, const tg_bf16* q, const tg_bf16* k,
                                            const tg_bf16* v, const int* offs, const int* parent, int T,
                                            int NH, int NKV, float sl2) {
  constexpr int MQ = TC_ROWS, NK = 64, LD = HD + 8, KS = HD / 16, NT = NK / 8, DT = HD / 8;
  TG_DYN_SMEM_ALIGNED(tg_bf16, sm_tc);
  tg_bf16* Qs = sm_tc;         // (MQ, LD)
  tg_bf16* Ks = Qs + MQ * LD;  // (NK, LD)
  tg_bf16* Vs = Ks + NK * LD;  // (NK, LD)
  const int s = blockIdx.y, h = blockIdx.z, kvh = h / (NH / NKV);
  int start, len;
  tree_seg(offs, s, T, start, len);
  const int q0 = (gridDim.x - 1 - blockIdx.x) * MQ;  // the longest rows first
  if (q0 >= len) return;
  const int lane = threadIdx.x & 31, warp = threadIdx.x >> 5, g = lane >> 2, t = lane & 3;
  tree_walk c = {s, start, min(len, q0 + MQ), 0, true};
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
    tree_walk n;
    const bool more = tree_walk_next<NK>(c, n, offs, parent, T);
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

#define TREE_TC_ARGS const int *offs, const int *parent, int T, int NH, int NKV, float sl2
#define TREE_TC_CALL offs, parent, T, NH, NKV, sl2
extern "C" __global__ void __launch_bounds__(TC_THREADS, 2)
    tree_fwd_tc_hd64_bf16out(tg_bf16* out, float* lse, const tg_bf16* q, const tg_bf16* k, const tg_bf16* v,
                             TREE_TC_ARGS) {
  tree_fwd_tc<64, tg_bf16>(out, lse, q, k, v, TREE_TC_CALL);
}
extern "C" __global__ void __launch_bounds__(TC_THREADS, 2)
    tree_fwd_tc_hd64_f32out(float* out, float* lse, const tg_bf16* q, const tg_bf16* k, const tg_bf16* v,
                            TREE_TC_ARGS) {
  tree_fwd_tc<64, float>(out, lse, q, k, v, TREE_TC_CALL);
}
extern "C" __global__ void __launch_bounds__(TC_THREADS, 2)
    tree_fwd_tc_hd128_bf16out(tg_bf16* out, float* lse, const tg_bf16* q, const tg_bf16* k, const tg_bf16* v,
                              TREE_TC_ARGS) {
  tree_fwd_tc<128, tg_bf16>(out, lse, q, k, v, TREE_TC_CALL);
}
extern "C" __global__ void __launch_bounds__(TC_THREADS, 2)
    tree_fwd_tc_hd128_f32out(float* out, float* lse, const tg_bf16* q, const tg_bf16* k, const tg_bf16* v,
                             TREE_TC_ARGS) {
  tree_fwd_tc<128, float>(out, lse, q, k, v, TREE_TC_CALL);
}

template <int HD, int NK>
__device__ __forceinline__ void tree_bwd_dq_tc(float* dq, const tg_bf16* dout, const float* lse,
                                               const float* D, const tg_bf16* q, const tg_bf16* k,
                                               const tg_bf16* v, const int* offs, const int* parent,
                                               int T, int NH, int NKV, float scale, float sl2) {
  constexpr int MQ = TC_ROWS, LD = HD + 8, KS = HD / 16, NT = NK / 8, DT = HD / 8;
  TG_DYN_SMEM_ALIGNED(tg_bf16, sm_tc);
  tg_bf16* Qs = sm_tc;             // (MQ, LD)
  tg_bf16* dOs = Qs + MQ * LD;     // (MQ, LD)
  tg_bf16* Ks = dOs + MQ * LD;     // 2 × (NK, LD)
  tg_bf16* Vs = Ks + 2 * NK * LD;  // 2 × (NK, LD)
  const int s = blockIdx.y, h = blockIdx.z, kvh = h / (NH / NKV);
  int start, len;
  tree_seg(offs, s, T, start, len);
  const int q0 = (gridDim.x - 1 - blockIdx.x) * MQ;
  if (q0 >= len) return;
  const int lane = threadIdx.x & 31, warp = threadIdx.x >> 5, g = lane >> 2, t = lane & 3;
  tree_walk c = {s, start, min(len, q0 + MQ), 0, true};
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
    tree_walk n;
    const bool more = tree_walk_next<NK>(c, n, offs, parent, T);
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

#define TREE_TC_BWD_ARGS \
  const int *offs, const int *parent, const int *ends, int T, int NH, int NKV, float scale, float sl2
#define TREE_TC_BWD_CALL offs, parent, T, NH, NKV, scale, sl2
extern "C" __global__ void __launch_bounds__(TC_THREADS, 2)
    tree_bwd_dq_tc_hd64(float* dq, const tg_bf16* dout, const float* lse, const float* D, const tg_bf16* q,
                        const tg_bf16* k, const tg_bf16* v, TREE_TC_BWD_ARGS) {
  tree_bwd_dq_tc<64, 64>(dq, dout, lse, D, q, k, v, TREE_TC_BWD_CALL);
}
extern "C" __global__ void __launch_bounds__(TC_THREADS, 2)
    tree_bwd_dq_tc_hd128(float* dq, const tg_bf16* dout, const float* lse, const float* D, const tg_bf16* q,
                         const tg_bf16* k, const tg_bf16* v, TREE_TC_BWD_ARGS) {
  tree_bwd_dq_tc<128, 32>(dq, dout, lse, D, q, k, v, TREE_TC_BWD_CALL);
}

// Query tile it of a dkdv block's walk (for its head, it % ntq): the own
// segment's tiles from the block's first key (ntq_own of them), then the
// descendants' run. base is the tile's first packed row, rmax its rows, i0
// its first query's index in the own segment (own tiles only).
__device__ __forceinline__ void tree_qtile(int it, int ntq_own, int NQ, int start, int len, int k0, int d0,
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

template <int HD, int NQ>
__device__ __forceinline__ void tree_bwd_dkdv_tc(float* dk, float* dv, const tg_bf16* dout,
                                                 const float* lse, const float* D, const tg_bf16* q,
                                                 const tg_bf16* k, const tg_bf16* v, const int* offs,
                                                 const int* ends, int T, int NH, int NKV, float scale,
                                                 float sl2) {
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
  tree_seg(offs, s, T, start, len);
  const int k0 = blockIdx.x * MK;  // the first key blocks have the most work and go first
  if (k0 >= len) return;
  tree_desc(ends, s, start, len, T, d0, dn);
  const int lane = threadIdx.x & 31, warp = threadIdx.x >> 5, g = lane >> 2, t = lane & 3;
  const int nto = (len - k0 + NQ - 1) / NQ, ntq = nto + (dn + NQ - 1) / NQ, nit = G * ntq;
  long long base;
  int rmax, i0;
  bool own;
  tc_load<MK, HD>(Ks, k, start + k0, len - k0, NKV, kvh);
  tc_load<MK, HD>(Vs, v, start + k0, len - k0, NKV, kvh);
  tree_qtile(0, nto, NQ, start, len, k0, d0, dn, base, rmax, i0, own);
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
    const int cur0 = i0, curmax = rmax;
    const bool curown = own;
    if (it + 1 < nit) {
      const int hn = kvh * G + (it + 1) / ntq;
      tree_qtile((it + 1) % ntq, nto, NQ, start, len, k0, d0, dn, base, rmax, i0, own);
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

#define TREE_TC_DKDV_CALL offs, ends, T, NH, NKV, scale, sl2
extern "C" __global__ void __launch_bounds__(TC_THREADS, 2)
    tree_bwd_dkdv_tc_hd64(float* dk, float* dv, const tg_bf16* dout, const float* lse, const float* D,
                          const tg_bf16* q, const tg_bf16* k, const tg_bf16* v, TREE_TC_BWD_ARGS) {
  tree_bwd_dkdv_tc<64, 64>(dk, dv, dout, lse, D, q, k, v, TREE_TC_DKDV_CALL);
}
extern "C" __global__ void __launch_bounds__(TC_THREADS, 2)
    tree_bwd_dkdv_tc_hd128(float* dk, float* dv, const tg_bf16* dout, const float* lse, const float* D,
                           const tg_bf16* q, const tg_bf16* k, const tg_bf16* v, TREE_TC_BWD_ARGS) {
  tree_bwd_dkdv_tc<128, 32>(dk, dv, dout, lse, D, q, k, v, TREE_TC_DKDV_CALL);
}
