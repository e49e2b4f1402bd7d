//go:build cgo

package cuda

// The chunked SSD forward of the Mamba-2 scan on tensor cores
// (csrc/ssd_fwd.cu): SSMScan runs it on a bf16 xbc whose state size fits
// (DS ≤ ssdMaxDS), the sequential fp32 recurrence of csrc/mamba.cu
// otherwise (an fp32 xbc keeps fp32 products: TolScan, not TolScanBF16).

import "github.com/tracegrpo/tracegrpo/kernels"

// The shape of csrc/ssd_fwd.cu.
const (
	ssdThreads = 128 // SSD_THREADS
	ssdQ       = 64  // SSD_Q: a chunk's rows (= mambaQ, the checkpoints' spacing)
	ssdPT      = 16  // SSD_PT: a block's columns of its head
	ssdMaxDS   = 128 // SSD_DSMAX
	// ssdSmem is SSD_SMEM: B and C (64 rows of 136), S0's two parts (16
	// of 136), X and diag(w)·X's two parts (64 of 24), bf16; dt and Λ.
	ssdSmem = 2*(2*ssdQ*(ssdMaxDS+8)+2*ssdPT*(ssdMaxDS+8)+3*ssdQ*(ssdPT+8)) + 8*ssdQ
)

// ssdForward reports whether SSMScan on xbc of type dt runs ssd_scan_fwd_bf16.
func ssdForward(dt kernels.DType, s kernels.Scan) bool { return dt == kernels.BF16 && s.DS <= ssdMaxDS }

// ssdFLOPs is the tensor-core work of ssd_scan_fwd_bf16 over T tokens, as
// if they filled whole chunks of ssdQ rows (a segment's last, partial chunk
// skips its empty 16-row steps): per chunk and block (ssdPT columns p, the
// state padded to DSP = ⌈DS/16⌉·16 columns n), the products
//
//	C·S0ᵀ      (Q × DSP) · (DSP × PT)
//	C·Bᵀ       its 10 causal 16×16 tiles of (Q × Q), each over DSP
//	(·)·X      the same 10 tiles times (16 × PT)
//	Xwᵀ·B      (PT × Q) · (Q × DSP)
//
// at 2 FLOPs a multiply-add, each but C·Bᵀ twice (its fp32 operand's two
// bf16 parts); a block per (head, ⌈MP/PT⌉ p-tile).
func ssdFLOPs(T int, s kernels.Scan) int64 {
	dsp := int64((s.DS + 15) / 16 * 16)
	const q, pt, tiles = ssdQ, ssdPT, 10 // 1 + 2 + 3 + 4 causal tiles in 4 row blocks of 16
	perChunk := 2*(2*q*dsp*pt) + 2*tiles*16*16*dsp + 2*(2*tiles*16*16*pt) + 2*(2*pt*q*dsp)
	blocks := int64(s.MH) * int64(ceilDiv(s.MP, ssdPT))
	return int64(T) * blocks * perChunk / q
}
