// bf16.cuh: bfloat16 storage for the kernels, the same bits under nvcc and
// the CPU emulator (TG_EMU). A bf16 value is its 16 bits in an unsigned
// short; two of them packed in an unsigned (the low half is the element at
// the lower address, as in memory and in the mma fragments). Widening is
// exact; narrowing rounds to nearest even with NaN kept quiet, like
// kernels/cpu's F32ToBF16 and cast.cu.
#pragma once

typedef unsigned short tg_bf16;

// Widen bf16 bits to float (exact).
__device__ __forceinline__ float tg_widen(tg_bf16 b) {
  return __int_as_float((int)((unsigned)b << 16));
}

// The low and high bf16 halves of a packed pair, widened.
__device__ __forceinline__ float bf16_lo(unsigned x) { return __int_as_float((int)(x << 16)); }
__device__ __forceinline__ float bf16_hi(unsigned x) { return __int_as_float((int)(x & 0xffff0000u)); }

// Round float to bf16 bits, to nearest even; NaN stays a quiet NaN.
__device__ __forceinline__ tg_bf16 tg_round(float f) {
  unsigned u = __float_as_uint(f);
  if ((u & 0x7fffffffu) > 0x7f800000u) return (tg_bf16)((u >> 16) | 0x40u);
  u += 0x7fffu + ((u >> 16) & 1u);
  return (tg_bf16)(u >> 16);
}

// Two floats rounded to bf16 and packed: lo in the low half.
__device__ __forceinline__ unsigned pack_bf16x2(float lo, float hi) {
#ifdef TG_EMU
  return (unsigned)tg_round(lo) | ((unsigned)tg_round(hi) << 16);
#else
  unsigned r;
  // cvt.rn.bf16x2.f32 d, a, b puts a in the upper half (PTX ISA 7.0, sm_80).
  asm("cvt.rn.bf16x2.f32 %0, %1, %2;\n" : "=r"(r) : "f"(hi), "f"(lo));
  return r;
#endif
}

// Element i of a buffer of type T (float or tg_bf16) as float, and the
// store of a float into it (rounded for bf16): kernels templated on their
// storage type read and write through these.
__device__ __forceinline__ float ld_f(const float* p, long long i) { return p[i]; }
__device__ __forceinline__ float ld_f(const tg_bf16* p, long long i) { return tg_widen(p[i]); }
__device__ __forceinline__ void st_f(float* p, long long i, float v) { p[i] = v; }
__device__ __forceinline__ void st_f(tg_bf16* p, long long i, float v) { p[i] = tg_round(v); }

// Vector access, 8 or 4 elements at a time as floats: 16-byte loads and
// stores (two for 8 floats, one for 8 bf16; 8 bytes for 4 bf16). p must be
// aligned to the access (the launchers check and take a scalar kernel
// otherwise; the emulator aborts on a misaligned one, as a GPU faults).
__device__ __forceinline__ bool tg_aligned16(const void* p) { return ((unsigned long long)p & 15) == 0; }

#ifdef TG_EMU
#define TG_CHECK_ALIGN(p, n) tg_emu_check_align(p, n)
#else
#define TG_CHECK_ALIGN(p, n)
#endif

__device__ __forceinline__ float4 ld_f4(const float* p) {
  TG_CHECK_ALIGN(p, 16);
  return *(const float4*)p;
}
__device__ __forceinline__ void ld4(const float* p, float r[4]) {
  const float4 v = ld_f4(p);
  r[0] = v.x, r[1] = v.y, r[2] = v.z, r[3] = v.w;
}
__device__ __forceinline__ void ld4(const tg_bf16* p, float r[4]) {
  TG_CHECK_ALIGN(p, 8);
  const uint2 v = *(const uint2*)p;
  r[0] = bf16_lo(v.x), r[1] = bf16_hi(v.x), r[2] = bf16_lo(v.y), r[3] = bf16_hi(v.y);
}
__device__ __forceinline__ void st_f4(float* p, const float r[4]) {
  TG_CHECK_ALIGN(p, 16);
  float4 v;
  v.x = r[0], v.y = r[1], v.z = r[2], v.w = r[3];
  *(float4*)p = v;
}
__device__ __forceinline__ void st_f4(tg_bf16* p, const float r[4]) {
  TG_CHECK_ALIGN(p, 8);
  uint2 v;
  v.x = pack_bf16x2(r[0], r[1]), v.y = pack_bf16x2(r[2], r[3]);
  *(uint2*)p = v;
}
__device__ __forceinline__ void ld8(const float* p, float r[8]) {
  ld4(p, r);
  ld4(p + 4, r + 4);
}
__device__ __forceinline__ void ld8(const tg_bf16* p, float r[8]) {
  TG_CHECK_ALIGN(p, 16);
  const uint4 v = *(const uint4*)p;
  r[0] = bf16_lo(v.x), r[1] = bf16_hi(v.x), r[2] = bf16_lo(v.y), r[3] = bf16_hi(v.y);
  r[4] = bf16_lo(v.z), r[5] = bf16_hi(v.z), r[6] = bf16_lo(v.w), r[7] = bf16_hi(v.w);
}
__device__ __forceinline__ void st8(float* p, const float r[8]) {
  st_f4(p, r);
  st_f4(p + 4, r + 4);
}
__device__ __forceinline__ void st8(tg_bf16* p, const float r[8]) {
  TG_CHECK_ALIGN(p, 16);
  uint4 v;
  v.x = pack_bf16x2(r[0], r[1]), v.y = pack_bf16x2(r[2], r[3]);
  v.z = pack_bf16x2(r[4], r[5]), v.w = pack_bf16x2(r[6], r[7]);
  *(uint4*)p = v;
}
