// embedding.cu: token embedding lookup and its gradient.
//
//   embedding_fwd:  out (T,C) = wte (V,C) [tokens (T)]               (=)
//   embedding_bwd:  dwte (V,C) += scatter-add of dout (T,C) at tokens (+=)
//
// A token id outside [0, V) writes a zero row, contributes no gradient, and
// sets TG_ERR_TOKEN in flags (reported by Sync). The backward pass adds with
// atomicAdd, so rows hit by several tokens are summed in an unspecified order
// (equal to the CPU's within float rounding, not bitwise).
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
  TG_FOR(i, (long long)T * C) {
    int t = (int)(i / C), c = (int)(i % C);
    int tok = tokens[t];
    if (tok >= 0 && tok < V) atomicAdd(&dwte[(long long)tok * C + c], dout[i]);
  }
}
