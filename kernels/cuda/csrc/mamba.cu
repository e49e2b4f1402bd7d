// mamba.cu: Nemotron-H's ops (kernels.Mamba): the causal depthwise conv of
// the Mamba-2 mixer, the selective scan, the gated RMSNorm and squared ReLU,
// over packed trees (kernels.Tree; packed sequences are a forest of roots).
//
//   mamba_tree_anc:    anc (NS) = the tokens of each segment's ancestors (one thread, preorder)  (=)
//   conv1d_fwd*:       out (T,CD) = silu(bias + Σ_k w[c,k]·inp[prev^(KW−1−k)(t), c])          (=)
//   conv1d_bwd_dinp:   dinp (T,CD) = Σ over the tokens that read each row of w·g,
//                      g = dout·silu'(pre)                                                   (=)
//   conv1d_bwd_dw:     partials (chunks, CD·KW) and (chunks, CD) of Σ_t g·inp[tap], Σ_t g
//                      over chunks of MB_ROWS tokens (bias.cu's bias_backward_reduce adds
//                      them to dweight and dbias in chunk order)                             (=)
//   conv1d_decode*:    one token per sequence against its window of KW−1 rows; the window
//                      shifts                                                                (=)
//   gated_rmsnorm_fwd*: u = y·silu(z), rstd (N,D/GS), out (N,D) = w ⊙ u·rstd                 (=)
//   gated_rmsnorm_bwd:  dy (N,D), dz (N,D)                                                   (=)
//   gated_rmsnorm_dw:   partials (chunks, D) of Σ_rows dout ⊙ u·rstd (reduced as above)      (=)
//   relu2_fwd*:        out = relu(inp)²; relu2_bwd*: dinp = 2·relu(inp)·dout                  (=)
//   ssm_scan_fwd*:     the selective scan, sequentially over each segment's tokens, one
//                      block per head: y (T,MH,MP), each segment's final state (NS,MH,MP,DS)
//                      and, for the backward, the state at every MB_Q-th token of a
//                      segment (checkpoints)                                                  (=)
//   ssm_scan_bwd*:     the reverse recurrence, one block per head, segments in reverse
//                      preorder: a chunk of MB_Q tokens' states recomputed from its
//                      checkpoint into per-head scratch, then walked backwards; dx, ddtRaw
//                      and the head's ddtBias, daLog, dd; dB and dC per head into
//                      (T,MH,2,DS) scratch                                                   (=, +=)
//   ssm_bc_reduce:     dxbc's B and C columns = the sum of the group's heads' dB, dC in head
//                      order                                                                 (=)
//   ssm_decode*:       one token per sequence: the state in place, y                         (=)
//
// Sums run in orders fixed by the shapes and the tree, with no atomics: the
// same bits on every run. The scan keeps its state in fp32 (shared memory in
// the forward, registers in the backward: at most MB_EPT elements a thread
// of MP·DS); a tree's child starts from its parent's final state and its conv
// window from its parent's last rows; in the backward a parent's final state
// receives the sum of its children's initial-state gradients in child
// order, and a row near a segment's end the gradients of every descendant
// token that reads it, in preorder.
#include "bf16.cuh"
#include "common.cuh"

#define MB_THREADS 256
#define MB_ROWS 256   // tokens (rows) per partial sum of the weight gradients
#define MB_MAXKW 8    // the conv's window
#define MB_Q 64       // tokens between the backward's checkpoints
#define MB_EPT 32     // state elements per thread in the backward: MP·DS ≤ 256·32
#define MB_MAXMP 256  // a head's dimension

// The segment holding token t: the largest s with offs[s] ≤ t.
__device__ __forceinline__ int mb_seg_of(const int* offs, int NS, int t) {
  int lo = 0, hi = NS - 1;
  while (lo < hi) {
    const int mid = (lo + hi + 1) >> 1;
    if (offs[mid] <= t) lo = mid;
    else hi = mid - 1;
  }
  return lo;
}

// The token before t (in segment *seg) in its context: t−1 inside the
// segment, the parent's last token at its first (*seg becomes the parent),
// −1 at a root's first (or a parent that breaks the tree's rules).
__device__ __forceinline__ int mb_prev(const int* offs, const int* parent, int t, int* seg) {
  if (t > offs[*seg]) return t - 1;
  const int p = parent[*seg];
  if (p < 0 || p >= *seg) return -1;
  *seg = p;
  return offs[p + 1] - 1;
}

