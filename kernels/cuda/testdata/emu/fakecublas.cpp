// fakecublas.cpp: a CPU stand-in for libcublas exporting the calls
// kernels/cuda binds. cublasGemmEx is a plain column-major loop in double
// over fp32 or bf16 inputs (types 0 and 14) with an fp32 or bf16 result
// (bf16 rounded to nearest even, as cuBLAS does).
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

static double load(const void* p, int type, long i) {
  if (type == 0) return ((const float*)p)[i];
  uint32_t u = (uint32_t)((const uint16_t*)p)[i] << 16;
  float f;
  memcpy(&f, &u, 4);
  return f;
}

API cublasGemmEx(void*, int ta, int tb, int m, int n, int k, const void* alpha, const void* A,
                 int at, int lda, const void* B, int bt, int ldb, const void* beta, void* C, int ct,
                 int ldc, int compute, int) {
  if ((at != 0 && at != 14) || (bt != 0 && bt != 14) || (ct != 0 && ct != 14)) return 15;  // NOT_SUPPORTED
  if (compute != 68 && compute != 77) return 15;
  if (m < 0 || n < 0 || k < 0 || lda < (ta ? k : m) || ldb < (tb ? n : k) || ldc < m) return 7;
  float a = *(const float*)alpha, bb = *(const float*)beta;
  for (int j = 0; j < n; j++)
    for (int i = 0; i < m; i++) {
      double s = 0;
      for (int l = 0; l < k; l++) {
        double x = ta ? load(A, at, (long)i * lda + l) : load(A, at, (long)l * lda + i);
        double y = tb ? load(B, bt, (long)l * ldb + j) : load(B, bt, (long)j * ldb + l);
        s += x * y;
      }
      long o = (long)j * ldc + i;
      float r = (float)(a * s + (bb == 0 ? 0.0 : bb * load(C, ct, o)));
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
