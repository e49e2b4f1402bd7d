//go:build cgo

package cuda

import (
	"fmt"
	"math"
	"math/rand/v2"
	"slices"
	"testing"

	"github.com/tracegrpo/tracegrpo/kernels"
)

// TestAttentionBackwardBitwiseSeeds: the tensor-core backward over packed
// sequences (dk, dv and the dS scratch in one kernel, dq = dS·K from it in
// another) gives the same bits of dq, dk and dv under every emulator
// schedule seed (block, warp and lane orders): every output element and
// every dS element is written by one lane and summed in a fixed order. It
// also checks that the dS scratch is exactly what PlanWorkspace counts.
func TestAttentionBackwardBitwiseSeeds(t *testing.T) {
	for _, sh := range []struct {
		lens        []int
		NH, NKV, HD int
	}{
		{[]int{70, 3, 130}, 4, 2, 64},
		{[]int{65, 1, 64}, 2, 1, 128},
	} {
		name := fmt.Sprintf("lens=%v NH=%d NKV=%d HD=%d", sh.lens, sh.NH, sh.NKV, sh.HD)
		t.Run(name, func(t *testing.T) {
			var first [][]float32
			for _, seed := range []string{"1", "2", "3"} {
				t.Setenv(emuSeedEnv, seed)
				got, ran := attentionBackwardLedger(t, sh.lens, sh.NH, sh.NKV, sh.HD)
				if dqDS := tcKernel(sh.HD, "attention_bwd_dq_ds_tc_hd64", "attention_bwd_dq_ds_tc_hd128"); !slices.Contains(ran, dqDS) {
					t.Fatalf("seed %s: the backward launched %v, not %s", seed, ran, dqDS)
				}
				if first == nil {
					first = got
					continue
				}
				for i, n := range []string{"dq", "dk", "dv"} {
					if j := firstBitDiff(first[i], got[i]); j >= 0 {
						t.Errorf("seed %s: %s[%d] = %g, seed 1 gave %g", seed, n, j, got[i][j], first[i][j])
					}
				}
			}
		})
	}
}

func firstBitDiff(a, b []float32) int {
	for i := range a {
		if math.Float32bits(a[i]) != math.Float32bits(b[i]) {
			return i
		}
	}
	if len(a) != len(b) {
		return min(len(a), len(b))
	}
	return -1
}

// attentionBackwardLedger runs Attention then AttentionBackward on bf16
// operands drawn from a fixed generator, on a fresh emulator backend, and
// returns dq, dk, dv and the kernels AttentionBackward launched (in order).
func attentionBackwardLedger(t *testing.T, lens []int, NH, NKV, HD int) ([][]float32, []string) {
	b := emuBackend(t, Options{})
	rng := rand.New(rand.NewPCG(36, 25))
	cu := []int32{0}
	for _, l := range lens {
		cu = append(cu, cu[len(cu)-1]+int32(l))
	}
	T, maxLen := int(cu[len(cu)-1]), slices.Max(lens)
	alloc := func(dt kernels.DType, n int) kernels.Buf {
		x, err := b.Alloc(dt, n)
		if err != nil {
			t.Fatal(err)
		}
		return x
	}
	randBF16 := func(n int) kernels.Buf {
		x := alloc(kernels.BF16, n)
		h := make([]uint16, n)
		for i := range h {
			h[i] = uint16(math.Float32bits(float32(rng.NormFloat64())) >> 16)
		}
		b.UploadBF16(x, h)
		return x
	}
	q, k, v, dout := randBF16(T*NH*HD), randBF16(T*NKV*HD), randBF16(T*NKV*HD), randBF16(T*NH*HD)
	out, lse := alloc(kernels.BF16, T*NH*HD), alloc(kernels.F32, T*NH)
	dq, dk, dv := alloc(kernels.F32, T*NH*HD), alloc(kernels.F32, T*NKV*HD), alloc(kernels.F32, T*NKV*HD)
	cuB := alloc(kernels.I32, len(cu))
	b.UploadI32(cuB, cu)
	seqs := kernels.Seqs{CuSeqlens: cuB, S: len(lens), MaxLen: maxLen}
	b.Attention(out, lse, q, k, v, seqs, NH, NKV, HD)
	b.StartLedger()
	b.AttentionBackward(dq, dk, dv, dout, out, lse, q, k, v, seqs, NH, NKV, HD)
	var kernelsRun []string
	for _, l := range b.TakeLedger() {
		kernelsRun = append(kernelsRun, l.Kernel)
	}
	if err := b.Sync(); err != nil {
		t.Fatal(err)
	}
	// Every scratch buffer the backward allocated is the one the plan
	// counts, and the plan counts no other (the dS scratch when it fits
	// under attnDSMaxBytes, none otherwise).
	w := kernels.Workload{Attention: []kernels.Attn{{T: T, NH: NH, NKV: NKV, HD: HD, MaxLen: maxLen, Backward: true, BF16: true}}}
	plan := workspaceSizes(w, Options{})
	for name, s := range b.scratch {
		if s.bytes != plan[name] {
			t.Errorf("scratch %s: %d bytes allocated, the plan counts %d", name, s.bytes, plan[name])
		}
	}
	for name, n := range plan {
		if _, ok := b.scratch[name]; !ok {
			t.Errorf("scratch %s: the plan counts %d bytes, none allocated", name, n)
		}
	}
	res := make([][]float32, 3)
	for i, x := range []kernels.Buf{dq, dk, dv} {
		res[i] = make([]float32, x.N)
		b.DownloadF32(res[i], x)
	}
	return res, kernelsRun
}
