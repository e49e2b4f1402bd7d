//go:build cgo

package cuda

import (
	"fmt"
	"math"
	"math/rand/v2"
	"strconv"
	"testing"

	"github.com/tracegrpo/tracegrpo/kernels"
	"github.com/tracegrpo/tracegrpo/kernels/cpu"
	"github.com/tracegrpo/tracegrpo/kernels/internal/randtree"
	"github.com/tracegrpo/tracegrpo/kernels/kerneltest"
)

// ssdCase is one scan of TestSSDForwardEmu: a shape on a tree.
type ssdCase struct {
	s    kernels.Scan
	tree randtree.Tree
}

func ssdSeq(lens ...int) randtree.Tree {
	tr := randtree.Tree{Offs: []int32{0}}
	for _, l := range lens {
		tr.Parent = append(tr.Parent, -1)
		tr.Offs = append(tr.Offs, tr.Offs[len(tr.Offs)-1]+int32(l))
		tr.Ends = append(tr.Ends, tr.Offs[len(tr.Offs)-1])
		tr.MaxLen, tr.MaxCtx = max(tr.MaxLen, l), max(tr.MaxCtx, l)
	}
	return tr
}

// ssdCases: lengths the chunk (64) does not divide, packed rows with
// one-token sequences, random trees (children inside and across chunk
// boundaries), n_groups > 1, MP not a multiple of the p-tile (16) and DS not
// a multiple of 16, and Nemotron-3-Nano's head shape (MP 64, DS 128).
func ssdCases() []ssdCase {
	inf := float32(math.Inf(1))
	r := rand.New(rand.NewPCG(35, 1))
	small := kernels.Scan{MH: 4, MP: 24, G: 2, DS: 24, Chunk: 128, DtMax: inf}
	clamp := kernels.Scan{MH: 2, MP: 8, G: 2, DS: 5, Chunk: 16, DtMin: 0.05, DtMax: 0.6}
	nano := kernels.Scan{MH: 2, MP: 64, G: 1, DS: 128, Chunk: 128, DtMax: inf}
	return []ssdCase{
		{small, ssdSeq(150)},
		{small, ssdSeq(64, 1, 70, 33)},
		{small, randtree.Random(r, 4, 3, 90)},
		{clamp, randtree.Random(r, 6, 2, 3)},
		{clamp, ssdSeq(129)},
		{nano, ssdSeq(200, 7)},
		{nano, randtree.Random(r, 3, 3, 70)},
	}
}

// ssdRun is one backend's outputs of a scan: y, the final states and (the
// kernels launched directly) the checkpoints.
type ssdRun struct{ y, final, ckpt []float32 }

// ssdInputs are a case's inputs on the host: xbc (rounded to bf16), dtRaw,
// dtBias, aLog, d.
func ssdInputs(r *rand.Rand, T int, s kernels.Scan) [5][]float32 {
	randn := func(n int, sd float64) []float32 {
		v := make([]float32, n)
		for i := range v {
			v[i] = float32(r.NormFloat64() * sd)
		}
		return v
	}
	xbc := randn(T*s.CD(), 1)
	for i, x := range xbc {
		xbc[i] = cpu.BF16ToF32(cpu.F32ToBF16(x))
	}
	al := make([]float32, s.MH)
	for h := range al {
		al[h] = float32(math.Log(float64(1+h)) + 0.3*r.NormFloat64())
	}
	return [5][]float32{xbc, randn(T*s.MH, 1.5), randn(s.MH, 1), al, randn(s.MH, 1)}
}

func ssdCkpts(tr randtree.Tree) int {
	n := 0
	for s := range tr.Parent {
		n += int(tr.Offs[s+1]-tr.Offs[s]+ssdQ-1) / ssdQ
	}
	return n
}

