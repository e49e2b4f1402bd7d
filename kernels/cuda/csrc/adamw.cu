// adamw.cu: one AdamW update of a flat parameter run (kernels.AdamWStep):
//
//   g = grad·gscale;  p = p·(1 − lr·wd);  m = β1·m + (1−β1)·g;  v = β2·v + (1−β2)·g²
//   (1−β1 and 1−β2 come from the host, computed in double: omb1, omb2)
//   p = p − (lr/bc1) · m / (sqrt(v)/sqrt(bc2) + eps)
//
// param, m, v (N) are updated in place; grad (N) is read.
#include "common.cuh"

extern "C" __global__ void adamw(float* p, const float* grad, float* m, float* v, long long N,
                                 float lr, float b1, float b2, float omb1, float omb2, float eps,
                                 float wd, float bc1,
                                 float bc2, float gscale) {
  float decay = 1.f - lr * wd;
  float step = lr / bc1;
  float sbc2 = sqrtf(bc2);
  TG_FOR(i, N) {
    float g = grad[i] * gscale;
    float pp = p[i] * decay;
    float mm = b1 * m[i] + omb1 * g;
    float vv = b2 * v[i] + omb2 * g * g;
    m[i] = mm;
    v[i] = vv;
    p[i] = pp - step * mm / (sqrtf(vv) / sbc2 + eps);
  }
}
