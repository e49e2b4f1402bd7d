package bench

import (
	"bytes"
	"strings"
	"testing"
	"time"

	"github.com/tracegrpo/tracegrpo/kernels"
	"github.com/tracegrpo/tracegrpo/kernels/cpu"
)

// TestProfileCountsFLOPs: --profile credits each matrix op with the FLOPs
// of the products it computes, from the shapes of the call (and, for
// attention, the sequence lengths the backend holds), and nothing to the
// memory-bound ops.
func TestProfileCountsFLOPs(t *testing.T) {
	be := cpu.New(1)
	defer be.Close()
	p := newTimedBackend(be)
	alloc := func(dt kernels.DType, n int) kernels.Buf {
		b, err := be.Alloc(dt, n)
		if err != nil {
			t.Fatal(err)
		}
		return b
	}
	const T, C, OC, V, NH, NKV, HD = 8, 6, 5, 7, 2, 1, 4
	inp, w, out := alloc(kernels.F32, T*C), alloc(kernels.F32, OC*C), alloc(kernels.F32, T*OC)
	dinp, dw := alloc(kernels.F32, T*C), alloc(kernels.F32, OC*C)
	var none kernels.Buf
	p.Matmul(out, inp, w, T, C, OC)
	p.MatmulBackward(dinp, none, out, inp, w, T, C, OC) // dinp only
	p.MatmulBackward(dinp, dw, out, inp, w, T, C, OC)   // both
	wv, tg := alloc(kernels.F32, V*C), alloc(kernels.I32, T)
	lp, ent, lse := alloc(kernels.F32, T), alloc(kernels.F32, T), alloc(kernels.F32, T)
	p.TokenLogprob(lp, ent, lse, inp, wv, tg, T, C, V, 1)
	p.TokenLogprobBackward(dinp, alloc(kernels.F32, V*C), lp, inp, wv, tg, lse, T, C, V, 1)
	// Two sequences of 3 and 5 tokens: 6 + 15 causal (query, key) pairs.
	cu := alloc(kernels.I32, 3)
	be.UploadI32(cu, []int32{0, 3, 8})
	seqs := kernels.Seqs{CuSeqlens: cu, S: 2, MaxLen: 5}
	q, k, v := alloc(kernels.F32, T*NH*HD), alloc(kernels.F32, T*NKV*HD), alloc(kernels.F32, T*NKV*HD)
	ao, alse := alloc(kernels.F32, T*NH*HD), alloc(kernels.F32, T*NH)
	p.Attention(ao, alse, q, k, v, seqs, NH, NKV, HD)
	p.AttentionBackward(alloc(kernels.F32, T*NH*HD), alloc(kernels.F32, T*NKV*HD), alloc(kernels.F32, T*NKV*HD), ao, ao, alse, q, k, v, seqs, NH, NKV, HD)
	p.Fill(dinp, 0)
	if err := p.Sync(); err != nil {
		t.Fatal(err)
	}
	mm := 2.0 * T * C * OC
	attn := 4.0 * NH * HD * (6 + 15)
	want := map[string]float64{
		"Matmul":               mm,
		"MatmulBackward":       mm + 2*mm,
		"TokenLogprob":         2.0 * T * C * V,
		"TokenLogprobBackward": 3 * 2.0 * T * C * V, // the logits again, dhidden, dweight
		"Attention":            attn,
		"AttentionBackward":    2.5 * attn,
		"Fill":                 0,
	}
	for op, f := range want {
		s := p.stats[op]
		if s == nil {
			t.Errorf("%s was not timed", op)
			continue
		}
		if s.flops != f {
			t.Errorf("%s: %g FLOPs counted, want %g", op, s.flops, f)
		}
	}
	// The report gives the counted ops a rate and a fraction of the peak
	// it is handed, and the others none. (Each op's times are set, so that
	// the report does not depend on how long the calls took.)
	for _, s := range p.stats {
		s.cur, s.cpu = time.Millisecond, time.Millisecond
	}
	p.cpuOK = true
	p.endStep()
	var buf bytes.Buffer
	p.report(&buf, 1, 1000, Peak{GFLOPS: 100, PerThread: 50, How: "test peak"})
	for _, l := range strings.Split(buf.String(), "\n") {
		f := strings.Fields(l)
		if len(f) == 0 {
			continue
		}
		switch {
		case f[0] == "Fill" && (len(f) != 11 || f[6] != "-" || f[7] != "-" || f[9] != "-" || f[10] != "-"):
			t.Errorf("Fill has a rate: %q", l)
		case want[f[0]] > 0 && (len(f) != 11 || !strings.HasSuffix(f[7], "%") || !strings.HasSuffix(f[10], "%")):
			t.Errorf("%s has no fraction of peak or of a core's peak: %q", f[0], l)
		}
	}
	if !strings.Contains(buf.String(), "(matrix ops)") || !strings.Contains(buf.String(), "peak: test peak") {
		t.Errorf("report lacks the matrix ops' line or the peak's account:\n%s", buf.String())
	}
}
