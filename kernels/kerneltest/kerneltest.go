// Package kerneltest is the conformance suite of kernels.Backend: Run checks
// every op of a backend against kernels/cpu, the reference, on random inputs
// of odd shapes (lengths that are not multiples of 32, one-token sequences,
// many short packed sequences, grouped-query ratios), with a named
// tolerance per op.
//
// Every buffer is a view into a larger allocation with a random margin on
// both sides: the suite checks that an op writes only inside its views, and
// that a backend honours Buf.Off. Outputs start from random contents, so an
// assigned (=) output an op forgets to write, or an accumulated (+=) one it
// overwrites, fails. Ops that set a sticky error on the reference must set
// one on the backend too.
//
// In CI kerneltest's own test runs the CPU backend against itself (a second
// instance with a different thread count); kernels/cuda runs it on a GPU, and
// on its CPU emulator.
package kerneltest

import (
	"fmt"
	"io"
	"math"
	"math/rand/v2"
	"os"
	"slices"
	"testing"

	"github.com/tracegrpo/tracegrpo/kernels"
	"github.com/tracegrpo/tracegrpo/kernels/cpu"
)

// Tol is |got − want| ≤ Atol + Rtol·|want|.
type Tol struct{ Atol, Rtol float64 }

// The per-op tolerances of a backend against kernels/cpu, both fp32 with
// different summation orders and transcendental implementations.
var (
	// Exact: pure data movement or one correctly rounded fp32 operation.
	TolExact = Tol{Atol: 0, Rtol: 0}
	// TolElementwise: one or two calls of exp/sqrt whose last bit differs
	// between libraries.
	TolElementwise = Tol{Atol: 1e-6, Rtol: 1e-5}
	// TolReduce: sums over up to a few hundred terms in another order
	// (atomics across blocks, tree reductions).
	TolReduce = Tol{Atol: 1e-5, Rtol: 1e-5}
	// TolMatmul: fp32 dot products of length ≤ 300 of N(0,1) terms in
	// another blocking order.
	TolMatmul = Tol{Atol: 1e-4, Rtol: 1e-4}
	// TolAttention: softmax over ≤ 100 keys, online (rescaled per tile) on
	// one side, and the backward pass's products of those.
	TolAttention = Tol{Atol: 2e-5, Rtol: 1e-4}
	// TolLogprob: log-sum-exp over a vocabulary of a few hundred, formed in
	// chunks; entropy is lse − E[z], a difference of two O(10) numbers.
	TolLogprob = Tol{Atol: 1e-4, Rtol: 1e-4}
	// TolLogprobBF16Grad: the LM head's gradients from bf16 hidden and
	// weight: the logits' gradient dz is rounded to bf16 (2^-9 relative) as
	// the operand of the two tensor-core GEMMs (as torch.autocast does), so
	// dhidden = Σ_v dz_v·W_v and dweight = Σ_t dz_t·hidden_t carry up to
	// 2^-9 of each term. The largest terms are the targets' (|dz| ≈
	// |dlogprob| ≤ 2.5 times |hidden| ≤ 4 here): up to 2e-2 absolute, where
	// two such terms may cancel. The softmax part (|dz| ≈ p) is what the
	// non-target rows hold, 0.1 to 0.3 here: a kernel dropping it fails.
	// Measured worst on the emulator: 1.8e-2 (dweight, V=2053).
	TolLogprobBF16Grad = Tol{Atol: 3e-2, Rtol: 1e-2}
	// TolSample: a sampled token's logprob, log(p/Σp) in float64 on both
	// sides with sums in other orders, rounded to float32: one float32 ulp.
	TolSample = Tol{Atol: 1e-6, Rtol: 1e-6}
	// TolRope: the same cos/sin tables on both sides; two products and a sum
	// per element, which a GPU compiler may fuse into one multiply-add.
	TolRope = Tol{Atol: 1e-6, Rtol: 1e-6}
	// TolBF16Out: an fp32 result rounded to bfloat16 (8 significant bits)
	// on each side; fp32 values a few ulps apart may round to neighbouring
	// bf16 values, one bf16 ulp (2^-8 relative) apart.
	TolBF16Out = Tol{Atol: 1e-6, Rtol: 1.0 / 128}
	// TolMatmulBF16Out: a TolMatmul result rounded to bfloat16 on each
	// side: one bf16 ulp relative, and TolMatmul's absolute error where a
	// dot product cancels to near zero.
	TolMatmulBF16Out = Tol{Atol: 1e-4, Rtol: 1.0 / 128}
	// TolAttentionBF16Out: attention output (fp32) from bf16 q, k, v of
	// N(0,1) values on tensor cores, which round the probabilities P to
	// bf16 (relative error up to 2^-9 each) before P·V, against the
	// reference's fp32 P: each term p_j·v_j is off by up to 2^-9·p_j·|v_j|,
	// so out = Σ p_j·v_j / l by up to about 2^-9·max|v| ≈ 1e-2 for the
	// largest of a million N(0,1) values (worst on rows that see few keys,
	// where one p dominates). Measured worst on the emulator: 3.6e-3
	// absolute (the reduced shapes, 30% of this).
	TolAttentionBF16Out = Tol{Atol: 8e-3, Rtol: 4e-3}
	// TolAttentionBF16OutBF16: the same output rounded to bf16 on both
	// sides: TolAttentionBF16Out plus one bf16 ulp (TolBF16Out).
	TolAttentionBF16OutBF16 = Tol{Atol: 8e-3, Rtol: 4e-3 + 1.0/128}
	// TolAttentionBF16LSE: the log-sum-exp is formed from fp32 scores
	// (exact bf16 products, fp32 sums) and unrounded probabilities: fp32
	// error only, through exp2 of log2-scaled scores. Measured worst: 5e-7
	// absolute on values up to ~10.
	TolAttentionBF16LSE = Tol{Atol: 1e-5, Rtol: 1e-5}
	// TolAttentionBF16Grad: dq, dk, dv from bf16 operands of N(0,1)
	// values. P and dS are rounded to bf16 as mma operands (2^-9 relative
	// each), so every term summed over keys (dq) or queries and heads
	// (dk, dv) carries up to 2^-9 of itself: terms with p near 1 and |dout|
	// near the largest of a million N(0,1) samples (≈5) are off by ≈1e-2,
	// on gradients of magnitude 0.05 to 5. Measured worst on the emulator
	// (reduced shapes): 9.5e-3 (dv, 43% of this), 5.8e-3 at 4096 tokens.
	TolAttentionBF16Grad = Tol{Atol: 2e-2, Rtol: 1e-2}
)

