// attention.cu: causal grouped-query attention over packed sequences
// (kernels.Seqs), forward and backward: the one-level case of
// attention_family.cuh's kernels, which tree_attention.cu runs over token
// trees. A sequence is a segment with no parent and no descendants
// (SeqTopo); every tile loop is the family's. Decode is in
// attention_decode.cu.
//
//   attention_fwd*:        out (T,NH,HD) =, lse (T,NH) =   (attn_fwd, attn_fwd_tc)
//   attention_bwd_dot*:    D (T,NH) = Σ_d dout·out          (=; here, tree_attention.cu's too)
//   attention_bwd_dkdv*:   dk, dv (T,NKV,HD) =              (attn_bwd_dkdv, attn_bwd_dkdv_tc<.., true>:
//                          and dS into the scratch, attn_ds)
//   attention_bwd_dkdv_nods_tc*: the same without dS (attn_bwd_dkdv_tc<.., false>: above the cap)
//   attention_bwd_dq*:     dq (T,NH,HD) =                   (attn_bwd_dq, attn_bwd_dq_ds_tc: dS·K
//                          from the scratch, after the dkdv kernel; attn_bwd_dq_tc above the
//                          scratch's cap: S and dP recomputed)
//
// q, out, dq, dout (T,NH,HD); k, v, dk, dv (T,NKV,HD); cu (S+1) I32 holds
// the sequence offsets. Sequence s is tokens [cu[s], cu[s+1]), positions
// restart at 0, and a query at position i sees keys 0..i of its own
// sequence. Offsets that do not run from 0 to T, or a sequence longer than
// Seqs.MaxLen or of negative length, set TG_ERR_SEQS (the outputs are then
// unspecified; no block reads outside q, k, v).
//
// The fp32 kernels take fp32 operands, and bf16 ones the tensor-core
// kernels do not (another head dimension, unaligned views: widened as they
// load). The _tc_hdD kernels take bf16 operands of head dimension 64 or
// 128. Grids and work split: attention_family.cuh.
#include "attention_family.cuh"

// Flags TG_ERR_SEQS for sequence s of length len when it is negative or
// longer than maxlen (Seqs.MaxLen, which sized the grid), or, for s = 0,
// when cu[0] != 0 or cu[S] != T: the checks kernels/cpu makes.
__device__ __forceinline__ void check_seq(const int* cu, int s, int S, int T, int maxlen, int len,
                                          int* flags) {
  if (len < 0 || len > maxlen || (s == 0 && (cu[0] != 0 || cu[S] != T))) atomicOr(flags, TG_ERR_SEQS);
}

// Packed sequences as attention_family.cuh's topology: roots alone.
struct SeqTopo {
  const int* cu;
  int S, T, maxlen;
  int* flags;
  // Block s's sequence; the block (x = 0) of each sequence checks it.
  __device__ __forceinline__ bool seg(int s, int& start, int& len) const {
    start = cu[s];
    len = cu[s + 1] - start;
    if (blockIdx.x == 0 && threadIdx.x == 0) check_seq(cu, s, S, T, maxlen, len, flags);
    return start >= 0 && len >= 0 && start + len <= T;  // else flagged; never read outside q, k, v
  }
  __device__ __forceinline__ int parent(int) const { return -1; }
  __device__ __forceinline__ void span(int, int& start, int& len) const { start = len = 0; }
  __device__ __forceinline__ void desc(int, int start, int len, int& d0, int& dn) const {
    d0 = start + len;
    dn = 0;
  }
};

