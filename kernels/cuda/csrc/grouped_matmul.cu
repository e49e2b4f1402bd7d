// grouped_matmul.cu: every expert's Linear over its own rows
// (kernels.Experts), and the two backward halves.
//
//   grouped_fwd*:  out[lo:hi] (n,OC)   =  inp[lo:hi] (n,C) · W[e] (OC,C)ᵀ        (=)
//   grouped_dinp*: dinp[lo:hi] (n,C)   += dout[lo:hi] (n,OC) · W[e] (OC,C)       (+=)
//   grouped_dw*:   dW[e] (OC,C)        += dout[lo:hi]ᵀ · inp[lo:hi]              (+=)
//
// for each expert e with rows [lo, hi) = [offsets[e], offsets[e+1]) of the
// permuted (N, ·) buffers (offsets on the device, as ExpertRoute writes
// them: no host round trip). An expert without rows costs nothing and its
// dW is not touched.
//
// One tile shape for all three: a block of 128 threads computes a 64×64
// tile of its expert's output, C_tile = Σ_k A(m,k)·B(n,k) over k in steps
// of 32, through shared memory (As (64, 32+pad), Bs (64, 32+pad), k
// innermost; the loads read whichever operand layout the product needs).
// The fp32 kernels multiply with FMAs (each thread 4×8 outputs); the bf16
// kernels on tensor cores (mma.sync m16n8k16, fp32 accumulation; each warp
// a 32×32 quarter as 2×4 mma tiles; fragments read from shared memory in
// the PTX ISA's layouts, csrc/mma.cuh). Each output element is produced by
// one thread, summing k in order: deterministic, no atomics.
//
// Tiles: fwd and dinp cover each expert's rows with ceil(n/64) row tiles;
// their grid has ceil(N/64) + E row-tile slots (Σ_e ceil(n_e/64) ≤ that) ×
// ceil(width/64), and a block finds its expert from the offsets (slots
// past the last tile return at once). dw's grid is (ceil(OC/64)·ceil(C/64),
// E): block (tile, e) sums over its expert's rows.
#include "bf16.cuh"
#include "common.cuh"
#include "mma.cuh"

#define GG_BM 64
#define GG_BN 64
#define GG_BK 32
#define GG_THREADS 128

// Expert e's rows [lo, hi) from offsets, clamped to [0, N] (a routing
// already flagged by expert_route stays in bounds).
__device__ __forceinline__ void gg_range(const int* offsets, int e, int N, int* lo, int* hi) {
  int a = offsets[e], b = offsets[e + 1];
  a = max(0, min(a, N));
  b = max(a, min(b, N));
  *lo = a, *hi = b;
}

// Finds the expert and row tile of row-tile slot `slot`: returns false when
// the slot is past the last tile.
__device__ __forceinline__ bool gg_row_tile(const int* offsets, int E, int N, int slot, int* e_out, int* lo_out,
                                            int* n_out) {
  __shared__ int info[3];
  if (threadIdx.x == 0) {
    info[0] = -1;
    int seen = 0;
    for (int e = 0; e < E; e++) {
      int lo, hi;
      gg_range(offsets, e, N, &lo, &hi);
      const int tiles = (hi - lo + GG_BM - 1) / GG_BM;
      if (slot < seen + tiles) {
        const int m0 = lo + (slot - seen) * GG_BM;
        info[0] = e, info[1] = m0, info[2] = min(GG_BM, hi - m0);
        break;
      }
      seen += tiles;
    }
  }
  __syncthreads();
  *e_out = info[0], *lo_out = info[1], *n_out = info[2];
  return info[0] >= 0;
}

// An operand: element (r, k) at base[r·sr + k·sk], r < R, k < K (zero
// outside). The offsets stay below 2^31 (kernels/cuda/grouped_matmul.go
// checks N·C and N·OC): 32-bit index arithmetic keeps the tile loops'
// registers down.
template <class T>
struct GGOp {
  const T* base;
  int sr, sk;
  int R, K;
};

