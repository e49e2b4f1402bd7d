package model

import (
	"fmt"
	"math"
	"path/filepath"
	"slices"
	"testing"

	"github.com/tracegrpo/tracegrpo/internal/safetensors"
	"github.com/tracegrpo/tracegrpo/kernels"
	"github.com/tracegrpo/tracegrpo/kernels/cpu"
)

// The mixed-precision step (Options.Precision BF16) against
// scripts/golden_model_bf16.py, a PyTorch implementation of the policy
// written from its documentation: float32 arithmetic, bf16 rounding (to
// nearest even) where the policy stores a value in bf16.
//
// Two float32 implementations sum in different orders, so a result within a
// few float32 ulps of a bf16 rounding boundary can round to either
// neighbouring bf16 value: a flip. A flip moves that value by a bf16 ulp
// (2^-8 relative) and everything downstream; later roundings of the moved
// values flip in turn. Injected into the golden one at a time (150 random
// forward and 100 backward values per variant), a single flip moved
// logprobs by up to 1.0e-2·(1+|x|), entropies by up to 2.1e-2·(1+|x|) and a
// parameter's gradient by up to 2.1e-2 (‖Δg‖/‖g‖) from the forward pass,
// 3.8e-3 from the backward pass: as much as leaving out one of the policy's
// roundings (3.8e-3 to 3.8e-2 for gradients in the golden). So the step is
// compared twice:
//
//   - as it runs, within what a few flips can do (bf16Flip*);
//   - with flips forced (flipBackend): each bf16 operand an op reads is
//     compared with the golden's value, at most bf16FlipFraction of its
//     elements may be the neighbouring bf16 value (they are set to the
//     golden's) and none may differ otherwise; the outputs must then agree
//     to float32 rounding (bf16Forced*), four orders of magnitude tighter
//     than TestBF16StepCloseToF32.
//
// Measured on this golden, alike on the avx2, avx512 and go SIMD paths and
// on arm64: no forward value flips, so the logprobs as they run are held to
// the forced tolerances too; 2 to 5 backward flips per variant, after which
// the gradients as they run differ by up to 1.7e-3 (qwen3_untied), 6.3e-5
// (llama_tied) and 1.1e-6 (qwen2_untied).
const (
	// As it runs: about twice the largest single-flip effects above.
	bf16FlipLogprobTol = 2e-2 // |Δ| ≤ tol·(1+|x|), logprob and loss
	bf16FlipEntropyTol = 4e-2 // |Δ| ≤ tol·(1+|x|)
	bf16FlipGradTol    = 4e-2 // ‖Δg‖/‖g‖ per parameter

	// Flips forced: measured worst 1.9e-6 for logprobs (values to 28),
	// 1.6e-6 for entropies, 1.5e-5 for the loss (~250); for gradients
	// (values to ~40) 1.9e-5 abs, within 1.8e-6 + 1e-4·|g|, and 6.2e-7
	// ‖Δg‖/‖g‖. The tolerances are about 5× that.
	bf16ForcedLogprobAtol = 1e-5
	bf16ForcedLogprobRtol = 1e-6
	bf16ForcedGradAtol    = 1e-5
	bf16ForcedGradRtol    = 1e-4
	bf16ForcedGradNormTol = 3e-6 // ‖Δg‖/‖g‖ per parameter

	// At most this fraction of a rounded tensor's elements (and at least
	// four) may be flips; at most two per tensor were measured. A wrong
	// rounding (an extra or a missing one, a stale operand) changes a
	// large share of them: 189 to 1963 in the checks made.
	bf16FlipFraction = 1.0 / 256
	bf16FlipMin      = 4
)

// bf16Negligible: a difference below this fraction of a rounded tensor's
// largest value is no flip and carries no information: it is float32
// cancellation around zero (attention's dS = P·(dP − D) at a sequence's
// first token is 0 in exact arithmetic, ~1e-8 in float32).
const bf16Negligible = 1.0 / (1 << 20)

func openGoldenBF16(t *testing.T, variant string) golden {
	t.Helper()
	f, err := safetensors.Open(filepath.Join("testdata", variant, "golden_bf16.safetensors"))
	if err != nil {
		t.Fatalf("%v (regenerate with /usr/bin/python3 scripts/golden_model_bf16.py)", err)
	}
	t.Cleanup(func() { f.Close() })
	return golden{f}
}

