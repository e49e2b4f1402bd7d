// adamw.cu: one AdamW update of a flat parameter run (kernels.AdamWStep),
// under either rule of kernels.AdamRule.
//
//   adamw (torch.optim.AdamW):
//     g = grad·gscale;  p = p·(1 − lr·wd);  m = β1·m + (1−β1)·g;  v = β2·v + (1−β2)·g²
//     (1−β1 and 1−β2 come from the host, computed in double: omb1, omb2)
//     p = p − (lr/bc1) · m / (sqrt(v)/sqrt(bc2) + eps)
//   fused_adam{,_bf16} (TransformerEngine's FusedAdam, adam_w_mode; the
//   expressions of transformer_engine/common/multi_tensor/adam.cu's
//   AdamFunctor at d0067d0, lines 329-340, so that nvcc contracts them
//   alike):
//     g = grad·gscale;  m = β1·m + (1−β1)·g;  v = β2·v + (1−β2)·g·g
//     u = (m/bc1) / (sqrtf(v/bc2) + eps) + wd·p;  p = p − lr·u
//     m and v F32, or BF16 (_bf16: widened on load, the update in float32,
//     rounded to nearest even on store)
//
// param, m, v (N) are updated in place; grad (N) is read.
#include "common.cuh"
#include "bf16.cuh"

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

// One element of FusedAdam; TM is the moments' storage (float or tg_bf16).
template <class TM>
__device__ __forceinline__ void fused_adam_elem(float* p, const float* grad, TM* m, TM* v, long long i, float lr,
                                                float b1, float b2, float omb1, float omb2, float eps, float wd,
                                                float bc1, float bc2, float gscale) {
  const float g = grad[i] * gscale;
  const float pp = p[i];
  const float mm = b1 * ld_f(m, i) + omb1 * g;
  const float vv = b2 * ld_f(v, i) + omb2 * g * g;
  const float mh = mm / bc1, vh = vv / bc2;
  const float denom = sqrtf(vh) + eps;
  const float u = (mh / denom) + (wd * pp);
  p[i] = pp - (lr * u);
  st_f(m, i, mm);
  st_f(v, i, vv);
}

extern "C" __global__ void fused_adam(float* p, const float* grad, float* m, float* v, long long N, float lr,
                                      float b1, float b2, float omb1, float omb2, float eps, float wd, float bc1,
                                      float bc2, float gscale) {
  TG_FOR(i, N) fused_adam_elem(p, grad, m, v, i, lr, b1, b2, omb1, omb2, eps, wd, bc1, bc2, gscale);
}

extern "C" __global__ void fused_adam_bf16(float* p, const float* grad, tg_bf16* m, tg_bf16* v, long long N,
                                           float lr, float b1, float b2, float omb1, float omb2, float eps,
                                           float wd, float bc1, float bc2, float gscale) {
  TG_FOR(i, N) fused_adam_elem(p, grad, m, v, i, lr, b1, b2, omb1, omb2, eps, wd, bc1, bc2, gscale);
}
