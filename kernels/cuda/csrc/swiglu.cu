// swiglu.cu: the SwiGLU gate of the MLP.
//
//   swiglu_fwd*:  out (N) = silu(gate (N)) · up (N),  silu(g) = g·σ(g)         (=)
//   swiglu_bwd*:  dgate (N) = dout·up·σ(g)·(1 + g·(1 − σ(g))),  dup (N) = dout·silu(g)  (=)
//
//   swiglu_rows_fwd*:  out (R,I) = the same over gu (R,2I), the gate|up GEMM's
//                      output as it lies: row r is I gate values, then I up  (=)
//   swiglu_rows_bwd*:  dgu (R,2I) = row r's dgate, then its dup, in dgu's
//                      dtype (fp32, or bf16 rounded as convert rounds)        (=)
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

// The rows forms take 8 elements of a row a step when I is a multiple of 8
// and the pointers are 16-byte aligned (then no 8 straddle a gate/up or row
// boundary), else one at a time; the arithmetic is swiglu_f's and
// swiglu_b's, element by element, so the results are theirs bit for bit.
template <class TI, class TO>
__device__ __forceinline__ void swiglu_rows_f(TO* out, const TI* gu, long long R, long long I) {
  if (I % 8 == 0 && tg_aligned16(out) && tg_aligned16(gu)) {
    const long long w8 = I / 8;
    TG_FOR(i, R * w8) {
      const long long r = i / w8, c = 8 * (i - r * w8);
      float g[8], u[8];
      ld8(gu + 2 * r * I + c, g);
      ld8(gu + 2 * r * I + I + c, u);
#pragma unroll
      for (int j = 0; j < 8; j++) g[j] = g[j] * (1.f / (1.f + expf(-g[j]))) * u[j];
      st8(out + r * I + c, g);
    }
    return;
  }
  TG_FOR(i, R * I) {
    const long long r = i / I, c = i - r * I;
    const float g = ld_f(gu, 2 * r * I + c);
    st_f(out, i, g * (1.f / (1.f + expf(-g))) * ld_f(gu, 2 * r * I + I + c));
  }
}

template <class TI, class TO>
__device__ __forceinline__ void swiglu_rows_b(TO* dgu, const float* dout, const TI* gu, long long R,
                                              long long I) {
  if (I % 8 == 0 && tg_aligned16(dgu) && tg_aligned16(dout) && tg_aligned16(gu)) {
    const long long w8 = I / 8;
    TG_FOR(i, R * w8) {
      const long long r = i / w8, c = 8 * (i - r * w8);
      float g[8], u[8], d[8], dg[8], du[8];
      ld8(gu + 2 * r * I + c, g);
      ld8(gu + 2 * r * I + I + c, u);
      ld8(dout + r * I + c, d);
#pragma unroll
      for (int j = 0; j < 8; j++) {
        const float s = 1.f / (1.f + expf(-g[j]));
        du[j] = d[j] * g[j] * s;
        dg[j] = d[j] * u[j] * s * (1.f + g[j] * (1.f - s));
      }
      st8(dgu + 2 * r * I + c, dg);
      st8(dgu + 2 * r * I + I + c, du);
    }
    return;
  }
  TG_FOR(i, R * I) {
    const long long r = i / I, c = i - r * I;
    const float g = ld_f(gu, 2 * r * I + c), u = ld_f(gu, 2 * r * I + I + c), d = dout[i];
    const float s = 1.f / (1.f + expf(-g));
    st_f(dgu, 2 * r * I + I + c, d * g * s);
    st_f(dgu, 2 * r * I + c, d * u * s * (1.f + g * (1.f - s)));
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

extern "C" __global__ void swiglu_rows_fwd(float* out, const float* gu, long long R, long long I) {
  swiglu_rows_f(out, gu, R, I);
}
extern "C" __global__ void swiglu_rows_fwd_bf16(tg_bf16* out, const tg_bf16* gu, long long R, long long I) {
  swiglu_rows_f(out, gu, R, I);
}
extern "C" __global__ void swiglu_rows_fwd_bf16_f32out(float* out, const tg_bf16* gu, long long R, long long I) {
  swiglu_rows_f(out, gu, R, I);
}
extern "C" __global__ void swiglu_rows_fwd_f32_bf16out(tg_bf16* out, const float* gu, long long R, long long I) {
  swiglu_rows_f(out, gu, R, I);
}

extern "C" __global__ void swiglu_rows_bwd(float* dgu, const float* dout, const float* gu, long long R,
                                           long long I) {
  swiglu_rows_b(dgu, dout, gu, R, I);
}
extern "C" __global__ void swiglu_rows_bwd_bf16(tg_bf16* dgu, const float* dout, const tg_bf16* gu,
                                                long long R, long long I) {
  swiglu_rows_b(dgu, dout, gu, R, I);
}
extern "C" __global__ void swiglu_rows_bwd_f32_bf16out(tg_bf16* dgu, const float* dout, const float* gu,
                                                       long long R, long long I) {
  swiglu_rows_b(dgu, dout, gu, R, I);
}
extern "C" __global__ void swiglu_rows_bwd_bf16_f32out(float* dgu, const float* dout, const tg_bf16* gu,
                                                       long long R, long long I) {
  swiglu_rows_b(dgu, dout, gu, R, I);
}
