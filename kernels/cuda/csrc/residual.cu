// residual.cu: elementwise sums of the residual stream.
//
//   add:         out (N) = a (N) + b (N)   (=, out may alias a or b)
//   accumulate:  dst (N) += src (N)        (+=)
//
// 4 elements per step with 16-byte accesses when every pointer is 16-byte
// aligned (checked here, the same for every thread), then the tail.
#include "bf16.cuh"
#include "common.cuh"

extern "C" __global__ void add(float* out, const float* a, const float* b, long long N) {
  long long done = 0;
  if (tg_aligned16(out) && tg_aligned16(a) && tg_aligned16(b)) {
    TG_FOR(i, N / 4) {
      float x[4], y[4];
      ld4(a + 4 * i, x);
      ld4(b + 4 * i, y);
#pragma unroll
      for (int j = 0; j < 4; j++) x[j] += y[j];
      st_f4(out + 4 * i, x);
    }
    done = N / 4 * 4;
  }
  TG_FOR(k, N - done) out[done + k] = a[done + k] + b[done + k];
}

extern "C" __global__ void accumulate(float* dst, const float* src, long long N) {
  long long done = 0;
  if (tg_aligned16(dst) && tg_aligned16(src)) {
    TG_FOR(i, N / 4) {
      float x[4], y[4];
      ld4(dst + 4 * i, x);
      ld4(src + 4 * i, y);
#pragma unroll
      for (int j = 0; j < 4; j++) x[j] += y[j];
      st_f4(dst + 4 * i, x);
    }
    done = N / 4 * 4;
  }
  TG_FOR(k, N - done) dst[done + k] += src[done + k];
}
