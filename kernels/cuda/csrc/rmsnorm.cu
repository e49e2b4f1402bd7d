// rmsnorm.cu: RMSNorm over rows (also Qwen3's per-head q/k norm, N = T·NH, C = HD).
//
//   rmsnorm_fwd{,_bf16}:  out (N,C) = inp·r·weight (C),  rstd (N) = r = 1/sqrt(mean(inp²) + eps)   (=)
//                 out fp32, or rounded to bf16 (the next GEMM's input: the
//                 cast fused into the norm); vec = 1 takes 16-byte accesses
//                 (C % 8 == 0, aligned rows; the launcher decides)
//   rmsnorm_bwd*: dinp (N,C) += r·dout·w − r³·inp/C · Σ_c dout·w·inp                      (+=)
//                 partial (G,C) = each block's Σ_rows dout·inp·r                          (=)
//   rmsnorm_dw_reduce: dweight (C) += Σ_g partial (G,C)                                   (+=)
//
// The forward pass: one block per row (grid-stride over rows), blockDim a
// multiple of 32. The backward pass: below.
#include "common.cuh"
#include "rmsnorm.cuh"

template <class TO>
__device__ __forceinline__ void rmsnorm_rows(TO* out, float* rstd, const float* inp, const float* weight,
                                             int N, int C, float eps, int vec) {
  __shared__ float scratch[32];
  for (int row = blockIdx.x; row < N; row += gridDim.x) {
    const float r = rms_row(out + (long long)row * C, inp + (long long)row * C, weight, C, eps, vec != 0, scratch);
    if (threadIdx.x == 0) rstd[row] = r;
  }
}

extern "C" __global__ void rmsnorm_fwd(float* out, float* rstd, const float* inp, const float* weight,
                                       int N, int C, float eps, int vec) {
  rmsnorm_rows(out, rstd, inp, weight, N, C, eps, vec);
}

extern "C" __global__ void rmsnorm_fwd_bf16(tg_bf16* out, float* rstd, const float* inp,
                                            const float* weight, int N, int C, float eps, int vec) {
  rmsnorm_rows(out, rstd, inp, weight, N, C, eps, vec);
}


// ---------------------------------------------------------------------------
// The backward pass.
//
// rmsnorm_bwd_gT: groups of T threads (T a power of two, 8..256) each own a
// row at a time; thread i of a group holds columns 8(i + T·j) .. +7 for
// j < NCH, so a block of 256 threads works on 256/T rows at once: Qwen3's
// per-head norms (C = 128) on 16 rows a block, the model width (C = 2048)
// on one. Loads and stores are 16 bytes (vec) or scalar (C % 8 != 0, or an
// unaligned view), the row's dot product is summed by shuffles within the
// group (and through shared memory across its warps for T > 32). Block b
// of G works on rows [b·R, (b+1)·R); each thread sums its columns' dweight
// contributions over its rows in row order, the block then adds its groups'
// sums in group order into its row of partial (G, C), and rmsnorm_dw_reduce
// adds the G rows in block order. G and R depend on N and C only (the Go
// side, normBwdGrid), so the reduction order, and with it the bits of
// dweight, are the same on every run and every GPU. No atomics.
//
// rmsnorm_bwd: the general kernel (one block per row, any C), the same
// partial rows.
#define NB_THREADS 256

// The sum of v over each aligned group of T lanes of a warp (T ≤ 32).
template <int T>
__device__ __forceinline__ float group_sum(float v) {
#pragma unroll
  for (int o = T / 2; o > 0; o >>= 1) v += __shfl_xor_sync(TG_FULL, v, o);
  return v;
}

// Columns c..c+7 of a row (c % 8 == 0), as floats: 16-byte loads (vec),
// else scalar ones of the columns below C (the rest read as 0).
__device__ __forceinline__ void nb_load(const float* row, int c, int C, bool vec, float r[8]) {
  if (vec) {
    if (c < C) {
      ld8(row + c, r);
    } else {
#pragma unroll
      for (int e = 0; e < 8; e++) r[e] = 0.f;
    }
    return;
  }
#pragma unroll
  for (int e = 0; e < 8; e++) r[e] = c + e < C ? row[c + e] : 0.f;
}
__device__ __forceinline__ void nb_store(float* row, int c, int C, bool vec, const float r[8]) {
  if (vec) {
    if (c < C) st8(row + c, r);
    return;
  }
#pragma unroll
  for (int e = 0; e < 8; e++)
    if (c + e < C) row[c + e] = r[e];
}

