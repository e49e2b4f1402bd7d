// probe.cu: kernels that show the emulator's own schedule and shared memory
// to kernels/cuda's TestEmuSchedule. Built only into an emulator variant,
// never into PTX or for a GPU.

// Lane 0 of each warp appends blockIdx.x*32 + its warp to log[] when the
// warp first runs: the order in which the emulator ran blocks and warps.
extern "C" __global__ void emu_probe_order(int* counter, int* log) {
  if ((threadIdx.x & 31) == 0) log[atomicAdd(counter, 1)] = (int)(blockIdx.x * 32 + (threadIdx.x >> 5));
}

// Each thread copies its static and dynamic shared memory word into out
// before any thread of the block writes it, then writes both, so a block
// that saw what an earlier block left shows 1.0 instead of the poison.
extern "C" __global__ void emu_probe_smem(float* out) {
  __shared__ float s[128];
  TG_DYN_SMEM(float, d);
  float* o = out + 2 * (blockIdx.x * blockDim.x + threadIdx.x);
  o[0] = s[threadIdx.x];
  o[1] = d[threadIdx.x];
  __syncthreads();
  s[threadIdx.x] = 1.f;
  d[threadIdx.x] = 1.f;
}
