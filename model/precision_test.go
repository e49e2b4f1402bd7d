package model

import (
	"errors"
	"fmt"
	"math"
	"math/rand/v2"
	"slices"
	"strings"
	"testing"

	"github.com/tracegrpo/tracegrpo/kernels"
	"github.com/tracegrpo/tracegrpo/kernels/cpu"
)

// countingBackend counts the bytes a model allocates and the whole-arena
// conversions it makes (the bf16 weight copy).
type countingBackend struct {
	kernels.Backend
	kernels.Experts // the sparse layers' ops, passed through
	live            map[kernels.Buf]int64
	bytes           int64 // live bytes
	weightCopy      int   // Convert calls of n elements
	n               int
}

func newCounting(b kernels.Backend, n int) *countingBackend {
	x, _ := b.(kernels.Experts)
	return &countingBackend{Backend: b, Experts: x, live: map[kernels.Buf]int64{}, n: n}
}

func (c *countingBackend) Alloc(dt kernels.DType, n int) (kernels.Buf, error) {
	buf, err := c.Backend.Alloc(dt, n)
	if err == nil {
		c.live[buf] = int64(n * dt.Size())
		c.bytes += int64(n * dt.Size())
	}
	return buf, err
}

func (c *countingBackend) Free(buf kernels.Buf) {
	c.bytes -= c.live[buf]
	delete(c.live, buf)
	c.Backend.Free(buf)
}

func (c *countingBackend) Convert(dst, src kernels.Buf) {
	if dst.N == c.n && dst.DType == kernels.BF16 {
		c.weightCopy++
	}
	c.Backend.Convert(dst, src)
}

var precisionVariants = []string{"qwen3_untied", "llama_tied", "qwen2_untied"}

func testConfig(t testing.TB, variant string) Config {
	t.Helper()
	cfg, err := LoadConfig("testdata/" + variant + "/config.json")
	if err != nil {
		t.Fatal(err)
	}
	return cfg
}

// TestPlanEqualsAllocations: PlanModel and PlanReference report exactly
// the bytes New and NewReference allocate, for every architecture,
// precision, checkpointing choice and with or without packed trees; a
// reference allocates its weights only.
func TestPlanEqualsAllocations(t *testing.T) {
	cb := cpu.New(1)
	defer cb.Close()
	for _, v := range append(slices.Clone(precisionVariants), "moe_k8_interleaved", "moe_k2_norm") {
		cfg := testConfig(t, v)
		for _, prec := range []kernels.DType{kernels.F32, kernels.BF16} {
			for i, re := range []bool{false, true, false, true} {
				tree := i >= 2 // shared-prefix trees: their extra buffers
				opt := Options{MaxTokens: 48, MaxSeqs: 5, MaxSeqLen: 40, Recompute: re, Precision: prec, Tree: tree}
				tag := fmt.Sprintf("%s %s recompute=%v tree=%v", v, prec, re, tree)
				b := newCounting(cb, NewParamTable(cfg).Total)
				m, err := New(b, cfg, opt)
				if err != nil {
					t.Fatal(err)
				}
				plan, err := PlanModel(cfg, opt)
				if err != nil {
					t.Fatal(err)
				}
				if plan.Total() != b.bytes || m.Footprint() != plan {
					t.Errorf("%s: plan %+v (%d bytes), model reports %+v, allocated %d bytes", tag, plan, plan.Total(), m.Footprint(), b.bytes)
				}
				before := b.bytes
				ref, err := NewReference(m)
				if err != nil {
					t.Fatal(err)
				}
				rplan, err := PlanReference(cfg, opt)
				if err != nil {
					t.Fatal(err)
				}
				if got := b.bytes - before; got != rplan.Total() || ref.Footprint() != rplan {
					t.Errorf("%s: reference plan %+v (%d bytes), allocated %d", tag, rplan, rplan.Total(), got)
				}
				wantRef := int64(NewParamTable(cfg).Total) * 4
				if prec == kernels.BF16 {
					wantRef += int64(NewParamTable(cfg).Total) * 2
				}
				if rplan.Total() != wantRef {
					t.Errorf("%s: reference plans %d bytes, want its weights only, %d", tag, rplan.Total(), wantRef)
				}
				for _, maxLen := range []int{20, 70} { // within the model's RoPE tables, and beyond
					before := b.bytes
					smp, err := NewSampler(m, 3, maxLen)
					if err != nil {
						t.Fatal(err)
					}
					sp, err := PlanSampler(cfg, opt, 3, maxLen)
					if err != nil {
						t.Fatal(err)
					}
					if got := b.bytes - before; got != sp.KVCache+sp.Buffers+sp.Rope {
						t.Errorf("%s: sampler maxLen %d: plan %+v, allocated %d bytes", tag, maxLen, sp, got)
					}
					smp.Close()
				}
				ref.Close()
				m.Close()
				fo := opt
				fo.ForwardOnly = true
				f, err := New(b, cfg, fo)
				if err != nil {
					t.Fatal(err)
				}
				fplan, _ := PlanModel(cfg, fo)
				if fplan.Total() != b.bytes || fplan.Grads != 0 || fplan.Activations >= plan.Activations {
					t.Errorf("%s: forward-only plan %+v (%d bytes), allocated %d; training activations %d", tag, fplan, fplan.Total(), b.bytes, plan.Activations)
				}
				f.Close()
				if b.bytes != 0 {
					t.Errorf("%s: %d bytes left allocated after Close", tag, b.bytes)
				}
			}
		}
	}
}