// ---------------------------------------------------------------------------
// fp32, and bf16 widened as it loads.
#define ATT_ARGS const int *cu, int S, int T, int maxlen, int NH, int NKV, int HD, float scale, int *flags
#define ATT_TOPO SeqTopo{cu, S, T, maxlen, flags}
extern "C" __global__ void __launch_bounds__(AT_THREADS)
    attention_fwd(float* out, float* lse, const float* q, const float* k, const float* v, ATT_ARGS) {
  attn_fwd(out, lse, q, k, v, ATT_TOPO, NH, NKV, HD, scale);
}
extern "C" __global__ void __launch_bounds__(AT_THREADS)
    attention_fwd_bf16out(tg_bf16* out, float* lse, const float* q, const float* k, const float* v, ATT_ARGS) {
  attn_fwd(out, lse, q, k, v, ATT_TOPO, NH, NKV, HD, scale);
}
extern "C" __global__ void __launch_bounds__(AT_THREADS)
    attention_fwd_bf16(tg_bf16* out, float* lse, const tg_bf16* q, const tg_bf16* k, const tg_bf16* v, ATT_ARGS) {
  attn_fwd(out, lse, q, k, v, ATT_TOPO, NH, NKV, HD, scale);
}
extern "C" __global__ void __launch_bounds__(AT_THREADS)
    attention_fwd_bf16_f32out(float* out, float* lse, const tg_bf16* q, const tg_bf16* k, const tg_bf16* v,
                              ATT_ARGS) {
  attn_fwd(out, lse, q, k, v, ATT_TOPO, NH, NKV, HD, scale);
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

extern "C" __global__ void __launch_bounds__(AT_THREADS)
    attention_bwd_dq(float* dq, const float* dout, const float* lse, const float* D, const float* q,
                     const float* k, const float* v, ATT_ARGS) {
  attn_bwd_dq(dq, dout, lse, D, q, k, v, ATT_TOPO, NH, NKV, HD, scale);
}
extern "C" __global__ void __launch_bounds__(AT_THREADS)
    attention_bwd_dq_bf16(float* dq, const tg_bf16* dout, const float* lse, const float* D,
                          const tg_bf16* q, const tg_bf16* k, const tg_bf16* v, ATT_ARGS) {
  attn_bwd_dq(dq, dout, lse, D, q, k, v, ATT_TOPO, NH, NKV, HD, scale);
}
extern "C" __global__ void __launch_bounds__(AT_THREADS)
    attention_bwd_dkdv(float* dk, float* dv, const float* dout, const float* lse, const float* D,
                       const float* q, const float* k, const float* v, ATT_ARGS) {
  attn_bwd_dkdv(dk, dv, dout, lse, D, q, k, v, ATT_TOPO, NH, NKV, HD, scale);
}
extern "C" __global__ void __launch_bounds__(AT_THREADS)
    attention_bwd_dkdv_bf16(float* dk, float* dv, const tg_bf16* dout, const float* lse,
                            const float* D, const tg_bf16* q, const tg_bf16* k, const tg_bf16* v,
                            ATT_ARGS) {
  attn_bwd_dkdv(dk, dv, dout, lse, D, q, k, v, ATT_TOPO, NH, NKV, HD, scale);
}

// ---------------------------------------------------------------------------
// Tensor cores: bf16, head dimension 64 or 128.
#define ATT_TC_ARGS const int *cu, int S, int T, int maxlen, int NH, int NKV, float sl2, int *flags
#define ATT_TC_TOPO SeqTopo{cu, S, T, maxlen, flags}
extern "C" __global__ void __launch_bounds__(TC_THREADS, 2)
    attention_fwd_tc_hd64_bf16out(tg_bf16* out, float* lse, const tg_bf16* q, const tg_bf16* k, const tg_bf16* v,
                                  ATT_TC_ARGS) {
  attn_fwd_tc<64, tg_bf16>(out, lse, q, k, v, ATT_TC_TOPO, NH, NKV, sl2);
}
extern "C" __global__ void __launch_bounds__(TC_THREADS, 2)
    attention_fwd_tc_hd64_f32out(float* out, float* lse, const tg_bf16* q, const tg_bf16* k, const tg_bf16* v,
                                 ATT_TC_ARGS) {
  attn_fwd_tc<64, float>(out, lse, q, k, v, ATT_TC_TOPO, NH, NKV, sl2);
}
extern "C" __global__ void __launch_bounds__(TC_THREADS, 2)
    attention_fwd_tc_hd128_bf16out(tg_bf16* out, float* lse, const tg_bf16* q, const tg_bf16* k, const tg_bf16* v,
                                   ATT_TC_ARGS) {
  attn_fwd_tc<128, tg_bf16>(out, lse, q, k, v, ATT_TC_TOPO, NH, NKV, sl2);
}
extern "C" __global__ void __launch_bounds__(TC_THREADS, 2)
    attention_fwd_tc_hd128_f32out(float* out, float* lse, const tg_bf16* q, const tg_bf16* k, const tg_bf16* v,
                                  ATT_TC_ARGS) {
  attn_fwd_tc<128, float>(out, lse, q, k, v, ATT_TC_TOPO, NH, NKV, sl2);
}

// The backward pass without recomputation: the dkdv kernels also write dS
// into the scratch (attn_ds: ds, bt elements a token), which the dq kernels
// multiply by K.
#define ATT_TC_BWD_ARGS \
  const int *cu, int S, int T, int maxlen, int NH, int NKV, float scale, float sl2, int *flags
#define ATT_TC_DS attn_ds{ds, bt, T, maxlen}
extern "C" __global__ void __launch_bounds__(TC_THREADS, 2)
    attention_bwd_dkdv_tc_hd64(float* dk, float* dv, tg_bf16* ds, long long bt, const tg_bf16* dout,
                               const float* lse, const float* D, const tg_bf16* q, const tg_bf16* k,
                               const tg_bf16* v, ATT_TC_BWD_ARGS) {
  attn_bwd_dkdv_tc<64, 64, true>(dk, dv, dout, lse, D, q, k, v, ATT_TC_TOPO, NH, NKV, scale, sl2, ATT_TC_DS);
}
extern "C" __global__ void __launch_bounds__(TC_THREADS, 2)
    attention_bwd_dkdv_tc_hd128(float* dk, float* dv, tg_bf16* ds, long long bt, const tg_bf16* dout,
                                const float* lse, const float* D, const tg_bf16* q, const tg_bf16* k,
                                const tg_bf16* v, ATT_TC_BWD_ARGS) {
  attn_bwd_dkdv_tc<128, 32, true>(dk, dv, dout, lse, D, q, k, v, ATT_TC_TOPO, NH, NKV, scale, sl2, ATT_TC_DS);
}
#define ATT_TC_DQ_ARGS const int *cu, int S, int T, int maxlen, int NH, int NKV, float scale, int *flags
extern "C" __global__ void __launch_bounds__(TC_THREADS, 2)
    attention_bwd_dq_ds_tc_hd64(float* dq, tg_bf16* ds, long long bt, const tg_bf16* k, ATT_TC_DQ_ARGS) {
  attn_bwd_dq_ds_tc<64>(dq, k, ATT_TC_TOPO, NH, NKV, scale, ATT_TC_DS);
}
extern "C" __global__ void __launch_bounds__(TC_THREADS, 2)
    attention_bwd_dq_ds_tc_hd128(float* dq, tg_bf16* ds, long long bt, const tg_bf16* k, ATT_TC_DQ_ARGS) {
  attn_bwd_dq_ds_tc<128>(dq, k, ATT_TC_TOPO, NH, NKV, scale, ATT_TC_DS);
}

// Above the dS scratch's cap (attnDSMaxBytes) the packed backward
// recomputes instead: dq recomputes S and dP (attn_bwd_dq_tc, seven products
// a tile pair with the dkdv kernel's four), and the dkdv kernels store no dS.
extern "C" __global__ void __launch_bounds__(TC_THREADS, 2)
    attention_bwd_dq_tc_hd64(float* dq, const tg_bf16* dout, const float* lse, const float* D, const tg_bf16* q,
                             const tg_bf16* k, const tg_bf16* v, ATT_TC_BWD_ARGS) {
  attn_bwd_dq_tc<64, 64>(dq, dout, lse, D, q, k, v, ATT_TC_TOPO, NH, NKV, scale, sl2);
}
extern "C" __global__ void __launch_bounds__(TC_THREADS, 2)
    attention_bwd_dq_tc_hd128(float* dq, const tg_bf16* dout, const float* lse, const float* D, const tg_bf16* q,
                              const tg_bf16* k, const tg_bf16* v, ATT_TC_BWD_ARGS) {
  attn_bwd_dq_tc<128, 32>(dq, dout, lse, D, q, k, v, ATT_TC_TOPO, NH, NKV, scale, sl2);
}
extern "C" __global__ void __launch_bounds__(TC_THREADS, 2)
    attention_bwd_dkdv_nods_tc_hd64(float* dk, float* dv, const tg_bf16* dout, const float* lse, const float* D,
                                    const tg_bf16* q, const tg_bf16* k, const tg_bf16* v, ATT_TC_BWD_ARGS) {
  attn_bwd_dkdv_tc<64, 64, false>(dk, dv, dout, lse, D, q, k, v, ATT_TC_TOPO, NH, NKV, scale, sl2, attn_ds{});
}
extern "C" __global__ void __launch_bounds__(TC_THREADS, 2)
    attention_bwd_dkdv_nods_tc_hd128(float* dk, float* dv, const tg_bf16* dout, const float* lse, const float* D,
                                     const tg_bf16* q, const tg_bf16* k, const tg_bf16* v, ATT_TC_BWD_ARGS) {
  attn_bwd_dkdv_tc<128, 32, false>(dk, dv, dout, lse, D, q, k, v, ATT_TC_TOPO, NH, NKV, scale, sl2, attn_ds{});
}