// The rows token t reads: idx[k] = prev^(KW−1−k)(t), −1 where none.
__device__ __forceinline__ void mb_taps(int* idx, const int* offs, const int* parent, int NS, int t, int KW) {
  int seg = mb_seg_of(offs, NS, t), r = t;
  for (int k = KW - 1; k >= 0; k--) {
    idx[k] = r;
    if (r >= 0) r = mb_prev(offs, parent, r, &seg);
  }
}

__device__ __forceinline__ float mb_sigmoid(float u) { return 1.f / (1.f + expf(-u)); }

extern "C" __global__ void mamba_tree_anc(int* anc, const int* offs, const int* parent, int NS) {
  if (blockIdx.x != 0 || threadIdx.x != 0) return;
  for (int s = 0; s < NS; s++) {
    const int p = parent[s];
    anc[s] = (p >= 0 && p < s) ? anc[p] + offs[p + 1] - offs[p] : 0;
  }
}

// The conv's pre-activation at (t, c) with its taps idx.
__device__ __forceinline__ float conv_pre(const float* inp, const float* w, const float* bias, const int* idx,
                                          int c, int CD, int KW) {
  float u = bias != nullptr ? bias[c] : 0.f;
  for (int k = 0; k < KW; k++) {
    if (idx[k] >= 0) u += w[(long long)c * KW + k] * inp[(long long)idx[k] * CD + c];
  }
  return u;
}

template <class TO>
__device__ __forceinline__ void conv_fwd(TO* out, const float* inp, const float* w, const float* bias,
                                         const int* offs, const int* parent, int NS, int T, int CD, int KW) {
  TG_FOR(i, (long long)T * CD) {
    const int t = (int)(i / CD), c = (int)(i % CD);
    int idx[MB_MAXKW];
    mb_taps(idx, offs, parent, NS, t, KW);
    const float u = conv_pre(inp, w, bias, idx, c, CD, KW);
    st_f(out, i, u / (1.f + expf(-u)));
  }
}

extern "C" __global__ void conv1d_fwd(float* out, const float* inp, const float* w, const float* bias,
                                      const int* offs, const int* parent, int NS, int T, int CD, int KW) {
  conv_fwd(out, inp, w, bias, offs, parent, NS, T, CD, KW);
}
extern "C" __global__ void conv1d_fwd_bf16out(tg_bf16* out, const float* inp, const float* w, const float* bias,
                                              const int* offs, const int* parent, int NS, int T, int CD,
                                              int KW) {
  conv_fwd(out, inp, w, bias, offs, parent, NS, T, CD, KW);
}

// g = dout·silu'(pre) at (t, c).
__device__ __forceinline__ float conv_g(const float* dout, const float* inp, const float* w, const float* bias,
                                        const int* offs, const int* parent, int NS, int t, int c, int CD,
                                        int KW) {
  int idx[MB_MAXKW];
  mb_taps(idx, offs, parent, NS, t, KW);
  const float u = conv_pre(inp, w, bias, idx, c, CD, KW);
  const float s = mb_sigmoid(u);
  return dout[(long long)t * CD + c] * (s * (1.f + u * (1.f - s)));
}

extern "C" __global__ void conv1d_bwd_dinp(float* dinp, const float* dout, const float* inp, const float* w,
                                           const float* bias, const int* offs, const int* parent,
                                           const int* ends, const int* anc, int NS, int T, int CD, int KW) {
  TG_FOR(i, (long long)T * CD) {
    const int r = (int)(i / CD), c = (int)(i % CD);
    const int seg = mb_seg_of(offs, NS, r), end = offs[seg + 1];
    const float* wc = w + (long long)c * KW;
    float acc = 0.f;
    // The readers in r's own segment: r + j reads r with tap KW−1−j.
    for (int j = 0; j < KW && r + j < end; j++)
      acc += wc[KW - 1 - j] * conv_g(dout, inp, w, bias, offs, parent, NS, r + j, c, CD, KW);
    if (r + KW - 1 >= end) {
      // The descendants' first tokens, in preorder: a token q into segment
      // d is anc[d] + q − (anc[seg] + r − offs[seg]) tokens after r.
      const int ctx = anc[seg] + r - offs[seg];
      int d = seg + 1;
      while (d < NS && offs[d] < ends[seg]) {
        const int dist0 = anc[d] - ctx;
        if (dist0 > KW - 1 || dist0 < 1) {
          // Too far (so is its subtree): skip to the segment after it.
          const int e = ends[d];
          d = e >= T ? NS : mb_seg_of(offs, NS, e);
          if (d <= seg) break;  // a tree that breaks the rules
          continue;
        }
        for (int q = 0; dist0 + q <= KW - 1 && offs[d] + q < offs[d + 1]; q++)
          acc += wc[KW - 1 - (dist0 + q)] * conv_g(dout, inp, w, bias, offs, parent, NS, offs[d] + q, c, CD, KW);
        d++;
      }
    }
    dinp[i] = acc;
  }
}