// TestGoldenBF16 runs the golden batch through the model under mixed
// precision and compares logprobs, entropies, the loss and every gradient
// with the PyTorch bf16 golden: as the model runs, and with rounding flips
// forced to the golden's (see the constants above).
func TestGoldenBF16(t *testing.T) {
	for _, v := range precisionVariants {
		t.Run(v, func(t *testing.T) {
			g := openGoldenBF16(t, v)
			checkBF16Golden(t, g, openGoldenFile(t, v))

			b := cpu.New(2)
			defer b.Close()
			plain := runGoldenStep(t, v, g, b, nil)
			compareRel(t, "logprob", plain.lp, g.f32(t, "logprob"), bf16FlipLogprobTol)
			compareRel(t, "entropy", plain.ent, g.f32(t, "entropy"), bf16FlipEntropyTol)
			compareRel(t, "loss", plain.loss, g.f32(t, "loss"), bf16FlipLogprobTol)
			var worst float64
			var worstName string
			for _, p := range NewParamTable(testConfig(t, v)).Params {
				e := compareNormRel(t, "grad."+p.Name, plain.grads[p.Offset:p.Offset+p.N], g.f32(t, "grad."+p.Name), bf16FlipGradTol)
				if e > worst {
					worst, worstName = e, p.Name
				}
			}
			t.Logf("as it runs: max |Δ logprob| %.3g, worst ‖Δg‖/‖g‖ %.3g (%s)",
				maxAbsDiff(plain.lp, g.f32(t, "logprob")), worst, worstName)

			fb := &flipBackend{Backend: cpu.New(2), t: t, g: g, layers: testConfig(t, v).NumHiddenLayers}
			defer fb.Close()
			forced := runGoldenStep(t, v, g, fb, nil)
			fb.checkCalls()
			compareClose(t, "forced logprob", forced.lp, g.f32(t, "logprob"), bf16ForcedLogprobAtol, bf16ForcedLogprobRtol)
			compareClose(t, "forced entropy", forced.ent, g.f32(t, "entropy"), bf16ForcedLogprobAtol, bf16ForcedLogprobRtol)
			compareClose(t, "forced loss", forced.loss, g.f32(t, "loss"), bf16ForcedLogprobAtol, bf16ForcedLogprobRtol)
			worst = 0
			for _, p := range NewParamTable(testConfig(t, v)).Params {
				got, want := forced.grads[p.Offset:p.Offset+p.N], g.f32(t, "grad."+p.Name)
				compareClose(t, "forced grad."+p.Name, got, want, bf16ForcedGradAtol, bf16ForcedGradRtol)
				worst = max(worst, compareNormRel(t, "forced grad."+p.Name, got, want, bf16ForcedGradNormTol))
			}
			t.Logf("flips forced: %d forward, %d backward (%v); max |Δ logprob| %.3g, worst ‖Δg‖/‖g‖ %.3g",
				fb.fwdFlips, fb.bwdFlips, fb.flipped, maxAbsDiff(forced.lp, g.f32(t, "logprob")), worst)
			// Without a forward flip the forced forward pass is the plain
			// one: the checks above then hold the model's own logprobs to
			// the forced tolerances.
			if fb.fwdFlips == 0 && (!slices.Equal(plain.lp, forced.lp) || !slices.Equal(plain.ent, forced.ent)) {
				t.Errorf("no forward value flipped, yet the forced forward pass changed the logprobs or entropies")
			}
		})
	}
}

// checkBF16Golden checks that the bf16 golden holds the fp32 golden's batch
// and that its results differ from the fp32 golden's by far more than the
// forced tolerances: a model that ignored Precision would fail.
func checkBF16Golden(t *testing.T, g, fp32 golden) {
	t.Helper()
	for _, name := range []string{"tokens", "cu_seqlens"} {
		if !slices.Equal(g.i32(t, name), fp32.i32(t, name)) {
			t.Fatalf("golden_bf16 %s differ from golden's (regenerate with scripts/golden_model_bf16.py)", name)
		}
	}
	for _, name := range []string{"temperature", "coef"} {
		if !slices.Equal(g.f32(t, name), fp32.f32(t, name)) {
			t.Fatalf("golden_bf16 %s differs from golden's (regenerate with scripts/golden_model_bf16.py)", name)
		}
	}
	if gap := maxAbsDiff(g.f32(t, "logprob"), fp32.f32(t, "logprob")); gap < 1000*bf16ForcedLogprobAtol {
		t.Fatalf("bf16 and fp32 goldens' logprobs differ by at most %g: the golden cannot tell the precisions apart", gap)
	}
}

