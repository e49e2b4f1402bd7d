//go:build cgo

package cuda

// GroupedMatmul and GroupedMatmulBackward: csrc/grouped_matmul.cu, one
// kernel family for every expert at once, reading the expert offsets on
// the device (no host round trip): fp32 operands on FMAs, bf16 operands on
// tensor cores (mma.sync, fp32 accumulation).

import (
	"fmt"
	"math"

	"github.com/tracegrpo/tracegrpo/kernels"
)

// groupedTile is GG_BM = GG_BN of csrc/grouped_matmul.cu; groupedThreads
// is GG_THREADS.
const (
	groupedTile    = 64
	groupedThreads = 128
)

func checkGrouped(op string, N, C, OC, E int) {
	if N < 0 || C < 1 || OC < 1 || E < 1 {
		panic(fmt.Sprintf("cuda: %s: N=%d C=%d OC=%d E=%d", op, N, C, OC, E))
	}
	if int64(N)*int64(max(C, OC)) > math.MaxInt32 || int64(OC)*int64(C) > math.MaxInt32 {
		panic(fmt.Sprintf("cuda: %s: N=%d rows of %d and %d: the kernels index an expert's rows with 32 bits", op, N, C, OC))
	}
}

// rowTileSlots is the grid's row-tile slots for N rows among E experts:
// Σ_e ceil(n_e/64) ≤ ceil(N/64) + E.
func rowTileSlots(N, E int) int { return (N+groupedTile-1)/groupedTile + E }

// GroupedMatmul implements kernels.Experts: out (N,OC) = each expert's
// rows of inp (N,C) times its weight (E,OC,C)ᵀ; inp, weight F32|BF16
// (same), out F32|BF16.
func (b *Backend) GroupedMatmul(out, inp, weight, offsets kernels.Buf, N, C, OC, E int) {
	checkGrouped("GroupedMatmul", N, C, OC, E)
	dt := operands("GroupedMatmul inp, weight", inp, weight)
	operands("GroupedMatmul out", out)
	want(out, out.DType, N*OC, "GroupedMatmul out")
	want(inp, dt, N*C, "GroupedMatmul inp")
	want(weight, dt, E*OC*C, "GroupedMatmul weight")
	want(offsets, kernels.I32, E+1, "GroupedMatmul offsets")
	if N == 0 {
		return
	}
	name := groupedFwdKernels[[2]kernels.DType{dt, out.DType}]
	defer b.lock()()
	// Each expert's weight read once (an upper bound: E·OC·C), the rows once.
	c := rw(reads(inp, weight, offsets), out).with(2*int64(N)*int64(C)*int64(OC), 0)
	b.launch(name, c, rowTileSlots(N, E), (OC+groupedTile-1)/groupedTile, 1, groupedThreads, 0,
		pa(out), pa(inp), pa(weight), pa(offsets), ia(N), ia(C), ia(OC), ia(E))
}

// groupedFwdKernels names GroupedMatmul's kernel by (operand, output) dtype.
var groupedFwdKernels = map[[2]kernels.DType]string{
	{kernels.F32, kernels.F32}: "grouped_fwd", {kernels.F32, kernels.BF16}: "grouped_fwd_f32_bf16out",
	{kernels.BF16, kernels.F32}: "grouped_fwd_bf16_f32out", {kernels.BF16, kernels.BF16}: "grouped_fwd_bf16",
}

// GroupedMatmulBackward implements kernels.Experts: dinp (N,C) +=,
// dweight (E,OC,C) += (an empty expert's untouched); a zero-length one is
// skipped. dout, inp, weight F32|BF16 (same); dinp, dweight F32.
func (b *Backend) GroupedMatmulBackward(dinp, dweight, dout, inp, weight, offsets kernels.Buf, N, C, OC, E int) {
	checkGrouped("GroupedMatmulBackward", N, C, OC, E)
	dt := operands("GroupedMatmulBackward dout", dout)
	want(dout, dt, N*OC, "GroupedMatmulBackward dout")
	want(offsets, kernels.I32, E+1, "GroupedMatmulBackward offsets")
	if N == 0 {
		return
	}
	suffix := ""
	if dt == kernels.BF16 {
		suffix = "_bf16"
	}
	defer b.lock()()
	if dinp.N != 0 {
		want(weight, dt, E*OC*C, "GroupedMatmulBackward weight")
		want(dinp, kernels.F32, N*C, "GroupedMatmulBackward dinp")
		c := rw(reads(dout, weight, offsets, dinp), dinp).with(2*int64(N)*int64(C)*int64(OC), 0)
		b.launch("grouped_dinp"+suffix, c, rowTileSlots(N, E), (C+groupedTile-1)/groupedTile, 1, groupedThreads, 0,
			pa(dinp), pa(dout), pa(weight), pa(offsets), ia(N), ia(C), ia(OC), ia(E))
	}
	if dweight.N != 0 {
		want(inp, dt, N*C, "GroupedMatmulBackward inp")
		want(dweight, kernels.F32, E*OC*C, "GroupedMatmulBackward dweight")
		tiles := ((OC + groupedTile - 1) / groupedTile) * ((C + groupedTile - 1) / groupedTile)
		c := rw(reads(dout, inp, offsets, dweight), dweight).with(2*int64(N)*int64(C)*int64(OC), 0)
		b.launch("grouped_dw"+suffix, c, tiles, E, 1, groupedThreads, 0,
			pa(dweight), pa(dout), pa(inp), pa(offsets), ia(N), ia(C), ia(OC))
	}
}
