//go:build cgo

package cuda

import (
	"math"
	"testing"
)

func near(a, b float64) bool { return math.Abs(a-b) <= 1e-12*math.Max(math.Abs(a), math.Abs(b)) }

// TestRoofline checks each bound of the model on launches whose time
// follows from the device's figures alone.
func TestRoofline(t *testing.T) {
	d := H200
	n := int64(d.GemmSize)
	// The measured GEMM runs at the measured rate.
	e := d.Predict(Launch{Kind: KindGEMM, Op: "Matmul", FLOPs: 2 * n * n * n, Read: 4 * n * n, Write: 2 * n * n,
		GEMM: &GemmCall{M: d.GemmSize, N: d.GemmSize, K: d.GemmSize}}, nil)
	if want := float64(2*n*n*n) / d.GemmRate; !near(e.Seconds, want) || e.Bound != "flops" {
		t.Errorf("GEMM %d³: %v s (%s), want %v s (flops)", n, e.Seconds, e.Bound, want)
	}
	// A GEMM of one output tile uses one SM of 132.
	e = d.Predict(Launch{Kind: KindGEMM, FLOPs: 2 * 128 * 256 * 65536, GEMM: &GemmCall{M: 128, N: 256, K: 65536}}, nil)
	if e.Fill != 1.0/132 {
		t.Errorf("one-tile GEMM fill %v, want 1/132", e.Fill)
	}
	// A copy at the copy bandwidth.
	e = d.Predict(Launch{Kind: KindCopy, Read: 1 << 30, Write: 1 << 30}, nil)
	if want := float64(2<<30) / d.CopyBW; !near(e.Seconds, want) || e.Bound != "bytes" {
		t.Errorf("copy: %v s (%s), want %v", e.Seconds, e.Bound, want)
	}
	// 128 blocks of one warp, 8 bytes in flight a thread: latency-bound,
	// at the bandwidth their 32 KiB in flight draw.
	facts := map[string]KernelFacts{"k": {Regs: 32}}
	e = d.Predict(Launch{Kind: KindSIMT, Kernel: "k", Grid: [3]int{128, 1, 1}, Block: 32, Read: 1 << 30, Inflight: 8}, facts)
	if want := float64(1<<30) * d.Latency / (128 * 32 * 8); !near(e.Seconds, want) || e.Bound != "latency" {
		t.Errorf("128 one-warp blocks: %v s (%s), want %v (latency)", e.Seconds, e.Bound, want)
	}
	// A full grid with enough loads in flight runs at the copy bandwidth.
	e = d.Predict(Launch{Kind: KindSIMT, Kernel: "k", Grid: [3]int{132 * 64, 1, 1}, Block: 256, Read: 1 << 30, Inflight: 32}, facts)
	if want := float64(1<<30) / d.CopyBW; !near(e.Seconds, want) || e.Bound != "bytes" {
		t.Errorf("full grid: %v s (%s), want %v (bytes)", e.Seconds, e.Bound, want)
	}
	// A tiny launch costs the gap.
	if e = d.Predict(Launch{Kind: KindSIMT, Kernel: "k", Grid: [3]int{1, 1, 1}, Block: 32, Read: 4}, facts); e.Seconds != d.LaunchGap {
		t.Errorf("tiny launch: %v s, want the gap %v", e.Seconds, d.LaunchGap)
	}
	// An mma.sync kernel computes at the HMMA rate over its grid's waves.
	facts["mma"] = KernelFacts{Regs: 128, HMMA: 64}
	e = d.Predict(Launch{Kind: KindSIMT, Kernel: "mma", Grid: [3]int{132 * 4, 1, 1}, Block: 128, FLOPs: 1e12}, facts)
	if want := 1e12 / d.MMARate; e.BlocksPerSM != 4 || !near(e.Seconds, want) {
		t.Errorf("mma kernel: %d blocks/SM, %v s; want 4, %v", e.BlocksPerSM, e.Seconds, want)
	}
}

// TestRooflineOccupancy: the roofline's blocks per SM agree with
// TestSASS's for sm_90 (two implementations of the same rule).
func TestRooflineOccupancy(t *testing.T) {
	sm90 := smArchs[1]
	for _, regs := range []int{16, 32, 40, 64, 96, 128, 168, 200, 255} {
		for _, threads := range []int{32, 64, 128, 256, 512, 1024} {
			for _, smem := range []int{0, 1 << 10, 27 << 10, 52224, 100 << 10, 227 << 10} {
				if got, want := H200.blocksPerSM(regs, threads, smem), sm90.blocksPerSM(regs, threads, smem); got != want {
					t.Errorf("regs %d threads %d smem %d: roofline %d, TestSASS %d blocks/SM", regs, threads, smem, got, want)
				}
			}
		}
	}
}