// Block (tile, chunk): 256 channels of tile, the tokens of chunk.
extern "C" __global__ void conv1d_bwd_dw(float* pw, float* pb, const float* dout, const float* inp,
                                         const float* w, const float* bias, const int* offs, const int* parent,
                                         int NS, int T, int CD, int KW) {
  const int tiles = (CD + MB_THREADS - 1) / MB_THREADS;
  const int tile = blockIdx.x % tiles, chunk = blockIdx.x / tiles;
  const int c = tile * MB_THREADS + threadIdx.x;
  if (c >= CD) return;
  float sw[MB_MAXKW], sb = 0.f;
  for (int k = 0; k < KW; k++) sw[k] = 0.f;
  const int lo = chunk * MB_ROWS, hi = min(lo + MB_ROWS, T);
  for (int t = lo; t < hi; t++) {
    int idx[MB_MAXKW];
    mb_taps(idx, offs, parent, NS, t, KW);
    const float u = conv_pre(inp, w, bias, idx, c, CD, KW);
    const float s = mb_sigmoid(u);
    const float g = dout[(long long)t * CD + c] * (s * (1.f + u * (1.f - s)));
    sb += g;
    for (int k = 0; k < KW; k++) {
      if (idx[k] >= 0) sw[k] += g * inp[(long long)idx[k] * CD + c];
    }
  }
  for (int k = 0; k < KW; k++) pw[(long long)chunk * CD * KW + (long long)c * KW + k] = sw[k];
  if (pb != nullptr) pb[(long long)chunk * CD + c] = sb;
}

template <class TO>
__device__ __forceinline__ void conv_decode(TO* out, float* window, const float* inp, const float* w,
                                            const float* bias, int B, int CD, int KW) {
  const int W = KW - 1;
  TG_FOR(i, (long long)B * CD) {
    const int b = (int)(i / CD), c = (int)(i % CD);
    float* wr = window + (long long)b * W * CD;
    const float* wc = w + (long long)c * KW;
    float u = bias != nullptr ? bias[c] : 0.f;
    for (int k = 0; k < W; k++) u += wc[k] * wr[(long long)k * CD + c];
    const float x = inp[i];
    u += wc[W] * x;
    st_f(out, i, u / (1.f + expf(-u)));
    // This thread owns column c of row b's window.
    for (int k = 0; k + 1 < W; k++) wr[(long long)k * CD + c] = wr[(long long)(k + 1) * CD + c];
    if (W > 0) wr[(long long)(W - 1) * CD + c] = x;
  }
}

extern "C" __global__ void conv1d_decode(float* out, float* window, const float* inp, const float* w,
                                         const float* bias, int B, int CD, int KW) {
  conv_decode(out, window, inp, w, bias, B, CD, KW);
}
extern "C" __global__ void conv1d_decode_bf16out(tg_bf16* out, float* window, const float* inp, const float* w,
                                                 const float* bias, int B, int CD, int KW) {
  conv_decode(out, window, inp, w, bias, B, CD, KW);
}

// The gated norm: one block of MB_THREADS per (row, group), blockIdx.x =
// row·(D/GS) + group.
template <class TO>
__device__ __forceinline__ void gated_fwd(TO* out, float* rstd, const float* y, const float* z, const float* w,
                                          int N, int D, int GS, float eps) {
  __shared__ float scratch[32];
  const int ng = D / GS;
  for (long long rg = blockIdx.x; rg < (long long)N * ng; rg += gridDim.x) {
    const long long base = (rg / ng) * D + (rg % ng) * GS;
    const int c0 = (int)(rg % ng) * GS;
    float ss = 0.f;
    for (int i = threadIdx.x; i < GS; i += blockDim.x) {
      const float zz = z[base + i], u = y[base + i] * zz * mb_sigmoid(zz);
      ss += u * u;
    }
    ss = block_sum(ss, scratch);
    const float rs = 1.f / sqrtf(ss / (float)GS + eps);
    if (threadIdx.x == 0) rstd[rg] = rs;
    for (int i = threadIdx.x; i < GS; i += blockDim.x) {
      const float zz = z[base + i], u = y[base + i] * zz * mb_sigmoid(zz);
      st_f(out, base + i, w[c0 + i] * (u * rs));
    }
  }
}