// Options adjust a run of the suite.
type Options struct {
	// Reduced keeps the long shapes (sequences of thousands of tokens at
	// real head dimensions) to a few, for backends that run slowly (the
	// CUDA emulator runs every GPU thread as a fiber on one CPU core).
	Reduced bool
	// Schedule is for a run that repeats one already made in full, under
	// another schedule of the backend's threads (the CUDA emulator's
	// seeds): every case runs, but the three that take most of the time
	// (Attention, AttentionBF16, SampleTokens) keep their shapes that cross
	// tiles, warps and blocks and drop the rest (AttentionBF16's long
	// ones among them), so that more schedules cost less. Use it with
	// Reduced.
	Schedule bool
	// Cases, when set, names the only cases that run (a backend variant
	// that differs in a few ops: the CUDA backend's GEMMs on
	// cublasGemmEx instead of cuBLASLt).
	Cases []string
}

// Run checks every op of the backends newBackend returns against
// kernels/cpu, with every shape. newBackend is called once; the backend is
// closed at the end if it has a Close method.
func Run(t *testing.T, newBackend func() kernels.Backend) {
	RunOptions(t, newBackend, Options{})
}

// RunOptions is Run with options.
func RunOptions(t *testing.T, newBackend func() kernels.Backend, opt Options) {
	dut := newBackend()
	ref := cpu.New(2)
	defer ref.Close()
	defer closeBackend(t, dut)
	for _, c := range cases {
		if opt.Cases != nil && !slices.Contains(opt.Cases, c.name) {
			continue
		}
		t.Run(c.name, func(t *testing.T) {
			rng := rand.New(rand.NewPCG(uint64(len(c.name)), 0x7eace))
			s := &suite{t: t, ref: ref, dut: dut, rng: rng, reduced: opt.Reduced, schedule: opt.Schedule}
			defer s.freeAll()
			c.run(s)
			s.syncBoth()
			s.checkMargins()
		})
	}
}

