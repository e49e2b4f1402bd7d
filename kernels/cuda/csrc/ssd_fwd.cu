// ssd_fwd.cu: the forward of the Mamba-2 scan (kernels.Mamba.SSMScan) on a
// bf16 xbc as the chunked SSD algorithm on tensor cores (mma.sync m16n8k16,
// bf16 operands, fp32 accumulators), over a packed tree (kernels.Tree).
//
//   ssd_scan_fwd_bf16: y (T,MH,MP), each segment's final state (NS,MH,MP,DS)
//                      and, when ckpt is set, the state before every
//                      SSD_Q-th token of a segment: the outputs, layouts and
//                      checkpoint contract of mamba.cu's ssm_scan_fwd_bf16
//                      (the backward's input), its arguments too          (=)
//
// Block (p-tile, head) = (blockIdx.x, blockIdx.y) owns the SSD_PT columns
// p ∈ [16·blockIdx.x, +16) of head h (the state's rows p evolve alone: y's
// column p reads only row p of the state). It walks the tree's segments in
// preorder, each from its parent's final state (which it wrote itself:
// no block reads another's), and each segment in chunks of SSD_Q tokens
// from the segment's first (chunk starts are the checkpoints: SSD_Q is
// mamba.cu's MB_Q). A chunk of l ≤ SSD_Q rows with dt_j, a_j = dt_j·A and
// Λ_i = Σ_{j≤i} a_j (a fixed left-to-right sum, thread 0), S0 its start
// state:
//
//   Y  = diag(exp Λ)·(C·S0ᵀ) + (C·Bᵀ ⊙ L)·X + D·X,  L_ij = exp(Λ_i − Λ_j)·dt_j (j ≤ i), 0 above
//   S1 = exp(Λ_last)·S0 + (diag(w)·X)ᵀ·B,            w_j = exp(Λ_last − Λ_j)·dt_j
//
// Four warps; warp w owns the chunk's rows [16w, 16w+16) of Y (C·S0ᵀ, then
// the causal tiles j < 16(w+1) of C·Bᵀ in registers, masked and scaled,
// repacked as the A operand of (·)·X, FlashAttention's register reuse) and
// the state's columns n ∈ [32w, 32w+32) (16 × 32 fp32 accumulators a warp,
// kept in registers across chunks and segments). The tensor-core operands
// are bf16: x, B and C exactly (xbc is bf16); the fp32 operands (the masked
// C·Bᵀ, diag(w)·X and S0) each as two bf16, the value rounded and the rest
// rounded (ssd_split2), in two products against the exact one, so that
// they carry 16 bits, not 8 (mamba_ssm's Triton kernels round them to the
// input's dtype once: with DS = 128 that cost y ~5% of its scale, measured
// by TestSSDForwardEmu). The state, Λ and every accumulation stay fp32.
// Sums run in orders fixed by the shapes: the same bits on every run.
// DS ≤ SSD_DSMAX (padded to a multiple of 16 with zeros); any MP (the last
// p-tile's columns past MP are zeros).
#include "attention_tc.cuh"
#include "common.cuh"

#define SSD_THREADS 128
#define SSD_Q 64                // chunk rows: mamba.cu's MB_Q
#define SSD_PT 16               // a block's columns p
#define SSD_DSMAX 128           // the largest state size
#define SSD_LDN (SSD_DSMAX + 8) // row stride of the (rows, n) tiles: 16 bytes of padding
#define SSD_LDP (SSD_PT + 8)    // of the (rows, p) tiles
// The dynamic shared memory: B, C (rows, n), S0's two parts (p, n), X and
// diag(w)·X's two parts (rows, p) in bf16, dt and Λ (rows) in fp32.
#define SSD_SMEM (2 * (2 * SSD_Q * SSD_LDN + 2 * SSD_PT * SSD_LDN + 3 * SSD_Q * SSD_LDP) + 8 * SSD_Q)

// dt = clamp(softplus(raw + bias), lo, hi), the softplus in double: mamba.cu's mb_dt.
__device__ __forceinline__ float ssd_dt(float raw, float bias, float lo, float hi) {
  const double xd = (double)(raw + bias);
  const float sp = (float)(xd > 20.0 ? xd : log1p(exp(xd)));
  return fminf(fmaxf(sp, lo), hi);
}

