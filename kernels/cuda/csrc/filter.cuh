// filter.cuh: NeMo RL's top-k/top-p filter of one row of logits, computed
// by one block of FLT_THREADS threads (kernels.TopKTopP and
// kernels.FilterCut in kernels/filter.go are the definition and the
// reference; token_logprob.cu's filtered head and sample.cu use it).
//
// The row is z_i = fl(logits[i]·scale), i < V. A token's key is its
// logit's order-preserving uint32 (−0 as +0). The kept set is a cut
// {key, id}: token i survives when key_i > key, or key_i == key and
// i ≥ id ({0, 0} keeps all).
//
//   top-k (1 ≤ k < V): tk = the k-th largest key, by a radix select of
//          four 8-bit passes over counts; K1 = {key ≥ tk}.
//   top-p (thrf = float32(1 − top_p), 0 < top_p < 1): weights
//          w_i = ⌊exp(z_i − max z)·2⁴⁰⌋ (uint64, summed exactly: any
//          order gives the same bits), S = Σ_K1 w, thr = ⌊thrf·S⌋ (an
//          integer sum exceeds thrf·S exactly when it exceeds thr); the
//          lowest key b whose weight from below exceeds thr (four 8-bit
//          passes over masses), then the first tie at b, in id order,
//          that takes it past thr. No such key (the whole of K1 at most
//          thr): the last token, the largest key's highest id.
//
// Histograms are per warp in shared memory (integer atomics, so their
// sums do not depend on the order the threads run in), merged in warp
// order. Every function here is called by all threads of the block.
#pragma once

#define FLT_THREADS 512
#define FLT_WARPS (FLT_THREADS / 32)
#define FLT_ONE 1099511627776.0  // 2^40: kernels.FixedOne

struct tg_cut {
  unsigned key;
  int id;
};

// Shared memory of the filter: 34 KB.
struct tg_filter_smem {
  unsigned long long hist[FLT_WARPS][256];  // per warp: counts or masses
  unsigned long long bin[256];              // merged
  unsigned long long u64[FLT_WARPS];        // block reductions and broadcasts
  unsigned u32[FLT_WARPS];
  int i32[FLT_WARPS];
};

__device__ __forceinline__ unsigned tg_key(float x) {
  unsigned b = __float_as_uint(x);
  if (b == 0x80000000u) b = 0;
  return (b & 0x80000000u) ? ~b : (b | 0x80000000u);
}

__device__ __forceinline__ float tg_key_value(unsigned k) {
  return __uint_as_float((k & 0x80000000u) ? (k & 0x7fffffffu) : ~k);
}

__device__ __forceinline__ bool tg_keeps(tg_cut c, int i, unsigned k) {
  return k > c.key || (k == c.key && i >= c.id);
}

// The row's logit i.
__device__ __forceinline__ float tg_z(const float* z, float scale, int i) { return __fmul_rn(z[i], scale); }

// w_i = ⌊exp(z − zmax)·2⁴⁰⌋ (kernels.FixedWeight).
__device__ __forceinline__ unsigned long long tg_weight(float z, float zmax) {
  return (unsigned long long)__dmul_rn(exp(__dsub_rn((double)z, (double)zmax)), FLT_ONE);
}

// Block reductions: every thread gets the result.
__device__ __forceinline__ unsigned tg_block_max_u32(unsigned v, tg_filter_smem* s) {
  const int lane = threadIdx.x & 31, warp = threadIdx.x >> 5;
#pragma unroll
  for (int o = 16; o > 0; o >>= 1) {
    const unsigned w = __shfl_xor_sync(TG_FULL, v, o);
    v = w > v ? w : v;
  }
  __syncthreads();  // earlier readers of s->u32 are done
  if (lane == 0) s->u32[warp] = v;
  __syncthreads();
  v = s->u32[0];
  for (int w = 1; w < FLT_WARPS; w++) v = s->u32[w] > v ? s->u32[w] : v;
  return v;
}