template <class T>
__device__ __forceinline__ float gg_ld(const GGOp<T>& o, int r, int k) {
  return (r < o.R && k < o.K) ? ld_f(o.base, r * o.sr + k * o.sk) : 0.f;
}

// Loads the (64, 32) tile at (r0, k0) of o into S (64 rows of P elements),
// the threads walking whichever index is contiguous in memory.
template <class T, class TS, int P>
__device__ __forceinline__ void gg_load(TS* S, const GGOp<T>& o, int r0, int k0) {
  if (o.sk == 1) {
    for (int i = threadIdx.x; i < GG_BM * GG_BK; i += GG_THREADS) {
      const int r = i / GG_BK, k = i % GG_BK;
      st_f(S, r * P + k, gg_ld(o, r0 + r, k0 + k));
    }
  } else {
    for (int i = threadIdx.x; i < GG_BM * GG_BK; i += GG_THREADS) {
      const int r = i % GG_BM, k = i / GG_BM;
      st_f(S, r * P + k, gg_ld(o, r0 + r, k0 + k));
    }
  }
}

// The output tile: element (m, n) at base[m·sm + n], m < M, n < N.
template <class TO>
struct GGOut {
  TO* base;
  long long sm;
  int M, N;
  bool acc;  // += (fp32 outputs only) rather than =
};

template <class TO>
__device__ __forceinline__ void gg_store(const GGOut<TO>& o, int m, int n, float v) {
  if (m < o.M && n < o.N) {
    const long long i = (long long)m * o.sm + n;
    if (o.acc) v += ld_f(o.base, i);
    st_f(o.base, i, v);
  }
}

#define GG_PF (GG_BK + 1)  // fp32 tile row: padded against bank conflicts
#define GG_PH (GG_BK + 8)  // bf16 tile row: 80 bytes, 4-byte aligned pairs

// C_tile (64×64 at m0, n0) = Σ_k A(m0+m, k)·B(n0+n, k), fp32 FMAs.
template <class TO>
__device__ __forceinline__ void gg_tile(const GGOp<float>& A, const GGOp<float>& B, const GGOut<TO>& out, int m0,
                                            int n0) {
  __shared__ float As[GG_BM * GG_PF], Bs[GG_BN * GG_PF];
  const int tx = threadIdx.x % 8, ty = threadIdx.x / 8;  // rows ty + 16·i, cols tx + 8·j
  float acc[4][8];
#pragma unroll
  for (int i = 0; i < 4; i++)
#pragma unroll
    for (int j = 0; j < 8; j++) acc[i][j] = 0.f;
  for (int k0 = 0; k0 < A.K; k0 += GG_BK) {
    __syncthreads();  // the previous step's reads are done
    gg_load<float, float, GG_PF>(As, A, m0, k0);
    gg_load<float, float, GG_PF>(Bs, B, n0, k0);
    __syncthreads();
#pragma unroll 4
    for (int k = 0; k < GG_BK; k++) {
      float a[4], b[8];
#pragma unroll
      for (int i = 0; i < 4; i++) a[i] = As[(ty + 16 * i) * GG_PF + k];
#pragma unroll
      for (int j = 0; j < 8; j++) b[j] = Bs[(tx + 8 * j) * GG_PF + k];
#pragma unroll
      for (int i = 0; i < 4; i++)
#pragma unroll
        for (int j = 0; j < 8; j++) acc[i][j] += a[i] * b[j];
    }
  }
#pragma unroll
  for (int i = 0; i < 4; i++)
#pragma unroll
    for (int j = 0; j < 8; j++) gg_store(out, m0 + ty + 16 * i, n0 + tx + 8 * j, acc[i][j]);
}