// hi, lo: the bf16 pairs (v0, v1) rounded, and what rounding left of them,
// rounded: v = hi + lo to 2^-16 relative, so a product with an exact bf16
// operand in two mma.sync (hi·b + lo·b) is as good as fp32's to that.
__device__ __forceinline__ void ssd_split2(unsigned* hi, unsigned* lo, float v0, float v1) {
  const tg_bf16 h0 = tg_round(v0), h1 = tg_round(v1);
  *hi = (unsigned)h0 | ((unsigned)h1 << 16);
  *lo = pack_bf16x2(v0 - tg_widen(h0), v1 - tg_widen(h1));
}

// The A fragment (m = p 16 × k = rows 16) of the transpose of a (rows, p)
// tile with stride SSD_LDP, rows k0..k0+15: ldmatrix.trans of its four 8×8
// blocks, (k0.., p 0..), (k0.., p 8..), (k0+8.., p 0..), (k0+8.., p 8..).
__device__ __forceinline__ void ssd_frag_at(unsigned a[4], const tg_bf16* tile, int k0, int lane) {
  ldmatrix_x4_trans(a, tile + (k0 + (lane & 7) + 8 * (lane >> 4)) * SSD_LDP + 8 * ((lane >> 3) & 1));
}

extern "C" __global__ void __launch_bounds__(SSD_THREADS) ssd_scan_fwd_bf16(
    float* y, float* fin, float* ckpt, const tg_bf16* xbc, const float* dtRaw, const float* dtBias,
    const float* aLog, const float* dd, const int* offs, const int* parent, int NS, int T, int MH, int MP, int G,
    int DS, float lo, float hi) {
  // Dynamic shared memory (SSD_SMEM bytes, over the static 48 KiB):
  TG_DYN_SMEM_ALIGNED(tg_bf16, ssd_smem);
  tg_bf16* sB = ssd_smem;                    // B (rows, n)
  tg_bf16* sC = sB + SSD_Q * SSD_LDN;        // C (rows, n)
  tg_bf16* sS = sC + SSD_Q * SSD_LDN;        // S0 (p, n): its bf16 high part
  tg_bf16* sSl = sS + SSD_PT * SSD_LDN;      //   and the rest, rounded
  tg_bf16* sX = sSl + SSD_PT * SSD_LDN;      // X (rows, p)
  tg_bf16* sXw = sX + SSD_Q * SSD_LDP;       // diag(w)·X: high part
  tg_bf16* sXwl = sXw + SSD_Q * SSD_LDP;     //   and the rest
  float* sdt = (float*)(sXwl + SSD_Q * SSD_LDP);
  float* slam = sdt + SSD_Q;
  const int p0 = blockIdx.x * SSD_PT, h = blockIdx.y;
  const int g = h / (MH / G), PN = MP * DS, DI = MH * MP, CD = DI + 2 * G * DS;
  const int tid = threadIdx.x, lane = tid & 31, w = tid >> 5, gr = lane >> 2, tq = lane & 3;
  const int DSP = (DS + 15) & ~15, KS = DSP / 16;
  const float A = -(float)exp((double)aLog[h]), D = dd[h], bias = dtBias[h];
  (void)T;
  // The state: st[j][e] is S[p][n] at p = gr + 8·(e/2), n = 32w + 8j + 2tq + e%2.
  float st[4][4];
  long long ck = 0;  // the next checkpoint
  for (int s = 0; s < NS; s++) {
    const int par = parent[s], t0 = offs[s], t1 = offs[s + 1];
    const bool fromParent = par >= 0 && par < s;
#pragma unroll
    for (int j = 0; j < 4; j++) {
#pragma unroll
      for (int e = 0; e < 4; e++) {
        const int p = p0 + gr + 8 * (e >> 1), n = 32 * w + 8 * j + 2 * tq + (e & 1);
        st[j][e] = fromParent && p < MP && n < DS ? fin[((long long)par * MH + h) * PN + (long long)p * DS + n] : 0.f;
      }
    }
    for (int c0 = t0; c0 < t1; c0 += SSD_Q) {
      const int nr = min(SSD_Q, t1 - c0), nk = (nr + 15) / 16;  // rows, their 16-row steps
      const bool zero0 = c0 == t0 && !fromParent;                // S0 = 0
      __syncthreads();  // the previous chunk's readers are done
      // S0: bf16 into sS for C·S0ᵀ, fp32 into the checkpoint.
#pragma unroll
      for (int j = 0; j < 4; j++) {
        const int n = 32 * w + 8 * j + 2 * tq;
        if (n >= DSP) continue;
#pragma unroll
        for (int hf = 0; hf < 2; hf++) {
          const int p = gr + 8 * hf;
          unsigned hi, lo;
          ssd_split2(&hi, &lo, st[j][2 * hf], st[j][2 * hf + 1]);
          *(unsigned*)(sS + p * SSD_LDN + n) = hi;
          *(unsigned*)(sSl + p * SSD_LDN + n) = lo;
          if (ckpt != nullptr && p0 + p < MP) {
            float* cp = ckpt + (ck * MH + h) * PN + (long long)(p0 + p) * DS;
            if (n < DS) cp[n] = st[j][2 * hf];
            if (n + 1 < DS) cp[n + 1] = st[j][2 * hf + 1];
          }
        }
      }
      ck++;
      // The chunk's rows (zeros past the segment, to the last 16-row step).
      const int rows = 16 * nk;
      for (int e = tid; e < rows * DSP; e += SSD_THREADS) {
        const int i = e / DSP, n = e - i * DSP;
        tg_bf16 vb = 0, vc = 0;
        if (i < nr && n < DS) {
          const tg_bf16* r = xbc + (long long)(c0 + i) * CD + DI;
          vb = r[g * DS + n];
          vc = r[(G + g) * DS + n];
        }
        sB[i * SSD_LDN + n] = vb;
        sC[i * SSD_LDN + n] = vc;
      }
      for (int e = tid; e < rows * SSD_PT; e += SSD_THREADS) {
        const int i = e / SSD_PT, p = e % SSD_PT;
        sX[i * SSD_LDP + p] = i < nr && p0 + p < MP ? xbc[(long long)(c0 + i) * CD + h * MP + p0 + p] : (tg_bf16)0;
      }
      if (tid < SSD_Q) sdt[tid] = tid < nr ? ssd_dt(dtRaw[(long long)(c0 + tid) * MH + h], bias, lo, hi) : 0.f;
      __syncthreads();
      if (tid == 0) {
        float acc = 0.f;
        for (int i = 0; i < SSD_Q; i++) {
          acc += sdt[i] * A;
          slam[i] = acc;
        }
      }
      __syncthreads();
      const float lastLam = slam[SSD_Q - 1];  // = Λ at the last row: dt is 0 past it
      for (int e = tid; e < rows * SSD_PT; e += SSD_THREADS) {
        const int i = e / SSD_PT, p = e % SSD_PT;
        const float v = expf(lastLam - slam[i]) * sdt[i] * tg_widen(sX[i * SSD_LDP + p]);
        const tg_bf16 hv = tg_round(v);
        sXw[i * SSD_LDP + p] = hv;
        sXwl[i * SSD_LDP + p] = tg_round(v - tg_widen(hv));
      }
      __syncthreads();
      // Warp w's rows of Y.
      const int r0 = 16 * w;
      if (r0 < nr) {
        float yacc[2][4], gacc[8][4];
#pragma unroll
        for (int e = 0; e < 4; e++) yacc[0][e] = yacc[1][e] = 0.f;
#pragma unroll
        for (int c = 0; c < 8; c++) {
#pragma unroll
          for (int e = 0; e < 4; e++) gacc[c][e] = 0.f;
        }
        for (int k = 0; k < KS; k++) {
          unsigned a[4], b[4];
          tc_frag_a<SSD_DSMAX>(a, sC, r0, 16 * k, lane);
          if (!zero0) {
            tc_frag_b<SSD_DSMAX>(b, sS, 0, 16 * k, lane);
            mma_bf16_16816(yacc[0], a, b);
            mma_bf16_16816(yacc[1], a, b + 2);
            tc_frag_b<SSD_DSMAX>(b, sSl, 0, 16 * k, lane);
            mma_bf16_16816(yacc[0], a, b);
            mma_bf16_16816(yacc[1], a, b + 2);
          }
#pragma unroll
          for (int c2 = 0; c2 < 4; c2++) {
            if (c2 > w) continue;
            tc_frag_b<SSD_DSMAX>(b, sB, 16 * c2, 16 * k, lane);
            mma_bf16_16816(gacc[2 * c2], a, b);
            mma_bf16_16816(gacc[2 * c2 + 1], a, b + 2);
          }
        }
        const int i0 = r0 + gr, i1 = i0 + 8;
        const float l0 = slam[i0], l1 = slam[i1];
        const float e0 = expf(l0), e1 = expf(l1);
#pragma unroll
        for (int nt = 0; nt < 2; nt++) {
          yacc[nt][0] *= e0;
          yacc[nt][1] *= e0;
          yacc[nt][2] *= e1;
          yacc[nt][3] *= e1;
        }
#pragma unroll
        for (int kk = 0; kk < 4; kk++) {
          if (kk > w) continue;
#pragma unroll
          for (int c = 2 * kk; c < 2 * kk + 2; c++) {
#pragma unroll
            for (int e = 0; e < 4; e++) {
              const int i = e < 2 ? i0 : i1, j = 8 * c + 2 * tq + (e & 1);
              const float li = e < 2 ? l0 : l1;
              gacc[c][e] = j <= i ? gacc[c][e] * expf(li - slam[j]) * sdt[j] : 0.f;
            }
          }
          unsigned a[4], al[4], b[4];
          ssd_split2(&a[0], &al[0], gacc[2 * kk][0], gacc[2 * kk][1]);
          ssd_split2(&a[1], &al[1], gacc[2 * kk][2], gacc[2 * kk][3]);
          ssd_split2(&a[2], &al[2], gacc[2 * kk + 1][0], gacc[2 * kk + 1][1]);
          ssd_split2(&a[3], &al[3], gacc[2 * kk + 1][2], gacc[2 * kk + 1][3]);
          tc_frag_bt<SSD_PT>(b, sX, 16 * kk, 0, lane);
          mma_bf16_16816(yacc[0], a, b);
          mma_bf16_16816(yacc[1], a, b + 2);
          mma_bf16_16816(yacc[0], al, b);
          mma_bf16_16816(yacc[1], al, b + 2);
        }
        if (y != nullptr) {
#pragma unroll
          for (int nt = 0; nt < 2; nt++) {
#pragma unroll
            for (int e = 0; e < 4; e++) {
              const int i = e < 2 ? i0 : i1, p = 8 * nt + 2 * tq + (e & 1);
              if (i < nr && p0 + p < MP)
                y[((long long)(c0 + i) * MH + h) * MP + p0 + p] = yacc[nt][e] + D * tg_widen(sX[i * SSD_LDP + p]);
            }
          }
        }
      }
      // Warp w's columns of the state: S1 = exp(Λ_last)·S0 + (diag(w)·X)ᵀ·B.
      const float eL = expf(lastLam);
#pragma unroll
      for (int j = 0; j < 4; j++) {
#pragma unroll
        for (int e = 0; e < 4; e++) st[j][e] *= eL;
      }
      for (int kk = 0; kk < nk; kk++) {
        unsigned a[4], al[4];
        ssd_frag_at(a, sXw, 16 * kk, lane);
        ssd_frag_at(al, sXwl, 16 * kk, lane);
#pragma unroll
        for (int jp = 0; jp < 2; jp++) {
          const int n0 = 32 * w + 16 * jp;
          if (n0 >= DSP) continue;
          unsigned b[4];
          tc_frag_bt<SSD_DSMAX>(b, sB, 16 * kk, n0, lane);
          mma_bf16_16816(st[2 * jp], a, b);
          mma_bf16_16816(st[2 * jp + 1], a, b + 2);
          mma_bf16_16816(st[2 * jp], al, b);
          mma_bf16_16816(st[2 * jp + 1], al, b + 2);
        }
      }
    }
    // The segment's final state.
#pragma unroll
    for (int j = 0; j < 4; j++) {
#pragma unroll
      for (int e = 0; e < 4; e++) {
        const int p = p0 + gr + 8 * (e >> 1), n = 32 * w + 8 * j + 2 * tq + (e & 1);
        if (p < MP && n < DS) fin[((long long)s * MH + h) * PN + (long long)p * DS + n] = st[j][e];
      }
    }
  }
}
