package cpu

// Conv1D: the Mamba-2 mixer's causal depthwise convolution with its silu,
// over a packed tree (kernels.Mamba).
//
//	forward:  pre[t,c] = bias[c] + Σ_{k<KW} w[c,k]·inp[prev^(KW−1−k)(t), c]
//	          out (T,CD) = silu(pre)                                        =
//	backward: g = dout·silu'(pre), silu'(u) = σ(u)·(1 + u·(1 − σ(u)))
//	          dinp (T,CD) = Σ over the readers of each row of w[c,k]·g[t,c] =
//	          dweight (CD,KW) += Σ_t g[t,c]·inp[prev^(KW−1−k)(t), c]
//	          dbias (CD) += Σ_t g[t,c]
//
// prev(t) is the token before t in its context (t−1 inside a segment, the
// parent's last token at a segment's first, −1 at a root's first); it is
// computed once per call into scratch. The forward splits by row; the
// backward by blocks of convChanBlock channels, each walking the tokens in
// order (t, then k) and scattering into dinp: every element is summed by one
// grain in a fixed order, thread-count invariant, with no atomics.
//
// The decoding form (Conv1DDecode) keeps each sequence's last KW−1 pre-conv
// rows in a window and shifts it after each token.

import (
	"fmt"

	"github.com/tracegrpo/tracegrpo/kernels"
)

const (
	convRowGrain  = 16 // rows per forward grain
	convChanBlock = 64 // channels per backward grain
)

// contextPrev fills prev (T) with the token before each token of the tree
// (offs, parent): t−1 inside a segment, the parent's last token at a
// segment's first, −1 at a root's first.
func contextPrev(prev, offs, parent []int32) {
	for s := range len(parent) {
		lo, hi := offs[s], offs[s+1]
		if p := parent[s]; p >= 0 {
			prev[lo] = offs[p+1] - 1
		} else {
			prev[lo] = -1
		}
		for t := lo + 1; t < hi; t++ {
			prev[t] = t - 1
		}
	}
}

// convTaps fills idx (KW) with the rows token t reads: idx[k] =
// prev^(KW−1−k)(t), −1 where the context has none.
func convTaps(idx []int32, prev []int32, t int32) {
	KW := len(idx)
	r := t
	for k := KW - 1; k >= 0; k-- {
		idx[k] = r
		if r >= 0 {
			r = prev[r]
		}
	}
}

type convTask struct {
	out, inp, weight, bias []float32 // (T,CD), (T,CD), (CD,KW), (CD) or nil
	dinp, dweight, dbias   []float32 // backward; dbias nil when there is none
	dout                   []float32
	prev                   []int32 // (T)
	idx                    [][]int32
	acc                    [][]float32 // per worker: a block's Σ_t of dweight and dbias
	T, CD, KW              int
	bwd                    bool
}

func (t *convTask) run(w, lo, hi int) {
	if t.bwd {
		t.backward(w, lo, hi)
		return
	}
	CD, KW := t.CD, t.KW
	idx := t.idx[w][:KW]
	for r := lo; r < hi; r++ {
		convTaps(idx, t.prev, int32(r))
		o := t.out[r*CD : (r+1)*CD]
		for c := range o {
			u := float32(0)
			if t.bias != nil {
				u = t.bias[c]
			}
			wc := t.weight[c*KW : (c+1)*KW]
			for k, j := range idx {
				if j >= 0 {
					u += wc[k] * t.inp[int(j)*CD+c]
				}
			}
			o[c] = u / (1 + expf(-u))
		}
	}
}

// backward handles the channel blocks [lo, hi).
func (t *convTask) backward(w, lo, hi int) {
	CD, KW := t.CD, t.KW
	idx := t.idx[w][:KW]
	// The weight gradients of a block are summed over the tokens first and
	// then added to dweight and dbias, so that accumulating micro-batches
	// into one gradient and summing each micro-batch's apart (a sharded
	// model's slot) give the same bits.
	acc := t.acc[w][:convChanBlock*(KW+1)]
	for blk := lo; blk < hi; blk++ {
		c0, c1 := blk*convChanBlock, min((blk+1)*convChanBlock, CD)
		for r := 0; r < t.T; r++ {
			clear(t.dinp[r*CD+c0 : r*CD+c1])
		}
		clear(acc)
		dwAcc, dbAcc := acc[:convChanBlock*KW], acc[convChanBlock*KW:]
		for r := 0; r < t.T; r++ {
			convTaps(idx, t.prev, int32(r))
			for c := c0; c < c1; c++ {
				u := float32(0)
				if t.bias != nil {
					u = t.bias[c]
				}
				wc := t.weight[c*KW : (c+1)*KW]
				for k, j := range idx {
					if j >= 0 {
						u += wc[k] * t.inp[int(j)*CD+c]
					}
				}
				s := 1 / (1 + expf(-u))
				g := t.dout[r*CD+c] * (s * (1 + u*(1-s)))
				dbAcc[c-c0] += g
				dw := dwAcc[(c-c0)*KW : (c-c0+1)*KW]
				for k, j := range idx {
					if j >= 0 {
						dw[k] += g * t.inp[int(j)*CD+c]
						t.dinp[int(j)*CD+c] += wc[k] * g
					}
				}
			}
		}
		for c := c0; c < c1; c++ {
			if t.dbias != nil {
				t.dbias[c] += dbAcc[c-c0]
			}
			dw := t.dweight[c*KW : (c+1)*KW]
			for k := range dw {
				dw[k] += dwAcc[(c-c0)*KW+k]
			}
		}
	}
}

