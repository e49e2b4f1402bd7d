// expert_route.cu: the permutation of a sparse layer's N = T·K assignments
// to expert-contiguous order (kernels.Experts), a stable counting sort.
//
//   expert_count:  counts (E) I32 = the assignments of each expert         (=)
//   expert_place:  offsets (E+1) = exclusive prefix sums of counts         (=)
//                  order (N) = assignments by expert, ascending within one  (=)
//                  slot (N) = slot[order[p]] = p                            (=)
//
// Block e (256 threads) handles expert e in both kernels: thread i owns the
// contiguous chunk [i·c, (i+1)·c) of the assignments (c = ceil(N/256)),
// counts its matches, and, in expert_place, takes its place after the
// lower threads' matches (an exclusive scan of the 256 counts) and writes
// them in order: the order within an expert is the assignment order, with
// no atomics. An expert id outside [0, E) sets TG_ERR_EXPERT and is routed
// to expert 0, so that the outputs stay a permutation every later op can
// read safely.
#include "common.cuh"

#define TG_ERR_EXPERT 64  // an expert id outside [0, E) (kernels/cuda/backend.go names the bits)
#define ROUTE_THREADS 256

__device__ __forceinline__ int route_expert(const int* experts, long long i, int E) {
  const int e = experts[i];
  return (e < 0 || e >= E) ? 0 : e;
}

// The number of assignments of expert e in this thread's chunk.
__device__ __forceinline__ int route_count(const int* experts, int N, int E, int e, long long* lo, long long* hi) {
  const long long c = ((long long)N + ROUTE_THREADS - 1) / ROUTE_THREADS;
  const long long a = (long long)threadIdx.x * c, b = a + c;
  *lo = a < N ? a : N;
  *hi = b < N ? b : N;
  int n = 0;
  for (long long i = *lo; i < *hi; i++) n += route_expert(experts, i, E) == e;
  return n;
}

extern "C" __global__ void __launch_bounds__(ROUTE_THREADS) expert_count(int* counts, const int* experts, int N, int E,
                                                                        int* flags) {
  __shared__ int part[ROUTE_THREADS];
  const int e = blockIdx.x;
  long long lo, hi;
  part[threadIdx.x] = route_count(experts, N, E, e, &lo, &hi);
  if (e == 0) {
    for (long long i = lo; i < hi; i++) {
      if (experts[i] < 0 || experts[i] >= E) {
        atomicOr(flags, TG_ERR_EXPERT);
        break;
      }
    }
  }
  __syncthreads();
  if (threadIdx.x == 0) {
    int s = 0;
    for (int i = 0; i < ROUTE_THREADS; i++) s += part[i];
    counts[e] = s;
  }
}

extern "C" __global__ void __launch_bounds__(ROUTE_THREADS) expert_place(int* offsets, int* order, int* slot,
                                                                        const int* counts, const int* experts, int N,
                                                                        int E) {
  __shared__ int part[ROUTE_THREADS];
  __shared__ int base;
  const int e = blockIdx.x;
  long long lo, hi;
  part[threadIdx.x] = route_count(experts, N, E, e, &lo, &hi);
  if (threadIdx.x == 0) {
    int b = 0;
    for (int i = 0; i < e; i++) b += counts[i];
    base = b;
    offsets[e] = b;
    if (e == E - 1) offsets[E] = b + counts[e];
  }
  __syncthreads();
  if (threadIdx.x == 0) {  // exclusive scan of the threads' counts
    int s = base;
    for (int i = 0; i < ROUTE_THREADS; i++) {
      const int n = part[i];
      part[i] = s;
      s += n;
    }
  }
  __syncthreads();
  int p = part[threadIdx.x];
  for (long long i = lo; i < hi; i++) {
    if (route_expert(experts, i, E) == e) {
      order[p] = (int)i;
      slot[i] = p;
      p++;
    }
  }
}