// ssdDevice runs kernel (ssd_scan_fwd_bf16 or mamba.cu's ssm_scan_fwd_bf16)
// on b with checkpoints, and SSMScan itself (which must be the SSD kernel's
// y and final, bit for bit, when kernel is it).
func ssdDevice(t *testing.T, b *Backend, kernel string, in [5][]float32, c ssdCase) (direct, api ssdRun) {
	t.Helper()
	s, T, NS := c.s, c.tree.T(), len(c.tree.Parent)
	f32 := func(v []float32) kernels.Buf {
		x, err := b.Alloc(kernels.F32, len(v))
		if err != nil {
			t.Fatal(err)
		}
		b.UploadF32(x, v)
		return x
	}
	i32 := func(v []int32) kernels.Buf {
		x, err := b.Alloc(kernels.I32, len(v))
		if err != nil {
			t.Fatal(err)
		}
		b.UploadI32(x, v)
		return x
	}
	xbc, err := b.Alloc(kernels.BF16, T*s.CD())
	if err != nil {
		t.Fatal(err)
	}
	b.Convert(xbc, f32(in[0]))
	dtRaw, dtBias, aLog, d := f32(in[1]), f32(in[2]), f32(in[3]), f32(in[4])
	tree := kernels.Tree{Offs: i32(c.tree.Offs), Parent: i32(c.tree.Parent), Ends: i32(c.tree.Ends), NS: NS, MaxLen: c.tree.MaxLen, MaxCtx: c.tree.MaxCtx}
	nan := func(n int) []float32 {
		v := make([]float32, n)
		for i := range v {
			v[i] = float32(math.NaN())
		}
		return v
	}
	st := s.DI() * s.DS
	y, fin, ck := f32(nan(T*s.DI())), f32(nan(NS*st)), f32(nan(ssdCkpts(c.tree)*st))
	y2, fin2 := f32(nan(T*s.DI())), f32(nan(NS*st))
	lo, hi := scanDt(s)
	// The SSD kernel's grid is (p-tile, head); mamba.cu's one block a head.
	gx, gy, threads, smem := ceilDiv(s.MP, ssdPT), s.MH, ssdThreads, ssdSmem
	if kernel != "ssd_scan_fwd_bf16" {
		gx, gy, threads, smem = s.MH, 1, mambaThreads, scanSmem(s)
	}
	func() {
		defer b.lock()()
		b.launch(kernel, cost{}, gx, gy, 1, threads, smem,
			pa(y), pa(fin), pa(ck), pa(xbc), pa(dtRaw), pa(dtBias), pa(aLog), pa(d), pa(tree.Offs), pa(tree.Parent),
			ia(NS), ia(T), ia(s.MH), ia(s.MP), ia(s.G), ia(s.DS), lo, hi)
	}()
	b.SSMScan(y2, fin2, xbc, dtRaw, dtBias, aLog, d, tree, T, s)
	get := func(x kernels.Buf) []float32 {
		v := make([]float32, x.N)
		b.DownloadF32(v, x)
		return v
	}
	if err := b.Sync(); err != nil {
		t.Fatal(err)
	}
	return ssdRun{get(y), get(fin), get(ck)}, ssdRun{get(y2), get(fin2), nil}
}

// ssdCPU runs kernels/cpu's SSMScan (the chunked SSD in fp32 on the same
// bf16-exact inputs).
func ssdCPU(t *testing.T, in [5][]float32, c ssdCase) ssdRun {
	ref := cpu.New(2)
	defer ref.Close()
	s, T, NS := c.s, c.tree.T(), len(c.tree.Parent)
	f32 := func(v []float32) kernels.Buf {
		x, _ := ref.Alloc(kernels.F32, len(v))
		ref.UploadF32(x, v)
		return x
	}
	i32 := func(v []int32) kernels.Buf {
		x, _ := ref.Alloc(kernels.I32, len(v))
		ref.UploadI32(x, v)
		return x
	}
	y, fin := f32(make([]float32, T*s.DI())), f32(make([]float32, NS*s.DI()*s.DS))
	tree := kernels.Tree{Offs: i32(c.tree.Offs), Parent: i32(c.tree.Parent), Ends: i32(c.tree.Ends), NS: NS, MaxLen: c.tree.MaxLen, MaxCtx: c.tree.MaxCtx}
	ref.SSMScan(y, fin, f32(in[0]), f32(in[1]), f32(in[2]), f32(in[3]), f32(in[4]), tree, T, s)
	out := ssdRun{make([]float32, y.N), make([]float32, fin.N), nil}
	ref.DownloadF32(out.y, y)
	ref.DownloadF32(out.final, fin)
	if err := ref.Sync(); err != nil {
		t.Fatal(err)
	}
	return out
}

// ssdErr is the largest |got − want| and the largest |got − want| /
// (|want| + 1) (the error against the scale TolScanBF16's Atol + Rtol·|want|
// measures, with Atol ≈ Rtol).
func ssdErr(want, got []float32) (abs, scaled float64) {
	for i := range want {
		d := math.Abs(float64(got[i]) - float64(want[i]))
		if math.IsNaN(d) {
			return math.Inf(1), math.Inf(1)
		}
		abs = max(abs, d)
		scaled = max(scaled, d/(math.Abs(float64(want[i]))+1))
	}
	return abs, scaled
}

