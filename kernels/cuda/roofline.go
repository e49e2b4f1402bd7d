package cuda

// The roofline: a launch ledger (ledger.go) turned into a predicted time
// per launch on a device that has never run it. Each launch is bounded
// below by
//
//   - its FLOPs at the matrix rate of what runs it (cuBLAS's GEMMs, our
//     mma.sync kernels, or the CUDA cores), over the part of the device its
//     grid occupies (a grid of fewer blocks than the SMs' slots runs at
//     that fraction; a last partial wave counts whole);
//   - its bytes at the measured copy bandwidth, or at the bandwidth its
//     resident threads can draw when they keep too few loads in flight
//     (Little's law: bytes in flight = bandwidth × latency);
//   - one launch's gap.
//
// The largest of the three is the prediction. Occupancy comes from the
// kernel's registers and shared memory on sm_90 (gen_sm90.go, written by
// make sass from ptxas), so the model reads the same machine code the
// device would run. Nothing here is measured on a GPU of this project; the
// rates are the measured ones of /work/.library/device (KINDS.md) or
// stated as assumptions (Device's comments), and gpu-check prints
// measured beside predicted time so that a lent GPU calibrates them.

import (
	"fmt"
	"math"
	"sort"
	"strings"
)

// Device is what the roofline knows of a GPU.
type Device struct {
	Name string
	SMs  int
	// PeakBF16 is the datasheet's dense bf16 rate (FLOP/s): MFU's
	// denominator.
	PeakBF16 float64
	// GemmRate is cuBLAS's bf16 rate on a large square GEMM as measured
	// (an 8192³ product), GemmSize that size: the model removes that
	// shape's own wave quantisation to get the rate of full waves.
	GemmRate float64
	GemmSize int
	// GemmTile is the output tile of one cuBLAS CTA (M, N), one CTA an SM:
	// the wave quantisation of GEMMs.
	GemmTile [2]int
	// MMARate is the matrix rate of our mma.sync (HMMA) kernels.
	MMARate float64
	// FP32Rate is the CUDA cores' fp32 rate (FLOP/s, an FMA counting 2).
	FP32Rate float64
	// CopyBW is the device-to-device copy bandwidth, bytes read plus
	// written per second, as measured.
	CopyBW float64
	// Latency is the memory latency under load (seconds): the bytes in
	// flight the copy bandwidth needs are CopyBW·Latency.
	Latency float64
	// LaunchGap is the least a launch costs on a busy stream (seconds).
	LaunchGap float64
	// Per-SM limits of sm_90 (CUDA C Programming Guide, "Technical
	// Specifications per Compute Capability").
	RegsPerSM, SmemPerSM, SmemPerBlock, SmemReserved, ThreadsPerSM, BlocksPerSM int
}

// H200 is the SXM H200 of the device notes (/work/.library/device: H200.md
// and KINDS.md): 132 SMs; 990 TFLOP/s dense bf16 by the datasheet, 788 on
// random data measured through PyTorch on an 8192³ product; 4.3 TB/s
// measured device-to-device copy. The rest are assumptions, stated so a
// lent GPU can correct them:
//   - MMARate: mma.sync issues Hopper's tensor cores at half the rate of
//     wgmma, which cuBLAS uses; so our HMMA kernels get half of cuBLAS's
//     measured rate at best (FlashAttention-2, on mma.sync, reaches about
//     35% of the datasheet peak on an H100).
//   - FP32Rate: the datasheet's 67 TFLOP/s.
//   - Latency: 650 ns under load, so the copy bandwidth needs about 2.8 MB
//     in flight, 21 KiB an SM.
//   - LaunchGap: 2 µs between back-to-back kernels on one stream.
//   - GemmTile: 128×256 outputs a CTA, one CTA an SM (cuBLAS's Hopper
//     bf16 kernels).
var H200 = Device{
	Name: "NVIDIA H200 (model)", SMs: 132,
	PeakBF16: 989e12, GemmRate: 788e12, GemmSize: 8192, GemmTile: [2]int{128, 256},
	MMARate: 788e12 / 2, FP32Rate: 67e12,
	CopyBW: 4.3e12, Latency: 650e-9, LaunchGap: 2e-6,
	RegsPerSM: 65536, SmemPerSM: 228 << 10, SmemPerBlock: 227 << 10, SmemReserved: 1 << 10,
	ThreadsPerSM: 2048, BlocksPerSM: 32,
}

