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

// The multi-tensor step (kernels.MultiAdamW): adamw_multi_prep (one
// thread) sums the groups' squared norms in double, in index order, and
// writes state[0] = 1 and state[1] = 0 when the norm is not finite (every
// chunk then keeps its values), else 0 and state[1] = the clip factor as
// float bits,
// float(min(1, maxNorm/(norm + 1e-6))) (1 for maxNorm <= 0), and clears
// the group flags state[2..]; adamw_multi_{torch,fused,fused_bf16} run
// one block per chunk of the table (grid-stride over chunks): the chunk's
// elements updated as adamw / fused_adam update them, and state[2+group]
// set (an integer OR: any order gives the same bits) when a new weight is
// not finite or its square overflows float (|p| >= 2^64).
extern "C" __global__ void adamw_multi_prep(int* state, const float* sums, int nsums, int ngroups,
                                            double maxNorm) {
  for (int g = blockIdx.x * blockDim.x + threadIdx.x; g < ngroups; g += gridDim.x * blockDim.x) state[2 + g] = 0;
  if (blockIdx.x != 0 || threadIdx.x != 0) return;
  double s = 0.0;
  for (int i = 0; i < nsums; i++) s += (double)sums[i];
  const double norm = sqrt(s);
  if (!(norm - norm == 0.0)) {  // NaN or ±Inf
    state[0] = 1;
    state[1] = 0;
    return;
  }
  double c = 1.0;
  if (maxNorm > 0) {
    c = maxNorm / (norm + 1e-6);
    if (!(c < 1.0)) c = 1.0;
  }
  state[0] = 0;
  state[1] = (int)__float_as_uint((float)c);
}

__device__ __forceinline__ bool adamw_bad(float p) { return !(fabsf(p) < 18446744073709551616.f); }

template <int RULE, class TM>
__device__ __forceinline__ void adamw_multi(float* p, const float* grad, TM* m, TM* v, const int* table,
                                            int nchunks, int* state, float lr, float b1, float b2, float omb1,
                                            float omb2, float eps, float wd, float bc1, float bc2) {
  if (state[0] != 0) return;  // a non-finite gradient norm: no update
  const float gscale = __int_as_float(state[1]);
  for (int c = blockIdx.x; c < nchunks; c += gridDim.x) {
    const int* e = table + 4 * c;
    const long long off = (long long)(((unsigned long long)(unsigned)e[1] << 32) | (unsigned)e[0]);
    const int n = e[2], group = e[3] >> 1;
    const float w = (e[3] & 1) ? wd : 0.f;
    bool bad = false;
    for (int j = threadIdx.x; j < n; j += blockDim.x) {
      const long long i = off + j;
      if (RULE == 0) {
        const float g = grad[i] * gscale;
        const float pp = p[i] * (1.f - lr * w);
        const float mm = b1 * ld_f(m, i) + omb1 * g;
        const float vv = b2 * ld_f(v, i) + omb2 * g * g;
        st_f(m, i, mm);
        st_f(v, i, vv);
        p[i] = pp - (lr / bc1) * mm / (sqrtf(vv) / sqrtf(bc2) + eps);
      } else {
        fused_adam_elem(p, grad, m, v, i, lr, b1, b2, omb1, omb2, eps, w, bc1, bc2, gscale);
      }
      bad = bad || adamw_bad(p[i]);
    }
    if (bad) atomicOr(state + 2 + group, 1);
  }
}

extern "C" __global__ void adamw_multi_torch(float* p, const float* grad, float* m, float* v, const int* table,
                                             int nchunks, int* state, float lr, float b1, float b2, float omb1,
                                             float omb2, float eps, float wd, float bc1, float bc2) {
  adamw_multi<0>(p, grad, m, v, table, nchunks, state, lr, b1, b2, omb1, omb2, eps, wd, bc1, bc2);
}

extern "C" __global__ void adamw_multi_fused(float* p, const float* grad, float* m, float* v, const int* table,
                                             int nchunks, int* state, float lr, float b1, float b2, float omb1,
                                             float omb2, float eps, float wd, float bc1, float bc2) {
  adamw_multi<1>(p, grad, m, v, table, nchunks, state, lr, b1, b2, omb1, omb2, eps, wd, bc1, bc2);
}

extern "C" __global__ void adamw_multi_fused_bf16(float* p, const float* grad, tg_bf16* m, tg_bf16* v,
                                                  const int* table, int nchunks, int* state, float lr, float b1,
                                                  float b2, float omb1, float omb2, float eps, float wd, float bc1,
                                                  float bc2) {
  adamw_multi<1>(p, grad, m, v, table, nchunks, state, lr, b1, b2, omb1, omb2, eps, wd, bc1, bc2);
}
