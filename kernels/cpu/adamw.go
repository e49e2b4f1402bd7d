package cpu

// AdamW: one decoupled-weight-decay Adam update of param, m, v (N) in place
// from grad (N), in float32, under the step's rule (kernels.AdamRule).
//
// TorchAdamW is torch.optim.AdamW's (single-tensor, torch 1.13) order of
// operations:
//
//	g     = grad · GradScale
//	p     = p · (1 − LR·WeightDecay)                     param.mul_(1 - lr*wd)
//	m     = m·β1 + (1−β1)·g                              exp_avg.mul_(β1).add_(g, alpha=1-β1)
//	v     = v·β2 + (1−β2)·g·g                            exp_avg_sq.mul_(β2).addcmul_(g, g, value=1-β2)
//	denom = sqrt(v) / sqrt(BiasCorrection2) + Eps
//	p     = p + (−LR/BiasCorrection1)·m / denom          param.addcdiv_(m, denom, value=-step_size)
//
// Scalars that torch computes in Python doubles (1 − β, which the caller
// supplies as OneMinusBeta, and 1 − lr·wd, lr/bc1, sqrt(bc2)) are computed in
// float64 here and rounded once to float32, as torch does when it hands a
// Python scalar to a float32 kernel.
//
// FusedAdam is TransformerEngine's FusedAdam kernel (AdamFunctor,
// ADAM_MODE_1) with float32 scalars:
//
//	g = grad·GradScale;  m = β1·m + (1−β1)·g;  v = β2·v + ((1−β2)·g)·g
//	u = (m/bc1) / (sqrt(v/bc2) + eps) + wd·p;   p = p − lr·u
//
// its moments F32 or BF16: read widened, updated in float32, stored rounded
// to nearest even (the update itself uses the unrounded float32 moments,
// as TE's registers hold them).
//
// Every product is rounded explicitly (float32(...)), so the compiler cannot
// fuse it into an FMA (the CUDA kernels contract some, so backends agree to
// rounding, not bits). Elementwise: thread-count invariant.

import (
	"fmt"
	"math"

	"github.com/tracegrpo/tracegrpo/kernels"
)

type adamwScalars struct {
	rule                                                        kernels.AdamRule
	gradScale, decay, b1, omb1, b2, omb2, bc2sqrt, eps, negStep float32
	lr, wd, bc1, bc2                                            float32 // FusedAdam
}

func newAdamwScalars(s kernels.AdamWStep) adamwScalars {
	return adamwScalars{
		rule:      s.Rule,
		gradScale: s.GradScale,
		decay:     float32(1 - float64(s.LR)*float64(s.WeightDecay)),
		b1:        s.Beta1,
		omb1:      s.OneMinusBeta1,
		b2:        s.Beta2,
		omb2:      s.OneMinusBeta2,
		bc2sqrt:   float32(math.Sqrt(float64(s.BiasCorrection2))),
		eps:       s.Eps,
		negStep:   float32(-(float64(s.LR) / float64(s.BiasCorrection1))),
		lr:        s.LR, wd: s.WeightDecay, bc1: s.BiasCorrection1, bc2: s.BiasCorrection2,
	}
}

// torchElem is one element of TorchAdamW: the new p, m and v.
func (s *adamwScalars) torchElem(p, g, m, v float32) (float32, float32, float32) {
	g = float32(g * s.gradScale)
	p = float32(p * s.decay)
	m = float32(m * s.b1)
	m = float32(m + float32(s.omb1*g))
	v = float32(v * s.b2)
	v = float32(v + float32(float32(s.omb2*g)*g))
	denom := float32(float32(float32(math.Sqrt(float64(v)))/s.bc2sqrt) + s.eps)
	p = float32(p + float32(float32(s.negStep*m)/denom))
	return p, m, v
}

// fusedElem is one element of FusedAdam: the new p, m and v (float32).
func (s *adamwScalars) fusedElem(p, g, m, v float32) (float32, float32, float32) {
	g = float32(g * s.gradScale)
	m = float32(float32(s.b1*m) + float32(s.omb1*g))
	v = float32(float32(s.b2*v) + float32(float32(s.omb2*g)*g))
	mh := float32(m / s.bc1)
	vh := float32(v / s.bc2)
	denom := float32(float32(math.Sqrt(float64(vh))) + s.eps)
	u := float32(float32(mh/denom) + float32(s.wd*p))
	p = float32(p - float32(s.lr*u))
	return p, m, v
}

func adamwRange(p, grad, m, v []float32, s *adamwScalars) {
	grad = grad[:len(p)]
	m = m[:len(p)]
	v = v[:len(p)]
	if s.rule == kernels.FusedAdam {
		for i := range p {
			p[i], m[i], v[i] = s.fusedElem(p[i], grad[i], m[i], v[i])
		}
		return
	}
	for i := range p {
		p[i], m[i], v[i] = s.torchElem(p[i], grad[i], m[i], v[i])
	}
}

// adamwRangeBF16 is FusedAdam over bf16 moments.
func adamwRangeBF16(p, grad []float32, m, v []uint16, s *adamwScalars) {
	grad = grad[:len(p)]
	m = m[:len(p)]
	v = v[:len(p)]
	for i := range p {
		pi, mi, vi := s.fusedElem(p[i], grad[i], BF16ToF32(m[i]), BF16ToF32(v[i]))
		p[i], m[i], v[i] = pi, F32ToBF16(mi), F32ToBF16(vi)
	}
}

