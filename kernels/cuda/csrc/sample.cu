// sample.cu: the next token of each decoded row, drawn on the device
// (kernels.TokenSampler; the reference is kernels/cpu/sample.go).
//
//   sample_tokens: tokens (B) I32 =, logprobs (B) F32 = from logits (B,V) F32
//     and u (2B) I32 (row b's uniform in [0,1) as float64 bits, low word
//     first), in float64:
//       p_i = exp((z_i − max z)/T)
//       K   = every token, or the top-k by (p desc, id asc), then the shortest
//             prefix in that order whose Σ p reaches topP·Σ p
//       tok = first i ∈ K in id order with Σ_{j∈K, j≤i} p_j > u·Σ_K p
//             (the last of K if rounding leaves none)
//       logprob = log(p_tok / Σ_K p);  T = 0: the argmax, logprob 0.
//
// One block of 512 threads per row; no scratch. The kept set is described
// by thresholds instead of a sort: with key(p) the bits of p as a float64
// (ordered as p for p ≥ 0),
//   top-k: tk = the largest key with #{key ≥ tk} ≥ k (bisection over keys),
//          then ik = the id of the (k − #{key > tk})-th token with key tk
//          in id order (bisection over ids): K1 = {key > tk} ∪ {key = tk,
//          id ≤ ik}, exactly the first k of the (p desc, id asc) order;
//   top-p: tp = the largest key with Σ_{K1, key ≥ tp} p ≥ topP·Σ_{K1} p, then
//          ip = the first id at which Σ_{K1, key > tp} p plus the ties at tp
//          up to it reaches the target: K = K1 ∩ ({key > tp} ∪ {key = tp,
//          id ≤ ip}).
// Every sum is a fixed tree over the block (deterministic); the draw walks
// each thread's contiguous run of ids after an exclusive scan of the runs'
// sums. The float64 sums run in another order than the reference's, so
// the two agree on the token unless u·Σ lands within rounding of a boundary.
#include "common.cuh"

#define SMP_THREADS 512
#define SMP_WARPS (SMP_THREADS / 32)

// Σ v over the block, every thread gets it (a fixed butterfly and a fixed
// order over warps).
template <class T>
__device__ __forceinline__ T smp_sum(T v, T* sm) {
  const int lane = threadIdx.x & 31, warp = threadIdx.x >> 5;
#pragma unroll
  for (int o = 16; o > 0; o >>= 1) v += __shfl_xor_sync(TG_FULL, v, o);
  __syncthreads();  // earlier readers of sm are done
  if (lane == 0) sm[warp] = v;
  __syncthreads();
  T s = 0;
  for (int w = 0; w < SMP_WARPS; w++) s += sm[w];
  return s;
}

// The exclusive prefix sum of v over threads in thread order.
__device__ __forceinline__ double smp_exscan(double v, double* sm) {
  const int lane = threadIdx.x & 31, warp = threadIdx.x >> 5;
  double x = v;
#pragma unroll
  for (int o = 1; o < 32; o <<= 1) {
    const double y = __shfl_sync(TG_FULL, x, lane >= o ? lane - o : lane);
    if (lane >= o) x += y;
  }
  double ex = __shfl_sync(TG_FULL, x, lane > 0 ? lane - 1 : 0);
  if (lane == 0) ex = 0.0;
  __syncthreads();
  if (lane == 31) sm[warp] = x;
  __syncthreads();
  double base = 0.0;
  for (int w = 0; w < warp; w++) base += sm[w];
  return base + ex;
}

// The largest z and the lowest id holding it.
__device__ __forceinline__ void smp_argmax(float& v, int& i, float* sv, int* si) {
  const int lane = threadIdx.x & 31, warp = threadIdx.x >> 5;
#pragma unroll
  for (int o = 16; o > 0; o >>= 1) {
    const float ov = __shfl_xor_sync(TG_FULL, v, o);
    const int oi = __shfl_xor_sync(TG_FULL, i, o);
    if (ov > v || (ov == v && oi < i)) v = ov, i = oi;
  }
  __syncthreads();
  if (lane == 0) sv[warp] = v, si[warp] = i;
  __syncthreads();
  v = sv[0], i = si[0];
  for (int w = 1; w < SMP_WARPS; w++)
    if (sv[w] > v || (sv[w] == v && si[w] < i)) v = sv[w], i = si[w];
}

__device__ __forceinline__ unsigned long long smp_key(double p) {
  return (unsigned long long)__double_as_longlong(p);
}