template <int T, int NCH>
__device__ __forceinline__ void rmsnorm_bwd_groups(float* dinp, float* partial, const float* dout,
                                                   const float* inp, const float* weight,
                                                   const float* rstd, int N, int C, int R, int vec) {
  constexpr int GROUPS = NB_THREADS / T, W = 8 * T * NCH;  // W: the columns a group covers
  __shared__ float red[NB_THREADS / 32];                  // the group's warps' dots (T > 32)
  __shared__ float dws[GROUPS * W];                       // each group's dweight sums
  const int grp = threadIdx.x / T, li = threadIdx.x % T;
  const bool v = vec != 0;
  float w[NCH][8], dw[NCH][8];
#pragma unroll
  for (int j = 0; j < NCH; j++) {
    nb_load(weight, 8 * (li + T * j), C, v, w[j]);
#pragma unroll
    for (int e = 0; e < 8; e++) dw[j][e] = 0.f;
  }
  const int r0 = blockIdx.x * R, r1 = min(N, r0 + R);
  // Every thread runs every round (a row past r1 does nothing but the
  // barriers), so the block's barriers are uniform.
  for (int base = r0; base < r1; base += GROUPS) {
    const int row = base + grp;
    const bool live = row < r1;
    const long long off = (long long)(live ? row : r0) * C;
    float g[NCH][8], x[NCH][8];
    float dot = 0.f;
#pragma unroll
    for (int j = 0; j < NCH; j++) {
      const int c = 8 * (li + T * j);
      nb_load(dout + off, c, C, v, g[j]);
      nb_load(inp + off, c, C, v, x[j]);
#pragma unroll
      for (int e = 0; e < 8; e++) dot += g[j][e] * w[j][e] * x[j][e];
    }
    const float r = live ? rstd[row] : 0.f;
    if (T <= 32) {
      dot = group_sum<(T < 32 ? T : 32)>(dot);
    } else {
      dot = warp_sum(dot);
      __syncthreads();  // the previous round's readers of red are done
      if ((threadIdx.x & 31) == 0) red[threadIdx.x >> 5] = dot;
      __syncthreads();
      dot = 0.f;
#pragma unroll
      for (int i = 0; i < T / 32; i++) dot += red[grp * (T / 32) + i];
    }
    if (!live) continue;
    const float k = r * r * r * dot / (float)C;
#pragma unroll
    for (int j = 0; j < NCH; j++) {
      const int c = 8 * (li + T * j);
      float dx[8];
      nb_load(dinp + off, c, C, v, dx);
#pragma unroll
      for (int e = 0; e < 8; e++) {
        dx[e] += r * g[j][e] * w[j][e] - k * x[j][e];
        dw[j][e] += g[j][e] * x[j][e] * r;
      }
      nb_store(dinp + off, c, C, v, dx);
    }
  }
  // The block's partial row: its groups' sums added in group order.
#pragma unroll
  for (int j = 0; j < NCH; j++)
#pragma unroll
    for (int e = 0; e < 8; e++) dws[grp * W + 8 * (li + T * j) + e] = dw[j][e];
  __syncthreads();
  for (int c = threadIdx.x; c < C && c < W; c += NB_THREADS) {
    float s = 0.f;
    for (int gi = 0; gi < GROUPS; gi++) s += dws[gi * W + c];
    partial[(long long)blockIdx.x * C + c] = s;
  }
}

