// residual.cu: elementwise sums of the residual stream.
//
//   add:         out (N) = a (N) + b (N)   (=, out may alias a or b)
//   accumulate:  dst (N) += src (N)        (+=)
#include "common.cuh"

extern "C" __global__ void add(float* out, const float* a, const float* b, long long N) {
  TG_FOR(i, N) out[i] = a[i] + b[i];
}

extern "C" __global__ void accumulate(float* dst, const float* src, long long N) {
  TG_FOR(i, N) dst[i] += src[i];
}
