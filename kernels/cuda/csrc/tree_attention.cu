// tree_attention.cu: causal grouped-query attention over a packed token tree
// (kernels.Tree), forward and backward: attention_family.cuh's kernels with
// the tree's topology (TreeTopo), whose one-level case (roots alone) is
// attention.cu's packed sequences. The backward pass's D = rowsum(dout∘out)
// is attention.cu's attention_bwd_dot.
//
//   tree_check:     the rules of kernels.Tree, one thread per segment (TG_ERR_TREE)
//   tree_fwd*:      out (T,NH,HD) =, lse (T,NH) =   (attn_fwd, attn_fwd_tc)
//   tree_bwd_dq*:   dq (T,NH,HD) =                   (attn_bwd_dq, attn_bwd_dq_tc)
//   tree_bwd_dkdv*: dk, dv (T,NKV,HD) =              (attn_bwd_dkdv, attn_bwd_dkdv_tc)
//
// offs (NS+1), parent (NS), ends (NS) I32: segment s holds tokens
// [offs[s], offs[s+1]), its parent is parent[s] (−1 for a root), its
// descendants hold the tokens [offs[s+1], ends[s]) (segments in depth-first
// preorder). A query of s sees its ancestors' tokens and its own segment's
// up to itself; a key's dk and dv sum every query that sees it (its
// segment's later ones and all its descendants') in an order fixed by the
// tree's shape.
//
// Bad trees: tree_check sets TG_ERR_TREE for every rule kernels.CheckTree
// checks (the outputs are then unspecified). TreeTopo clamps the ranges it
// gives to [0, T) and stops a parent walk at a parent that does not precede
// its child, so a bad tree can make the kernels neither read outside their
// buffers nor loop.
#include "attention_family.cuh"

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

// The tree as attention_family.cuh's topology.
struct TreeTopo {
  const int *offs, *par, *ends;
  int T;
  __device__ __forceinline__ bool seg(int s, int& start, int& len) const {
    tree_seg(offs, s, T, start, len);
    return true;
  }
  __device__ __forceinline__ int parent(int s) const { return tree_parent(par, s); }
  __device__ __forceinline__ void span(int a, int& start, int& len) const { tree_seg(offs, a, T, start, len); }
  __device__ __forceinline__ void desc(int s, int start, int len, int& d0, int& dn) const {
    tree_desc(ends, s, start, len, T, d0, dn);
  }
};

// ---------------------------------------------------------------------------
// fp32, and bf16 widened as it loads.
#define TREE_ARGS const int *offs, const int *parent, int T, int NH, int NKV, int HD, float scale
#define TREE_BWD_ARGS \
  const int *offs, const int *parent, const int *ends, int T, int NH, int NKV, int HD, float scale
#define TREE_TOPO TreeTopo{offs, parent, nullptr, T}
#define TREE_BWD_TOPO TreeTopo{offs, parent, ends, T}
extern "C" __global__ void __launch_bounds__(AT_THREADS)
    tree_fwd_f32(float* out, float* lse, const float* q, const float* k, const float* v, TREE_ARGS) {
  attn_fwd(out, lse, q, k, v, TREE_TOPO, NH, NKV, HD, scale);
}
extern "C" __global__ void __launch_bounds__(AT_THREADS)
    tree_fwd_f32_bf16out(tg_bf16* out, float* lse, const float* q, const float* k, const float* v, TREE_ARGS) {
  attn_fwd(out, lse, q, k, v, TREE_TOPO, NH, NKV, HD, scale);
}
extern "C" __global__ void __launch_bounds__(AT_THREADS)
    tree_fwd_bf16(tg_bf16* out, float* lse, const tg_bf16* q, const tg_bf16* k, const tg_bf16* v, TREE_ARGS) {
  attn_fwd(out, lse, q, k, v, TREE_TOPO, NH, NKV, HD, scale);
}
extern "C" __global__ void __launch_bounds__(AT_THREADS)
    tree_fwd_bf16_f32out(float* out, float* lse, const tg_bf16* q, const tg_bf16* k, const tg_bf16* v,
                         TREE_ARGS) {
  attn_fwd(out, lse, q, k, v, TREE_TOPO, NH, NKV, HD, scale);
}
extern "C" __global__ void __launch_bounds__(AT_THREADS)
    tree_bwd_dq_f32(float* dq, const float* dout, const float* lse, const float* D, const float* q,
                    const float* k, const float* v, TREE_BWD_ARGS) {
  attn_bwd_dq(dq, dout, lse, D, q, k, v, TREE_BWD_TOPO, NH, NKV, HD, scale);
}
extern "C" __global__ void __launch_bounds__(AT_THREADS)
    tree_bwd_dq_bf16(float* dq, const tg_bf16* dout, const float* lse, const float* D, const tg_bf16* q,
                     const tg_bf16* k, const tg_bf16* v, TREE_BWD_ARGS) {
  attn_bwd_dq(dq, dout, lse, D, q, k, v, TREE_BWD_TOPO, NH, NKV, HD, scale);
}
extern "C" __global__ void __launch_bounds__(AT_THREADS)
    tree_bwd_dkdv_f32(float* dk, float* dv, const float* dout, const float* lse, const float* D,
                      const float* q, const float* k, const float* v, TREE_BWD_ARGS) {
  attn_bwd_dkdv(dk, dv, dout, lse, D, q, k, v, TREE_BWD_TOPO, NH, NKV, HD, scale);
}
extern "C" __global__ void __launch_bounds__(AT_THREADS)
    tree_bwd_dkdv_bf16(float* dk, float* dv, const tg_bf16* dout, const float* lse, const float* D,
                       const tg_bf16* q, const tg_bf16* k, const tg_bf16* v, TREE_BWD_ARGS) {
  attn_bwd_dkdv(dk, dv, dout, lse, D, q, k, v, TREE_BWD_TOPO, NH, NKV, HD, scale);
}