// goldenStep is one forward and backward of the golden batch: the
// logprobs, entropies, loss and gradients, and a sparse model's
// load-balancing loss (router).
type goldenStep struct {
	lp, ent, loss, grads []float32
	router               float32
}

// runGoldenStep runs the golden batch forward and backward on b under BF16.
// For a sparse model the loss includes the load-balancing loss when the
// variant turns it on, and its routes are checked against the golden on
// ref (b's CPU backend) when ref is given.
func runGoldenStep(t *testing.T, variant string, g golden, b kernels.Backend, ref *cpu.Backend) goldenStep {
	t.Helper()
	tokens, cu := g.i32(t, "tokens"), g.i32(t, "cu_seqlens")
	coef := g.f32(t, "coef")
	cfg := testConfig(t, variant)
	m, err := New(b, cfg, Options{MaxTokens: 40, MaxSeqs: 8, Precision: kernels.BF16})
	if err != nil {
		t.Fatal(err)
	}
	defer m.Close()
	if err := m.LoadHF(filepath.Join("testdata", variant)); err != nil {
		t.Fatal(err)
	}
	lp, ent, err := m.Forward(tokens, cu, g.f32(t, "temperature")[0])
	if err != nil {
		t.Fatal(err)
	}
	if ref != nil {
		checkRoutes(t, m, ref, g)
	}
	aux, _ := m.RouterLoss()
	res := goldenStep{lp: slices.Clone(lp), ent: slices.Clone(ent), grads: make([]float32, m.Table().Total), router: float32(aux)}
	var loss float64
	for i := range lp {
		loss += float64(coef[i]) * float64(lp[i])
	}
	if cfg.MoE.OutputRouterLogits {
		loss += cfg.MoE.RouterAuxLossCoef * aux
		m.SetRouterLossWeight(float32(cfg.MoE.RouterAuxLossCoef))
	}
	res.loss = []float32{float32(loss)}
	m.ZeroGrad()
	if err := m.Backward(coef); err != nil {
		t.Fatal(err)
	}
	b.DownloadF32(res.grads, m.Grads())
	if err := b.Sync(); err != nil {
		t.Fatal(err)
	}
	return res
}

// compareRel reports elements with |got−want| > tol·(1+|want|).
func compareRel(t *testing.T, what string, got, want []float32, tol float64) {
	t.Helper()
	compareClose(t, what, got, want, tol, tol)
}

// compareNormRel reports ‖got−want‖/‖want‖ above tol, with the largest
// differences, and returns it.
func compareNormRel(t *testing.T, what string, got, want []float32, tol float64) float64 {
	t.Helper()
	var d2, w2, maxAbs float64
	at := 0
	for i := range want {
		d := float64(got[i]) - float64(want[i])
		d2 += d * d
		w2 += float64(want[i]) * float64(want[i])
		if math.Abs(d) > maxAbs || math.IsNaN(d) {
			maxAbs, at = math.Abs(d), i
		}
	}
	e := math.Sqrt(d2 / w2)
	if w2 == 0 {
		e = math.Sqrt(d2)
	}
	if !(e <= tol) {
		t.Errorf("%s: ‖got−want‖/‖want‖ = %.3g, above %g (max abs %.3g at [%d]: got %.7g want %.7g)",
			what, e, tol, maxAbs, at, got[at], want[at])
	}
	return e
}

func maxAbsDiff(a, b []float32) float64 {
	m := 0.0
	for i := range a {
		m = math.Max(m, math.Abs(float64(a[i])-float64(b[i])))
	}
	return m
}

