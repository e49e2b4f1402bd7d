// probe.cu: kernels that show the emulator's own schedule and shared memory
// to kernels/cuda's TestEmuSchedule. Built only into an emulator variant,
// never into PTX or for a GPU.

// The words emu_probe_smem writes per thread (emu_schedule_test.go).
#define EMU_PROBE_SMEM_WORDS 4

// Lane 0 of each warp appends blockIdx.x*32 + its warp to log[] when the
// warp first runs: the order in which the emulator ran blocks and warps.
extern "C" __global__ void emu_probe_order(int* counter, int* log) {
  if ((threadIdx.x & 31) == 0) log[atomicAdd(counter, 1)] = (int)(blockIdx.x * 32 + (threadIdx.x >> 5));
}

// A static __shared__ word in an inline device function and in a function
// template (csrc/grouped_matmul.cu has both; g++ gives them COMDAT groups
// and ignores a section attribute on a template's): each thread reads its
// word and then writes 1.0 there.
__device__ __forceinline__ float emu_probe_inline_smem() {
  __shared__ int w[128];
  const int v = w[threadIdx.x];
  __syncthreads();
  w[threadIdx.x] = 1;
  float f;
  memcpy(&f, &v, sizeof f);
  return f;
}
template <class T>
__device__ T emu_probe_template_smem() {
  __shared__ T w[128];
  const T v = w[threadIdx.x];
  __syncthreads();
  w[threadIdx.x] = T(1);
  return v;
}

// Each thread copies its shared memory words (static in the kernel, in an
// inline function and in a template; dynamic) into out before any thread
// of the block writes them, then writes all four, so a block that saw what
// an earlier block left shows 1.0 instead of the poison.
extern "C" __global__ void emu_probe_smem(float* out) {
  __shared__ float s[128];
  TG_DYN_SMEM(float, d);
  float* o = out + EMU_PROBE_SMEM_WORDS * (blockIdx.x * blockDim.x + threadIdx.x);
  o[0] = s[threadIdx.x];
  o[1] = d[threadIdx.x];
  o[2] = emu_probe_inline_smem();
  o[3] = emu_probe_template_smem<float>();
  __syncthreads();
  s[threadIdx.x] = 1.f;
  d[threadIdx.x] = 1.f;
}