extern "C" __global__ void __launch_bounds__(MB_THREADS) gated_rmsnorm_fwd(float* out, float* rstd, const float* y,
                                                                          const float* z, const float* w, int N,
                                                                          int D, int GS, float eps) {
  gated_fwd(out, rstd, y, z, w, N, D, GS, eps);
}
extern "C" __global__ void __launch_bounds__(MB_THREADS) gated_rmsnorm_fwd_bf16out(tg_bf16* out, float* rstd,
                                                                                  const float* y, const float* z,
                                                                                  const float* w, int N, int D,
                                                                                  int GS, float eps) {
  gated_fwd(out, rstd, y, z, w, N, D, GS, eps);
}

extern "C" __global__ void __launch_bounds__(MB_THREADS) gated_rmsnorm_bwd(float* dy, float* dz, const float* dout,
                                                                          const float* y, const float* z,
                                                                          const float* w, const float* rstd, int N,
                                                                          int D, int GS) {
  __shared__ float scratch[32];
  const int ng = D / GS;
  for (long long rg = blockIdx.x; rg < (long long)N * ng; rg += gridDim.x) {
    const long long base = (rg / ng) * D + (rg % ng) * GS;
    const int c0 = (int)(rg % ng) * GS;
    const float rs = rstd[rg];
    float dot = 0.f;
    for (int i = threadIdx.x; i < GS; i += blockDim.x) {
      const float zz = z[base + i], u = y[base + i] * zz * mb_sigmoid(zz);
      dot += dout[base + i] * w[c0 + i] * (u * rs);
    }
    const float mean = block_sum(dot, scratch) / (float)GS;
    for (int i = threadIdx.x; i < GS; i += blockDim.x) {
      const float zz = z[base + i], s = mb_sigmoid(zz), u = y[base + i] * zz * s;
      const float du = rs * (dout[base + i] * w[c0 + i] - u * rs * mean);
      dy[base + i] = du * zz * s;
      dz[base + i] = du * y[base + i] * (s * (1.f + zz * (1.f - s)));
    }
  }
}

// Block (tile, chunk): MB_THREADS columns, MB_ROWS rows, summed in row order.
extern "C" __global__ void gated_rmsnorm_dw(float* partials, const float* dout, const float* y, const float* z,
                                            const float* rstd, int N, int D, int GS) {
  const int tiles = (D + MB_THREADS - 1) / MB_THREADS;
  const int tile = blockIdx.x % tiles, chunk = blockIdx.x / tiles;
  const int c = tile * MB_THREADS + threadIdx.x;
  if (c >= D) return;
  const int ng = D / GS;
  const int lo = chunk * MB_ROWS, hi = min(lo + MB_ROWS, N);
  float s = 0.f;
  for (int r = lo; r < hi; r++) {
    const long long i = (long long)r * D + c;
    const float zz = z[i], u = y[i] * zz * mb_sigmoid(zz);
    s += dout[i] * (u * rstd[(long long)r * ng + c / GS]);
  }
  partials[(long long)chunk * D + c] = s;
}

template <class TI, class TO>
__device__ __forceinline__ void relu2_f(TO* out, const TI* inp, long long N) {
  TG_FOR(i, N) {
    const float r = fmaxf(ld_f(inp, i), 0.f);
    st_f(out, i, r * r);
  }
}
extern "C" __global__ void relu2_fwd(float* out, const float* inp, long long N) { relu2_f(out, inp, N); }
extern "C" __global__ void relu2_fwd_bf16(tg_bf16* out, const tg_bf16* inp, long long N) { relu2_f(out, inp, N); }
extern "C" __global__ void relu2_fwd_bf16_f32out(float* out, const tg_bf16* inp, long long N) {
  relu2_f(out, inp, N);
}
extern "C" __global__ void relu2_fwd_f32_bf16out(tg_bf16* out, const float* inp, long long N) {
  relu2_f(out, inp, N);
}

