//go:build cgo

package cuda

// AttentionDecode: csrc/attention_decode.cu (split over the cache length,
// then combined).

import (
	"fmt"
	"math"

	"github.com/tracegrpo/tracegrpo/kernels"
)

// AttentionDecode implements kernels.Ops: out (B,NH,HD) = attention of
// q (B,NH,HD) over rows [0, lens[b]) of kc, vc (B,Tmax,NKV,HD). q, kc, vc
// F32|BF16 (same: a bf16 KV cache), out F32.
func (b *Backend) AttentionDecode(out, q, kc, vc, lens kernels.Buf, B, Tmax, NH, NKV, HD int) {
	if NH <= 0 || NKV <= 0 || NH%NKV != 0 || HD <= 0 || HD > attMaxHD || B > attMaxGridY {
		panic(fmt.Sprintf("cuda: AttentionDecode: unsupported B %d NH %d NKV %d HD %d", B, NH, NKV, HD))
	}
	dt := operands("AttentionDecode q, kc, vc", q, kc, vc)
	want(out, kernels.F32, B*NH*HD, "AttentionDecode out")
	want(q, dt, B*NH*HD, "AttentionDecode q")
	want(kc, dt, B*Tmax*NKV*HD, "AttentionDecode kc")
	want(vc, dt, B*Tmax*NKV*HD, "AttentionDecode vc")
	want(lens, kernels.I32, B, "AttentionDecode lens")
	if B == 0 {
		return
	}
	scale := float32(1 / math.Sqrt(float64(HD)))
	split, nsplit := decodeSplits(b.opt.DecodeSplit, Tmax)
	if nsplit > attMaxGridY {
		panic(fmt.Sprintf("cuda: AttentionDecode: Tmax %d needs %d splits of %d (at most %d)", Tmax, nsplit, split, attMaxGridY))
	}
	smem := 4 * (HD + attKeyTile*(HD+1) + attKeyTile*HD)
	defer b.lock()()
	part := b.work(workDecode, decodeWork(B, NH, HD, nsplit))
	if part == 0 {
		return
	}
	name := "attention_decode_partial"
	if dt == kernels.BF16 {
		name = "attention_decode_partial_bf16"
	}
	// The cache rows up to Tmax, an upper bound of those the lengths name.
	pb := int64(decodeWork(B, NH, HD, nsplit))
	c := rw(reads(q, kc, vc, lens)).plus(0, pb).with(4*int64(B)*int64(NH)*int64(Tmax)*int64(HD), 0)
	b.launch(name, c, NH, B, nsplit, 32, smem,
		pu(part), pa(q), pa(kc), pa(vc), pa(lens), ia(Tmax), ia(NH), ia(NKV), ia(HD), fa(scale), ia(split), pu(b.flags))
	b.launch("attention_decode_combine", rw(nil, out).plus(pb, 0), NH, B, 1, 32, 0, pa(out), pu(part), ia(NH), ia(HD), ia(nsplit))
}