// convSetup checks the shapes and the tree and fills the task's context
// links; ok is false on a bad tree (a sticky error, outputs unwritten).
func (b *Backend) convSetup(op string, tree kernels.Tree, T, CD, KW int, weight, bias kernels.Buf) (*convTask, bool) {
	if T < 0 || CD <= 0 || KW < 1 {
		panic(fmt.Sprintf("cpu: %s: T=%d CD=%d KW=%d", op, T, CD, KW))
	}
	offs, parent, _, _, ok := b.checkTree(op, tree, T)
	if !ok {
		return nil, false
	}
	t := &b.tasks.conv
	*t = convTask{weight: b.f32n(weight, CD*KW, op+" weight"), T: T, CD: CD, KW: KW}
	if bias.N > 0 {
		t.bias = b.f32n(bias, CD, op+" bias")
	}
	if cap(b.tasks.convPrev) < T {
		b.tasks.convPrev = make([]int32, T)
	}
	t.prev = b.tasks.convPrev[:T]
	contextPrev(t.prev, offs, parent)
	if len(b.tasks.convIdx) != b.threads || (b.threads > 0 && cap(b.tasks.convIdx[0]) < KW) {
		b.tasks.convIdx = make([][]int32, b.threads)
		for i := range b.tasks.convIdx {
			b.tasks.convIdx[i] = make([]int32, KW)
		}
	}
	t.idx = b.tasks.convIdx
	if len(b.tasks.convAcc) != b.threads || (b.threads > 0 && cap(b.tasks.convAcc[0]) < convChanBlock*(KW+1)) {
		b.tasks.convAcc = make([][]float32, b.threads)
		for i := range b.tasks.convAcc {
			b.tasks.convAcc[i] = make([]float32, convChanBlock*(KW+1))
		}
	}
	t.acc = b.tasks.convAcc
	return t, true
}

// Conv1D implements kernels.Mamba.
// Shapes: out (T,CD) F32|BF16, inp (T,CD), weight (CD,KW), bias (CD) or empty.
func (b *Backend) Conv1D(out, inp, weight, bias kernels.Buf, tree kernels.Tree, T, CD, KW int) {
	t, ok := b.convSetup("Conv1D", tree, T, CD, KW, weight, bias)
	if !ok {
		return
	}
	o := b.out(out, T*CD, "Conv1D out")
	t.out, t.inp = o, b.f32n(inp, T*CD, "Conv1D inp")
	b.pool.parallel(t, T, convRowGrain)
	*t = convTask{}
	b.done(out, o)
}

// Conv1DBackward implements kernels.Mamba.
// Shapes: dinp, dout, inp (T,CD); dweight, weight (CD,KW); dbias, bias (CD) or empty.
func (b *Backend) Conv1DBackward(dinp, dweight, dbias, dout, inp, weight, bias kernels.Buf, tree kernels.Tree, T, CD, KW int) {
	t, ok := b.convSetup("Conv1DBackward", tree, T, CD, KW, weight, bias)
	if !ok {
		return
	}
	t.bwd = true
	t.dinp, t.dout, t.inp = b.f32n(dinp, T*CD, "Conv1DBackward dinp"), b.f32n(dout, T*CD, "Conv1DBackward dout"), b.f32n(inp, T*CD, "Conv1DBackward inp")
	t.dweight = b.f32n(dweight, CD*KW, "Conv1DBackward dweight")
	if t.bias != nil {
		t.dbias = b.f32n(dbias, CD, "Conv1DBackward dbias")
	}
	b.pool.parallel(t, (CD+convChanBlock-1)/convChanBlock, 1)
	*t = convTask{}
}

// Conv1DDecode implements kernels.Mamba.
// Shapes: out (B,CD) F32|BF16, window (B,KW−1,CD), inp (B,CD), weight (CD,KW), bias (CD) or empty.
func (b *Backend) Conv1DDecode(out, window, inp, weight, bias kernels.Buf, B, CD, KW int) {
	if B < 0 || CD <= 0 || KW < 1 {
		panic(fmt.Sprintf("cpu: Conv1DDecode: B=%d CD=%d KW=%d", B, CD, KW))
	}
	o := b.out(out, B*CD, "Conv1DDecode out")
	win := b.f32n(window, B*(KW-1)*CD, "Conv1DDecode window")
	x := b.f32n(inp, B*CD, "Conv1DDecode inp")
	wt := b.f32n(weight, CD*KW, "Conv1DDecode weight")
	var bs []float32
	if bias.N > 0 {
		bs = b.f32n(bias, CD, "Conv1DDecode bias")
	}
	W := KW - 1
	for r := range B {
		wr := win[r*W*CD : (r+1)*W*CD]
		for c := range CD {
			u := float32(0)
			if bs != nil {
				u = bs[c]
			}
			wc := wt[c*KW : (c+1)*KW]
			for k := range W {
				u += wc[k] * wr[k*CD+c]
			}
			u += wc[W] * x[r*CD+c]
			o[r*CD+c] = u / (1 + expf(-u))
		}
		if W > 0 {
			copy(wr, wr[CD:])
			copy(wr[(W-1)*CD:], x[r*CD:(r+1)*CD])
		}
	}
	b.done(out, o)
}
