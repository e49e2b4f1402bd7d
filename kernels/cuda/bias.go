//go:build cgo

package cuda

// AddBias and BiasBackward: csrc/bias.cu.

import (
	"fmt"

	"github.com/tracegrpo/tracegrpo/kernels"
)

// bias_backward_partial is written for blocks of biasThreads threads.
const biasThreads = 256

// AddBias implements kernels.Ops: out (T,OC) += bias (OC).
func (b *Backend) AddBias(out, bias kernels.Buf, T, OC int) {
	if OC <= 0 {
		panic(fmt.Sprintf("cuda: AddBias: OC = %d", OC))
	}
	want(out, kernels.F32, T*OC, "AddBias out")
	want(bias, kernels.F32, OC, "AddBias bias")
	defer b.lock()()
	b.elementwise("add_bias", rw(reads(out, bias), out).with(int64(T)*int64(OC), 0), T*OC, pa(out), pa(bias), ia(T), ia(OC))
}

// BiasBackward implements kernels.Ops: dbias (OC) += Σ_t dout (T,OC), in a
// fixed order (partial sums over chunks of biasRows rows, then the chunks in
// order).
func (b *Backend) BiasBackward(dbias, dout kernels.Buf, T, OC int) {
	if OC <= 0 {
		panic(fmt.Sprintf("cuda: BiasBackward: OC = %d", OC))
	}
	want(dbias, kernels.F32, OC, "BiasBackward dbias")
	want(dout, kernels.F32, T*OC, "BiasBackward dout")
	if T == 0 {
		return
	}
	chunks := (T + biasRows - 1) / biasRows
	tiles := (OC + 31) / 32
	defer b.lock()()
	partials := b.work(workBias, biasWork(T, OC))
	if partials == 0 {
		return
	}
	pb := int64(biasWork(T, OC))
	b.launch("bias_backward_partial", rw(reads(dout)).plus(0, pb).with(int64(T)*int64(OC), 0), tiles*chunks, 1, 1, biasThreads, 0, pu(partials), pa(dout), ia(T), ia(OC))
	b.elementwise("bias_backward_reduce", rw(reads(dbias), dbias).plus(pb, 0).with(pb/4, 0), OC, pa(dbias), pu(partials), ia(chunks), ia(OC))
}