template <class TI>
__device__ __forceinline__ void relu2_b(float* dinp, const float* dout, const TI* inp, long long N) {
  TG_FOR(i, N) {
    const float r = fmaxf(ld_f(inp, i), 0.f);
    dinp[i] = 2.f * r * dout[i];
  }
}
extern "C" __global__ void relu2_bwd(float* dinp, const float* dout, const float* inp, long long N) {
  relu2_b(dinp, dout, inp, N);
}
extern "C" __global__ void relu2_bwd_bf16(float* dinp, const float* dout, const tg_bf16* inp, long long N) {
  relu2_b(dinp, dout, inp, N);
}

// The scan's per-token constants for head h: dt (clamped softplus, in
// double as kernels.Softplus), a = exp(dt·A), and ∂dt/∂dtRaw (0 where the
// clamp holds).
struct mb_step {
  float dt, a, ddt;
};
__device__ __forceinline__ mb_step mb_dt(float raw, float bias, float A, float lo, float hi) {
  const float x = raw + bias;
  const double xd = (double)x;
  const float sp = (float)(xd > 20.0 ? xd : log1p(exp(xd)));
  mb_step st;
  st.dt = fminf(fmaxf(sp, lo), hi);
  st.a = expf(st.dt * A);
  const float dsp = x > 20.f ? 1.f : mb_sigmoid(x);
  st.ddt = (sp < lo || sp > hi) ? 0.f : dsp;
  return st;
}

// Shared memory of the forward scan: the head's state (MP·DS), then x (MP),
// B and C (DS each).
template <class TX>
__device__ __forceinline__ void scan_fwd(float* y, float* fin, float* ckpt, const TX* xbc, const float* dtRaw,
                                         const float* dtBias, const float* aLog, const float* dd, const int* offs,
                                         const int* parent, int NS, int T, int MH, int MP, int G, int DS,
                                         float lo, float hi) {
  TG_DYN_SMEM(float, mb_smem);
  const int h = blockIdx.x, g = h / (MH / G), PN = MP * DS;
  const int DI = MH * MP, CD = DI + 2 * G * DS;
  const int lane = threadIdx.x & 31, warp = threadIdx.x >> 5, nw = blockDim.x >> 5;
  float* S = mb_smem;
  float* sx = S + PN;
  float* sB = sx + MP;
  float* sC = sB + DS;
  const float A = -(float)exp((double)aLog[h]), D = dd[h];
  long long ck = 0;  // the next checkpoint
  for (int s = 0; s < NS; s++) {
    const int p0 = parent[s];
    __syncthreads();
    for (int e = threadIdx.x; e < PN; e += blockDim.x)
      S[e] = (p0 >= 0 && p0 < s) ? fin[((long long)p0 * MH + h) * PN + e] : 0.f;
    for (int t = offs[s]; t < offs[s + 1]; t++) {
      __syncthreads();  // the previous token's readers are done
      if (ckpt != nullptr && (t - offs[s]) % MB_Q == 0) {
        for (int e = threadIdx.x; e < PN; e += blockDim.x) ckpt[(ck * MH + h) * PN + e] = S[e];
        ck++;
      }
      const TX* row = xbc + (long long)t * CD;
      for (int i = threadIdx.x; i < MP; i += blockDim.x) sx[i] = ld_f(row, h * MP + i);
      for (int i = threadIdx.x; i < DS; i += blockDim.x) {
        sB[i] = ld_f(row, DI + g * DS + i);
        sC[i] = ld_f(row, DI + (G + g) * DS + i);
      }
      const mb_step st = mb_dt(dtRaw[(long long)t * MH + h], dtBias[h], A, lo, hi);
      __syncthreads();
      for (int e = threadIdx.x; e < PN; e += blockDim.x) {
        const int p = e / DS, n = e % DS;
        S[e] = st.a * S[e] + st.dt * sx[p] * sB[n];
      }
      __syncthreads();
      if (y != nullptr) {
        for (int p = warp; p < MP; p += nw) {
          float acc = 0.f;
          for (int n = lane; n < DS; n += 32) acc += S[p * DS + n] * sC[n];
          acc = warp_sum(acc);
          if (lane == 0) y[((long long)t * MH + h) * MP + p] = acc + D * sx[p];
        }
      }
    }
    for (int e = threadIdx.x; e < PN; e += blockDim.x) fin[((long long)s * MH + h) * PN + e] = S[e];
  }
}

