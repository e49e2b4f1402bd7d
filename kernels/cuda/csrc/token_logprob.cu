// token_logprob.cu: log-probability, entropy and log-sum-exp of the sampled
// token, formed over vocabulary chunks so that no T×V logits ever exist.
//
// The launcher (kernels/cuda/token_logprob.go) loops over chunks [v0, v0+Vc)
// of the vocabulary: cuBLAS writes logits (T,Vc) = invTemp·hidden (T,C)·W[v0:v0+Vc]ᵀ
// in fp32 into a scratch buffer (hidden and W fp32, or bf16 on tensor cores
// with fp32 accumulation), then
//   logprob_chunk folds the chunk into a running per-row state (T,4) =
//     {m, Σ e^(z−m), Σ e^(z−m)·z, z[target]}                         (update)
//   logprob_finish: lse (T) = m + log Σ, logprob (T) = z[target] − lse,
//     entropy (T) = lse − Σ e^(z−m)·z / Σ e^(z−m)                     (=)
// so the log-sum-exp, entropy and target logit are folded in the chunk loop
// and no T×V logits ever exist. Backward, per chunk after the same GEMM:
//   logprob_bwd_chunk{,_bf16}: dz (T,Vc) = dlogprob·(onehot(target) − e^(z−lse))·invTemp,
//     fp32 over the logits (fp32 GEMMs) or bf16 into its own buffer (the bf16
//     GEMMs' operand), then cuBLAS adds dhidden += dz·W_chunk and
//     dW_chunk += dzᵀ·hidden: one chunk of fp32 logits at a time.
// Rows with target < 0 get zeros and no gradient; a target >= V is treated the
// same and sets TG_ERR_TARGET. The chunk kernels take one block per row and
// read the row with 16-byte loads when Vc is a multiple of 4 (the scratch
// rows are then 16-byte aligned).
//
// The filtered head (kernels.FilteredHead: NeMo RL's top-k/top-p filter,
// filter.cuh) forms the logits a block of whole rows at a time instead,
// (Tr,V) = invTemp·hidden[r0:r0+Tr]·Wᵀ, the same blocks forward and
// backward (so the backward sees the forward's logits bit for bit), one
// block of FLT_THREADS threads per row:
//   logprob_filter_fwd: the row's cut (filter.cuh), then in one pass
//     s1 = Σ_K e, s2 = Σ_K e·(z−m), su = Σ_v e (e = expf(z−m), double sums
//     in a fixed order); lse = m + log s1, entropy = log s1 − s2/s1,
//     logprob = z[tg] − lse (−inf if tg is filtered out), lseFull = m +
//     log su, logprobFull = z[tg] − lseFull, cut (2) = {key, id}        (=)
//   logprob_filter_bwd{,_bf16}: dz (Tr,V) = invTemp·(g·k_v·(1[v=tg] −
//     e^(z−lse)) + gu·(1[v=tg] − e^(z−lseFull))), k_v = the cut keeps v;
//     then cuBLAS adds dhidden[r0:] += dz·W and dW += dzᵀ·hidden[r0:].
#include "common.cuh"
#include "bf16.cuh"
#include "filter.cuh"

struct lp_state {
  float m, s, s1;
};

__device__ __forceinline__ void lp_merge(lp_state& a, float mb, float sb, float s1b) {
  if (mb == -TG_INF) return;
  if (a.m == -TG_INF) {
    a.m = mb;
    a.s = sb;
    a.s1 = s1b;
    return;
  }
  float m = fmaxf(a.m, mb);
  float ea = expf(a.m - m), eb = expf(mb - m);
  a.s = a.s * ea + sb * eb;
  a.s1 = a.s1 * ea + s1b * eb;
  a.m = m;
}

// Folds one logit into a running state.
__device__ __forceinline__ void lp_add(lp_state& a, float zj) {
  if (zj > a.m) {
    float e = a.m == -TG_INF ? 0.f : expf(a.m - zj);
    a.s = a.s * e + 1.f;
    a.s1 = a.s1 * e + zj;
    a.m = zj;
  } else {
    float e = expf(zj - a.m);
    a.s += e;
    a.s1 += e * zj;
  }
}

extern "C" __global__ void logprob_init(float* state, int T) {
  TG_FOR(t, (long long)T) {
    state[t * 4 + 0] = -TG_INF;
    state[t * 4 + 1] = 0.f;
    state[t * 4 + 2] = 0.f;
    state[t * 4 + 3] = 0.f;
  }
}

