// sample.cu: the next token of each decoded row, drawn on the device
// (kernels.TokenSampler; the reference is kernels.SampleRow, which
// kernels/cpu/sample.go runs).
//
//   sample_tokens: tokens (B) I32 =, logprobs (B) F32 = from logits (B,V) F32
//     and u (2B) I32 (row b's uniform in [0,1) as float64 bits, low word
//     first):
//       z'_i = fl(z_i · invTemp)           (invTemp = float32(1/T), as the LM head)
//       K    = the tokens NeMo RL's top-k/top-p filter keeps of z' (filter.cuh)
//       w_i  = ⌊exp(z'_i − max z')·2⁴⁰⌋   (uint64; the sums are exact)
//       tok  = first i ∈ K in id order with Σ_{j∈K, j≤i} w_j > u·Σ_K w
//              (the last of K if none)
//       logprob = (z'_tok − max z') − log Σ_K exp(z'_j − max z')  (double)
//     T = 0: the argmax (lowest id among equal maxima), logprob 0.
//
// One block of FLT_THREADS threads per row. The selection is filter.cuh's
// radix select over the row (no bisection over the whole vocabulary);
// the draw walks each thread's contiguous run of ids after an exclusive
// scan of the runs' weights. The weights' sums are exact integers, so the
// token is the reference's; the logprob's double sum runs in a fixed tree.
#include "common.cuh"
#include "filter.cuh"

// The largest z and the lowest id holding it.
__device__ __forceinline__ void smp_argmax(float& v, int& i, tg_filter_smem* s) {
  const int lane = threadIdx.x & 31, warp = threadIdx.x >> 5;
#pragma unroll
  for (int o = 16; o > 0; o >>= 1) {
    const float ov = __shfl_xor_sync(TG_FULL, v, o);
    const int oi = __shfl_xor_sync(TG_FULL, i, o);
    if (ov > v || (ov == v && oi < i)) v = ov, i = oi;
  }
  __syncthreads();
  if (lane == 0) s->u32[warp] = __float_as_uint(v), s->i32[warp] = i;
  __syncthreads();
  v = __uint_as_float(s->u32[0]), i = s->i32[0];
  for (int w = 1; w < FLT_WARPS; w++) {
    const float sv = __uint_as_float(s->u32[w]);
    if (sv > v || (sv == v && s->i32[w] < i)) v = sv, i = s->i32[w];
  }
}

extern "C" __global__ void __launch_bounds__(FLT_THREADS)
    sample_tokens(int* tokens, float* logprobs, const float* logits, const int* u, int V, float temperature,
                  float invTemp, int topK, int onP, float thrf) {
  __shared__ tg_filter_smem s;
  const int row = blockIdx.x, tid = threadIdx.x;
  const float* z = logits + (long long)row * V;
  if (temperature == 0.f) {
    float best = -TG_INF;
    int bi = V;
    for (int i = tid; i < V; i += FLT_THREADS)
      if (z[i] > best || bi == V) best = z[i], bi = i;  // ids rise along the loop: the first maximum
    smp_argmax(best, bi, &s);
    if (tid == 0) tokens[row] = bi, logprobs[row] = 0.f;
    return;
  }
  unsigned mk = 0;
  for (int i = tid; i < V; i += FLT_THREADS) {
    const unsigned k = tg_key(tg_z(z, invTemp, i));
    mk = k > mk ? k : mk;
  }
  mk = tg_block_max_u32(mk, &s);
  const tg_cut c = tg_filter_cut(z, invTemp, V, topK, onP, thrf, mk, &s);
  const float zmax = tg_key_value(mk);
  // Each thread's contiguous run of ids.
  const int run = (V + FLT_THREADS - 1) / FLT_THREADS, i0 = min(V, tid * run), i1 = min(V, i0 + run);
  unsigned long long w = 0;
  double e = 0.0;
  int last = -1;
  for (int i = i0; i < i1; i++) {
    const float x = tg_z(z, invTemp, i);
    if (tg_keeps(c, i, tg_key(x))) {
      w += tg_weight(x, zmax);
      e += exp(__dsub_rn((double)x, (double)zmax));
      last = i;
    }
  }
  const double sum = tg_block_sum_f64(e, &s);
  const unsigned long long S = tg_block_sum_u64(w, &s);
  const unsigned long long pre = tg_block_exscan_u64(w, &s);
  const double ud =
      __longlong_as_double((long long)(((unsigned long long)(unsigned)u[2 * row + 1] << 32) | (unsigned)u[2 * row]));
  const unsigned long long target = (unsigned long long)__dmul_rn(ud, (double)S);
  int cand = -1;
  unsigned long long acc = pre;
  if (pre + w > target) {  // the crossing is in this run
    for (int i = i0; i < i1; i++) {
      const float x = tg_z(z, invTemp, i);
      if (!tg_keeps(c, i, tg_key(x))) continue;
      acc += tg_weight(x, zmax);
      if (acc > target) {
        cand = i;
        break;
      }
    }
  }
  // The first run holding the crossing: the lowest candidate.
  const int first = -tg_block_max_i32(cand >= 0 ? -cand : -V, &s);
  const int tok = first < V ? first : tg_block_max_i32(last, &s);
  if (tid == 0) {
    tokens[row] = tok;
    logprobs[row] = (float)(__dsub_rn((double)tg_z(z, invTemp, tok), (double)zmax) - log(sum));
  }
}
