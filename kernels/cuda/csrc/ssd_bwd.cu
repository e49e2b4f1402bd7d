// ssd_bwd.cu: the backward of the Mamba-2 scan (kernels.Mamba's
// SSMScanBackward) as the chunked SSD algorithm, over packed trees. The
// forward (ssm_scan_fwd*, rerun by the launcher) leaves each segment's final
// state and the state at every SBW_Q-th token of a segment (its
// checkpoints); chunk c is the ≤ SBW_Q tokens after checkpoint c, with
// start state S0 = ckpt[c]. For one head (A < 0, a_j = dt_j·A, Λ_i =
// Σ_{j≤i} a_j within the chunk, l rows):
//
//   y  = (G ⊙ L ⊙ dt_j)·X + diag(exp Λ)·C·S0ᵀ + D·X,  G = C·Bᵀ, L_ij = exp(Λ_i − Λ_j), j ≤ i
//   S1 = exp(Λ_last)·S0 + Xᵀ·diag(w)·B,  w_j = exp(Λ_last − Λ_j)·dt_j
//
//   ssd_bwd_chunks:  the chunk table (one thread): each chunk's first token and segment (=)
//   ssd_bwd_local*:  block (chunk, head): U = dYᵀ·diag(exp Λ)·C (MP,DS), the chunk's own
//                    term of its start state's gradient, and exp(Λ_last)             (=)
//   ssd_bwd_states:  block (element tile, head): the inter-chunk recurrence in reverse,
//                    fp32, segments in reverse preorder, a segment's chunks backwards:
//                    dS1 (the gradient of a chunk's end state) over U in place,
//                    dS0 = exp(Λ_last)·dS1 + U; a segment's final state receives the sum
//                    of its children's initial-state gradients in child order         (=)
//   ssd_bwd_chunk*:  block (chunk, group), the group's heads in order: from S0, dS1 and
//                    dY the chunk's gradients (dM = dY·Xᵀ, dX = Mᵀ·dY + w⊙(B·dS1ᵀ) + D·dY,
//                    dC = dG·B + diag(exp Λ)·dY·S0, dB = dGᵀ·C + diag(w)·X·dS1, dG =
//                    dM ⊙ L ⊙ dt_j), the decays' gradient dΛ reverse-summed into ddtRaw;
//                    dB and dC summed over the group's heads in head order straight
//                    into dxbc; each (chunk, head)'s terms of ∂L/∂A, ∂L/∂D, ∂L/∂dtBias
//                    into partials                                                   (=)
//   ssd_bwd_params:  ddtBias, daLog, dd += each head's partials summed in chunk order (+=)
//
// The _bf16 kernels (xbc bf16) run every matrix product on tensor cores,
// mma.sync m16n8k16 with bf16 operands (rounded from the fp32 values in
// shared memory) and fp32 accumulation, as mamba_ssm's Triton kernels do;
// the others run the same products in fp32 on the CUDA cores. Every sum
// has an order fixed by the shapes and the tree (a product's k in order,
// block sums over fixed warps): the same bits on every run, no atomics.
#include "bf16.cuh"
#include "common.cuh"
#include "mma.cuh"

#define SBW_THREADS 256
#define SBW_Q 64  // the forward's checkpoint interval (mamba.cu's MB_Q): the chunk

// The scan's per-token constants: as mamba.cu's mb_dt (dt, exp(dt·A) and
// ∂dt/∂dtRaw), here with the softplus itself (sp) for the clamp's test.
struct sbw_step {
  float dt, sp, ddt;
};
__device__ __forceinline__ sbw_step sbw_dt(float raw, float bias, float lo, float hi) {
  const float x = raw + bias;
  const double xd = (double)x;
  sbw_step st;
  st.sp = (float)(xd > 20.0 ? xd : log1p(exp(xd)));
  st.dt = fminf(fmaxf(st.sp, lo), hi);
  const float dsp = x > 20.f ? 1.f : 1.f / (1.f + expf(-x));
  st.ddt = (st.sp < lo || st.sp > hi) ? 0.f : dsp;
  return st;
}

// Two floats split into bf16 pairs: hi = bf16(v), lo = bf16(v − hi), so
// hi + lo holds v to about 2^-16 of it.
__device__ __forceinline__ void sbw_split(float v0, float v1, unsigned* hi, unsigned* lo) {
  *hi = pack_bf16x2(v0, v1);
  *lo = pack_bf16x2(v0 - bf16_lo(*hi), v1 - bf16_hi(*hi));
}