// One block per row (grid-stride over rows).
extern "C" __global__ void logprob_chunk(float* state, const float* logits, const int* targets,
                                         int T, int Vc, int v0, int V) {
  __shared__ float sm[3][32];
  const int lane = threadIdx.x & 31, warp = threadIdx.x >> 5, nw = blockDim.x >> 5;
  for (int t = blockIdx.x; t < T; t += gridDim.x) {
    const int tgt = targets[t];
    if (tgt < 0 || tgt >= V) continue;  // whole block
    const float* z = logits + (long long)t * Vc;
    lp_state a = {-TG_INF, 0.f, 0.f};
    if ((Vc & 3) == 0) {
      for (int j = 4 * threadIdx.x; j < Vc; j += 4 * blockDim.x) {
        const float4 z4 = ld_f4(z + j);
        lp_add(a, z4.x);
        lp_add(a, z4.y);
        lp_add(a, z4.z);
        lp_add(a, z4.w);
      }
    } else {
      for (int j = threadIdx.x; j < Vc; j += blockDim.x) lp_add(a, z[j]);
    }
#pragma unroll
    for (int o = 16; o > 0; o >>= 1) {
      float mb = __shfl_xor_sync(TG_FULL, a.m, o);
      float sb = __shfl_xor_sync(TG_FULL, a.s, o);
      float s1b = __shfl_xor_sync(TG_FULL, a.s1, o);
      lp_merge(a, mb, sb, s1b);
    }
    __syncthreads();  // the previous row's readers of sm are done
    if (lane == 0) {
      sm[0][warp] = a.m;
      sm[1][warp] = a.s;
      sm[2][warp] = a.s1;
    }
    __syncthreads();
    if (threadIdx.x == 0) {
      lp_state r = {-TG_INF, 0.f, 0.f};
      for (int w = 0; w < nw; w++) lp_merge(r, sm[0][w], sm[1][w], sm[2][w]);
      float* st = state + (long long)t * 4;
      lp_state run = {st[0], st[1], st[2]};
      lp_merge(run, r.m, r.s, r.s1);
      st[0] = run.m;
      st[1] = run.s;
      st[2] = run.s1;
      if (tgt >= v0 && tgt < v0 + Vc) st[3] = z[tgt - v0];
    }
  }
}

extern "C" __global__ void logprob_finish(float* logprob, float* entropy, float* lse,
                                          const float* state, const int* targets, int T, int V,
                                          int* flags) {
  TG_FOR(t, (long long)T) {
    const int tgt = targets[t];
    if (tgt < 0 || tgt >= V) {
      if (tgt >= V) atomicOr(flags, TG_ERR_TARGET);
      logprob[t] = 0.f;
      entropy[t] = 0.f;
      lse[t] = 0.f;
      continue;
    }
    const float* st = state + t * 4;
    const float L = st[0] + logf(st[1]);
    lse[t] = L;
    logprob[t] = st[3] - L;
    entropy[t] = L - st[2] / st[1];
  }
}

// dz row t of the chunk, one block per row (grid-stride over rows). TD is
// float (dz over the logits) or tg_bf16 (dz into its own buffer).
template <class TD>
__device__ __forceinline__ void lp_bwd_chunk(TD* dz, const float* logits, const float* lse,
                                             const float* dlogprob, const int* targets, int T,
                                             int Vc, int v0, int V, float invTemp) {
  for (int t = blockIdx.x; t < T; t += gridDim.x) {
    const int tgt = targets[t];
    const bool on = tgt >= 0 && tgt < V;
    const float L = on ? lse[t] : 0.f, g = on ? dlogprob[t] : 0.f;
    const int jt = on ? tgt - v0 : -1;  // the target's column in this chunk, if any
    const float* z = logits + (long long)t * Vc;
    TD* d = dz + (long long)t * Vc;
    if ((Vc & 3) == 0) {
      for (int j = 4 * threadIdx.x; j < Vc; j += 4 * blockDim.x) {
        const float4 z4 = ld_f4(z + j);
        float r[4] = {z4.x, z4.y, z4.z, z4.w};
#pragma unroll
        for (int i = 0; i < 4; i++) r[i] = on ? g * ((j + i == jt ? 1.f : 0.f) - expf(r[i] - L)) * invTemp : 0.f;
        st_f4(d + j, r);
      }
    } else {
      for (int j = threadIdx.x; j < Vc; j += blockDim.x) {
        const float r = on ? g * ((j == jt ? 1.f : 0.f) - expf(z[j] - L)) * invTemp : 0.f;
        st_f(d, j, r);
      }
    }
  }
}

extern "C" __global__ void logprob_bwd_chunk(float* dz, const float* logits, const float* lse, const float* dlogprob,
                                             const int* targets, int T, int Vc, int v0, int V,
                                             float invTemp) {
  lp_bwd_chunk(dz, logits, lse, dlogprob, targets, T, Vc, v0, V, invTemp);  // dz == logits
}

extern "C" __global__ void logprob_bwd_chunk_bf16(tg_bf16* dz, const float* logits, const float* lse,
                                                  const float* dlogprob, const int* targets, int T,
                                                  int Vc, int v0, int V, float invTemp) {
  lp_bwd_chunk(dz, logits, lse, dlogprob, targets, T, Vc, v0, V, invTemp);
}

