package model

import (
	"fmt"
	"slices"
	"testing"

	"github.com/tracegrpo/tracegrpo/kernels"
	"github.com/tracegrpo/tracegrpo/kernels/cpu"
)

// moeBF16Variants are the MoE goldens with a mixed-precision golden
// (scripts/golden_moe.py): k = 2 renormalised, k = 1 not, and k = 8 with
// dense layers interleaved and the load-balancing loss on.
var moeBF16Variants = []string{"moe_k2_norm", "moe_k1", "moe_k8_step2"}

// TestGoldenMoEBF16 is TestGoldenBF16 for sparse models, with the dense
// families' tolerances: the mixed-precision step against the PyTorch
// policy golden, as it runs and with rounding flips forced to the golden's
// (see golden_bf16_test.go). The rounded operands of a sparse layer are
// its experts' gate, up and silu(gate)·up (N = T·K rows in the policy's
// expert order) and the gradients entering its three GEMMs' backward (the
// experts' down and gate|up, the router's); its routing (fp32 logits,
// float64 softmax) must choose the golden's experts.
func TestGoldenMoEBF16(t *testing.T) {
	for _, v := range moeBF16Variants {
		t.Run(v, func(t *testing.T) {
			g := openGoldenBF16(t, v)
			checkBF16Golden(t, g, openGoldenFile(t, v))
			cfg := testConfig(t, v)

			b := cpu.New(2)
			defer b.Close()
			plain := runGoldenStep(t, v, g, b, nil)
			compareRel(t, "logprob", plain.lp, g.f32(t, "logprob"), bf16FlipLogprobTol)
			compareRel(t, "entropy", plain.ent, g.f32(t, "entropy"), bf16FlipEntropyTol)
			compareRel(t, "loss", plain.loss, g.f32(t, "loss"), bf16FlipLogprobTol)
			for _, p := range NewParamTable(cfg).Params {
				compareNormRel(t, "grad."+p.Name, plain.grads[p.Offset:p.Offset+p.N], g.f32(t, "grad."+p.Name), bf16FlipGradTol)
			}

			fb := newMoEFlipBackend(t, g, cfg)
			defer fb.Close()
			forced := runGoldenStep(t, v, g, fb, fb.flipBackend.Backend)
			fb.checkCalls()
			compareClose(t, "forced logprob", forced.lp, g.f32(t, "logprob"), bf16ForcedLogprobAtol, bf16ForcedLogprobRtol)
			compareClose(t, "forced entropy", forced.ent, g.f32(t, "entropy"), bf16ForcedLogprobAtol, bf16ForcedLogprobRtol)
			compareClose(t, "forced loss", forced.loss, g.f32(t, "loss"), bf16ForcedLogprobAtol, bf16ForcedLogprobRtol)
			compareClose(t, "forced router_loss", []float32{forced.router}, g.f32(t, "router_loss"), 0, moeRouterLossTol)
			worst := 0.0
			for _, p := range NewParamTable(cfg).Params {
				got, want := forced.grads[p.Offset:p.Offset+p.N], g.f32(t, "grad."+p.Name)
				compareClose(t, "forced grad."+p.Name, got, want, bf16ForcedGradAtol, bf16ForcedGradRtol)
				worst = max(worst, compareNormRel(t, "forced grad."+p.Name, got, want, bf16ForcedGradNormTol))
			}
			t.Logf("flips forced: %d forward, %d backward (%v); max |Δ logprob| %.3g, worst ‖Δg‖/‖g‖ %.3g",
				fb.fwdFlips, fb.bwdFlips, fb.flipped, maxAbsDiff(forced.lp, g.f32(t, "logprob")), worst)
			if fb.fwdFlips == 0 && (!slices.Equal(plain.lp, forced.lp) || !slices.Equal(plain.ent, forced.ent)) {
				t.Errorf("no forward value flipped, yet the forced forward pass changed the logprobs or entropies")
			}
		})
	}
}

// moeFlipBackend is flipBackend for a model with sparse layers: it names
// each bf16 operand by the op sequence the model runs (per layer the
// forward's Matmul q|k|v, Attention, Matmul o, then for a dense layer
// Matmul gate|up, SwiGLU, Matmul down, for a sparse one Matmul router,
// GroupedMatmul gate|up (of the gathered ln2 rows: no operand of its own),
// SwiGLU, GroupedMatmul down; the backward from the last layer: a dense
// layer's MatmulBackward down and gate|up, a sparse layer's
// GroupedMatmulBackward down and gate|up and MatmulBackward router, then
// MatmulBackward o, AttentionBackward, MatmulBackward q|k|v).
type moeFlipBackend struct {
	*flipBackend
	mmNames, swNames, gNames, mmbNames, gbNames []string
	mm2, sw, gm, mmb2, gb, attn2, attnb2, tlp2  int
}

func newMoEFlipBackend(t *testing.T, g golden, cfg Config) *moeFlipBackend {
	f := &moeFlipBackend{flipBackend: &flipBackend{Backend: cpu.New(2), t: t, g: g, layers: cfg.NumHiddenLayers}}
	for l := 0; l < cfg.NumHiddenLayers; l++ {
		a := fmt.Sprintf("act.L%d.", l)
		if cfg.SparseLayer(l) {
			f.mmNames = append(f.mmNames, a+"ln1", a+"att", a+"ln2")
			f.swNames = append(f.swNames, a+"egate", a+"eup")
			f.gNames = append(f.gNames, "", a+"eh")
		} else {
			f.mmNames = append(f.mmNames, a+"ln1", a+"att", a+"ln2", a+"h")
			f.swNames = append(f.swNames, a+"gate", a+"up")
		}
	}
	for l := cfg.NumHiddenLayers - 1; l >= 0; l-- {
		d := fmt.Sprintf("dout.L%d.", l)
		if cfg.SparseLayer(l) {
			f.gbNames = append(f.gbNames, d+"edown", d+"egu")
			f.mmbNames = append(f.mmbNames, d+"router", d+"o", d+"qkv")
		} else {
			f.mmbNames = append(f.mmbNames, d+"down", d+"gu", d+"o", d+"qkv")
		}
	}
	return f
}