extern "C" __global__ void __launch_bounds__(MB_THREADS) ssm_scan_fwd(
    float* y, float* fin, float* ckpt, const float* xbc, const float* dtRaw, const float* dtBias,
    const float* aLog, const float* dd, const int* offs, const int* parent, int NS, int T, int MH, int MP, int G,
    int DS, float lo, float hi) {
  scan_fwd(y, fin, ckpt, xbc, dtRaw, dtBias, aLog, dd, offs, parent, NS, T, MH, MP, G, DS, lo, hi);
}
extern "C" __global__ void __launch_bounds__(MB_THREADS) ssm_scan_fwd_bf16(
    float* y, float* fin, float* ckpt, const tg_bf16* xbc, const float* dtRaw, const float* dtBias,
    const float* aLog, const float* dd, const int* offs, const int* parent, int NS, int T, int MH, int MP, int G,
    int DS, float lo, float hi) {
  scan_fwd(y, fin, ckpt, xbc, dtRaw, dtBias, aLog, dd, offs, parent, NS, T, MH, MP, G, DS, lo, hi);
}

// The backward scan. Shared memory: red (MP·DS) for the sums over p and
// over n, then x, dy, the sums over n (MP each), B and C (DS each), and the
// block_sum scratch (32). work (MH, MB_Q, MP·DS) holds a chunk's states;
// dsin (NS, MH, MP·DS) each segment's initial-state gradient; dbc
// (T, MH, 2, DS) the head's dB, dC.
template <class TX>
__device__ __forceinline__ void scan_bwd(float* dxbc, float* ddtRaw, float* ddtBias, float* daLog, float* ddd,
                                         float* dbc, float* work, float* dsin, const float* fin,
                                         const float* ckpt, const float* dy, const TX* xbc,
                                         const float* dtRaw, const float* dtBias, const float* aLog,
                                         const float* dd, const int* offs, const int* parent, const int* ends,
                                         int NS, int T, int MH, int MP, int G, int DS, float lo, float hi) {
  TG_DYN_SMEM(float, mb_smem);
  const int h = blockIdx.x, g = h / (MH / G), PN = MP * DS;
  const int DI = MH * MP, CD = DI + 2 * G * DS;
  const int lane = threadIdx.x & 31, warp = threadIdx.x >> 5, nw = blockDim.x >> 5;
  float* red = mb_smem;
  float* sx = red + PN;
  float* sdy = sx + MP;
  float* sv = sdy + MP;
  float* sB = sv + MP;
  float* sC = sB + DS;
  float* scratch = sC + DS;
  const float A = -(float)exp((double)aLog[h]), D = dd[h];
  float* W = work + (long long)h * MB_Q * PN;
  float dS[MB_EPT];
  float accA = 0.f, accBias = 0.f, accD = 0.f;  // thread 0's
  long long ck = 0;
  for (int s = 0; s < NS; s++) ck += (offs[s + 1] - offs[s] + MB_Q - 1) / MB_Q;
  for (int s = NS - 1; s >= 0; s--) {
    const int L = offs[s + 1] - offs[s], nch = (L + MB_Q - 1) / MB_Q;
    ck -= nch;
    // The gradient of s's final state: its children's initial-state ones.
#pragma unroll
    for (int j = 0; j < MB_EPT; j++) dS[j] = 0.f;
    for (int c = s + 1; c < NS && offs[c] < ends[s]; c++) {
      if (parent[c] != s) continue;
#pragma unroll
      for (int j = 0; j < MB_EPT; j++) {
        const int e = threadIdx.x + j * MB_THREADS;
        if (e < PN) dS[j] += dsin[((long long)c * MH + h) * PN + e];
      }
    }
    for (int k = nch - 1; k >= 0; k--) {
      const int t0 = offs[s] + k * MB_Q, t1 = min(t0 + MB_Q, offs[s + 1]);
      const float* S0 = ckpt + ((ck + k) * MH + h) * PN;
      // The chunk's states, forward from its checkpoint (each thread its
      // own elements: no barrier needed between the writes and the reads).
      for (int t = t0; t < t1; t++) {
        const TX* row = xbc + (long long)t * CD;
        const mb_step st = mb_dt(dtRaw[(long long)t * MH + h], dtBias[h], A, lo, hi);
        const float* prev = t == t0 ? S0 : W + (long long)(t - t0 - 1) * PN;
        float* cur = W + (long long)(t - t0) * PN;
        for (int e = threadIdx.x; e < PN; e += blockDim.x) {
          const int p = e / DS, n = e % DS;
          cur[e] = st.a * prev[e] + st.dt * ld_f(row, h * MP + p) * ld_f(row, DI + g * DS + n);
        }
      }
      for (int t = t1 - 1; t >= t0; t--) {
        const TX* row = xbc + (long long)t * CD;
        const mb_step st = mb_dt(dtRaw[(long long)t * MH + h], dtBias[h], A, lo, hi);
        const float* St = W + (long long)(t - t0) * PN;
        const float* Sp = t == t0 ? S0 : W + (long long)(t - t0 - 1) * PN;
        __syncthreads();
        for (int i = threadIdx.x; i < MP; i += blockDim.x) {
          sx[i] = ld_f(row, h * MP + i);
          sdy[i] = dy[((long long)t * MH + h) * MP + i];
        }
        for (int i = threadIdx.x; i < DS; i += blockDim.x) {
          sB[i] = ld_f(row, DI + g * DS + i);
          sC[i] = ld_f(row, DI + (G + g) * DS + i);
        }
        __syncthreads();
        // dS += dy ⊗ C; red = dy ⊗ S_t (for dC); t4 = Σ dS·S_{t−1}.
        float t4 = 0.f;
#pragma unroll
        for (int j = 0; j < MB_EPT; j++) {
          const int e = threadIdx.x + j * MB_THREADS;
          if (e < PN) {
            const int p = e / DS, n = e % DS;
            dS[j] += sdy[p] * sC[n];
            red[e] = sdy[p] * St[e];
            t4 += dS[j] * Sp[e];
          }
        }
        __syncthreads();
        float* bc = dbc + ((long long)t * MH + h) * 2 * DS;
        for (int n = threadIdx.x; n < DS; n += blockDim.x) {
          float v = 0.f;
          for (int p = 0; p < MP; p++) v += red[p * DS + n];
          bc[DS + n] = v;  // dC
        }
        __syncthreads();
#pragma unroll
        for (int j = 0; j < MB_EPT; j++) {
          const int e = threadIdx.x + j * MB_THREADS;
          if (e < PN) red[e] = dS[j] * st.dt * sx[e / DS];
        }
        __syncthreads();
        for (int n = threadIdx.x; n < DS; n += blockDim.x) {
          float v = 0.f;
          for (int p = 0; p < MP; p++) v += red[p * DS + n];
          bc[n] = v;  // dB
        }
        __syncthreads();
#pragma unroll
        for (int j = 0; j < MB_EPT; j++) {
          const int e = threadIdx.x + j * MB_THREADS;
          if (e < PN) red[e] = dS[j] * sB[e % DS];
        }
        __syncthreads();
        for (int p = warp; p < MP; p += nw) {
          float v = 0.f;
          for (int n = lane; n < DS; n += 32) v += red[p * DS + n];
          v = warp_sum(v);
          if (lane == 0) {
            sv[p] = v;
            dxbc[(long long)t * CD + h * MP + p] = st.dt * v + D * sdy[p];
          }
        }
        const float T4 = block_sum(t4, scratch);  // its barriers order sv's writes too
        if (threadIdx.x == 0) {
          float sxv = 0.f, sxy = 0.f;
          for (int p = 0; p < MP; p++) {
            sxv += sx[p] * sv[p];
            sxy += sdy[p] * sx[p];
          }
          const float gdt = A * st.a * T4 + sxv;  // ∂L/∂dt
          accA += st.dt * st.a * T4;
          const float g = gdt * st.ddt;
          ddtRaw[(long long)t * MH + h] = g;
          accBias += g;
          accD += sxy;
        }
#pragma unroll
        for (int j = 0; j < MB_EPT; j++) dS[j] *= st.a;
      }
    }
    const int p0 = parent[s];
    if (p0 >= 0) {
#pragma unroll
      for (int j = 0; j < MB_EPT; j++) {
        const int e = threadIdx.x + j * MB_THREADS;
        if (e < PN) dsin[((long long)s * MH + h) * PN + e] = dS[j];
      }
    }
  }
  (void)fin;
  if (threadIdx.x == 0) {
    ddtBias[h] += accBias;
    daLog[h] += accA * A;
    ddd[h] += accD;
  }
}

