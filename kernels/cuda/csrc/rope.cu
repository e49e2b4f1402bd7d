// rope.cu: rotary position embedding, Hugging Face "rotate half" convention.
//
//   rope:  x (T,H,HD) rotated in place: for i < HD/2, with a = pos[t]·theta^(−2i/HD),
//          (x[i], x[i+HD/2]) ← (x[i]·cos a − x[i+HD/2]·sin a, x[i+HD/2]·cos a + x[i]·sin a)
//   RopeBackward is the same kernel with sign = −1 (the inverse rotation).
//
// pos (T) I32. sign = −1 rotates back by the same cos and sin values.
#include "common.cuh"

extern "C" __global__ void rope(float* x, const int* pos, int T, int H, int HD, float theta,
                                float sign) {
  int half = HD / 2;
  TG_FOR(i, (long long)T * H * half) {
    int k = (int)(i % half);
    long long th = i / half;
    int t = (int)(th / H);
    // Hugging Face's float32 arithmetic, as kernels/cpu/rope.go: inv_freq =
    // 1/theta^(2k/HD) rounded to float, angle = float(pos)·inv_freq in float,
    // then cos and sin of that angle in double, rounded once.
    const float e = (float)(2 * k) / (float)HD;
    const float inv = 1.f / (float)pow((double)theta, (double)e);
    const float ang = __fmul_rn((float)pos[t], inv);
    const float c = (float)cos((double)ang), s = sign * (float)sin((double)ang);
    float* p = x + th * HD;
    float a = p[k], b = p[k + half];
    p[k] = a * c - b * s;
    p[k + half] = b * c + a * s;
  }
}
