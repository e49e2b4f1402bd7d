package cpu

import (
	"bytes"
	"os"
	"testing"

	"github.com/tracegrpo/tracegrpo/kernels/cpu/internal/asmgen"
)

// TestGeneratedAsmFresh: the committed assembly is what the generator writes
// (regenerate with `go generate ./kernels/cpu`).
func TestGeneratedAsmFresh(t *testing.T) {
	got, err := os.ReadFile("gen_kernels_amd64.s")
	if err != nil {
		t.Fatal(err)
	}
	if !bytes.Equal(got, asmgen.Generate()) {
		t.Error("gen_kernels_amd64.s is stale: run `go generate ./kernels/cpu`")
	}
}

// TestPeakChainsMatchGenerator: MeasurePeak counts the FLOPs of the loops
// the generator wrote.
func TestPeakChainsMatchGenerator(t *testing.T) {
	if peakChainsAVX512 != asmgen.PeakChainsAVX512 || peakChainsAVX2 != asmgen.PeakChainsAVX2 {
		t.Errorf("peak chains %d/%d, the generator writes %d/%d", peakChainsAVX512, peakChainsAVX2, asmgen.PeakChainsAVX512, asmgen.PeakChainsAVX2)
	}
}