// next returns names[*i] and advances, or fails when the model ran more
// such ops than expected.
func (f *moeFlipBackend) next(op string, names []string, i *int) string {
	if *i >= len(names) {
		f.t.Fatalf("%s called more than the %d times the model's op sequence has", op, len(names))
	}
	*i++
	return names[*i-1]
}

func (f *moeFlipBackend) Matmul(out, inp, weight kernels.Buf, T, C, OC int) {
	f.force(f.next("Matmul", f.mmNames, &f.mm2), inp)
	f.flipBackend.Backend.Matmul(out, inp, weight, T, C, OC)
}

// MatmulAdd: as flipBackend's, through this Matmul.
func (f *moeFlipBackend) MatmulAdd(out, res, inp, weight kernels.Buf, T, C, OC int) {
	f.Matmul(out, inp, weight, T, C, OC)
	f.flipBackend.Backend.Add(out, out, res, T*OC)
}

func (f *moeFlipBackend) Attention(out, lse, q, k, v kernels.Buf, seqs kernels.Seqs, NH, NKV, HD int) {
	for _, x := range []struct {
		name string
		buf  kernels.Buf
	}{{"q", q}, {"k", k}, {"v", v}} {
		f.force(fmt.Sprintf("act.L%d.%s", f.attn2, x.name), x.buf)
	}
	f.attn2++
	f.flipBackend.Backend.Attention(out, lse, q, k, v, seqs, NH, NKV, HD)
}

func (f *moeFlipBackend) SwiGLU(out, gate, up kernels.Buf, N int) {
	f.force(f.next("SwiGLU", f.swNames, &f.sw), gate)
	f.force(f.next("SwiGLU", f.swNames, &f.sw), up)
	f.flipBackend.Backend.SwiGLU(out, gate, up, N)
}

func (f *moeFlipBackend) SwiGLURows(out, gu kernels.Buf, R, I int) {
	gate := f.next("SwiGLU", f.swNames, &f.sw)
	f.forceRows(gate, f.next("SwiGLU", f.swNames, &f.sw), gu, R, I)
	f.flipBackend.Backend.SwiGLURows(out, gu, R, I)
}

func (f *moeFlipBackend) GroupedMatmul(out, inp, weight, offsets kernels.Buf, N, C, OC, E int) {
	if name := f.next("GroupedMatmul", f.gNames, &f.gm); name != "" {
		f.force(name, inp)
	}
	f.flipBackend.Backend.GroupedMatmul(out, inp, weight, offsets, N, C, OC, E)
}

func (f *moeFlipBackend) TokenLogprob(logprob, entropy, lse, hidden, weight, targets kernels.Buf, T, C, V int, invTemp float32) {
	f.force("act.lnf", hidden)
	f.tlp2++
	f.flipBackend.Backend.TokenLogprob(logprob, entropy, lse, hidden, weight, targets, T, C, V, invTemp)
}

func (f *moeFlipBackend) MatmulBackward(dinp, dweight, dout, inp, weight kernels.Buf, T, C, OC int) {
	f.inBackward = true
	f.force(f.next("MatmulBackward", f.mmbNames, &f.mmb2), dout)
	f.flipBackend.Backend.MatmulBackward(dinp, dweight, dout, inp, weight, T, C, OC)
}

func (f *moeFlipBackend) MatmulBackwardFresh(dinp, dweight, dout, inp, weight kernels.Buf, T, C, OC int) {
	f.inBackward = true
	f.force(f.next("MatmulBackward", f.mmbNames, &f.mmb2), dout)
	f.flipBackend.Backend.MatmulBackwardFresh(dinp, dweight, dout, inp, weight, T, C, OC)
}

func (f *moeFlipBackend) GroupedMatmulBackward(dinp, dweight, dout, inp, weight, offsets kernels.Buf, N, C, OC, E int) {
	f.inBackward = true
	f.force(f.next("GroupedMatmulBackward", f.gbNames, &f.gb), dout)
	f.flipBackend.Backend.GroupedMatmulBackward(dinp, dweight, dout, inp, weight, offsets, N, C, OC, E)
}

func (f *moeFlipBackend) AttentionBackward(dq, dk, dv, dout, out, lse, q, k, v kernels.Buf, seqs kernels.Seqs, NH, NKV, HD int) {
	f.inBackward = true
	f.force(fmt.Sprintf("dout.L%d.att", f.layers-1-f.attnb2), dout)
	f.attnb2++
	f.flipBackend.Backend.AttentionBackward(dq, dk, dv, dout, out, lse, q, k, v, seqs, NH, NKV, HD)
}

// checkCalls fails unless every op ran exactly as often as the model's op
// sequence says.
func (f *moeFlipBackend) checkCalls() {
	f.t.Helper()
	got := []int{f.mm2, f.sw, f.gm, f.mmb2, f.gb, f.attn2, f.attnb2, f.tlp2}
	want := []int{len(f.mmNames), len(f.swNames), len(f.gNames), len(f.mmbNames), len(f.gbNames), f.layers, f.layers, 1}
	if !slices.Equal(got, want) {
		f.t.Errorf("op calls (Matmul, SwiGLU, GroupedMatmul, MatmulBackward, GroupedMatmulBackward, Attention, AttentionBackward, TokenLogprob) = %v, want %v: "+
			"the model's op sequence changed; update moeFlipBackend", got, want)
	}
}
