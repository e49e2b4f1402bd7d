// fakecublaslt.cpp: a CPU stand-in for libcublasLt exporting the calls
// kernels/cuda binds (blaslt.go). cublasLtMatmul computes column-major
// D = alpha·op(A)·op(B) + beta·C over fp32 or bf16 inputs (types 0 and 14)
// with an fp32 or bf16 C and D (bf16 rounded to nearest even), each product
// and sum rounded to fp32, as fakecublas.cpp's cublasGemmEx does (and TF32
// inputs under CUBLAS_COMPUTE_32F_FAST_TF32), so an algorithm of one split
// gives GemmEx's bits.
//
// Like the real library's, its algorithms differ in summation order: an
// algorithm splits K into s = 1, 2 or 4 contiguous ranges (split-K), each
// summed in order into fp32 partials kept in the caller's workspace
// (4·m·n·s bytes: an algorithm that needs more than the preference's
// MAX_WORKSPACE_BYTES is not offered), then adds the partials in range
// order. Which algorithm the heuristic offers first rotates with every
// query on a handle, so a caller that asks again for a GEMM it has run
// gets other bits: only a caller that keeps its first answer reruns
// bitwise. cublasLtMatmul refuses a null algorithm and a workspace smaller
// than its algorithm needs.
#include <cstdint>
#include <cstdio>
#include <cstring>

#define API extern "C" __attribute__((visibility("default"))) int

enum { kOK = 0, kInvalid = 7, kNotSupported = 15 };
enum { kCompute32F = 68, kCompute32FFastTF32 = 77 };
enum { kTransA = 3, kTransB = 4, kPrefWorkspace = 1, kPrefAlignA = 5, kPrefAlignD = 8 };
static const uint64_t kMagic = 0x7467656d756c7400ull;  // "tgemult"

struct Handle {
  long queries;
};
struct Desc {
  int compute, ta, tb;
};
struct Layout {
  int type;
  uint64_t rows, cols;
  int64_t ld;
};
struct Pref {
  uint64_t maxws;
};
struct Result {
  uint64_t algo[8];
  size_t workspaceSize;
  int state;
  float wavesCount;
  int reserved[4];
};

API cublasLtCreate(void** h) {
  *h = new Handle{0};
  return kOK;
}
API cublasLtDestroy(void* h) {
  delete (Handle*)h;
  return kOK;
}
extern "C" __attribute__((visibility("default"))) size_t cublasLtGetVersion(void) { return 130000; }

API cublasLtMatmulDescCreate(void** d, int compute, int scale) {
  if ((compute != kCompute32F && compute != kCompute32FFastTF32) || scale != 0) return kNotSupported;
  *d = new Desc{compute, 0, 0};
  return kOK;
}
API cublasLtMatmulDescDestroy(void* d) {
  delete (Desc*)d;
  return kOK;
}
API cublasLtMatmulDescSetAttribute(void* d, int attr, const void* buf, size_t n) {
  if ((attr != kTransA && attr != kTransB) || n != 4) return kInvalid;
  int32_t v;
  memcpy(&v, buf, 4);
  if (v != 0 && v != 1) return kInvalid;
  (attr == kTransA ? ((Desc*)d)->ta : ((Desc*)d)->tb) = v;
  return kOK;
}
API cublasLtMatrixLayoutCreate(void** l, int type, uint64_t rows, uint64_t cols, int64_t ld) {
  if (type != 0 && type != 14) return kNotSupported;
  if (ld < (int64_t)rows || ld < 1) return kInvalid;
  *l = new Layout{type, rows, cols, ld};
  return kOK;
}
API cublasLtMatrixLayoutDestroy(void* l) {
  delete (Layout*)l;
  return kOK;
}
API cublasLtMatmulPreferenceCreate(void** p) {
  *p = new Pref{0};
  return kOK;
}
API cublasLtMatmulPreferenceDestroy(void* p) {
  delete (Pref*)p;
  return kOK;
}
API cublasLtMatmulPreferenceSetAttribute(void* p, int attr, const void* buf, size_t n) {
  if (attr == kPrefWorkspace && n == 8) {
    memcpy(&((Pref*)p)->maxws, buf, 8);
    return kOK;
  }
  if (attr >= kPrefAlignA && attr <= kPrefAlignD && n == 4) return kOK;
  return kInvalid;
}

