// scatter.cu: ScatterRows.
//
//   scatter_rows:  dst[idx[i], :] = src[i, :]   for src (N,W), idx (N), dst (R,W)   (=)
//
// An index outside [0, R) writes nothing and sets TG_ERR_SCATTER in flags.
// Two rows with the same index race (the interface leaves that undefined).
#include "common.cuh"

extern "C" __global__ void scatter_rows(float* dst, const float* src, const int* idx, int N,
                                        int W, int R, int* flags) {
  TG_FOR(i, (long long)N * W) {
    int r = (int)(i / W), c = (int)(i % W);
    int d = idx[r];
    if (d < 0 || d >= R) {
      if (c == 0) atomicOr(flags, TG_ERR_SCATTER);
    } else {
      dst[(long long)d * W + c] = src[i];
    }
  }
}
