// bias.cu: the bias of a Hugging Face Linear (Qwen2's q/k/v projections).
//
//   add_bias:              out (T,OC) += bias (OC) on every row                    (+=)
//   bias_backward_partial: partials (nchunks, OC) = Σ over each chunk of
//                          TG_BIAS_ROWS rows of dout (T,OC)                        (=)
//   bias_backward_reduce:  dbias (OC) += Σ_chunks partials, in chunk order         (+=)
//
// The backward pass is deterministic: block b of bias_backward_partial owns
// a tile of 32 columns and one chunk of rows; its 8 warps each sum every 8th
// row of the chunk in row order, and the 8 sums are added in warp order. The
// chunk size and the order do not depend on the device.
#include "common.cuh"

#define TG_BIAS_ROWS 256

extern "C" __global__ void add_bias(float* out, const float* bias, int T, int OC) {
  TG_FOR(i, (long long)T * OC) out[i] += bias[i % OC];
}

// Launched with 256 threads and tiles × nchunks blocks, tiles = ceil(OC/32).
extern "C" __global__ void bias_backward_partial(float* partials, const float* dout, int T, int OC) {
  __shared__ float sums[8][32];
  int tiles = (OC + 31) / 32;
  int tile = blockIdx.x % tiles, chunk = blockIdx.x / tiles;
  int lane = threadIdx.x & 31, r = threadIdx.x >> 5;
  int c = tile * 32 + lane;
  int lo = chunk * TG_BIAS_ROWS, hi = min(lo + TG_BIAS_ROWS, T);
  float s = 0.f;
  if (c < OC) {
    for (int t = lo + r; t < hi; t += 8) s += dout[(long long)t * OC + c];
  }
  sums[r][lane] = s;
  __syncthreads();
  if (r == 0 && c < OC) {
    float total = 0.f;
    for (int k = 0; k < 8; k++) total += sums[k][lane];
    partials[(long long)chunk * OC + c] = total;
  }
}

extern "C" __global__ void bias_backward_reduce(float* dbias, const float* partials, int nchunks, int OC) {
  TG_FOR(c, OC) {
    float s = 0.f;
    for (int k = 0; k < nchunks; k++) s += partials[(long long)k * OC + c];
    dbias[c] += s;
  }
}