// H200SM90a is what-if H200 for the sm_90a path that is not built
// (docs/gpu.md): our tensor-core kernels (attention) issuing wgmma from
// warpgroups at cuBLAS's measured rate instead of mma.sync at half of it
// (FlashAttention-3 reaches about 75% of the datasheet peak in its forward
// on an H100, 740 TFLOP/s, near the 788 measured here), and every kernel's
// loads fed by the bulk tensor copy engine (TMA) through a few shared-memory
// stages, so that no kernel is bound by the loads its threads keep in
// flight (Latency 0: the latency bound drops out, bytes and FLOPs remain).
// train gpu-model --sm90a predicts on it.
var H200SM90a = func() Device {
	d := H200
	d.Name = "NVIDIA H200 (model, what-if sm_90a: wgmma at cuBLAS's rate, TMA-fed loads)"
	d.MMARate = d.GemmRate
	d.Latency = 0
	return d
}()

// KernelFacts are what ptxas says of a kernel on sm_90 (gen_sm90.go).
type KernelFacts struct {
	Regs       int // registers a thread
	StaticSmem int // bytes
	HMMA       int // tensor-core instructions in its SASS (mma.sync)
}

// blocksPerSM is how many blocks of threads each, regs registers a thread
// and smem bytes of shared memory one SM of d holds: registers in units of
// 256 a warp, shared memory plus the reserved KiB a block.
func (d Device) blocksPerSM(regs, threads, smem int) int {
	warps := (threads + 31) / 32
	n := min(d.BlocksPerSM, d.ThreadsPerSM/max(threads, 1))
	if perWarp := (regs*32 + 255) / 256 * 256; perWarp > 0 {
		n = min(n, d.RegsPerSM/(perWarp*warps))
	}
	if smem > d.SmemPerBlock {
		return 0
	}
	return min(n, d.SmemPerSM/(smem+d.SmemReserved))
}

// Estimate is one launch's prediction.
type Estimate struct {
	Launch
	Seconds float64
	// Bound names the term that gave Seconds: "flops", "bytes",
	// "latency" (bytes, at the bandwidth the threads in flight allow) or
	// "launch".
	Bound string
	// BlocksPerSM is the kernel's occupancy (0 for GEMMs and copies);
	// Fill the fraction of the device's block slots (or, for a GEMM, of
	// its SMs) the grid keeps busy, waves counted whole.
	BlocksPerSM int
	Fill        float64
}

// waveFill is the fraction of slots a grid of n blocks keeps busy, its
// waves counted whole (a grid of fewer blocks than slots: n/slots).
func waveFill(n, slots int) float64 {
	if n <= 0 || slots <= 0 {
		return 0
	}
	waves := (n + slots - 1) / slots
	return float64(n) / float64(waves*slots)
}

// gemmFill is a GEMM's wave fill on d: its output tiles over d's SMs.
func (d Device) gemmFill(m, n int) float64 {
	tiles := ((m + d.GemmTile[0] - 1) / d.GemmTile[0]) * ((n + d.GemmTile[1] - 1) / d.GemmTile[1])
	return waveFill(tiles, d.SMs)
}