// out (M,N) = Σ_{k<K} a(i,k)·b(k,j), epi(i, j, out) for every i < M, j < N;
// every thread of the block calls it. TC: tensor cores, warps over 16×8
// tiles, k in steps of 16 (a and b read as 0 past K: they are called only
// inside); else one thread an element, k in order.
template <bool TC, class FA, class FB, class FE>
__device__ __forceinline__ void sbw_mm(int M, int N, int K, FA a, FB b, FE epi) {
  if (TC) {
    const int lane = threadIdx.x & 31, warp = threadIdx.x >> 5, nw = blockDim.x >> 5;
    const int g = lane >> 2, q = lane & 3;
    const int tm = (M + 15) / 16, tn = (N + 7) / 8;
    for (int tile = warp; tile < tm * tn; tile += nw) {
      const int i0 = (tile / tn) * 16, j0 = (tile % tn) * 8;
      float acc[4] = {0.f, 0.f, 0.f, 0.f};
      for (int k0 = 0; k0 < K; k0 += 16) {
        unsigned ah[4], al[4], bh[2], bl[2];
        for (int r = 0; r < 4; r++) {
          const int i = i0 + g + (r & 1) * 8, k = k0 + 2 * q + (r >> 1) * 8;
          const bool in = i < M;
          sbw_split(in && k < K ? a(i, k) : 0.f, in && k + 1 < K ? a(i, k + 1) : 0.f, &ah[r], &al[r]);
        }
        for (int r = 0; r < 2; r++) {
          const int j = j0 + g, k = k0 + 2 * q + r * 8;
          const bool in = j < N;
          sbw_split(in && k < K ? b(k, j) : 0.f, in && k + 1 < K ? b(k + 1, j) : 0.f, &bh[r], &bl[r]);
        }
        // a·b ≈ a_hi·b_hi + a_hi·b_lo + a_lo·b_hi, in this order.
        mma_bf16_16816(acc, ah, bh);
        mma_bf16_16816(acc, ah, bl);
        mma_bf16_16816(acc, al, bh);
      }
      for (int r = 0; r < 4; r++) {
        const int i = i0 + g + (r >> 1) * 8, j = j0 + 2 * q + (r & 1);
        if (i < M && j < N) epi(i, j, acc[r]);
      }
    }
  } else {
    for (int e = threadIdx.x; e < M * N; e += blockDim.x) {
      const int i = e / N, j = e % N;
      float acc = 0.f;
      for (int k = 0; k < K; k++) acc += a(i, k) * b(k, j);
      epi(i, j, acc);
    }
  }
}

// The chunk table: chunk c < cap starts at token t0[c] of segment seg[c]
// (−1 past the last chunk), in segment order: the forward's checkpoint
// order.
extern "C" __global__ void ssd_bwd_chunks(int* t0, int* seg, const int* offs, int NS, int cap) {
  if (blockIdx.x != 0 || threadIdx.x != 0) return;
  int c = 0;
  for (int s = 0; s < NS; s++) {
    for (int t = offs[s]; t < offs[s + 1] && c < cap; t += SBW_Q, c++) {
      t0[c] = t;
      seg[c] = s;
    }
  }
  for (; c < cap; c++) t0[c] = seg[c] = -1;
}

// Loads a chunk's rows' dt into vdt, the softplus into vsp and the
// cumulative decay Λ into vlam (one thread, in row order); returns nothing,
// every thread calls it (it ends with a barrier).
__device__ __forceinline__ void sbw_decays(float* vdt, float* vsp, float* vlam, float* vddt, const float* dtRaw,
                                           float bias, float A, int t0, int l, int MH, int h, float lo, float hi) {
  for (int i = threadIdx.x; i < l; i += blockDim.x) {
    const sbw_step st = sbw_dt(dtRaw[(long long)(t0 + i) * MH + h], bias, lo, hi);
    vdt[i] = st.dt;
    vsp[i] = st.sp;
    if (vddt != nullptr) vddt[i] = st.ddt;
  }
  __syncthreads();
  if (threadIdx.x == 0) {
    float acc = 0.f;
    for (int i = 0; i < l; i++) {
      acc += vdt[i] * A;
      vlam[i] = acc;
    }
  }
  __syncthreads();
}

