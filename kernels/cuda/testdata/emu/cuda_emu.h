// cuda_emu.h: just enough of CUDA C++ to compile kernels/cuda/csrc/*.cu as
// plain C++ and run them on the CPU (force-included with g++ -include).
// Each CUDA thread of a block is a ucontext fiber on one OS thread;
// __syncthreads and the warp shuffles are cooperative barriers. Blocks run
// one after another, in a shuffled order, so __shared__ (static here) is
// one copy that every block reuses: the build (emu_test.go's emuSmemScript)
// links every zero-initialised function-local static of the kernels,
// wherever it is declared (a kernel, an inline function, a template), into
// one section, tg_emu_smem, which the launch poisons (0xFF bytes: NaN, -1)
// at the start of every block, as a GPU's shared memory holds whatever was
// there.
// Used only by kernels/cuda's emulator test (emu_test.go): it checks the
// kernels' logic and indexing, not GPU timing or memory-model behaviour.
#pragma once
#include <cmath>
#include <cstdint>
#include <cstring>

#define TG_EMU 1
#define __global__
#define __device__
#define __forceinline__ inline
#define __launch_bounds__(...)
#define __shared__ static
#define __align__(n) __attribute__((aligned(n)))
#define TG_INF INFINITY
#define TG_DYN_SMEM(T, name) T* name = (T*)tg_emu_dyn_smem
#define TG_DYN_SMEM_ALIGNED(T, name) T* name = (T*)tg_emu_dyn_smem  // 128-byte aligned

struct tg_dim3 {
  unsigned x, y, z;
};
extern tg_dim3 threadIdx, blockIdx, blockDim, gridDim;
extern char* tg_emu_dyn_smem;

void __syncthreads();
void tg_emu_warp_barrier();
uint64_t* tg_emu_warp_slots();
inline void __syncwarp(unsigned = 0xffffffffu) { tg_emu_warp_barrier(); }

// Tensor-core instructions and asynchronous copies (fakecuda.cpp; wrapped
// for the kernels by csrc/mma.cuh, which documents their semantics).
// acc (16x8 f32) += A (16x16 bf16) * B (16x8 bf16), per-lane fragments.
void tg_emu_mma_bf16_16816(float acc[4], const unsigned a[4], const unsigned b[2]);
// ldmatrix .x1/.x2/.x4 (num matrices), optionally .trans; p is this lane's
// row address.
void tg_emu_ldmatrix(unsigned* r, int num, bool trans, const void* p);
// cp.async of size bytes (src_bytes of them read, the rest zeroed), and its
// commit/wait_group.
void tg_emu_cp_async(void* dst, const void* src, int size, int src_bytes);
void tg_emu_cp_commit();
void tg_emu_cp_wait(int n);
// Aborts, naming the thread, unless p is aligned to n bytes (vector access).
void tg_emu_check_align(const void* p, int n);

template <class T>
T tg_emu_shfl(T v, int src) {
  uint64_t* s = tg_emu_warp_slots();
  uint64_t bits = 0;
  memcpy(&bits, &v, sizeof(T));
  s[threadIdx.x & 31] = bits;
  tg_emu_warp_barrier();
  uint64_t r = s[src & 31];
  tg_emu_warp_barrier();
  T out;
  memcpy(&out, &r, sizeof(T));
  return out;
}
template <class T>
T __shfl_xor_sync(unsigned, T v, int m) {
  return tg_emu_shfl(v, (int)(threadIdx.x & 31) ^ m);
}
template <class T>
T __shfl_sync(unsigned, T v, int src) {
  return tg_emu_shfl(v, src);
}

// One OS thread runs every fiber: plain read-modify-write is atomic.
inline float atomicAdd(float* p, float v) {
  float o = *p;
  *p = o + v;
  return o;
}
inline int atomicOr(int* p, int v) {
  int o = *p;
  *p = o | v;
  return o;
}
inline unsigned __float_as_uint(float f) {
  unsigned u;
  memcpy(&u, &f, 4);
  return u;
}
inline float __int_as_float(int i) {
  float f;
  memcpy(&f, &i, 4);
  return f;
}
inline float __fmul_rn(float a, float b) { return a * b; }
inline long long __double_as_longlong(double d) {
  long long l;
  memcpy(&l, &d, 8);
  return l;
}
inline double __longlong_as_double(long long l) {
  double d;
  memcpy(&d, &l, 8);
  return d;
}
inline int atomicAdd(int* p, int v) {
  int o = *p;
  *p = o + v;
  return o;
}
inline unsigned atomicAdd(unsigned* p, unsigned v) {
  unsigned o = *p;
  *p = o + v;
  return o;
}
inline unsigned long long atomicAdd(unsigned long long* p, unsigned long long v) {
  unsigned long long o = *p;
  *p = o + v;
  return o;
}
inline float __uint_as_float(unsigned u) {
  float f;
  memcpy(&f, &u, 4);
  return f;
}
// Double arithmetic rounded as written (nvcc does not contract these).
inline double __dmul_rn(double a, double b) { return a * b; }
inline double __dsub_rn(double a, double b) { return a - b; }
inline double __ddiv_rn(double a, double b) { return a / b; }
// 16-byte vector types for vectorized loads (the kernels check alignment
// first; the emulator aborts on a misaligned one, as a GPU faults).
struct alignas(16) float4 {
  float x, y, z, w;
};
struct alignas(16) uint4 {
  unsigned x, y, z, w;
};
struct alignas(8) float2 {
  float x, y;
};
struct alignas(8) uint2 {
  unsigned x, y;
};
inline int min(int a, int b) { return a < b ? a : b; }
inline int max(int a, int b) { return a > b ? a : b; }
using std::cos;
using std::exp;
using std::pow;
using std::sin;