func closeBackend(t *testing.T, b kernels.Backend) {
	switch c := b.(type) {
	case io.Closer:
		if err := c.Close(); err != nil {
			t.Errorf("close %s backend: %v", b.Name(), err)
		}
	case interface{ Close() }:
		c.Close()
	}
}

// pairBuf is one buffer on both backends: the views the op sees and the
// allocations around them.
type pairBuf struct {
	r, d         kernels.Buf // the views
	rAll, dAll   kernels.Buf // the allocations
	init         []float32   // F32 initial contents of the allocation
	initI        []int32     // I32 initial contents of the allocation
	initB        []float32   // BF16 initial contents of the allocation, widened
	off, n       int
	checkMargins bool
}

type suite struct {
	t        *testing.T
	ref, dut kernels.Backend
	rng      *rand.Rand
	bufs     []*pairBuf
	reduced  bool // Options.Reduced
	schedule bool // Options.Schedule
	aligned  bool // the next allocations start 16-byte aligned
}

func (s *suite) alloc(dt kernels.DType, n int) *pairBuf {
	s.t.Helper()
	lo, hi := s.rng.IntN(5), s.rng.IntN(5)
	if s.aligned {
		// A margin of a multiple of 16 bytes: backends that move 16-byte
		// chunks (the tensor-core paths) take their fast path on such views.
		lo = s.rng.IntN(3) * 16 / dt.Size()
	}
	p := &pairBuf{off: lo, n: n, checkMargins: true}
	var err error
	if p.rAll, err = s.ref.Alloc(dt, lo+n+hi); err != nil {
		s.t.Fatal(err)
	}
	if p.dAll, err = s.dut.Alloc(dt, lo+n+hi); err != nil {
		s.t.Fatalf("%s: Alloc(%s, %d): %v", s.dut.Name(), dt, lo+n+hi, err)
	}
	p.r, p.d = p.rAll.Slice(lo, n), p.dAll.Slice(lo, n)
	s.bufs = append(s.bufs, p)
	return p
}

// f32 is a buffer holding vals on both backends (random margins around it).
func (s *suite) f32(vals []float32) *pairBuf {
	p := s.alloc(kernels.F32, len(vals))
	p.init = make([]float32, p.rAll.N)
	for i := range p.init {
		p.init[i] = float32(s.rng.NormFloat64())
	}
	copy(p.init[p.off:], vals)
	s.ref.UploadF32(p.rAll, p.init)
	s.dut.UploadF32(p.dAll, p.init)
	return p
}

// i32 is an I32 buffer holding vals on both backends.
func (s *suite) i32(vals []int32) *pairBuf {
	p := s.alloc(kernels.I32, len(vals))
	p.initI = make([]int32, p.rAll.N)
	for i := range p.initI {
		p.initI[i] = -12345
	}
	copy(p.initI[p.off:], vals)
	s.ref.UploadI32(p.rAll, p.initI)
	s.dut.UploadI32(p.dAll, p.initI)
	return p
}

