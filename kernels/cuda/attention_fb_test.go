//go:build cgo

package cuda

import (
	"fmt"
	"slices"
	"strings"
	"testing"

	"github.com/tracegrpo/tracegrpo/kernels"
	"github.com/tracegrpo/tracegrpo/kernels/kerneltest"
)

// TestAttentionBackwardDSFallback: with attnDSMaxBytes lowered below a
// case's dS scratch, the packed bf16 backward runs the recomputing
// kernels (attention_bwd_dq_bf16, attention_bwd_dkdv_bf16) and no dq_ds,
// allocates no dS scratch (and the plan counts none: attentionBackwardLedger
// checks allocated == planned), and its dq, dk, dv agree with the dS
// path's within the bf16 attention gradient tolerance.
func TestAttentionBackwardDSFallback(t *testing.T) {
	for _, sh := range []struct {
		lens        []int
		NH, NKV, HD int
	}{
		{[]int{70, 3, 130}, 4, 2, 64},
		{[]int{65, 1, 64}, 2, 1, 128},
	} {
		t.Run(fmt.Sprintf("lens=%v NH=%d NKV=%d HD=%d", sh.lens, sh.NH, sh.NKV, sh.HD), func(t *testing.T) {
			T := 0
			for _, l := range sh.lens {
				T += l
			}
			dsBytes := int64(attnDSWork(T, sh.NH, slices.Max(sh.lens)))
			dqDS := tcKernel(sh.HD, "attention_bwd_dq_ds_tc_hd64", "attention_bwd_dq_ds_tc_hd128")
			old := attnDSMaxBytes
			t.Cleanup(func() { attnDSMaxBytes = old })

			attnDSMaxBytes = dsBytes // exactly fits: the dS path
			want, ranDS := attentionBackwardLedger(t, sh.lens, sh.NH, sh.NKV, sh.HD)
			if !slices.Contains(ranDS, dqDS) {
				t.Fatalf("bound %d = the scratch: launched %v, want %s", dsBytes, ranDS, dqDS)
			}

			attnDSMaxBytes = dsBytes - 1 // one byte short: the recomputing path
			got, ran := attentionBackwardLedger(t, sh.lens, sh.NH, sh.NKV, sh.HD)
			for _, k := range ran {
				if strings.Contains(k, "_ds_") || strings.Contains(k, "_tc_") {
					t.Errorf("bound %d < scratch %d: launched %s (%v)", dsBytes-1, dsBytes, k, ran)
				}
			}
			for _, k := range []string{"attention_bwd_dq_bf16", "attention_bwd_dkdv_bf16"} {
				if !slices.Contains(ran, k) {
					t.Errorf("bound %d < scratch %d: launched %v, not %s", dsBytes-1, dsBytes, ran, k)
				}
			}
			for i, n := range []string{"dq", "dk", "dv"} {
				if msg := kerneltest.Compare(want[i], got[i], kerneltest.TolAttentionBF16Grad); msg != "" {
					t.Errorf("%s: recomputing path vs dS path: %s", n, msg)
				}
			}
		})
	}
}

// TestPlanAttnDSLongContext: at a long context (one 32768-token sequence,
// Qwen3-1.7B's 16 query heads, 8 KV heads of 128) the dS scratch (17 GB)
// is over attnDSMaxBytes and the plan counts none; at the bench shape (8 ×
// 4096 tokens) it is under and counted.
func TestPlanAttnDSLongContext(t *testing.T) {
	for _, c := range []struct {
		T, MaxLen int
		ds        bool
	}{{32768, 32768, false}, {8 * 4096, 4096, true}} {
		a := kernels.Attn{T: c.T, NH: 16, NKV: 8, HD: 128, MaxLen: c.MaxLen, Backward: true, BF16: true}
		sizes := workspaceSizes(kernels.Workload{Attention: []kernels.Attn{a}}, Options{})
		full := int64(attnDSWork(a.T, a.NH, a.MaxLen))
		got, ok := sizes[workAttnDS]
		if ok != c.ds {
			t.Errorf("T=%d MaxLen=%d: dS scratch of %d bytes (bound %d) planned %v (%d bytes), want %v", c.T, c.MaxLen, full, attnDSMaxBytes, ok, got, c.ds)
		}
		if ok && int64(got) != full {
			t.Errorf("T=%d MaxLen=%d: dS scratch planned %d, want %d", c.T, c.MaxLen, got, full)
		}
		if _, ok := sizes[workAttnD]; !ok {
			t.Errorf("T=%d MaxLen=%d: no %s planned", c.T, c.MaxLen, workAttnD)
		}
	}
}