type adamwTask struct {
	p, g, m, v []float32 // (N)
	mb, vb     []uint16  // (N) bf16 moments (then m, v are nil)
	s          adamwScalars
}

func (t *adamwTask) run(_, lo, hi int) {
	if t.mb != nil {
		adamwRangeBF16(t.p[lo:hi], t.g[lo:hi], t.mb[lo:hi], t.vb[lo:hi], &t.s)
		return
	}
	adamwRange(t.p[lo:hi], t.g[lo:hi], t.m[lo:hi], t.v[lo:hi], &t.s)
}

// AdamW implements kernels.Ops.
// Shapes: param, grad, m, v (N); m, v F32, or BF16 under FusedAdam.
func (b *Backend) AdamW(param, grad, m, v kernels.Buf, step kernels.AdamWStep) {
	n := param.N
	t := &b.tasks.adamw
	*t = adamwTask{p: b.f32n(param, n, "AdamW param"), g: b.f32n(grad, n, "AdamW grad"), s: newAdamwScalars(step)}
	kernels.CheckMoments("cpu", m, v, n, step.Rule)
	if m.DType == kernels.BF16 {
		t.mb, t.vb = b.BF16(m), b.BF16(v)
	} else {
		t.m, t.v = b.f32n(m, n, "AdamW m"), b.f32n(v, n, "AdamW v")
	}
	b.pool.parallel(t, n, elemGrain)
	*t = adamwTask{}
}

// AdamWMulti: a whole step's AdamW over a chunk table (kernels.MultiAdamW):
// the clip factor from sums in float64, nothing updated for a non-finite
// norm, then each chunk as AdamW updates it, and the new weights checked
// per chunk (each chunk's flag written by the worker that ran it, then OR-
// ed into its group's in chunk order). Chunks are disjoint: thread-count
// invariant, the same bits as AdamW over the same elements.
type adamwMultiTask struct {
	adamwTask
	chunks []kernels.AdamChunk
	bad    []bool // per chunk
}

func (t *adamwMultiTask) run(_, lo, hi int) {
	for ci := lo; ci < hi; ci++ {
		c := t.chunks[ci]
		a, b := int(c.Off), int(c.Off)+int(c.N)
		s := t.s
		if !c.Decay {
			s.wd, s.decay = 0, 1
		}
		if t.mb != nil {
			adamwRangeBF16(t.p[a:b], t.g[a:b], t.mb[a:b], t.vb[a:b], &s)
		} else {
			adamwRange(t.p[a:b], t.g[a:b], t.m[a:b], t.v[a:b], &s)
		}
		bad := false
		for _, x := range t.p[a:b] {
			bad = bad || kernels.WeightTooLarge(x)
		}
		t.bad[ci] = bad
	}
}

// AdamWMulti implements kernels.MultiAdamW.
// Shapes: param, grad, m, v (N); sums (nsums); table (4·nchunks) I32; flags (2+groups) I32.
func (b *Backend) AdamWMulti(param, grad, m, v, sums, table, flags kernels.Buf, nsums, nchunks int, step kernels.AdamWStep, maxNorm float64) {
	n := param.N
	ss := b.f32n(sums, nsums, "AdamWMulti sums")
	fl := b.I32(flags)
	tab := b.i32n(table, kernels.AdamChunkWords*nchunks, "AdamWMulti table")
	var S float64
	for _, x := range ss {
		S += float64(x)
	}
	norm := math.Sqrt(S)
	clear(fl)
	if math.IsNaN(norm) || math.IsInf(norm, 0) {
		fl[0] = 1
		return
	}
	step.GradScale = float32(kernels.ClipScale(norm, maxNorm))
	fl[1] = int32(math.Float32bits(step.GradScale))
	t := &b.tasks.adamwMulti
	*t = adamwMultiTask{adamwTask: adamwTask{p: b.f32n(param, n, "AdamWMulti param"), g: b.f32n(grad, n, "AdamWMulti grad"), s: newAdamwScalars(step)}}
	kernels.CheckMoments("cpu", m, v, n, step.Rule)
	if m.DType == kernels.BF16 {
		t.mb, t.vb = b.BF16(m), b.BF16(v)
	} else {
		t.m, t.v = b.f32n(m, n, "AdamWMulti m"), b.f32n(v, n, "AdamWMulti v")
	}
	t.chunks, t.bad = make([]kernels.AdamChunk, nchunks), make([]bool, nchunks)
	for i := range t.chunks {
		w := tab[kernels.AdamChunkWords*i:]
		t.chunks[i] = kernels.AdamChunk{Off: int64(uint32(w[0])) | int64(w[1])<<32, N: w[2], Group: w[3] >> 1, Decay: w[3]&1 != 0}
		if c := t.chunks[i]; c.Off < 0 || c.N < 0 || int(c.Off)+int(c.N) > n || 2+int(c.Group) >= len(fl) {
			panic(fmt.Sprintf("cpu: AdamWMulti chunk %d %+v outside %d parameters and %d flags", i, c, n, len(fl)))
		}
	}
	b.pool.parallel(t, nchunks, 1)
	for i, bad := range t.bad {
		if bad {
			fl[2+t.chunks[i].Group] = 1
		}
	}
	*t = adamwMultiTask{}
}

var _ kernels.MultiAdamW = (*Backend)(nil)