__device__ __forceinline__ int tg_block_max_i32(int v, tg_filter_smem* s) {
  const int lane = threadIdx.x & 31, warp = threadIdx.x >> 5;
#pragma unroll
  for (int o = 16; o > 0; o >>= 1) v = max(v, __shfl_xor_sync(TG_FULL, v, o));
  __syncthreads();
  if (lane == 0) s->i32[warp] = v;
  __syncthreads();
  v = s->i32[0];
  for (int w = 1; w < FLT_WARPS; w++) v = max(v, s->i32[w]);
  return v;
}

__device__ __forceinline__ unsigned long long tg_block_sum_u64(unsigned long long v, tg_filter_smem* s) {
  const int lane = threadIdx.x & 31, warp = threadIdx.x >> 5;
#pragma unroll
  for (int o = 16; o > 0; o >>= 1) v += __shfl_xor_sync(TG_FULL, v, o);
  __syncthreads();
  if (lane == 0) s->u64[warp] = v;
  __syncthreads();
  v = 0;
  for (int w = 0; w < FLT_WARPS; w++) v += s->u64[w];
  return v;
}

// Σ v over the block in double, in a fixed order (a butterfly in each
// warp, then the warps in order): the same bits on every run.
__device__ __forceinline__ double tg_block_sum_f64(double v, tg_filter_smem* s) {
  const int lane = threadIdx.x & 31, warp = threadIdx.x >> 5;
#pragma unroll
  for (int o = 16; o > 0; o >>= 1) v += __shfl_xor_sync(TG_FULL, v, o);
  __syncthreads();
  if (lane == 0) s->u64[warp] = (unsigned long long)__double_as_longlong(v);
  __syncthreads();
  double t = 0.0;
  for (int w = 0; w < FLT_WARPS; w++) t += __longlong_as_double((long long)s->u64[w]);
  return t;
}

// The exclusive prefix sum of v over threads in thread order.
__device__ __forceinline__ unsigned long long tg_block_exscan_u64(unsigned long long v, tg_filter_smem* s) {
  const int lane = threadIdx.x & 31, warp = threadIdx.x >> 5;
  unsigned long long x = v;
#pragma unroll
  for (int o = 1; o < 32; o <<= 1) {
    const unsigned long long y = __shfl_sync(TG_FULL, x, lane >= o ? lane - o : lane);
    if (lane >= o) x += y;
  }
  __syncthreads();
  if (lane == 31) s->u64[warp] = x;
  __syncthreads();
  unsigned long long base = 0;
  for (int w = 0; w < warp; w++) base += s->u64[w];
  return base + x - v;
}

// Clears the per-warp histograms.
__device__ __forceinline__ void tg_hist_clear(tg_filter_smem* s) {
  unsigned long long* h = &s->hist[0][0];
  __syncthreads();  // earlier readers of the histograms are done
  for (int j = threadIdx.x; j < FLT_WARPS * 256; j += FLT_THREADS) h[j] = 0;
  __syncthreads();
}

// Merges the per-warp histograms into s->bin, in warp order.
__device__ __forceinline__ void tg_hist_merge(tg_filter_smem* s) {
  __syncthreads();  // every add is done
  for (int b = threadIdx.x; b < 256; b += FLT_THREADS) {
    unsigned long long t = 0;
    for (int w = 0; w < FLT_WARPS; w++) t += s->hist[w][b];
    s->bin[b] = t;
  }
  __syncthreads();
}

// The first token, in id order, with key k at which below plus w per
// token with key k so far exceeds thr (the last such token if none does):
// each thread counts its contiguous run of ids, an exclusive scan orders
// the runs, and the run holding the crossing walks it.
__device__ __forceinline__ int tg_tie_cut(const float* z, float scale, int V, unsigned k, unsigned long long below,
                                         unsigned long long w, unsigned long long thr, tg_filter_smem* s) {
  const int run = (V + FLT_THREADS - 1) / FLT_THREADS;
  const int i0 = min(V, (int)threadIdx.x * run), i1 = min(V, i0 + run);
  unsigned long long c = 0;
  int last = -1;
  for (int i = i0; i < i1; i++)
    if (tg_key(tg_z(z, scale, i)) == k) c++, last = i;
  const unsigned long long pre = tg_block_exscan_u64(c, s);
  int found = -1;
  if (c > 0 && !(below + pre * w > thr) && below + (pre + c) * w > thr) {
    unsigned long long acc = below + pre * w;
    for (int i = i0; i < i1; i++)
      if (tg_key(tg_z(z, scale, i)) == k && (acc += w) > thr) {
        found = i;
        break;
      }
  }
  found = tg_block_max_i32(found, s);
  if (found >= 0) return found;
  return tg_block_max_i32(last, s);
}