// randn is an F32 buffer of n N(0, sd²) values.
func (s *suite) randn(n int, sd float64) *pairBuf {
	v := make([]float32, n)
	for i := range v {
		v[i] = float32(s.rng.NormFloat64() * sd)
	}
	return s.f32(v)
}

// ropeTables is a pair of cos, sin tables (P, HD/2) for positions [0, P)
// with inverse frequencies theta^(−2i/HD), the same on both backends.
func (s *suite) ropeTables(P, HD int, theta float64) (cos, sin *pairBuf) {
	half := HD / 2
	c, sn := make([]float32, P*half), make([]float32, P*half)
	for p := 0; p < P; p++ {
		for i := 0; i < half; i++ {
			a := float64(p) * math.Pow(theta, -float64(2*i)/float64(HD))
			c[p*half+i], sn[p*half+i] = float32(math.Cos(a)), float32(math.Sin(a))
		}
	}
	return s.f32(c), s.f32(sn)
}

// bf16 is a BF16 buffer holding vals rounded to bfloat16 on both backends
// (random margins around it): the values are written as F32 and converted
// on each backend with Convert (itself checked exactly by the Convert case).
func (s *suite) bf16(vals []float32) *pairBuf {
	s.t.Helper()
	p := s.alloc(kernels.BF16, len(vals))
	all := make([]float32, p.rAll.N)
	for i := range all {
		all[i] = float32(s.rng.NormFloat64())
	}
	copy(all[p.off:], vals)
	p.initB = make([]float32, len(all))
	for i, x := range all {
		p.initB[i] = cpu.BF16ToF32(cpu.F32ToBF16(x))
	}
	for _, side := range []struct {
		b   kernels.Backend
		dst kernels.Buf
	}{{s.ref, p.rAll}, {s.dut, p.dAll}} {
		tmp, err := side.b.Alloc(kernels.F32, len(all))
		if err != nil {
			s.t.Fatal(err)
		}
		side.b.UploadF32(tmp, all)
		side.b.Convert(side.dst, tmp)
		if err := side.b.Sync(); err != nil {
			s.t.Fatal(err)
		}
		side.b.Free(tmp)
	}
	return p
}

// randnBF16 is a BF16 buffer of n N(0, sd²) values rounded to bfloat16.
func (s *suite) randnBF16(n int, sd float64) *pairBuf {
	v := make([]float32, n)
	for i := range v {
		v[i] = float32(s.rng.NormFloat64() * sd)
	}
	return s.bf16(v)
}

// download returns a view's values as float32 on one backend (a BF16 view
// is widened with Convert).
func (s *suite) download(b kernels.Backend, view kernels.Buf) []float32 {
	s.t.Helper()
	out := make([]float32, view.N)
	if view.DType != kernels.BF16 {
		b.DownloadF32(out, view)
		return out
	}
	tmp, err := b.Alloc(kernels.F32, view.N)
	if err != nil {
		s.t.Fatal(err)
	}
	defer b.Free(tmp)
	b.Convert(tmp, view)
	b.DownloadF32(out, tmp)
	if err := b.Sync(); err != nil {
		s.t.Fatal(err)
	}
	return out
}

// out is an F32 output buffer with random initial contents (the same on
// both backends), so that an unwritten element shows.
func (s *suite) out(n int) *pairBuf { return s.randn(n, 1) }

func (s *suite) syncBoth() {
	s.t.Helper()
	rerr, derr := s.ref.Sync(), s.dut.Sync()
	if (rerr == nil) != (derr == nil) {
		s.t.Errorf("sticky errors differ: cpu %v, %s %v", rerr, s.dut.Name(), derr)
	}
}

// wantSyncError checks that both backends report an error at Sync.
func (s *suite) wantSyncError(what string) {
	s.t.Helper()
	rerr, derr := s.ref.Sync(), s.dut.Sync()
	if rerr == nil {
		s.t.Fatalf("%s: the cpu reference reported no error; the case is wrong", what)
	}
	if derr == nil {
		s.t.Errorf("%s: %s reported no error at Sync (cpu: %v)", what, s.dut.Name(), rerr)
	}
}

