// swiglu.cu: the SwiGLU gate of the MLP.
//
//   swiglu_fwd*:  out (N) = silu(gate (N)) · up (N),  silu(g) = g·σ(g)         (=)
//   swiglu_bwd*:  dgate (N) = dout·up·σ(g)·(1 + g·(1 − σ(g))),  dup (N) = dout·silu(g)  (=)
//
// gate and up are fp32 or bf16 (the fused gate|up GEMM's output under mixed
// precision), out fp32 or bf16 (the down projection's input); dout, dgate
// and dup are fp32. Each kernel takes 8 elements per step with 16-byte
// accesses when every pointer is 16-byte aligned (checked here, the same for
// every thread), then finishes the tail one element at a time.
#include "bf16.cuh"
#include "common.cuh"

template <class TI, class TO>
__device__ __forceinline__ void swiglu_f(TO* out, const TI* gate, const TI* up, long long N) {
  long long done = 0;
  if (tg_aligned16(out) && tg_aligned16(gate) && tg_aligned16(up)) {
    const long long n8 = N / 8;
    TG_FOR(i, n8) {
      float g[8], u[8];
      ld8(gate + 8 * i, g);
      ld8(up + 8 * i, u);
#pragma unroll
      for (int j = 0; j < 8; j++) g[j] = g[j] * (1.f / (1.f + expf(-g[j]))) * u[j];
      st8(out + 8 * i, g);
    }
    done = 8 * n8;
  }
  TG_FOR(k, N - done) {
    const long long i = done + k;
    const float g = ld_f(gate, i);
    st_f(out, i, g * (1.f / (1.f + expf(-g))) * ld_f(up, i));
  }
}

template <class TI>
__device__ __forceinline__ void swiglu_b(float* dgate, float* dup, const float* dout, const TI* gate,
                                         const TI* up, long long N) {
  long long done = 0;
  if (tg_aligned16(dgate) && tg_aligned16(dup) && tg_aligned16(dout) && tg_aligned16(gate) &&
      tg_aligned16(up)) {
    const long long n8 = N / 8;
    TG_FOR(i, n8) {
      float g[8], u[8], d[8], dg[8], du[8];
      ld8(gate + 8 * i, g);
      ld8(up + 8 * i, u);
      ld8(dout + 8 * i, d);
#pragma unroll
      for (int j = 0; j < 8; j++) {
        const float s = 1.f / (1.f + expf(-g[j]));
        du[j] = d[j] * g[j] * s;
        dg[j] = d[j] * u[j] * s * (1.f + g[j] * (1.f - s));
      }
      st8(dgate + 8 * i, dg);
      st8(dup + 8 * i, du);
    }
    done = 8 * n8;
  }
  TG_FOR(k, N - done) {
    const long long i = done + k;
    const float g = ld_f(gate, i), u = ld_f(up, i), d = dout[i];
    const float s = 1.f / (1.f + expf(-g));
    dup[i] = d * g * s;
    dgate[i] = d * u * s * (1.f + g * (1.f - s));
  }
}

extern "C" __global__ void swiglu_fwd(float* out, const float* gate, const float* up, long long N) {
  swiglu_f(out, gate, up, N);
}
extern "C" __global__ void swiglu_fwd_bf16(tg_bf16* out, const tg_bf16* gate, const tg_bf16* up, long long N) {
  swiglu_f(out, gate, up, N);
}
extern "C" __global__ void swiglu_fwd_bf16_f32out(float* out, const tg_bf16* gate, const tg_bf16* up,
                                                  long long N) {
  swiglu_f(out, gate, up, N);
}
extern "C" __global__ void swiglu_fwd_f32_bf16out(tg_bf16* out, const float* gate, const float* up,
                                                  long long N) {
  swiglu_f(out, gate, up, N);
}

extern "C" __global__ void swiglu_bwd(float* dgate, float* dup, const float* dout, const float* gate,
                                      const float* up, long long N) {
  swiglu_b(dgate, dup, dout, gate, up, N);
}
extern "C" __global__ void swiglu_bwd_bf16(float* dgate, float* dup, const float* dout,
                                           const tg_bf16* gate, const tg_bf16* up, long long N) {
  swiglu_b(dgate, dup, dout, gate, up, N);
}