extern "C" __global__ void __launch_bounds__(MB_THREADS) ssm_scan_bwd(
    float* dxbc, float* ddtRaw, float* ddtBias, float* daLog, float* ddd, float* dbc, float* work, float* dsin,
    const float* fin, const float* ckpt, const float* dy, const float* xbc, const float* dtRaw,
    const float* dtBias, const float* aLog, const float* dd, const int* offs, const int* parent, const int* ends,
    int NS, int T, int MH, int MP, int G, int DS, float lo, float hi) {
  scan_bwd(dxbc, ddtRaw, ddtBias, daLog, ddd, dbc, work, dsin, fin, ckpt, dy, xbc, dtRaw, dtBias, aLog, dd, offs,
           parent, ends, NS, T, MH, MP, G, DS, lo, hi);
}
extern "C" __global__ void __launch_bounds__(MB_THREADS) ssm_scan_bwd_bf16(
    float* dxbc, float* ddtRaw, float* ddtBias, float* daLog, float* ddd, float* dbc, float* work, float* dsin,
    const float* fin, const float* ckpt, const float* dy, const tg_bf16* xbc, const float* dtRaw,
    const float* dtBias, const float* aLog, const float* dd, const int* offs, const int* parent, const int* ends,
    int NS, int T, int MH, int MP, int G, int DS, float lo, float hi) {
  scan_bwd(dxbc, ddtRaw, ddtBias, daLog, ddd, dbc, work, dsin, fin, ckpt, dy, xbc, dtRaw, dtBias, aLog, dd, offs,
           parent, ends, NS, T, MH, MP, G, DS, lo, hi);
}