// runStep is one Forward and Backward of a batch: logprobs, entropies and
// gradients.
type stepResult struct{ lp, ent, grads []float32 }

func runStep(t *testing.T, m *Model, tokens, cu []int32, coef []float32, temp float32) stepResult {
	t.Helper()
	lp, ent, err := m.Forward(tokens, cu, temp)
	if err != nil {
		t.Fatal(err)
	}
	res := stepResult{lp: slices.Clone(lp), ent: slices.Clone(ent), grads: make([]float32, m.Table().Total)}
	m.ZeroGrad()
	if err := m.Backward(coef); err != nil {
		t.Fatal(err)
	}
	m.Backend().DownloadF32(res.grads, m.Grads())
	if err := m.Backend().Sync(); err != nil {
		t.Fatal(err)
	}
	return res
}

// bf16Errors measures a BF16 step against the F32 step of the same weights
// and batch: the largest |Δ| of logprobs and entropies, and per parameter
// the relative error of its gradient, ‖Δg‖/‖g‖.
func bf16Errors(t *testing.T, variant string, seed uint64) (lp, ent float64, worstGrad float64, worstName string) {
	b := cpu.New(2)
	defer b.Close()
	cfg := testConfig(t, variant)
	r := rand.New(rand.NewPCG(seed, 3))
	tokens, cu := randomBatch(r, 5, 14, cfg.VocabSize)
	coef := make([]float32, len(tokens))
	for i := range coef {
		coef[i] = float32(r.NormFloat64())
	}
	var res [2]stepResult
	for i, prec := range []kernels.DType{kernels.F32, kernels.BF16} {
		m := loadTestModel(t, variant, b, Options{MaxTokens: 80, MaxSeqs: 8, Precision: prec})
		res[i] = runStep(t, m, tokens, cu, coef, 0.9)
		m.Close()
	}
	for i := range res[0].lp {
		lp = math.Max(lp, math.Abs(float64(res[0].lp[i]-res[1].lp[i]))/(1+math.Abs(float64(res[0].lp[i]))))
		ent = math.Max(ent, math.Abs(float64(res[0].ent[i]-res[1].ent[i]))/(1+math.Abs(float64(res[0].ent[i]))))
	}
	for _, p := range NewParamTable(cfg).Params {
		var d, n float64
		for i := p.Offset; i < p.Offset+p.N; i++ {
			g, h := float64(res[0].grads[i]), float64(res[1].grads[i])
			d += (g - h) * (g - h)
			n += g * g
		}
		if n == 0 || strings.HasSuffix(p.Name, "k_proj.bias") {
			continue
		}
		if e := math.Sqrt(d / n); e > worstGrad {
			worstGrad, worstName = e, p.Name
		}
	}
	return lp, ent, worstGrad, worstName
}

// TestBF16StepCloseToF32: a mixed-precision step (Options.Precision BF16)
// against the fp32 step of the same weights and batch, on every
// architecture and 8 random batches each. The tolerances: bf16 keeps 8
// significant bits (unit roundoff 2^-9 ≈ 0.2%) and the operands of every
// GEMM and of attention are rounded, about ten roundings per layer, so
// errors of a percent or two are bf16's own. Over 3 architectures × 20
// batches the largest errors measured were 0.017 for logprobs and 0.037
// for entropies (|Δ| / (1 + |x|), these test models' logprobs reach −28)
// and 0.033 for a gradient (‖Δg‖/‖g‖ per parameter): the tolerances are
// about twice that. A k_proj bias is left out: softmax is invariant to it,
// so its exact gradient is 0 and both sides hold rounding noise.
func TestBF16StepCloseToF32(t *testing.T) {
	const tolLP, tolEnt, tolGrad = 0.04, 0.08, 0.06
	for _, v := range precisionVariants {
		for seed := uint64(1); seed <= 8; seed++ {
			lp, ent, g, name := bf16Errors(t, v, seed)
			if lp > tolLP || ent > tolEnt || g > tolGrad {
				t.Errorf("%s batch %d: logprob error %.3g (tol %g), entropy %.3g (tol %g), gradient %.3g of %s (tol %g)",
					v, seed, lp, tolLP, ent, tolEnt, g, name, tolGrad)
			}
		}
	}
}

