// fill.cu: Fill and Scale of one buffer. (Copy, the third op of the CPU's
// fill.go, is a device-to-device cuMemcpy and needs no kernel.)
//
//   fill:   x (N) = v    (=)
//   scale:  x (N) *= s   (in place)
//
// 16-byte accesses (4 floats a thread a step) where x is 16-byte aligned,
// the tail (and an unaligned x) one float at a time.
#include "bf16.cuh"
#include "common.cuh"

extern "C" __global__ void fill(float* x, float v, long long N) {
  long long done = 0;
  if (tg_aligned16(x)) {
    const float r[4] = {v, v, v, v};
    TG_FOR(i, N / 4) st_f4(x + 4 * i, r);
    done = N / 4 * 4;
  }
  TG_FOR(k, N - done) x[done + k] = v;
}

extern "C" __global__ void scale(float* x, float s, long long N) {
  long long done = 0;
  if (tg_aligned16(x)) {
    TG_FOR(i, N / 4) {
      float r[4];
      ld4(x + 4 * i, r);
#pragma unroll
      for (int j = 0; j < 4; j++) r[j] *= s;
      st_f4(x + 4 * i, r);
    }
    done = N / 4 * 4;
  }
  TG_FOR(k, N - done) x[done + k] *= s;
}