// Block (chunk, head) = blockIdx.x·MH + …: U (chunks,MH,MP,DS) and the
// chunk's decay dec (chunks,MH). Shared memory: dY (Q,MP), C (Q,DS), dt,
// sp, Λ (Q each).
template <bool TC, class TX>
__device__ __forceinline__ void sbw_local(float* U, float* dec, const float* dy, const TX* xbc, const float* dtRaw,
                                          const float* dtBias, const float* aLog, const int* ct0, const int* cseg,
                                          const int* offs, int MH, int MP, int G, int DS, float lo, float hi) {
  TG_DYN_SMEM(float, sbw_smem);
  const int c = blockIdx.x / MH, h = blockIdx.x % MH, g = h / (MH / G);
  const int t0 = ct0[c];
  if (t0 < 0) return;
  const int l = min(SBW_Q, offs[cseg[c] + 1] - t0);
  const int DI = MH * MP, CD = DI + 2 * G * DS;
  float* sdY = sbw_smem;
  float* sC = sdY + SBW_Q * MP;
  float* vdt = sC + SBW_Q * DS;
  float* vsp = vdt + SBW_Q;
  float* vlam = vsp + SBW_Q;
  const float A = -(float)exp((double)aLog[h]);
  for (int e = threadIdx.x; e < l * MP; e += blockDim.x)
    sdY[e] = dy[((long long)(t0 + e / MP) * MH + h) * MP + e % MP];
  for (int e = threadIdx.x; e < l * DS; e += blockDim.x)
    sC[e] = ld_f(xbc, (long long)(t0 + e / DS) * CD + DI + (G + g) * DS + e % DS);
  sbw_decays(vdt, vsp, vlam, nullptr, dtRaw, dtBias[h], A, t0, l, MH, h, lo, hi);
  // The products read exp(Λ_i)·C[i] from sC: scale it in place.
  for (int e = threadIdx.x; e < l * DS; e += blockDim.x) sC[e] *= expf(vlam[e / DS]);
  __syncthreads();
  float* u = U + ((long long)c * MH + h) * MP * DS;
  sbw_mm<TC>(
      MP, DS, l, [&](int p, int i) { return sdY[i * MP + p]; }, [&](int i, int n) { return sC[i * DS + n]; },
      [&](int p, int n, float v) { u[p * DS + n] = v; });
  if (threadIdx.x == 0) dec[(long long)c * MH + h] = expf(vlam[l - 1]);
}

extern "C" __global__ void __launch_bounds__(SBW_THREADS)
    ssd_bwd_local(float* U, float* dec, const float* dy, const float* xbc, const float* dtRaw, const float* dtBias,
                  const float* aLog, const int* ct0, const int* cseg, const int* offs, int MH, int MP, int G, int DS,
                  float lo, float hi) {
  sbw_local<false>(U, dec, dy, xbc, dtRaw, dtBias, aLog, ct0, cseg, offs, MH, MP, G, DS, lo, hi);
}
extern "C" __global__ void __launch_bounds__(SBW_THREADS)
    ssd_bwd_local_bf16(float* U, float* dec, const float* dy, const tg_bf16* xbc, const float* dtRaw,
                       const float* dtBias, const float* aLog, const int* ct0, const int* cseg, const int* offs,
                       int MH, int MP, int G, int DS, float lo, float hi) {
  sbw_local<true>(U, dec, dy, xbc, dtRaw, dtBias, aLog, ct0, cseg, offs, MH, MP, G, DS, lo, hi);
}