extern "C" __global__ void __launch_bounds__(SMP_THREADS)
    sample_tokens(int* tokens, float* logprobs, const float* logits, const int* u, int V,
                  float temperature, int topK, float topP) {
  __shared__ double sd[SMP_WARPS];
  __shared__ long long sl[SMP_WARPS];
  __shared__ float sf[SMP_WARPS];
  __shared__ int si[SMP_WARPS];
  const int row = blockIdx.x, tid = threadIdx.x;
  const float* z = logits + (long long)row * V;
  float best = -TG_INF;
  int bi = V;
  for (int i = tid; i < V; i += SMP_THREADS)
    if (z[i] > best || bi == V) best = z[i], bi = i;  // ids rise along the loop: the first maximum
  smp_argmax(best, bi, sf, si);
  if (temperature == 0.f) {
    if (tid == 0) tokens[row] = bi, logprobs[row] = 0.f;
    return;
  }
  const double zmax = (double)best, inv = 1.0 / (double)temperature;
  auto P = [&](int i) { return exp(((double)z[i] - zmax) * inv); };
  const bool byK = topK > 0 && topK < V, byP = topP > 0.f && topP < 1.f;
  const unsigned long long top = smp_key(1.0) + 1;  // p ≤ 1: every key is below
  // K1: the top k.
  unsigned long long tk = 0;
  int ik = V - 1;
  if (byK) {
    unsigned long long lo = 0, hi = top;
    long long chi = 0;  // #{key ≥ hi}
    while (hi - lo > 1) {
      const unsigned long long mid = lo + (hi - lo) / 2;
      long long c = 0;
      for (int i = tid; i < V; i += SMP_THREADS) c += smp_key(P(i)) >= mid;
      c = smp_sum(c, sl);
      if (c >= topK) lo = mid;
      else hi = mid, chi = c;
    }
    tk = lo;
    const long long need = topK - chi;  // ties at tk to keep, lowest ids first
    int ilo = -1, ihi = V - 1;
    while (ihi - ilo > 1) {
      const int mid = ilo + (ihi - ilo) / 2;
      long long c = 0;
      for (int i = tid; i <= mid; i += SMP_THREADS) c += smp_key(P(i)) == tk;
      c = smp_sum(c, sl);
      if (c >= need) ihi = mid;
      else ilo = mid;
    }
    ik = ihi;
  }
  auto inK1 = [&](int i, unsigned long long k) { return !byK || k > tk || (k == tk && i <= ik); };
  // K: the top-p prefix of K1.
  unsigned long long tp = 0;
  int ip = V - 1;
  if (byP) {
    double m = 0.0;
    for (int i = tid; i < V; i += SMP_THREADS) {
      const double p = P(i);
      if (inK1(i, smp_key(p))) m += p;
    }
    const double target = (double)topP * smp_sum(m, sd);
    unsigned long long lo = 0, hi = top;
    double mhi = 0.0;  // Σ_{K1, key ≥ hi} p
    while (hi - lo > 1) {
      const unsigned long long mid = lo + (hi - lo) / 2;
      double s = 0.0;
      for (int i = tid; i < V; i += SMP_THREADS) {
        const double p = P(i);
        const unsigned long long k = smp_key(p);
        if (k >= mid && inK1(i, k)) s += p;
      }
      s = smp_sum(s, sd);
      if (s >= target) lo = mid;
      else hi = mid, mhi = s;
    }
    tp = lo;
    int ilo = -1, ihi = V - 1;
    while (ihi - ilo > 1) {
      const int mid = ilo + (ihi - ilo) / 2;
      double s = 0.0;
      for (int i = tid; i <= mid; i += SMP_THREADS) {
        const double p = P(i);
        const unsigned long long k = smp_key(p);
        if (k == tp && inK1(i, k)) s += p;
      }
      if (mhi + smp_sum(s, sd) >= target) ihi = mid;
      else ilo = mid;
    }
    ip = ihi;
  }
  auto inK = [&](int i, unsigned long long k) {
    return inK1(i, k) && (!byP || k > tp || (k == tp && i <= ip));
  };
  // The draw: each thread's contiguous run of ids, in id order.
  const int run = (V + SMP_THREADS - 1) / SMP_THREADS, i0 = min(V, tid * run), i1 = min(V, i0 + run);
  double s = 0.0;
  int last = -1;
  for (int i = i0; i < i1; i++) {
    const double p = P(i);
    if (inK(i, smp_key(p))) s += p, last = i;
  }
  const double sum = smp_sum(s, sd);
  const double target = __longlong_as_double((long long)(((unsigned long long)(unsigned)u[2 * row + 1] << 32) |
                                                         (unsigned)u[2 * row])) *
                        sum;
  const double pre = smp_exscan(s, sd);
  int cand = V;
  double acc = 0.0;
  for (int i = i0; i < i1 && cand == V; i++) {
    const double p = P(i);
    if (!inK(i, smp_key(p))) continue;
    acc += p;
    if (target < pre + acc) cand = i;
  }
  // The first candidate, else the last kept id.
  float fc = -(float)cand;
  int ic = cand;
  smp_argmax(fc, ic, sf, si);
  float fl = (float)last;
  int il = last;
  smp_argmax(fl, il, sf, si);
  const int tok = ic < V ? ic : il;
  if (tid == 0) {
    tokens[row] = tok;
    logprobs[row] = (float)log(P(tok) / sum);
  }
}