// flipBackend is the CPU backend checking every bf16 operand the model's
// ops read against the golden's rounded values (act.* and dout.*), and
// forcing flips: where the model's value is the neighbouring bf16 value of
// the golden's, it is replaced by the golden's before the op runs.
//
// It names each operand by the order in which Model.forward and
// Model.backward call the ops (without Options.Recompute): per layer the
// forward runs Matmul q|k|v (ln1), Attention (q, k, v), Matmul o (att),
// Matmul gate|up (ln2), SwiGLU (gate, up), Matmul down (h), then
// TokenLogprob (lnf); the backward, from the last layer, MatmulBackward of
// down, gate|up and o, AttentionBackward, MatmulBackward of q|k|v, each
// reading its rounded dout. checkCalls fails if the number of calls
// changed; a changed order shows as operands far from the golden's.
type flipBackend struct {
	*cpu.Backend
	t                     *testing.T
	g                     golden
	layers                int
	mm, attn, swiglu, tlp int // forward calls so far
	mmb, attnb            int // backward calls so far
	fwdFlips, bwdFlips    int
	flipped               map[string]int
	inBackward            bool
}

var (
	flipMatmulOperands   = []string{"ln1", "att", "ln2", "h"} // by call within a layer
	flipBackwardOperands = []string{"down", "gu", "o", "qkv"} // MatmulBackward dout, by call within a layer
)

func (f *flipBackend) Matmul(out, inp, weight kernels.Buf, T, C, OC int) {
	f.force(fmt.Sprintf("act.L%d.%s", f.mm/4, flipMatmulOperands[f.mm%4]), inp)
	f.mm++
	f.Backend.Matmul(out, inp, weight, T, C, OC)
}

// MatmulAdd is a Matmul (its operand forced as Matmul's are) and the
// residual added after it: the CPU's MatmulAdd bits.
func (f *flipBackend) MatmulAdd(out, res, inp, weight kernels.Buf, T, C, OC int) {
	f.Matmul(out, inp, weight, T, C, OC)
	f.Backend.Add(out, out, res, T*OC)
}

func (f *flipBackend) Attention(out, lse, q, k, v kernels.Buf, seqs kernels.Seqs, NH, NKV, HD int) {
	for _, x := range []struct {
		name string
		buf  kernels.Buf
	}{{"q", q}, {"k", k}, {"v", v}} {
		f.force(fmt.Sprintf("act.L%d.%s", f.attn, x.name), x.buf)
	}
	f.attn++
	f.Backend.Attention(out, lse, q, k, v, seqs, NH, NKV, HD)
}

// SwiGLURows reads gate and up as the gate|up GEMM wrote them, row by row
// interleaved: each half is forced as its own golden tensor.
func (f *flipBackend) SwiGLURows(out, gu kernels.Buf, R, I int) {
	f.forceRows(fmt.Sprintf("act.L%d.gate", f.swiglu), fmt.Sprintf("act.L%d.up", f.swiglu), gu, R, I)
	f.swiglu++
	f.Backend.SwiGLURows(out, gu, R, I)
}

// forceRows forces the gate and up halves of gu (R,2I) against the golden
// tensors gate and up (R,I).
func (f *flipBackend) forceRows(gate, up string, gu kernels.Buf, R, I int) {
	for half, name := range []string{gate, up} {
		if gu.DType != kernels.BF16 {
			f.force(name, gu)
			continue
		}
		all := f.Backend.BF16(gu)
		part := make([]uint16, R*I)
		for r := range R {
			copy(part[r*I:(r+1)*I], all[(2*r+half)*I:(2*r+half+1)*I])
		}
		f.forceBits(name, part)
		for r := range R {
			copy(all[(2*r+half)*I:(2*r+half+1)*I], part[r*I:(r+1)*I])
		}
	}
}

func (f *flipBackend) TokenLogprob(logprob, entropy, lse, hidden, weight, targets kernels.Buf, T, C, V int, invTemp float32) {
	f.force("act.lnf", hidden)
	f.tlp++
	f.Backend.TokenLogprob(logprob, entropy, lse, hidden, weight, targets, T, C, V, invTemp)
}

