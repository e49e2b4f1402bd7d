// fill.cu: Fill and Scale of one buffer. (Copy, the third op of the CPU's
// fill.go, is a device-to-device cuMemcpy and needs no kernel.)
//
//   fill:   x (N) = v    (=)
//   scale:  x (N) *= s   (in place)
#include "common.cuh"

extern "C" __global__ void fill(float* x, float v, long long N) {
  TG_FOR(i, N) x[i] = v;
}

extern "C" __global__ void scale(float* x, float s, long long N) {
  TG_FOR(i, N) x[i] *= s;
}
