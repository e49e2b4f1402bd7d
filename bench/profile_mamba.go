package bench

import "github.com/tracegrpo/tracegrpo/kernels"

// profiled is the backend a profiled run hands the model: p, and, when the
// backend has Nemotron-H's Mamba-2 ops (kernels.Mamba), p with those timed
// too. A backend without them stays without, so a hybrid config is refused
// as it would be unprofiled.
func (p *timedBackend) profiled() kernels.Backend {
	if _, ok := p.Backend.(kernels.Mamba); ok {
		return timedMamba{p}
	}
	return p
}

// timedMamba is a timed backend with the Mamba-2 ops.
type timedMamba struct{ *timedBackend }

func (p timedMamba) mamba() kernels.Mamba { return p.Backend.(kernels.Mamba) }

func (p timedMamba) Conv1D(out, inp, weight, bias kernels.Buf, tree kernels.Tree, T, CD, KW int) {
	p.time("Conv1D", func() { p.mamba().Conv1D(out, inp, weight, bias, tree, T, CD, KW) })
}
func (p timedMamba) Conv1DBackward(dinp, dweight, dbias, dout, inp, weight, bias kernels.Buf, tree kernels.Tree, T, CD, KW int) {
	p.time("Conv1DBackward", func() { p.mamba().Conv1DBackward(dinp, dweight, dbias, dout, inp, weight, bias, tree, T, CD, KW) })
}
func (p timedMamba) SSMScan(y, final, xbc, dtRaw, dtBias, aLog, d kernels.Buf, tree kernels.Tree, T int, s kernels.Scan) {
	p.time("SSMScan", func() { p.mamba().SSMScan(y, final, xbc, dtRaw, dtBias, aLog, d, tree, T, s) })
}
func (p timedMamba) SSMScanBackward(dxbc, ddtRaw, ddtBias, daLog, dd, dy, xbc, dtRaw, dtBias, aLog, d kernels.Buf, tree kernels.Tree, T int, s kernels.Scan) {
	p.time("SSMScanBackward", func() {
		p.mamba().SSMScanBackward(dxbc, ddtRaw, ddtBias, daLog, dd, dy, xbc, dtRaw, dtBias, aLog, d, tree, T, s)
	})
}
func (p timedMamba) Conv1DDecode(out, window, inp, weight, bias kernels.Buf, B, CD, KW int) {
	p.time("Conv1DDecode", func() { p.mamba().Conv1DDecode(out, window, inp, weight, bias, B, CD, KW) })
}
func (p timedMamba) SSMDecode(y, state, xbc, dtRaw, dtBias, aLog, d kernels.Buf, B int, s kernels.Scan) {
	p.time("SSMDecode", func() { p.mamba().SSMDecode(y, state, xbc, dtRaw, dtBias, aLog, d, B, s) })
}
func (p timedMamba) GatedRMSNorm(out, rstd, y, z, weight kernels.Buf, N, D, GS int, eps float32) {
	p.time("GatedRMSNorm", func() { p.mamba().GatedRMSNorm(out, rstd, y, z, weight, N, D, GS, eps) })
}
func (p timedMamba) GatedRMSNormBackward(dy, dz, dweight, dout, y, z, weight, rstd kernels.Buf, N, D, GS int) {
	p.time("GatedRMSNormBackward", func() { p.mamba().GatedRMSNormBackward(dy, dz, dweight, dout, y, z, weight, rstd, N, D, GS) })
}
func (p timedMamba) ReLU2(out, inp kernels.Buf, N int) {
	p.time("ReLU2", func() { p.mamba().ReLU2(out, inp, N) })
}
func (p timedMamba) ReLU2Backward(dinp, dout, inp kernels.Buf, N int) {
	p.time("ReLU2Backward", func() { p.mamba().ReLU2Backward(dinp, dout, inp, N) })
}