// One block per row of the block of rows starting at row r0.
extern "C" __global__ void __launch_bounds__(FLT_THREADS)
    logprob_filter_fwd(float* logprob, float* entropy, float* lse, float* logprobFull, float* lseFull, int* cut,
                       const float* logits, const int* targets, int r0, int V, int topK, int onP, float thrf,
                       int* flags) {
  __shared__ tg_filter_smem s;
  const int tid = threadIdx.x, t = r0 + blockIdx.x;
  const float* z = logits + (long long)blockIdx.x * V;
  const int tgt = targets[t];
  if (tgt < 0 || tgt >= V) {  // whole block
    if (tid == 0) {
      if (tgt >= V) atomicOr(flags, TG_ERR_TARGET);
      logprob[t] = entropy[t] = lse[t] = logprobFull[t] = lseFull[t] = 0.f;
      cut[2 * t] = cut[2 * t + 1] = 0;
    }
    return;
  }
  unsigned mk = 0;
  for (int i = tid; i < V; i += FLT_THREADS) {
    const unsigned k = tg_key(z[i]);
    mk = k > mk ? k : mk;
  }
  mk = tg_block_max_u32(mk, &s);
  const tg_cut c = tg_filter_cut(z, 1.f, V, topK, onP, thrf, mk, &s);
  const float m = tg_key_value(mk);
  double s1 = 0.0, s2 = 0.0, su = 0.0;
  for (int i = tid; i < V; i += FLT_THREADS) {
    const float x = z[i], d = x - m;
    const double e = (double)expf(d);
    su += e;
    if (tg_keeps(c, i, tg_key(x))) {
      s1 += e;
      s2 += e * (double)d;
    }
  }
  s1 = tg_block_sum_f64(s1, &s);
  s2 = tg_block_sum_f64(s2, &s);
  su = tg_block_sum_f64(su, &s);
  if (tid == 0) {
    const float zt = z[tgt];
    const double L = (double)m + log(s1), Lu = (double)m + log(su);
    lse[t] = (float)L;
    entropy[t] = (float)(log(s1) - s2 / s1);
    logprob[t] = tg_keeps(c, tgt, tg_key(zt)) ? (float)((double)zt - L) : -TG_INF;
    lseFull[t] = (float)Lu;
    logprobFull[t] = (float)((double)zt - Lu);
    cut[2 * t] = (int)c.key;
    cut[2 * t + 1] = c.id;
  }
}

// dz row blockIdx.x of the block of rows at r0. TD is float (dz over the
// logits) or tg_bf16 (dz into its own buffer). dlogprobFull may be null.
template <class TD>
__device__ __forceinline__ void lpf_bwd(TD* dz, const float* logits, const float* lse, const float* lseFull,
                                        const int* cut, const float* dlogprob, const float* dlogprobFull,
                                        const int* targets, int r0, int V, float invTemp) {
  const int t = r0 + blockIdx.x;
  const float* z = logits + (long long)blockIdx.x * V;
  TD* d = dz + (long long)blockIdx.x * V;
  const int tgt = targets[t];
  if (tgt < 0 || tgt >= V) {
    for (int v = threadIdx.x; v < V; v += blockDim.x) st_f(d, v, 0.f);
    return;
  }
  const tg_cut c = {(unsigned)cut[2 * t], cut[2 * t + 1]};
  const float Lf = lse[t], g = dlogprob[t];
  const bool full = dlogprobFull != nullptr;
  const float Lu = full ? lseFull[t] : 0.f, gu = full ? dlogprobFull[t] : 0.f;
  for (int v = threadIdx.x; v < V; v += blockDim.x) {
    const float x = z[v];
    const bool kept = tg_keeps(c, v, tg_key(x));
    float r = kept ? -g * expf(x - Lf) : 0.f;
    if (full) r -= gu * expf(x - Lu);
    if (v == tgt) {
      if (kept) r += g;
      r += gu;
    }
    st_f(d, v, r * invTemp);
  }
}

extern "C" __global__ void __launch_bounds__(FLT_THREADS)
    logprob_filter_bwd(float* dz, const float* logits, const float* lse, const float* lseFull, const int* cut,
                       const float* dlogprob, const float* dlogprobFull, const int* targets, int r0, int V,
                       float invTemp) {
  lpf_bwd(dz, logits, lse, lseFull, cut, dlogprob, dlogprobFull, targets, r0, V, invTemp);  // dz == logits
}

extern "C" __global__ void __launch_bounds__(FLT_THREADS)
    logprob_filter_bwd_bf16(tg_bf16* dz, const float* logits, const float* lse, const float* lseFull,
                            const int* cut, const float* dlogprob, const float* dlogprobFull, const int* targets,
                            int r0, int V, float invTemp) {
  lpf_bwd(dz, logits, lse, lseFull, cut, dlogprob, dlogprobFull, targets, r0, V, invTemp);
}