func (f *flipBackend) MatmulBackward(dinp, dweight, dout, inp, weight kernels.Buf, T, C, OC int) {
	f.inBackward = true
	f.force(fmt.Sprintf("dout.L%d.%s", f.layers-1-f.mmb/4, flipBackwardOperands[f.mmb%4]), dout)
	f.mmb++
	f.Backend.MatmulBackward(dinp, dweight, dout, inp, weight, T, C, OC)
}

// MatmulBackwardFresh is MatmulBackward's hook for the fresh-gradient
// form the model calls (kernels.FreshMatmulBackward).
func (f *flipBackend) MatmulBackwardFresh(dinp, dweight, dout, inp, weight kernels.Buf, T, C, OC int) {
	f.inBackward = true
	f.force(fmt.Sprintf("dout.L%d.%s", f.layers-1-f.mmb/4, flipBackwardOperands[f.mmb%4]), dout)
	f.mmb++
	f.Backend.MatmulBackwardFresh(dinp, dweight, dout, inp, weight, T, C, OC)
}

func (f *flipBackend) AttentionBackward(dq, dk, dv, dout, out, lse, q, k, v kernels.Buf, seqs kernels.Seqs, NH, NKV, HD int) {
	f.force(fmt.Sprintf("dout.L%d.att", f.layers-1-f.attnb), dout)
	f.attnb++
	f.Backend.AttentionBackward(dq, dk, dv, dout, out, lse, q, k, v, seqs, NH, NKV, HD)
}

// checkCalls fails unless every op ran as often as flipBackend expects.
func (f *flipBackend) checkCalls() {
	f.t.Helper()
	L := f.layers
	got := []int{f.mm, f.attn, f.swiglu, f.tlp, f.mmb, f.attnb}
	if want := []int{4 * L, L, L, 1, 4 * L, L}; !slices.Equal(got, want) {
		f.t.Errorf("op calls (Matmul, Attention, SwiGLU, TokenLogprob, MatmulBackward, AttentionBackward) = %v, want %v: "+
			"the model's op sequence changed; update flipBackend", got, want)
	}
}

// force compares the bf16 operand buf with the golden tensor name and
// sets its flipped elements to the golden's values.
func (f *flipBackend) force(name string, buf kernels.Buf) {
	t := f.t
	t.Helper()
	if buf.DType != kernels.BF16 {
		t.Errorf("%s: the op reads a %s operand; the policy rounds it to bf16", name, buf.DType)
		return
	}
	f.forceBits(name, f.Backend.BF16(buf))
}

// forceBits is force on a bf16 operand's bits, set in place.
func (f *flipBackend) forceBits(name string, got []uint16) {
	t := f.t
	t.Helper()
	want := f.g.f32(t, name)
	if len(got) != len(want) {
		t.Errorf("%s: operand of %d elements, golden has %d", name, len(got), len(want))
		return
	}
	scale := 0.0
	for _, w := range want {
		scale = math.Max(scale, math.Abs(float64(w)))
	}
	flips, bad := 0, 0
	var first []string
	for i, w := range want {
		wb := cpu.F32ToBF16(w)
		gb := got[i]
		if gb == wb || (gb|wb)&0x7fff == 0 { // equal, or ±0
			continue
		}
		gv := cpu.BF16ToF32(gb)
		switch d := int(gb&0x7fff) - int(wb&0x7fff); {
		case gb>>15 == wb>>15 && (d == 1 || d == -1):
			flips++
		case math.Abs(float64(gv)-float64(w)) <= bf16Negligible*scale:
		default:
			bad++
			if len(first) < 5 {
				first = append(first, fmt.Sprintf("[%d] %.6g, golden %.6g", i, gv, w))
			}
		}
		got[i] = wb
	}
	if bad > 0 {
		t.Errorf("%s: %d of %d values differ from the golden's by more than a bf16 flip: %v", name, bad, len(want), first)
	}
	if budget := max(bf16FlipMin, int(bf16FlipFraction*float64(len(want)))); flips > budget {
		t.Errorf("%s: %d of %d values are the golden's neighbouring bf16 value, more than %d flips", name, flips, len(want), budget)
	}
	if flips > 0 {
		if f.flipped == nil {
			f.flipped = map[string]int{}
		}
		f.flipped[name] += flips
		if f.inBackward {
			f.bwdFlips += flips
		} else {
			f.fwdFlips += flips
		}
	}
}
