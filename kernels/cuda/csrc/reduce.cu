// reduce.cu: SumSquares, out (1) = Σ x² over x (N), accumulated in double.
//
// sum_squares_partial runs on a fixed grid of TG_REDUCE_BLOCKS blocks of
// TG_REDUCE_THREADS threads (set by the launcher, never by the device), each
// thread summing a fixed grid-stride subset in order and each block combining
// its threads by a fixed tree; sum_squares_final combines the block partials
// the same way. The order depends only on N: deterministic run to run and
// device to device.
#include "common.cuh"

#define TG_REDUCE_THREADS 256

__device__ __forceinline__ double block_tree_sum(double v, double* buf) {
  int t = threadIdx.x;
  buf[t] = v;
  __syncthreads();
  for (int s = TG_REDUCE_THREADS / 2; s > 0; s >>= 1) {
    if (t < s) buf[t] += buf[t + s];
    __syncthreads();
  }
  return buf[0];
}

extern "C" __global__ void __launch_bounds__(TG_REDUCE_THREADS)
    sum_squares_partial(double* partials, const float* x, long long N) {
  __shared__ double buf[TG_REDUCE_THREADS];
  double s = 0;
  TG_FOR(i, N) {
    double v = x[i];
    s += v * v;
  }
  double total = block_tree_sum(s, buf);
  if (threadIdx.x == 0) partials[blockIdx.x] = total;
}

extern "C" __global__ void __launch_bounds__(TG_REDUCE_THREADS)
    sum_squares_final(float* out, const double* partials, int nparts) {
  __shared__ double buf[TG_REDUCE_THREADS];
  double s = 0;
  for (int i = threadIdx.x; i < nparts; i += TG_REDUCE_THREADS) s += partials[i];
  double total = block_tree_sum(s, buf);
  if (threadIdx.x == 0) out[0] = (float)total;
}