extern "C" __global__ void __launch_bounds__(NB_THREADS)
    rmsnorm_bwd_g8_c1(float* dinp, float* partial, const float* dout, const float* inp, const float* weight,
                            const float* rstd, int N, int C, int R, int vec) {
  rmsnorm_bwd_groups<8, 1>(dinp, partial, dout, inp, weight, rstd, N, C, R, vec);
}
extern "C" __global__ void __launch_bounds__(NB_THREADS)
    rmsnorm_bwd_g16_c1(float* dinp, float* partial, const float* dout, const float* inp, const float* weight,
                            const float* rstd, int N, int C, int R, int vec) {
  rmsnorm_bwd_groups<16, 1>(dinp, partial, dout, inp, weight, rstd, N, C, R, vec);
}
extern "C" __global__ void __launch_bounds__(NB_THREADS)
    rmsnorm_bwd_g32_c1(float* dinp, float* partial, const float* dout, const float* inp, const float* weight,
                            const float* rstd, int N, int C, int R, int vec) {
  rmsnorm_bwd_groups<32, 1>(dinp, partial, dout, inp, weight, rstd, N, C, R, vec);
}
extern "C" __global__ void __launch_bounds__(NB_THREADS)
    rmsnorm_bwd_g64_c1(float* dinp, float* partial, const float* dout, const float* inp, const float* weight,
                            const float* rstd, int N, int C, int R, int vec) {
  rmsnorm_bwd_groups<64, 1>(dinp, partial, dout, inp, weight, rstd, N, C, R, vec);
}
extern "C" __global__ void __launch_bounds__(NB_THREADS)
    rmsnorm_bwd_g128_c1(float* dinp, float* partial, const float* dout, const float* inp, const float* weight,
                            const float* rstd, int N, int C, int R, int vec) {
  rmsnorm_bwd_groups<128, 1>(dinp, partial, dout, inp, weight, rstd, N, C, R, vec);
}
extern "C" __global__ void __launch_bounds__(NB_THREADS)
    rmsnorm_bwd_g256_c1(float* dinp, float* partial, const float* dout, const float* inp, const float* weight,
                            const float* rstd, int N, int C, int R, int vec) {
  rmsnorm_bwd_groups<256, 1>(dinp, partial, dout, inp, weight, rstd, N, C, R, vec);
}
extern "C" __global__ void __launch_bounds__(NB_THREADS)
    rmsnorm_bwd_g256_c2(float* dinp, float* partial, const float* dout, const float* inp, const float* weight,
                            const float* rstd, int N, int C, int R, int vec) {
  rmsnorm_bwd_groups<256, 2>(dinp, partial, dout, inp, weight, rstd, N, C, R, vec);
}
extern "C" __global__ void __launch_bounds__(NB_THREADS)
    rmsnorm_bwd_g256_c4(float* dinp, float* partial, const float* dout, const float* inp, const float* weight,
                            const float* rstd, int N, int C, int R, int vec) {
  rmsnorm_bwd_groups<256, 4>(dinp, partial, dout, inp, weight, rstd, N, C, R, vec);
}

// Any C: one block per row of block R (rows [b·R, (b+1)·R) of block b),
// its threads striding over the columns.
extern "C" __global__ void rmsnorm_bwd(float* dinp, float* partial, const float* dout, const float* inp,
                                       const float* weight, const float* rstd, int N, int C, int R) {
  __shared__ float scratch[32];
  float* dw = partial + (long long)blockIdx.x * C;  // (C): this block's row of partial
  for (int c = threadIdx.x; c < C; c += blockDim.x) dw[c] = 0.f;
  const int r1 = min(N, (blockIdx.x + 1) * R);
  for (int row = blockIdx.x * R; row < r1; row++) {
    const float* x = inp + (long long)row * C;
    const float* g = dout + (long long)row * C;
    float r = rstd[row];
    float dot = 0.f;
    for (int c = threadIdx.x; c < C; c += blockDim.x) dot += g[c] * weight[c] * x[c];
    dot = block_sum(dot, scratch);
    float k = r * r * r * dot / (float)C;
    float* dx = dinp + (long long)row * C;
    for (int c = threadIdx.x; c < C; c += blockDim.x) {
      dx[c] += r * g[c] * weight[c] - k * x[c];
      dw[c] += g[c] * x[c] * r;  // column c belongs to this thread alone
    }
  }
}

// dweight (C) += Σ_g partial[g][c], g = 0..G−1: a block of 8 warps per 32
// columns, warp w summing the rows g ≡ w (mod 8) in order, then the 8 warp
// sums added in warp order (a fixed order: deterministic).
extern "C" __global__ void __launch_bounds__(NB_THREADS) rmsnorm_dw_reduce(float* dweight, const float* partial,
                                                                         int G, int C) {
  __shared__ float ws[8][32];
  const int lane = threadIdx.x & 31, warp = threadIdx.x >> 5, c = blockIdx.x * 32 + lane;
  float s = 0.f;
  if (c < C)
    for (int g = warp; g < G; g += 8) s += partial[(long long)g * C + c];
  ws[warp][lane] = s;
  __syncthreads();
  if (warp == 0 && c < C) {
    float t = 0.f;
#pragma unroll
    for (int w = 0; w < 8; w++) t += ws[w][lane];
    dweight[c] += t;
  }
}