// TestWeightCopyOncePerUpdate: under BF16 the weights are converted once
// after each change, however many forwards follow (micro-batches, the
// previous-policy pass); a change the model is told of (ParamsChanged)
// reaches the next Forward, and so do InitRandom and SetParamsHost.
// Without ParamsChanged the old copy is used, which is why the optimizer's
// caller must say so (the trainer's tests check that it does).
func TestWeightCopyOncePerUpdate(t *testing.T) {
	cb := cpu.New(1)
	defer cb.Close()
	cfg := testConfig(t, "qwen3_untied")
	b := newCounting(cb, NewParamTable(cfg).Total)
	m, err := New(b, cfg, Options{MaxTokens: 40, MaxSeqs: 4, Precision: kernels.BF16})
	if err != nil {
		t.Fatal(err)
	}
	defer m.Close()
	if err := m.LoadHF("testdata/qwen3_untied"); err != nil {
		t.Fatal(err)
	}
	tokens, cu := randomBatch(rand.New(rand.NewPCG(2, 2)), 3, 10, cfg.VocabSize)
	forward := func() []float32 {
		lp, _, err := m.Forward(tokens, cu, 1)
		if err != nil {
			t.Fatal(err)
		}
		return slices.Clone(lp)
	}
	before := forward()
	forward()
	forward()
	if b.weightCopy != 1 {
		t.Fatalf("3 forwards after loading: %d weight copies, want 1", b.weightCopy)
	}
	// Scale every weight behind the model's back, as the optimizer writes.
	h := m.ParamsHost()
	for i := range h {
		h[i] *= 1.5
	}
	cb.UploadF32(m.Params(), h)
	if forward(); b.weightCopy != 1 {
		t.Fatalf("without ParamsChanged the copy was remade (%d copies)", b.weightCopy)
	}
	m.ParamsChanged()
	after := forward()
	forward()
	if b.weightCopy != 2 || slices.Equal(after, before) {
		t.Fatalf("after ParamsChanged: %d copies (want 2), logprobs changed: %v", b.weightCopy, !slices.Equal(after, before))
	}
	if err := m.SetParamsHost(h); err != nil {
		t.Fatal(err)
	}
	forward()
	m.InitRandom(3)
	forward()
	if b.weightCopy != 4 {
		t.Fatalf("SetParamsHost and InitRandom: %d copies, want 4", b.weightCopy)
	}
}

// TestReference: a forward-only reference gives the policy's logprobs bit
// for bit, keeps its weights when the policy's change, runs in the
// policy's activations (so a policy Backward after a reference Forward is
// refused, and the policy's next step is unchanged), and has no Backward
// of its own; under BF16 too, where it keeps its own bf16 copy.
func TestReference(t *testing.T) {
	b := cpu.New(2)
	defer b.Close()
	for _, prec := range []kernels.DType{kernels.F32, kernels.BF16} {
		for _, v := range precisionVariants {
			tag := fmt.Sprintf("%s %s", v, prec)
			m := loadTestModel(t, v, b, Options{MaxTokens: 60, MaxSeqs: 6, Precision: prec})
			ref, err := NewReference(m)
			if err != nil {
				t.Fatal(err)
			}
			r := rand.New(rand.NewPCG(5, 6))
			tokens, cu := randomBatch(r, 4, 12, m.Config().VocabSize)
			coef := make([]float32, len(tokens))
			for i := range coef {
				coef[i] = float32(r.NormFloat64())
			}
			want := runStep(t, m, tokens, cu, coef, 0.7)
			got, _, err := ref.Forward(tokens, cu, 0.7)
			if err != nil {
				t.Fatal(err)
			}
			if !slices.Equal(got, want.lp) {
				t.Fatalf("%s: reference logprobs differ from the policy's", tag)
			}
			if err := m.Backward(coef); !errors.Is(err, ErrNoForward) {
				t.Fatalf("%s: policy Backward after a reference Forward: %v, want ErrNoForward", tag, err)
			}
			if err := ref.Backward(coef); !errors.Is(err, ErrForwardOnly) {
				t.Fatalf("%s: reference Backward: %v, want ErrForwardOnly", tag, err)
			}
			if again := runStep(t, m, tokens, cu, coef, 0.7); !slices.Equal(again.grads, want.grads) || !slices.Equal(again.lp, want.lp) {
				t.Fatalf("%s: policy step changed after a reference forward", tag)
			}
			m.InitRandom(9)
			got2, _, err := ref.Forward(tokens, cu, 0.7)
			if err != nil {
				t.Fatal(err)
			}
			if !slices.Equal(got2, want.lp) {
				t.Fatalf("%s: the reference moved with the policy's weights", tag)
			}
			ref.Close()
			m.Close()
		}
	}
}