// The same tile from bf16 operands on tensor cores: warp w owns rows
// 32·(w/2).., columns 32·(w%2).. as 2 (m16) × 4 (n8) mma tiles.
template <class TO>
__device__ __forceinline__ void gg_tile(const GGOp<tg_bf16>& A, const GGOp<tg_bf16>& B, const GGOut<TO>& out,
                                             int m0, int n0) {
  __shared__ __align__(16) tg_bf16 As[GG_BM * GG_PH], Bs[GG_BN * GG_PH];
  const int lane = threadIdx.x & 31, warp = threadIdx.x >> 5;
  const int wm = (warp >> 1) * 32, wn = (warp & 1) * 32;
  const int g = lane >> 2, t = lane & 3;
  float acc[2][4][4];
#pragma unroll
  for (int i = 0; i < 2; i++)
#pragma unroll
    for (int j = 0; j < 4; j++)
#pragma unroll
      for (int r = 0; r < 4; r++) acc[i][j][r] = 0.f;
  for (int k0 = 0; k0 < A.K; k0 += GG_BK) {
    __syncthreads();
    gg_load<tg_bf16, tg_bf16, GG_PH>(As, A, m0, k0);
    gg_load<tg_bf16, tg_bf16, GG_PH>(Bs, B, n0, k0);
    __syncthreads();
#pragma unroll
    for (int kk = 0; kk < GG_BK; kk += 16) {
      unsigned a[2][4], b[4][2];
#pragma unroll
      for (int i = 0; i < 2; i++) {
        const tg_bf16* r0 = As + (wm + 16 * i + g) * GG_PH + kk + 2 * t;
        const tg_bf16* r8 = r0 + 8 * GG_PH;
        a[i][0] = *(const unsigned*)r0;
        a[i][1] = *(const unsigned*)r8;
        a[i][2] = *(const unsigned*)(r0 + 8);
        a[i][3] = *(const unsigned*)(r8 + 8);
      }
#pragma unroll
      for (int j = 0; j < 4; j++) {
        const tg_bf16* c0 = Bs + (wn + 8 * j + g) * GG_PH + kk + 2 * t;
        b[j][0] = *(const unsigned*)c0;
        b[j][1] = *(const unsigned*)(c0 + 8);
      }
#pragma unroll
      for (int i = 0; i < 2; i++)
#pragma unroll
        for (int j = 0; j < 4; j++) mma_bf16_16816(acc[i][j], a[i], b[j]);
    }
  }
#pragma unroll
  for (int i = 0; i < 2; i++)
#pragma unroll
    for (int j = 0; j < 4; j++) {
      const int m = m0 + wm + 16 * i + g, n = n0 + wn + 8 * j + 2 * t;
      gg_store(out, m, n, acc[i][j][0]);
      gg_store(out, m, n + 1, acc[i][j][1]);
      gg_store(out, m + 8, n, acc[i][j][2]);
      gg_store(out, m + 8, n + 1, acc[i][j][3]);
    }
}

// out (N,OC) = inp (N,C) · W[e]ᵀ, row tiles by expert.
template <class T, class TO>
__device__ __forceinline__ void gg_fwd(TO* out, const T* inp, const T* W, const int* offsets, int N, int C, int OC,
                                       int E) {
  int e, lo, n;
  if (!gg_row_tile(offsets, E, N, blockIdx.x, &e, &lo, &n)) return;
  const int n0 = blockIdx.y * GG_BN;
  const GGOp<T> A = {inp + (long long)lo * C, C, 1, n, C};
  const GGOp<T> B = {W + (long long)e * OC * C, C, 1, OC, C};
  const GGOut<TO> o = {out + (long long)lo * OC, OC, n, OC, false};
  gg_tile(A, B, o, 0, n0);
}

// dinp (N,C) += dout (N,OC) · W[e], row tiles by expert.
template <class T>
__device__ __forceinline__ void gg_dinp(float* dinp, const T* dout, const T* W, const int* offsets, int N, int C,
                                        int OC, int E) {
  int e, lo, n;
  if (!gg_row_tile(offsets, E, N, blockIdx.x, &e, &lo, &n)) return;
  const int n0 = blockIdx.y * GG_BN;
  const GGOp<T> A = {dout + (long long)lo * OC, OC, 1, n, OC};
  const GGOp<T> B = {W + (long long)e * OC * C, 1, C, C, OC};  // B(n, k) = W[e][k][n]
  const GGOut<float> o = {dinp + (long long)lo * C, C, n, C, true};
  gg_tile(A, B, o, 0, n0);
}

