// attention_tc.cuh: the tiles of the tensor-core attention kernels
// (attention.cu, tree_attention.cu), bf16 on mma.sync m16n8k16.
//
// Every tile is a (rows, HD) bf16 block of one head staged in shared memory
// with rows HD+8 elements apart (16 bytes of padding make the 8 row
// addresses of an ldmatrix hit different banks), loaded by cp.async in
// 16-byte chunks; chunk c of a tile is row c / (HD/8), column (c % (HD/8))·8
// with HD/8 a compile-time power of two (a shift and a mask, no division).
// Rows past the sequence are zero-filled.
#pragma once
#include "mma.cuh"

#define TC_THREADS 128
#define TC_ROWS 64  // query rows of a forward/dq block, key rows of a dkdv block
#define TC_LOG2E 1.4426950408889634f
#define TC_LN2 0.6931471805599453f

// Rows [0, ROWS) of a tile starting at packed row row0 of a (T, H, HD)
// tensor's head h into dst (ROWS, HD+8); rows >= rmax are zero-filled.
// Every thread of the block calls it; the caller commits the group.
template <int ROWS, int HD>
__device__ __forceinline__ void tc_load(tg_bf16* dst, const tg_bf16* src, long long row0, int rmax,
                                        int H, int h) {
  constexpr unsigned CPR = HD / 8, LD = HD + 8;
  static_assert(ROWS * CPR % TC_THREADS == 0, "whole chunks per thread");
#pragma unroll
  for (unsigned i = 0; i < ROWS * CPR / TC_THREADS; i++) {
    const unsigned c = threadIdx.x + i * TC_THREADS;
    const unsigned r = c / CPR, col = (c % CPR) * 8;  // CPR is a power of two
    const bool ok = (int)r < rmax;
    const tg_bf16* s = src + ((row0 + (ok ? r : 0)) * H + h) * HD + col;
    cp_async16(dst + r * LD + col, s, ok ? 16 : 0);
  }
}

// The 4 A fragments (16 rows × 16 columns at column k) of rows r0.. of a
// (rows, HD+8) tile.
template <int HD>
__device__ __forceinline__ void tc_frag_a(unsigned a[4], const tg_bf16* tile, int r0, int k, int lane) {
  ldmatrix_x4(a, tile + (r0 + (lane & 15)) * (HD + 8) + k + 8 * (lane >> 4));
}
// B fragments of two n-tiles (rows n0..n0+15 of the tile are the n index,
// columns k..k+15 the k index): b[0..1] for n0..n0+7, b[2..3] for n0+8...
template <int HD>
__device__ __forceinline__ void tc_frag_b(unsigned b[4], const tg_bf16* tile, int n0, int k, int lane) {
  ldmatrix_x4(b, tile + (n0 + (lane & 7) + 8 * (lane >> 4)) * (HD + 8) + k + 8 * ((lane >> 3) & 1));
}
// B fragments of two n-tiles when the tile's rows are the k index (rows
// k0..k0+15) and its columns the n index (columns n0..n0+15): ldmatrix.trans.
template <int HD>
__device__ __forceinline__ void tc_frag_bt(unsigned b[4], const tg_bf16* tile, int k0, int n0, int lane) {
  ldmatrix_x4_trans(b, tile + (k0 + (lane & 7) + 8 * ((lane >> 3) & 1)) * (HD + 8) + n0 + 8 * (lane >> 4));
}
// A fragment of k-step kk from accumulator tiles 2kk and 2kk+1, as bf16.
__device__ __forceinline__ void tc_pack_a(unsigned a[4], const float c0[4], const float c1[4]) {
  a[0] = pack_bf16x2(c0[0], c0[1]);
  a[1] = pack_bf16x2(c0[2], c0[3]);
  a[2] = pack_bf16x2(c1[0], c1[1]);
  a[3] = pack_bf16x2(c1[2], c1[3]);
}

// The lse and D of a query tile's rows into shared memory (ordinary loads
// and stores; visible after the next __syncthreads).
template <int NQ>
__device__ __forceinline__ void tc_load_stats(float* Ls, float* Ds, const float* lse, const float* D,
                                              long long row0, int rmax, int NH, int h) {
  for (int r = threadIdx.x; r < NQ; r += TC_THREADS) {
    const long long row = (row0 + r) * NH + h;
    Ls[r] = r < rmax ? lse[row] * TC_LOG2E : 0.f;
    Ds[r] = r < rmax ? D[row] : 0.f;
  }
}
