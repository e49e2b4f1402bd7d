package cpu

// AdamW: one decoupled-weight-decay Adam update of param, m, v (N) in place
// from grad (N), in float32, in exactly torch.optim.AdamW's (single-tensor,
// torch 1.13) order of operations:
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
// float64 here and rounded once to float32, as
// torch does when it hands a Python scalar to a float32 kernel. Every product
// is rounded explicitly (float32(...)), so the compiler cannot fuse it into
// an FMA. Elementwise: thread-count invariant.

import (
	"math"

	"github.com/tracegrpo/tracegrpo/kernels"
)

type adamwScalars struct {
	gradScale, decay, b1, omb1, b2, omb2, bc2sqrt, eps, negStep float32
}

func newAdamwScalars(s kernels.AdamWStep) adamwScalars {
	return adamwScalars{
		gradScale: s.GradScale,
		decay:     float32(1 - float64(s.LR)*float64(s.WeightDecay)),
		b1:        s.Beta1,
		omb1:      s.OneMinusBeta1,
		b2:        s.Beta2,
		omb2:      s.OneMinusBeta2,
		bc2sqrt:   float32(math.Sqrt(float64(s.BiasCorrection2))),
		eps:       s.Eps,
		negStep:   float32(-(float64(s.LR) / float64(s.BiasCorrection1))),
	}
}

func adamwRange(p, grad, m, v []float32, s adamwScalars) {
	grad = grad[:len(p)]
	m = m[:len(p)]
	v = v[:len(p)]
	for i := range p {
		g := float32(grad[i] * s.gradScale)
		pi := float32(p[i] * s.decay)
		mi := float32(m[i] * s.b1)
		mi = float32(mi + float32(s.omb1*g))
		vi := float32(v[i] * s.b2)
		vi = float32(vi + float32(float32(s.omb2*g)*g))
		denom := float32(float32(float32(math.Sqrt(float64(vi)))/s.bc2sqrt) + s.eps)
		pi = float32(pi + float32(float32(s.negStep*mi)/denom))
		p[i], m[i], v[i] = pi, mi, vi
	}
}

type adamwTask struct {
	p, g, m, v []float32 // (N)
	s          adamwScalars
}

func (t *adamwTask) run(_, lo, hi int) {
	adamwRange(t.p[lo:hi], t.g[lo:hi], t.m[lo:hi], t.v[lo:hi], t.s)
}

// AdamW implements kernels.Ops.
// Shapes: param, grad, m, v (N).
func (b *Backend) AdamW(param, grad, m, v kernels.Buf, step kernels.AdamWStep) {
	n := param.N
	t := &b.tasks.adamw
	*t = adamwTask{
		p: b.f32n(param, n, "AdamW param"), g: b.f32n(grad, n, "AdamW grad"),
		m: b.f32n(m, n, "AdamW m"), v: b.f32n(v, n, "AdamW v"),
		s: newAdamwScalars(step),
	}
	b.pool.parallel(t, n, elemGrain)
	*t = adamwTask{}
}