// Block (tile, head), blockIdx.x = head·tiles + tile: one thread a state
// element e of head h. dS (chunks,MH,PN) holds U on entry, dS1 on exit;
// dsin (NS,MH,PN) each segment's initial-state gradient (for its parent).
extern "C" __global__ void __launch_bounds__(SBW_THREADS)
    ssd_bwd_states(float* dS, float* dsin, const float* dec, const int* offs, const int* parent, const int* ends,
                   int NS, int MH, int PN) {
  const int tiles = (PN + SBW_THREADS - 1) / SBW_THREADS;
  const int h = blockIdx.x / tiles, e = (blockIdx.x % tiles) * SBW_THREADS + threadIdx.x;
  if (h >= MH || e >= PN) return;
  long long ck = 0;
  for (int s = 0; s < NS; s++) ck += (offs[s + 1] - offs[s] + SBW_Q - 1) / SBW_Q;
  for (int s = NS - 1; s >= 0; s--) {
    const int nch = (offs[s + 1] - offs[s] + SBW_Q - 1) / SBW_Q;
    ck -= nch;
    float carried = 0.f;  // the gradient of s's final state: its children's initial-state ones
    for (int c = s + 1; c < NS && offs[c] < ends[s]; c++) {
      if (parent[c] == s) carried += dsin[((long long)c * MH + h) * PN + e];
    }
    for (int k = nch - 1; k >= 0; k--) {
      float* p = dS + ((ck + k) * MH + h) * PN + e;
      const float u = *p;
      *p = carried;
      carried = dec[(ck + k) * MH + h] * carried + u;
    }
    const int p0 = parent[s];
    if (p0 >= 0 && p0 < s) dsin[((long long)s * MH + h) * PN + e] = carried;
  }
}

