// embedding.cu: token embedding lookup and its gradient.
//
//   embedding_fwd:  out (T,C) = wte (V,C) [tokens (T)]               (=)
//   embedding_bwd:  dwte (V,C) += scatter-add of dout (T,C) at tokens (+=)
//
// A token id outside [0, V) writes a zero row, contributes no gradient, and
// sets TG_ERR_TOKEN in flags (reported by Sync).
//
// The backward pass is deterministic and bitwise equal to kernels/cpu: thread
// (c, k) owns column c of every vocabulary row v with v % K == k (K =
// gridDim.y) and adds dout[t][c] for t = 0, 1, ..., T−1 in order, so each
// dwte element sums its tokens in token order, as the CPU does, with no
// atomics. Grid: (ceil(C/blockDim.x), K).
#include "common.cuh"

extern "C" __global__ void embedding_fwd(float* out, const float* wte, const int* tokens,
                                         int T, int C, int V, int* flags) {
  TG_FOR(i, (long long)T * C) {
    int t = (int)(i / C), c = (int)(i % C);
    int tok = tokens[t];
    if (tok < 0 || tok >= V) {
      out[i] = 0.f;
      if (c == 0) atomicOr(flags, TG_ERR_TOKEN);
    } else {
      out[i] = wte[(long long)tok * C + c];
    }
  }
}

extern "C" __global__ void embedding_bwd(float* dwte, const float* dout, const int* tokens,
                                         int T, int C, int V) {
  const int c = blockIdx.x * blockDim.x + threadIdx.x;
  const int k = blockIdx.y, K = gridDim.y;
  if (c >= C) return;
  for (int t = 0; t < T; t++) {
    const int tok = tokens[t];
    if (tok < 0 || tok >= V || tok % K != k) continue;
    dwte[(long long)tok * C + c] += dout[(long long)t * C + c];
  }
}