// dW[e] (OC,C) += Σ over e's rows of dout[r]ᵀ · inp[r].
template <class T>
__device__ __forceinline__ void gg_dw(float* dW, const T* dout, const T* inp, const int* offsets, int N, int C,
                                      int OC) {
  const int e = blockIdx.y;
  int lo, hi;
  gg_range(offsets, e, N, &lo, &hi);
  if (hi == lo) return;  // an empty expert: dW[e] untouched
  const int ntn = (C + GG_BN - 1) / GG_BN;
  const int m0 = (blockIdx.x / ntn) * GG_BM, n0 = (blockIdx.x % ntn) * GG_BN;
  const GGOp<T> A = {dout + (long long)lo * OC, 1, OC, OC, hi - lo};  // A(m, k) = dout[lo+k][m]
  const GGOp<T> B = {inp + (long long)lo * C, 1, C, C, hi - lo};      // B(n, k) = inp[lo+k][n]
  const GGOut<float> o = {dW + (long long)e * OC * C, C, OC, C, true};
  gg_tile(A, B, o, m0, n0);
}

extern "C" __global__ void __launch_bounds__(GG_THREADS) grouped_fwd(float* out, const float* inp, const float* W, const int* offsets, int N, int C, int OC, int E) {
  gg_fwd<float, float>(out, inp, W, offsets, N, C, OC, E);
}
extern "C" __global__ void __launch_bounds__(GG_THREADS) grouped_fwd_f32_bf16out(tg_bf16* out, const float* inp, const float* W, const int* offsets, int N, int C,
                                  int OC, int E) {
  gg_fwd<float, tg_bf16>(out, inp, W, offsets, N, C, OC, E);
}
extern "C" __global__ void __launch_bounds__(GG_THREADS) grouped_fwd_bf16_f32out(float* out, const tg_bf16* inp, const tg_bf16* W, const int* offsets, int N, int C,
                                  int OC, int E) {
  gg_fwd<tg_bf16, float>(out, inp, W, offsets, N, C, OC, E);
}
extern "C" __global__ void __launch_bounds__(GG_THREADS) grouped_fwd_bf16(tg_bf16* out, const tg_bf16* inp, const tg_bf16* W, const int* offsets, int N, int C,
                           int OC, int E) {
  gg_fwd<tg_bf16, tg_bf16>(out, inp, W, offsets, N, C, OC, E);
}
extern "C" __global__ void __launch_bounds__(GG_THREADS) grouped_dinp(float* dinp, const float* dout, const float* W, const int* offsets, int N, int C, int OC,
                       int E) {
  gg_dinp<float>(dinp, dout, W, offsets, N, C, OC, E);
}
extern "C" __global__ void __launch_bounds__(GG_THREADS) grouped_dinp_bf16(float* dinp, const tg_bf16* dout, const tg_bf16* W, const int* offsets, int N, int C,
                            int OC, int E) {
  gg_dinp<tg_bf16>(dinp, dout, W, offsets, N, C, OC, E);
}
extern "C" __global__ void __launch_bounds__(GG_THREADS) grouped_dw(float* dW, const float* dout, const float* inp, const int* offsets, int N, int C, int OC) {
  gg_dw<float>(dW, dout, inp, offsets, N, C, OC);
}
extern "C" __global__ void __launch_bounds__(GG_THREADS) grouped_dw_bf16(float* dW, const tg_bf16* dout, const tg_bf16* inp, const int* offsets, int N, int C,
                          int OC) {
  gg_dw<tg_bf16>(dW, dout, inp, offsets, N, C, OC);
}