// Predict returns l's predicted time on d; facts are the kernels' sm_90
// facts (nil: gen_sm90.go's).
func (d Device) Predict(l Launch, facts map[string]KernelFacts) Estimate {
	if facts == nil {
		facts = sm90Facts
	}
	e := Estimate{Launch: l}
	bytes := float64(l.Read + l.Write)
	tBytes := bytes / d.CopyBW
	var tFlops, tLatency float64
	switch l.Kind {
	case KindGEMM:
		e.Fill = 1
		if g := l.GEMM; g != nil {
			e.Fill = d.gemmFill(g.M, g.N)
		}
		full := d.GemmRate / d.gemmFill(d.GemmSize, d.GemmSize) // the rate of full waves
		tFlops = float64(l.FLOPs) / (full * e.Fill)
	case KindCopy:
		e.Fill = 1
	default:
		f := facts[l.Kernel]
		threads := max(l.Block, 1)
		e.BlocksPerSM = max(1, d.blocksPerSM(f.Regs, threads, f.StaticSmem+l.Smem))
		slots := d.SMs * e.BlocksPerSM
		blocks := l.Blocks()
		// The compute units: a grid below one block an SM uses that
		// fraction of the SMs; above, its waves over the slots.
		if blocks < d.SMs {
			e.Fill = float64(blocks) / float64(d.SMs)
		} else {
			e.Fill = waveFill(blocks, slots)
		}
		rate := d.FP32Rate
		if f.HMMA > 0 {
			rate = d.MMARate
		}
		tFlops = float64(l.FLOPs) / (rate * e.Fill)
		// Little's law: the resident threads' loads in flight against the
		// bytes the bandwidth needs.
		resident := float64(min(blocks, slots) * threads)
		inflight := resident * float64(max(l.Inflight, 1))
		if need := d.CopyBW * d.Latency; inflight < need {
			tLatency = bytes / (d.CopyBW * inflight / need)
		}
	}
	e.Seconds, e.Bound = d.LaunchGap, "launch"
	for _, c := range []struct {
		t    float64
		name string
	}{{tFlops, "flops"}, {tBytes, "bytes"}, {tLatency, "latency"}} {
		if c.t > e.Seconds {
			e.Seconds, e.Bound = c.t, c.name
		}
	}
	return e
}

// Prediction is a ledger's estimates with their sums by op.
type Prediction struct {
	Device    Device
	Estimates []Estimate
	Seconds   float64 // all launches, one after another on one stream
	FLOPs     int64   // the launches' own count (recomputation included)
	Bytes     int64
}

// PredictLedger predicts every launch of a ledger on d.
func (d Device) PredictLedger(ledger []Launch, facts map[string]KernelFacts) Prediction {
	p := Prediction{Device: d}
	for _, l := range ledger {
		e := d.Predict(l, facts)
		p.Estimates = append(p.Estimates, e)
		p.Seconds += e.Seconds
		p.FLOPs += l.FLOPs
		p.Bytes += l.Read + l.Write
	}
	return p
}

// OpSum is the launches of one op (or one part) added up.
type OpSum struct {
	Name     string
	Launches int
	Seconds  float64
	FLOPs    int64
	Bytes    int64
	// Bounds counts the seconds by the bound that set them.
	Bounds map[string]float64
}

// Why names the term that bounds most of the op's time.
func (s OpSum) Why() string {
	best, bt := "", -1.0
	for b, t := range s.Bounds {
		if t > bt || (t == bt && b < best) {
			best, bt = b, t
		}
	}
	return best
}

// By sums the estimates by key(estimate), the largest first.
func (p Prediction) By(key func(Estimate) string) []OpSum {
	m := map[string]*OpSum{}
	for _, e := range p.Estimates {
		k := key(e)
		s := m[k]
		if s == nil {
			s = &OpSum{Name: k, Bounds: map[string]float64{}}
			m[k] = s
		}
		s.Launches++
		s.Seconds += e.Seconds
		s.FLOPs += e.FLOPs
		s.Bytes += e.Read + e.Write
		s.Bounds[e.Bound] += e.Seconds
	}
	out := make([]OpSum, 0, len(m))
	for _, s := range m {
		out = append(out, *s)
	}
	sort.Slice(out, func(i, j int) bool {
		if out[i].Seconds != out[j].Seconds {
			return out[i].Seconds > out[j].Seconds
		}
		return out[i].Name < out[j].Name
	})
	return out
}