func (s *suite) freeAll() {
	for _, p := range s.bufs {
		s.ref.Free(p.rAll)
		s.dut.Free(p.dAll)
	}
	s.bufs = nil
}

// check compares the view p (F32, or BF16 widened) on both backends.
func (s *suite) check(name string, p *pairBuf, tol Tol) {
	s.t.Helper()
	want := s.download(s.ref, p.r)
	got := s.download(s.dut, p.d)
	if msg := Compare(want, got, tol); msg != "" {
		s.t.Errorf("%s (%d elements): %s", name, p.n, msg)
	}
	if os.Getenv(reportEnv) != "" {
		frac, maxAbs, maxRel := Used(want, got, tol)
		s.t.Logf("%s: max abs err %.3g, max rel err %.3g, rms(want) %.3g, %.1f%% of the tolerance", name, maxAbs, maxRel, rms(want), 100*frac)
	}
}

// sameBits fails unless the views a and b hold the same bits on each
// backend (two computations that must agree exactly, not within a
// tolerance).
func (s *suite) sameBits(name string, a, b *pairBuf) {
	s.t.Helper()
	s.sameBitsOn(s.ref, name, a.r, b.r)
	s.sameBitsOn(s.dut, name, a.d, b.d)
}

// sameBitsOn is sameBits of two views on one backend.
func (s *suite) sameBitsOn(be kernels.Backend, name string, a, b kernels.Buf) {
	s.t.Helper()
	va, vb := s.download(be, a), s.download(be, b)
	for i := range va {
		if math.Float32bits(va[i]) != math.Float32bits(vb[i]) {
			s.t.Errorf("%s on %s: element %d is %g (%#x), the other %g (%#x)", name, be.Name(), i,
				va[i], math.Float32bits(va[i]), vb[i], math.Float32bits(vb[i]))
			return
		}
	}
}

// randnOf is randn or randnBF16 by dt.
func (s *suite) randnOf(dt kernels.DType, n int, sd float64) *pairBuf {
	if dt == kernels.BF16 {
		return s.randnBF16(n, sd)
	}
	return s.randn(n, sd)
}

// reportEnv, when set, makes every check log its largest errors and the
// share of its tolerance they use (to state and justify tolerances).
const reportEnv = "TRACEGRPO_KERNELTEST_REPORT"

// checkI32 compares an I32 view on both backends exactly.
func (s *suite) checkI32(name string, p *pairBuf) {
	s.t.Helper()
	want, got := make([]int32, p.n), make([]int32, p.n)
	s.ref.DownloadI32(want, p.r)
	s.dut.DownloadI32(got, p.d)
	bad := 0
	var first []string
	for i := range want {
		if want[i] != got[i] {
			bad++
			if len(first) < 5 {
				first = append(first, fmt.Sprintf("[%d] got %d want %d", i, got[i], want[i]))
			}
		}
	}
	if bad > 0 {
		s.t.Errorf("%s (%d elements): %d differ; first: %v", name, p.n, bad, first)
	}
}

