//go:build cgo

package cuda

import (
	"os"
	"testing"

	"github.com/tracegrpo/tracegrpo/kernels"
	"github.com/tracegrpo/tracegrpo/kernels/kerneltest"
)

// TestConformanceEmu runs the conformance suite on the CPU emulator of the
// driver and cuBLAS: the real backend and the real kernel sources, compiled
// for the CPU. LogitsScratch is small so TokenLogprob works in several
// vocabulary chunks, DecodeSplit so AttentionDecode combines several splits.
func TestConformanceEmu(t *testing.T) {
	b := emuBackend(t, Options{LogitsScratch: 37 * 64, DecodeSplit: 32})
	kerneltest.RunOptions(t, func() kernels.Backend { return noClose{b} }, kerneltest.Options{Reduced: true})
}

// noClose keeps kerneltest from closing a backend emuBackend closes.
type noClose struct{ *Backend }

func (noClose) Close() error { return nil }

// TestConformanceGPU runs the conformance suite on CUDA device 0 against the
// CPU, every shape (with TRACEGRPO_CONFORMANCE_REDUCED=1 the emulator's
// reduced set: compute-sanitizer's runs and gpu-check's dry run). It skips
// when no driver or device is present (CI), and fails when
// TRACEGRPO_REQUIRE_GPU=1 (scripts/gpu-check.sh) and none is.
func TestConformanceGPU(t *testing.T) {
	b, err := OpenBackend(Options{Matmul: MatmulFP32, LogitsScratch: 37 * 64, DecodeSplit: 32})
	if err != nil {
		if os.Getenv("TRACEGRPO_REQUIRE_GPU") == "1" {
			t.Fatalf("no CUDA device: %v", err)
		}
		t.Skipf("no CUDA device: %v", err)
	}
	t.Logf("device: %s", b.Info())
	opt := kerneltest.Options{Reduced: os.Getenv("TRACEGRPO_CONFORMANCE_REDUCED") == "1"}
	kerneltest.RunOptions(t, func() kernels.Backend { return b }, opt)
}