// Part is the issue table's grouping of an op: the RMSNorm backward, the
// layer GEMMs, our attention, the LM head, the optimizer, and the other
// elementwise ops.
func Part(e Estimate) string {
	switch op := e.Op; {
	case op == "TokenLogprob" || op == "TokenLogprobBackward":
		return "LM head"
	case op == "RMSNormBackward" || strings.HasPrefix(op, "RMSNormBackward"):
		return "RMSNorm backward"
	case e.Kind == KindGEMM:
		return "layer GEMMs (cuBLAS)"
	case strings.Contains(op, "Attention"):
		return "attention (own)"
	case op == "AdamW" || op == "SumSquares" || strings.HasPrefix(op, "AdamW"):
		return "optimizer"
	}
	return "other elementwise"
}

// Table renders the prediction grouped by parts, then by op, then its
// costliest kernels: the table for a step, with the predicted MFU
// of modelFLOPs (the step's model FLOPs, 0: not shown).
func (p Prediction) Table(modelFLOPs float64) string {
	var b strings.Builder
	total := p.Seconds
	pct := func(t float64) float64 { return 100 * t / math.Max(total, 1e-30) }
	fmt.Fprintf(&b, "| part | ms | share | launches | bound by |\n|---|---:|---:|---:|---|\n")
	for _, s := range p.By(Part) {
		fmt.Fprintf(&b, "| %s | %.1f | %.1f%% | %d | %s |\n", s.Name, 1e3*s.Seconds, pct(s.Seconds), s.Launches, s.Why())
	}
	fmt.Fprintf(&b, "| **step** | **%.1f** | 100%% | %d | |\n\n", 1e3*total, len(p.Estimates))
	fmt.Fprintf(&b, "| op | ms | share | launches | GFLOP | GB moved | bound by |\n|---|---:|---:|---:|---:|---:|---|\n")
	for _, s := range p.By(func(e Estimate) string { return e.Op }) {
		fmt.Fprintf(&b, "| %s | %.2f | %.1f%% | %d | %.1f | %.2f | %s |\n", s.Name, 1e3*s.Seconds, pct(s.Seconds), s.Launches,
			float64(s.FLOPs)/1e9, float64(s.Bytes)/1e9, s.Why())
	}
	fmt.Fprintf(&b, "\n| kernel (op) | ms | launches | blocks/SM | fill | bound by |\n|---|---:|---:|---:|---:|---|\n")
	kernels := p.By(func(e Estimate) string {
		k := e.Kernel
		if e.GEMM != nil {
			k = "gemm " + e.GEMM.String()
		}
		return k + " (" + e.Op + ")"
	})
	occ := map[string]Estimate{}
	for _, e := range p.Estimates {
		k := e.Kernel
		if e.GEMM != nil {
			k = "gemm " + e.GEMM.String()
		}
		occ[k+" ("+e.Op+")"] = e
	}
	for i, s := range kernels {
		if i == 20 {
			fmt.Fprintf(&b, "| (%d more) | | | | | |\n", len(kernels)-i)
			break
		}
		e := occ[s.Name]
		fmt.Fprintf(&b, "| %s | %.2f | %d | %d | %.2f | %s |\n", s.Name, 1e3*s.Seconds, s.Launches, e.BlocksPerSM, e.Fill, s.Why())
	}
	fmt.Fprintf(&b, "\npredicted step: %.1f ms on %s; %.1f TFLOP counted in the launches, %.1f GB moved",
		1e3*total, p.Device.Name, float64(p.FLOPs)/1e12, float64(p.Bytes)/1e9)
	if modelFLOPs > 0 {
		fmt.Fprintf(&b, "; model FLOPs %.1f TFLOP: predicted MFU %.1f%% of %.0f TFLOP/s dense bf16",
			modelFLOPs/1e12, p.MFU(modelFLOPs), p.Device.PeakBF16/1e12)
	}
	b.WriteString("\n")
	return b.String()
}