// checkMargins verifies that no op wrote outside its views on the backend
// under test.
func (s *suite) checkMargins() {
	s.t.Helper()
	for i, p := range s.bufs {
		if p.init == nil && p.initI == nil && p.initB == nil {
			continue
		}
		n := p.dAll.N
		if p.initB != nil {
			got := s.download(s.dut, p.dAll)
			for _, region := range [][2]int{{0, p.off}, {p.off + p.n, n}} {
				for j := region[0]; j < region[1]; j++ {
					if math.Float32bits(got[j]) != math.Float32bits(p.initB[j]) {
						s.t.Errorf("buffer %d: BF16 element %d outside the view [%d, %d) changed from %v to %v",
							i, j, p.off, p.off+p.n, p.initB[j], got[j])
						break
					}
				}
			}
			continue
		}
		for _, region := range [][2]int{{0, p.off}, {p.off + p.n, n}} {
			if region[0] == region[1] {
				continue
			}
			if p.init != nil {
				got := make([]float32, n)
				s.dut.DownloadF32(got, p.dAll)
				for j := region[0]; j < region[1]; j++ {
					if math.Float32bits(got[j]) != math.Float32bits(p.init[j]) {
						s.t.Errorf("buffer %d: element %d outside the view [%d, %d) changed from %v to %v",
							i, j, p.off, p.off+p.n, p.init[j], got[j])
						break
					}
				}
			} else {
				got := make([]int32, n)
				s.dut.DownloadI32(got, p.dAll)
				for j := region[0]; j < region[1]; j++ {
					if got[j] != p.initI[j] {
						s.t.Errorf("buffer %d: I32 element %d outside the view changed", i, j)
						break
					}
				}
			}
		}
	}
}

// Compare returns "" when every got[i] is within tol of want[i], else the
// max abs and rel errors and the first mismatches.
func Compare(want, got []float32, tol Tol) string {
	if len(want) != len(got) {
		return fmt.Sprintf("length %d, want %d", len(got), len(want))
	}
	var maxAbs, maxRel float64
	var first []string
	bad := 0
	atol := tol.Atol
	for i := range want {
		w, g := float64(want[i]), float64(got[i])
		d := math.Abs(g - w)
		if math.IsNaN(g) != math.IsNaN(w) || math.IsInf(g, 0) != math.IsInf(w, 0) {
			d = math.Inf(1)
		} else if math.IsNaN(g) || (math.IsInf(g, 0) && g == w) {
			d = 0
		}
		maxAbs = math.Max(maxAbs, d)
		if w != 0 {
			maxRel = math.Max(maxRel, d/math.Abs(w))
		}
		scale := math.Abs(w)
		if math.IsNaN(scale) || math.IsInf(scale, 0) {
			scale = 0
		}
		if !(d <= atol+tol.Rtol*scale) {
			bad++
			if len(first) < 5 {
				first = append(first, fmt.Sprintf("[%d] got %g want %g", i, g, w))
			}
		}
	}
	if bad == 0 {
		return ""
	}
	return fmt.Sprintf("%d mismatches beyond atol %g rtol %g (max abs err %.3g, max rel err %.3g); first: %v",
		bad, atol, tol.Rtol, maxAbs, maxRel, first)
}

// rms is the root mean square of the finite elements of x.
func rms(x []float32) float64 {
	var s float64
	n := 0
	for _, v := range x {
		if f := float64(v); !math.IsNaN(f) && !math.IsInf(f, 0) {
			s += f * f
			n++
		}
	}
	if n == 0 {
		return 0
	}
	return math.Sqrt(s / float64(n))
}

// Used returns the largest fraction of tol any element's error uses,
// max |got−want| / (Atol + Rtol·|want|), with the max abs and rel errors: a
// measurement to set a tolerance from (a value > 1 fails Compare).
func Used(want, got []float32, tol Tol) (frac, maxAbs, maxRel float64) {
	atol := tol.Atol
	for i := range want {
		if i >= len(got) {
			return math.Inf(1), math.Inf(1), math.Inf(1)
		}
		w, g := float64(want[i]), float64(got[i])
		d := math.Abs(g - w)
		if math.IsNaN(d) {
			if math.IsNaN(g) == math.IsNaN(w) {
				continue
			}
			d = math.Inf(1)
		}
		maxAbs = math.Max(maxAbs, d)
		if w != 0 {
			maxRel = math.Max(maxRel, d/math.Abs(w))
		}
		if lim := atol + tol.Rtol*math.Abs(w); lim > 0 {
			frac = math.Max(frac, d/lim)
		} else if d > 0 {
			frac = math.Inf(1)
		}
	}
	return frac, maxAbs, maxRel
}