// Block (chunk, group) = blockIdx.x·G + g. Shared memory (floats): B, C
// (Q,DS each), G = C·Bᵀ (Q,Q), X, dY (Q,MP each), dM (Q,Q), a (Q,MP)
// product, then dt, sp, ∂dt/∂dtRaw, Λ, ddt, dΛ's row and column terms, the
// end state's terms (Q each) and 32 for block sums. part (chunks,MH,3):
// the chunk's Σ_j dΛ-sum·dt_j (∂L/∂A), ∂L/∂D, ∂L/∂dtBias.
template <bool TC, class TX>
__device__ __forceinline__ void sbw_chunk(float* dxbc, float* ddtRaw, float* part, const float* ckpt, const float* dS,
                                          const float* dy, const TX* xbc, const float* dtRaw, const float* dtBias,
                                          const float* aLog, const float* dd, const int* ct0, const int* cseg,
                                          const int* offs, int MH, int MP, int G, int DS, float lo, float hi) {
  TG_DYN_SMEM(float, sbw_smem);
  const int c = blockIdx.x / G, g = blockIdx.x % G, hpg = MH / G;
  const int t0 = ct0[c];
  if (t0 < 0) return;
  const int l = min(SBW_Q, offs[cseg[c] + 1] - t0);
  const int P = MP, N = DS, PN = MP * DS, DI = MH * MP, CD = DI + 2 * G * DS;
  const int Q = SBW_Q;
  float* sB = sbw_smem;
  float* sC = sB + Q * N;
  float* sG = sC + Q * N;
  float* sX = sG + Q * Q;
  float* sdY = sX + Q * P;
  float* sdM = sdY + Q * P;
  float* sbuf = sdM + Q * Q;
  float* vdt = sbuf + Q * P;
  float* vsp = vdt + Q;
  float* vdd = vsp + Q;
  float* vlam = vdd + Q;
  float* vddt = vlam + Q;
  float* vdlr = vddt + Q;
  float* vdlc = vdlr + Q;
  float* vq = vdlc + Q;
  float* scratch = vq + Q;
  for (int e = threadIdx.x; e < l * N; e += blockDim.x) {
    const long long row = (long long)(t0 + e / N) * CD + DI;
    sB[e] = ld_f(xbc, row + g * N + e % N);
    sC[e] = ld_f(xbc, row + (G + g) * N + e % N);
  }
  __syncthreads();
  sbw_mm<TC>(
      l, l, N, [&](int i, int n) { return sC[i * N + n]; }, [&](int n, int j) { return sB[j * N + n]; },
      [&](int i, int j, float v) { sG[i * Q + j] = v; });
  for (int hk = 0; hk < hpg; hk++) {
    const int h = g * hpg + hk;
    const float A = -(float)exp((double)aLog[h]), D = dd[h];
    const float* S0 = ckpt + ((long long)c * MH + h) * PN;
    const float* dS1 = dS + ((long long)c * MH + h) * PN;
    __syncthreads();  // the previous head's readers are done
    for (int e = threadIdx.x; e < l * P; e += blockDim.x) {
      const int i = e / P, p = e % P;
      sX[e] = ld_f(xbc, (long long)(t0 + i) * CD + h * P + p);
      sdY[e] = dy[((long long)(t0 + i) * MH + h) * P + p];
    }
    sbw_decays(vdt, vsp, vlam, vdd, dtRaw, dtBias[h], A, t0, l, MH, h, lo, hi);
    const float last = vlam[l - 1];
    // dM = dY·Xᵀ; the inter-chunk output's C·S0ᵀ into sbuf.
    sbw_mm<TC>(
        l, l, P, [&](int i, int p) { return sdY[i * P + p]; }, [&](int p, int j) { return sX[j * P + p]; },
        [&](int i, int j, float v) { sdM[i * Q + j] = v; });
    sbw_mm<TC>(
        l, P, N, [&](int i, int n) { return sC[i * N + n]; }, [&](int n, int p) { return S0[p * N + n]; },
        [&](int i, int p, float v) { sbuf[i * P + p] = v; });
    __syncthreads();
    // The decays' gradients, by rows (threads 0..l−1: dΛ_i's Σ_j r_ij and
    // the inter-chunk output's term) and by columns (threads 128..: ddt_j's
    // Σ_i dM·G·L_ij and dΛ_j's −dt_j·that), r_ij = dM·G·L_ij·dt_j.
    if (threadIdx.x < l) {
      const int i = threadIdx.x;
      float acc = 0.f, dot = 0.f;
      for (int j = 0; j <= i; j++) acc += sdM[i * Q + j] * sG[i * Q + j] * expf(vlam[i] - vlam[j]) * vdt[j];
      for (int p = 0; p < P; p++) dot += sdY[i * P + p] * sbuf[i * P + p];
      vdlr[i] = acc + expf(vlam[i]) * dot;
    } else if (threadIdx.x >= 128 && threadIdx.x < 128 + l) {
      const int j = threadIdx.x - 128;
      float acc = 0.f;
      for (int i = j; i < l; i++) acc += sdM[i * Q + j] * sG[i * Q + j] * expf(vlam[i] - vlam[j]);
      vddt[j] = acc;
      vdlc[j] = acc * vdt[j];
    }
    __syncthreads();
    // The end state's: B·dS1ᵀ into sbuf, then by rows q_j = x_j·(B·dS1ᵀ)_j.
    sbw_mm<TC>(
        l, P, N, [&](int j, int n) { return sB[j * N + n]; }, [&](int n, int p) { return dS1[p * N + n]; },
        [&](int j, int p, float v) { sbuf[j * P + p] = v; });
    __syncthreads();
    if (threadIdx.x < l) {
      const int j = threadIdx.x;
      float q = 0.f;
      for (int p = 0; p < P; p++) q += sX[j * P + p] * sbuf[j * P + p];
      const float e = expf(last - vlam[j]);
      vddt[j] += e * q;
      vq[j] = e * vdt[j] * q;
    }
    float dotS = 0.f, dotD = 0.f;
    for (int e = threadIdx.x; e < PN; e += blockDim.x) dotS += dS1[e] * S0[e];
    for (int e = threadIdx.x; e < l * P; e += blockDim.x) dotD += sdY[e] * sX[e];
    dotS = block_sum(dotS, scratch);  // its barriers order vq's and vddt's writes too
    dotD = block_sum(dotD, scratch);
    // dX = Mᵀ·dY + w⊙(B·dS1ᵀ) + D·dY, M_kj = G_kj·L_kj·dt_j (k ≥ j).
    float* dxr = dxbc + (long long)t0 * CD;
    sbw_mm<TC>(
        l, P, l,
        [&](int j, int k) { return k >= j ? sG[k * Q + j] * expf(vlam[k] - vlam[j]) * vdt[j] : 0.f; },
        [&](int k, int p) { return sdY[k * P + p]; },
        [&](int j, int p, float v) {
          dxr[(long long)j * CD + h * P + p] = v + expf(last - vlam[j]) * vdt[j] * sbuf[j * P + p] + D * sdY[j * P + p];
        });
    // dC = dG·B + diag(exp Λ)·dY·S0 and dB = dGᵀ·C + diag(w)·X·dS1, dG_ik =
    // dM_ik·L_ik·dt_k (k ≤ i): the group's sums, in head order.
    sbw_mm<TC>(
        l, N, l + P,
        [&](int i, int k) {
          if (k >= l) return expf(vlam[i]) * sdY[i * P + k - l];
          return k <= i ? sdM[i * Q + k] * expf(vlam[i] - vlam[k]) * vdt[k] : 0.f;
        },
        [&](int k, int n) { return k < l ? sB[k * N + n] : S0[(k - l) * N + n]; },
        [&](int i, int n, float v) {
          float* o = dxr + (long long)i * CD + DI + (G + g) * N + n;
          *o = hk == 0 ? v : *o + v;
        });
    sbw_mm<TC>(
        l, N, l + P,
        [&](int j, int k) {
          if (k >= l) return expf(last - vlam[j]) * vdt[j] * sX[j * P + k - l];
          return k >= j ? sdM[k * Q + j] * expf(vlam[k] - vlam[j]) * vdt[j] : 0.f;
        },
        [&](int k, int n) { return k < l ? sC[k * N + n] : dS1[(k - l) * N + n]; },
        [&](int j, int n, float v) {
          float* o = dxr + (long long)j * CD + DI + g * N + n;
          *o = hk == 0 ? v : *o + v;
        });
    // dΛ, reverse-summed: da_j = Σ_{i≥j} dΛ_i; ddt_j += da_j·A, through the
    // clamp and the softplus to dtRaw; ∂L/∂A = Σ_j da_j·dt_j.
    if (threadIdx.x == 0) {
      float sq = 0.f;
      for (int j = 0; j < l; j++) sq += vq[j];
      float da = 0.f, dA = 0.f, dB = 0.f;
      for (int j = l - 1; j >= 0; j--) {
        float dl = vdlr[j] - vdlc[j] - vq[j];
        if (j == l - 1) dl += sq + expf(last) * dotS;
        da += dl;
        dA += da * vdt[j];
        const float gr = (vddt[j] + da * A) * vdd[j];
        ddtRaw[(long long)(t0 + j) * MH + h] = gr;
        dB += gr;
      }
      float* pp = part + ((long long)c * MH + h) * 3;
      pp[0] = dA;
      pp[1] = dotD;
      pp[2] = dB;
    }
  }
}