// MFU is the model FLOPs utilisation of the predicted step, in percent.
func (p Prediction) MFU(modelFLOPs float64) float64 {
	if p.Seconds <= 0 {
		return 0
	}
	return 100 * modelFLOPs / p.Seconds / p.Device.PeakBF16
}

// Measured is the launches' measured device time (seconds; a timed
// ledger's, Backend.StartTimedLedger), 0 when the ledger was not timed.
func (p Prediction) Measured() float64 {
	var t float64
	for _, e := range p.Estimates {
		t += e.Measured
	}
	return t
}

// CompareHeader starts Compare's text (gpu-check looks for it).
const CompareHeader = "predicted against measured"

// Compare renders predicted against measured time by part and by op, for a
// timed ledger (a GPU's: that calibrates the model), with both MFUs of
// modelFLOPs (0: not shown). A ratio above 1 is an op slower than
// predicted: the roofline missed a cost (or the op's ledger entry
// understates it); below 1, the model's rates are too low for it.
func (p Prediction) Compare(modelFLOPs float64) string {
	var b strings.Builder
	measured := p.Measured()
	fmt.Fprintf(&b, "%s time per op: one step, %d launches, each timed between device events; predicted on %s\n\n",
		CompareHeader, len(p.Estimates), p.Device.Name)
	ratio := func(m, t float64) string {
		if t <= 0 {
			return "-"
		}
		return fmt.Sprintf("%.2f", m/t)
	}
	sums := func(key func(Estimate) string) ([]OpSum, map[string]float64) {
		meas := map[string]float64{}
		for _, e := range p.Estimates {
			meas[key(e)] += e.Measured
		}
		return p.By(key), meas
	}
	parts, pm := sums(Part)
	fmt.Fprintf(&b, "| part | launches | predicted ms | measured ms | measured/predicted |\n|---|---:|---:|---:|---:|\n")
	for _, s := range parts {
		fmt.Fprintf(&b, "| %s | %d | %.2f | %.2f | %s |\n", s.Name, s.Launches, 1e3*s.Seconds, 1e3*pm[s.Name], ratio(pm[s.Name], s.Seconds))
	}
	fmt.Fprintf(&b, "| **step** | %d | %.2f | %.2f | %s |\n\n", len(p.Estimates), 1e3*p.Seconds, 1e3*measured, ratio(measured, p.Seconds))
	ops, om := sums(func(e Estimate) string { return e.Op })
	sort.SliceStable(ops, func(i, j int) bool { return om[ops[i].Name] > om[ops[j].Name] })
	fmt.Fprintf(&b, "| op (by measured time) | launches | predicted ms | measured ms | measured/predicted | bound by (predicted) |\n|---|---:|---:|---:|---:|---|\n")
	for _, s := range ops {
		fmt.Fprintf(&b, "| %s | %d | %.2f | %.2f | %s | %s |\n", s.Name, s.Launches, 1e3*s.Seconds, 1e3*om[s.Name], ratio(om[s.Name], s.Seconds), s.Why())
	}
	fmt.Fprintf(&b, "\npredicted step %.1f ms, measured %.1f ms (%s × the prediction)", 1e3*p.Seconds, 1e3*measured, ratio(measured, p.Seconds))
	if modelFLOPs > 0 && measured > 0 {
		fmt.Fprintf(&b, "; MFU predicted %.1f%%, measured %.1f%% of %.0f TFLOP/s dense bf16", p.MFU(modelFLOPs),
			100*modelFLOPs/measured/p.Device.PeakBF16, p.Device.PeakBF16/1e12)
	}
	b.WriteString("\n")
	return b.String()
}