// The row's cut under top-k k (off unless 1 ≤ k < V) and top-p (off
// unless onP; thrf = float32(1 − top_p)). maxKey is the row's largest key.
__device__ __forceinline__ tg_cut tg_filter_cut(const float* z, float scale, int V, int k, int onP, float thrf,
                                               unsigned maxKey, tg_filter_smem* s) {
  const int tid = threadIdx.x, warp = tid >> 5;
  tg_cut cut = {0u, 0};
  const bool byK = k > 0 && k < V;
  if (!byK && !onP) return cut;
  unsigned tk = 0;
  if (byK) {
    unsigned prefix = 0, mask = 0;
    long long need = k;
    for (int shift = 24; shift >= 0; shift -= 8) {
      tg_hist_clear(s);
      for (int i = tid; i < V; i += FLT_THREADS) {
        const unsigned key = tg_key(tg_z(z, scale, i));
        if ((key & mask) == prefix) atomicAdd(&s->hist[warp][(key >> shift) & 255u], 1ull);
      }
      tg_hist_merge(s);
      if (tid == 0) {
        int d = 255;
        for (; d > 0 && (long long)s->bin[d] < need; d--) need -= (long long)s->bin[d];
        s->u64[0] = (unsigned long long)d;
        s->u64[1] = (unsigned long long)need;
      }
      __syncthreads();
      const int d = (int)s->u64[0];
      need = (long long)s->u64[1];
      prefix |= (unsigned)d << shift;
      mask |= 0xffu << shift;
    }
    tk = prefix;
  }
  cut.key = tk;
  if (!onP) return cut;
  const float zmax = tg_key_value(maxKey);
  unsigned long long S = 0;
  for (int i = tid; i < V; i += FLT_THREADS) {
    const float x = tg_z(z, scale, i);
    if (tg_key(x) >= tk) S += tg_weight(x, zmax);
  }
  S = tg_block_sum_u64(S, s);
  const unsigned long long thr = (unsigned long long)__dmul_rn((double)thrf, (double)S);
  unsigned long long below = 0;
  unsigned prefix = 0, mask = 0;
  for (int shift = 24; shift >= 0; shift -= 8) {
    tg_hist_clear(s);
    for (int i = tid; i < V; i += FLT_THREADS) {
      const float x = tg_z(z, scale, i);
      const unsigned key = tg_key(x);
      if (key >= tk && (key & mask) == prefix) atomicAdd(&s->hist[warp][(key >> shift) & 255u], tg_weight(x, zmax));
    }
    tg_hist_merge(s);
    if (tid == 0) {
      int d = 0;
      for (; d < 256 && !(below + s->bin[d] > thr); d++) below += s->bin[d];
      s->u64[0] = (unsigned long long)d;
      s->u64[1] = below;
    }
    __syncthreads();
    const int d = (int)s->u64[0];
    below = s->u64[1];
    if (d == 256) {  // the whole of K1 is at most thr: keep the last token
      int last = -1;
      for (int i = tid; i < V; i += FLT_THREADS)
        if (tg_key(tg_z(z, scale, i)) == maxKey) last = max(last, i);
      cut.key = maxKey;
      cut.id = tg_block_max_i32(last, s);
      return cut;
    }
    prefix |= (unsigned)d << shift;
    mask |= 0xffu << shift;
  }
  cut.key = prefix;
  cut.id = tg_tie_cut(z, scale, V, prefix, below, tg_weight(tg_key_value(prefix), zmax), thr, s);
  return cut;
}