// ---------------------------------------------------------------------------
// Tensor cores: bf16, head dimension 64 or 128.
#define TREE_TC_ARGS const int *offs, const int *parent, int T, int NH, int NKV, float sl2
#define TREE_TC_BWD_ARGS \
  const int *offs, const int *parent, const int *ends, int T, int NH, int NKV, float scale, float sl2
extern "C" __global__ void __launch_bounds__(TC_THREADS, 2)
    tree_fwd_tc_hd64_bf16out(tg_bf16* out, float* lse, const tg_bf16* q, const tg_bf16* k, const tg_bf16* v,
                             TREE_TC_ARGS) {
  attn_fwd_tc<64, tg_bf16>(out, lse, q, k, v, TREE_TOPO, NH, NKV, sl2);
}
extern "C" __global__ void __launch_bounds__(TC_THREADS, 2)
    tree_fwd_tc_hd64_f32out(float* out, float* lse, const tg_bf16* q, const tg_bf16* k, const tg_bf16* v,
                            TREE_TC_ARGS) {
  attn_fwd_tc<64, float>(out, lse, q, k, v, TREE_TOPO, NH, NKV, sl2);
}
extern "C" __global__ void __launch_bounds__(TC_THREADS, 2)
    tree_fwd_tc_hd128_bf16out(tg_bf16* out, float* lse, const tg_bf16* q, const tg_bf16* k, const tg_bf16* v,
                              TREE_TC_ARGS) {
  attn_fwd_tc<128, tg_bf16>(out, lse, q, k, v, TREE_TOPO, NH, NKV, sl2);
}
extern "C" __global__ void __launch_bounds__(TC_THREADS, 2)
    tree_fwd_tc_hd128_f32out(float* out, float* lse, const tg_bf16* q, const tg_bf16* k, const tg_bf16* v,
                             TREE_TC_ARGS) {
  attn_fwd_tc<128, float>(out, lse, q, k, v, TREE_TOPO, NH, NKV, sl2);
}
extern "C" __global__ void __launch_bounds__(TC_THREADS, 2)
    tree_bwd_dq_tc_hd64(float* dq, const tg_bf16* dout, const float* lse, const float* D, const tg_bf16* q,
                        const tg_bf16* k, const tg_bf16* v, TREE_TC_BWD_ARGS) {
  attn_bwd_dq_tc<64, 64>(dq, dout, lse, D, q, k, v, TREE_BWD_TOPO, NH, NKV, scale, sl2);
}
extern "C" __global__ void __launch_bounds__(TC_THREADS, 2)
    tree_bwd_dq_tc_hd128(float* dq, const tg_bf16* dout, const float* lse, const float* D, const tg_bf16* q,
                         const tg_bf16* k, const tg_bf16* v, TREE_TC_BWD_ARGS) {
  attn_bwd_dq_tc<128, 32>(dq, dout, lse, D, q, k, v, TREE_BWD_TOPO, NH, NKV, scale, sl2);
}
extern "C" __global__ void __launch_bounds__(TC_THREADS, 2)
    tree_bwd_dkdv_tc_hd64(float* dk, float* dv, const tg_bf16* dout, const float* lse, const float* D,
                          const tg_bf16* q, const tg_bf16* k, const tg_bf16* v, TREE_TC_BWD_ARGS) {
  attn_bwd_dkdv_tc<64, 64, false>(dk, dv, dout, lse, D, q, k, v, TREE_BWD_TOPO, NH, NKV, scale, sl2, attn_ds{});
}
extern "C" __global__ void __launch_bounds__(TC_THREADS, 2)
    tree_bwd_dkdv_tc_hd128(float* dk, float* dv, const tg_bf16* dout, const float* lse, const float* D,
                           const tg_bf16* q, const tg_bf16* k, const tg_bf16* v, TREE_TC_BWD_ARGS) {
  attn_bwd_dkdv_tc<128, 32, false>(dk, dv, dout, lse, D, q, k, v, TREE_BWD_TOPO, NH, NKV, scale, sl2, attn_ds{});
}
