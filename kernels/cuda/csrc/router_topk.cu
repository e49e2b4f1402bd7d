// router_topk.cu: a sparse layer's choice of experts (kernels.Experts).
//
//   router_topk_fwd:  probs (T,E) = softmax(logits (T,E)), in float64, rounded      (=)
//                     experts (T,K) I32 = the K largest probs[t], descending, ties
//                       to the lower expert id                                      (=)
//                     weights (T,K) = those probs (÷ their float64 sum when norm)   (=)
//   router_topk_bwd*: dlogits (T,E) = p ⊙ (dp − Σ_e p_e·dp_e), dp[e] = dprobs[e]
//                       (when given) + the chosen experts' share of dweights (T,K):
//                       (dweights[j] − Σ_i dweights[i]·weights[i]) / Σ_i p_chosen
//                       under norm, else dweights[j]; in float64               (=)
//
// One warp per row (8 rows per 256-thread block, grid-stride over rows);
// lane L handles experts e = L + 32·j (the forward keeps their
// probabilities in registers: E ≤ 32·RT_MAXJ = 512). The selection is K warp-wide argmax rounds (value descending,
// id ascending); each lane's partial sums run over its experts in order and
// the warp combines them by a fixed xor tree: the same bits on every run.
// dlogits is fp32 or bf16 (router_topk_bwd_bf16: the router GEMM's backward
// operand under mixed precision).
#include "bf16.cuh"
#include "common.cuh"

#define RT_MAXJ 16
#define RT_WARPS 8

__device__ __forceinline__ double warp_sum_d(double v) {
#pragma unroll
  for (int o = 16; o > 0; o >>= 1) v += __shfl_xor_sync(TG_FULL, v, o);
  return v;
}

extern "C" __global__ void __launch_bounds__(256) router_topk_fwd(float* probs, float* weights, int* experts,
                                                                 const float* logits, int T, int E, int K,
                                                                 int norm) {
  const int lane = threadIdx.x & 31, warp = threadIdx.x >> 5;
  for (int t = blockIdx.x * RT_WARPS + warp; t < T; t += gridDim.x * RT_WARPS) {
    const float* z = logits + (long long)t * E;
    float p[RT_MAXJ];
    float m = -TG_INF;
#pragma unroll
    for (int j = 0; j < RT_MAXJ; j++) {
      const int e = lane + 32 * j;
      p[j] = e < E ? z[e] : -TG_INF;
      m = fmaxf(m, p[j]);
    }
    m = warp_max(m);
    double s = 0;
#pragma unroll
    for (int j = 0; j < RT_MAXJ; j++) {
      if (lane + 32 * j < E) s += exp((double)p[j] - (double)m);
    }
    s = warp_sum_d(s);
    float* pr = probs + (long long)t * E;
#pragma unroll
    for (int j = 0; j < RT_MAXJ; j++) {
      const int e = lane + 32 * j;
      if (e < E) {
        p[j] = (float)(exp((double)p[j] - (double)m) / s);
        pr[e] = p[j];
      }
    }
    // K rounds: the largest prob not yet taken, the lower id on a tie.
    unsigned taken = 0;
    double sel = 0;
    for (int k = 0; k < K; k++) {
      float bv = -1.f;
      int be = 0x7fffffff;
#pragma unroll
      for (int j = 0; j < RT_MAXJ; j++) {
        const int e = lane + 32 * j;
        // (A NaN probability is never preferred, but an id is always chosen.)
        if (e < E && !(taken >> j & 1u) && (p[j] > bv || (p[j] == bv && e < be) || be == 0x7fffffff)) bv = p[j], be = e;
      }
#pragma unroll
      for (int o = 16; o > 0; o >>= 1) {
        const float ov = __shfl_xor_sync(TG_FULL, bv, o);
        const int oe = __shfl_xor_sync(TG_FULL, be, o);
        if (oe != 0x7fffffff && (ov > bv || (ov == bv && oe < be) || be == 0x7fffffff)) bv = ov, be = oe;
      }
      if ((be & 31) == lane) taken |= 1u << (be >> 5);
      sel += (double)bv;
      if (lane == 0) {
        experts[(long long)t * K + k] = be;
        weights[(long long)t * K + k] = bv;
      }
    }
    if (norm && lane == 0) {
      for (int k = 0; k < K; k++) {
        float* w = weights + (long long)t * K + k;
        *w = (float)((double)*w / sel);
      }
    }
  }
}

// ∂L/∂probs[e] of one row before the softmax: dprobs[e] (when given) plus
// the share of every chosen slot k with experts[k] = e (gk: slot k's).
__device__ __forceinline__ double router_dp(int e, const float* dprobs, const int* ex, const float* dw, int K,
                                            int norm, double dot, double invS) {
  double d = dprobs != nullptr ? (double)dprobs[e] : 0.0;
  for (int k = 0; k < K; k++) {
    if (ex[k] == e) d += norm ? ((double)dw[k] - dot) * invS : (double)dw[k];
  }
  return d;
}

