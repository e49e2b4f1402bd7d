//go:build cgo

package cuda_test

import (
	"testing"

	"github.com/tracegrpo/tracegrpo/kernels/cpu"
	"github.com/tracegrpo/tracegrpo/kernels/cuda"
)

// nemotronStepModels are the tiny Nemotron-H models (model/testdata, with
// their PyTorch goldens' weights) a step runs on: every block kind
// (nh_blocks: M, *, -, E), n_groups > 1 with group-limited routing and the
// time-step clamp (nh_groups), Super's latent MoE (nh_latent).
var nemotronStepModels = []string{"nh_blocks", "nh_groups", "nh_latent"}

// TestTinyStepNemotronHEmu: one training step of each tiny Nemotron-H
// model through the whole CUDA backend on the emulator (its Mamba-2 mixers
// on kernels/cuda's conv, scan and gated norm, its MLPs and experts on
// squared ReLU, its routers sigmoid with the selection bias) equals the
// CPU backend's step within the tolerances of the other models' (the
// sparse ones: every model here has MoE blocks).
func TestTinyStepNemotronHEmu(t *testing.T) {
	ref := cpu.New(2)
	defer ref.Close()
	emu := cuda.EmuBackend(t, cuda.Options{})
	for _, v := range nemotronStepModels {
		t.Run(v, func(t *testing.T) {
			compareSteps(t, tinyStep(t, ref, v, false), tinyStep(t, emu, v, false), true)
		})
	}
}

// TestTinyStepNemotronHGPU: the same on CUDA device 0 (skips without one,
// unless TRACEGRPO_REQUIRE_GPU=1).
func TestTinyStepNemotronHGPU(t *testing.T) {
	be := gpuBackend(t)
	ref := cpu.New(2)
	defer ref.Close()
	for _, v := range nemotronStepModels {
		t.Run(v, func(t *testing.T) {
			compareSteps(t, tinyStep(t, ref, v, false), tinyStep(t, be, v, false), true)
		})
	}
}
