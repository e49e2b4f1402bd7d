// common.cuh: helpers every kernel file includes. Its sha256 is recorded in
// each gen_*.ptx header next to the kernel file's own, so editing it makes
// every PTX stale.
//
// The kernels are written so that they also compile as plain C++ against the
// CPU emulation header in kernels/cuda/testdata/emu (TG_EMU), which is how
// their logic is tested on machines without a GPU: no CUDA headers, no
// vector types, no inline PTX, only intrinsics that header defines.
#pragma once

#define TG_FULL 0xffffffffu

#ifndef TG_EMU
#define TG_DYN_SMEM(T, name) extern __shared__ T name[]
// Dynamic shared memory for 16-byte accesses (ldmatrix, cp.async); a
// kernel file using both macros gives the arrays different names.
#define TG_DYN_SMEM_ALIGNED(T, name) extern __shared__ __align__(16) T name[]
#define TG_INF __int_as_float(0x7f800000)
#endif

// Sum of v over the 32 lanes of a warp; every lane gets the result.
__device__ __forceinline__ float warp_sum(float v) {
#pragma unroll
  for (int o = 16; o > 0; o >>= 1) v += __shfl_xor_sync(TG_FULL, v, o);
  return v;
}

// Max of v over the 32 lanes of a warp; every lane gets the result.
__device__ __forceinline__ float warp_max(float v) {
#pragma unroll
  for (int o = 16; o > 0; o >>= 1) v = fmaxf(v, __shfl_xor_sync(TG_FULL, v, o));
  return v;
}

// Sum of v over the whole block (blockDim.x a multiple of 32, at most 1024);
// every thread gets the result. scratch holds 32 floats of shared memory.
// Every thread of the block must call it.
__device__ __forceinline__ float block_sum(float v, float* scratch) {
  int lane = threadIdx.x & 31, warp = threadIdx.x >> 5, nw = blockDim.x >> 5;
  v = warp_sum(v);
  __syncthreads();  // earlier readers of scratch are done
  if (lane == 0) scratch[warp] = v;
  __syncthreads();
  v = lane < nw ? scratch[lane] : 0.f;
  return warp_sum(v);
}

// Device-side data errors, OR-ed into the backend's flag word and reported
// by Sync (kernels/cuda/backend.go names each bit).
#define TG_ERR_TOKEN 1     // embedding: token id outside [0, V)
#define TG_ERR_SCATTER 2   // scatter_rows: index outside [0, rows)
#define TG_ERR_TARGET 4    // token_logprob: target id >= V
#define TG_ERR_DECODELEN 8 // attention_decode: lens[b] outside [1, Tmax]
#define TG_ERR_SEQS 16     // attention: cu_seqlens not 0..T, or a length < 0 or > Seqs.MaxLen
#define TG_ERR_ROPEPOS 32  // rope: a position outside the cos/sin tables' [0, P)
#define TG_ERR_TREE 128    // tree_attention: a tree that breaks a rule of kernels.Tree (64: expert_route.cu's TG_ERR_EXPERT)

// Grid-stride loop over [0, n) with a 64-bit index.
#define TG_FOR(i, n)                                                        \
  for (long long i = (long long)blockIdx.x * blockDim.x + threadIdx.x; i < (n); \
       i += (long long)gridDim.x * blockDim.x)