template <class TO>
__device__ __forceinline__ void router_bwd(TO* dlogits, const float* dweights, const float* probs,
                                           const float* weights, const int* experts, const float* dprobs,
                                           int T, int E, int K, int norm) {
  const int lane = threadIdx.x & 31, warp = threadIdx.x >> 5;
  for (int t = blockIdx.x * RT_WARPS + warp; t < T; t += gridDim.x * RT_WARPS) {
    const float* pr = probs + (long long)t * E;
    const float* dw = dweights + (long long)t * K;
    const float* w = weights + (long long)t * K;
    const int* ex = experts + (long long)t * K;
    double S = 0, dot = 0;  // every lane, in k order
    if (norm) {
      for (int k = 0; k < K; k++) {
        S += (double)pr[ex[k]];
        dot += (double)dw[k] * (double)w[k];
      }
    }
    const double invS = norm ? 1.0 / S : 1.0;
    // Σ_e p_e·dp_e: the lane's experts in order, then the warp's fixed tree.
    double pd = 0;
    for (int e = lane; e < E; e += 32) pd += (double)pr[e] * router_dp(e, dprobs, ex, dw, K, norm, dot, invS);
    pd = warp_sum_d(pd);
    TO* out = dlogits + (long long)t * E;
    for (int e = lane; e < E; e += 32) {
      st_f(out, e, (float)((double)pr[e] * (router_dp(e, dprobs, ex, dw, K, norm, dot, invS) - pd)));
    }
  }
}

extern "C" __global__ void __launch_bounds__(256) router_topk_bwd(float* dlogits, const float* dweights,
                                                                 const float* probs, const float* weights,
                                                                 const int* experts, const float* dprobs, int T,
                                                                 int E, int K, int norm) {
  router_bwd(dlogits, dweights, probs, weights, experts, dprobs, T, E, K, norm);
}
extern "C" __global__ void __launch_bounds__(256) router_topk_bwd_bf16(tg_bf16* dlogits, const float* dweights,
                                                                      const float* probs, const float* weights,
                                                                      const int* experts, const float* dprobs,
                                                                      int T, int E, int K, int norm) {
  router_bwd(dlogits, dweights, probs, weights, experts, dprobs, T, E, K, norm);
}

// The sigmoid router (Nemotron-H; kernels.Router.Sigmoid):
//
//   router_sigmoid_fwd:  probs (T,E) = s = σ(logits) in float64, rounded            (=)
//                        c = s + bias (one float add; s without a bias); under groups
//                          (ng > 1) a group scores the float sum of its two largest c,
//                          the topg best groups (ties to the lower id) stay and the
//                          others' c become 0
//                        experts (T,K) = the K largest c, descending, ties to the lower
//                          id                                                          (=)
//                        weights (T,K) = scale·s_e (÷ (Σ_j s_{e_j} + 1e-20) under norm),
//                          in float64                                                  (=)
//   router_sigmoid_bwd*: dlogits (T,E) = s(1 − s)·(dprobs[e] (when given) + Σ_j [e_j = e]·g_j),
//                        g_j = scale/S'·(dweights_j − Σ_i dweights_i·weights_i/scale) under
//                        norm, else scale·dweights_j, in float64                        (=)
//
// One warp a row as above; the choice scores sit in the warp's shared row
// (E ≤ 512) while the groups are scored, lane g scoring groups g, g + 32.
#define RT_MAXGROUPS 64