// TestSSDForwardEmu: the chunked SSD forward on tensor cores
// (csrc/ssd_fwd.cu) on the emulator, against kernels/cpu's fp32 SSD and
// against mamba.cu's sequential fp32 recurrence on the same bf16 inputs:
// y, the final states and the checkpoints the backward reads (the same
// contract: the state before every 64th token of a segment), within
// kerneltest.TolScanBF16; SSMScan runs it (its outputs are the kernel's,
// bit for bit). The worst errors are logged: they set TolScanBF16.
func TestSSDForwardEmu(t *testing.T) {
	b := emuBackend(t, Options{})
	r := rand.New(rand.NewPCG(35, 2))
	var worstAbs, worstScaled float64
	for _, c := range ssdCases() {
		tag := fmt.Sprintf("%+v NS=%d T=%d", c.s, len(c.tree.Parent), c.tree.T())
		in := ssdInputs(r, c.tree.T(), c.s)
		ssd, api := ssdDevice(t, b, "ssd_scan_fwd_bf16", in, c)
		seq, _ := ssdDevice(t, b, "ssm_scan_fwd_bf16", in, c)
		ref := ssdCPU(t, in, c)
		for _, cmp := range []struct {
			what      string
			want, got []float32
			tol       kerneltest.Tol
		}{
			{"y against kernels/cpu", ref.y, ssd.y, kerneltest.TolScanBF16},
			{"final against kernels/cpu", ref.final, ssd.final, kerneltest.TolScanBF16},
			{"y against the sequential recurrence", seq.y, ssd.y, kerneltest.TolScanBF16},
			{"final against the sequential recurrence", seq.final, ssd.final, kerneltest.TolScanBF16},
			{"checkpoints against the sequential recurrence's", seq.ckpt, ssd.ckpt, kerneltest.TolScanBF16},
			{"SSMScan's y against the kernel's", ssd.y, api.y, kerneltest.TolExact},
			{"SSMScan's final against the kernel's", ssd.final, api.final, kerneltest.TolExact},
		} {
			if msg := kerneltest.Compare(cmp.want, cmp.got, cmp.tol); msg != "" {
				t.Errorf("%s: %s: %s", tag, cmp.what, msg)
			}
			if cmp.tol == kerneltest.TolScanBF16 {
				a, s := ssdErr(cmp.want, cmp.got)
				worstAbs, worstScaled = max(worstAbs, a), max(worstScaled, s)
				t.Logf("%s: %s: max |err| %.3g, max |err|/(|want|+1) %.3g", tag, cmp.what, a, s)
			}
		}
	}
	t.Logf("worst over the cases: |err| %.3g, |err|/(|want|+1) %.3g (TolScanBF16 %+v)", worstAbs, worstScaled, kerneltest.TolScanBF16)
}

// TestSSDForwardSchedulesEmu: the SSD forward's outputs are the same bits
// under other emulator schedules (block, warp and lane orders): no
// summation order depends on which thread runs first.
func TestSSDForwardSchedulesEmu(t *testing.T) {
	cs := ssdCases()
	var first []ssdRun
	for i, seed := range []int{1, 7, 12345} {
		t.Setenv(emuSeedEnv, strconv.Itoa(seed))
		b := emuBackend(t, Options{})
		r := rand.New(rand.NewPCG(35, 3))
		for k, c := range []ssdCase{cs[2], cs[6]} {
			run, _ := ssdDevice(t, b, "ssd_scan_fwd_bf16", ssdInputs(r, c.tree.T(), c.s), c)
			if i == 0 {
				first = append(first, run)
				continue
			}
			for _, v := range []struct {
				what      string
				want, got []float32
			}{{"y", first[k].y, run.y}, {"final", first[k].final, run.final}, {"checkpoints", first[k].ckpt, run.ckpt}} {
				for j := range v.want {
					if math.Float32bits(v.want[j]) != math.Float32bits(v.got[j]) {
						t.Fatalf("seed %d, case %d: %s[%d] = %g, under seed 1 %g", seed, k, v.what, j, v.got[j], v.want[j])
					}
				}
			}
		}
	}
}
