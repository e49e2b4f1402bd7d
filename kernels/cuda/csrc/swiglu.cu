// swiglu.cu: the SwiGLU gate of the MLP.
//
//   swiglu_fwd:  out (N) = silu(gate (N)) · up (N),  silu(g) = g·σ(g)          (=)
//   swiglu_bwd:  dgate (N) = dout·up·σ(g)·(1 + g·(1 − σ(g))),  dup (N) = dout·silu(g)  (=)
#include "common.cuh"

extern "C" __global__ void swiglu_fwd(float* out, const float* gate, const float* up, long long N) {
  TG_FOR(i, N) {
    float g = gate[i];
    float s = 1.f / (1.f + expf(-g));
    out[i] = g * s * up[i];
  }
}

extern "C" __global__ void swiglu_bwd(float* dgate, float* dup, const float* dout,
                                      const float* gate, const float* up, long long N) {
  TG_FOR(i, N) {
    float g = gate[i], u = up[i], d = dout[i];
    float s = 1.f / (1.f + expf(-g));
    dup[i] = d * g * s;
    dgate[i] = d * u * s * (1.f + g * (1.f - s));
  }
}