extern "C" __global__ void __launch_bounds__(256) router_sigmoid_fwd(float* probs, float* weights, int* experts,
                                                                    const float* logits, const float* bias, int T,
                                                                    int E, int K, int norm, int ng, int topg,
                                                                    float scale) {
  __shared__ float crow[RT_WARPS][32 * RT_MAXJ];
  const int lane = threadIdx.x & 31, warp = threadIdx.x >> 5;
  float* cw = crow[warp];
  for (int t = blockIdx.x * RT_WARPS + warp; t < T; t += gridDim.x * RT_WARPS) {
    const float* z = logits + (long long)t * E;
    float* pr = probs + (long long)t * E;
    float p[RT_MAXJ], c[RT_MAXJ];
#pragma unroll
    for (int j = 0; j < RT_MAXJ; j++) {
      const int e = lane + 32 * j;
      p[j] = 0.f;
      c[j] = -TG_INF;
      if (e < E) {
        p[j] = (float)(1.0 / (1.0 + exp(-(double)z[e])));
        pr[e] = p[j];
        c[j] = bias != nullptr ? p[j] + bias[e] : p[j];
      }
    }
    if (ng > 1) {
      const int gs = E / ng;
      __syncwarp();  // the previous row's readers of cw are done
#pragma unroll
      for (int j = 0; j < RT_MAXJ; j++) {
        if (lane + 32 * j < E) cw[lane + 32 * j] = c[j];
      }
      __syncwarp();
      // Group scores: the two largest of the group (as kernels/cpu).
      float sc[2];
      for (int q = 0; q < 2; q++) {
        const int gi = lane + 32 * q;
        sc[q] = -TG_INF;
        if (gi < ng) {
          const float* row = cw + gi * gs;
          int a = -1, b = -1;
          for (int i = 0; i < gs; i++) {
            if (a < 0 || row[i] > row[a]) {
              b = a;
              a = i;
            } else if (b < 0 || row[i] > row[b]) {
              b = i;
            }
          }
          sc[q] = row[a] + row[b];
        }
      }
      // topg rounds of the best group not yet kept, the lower id on a tie.
      unsigned long long keep = 0;
      for (int k = 0; k < topg; k++) {
        float bv = 0.f;
        int bg = 0x7fffffff;
        for (int q = 0; q < 2; q++) {
          const int gi = lane + 32 * q;
          if (gi < ng && !(keep >> gi & 1ull) && (bg == 0x7fffffff || sc[q] > bv || (sc[q] == bv && gi < bg)))
            bv = sc[q], bg = gi;
        }
#pragma unroll
        for (int o = 16; o > 0; o >>= 1) {
          const float ov = __shfl_xor_sync(TG_FULL, bv, o);
          const int og = __shfl_xor_sync(TG_FULL, bg, o);
          if (og != 0x7fffffff && (bg == 0x7fffffff || ov > bv || (ov == bv && og < bg))) bv = ov, bg = og;
        }
        keep |= 1ull << bg;
      }
#pragma unroll
      for (int j = 0; j < RT_MAXJ; j++) {
        const int e = lane + 32 * j;
        if (e < E && !(keep >> (e / gs) & 1ull)) c[j] = 0.f;
      }
    }
    unsigned taken = 0;
    double sel = 0;
    for (int k = 0; k < K; k++) {
      float bv = 0.f;
      int be = 0x7fffffff;
      float bp = 0.f;
#pragma unroll
      for (int j = 0; j < RT_MAXJ; j++) {
        const int e = lane + 32 * j;
        if (e < E && !(taken >> j & 1u) && (be == 0x7fffffff || c[j] > bv || (c[j] == bv && e < be)))
          bv = c[j], be = e, bp = p[j];
      }
#pragma unroll
      for (int o = 16; o > 0; o >>= 1) {
        const float ov = __shfl_xor_sync(TG_FULL, bv, o);
        const int oe = __shfl_xor_sync(TG_FULL, be, o);
        const float op = __shfl_xor_sync(TG_FULL, bp, o);
        if (oe != 0x7fffffff && (be == 0x7fffffff || ov > bv || (ov == bv && oe < be))) bv = ov, be = oe, bp = op;
      }
      if ((be & 31) == lane) taken |= 1u << (be >> 5);
      sel += (double)bp;
      if (lane == 0) {
        experts[(long long)t * K + k] = be;
        weights[(long long)t * K + k] = bp;
      }
    }
    if (lane == 0) {
      for (int k = 0; k < K; k++) {
        float* w = weights + (long long)t * K + k;
        *w = norm ? (float)((double)scale * (double)*w / (sel + 1e-20)) : (float)((double)scale * (double)*w);
      }
    }
  }
}

template <class TO>
__device__ __forceinline__ void router_sig_bwd(TO* dlogits, const float* dweights, const float* probs,
                                               const float* weights, const int* experts, const float* dprobs,
                                               int T, int E, int K, int norm, float scale) {
  const int lane = threadIdx.x & 31, warp = threadIdx.x >> 5;
  for (int t = blockIdx.x * RT_WARPS + warp; t < T; t += gridDim.x * RT_WARPS) {
    const float* pr = probs + (long long)t * E;
    const float* dw = dweights + (long long)t * K;
    const float* w = weights + (long long)t * K;
    const int* ex = experts + (long long)t * K;
    double S = 0, dot = 0;
    if (norm) {
      for (int k = 0; k < K; k++) {
        S += (double)pr[ex[k]];
        dot += (double)dw[k] * (double)w[k];
      }
      S += 1e-20;
    }
    const double sc = (double)scale;
    TO* out = dlogits + (long long)t * E;
    for (int e = lane; e < E; e += 32) {
      double d = dprobs != nullptr ? (double)dprobs[e] : 0.0;
      for (int k = 0; k < K; k++) {
        if (ex[k] == e) d += norm ? sc / S * ((double)dw[k] - dot / sc) : sc * (double)dw[k];
      }
      const double q = (double)pr[e];
      st_f(out, e, (float)(d * (q * (1 - q))));
    }
  }
}

extern "C" __global__ void __launch_bounds__(256) router_sigmoid_bwd(float* dlogits, const float* dweights,
                                                                    const float* probs, const float* weights,
                                                                    const int* experts, const float* dprobs, int T,
                                                                    int E, int K, int norm, float scale) {
  router_sig_bwd(dlogits, dweights, probs, weights, experts, dprobs, T, E, K, norm, scale);
}
extern "C" __global__ void __launch_bounds__(256) router_sigmoid_bwd_bf16(tg_bf16* dlogits, const float* dweights,
                                                                         const float* probs, const float* weights,
                                                                         const int* experts, const float* dprobs,
                                                                         int T, int E, int K, int norm,
                                                                         float scale) {
  router_sig_bwd(dlogits, dweights, probs, weights, experts, dprobs, T, E, K, norm, scale);
}