// shape checks that the layouts describe D (m,n) = op(A) (m,k) · op(B) (k,n)
// + C (m,n), and returns m, n, k.
static bool shape(const Desc* d, const Layout* a, const Layout* b, const Layout* c, const Layout* dd, int* m,
                  int* n, int* k) {
  *m = (int)dd->rows;
  *n = (int)dd->cols;
  *k = (int)(d->ta ? a->rows : a->cols);
  uint64_t am = d->ta ? a->cols : a->rows, bk = d->tb ? b->cols : b->rows, bn = d->tb ? b->rows : b->cols;
  return am == dd->rows && bk == (uint64_t)*k && bn == dd->cols && c->rows == dd->rows && c->cols == dd->cols &&
         a->type == b->type && c->type == dd->type;
}

static size_t need(int m, int n, int s) { return s == 1 ? 0 : (size_t)4 * m * n * s; }

API cublasLtMatmulAlgoGetHeuristic(void* h, void* desc, void* A, void* B, void* C, void* D, void* pref, int req,
                                   Result* res, int* got) {
  int m, n, k;
  *got = 0;
  if (req < 1) return kInvalid;
  if (!shape((Desc*)desc, (Layout*)A, (Layout*)B, (Layout*)C, (Layout*)D, &m, &n, &k)) return kInvalid;
  int cand[3], nc = 0;
  static const int splits[3] = {1, 2, 4};
  for (int s : splits)
    if (s <= (k > 0 ? k : 1) && need(m, n, s) <= ((Pref*)pref)->maxws) cand[nc++] = s;
  long q = ((Handle*)h)->queries++;
  for (int i = 0; i < nc && i < req; i++) {
    Result& r = res[i];
    memset(&r, 0, sizeof r);
    r.algo[0] = kMagic;
    r.algo[1] = (uint64_t)cand[(q + i) % nc];
    r.workspaceSize = need(m, n, cand[(q + i) % nc]);
    r.wavesCount = 1;
    (*got)++;
  }
  return *got ? kOK : kNotSupported;
}

// tf32 and load as in fakecublas.cpp.
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

API cublasLtMatmul(void* h, void* desc, const void* alpha, const void* A, void* Ad, const void* B, void* Bd,
                   const void* beta, const void* C, void* Cd, void* D, void* Dd, const void* algo, void* ws,
                   size_t wsn, void* stream) {
  const Desc* d = (const Desc*)desc;
  const Layout *la = (Layout*)Ad, *lb = (Layout*)Bd, *lc = (Layout*)Cd, *ld = (Layout*)Dd;
  int m, n, k;
  if (!shape(d, la, lb, lc, ld, &m, &n, &k)) return kInvalid;
  if (!algo) return kInvalid;  // the backend always passes the algorithm it planned
  const uint64_t* al = (const uint64_t*)algo;
  int s = (int)al[1];
  if (al[0] != kMagic || (s != 1 && s != 2 && s != 4) || s > (k > 0 ? k : 1)) return kInvalid;
  if (need(m, n, s) > wsn || (need(m, n, s) > 0 && !ws)) return kInvalid;
  const bool tf = d->compute == kCompute32FFastTF32;
  const int at = la->type, ct = lc->type;
  const long lda = la->ld, ldb = lb->ld, ldc = lc->ld, ldd = ld->ld;
  float a = *(const float*)alpha, bb = *(const float*)beta;
  float* part = (float*)ws;
  for (int j = 0; j < n; j++)
    for (int i = 0; i < m; i++) {
      float total = 0;
      for (int c = 0; c < s; c++) {
        float acc = 0;
        for (int l = (int)((long)k * c / s); l < (int)((long)k * (c + 1) / s); l++) {
          float x = d->ta ? load(A, at, (long)i * lda + l, tf) : load(A, at, (long)l * lda + i, tf);
          float y = d->tb ? load(B, at, (long)l * ldb + j, tf) : load(B, at, (long)j * ldb + l, tf);
          acc += x * y;
        }
        if (s == 1) {
          total = acc;
        } else {
          part[((long)c * n + j) * m + i] = acc;
        }
      }
      for (int c = 0; s > 1 && c < s; c++) total += part[((long)c * n + j) * m + i];
      float r = a * total + (bb == 0 ? 0.0f : bb * load(C, ct, (long)j * ldc + i, false));
      long o = (long)j * ldd + i;
      if (ct == 0) {
        ((float*)D)[o] = r;
      } else {
        uint32_t u;
        memcpy(&u, &r, 4);
        u += 0x7fffu + ((u >> 16) & 1u);
        ((uint16_t*)D)[o] = (uint16_t)(u >> 16);
      }
    }
  return kOK;
}
