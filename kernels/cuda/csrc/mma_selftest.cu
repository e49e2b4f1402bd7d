// mma_selftest.cu: test kernels (not ops) for the tensor-core wrappers of
// mma.cuh. kernels/cuda's TestMMALayoutEmu runs them on the CPU emulator and
// TestMMALayoutGPU on a device, both against a float64 matrix product: on
// the emulator they check its model of the instructions, on a GPU that the
// model is the hardware's. The fragments are built here from the PTX ISA's
// layout tables, written out independently of the emulator's code.
//
//   mma_selftest_frag:     D (16,8) = A (16,16) · Bᵀ + C, with Bt (8,16) = Bᵀ
//                          (n-major, the "col" operand), fragments loaded
//                          from global memory lane by lane              (=)
//   mma_selftest_ldmatrix: the same product twice, operands staged in shared
//                          memory by cp.async and fetched with ldmatrix:
//                          D1 from Bt (ldmatrix, no transpose), D2 from
//                          B (16,8) k-major (ldmatrix .trans); rows 12..15
//                          of A are zero-filled by cp.async (src-size 0), so
//                          D1 and D2 rows 12..15 are C's                (=)
// One block of one warp. A, Bt, B bf16 row-major; C, D, D1, D2 f32 row-major.
#include "common.cuh"
#include "mma.cuh"

extern "C" __global__ void mma_selftest_frag(float* D, const tg_bf16* A, const tg_bf16* Bt,
                                             const float* C) {
  const int lane = threadIdx.x & 31, g = lane >> 2, t = lane & 3;
  auto pk = [](tg_bf16 lo, tg_bf16 hi) { return (unsigned)lo | ((unsigned)hi << 16); };
  unsigned a[4], b[2];
  // a_i for i = 0..7 (two per register): row g + 8·((i/2)%2), col 2t + i%2 + 8·(i/4).
  a[0] = pk(A[g * 16 + 2 * t], A[g * 16 + 2 * t + 1]);
  a[1] = pk(A[(g + 8) * 16 + 2 * t], A[(g + 8) * 16 + 2 * t + 1]);
  a[2] = pk(A[g * 16 + 2 * t + 8], A[g * 16 + 2 * t + 9]);
  a[3] = pk(A[(g + 8) * 16 + 2 * t + 8], A[(g + 8) * 16 + 2 * t + 9]);
  // b_i for i = 0..3: row (k) 2t + i%2 + 8·(i/2), col (n) g.
  b[0] = pk(Bt[g * 16 + 2 * t], Bt[g * 16 + 2 * t + 1]);
  b[1] = pk(Bt[g * 16 + 2 * t + 8], Bt[g * 16 + 2 * t + 9]);
  // c_i: row g + 8·(i/2), col 2t + i%2.
  float acc[4] = {C[g * 8 + 2 * t], C[g * 8 + 2 * t + 1], C[(g + 8) * 8 + 2 * t],
                  C[(g + 8) * 8 + 2 * t + 1]};
  mma_bf16_16816(acc, a, b);
  D[g * 8 + 2 * t] = acc[0];
  D[g * 8 + 2 * t + 1] = acc[1];
  D[(g + 8) * 8 + 2 * t] = acc[2];
  D[(g + 8) * 8 + 2 * t + 1] = acc[3];
}

extern "C" __global__ void mma_selftest_ldmatrix(float* D1, float* D2, const tg_bf16* A,
                                                 const tg_bf16* Bt, const tg_bf16* B,
                                                 const float* C) {
  __shared__ __align__(16) tg_bf16 As[16 * 16], Bts[8 * 16], Bs[16 * 8];
  const int lane = threadIdx.x & 31, g = lane >> 2, t = lane & 3;
  // 16-byte chunks: A has 32 (two per row), Bt 16, B 16.
  {
    const int r = lane >> 1, c = (lane & 1) * 8;
    cp_async16(&As[r * 16 + c], &A[r * 16 + c], r < 12 ? 16 : 0);
  }
  if (lane < 16) {
    const int r = lane >> 1, c = (lane & 1) * 8;
    cp_async16(&Bts[r * 16 + c], &Bt[r * 16 + c], 16);
    cp_async16(&Bs[lane * 8], &B[lane * 8], 16);
  }
  cp_async_commit();
  cp_async_wait<0>();
  __syncwarp();
  unsigned a[4], b1[2], b2[2];
  // x4 on A: matrices (rows 0-7, cols 0-7), (rows 8-15, cols 0-7),
  // (rows 0-7, cols 8-15), (rows 8-15, cols 8-15) = a[0..3].
  ldmatrix_x4(a, &As[((lane & 7) + 8 * ((lane >> 3) & 1)) * 16 + 8 * (lane >> 4)]);
  // x2 on Bt (n rows, k cols): matrices (k 0-7), (k 8-15).
  ldmatrix_x2(b1, &Bts[(lane & 7) * 16 + 8 * ((lane >> 3) & 1)]);
  // x2.trans on B (k rows, n cols): matrices (k 0-7), (k 8-15).
  ldmatrix_x2_trans(b2, &Bs[(lane & 15) * 8]);
  float c1[4] = {C[g * 8 + 2 * t], C[g * 8 + 2 * t + 1], C[(g + 8) * 8 + 2 * t],
                 C[(g + 8) * 8 + 2 * t + 1]};
  float c2[4] = {c1[0], c1[1], c1[2], c1[3]};
  mma_bf16_16816(c1, a, b1);
  mma_bf16_16816(c2, a, b2);
  D1[g * 8 + 2 * t] = c1[0];
  D1[g * 8 + 2 * t + 1] = c1[1];
  D1[(g + 8) * 8 + 2 * t] = c1[2];
  D1[(g + 8) * 8 + 2 * t + 1] = c1[3];
  D2[g * 8 + 2 * t] = c2[0];
  D2[g * 8 + 2 * t + 1] = c2[1];
  D2[(g + 8) * 8 + 2 * t] = c2[2];
  D2[(g + 8) * 8 + 2 * t + 1] = c2[3];
}
