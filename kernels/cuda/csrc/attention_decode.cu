// attention_decode.cu: one query per sequence against a KV cache, split over
// the cache length (flash-decoding) so that a few long sequences still fill
// the GPU.
//
//   attention_decode: out (B,NH,HD) = softmax(scale·q·kᵀ)·v for q (B,NH,HD) over
//                     kc, vc (B,Tmax,NKV,HD), rows [0, lens[b]) of sequence b  (=)
//
// attention_decode_partial: grid (NH, B, nsplit), block 32 (one warp). Split
// z covers cache rows [z·split, (z+1)·split) ∩ [0, lens[b]); for each tile of
// 32 rows lane j scores row j, the warp does the online softmax update and
// p_j is broadcast by shuffle for p·V (a lane owns d = lane + 32·j). It
// writes the split's unnormalized state to part (B,NH,nsplit,HD+2):
// {acc[0..HD), m, l}, with m = −inf and l = 0 for an empty split.
// attention_decode_combine: grid (NH, B), block 32: out = Σ_z acc_z·e^(m_z−M)
// / Σ_z l_z·e^(m_z−M), M = max_z m_z, combining splits in order.
//
// HD <= 128. lens[b] outside [1, Tmax] (as kernels/cpu requires) gives zeros
// and sets TG_ERR_DECODELEN. q, kc and vc are fp32, or bf16 (a bf16 KV
// cache: attention_decode_partial_bf16), widened as the tiles are loaded
// (row by row, lanes across the head dimension: no division per element).
#include "bf16.cuh"
#include "common.cuh"

#define ATT_MAXJ 4
#define BC 32

template <class TI>
__device__ __forceinline__ void decode_partial(float* part, const TI* q, const TI* kc, const TI* vc,
                                               const int* lens, int Tmax, int NH, int NKV, int HD,
                                               float scale, int split, int* flags) {
  TG_DYN_SMEM(float, sm);
  const int h = blockIdx.x, b = blockIdx.y, z = blockIdx.z, nsplit = gridDim.z;
  const int kvh = h / (NH / NKV), lane = threadIdx.x;
  const int HDP = HD + 1;
  float* Qs = sm;            // (HD), pre-scaled
  float* Ks = Qs + HD;       // (BC, HDP)
  float* Vs = Ks + BC * HDP; // (BC, HD)
  int n = lens[b];
  if (n < 1 || n > Tmax) {
    if (lane == 0 && h == 0 && z == 0) atomicOr(flags, TG_ERR_DECODELEN);
    n = 0;
  }
  const int lo = z * split, hi = min(n, lo + split);
  const long long qrow = (long long)b * NH + h;
  for (int d = lane; d < HD; d += 32) Qs[d] = ld_f(q, qrow * HD + d) * scale;
  float m = -TG_INF, l = 0.f, acc[ATT_MAXJ];
#pragma unroll
  for (int j = 0; j < ATT_MAXJ; j++) acc[j] = 0.f;
  for (int k0 = lo; k0 < hi; k0 += BC) {
    __syncwarp();  // Q stored; the previous tile is consumed
    for (int r = 0; r < BC; r++) {
      const int kj = k0 + r;
      const long long off = (((long long)b * Tmax + kj) * NKV + kvh) * HD;
      for (int d = lane; d < HD; d += 32) {
        Ks[r * HDP + d] = kj < hi ? ld_f(kc, off + d) : 0.f;
        Vs[r * HD + d] = kj < hi ? ld_f(vc, off + d) : 0.f;
      }
    }
    __syncwarp();
    float sc = -TG_INF;
    if (k0 + lane < hi) {
      float dot = 0.f;
      for (int d = 0; d < HD; d++) dot += Qs[d] * Ks[lane * HDP + d];
      sc = dot;
    }
    const float mnew = fmaxf(m, warp_max(sc));
    const float p = sc == -TG_INF ? 0.f : expf(sc - mnew);
    const float alpha = m == -TG_INF ? 0.f : expf(m - mnew);
    l = l * alpha + warp_sum(p);
    m = mnew;
#pragma unroll
    for (int j = 0; j < ATT_MAXJ; j++) acc[j] *= alpha;
    for (int jj = 0; jj < BC; jj++) {
      const float pj = __shfl_sync(TG_FULL, p, jj);
#pragma unroll
      for (int j = 0; j < ATT_MAXJ; j++) {
        int d = lane + 32 * j;
        if (d < HD) acc[j] += pj * Vs[jj * HD + d];
      }
    }
  }
  float* o = part + (qrow * nsplit + z) * (HD + 2);
#pragma unroll
  for (int j = 0; j < ATT_MAXJ; j++) {
    int d = lane + 32 * j;
    if (d < HD) o[d] = acc[j];
  }
  if (lane == 0) {
    o[HD] = m;
    o[HD + 1] = l;
  }
}

extern "C" __global__ void __launch_bounds__(32)
    attention_decode_partial(float* part, const float* q, const float* kc, const float* vc,
                             const int* lens, int Tmax, int NH, int NKV, int HD, float scale,
                             int split, int* flags) {
  decode_partial(part, q, kc, vc, lens, Tmax, NH, NKV, HD, scale, split, flags);
}

extern "C" __global__ void __launch_bounds__(32)
    attention_decode_partial_bf16(float* part, const tg_bf16* q, const tg_bf16* kc,
                                  const tg_bf16* vc, const int* lens, int Tmax, int NH, int NKV,
                                  int HD, float scale, int split, int* flags) {
  decode_partial(part, q, kc, vc, lens, Tmax, NH, NKV, HD, scale, split, flags);
}

extern "C" __global__ void __launch_bounds__(32)
    attention_decode_combine(float* out, const float* part, int NH, int HD, int nsplit) {
  const int h = blockIdx.x, b = blockIdx.y, lane = threadIdx.x;
  const long long qrow = (long long)b * NH + h;
  const float* p = part + qrow * nsplit * (HD + 2);
  float M = -TG_INF;
  for (int z = 0; z < nsplit; z++) M = fmaxf(M, p[z * (HD + 2) + HD]);
  float L = 0.f, acc[ATT_MAXJ];
#pragma unroll
  for (int j = 0; j < ATT_MAXJ; j++) acc[j] = 0.f;
  for (int z = 0; z < nsplit; z++) {
    const float* pz = p + z * (HD + 2);
    const float mz = pz[HD];
    if (mz == -TG_INF) continue;  // empty split
    const float e = expf(mz - M);
    L += pz[HD + 1] * e;
#pragma unroll
    for (int j = 0; j < ATT_MAXJ; j++) {
      int d = lane + 32 * j;
      if (d < HD) acc[j] += pz[d] * e;
    }
  }
  const float inv = L > 0.f ? 1.f / L : 0.f;  // an empty cache gives zeros
#pragma unroll
  for (int j = 0; j < ATT_MAXJ; j++) {
    int d = lane + 32 * j;
    if (d < HD) out[qrow * HD + d] = acc[j] * inv;
  }
}