// dxbc's B and C columns of token t, group g: the sums of dbc over the
// group's heads, in head order. One thread per (t, g, B|C, n).
extern "C" __global__ void ssm_bc_reduce(float* dxbc, const float* dbc, int T, int MH, int MP, int G, int DS) {
  const int hpg = MH / G, DI = MH * MP, CD = DI + 2 * G * DS;
  TG_FOR(i, (long long)T * G * 2 * DS) {
    const int n = (int)(i % DS), w = (int)(i / DS % 2), g = (int)(i / (2 * DS) % G);
    const long long t = i / (2LL * DS * G);
    float v = 0.f;
    for (int k = 0; k < hpg; k++) v += dbc[((t * MH + g * hpg + k) * 2 + w) * DS + n];
    dxbc[t * CD + DI + (w * G + g) * DS + n] = v;
  }
}

// One token per sequence: block (b, h) = blockIdx.x = b·MH + h.
template <class TX>
__device__ __forceinline__ void scan_decode(float* y, float* state, const TX* xbc, const float* dtRaw,
                                            const float* dtBias, const float* aLog, const float* dd, int B, int MH,
                                            int MP, int G, int DS, float lo, float hi) {
  const int b = blockIdx.x / MH, h = blockIdx.x % MH, g = h / (MH / G), PN = MP * DS;
  const int DI = MH * MP, CD = DI + 2 * G * DS;
  const int lane = threadIdx.x & 31, warp = threadIdx.x >> 5, nw = blockDim.x >> 5;
  if (b >= B) return;
  const TX* row = xbc + (long long)b * CD;
  float* S = state + ((long long)b * MH + h) * PN;
  const float A = -(float)exp((double)aLog[h]);
  const mb_step st = mb_dt(dtRaw[(long long)b * MH + h], dtBias[h], A, lo, hi);
  for (int e = threadIdx.x; e < PN; e += blockDim.x) {
    const int p = e / DS, n = e % DS;
    S[e] = st.a * S[e] + st.dt * ld_f(row, h * MP + p) * ld_f(row, DI + g * DS + n);
  }
  __syncthreads();
  for (int p = warp; p < MP; p += nw) {
    float acc = 0.f;
    for (int n = lane; n < DS; n += 32) acc += S[p * DS + n] * ld_f(row, DI + (G + g) * DS + n);
    acc = warp_sum(acc);
    if (lane == 0) y[((long long)b * MH + h) * MP + p] = acc + dd[h] * ld_f(row, h * MP + p);
  }
}

extern "C" __global__ void __launch_bounds__(MB_THREADS) ssm_decode(float* y, float* state, const float* xbc,
                                                                   const float* dtRaw, const float* dtBias,
                                                                   const float* aLog, const float* dd, int B,
                                                                   int MH, int MP, int G, int DS, float lo,
                                                                   float hi) {
  scan_decode(y, state, xbc, dtRaw, dtBias, aLog, dd, B, MH, MP, G, DS, lo, hi);
}
extern "C" __global__ void __launch_bounds__(MB_THREADS) ssm_decode_bf16(float* y, float* state,
                                                                        const tg_bf16* xbc, const float* dtRaw,
                                                                        const float* dtBias, const float* aLog,
                                                                        const float* dd, int B, int MH, int MP,
                                                                        int G, int DS, float lo, float hi) {
  scan_decode(y, state, xbc, dtRaw, dtBias, aLog, dd, B, MH, MP, G, DS, lo, hi);
}