extern "C" __global__ void __launch_bounds__(SBW_THREADS)
    ssd_bwd_chunk(float* dxbc, float* ddtRaw, float* part, const float* ckpt, const float* dS, const float* dy,
                  const float* xbc, const float* dtRaw, const float* dtBias, const float* aLog, const float* dd,
                  const int* ct0, const int* cseg, const int* offs, int MH, int MP, int G, int DS, float lo,
                  float hi) {
  sbw_chunk<false>(dxbc, ddtRaw, part, ckpt, dS, dy, xbc, dtRaw, dtBias, aLog, dd, ct0, cseg, offs, MH, MP, G, DS,
                   lo, hi);
}
extern "C" __global__ void __launch_bounds__(SBW_THREADS)
    ssd_bwd_chunk_bf16(float* dxbc, float* ddtRaw, float* part, const float* ckpt, const float* dS, const float* dy,
                       const tg_bf16* xbc, const float* dtRaw, const float* dtBias, const float* aLog,
                       const float* dd, const int* ct0, const int* cseg, const int* offs, int MH, int MP, int G,
                       int DS, float lo, float hi) {
  sbw_chunk<true>(dxbc, ddtRaw, part, ckpt, dS, dy, xbc, dtRaw, dtBias, aLog, dd, ct0, cseg, offs, MH, MP, G, DS,
                  lo, hi);
}

// One thread a head: ddtBias, daLog, dd += its chunks' partials (chunks <
// cap whose table entry is set), summed in chunk order.
extern "C" __global__ void ssd_bwd_params(float* ddtBias, float* daLog, float* ddd, const float* part,
                                          const int* ct0, const float* aLog, int MH, int cap) {
  TG_FOR(h, MH) {
    float a = 0.f, d = 0.f, b = 0.f;
    for (int c = 0; c < cap && ct0[c] >= 0; c++) {
      const float* pp = part + ((long long)c * MH + h) * 3;
      a += pp[0];
      d += pp[1];
      b += pp[2];
    }
    const float A = -(float)exp((double)aLog[h]);
    ddtBias[h] += b;
    daLog[h] += a * A;  // A = −exp(aLog): ∂A/∂aLog = A
    ddd[h] += d;
  }
}
