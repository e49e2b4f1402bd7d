// mma.cuh: the warp-level tensor-core instructions the kernels use, each
// wrapped in one device function. Under nvcc they are inline PTX (sm_80+);
// under the CPU emulator (TG_EMU) they call kernels/cuda/testdata/emu, which
// gathers the warp's operands through per-warp scratch at a warp barrier and
// computes what the PTX ISA specifies, fragment layouts included.
//
//   mma_bf16_16816(acc, a, b)   acc (16×8 f32) += A (16×16 bf16) · B (16×8 bf16)
//       mma.sync.aligned.m16n8k16.row.col.f32.bf16.bf16.f32. With
//       g = lane/4 and t = lane%4 (PTX ISA, "Matrix Fragments for
//       mma.m16n8k16 with floating point type"):
//         a[0] = A[g][2t..2t+1]    a[1] = A[g+8][2t..2t+1]
//         a[2] = A[g][2t+8..2t+9]  a[3] = A[g+8][2t+8..2t+9]
//         b[0] = B[2t..2t+1][g]    b[1] = B[2t+8..2t+9][g]
//         acc[0..1] = D[g][2t..2t+1]  acc[2..3] = D[g+8][2t..2t+1]
//       (pairs packed low element first). The accumulator layout of two
//       adjacent n-tiles is the A layout of one k-step: FlashAttention's
//       P = softmax(S) stays in registers between its two GEMMs.
//   ldmatrix_x4 / _x2 (and _trans): lanes 8j..8j+7 give the row addresses
//       (16 bytes each, 16-byte aligned, shared memory) of 8×8 b16 matrix j;
//       lane L receives r[j] = M_j[L/4][2(L%4)..+1], or transposed
//       M_j[2(L%4)..+1][L/4]. For x2 only lanes 0..15's addresses count.
//   cp_async16(dst, src, n)  copies 16 bytes global → shared without the
//       registers (cp.async.cg), the last 16−n zero-filled (n = 0 reads
//       nothing); cp_async_commit closes a group, cp_async_wait<N> waits
//       until at most N groups are in flight. The destination is undefined
//       until the wait: the emulator fills it with NaN at issue and writes
//       the data at the wait, so a read before the wait, or a copy issued
//       into a buffer still being read, changes results.
#pragma once
#include "bf16.cuh"

#ifdef TG_EMU

__device__ __forceinline__ void mma_bf16_16816(float acc[4], const unsigned a[4], const unsigned b[2]) {
  tg_emu_mma_bf16_16816(acc, a, b);
}
__device__ __forceinline__ void ldmatrix_x4(unsigned r[4], const void* p) { tg_emu_ldmatrix(r, 4, false, p); }
__device__ __forceinline__ void ldmatrix_x4_trans(unsigned r[4], const void* p) { tg_emu_ldmatrix(r, 4, true, p); }
__device__ __forceinline__ void ldmatrix_x2(unsigned r[2], const void* p) { tg_emu_ldmatrix(r, 2, false, p); }
__device__ __forceinline__ void ldmatrix_x2_trans(unsigned r[2], const void* p) { tg_emu_ldmatrix(r, 2, true, p); }
__device__ __forceinline__ void cp_async16(void* dst, const void* src, int n) { tg_emu_cp_async(dst, src, 16, n); }
__device__ __forceinline__ void cp_async_commit() { tg_emu_cp_commit(); }
template <int N>
__device__ __forceinline__ void cp_async_wait() {
  tg_emu_cp_wait(N);
}

#else

__device__ __forceinline__ unsigned smem_u32(const void* p) {
  return (unsigned)__cvta_generic_to_shared(p);
}

__device__ __forceinline__ void mma_bf16_16816(float acc[4], const unsigned a[4], const unsigned b[2]) {
  asm volatile(
      "mma.sync.aligned.m16n8k16.row.col.f32.bf16.bf16.f32 {%0,%1,%2,%3}, {%4,%5,%6,%7}, {%8,%9}, "
      "{%0,%1,%2,%3};\n"
      : "+f"(acc[0]), "+f"(acc[1]), "+f"(acc[2]), "+f"(acc[3])
      : "r"(a[0]), "r"(a[1]), "r"(a[2]), "r"(a[3]), "r"(b[0]), "r"(b[1]));
}
__device__ __forceinline__ void ldmatrix_x4(unsigned r[4], const void* p) {
  asm volatile("ldmatrix.sync.aligned.m8n8.x4.shared.b16 {%0,%1,%2,%3}, [%4];\n"
               : "=r"(r[0]), "=r"(r[1]), "=r"(r[2]), "=r"(r[3])
               : "r"(smem_u32(p)));
}
__device__ __forceinline__ void ldmatrix_x4_trans(unsigned r[4], const void* p) {
  asm volatile("ldmatrix.sync.aligned.m8n8.x4.trans.shared.b16 {%0,%1,%2,%3}, [%4];\n"
               : "=r"(r[0]), "=r"(r[1]), "=r"(r[2]), "=r"(r[3])
               : "r"(smem_u32(p)));
}
__device__ __forceinline__ void ldmatrix_x2(unsigned r[2], const void* p) {
  asm volatile("ldmatrix.sync.aligned.m8n8.x2.shared.b16 {%0,%1}, [%2];\n"
               : "=r"(r[0]), "=r"(r[1])
               : "r"(smem_u32(p)));
}
__device__ __forceinline__ void ldmatrix_x2_trans(unsigned r[2], const void* p) {
  asm volatile("ldmatrix.sync.aligned.m8n8.x2.trans.shared.b16 {%0,%1}, [%2];\n"
               : "=r"(r[0]), "=r"(r[1])
               : "r"(smem_u32(p)));
}
__device__ __forceinline__ void cp_async16(void* dst, const void* src, int n) {
  asm volatile("cp.async.cg.shared.global [%0], [%1], 16, %2;\n" ::"r"(smem_u32(dst)), "l"(src), "r"(n));
}
__device__ __forceinline__ void cp_async_commit() { asm volatile("cp.async.commit_group;\n" ::); }
template <int N>
__device__ __forceinline__ void cp_async_wait() {
  asm volatile("cp.async.wait_group %0;\n" ::"n"(N) : "memory");
}

#endif
