// fakecublas.cpp: a CPU stand-in for libcublas exporting the calls
// kernels/cuda binds. cublasGemmEx is a plain column-major loop over fp32 or
// bf16 inputs (types 0 and 14) with an fp32 or bf16 result (bf16 rounded to
// nearest even, as cuBLAS does). It accumulates in fp32, one product at a
// time (each product and each sum rounded to fp32), as cuBLAS's CUBLAS_COMPUTE_32F kernels accumulate in fp32 (in
// blocked orders whose error is no larger than this sequential sum's); in
// CUBLAS_COMPUTE_32F_FAST_TF32 mode it first rounds fp32 inputs to TF32's
// 10 mantissa bits (to nearest, ties away, as cvt.rna.tf32.f32), as the
// tensor cores see them. So the emulator's GEMMs are no more exact than a
// GPU's, and a tolerance measured on them is not tighter than a GPU needs.
#include <cstdint>
#include <cstdio>
#include <cstring>

#define API extern "C" __attribute__((visibility("default"))) int

API cublasCreate_v2(void** h) {
  static int handle;
  *h = &handle;
  return 0;
}
API cublasDestroy_v2(void*) { return 0; }
API cublasSetStream_v2(void*, void*) { return 0; }
API cublasGetVersion_v2(void*, int* v) {
  *v = 110000;
  return 0;
}

enum { kCompute32F = 68, kCompute32FFastTF32 = 77 };

// tf32 rounds an fp32 value to 10 mantissa bits, to nearest with ties away
// from zero (adding half of the dropped 13 bits' range to the magnitude);
// infinities and NaN pass unchanged.
static float tf32(float x) {
  uint32_t u;
  memcpy(&u, &x, 4);
  if ((u & 0x7f800000u) != 0x7f800000u) {
    u += 0x1000u;
    u &= 0xffffe000u;
  }
  memcpy(&x, &u, 4);
  return x;
}

static float load(const void* p, int type, long i, bool tf) {
  if (type == 0) return tf ? tf32(((const float*)p)[i]) : ((const float*)p)[i];
  uint32_t u = (uint32_t)((const uint16_t*)p)[i] << 16;
  float f;
  memcpy(&f, &u, 4);
  return f;
}

API cublasGemmEx(void*, int ta, int tb, int m, int n, int k, const void* alpha, const void* A,
                 int at, int lda, const void* B, int bt, int ldb, const void* beta, void* C, int ct,
                 int ldc, int compute, int) {
  if ((at != 0 && at != 14) || (bt != 0 && bt != 14) || (ct != 0 && ct != 14)) return 15;  // NOT_SUPPORTED
  if (compute != kCompute32F && compute != kCompute32FFastTF32) return 15;
  const bool tf = compute == kCompute32FFastTF32;
  if (m < 0 || n < 0 || k < 0 || lda < (ta ? k : m) || ldb < (tb ? n : k) || ldc < m) return 7;
  float a = *(const float*)alpha, bb = *(const float*)beta;
  for (int j = 0; j < n; j++)
    for (int i = 0; i < m; i++) {
      float s = 0;
      for (int l = 0; l < k; l++) {
        float x = ta ? load(A, at, (long)i * lda + l, tf) : load(A, at, (long)l * lda + i, tf);
        float y = tb ? load(B, bt, (long)l * ldb + j, tf) : load(B, bt, (long)j * ldb + l, tf);
        s += x * y;
      }
      long o = (long)j * ldc + i;
      float r = a * s + (bb == 0 ? 0.0f : bb * load(C, ct, o, false));
      if (ct == 0) {
        ((float*)C)[o] = r;
      } else {
        uint32_t u;
        memcpy(&u, &r, 4);
        u += 0x7fffu + ((u >> 16) & 1u);
        ((uint16_t*)C)[o] = (uint16_t)(u >> 16);
      }
    }
  return 0;
}
