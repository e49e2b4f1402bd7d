//go:build cgo

package cuda_test

import (
	"testing"

	"github.com/tracegrpo/tracegrpo/kernels/cuda"
	"github.com/tracegrpo/tracegrpo/trainer"
)

// TestTrainPlanEqualsAllocatedEmu: the memory plan of a train run on the
// CUDA backend equals, byte for byte, the most device memory the backend
// held through the run (the emulator counts every allocation the backend
// makes, its ops' scratch included): the built-in job with and without
// activation checkpointing and with a KL reference policy.
func TestTrainPlanEqualsAllocatedEmu(t *testing.T) {
	for _, c := range []struct {
		name string
		sets []string
	}{
		{"builtin", nil},
		{"checkpointing_kl", []string{"policy.megatron_cfg.activation_checkpointing=true", "loss_fn.reference_policy_kl_penalty=0.01"}},
		// Mixed precision: the bf16 paths' scratch (the LM head's bf16 dz
		// inside the logits chunk) must be in the plan too.
		{"bf16", []string{"policy.precision=bfloat16"}},
	} {
		t.Run(c.name, func(t *testing.T) {
			be := cuda.EmuBackend(t, cuda.Options{})
			// A small step (4 rollouts) keeps the emulator quick.
			sets := append([]string{"grpo.num_prompts_per_step=2", "grpo.num_generations_per_prompt=2"}, c.sets...)
			tr, err := trainer.New(trainer.Options{Backend: be, Out: t.TempDir(), Steps: 1, Quiet: true, Sets: sets})
			if err != nil {
				t.Fatal(err)
			}
			defer tr.Close()
			if err := tr.Run(); err != nil {
				t.Fatal(err)
			}
			plan, err := tr.Plan()
			if err != nil {
				t.Fatal(err)
			}
			live, peak := be.Allocated()
			if peak != plan.TotalBytes || live != plan.TotalBytes {
				t.Errorf("plan %d bytes, the backend held %d at most and %d at the end", plan.TotalBytes, peak, live)
				for _, p := range plan.Components {
					t.Logf("  %-18s %d", p.Name, p.Bytes)
				}
			}
		})
	}
}
