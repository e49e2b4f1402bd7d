//go:build cgo

package cuda_test

import (
	"os"
	"testing"

	"github.com/tracegrpo/tracegrpo/kernels"
	"github.com/tracegrpo/tracegrpo/kernels/cuda"
	"github.com/tracegrpo/tracegrpo/model"
	"github.com/tracegrpo/tracegrpo/trainer"
)

// TestTrainPlanEqualsAllocatedEmu: the memory plan of a train run on the
// CUDA backend equals, byte for byte, the most device memory the backend
// held through the run (the emulator counts every allocation the backend
// makes, its ops' scratch included): the built-in job with and without
// activation checkpointing and with a KL reference policy.
func TestTrainPlanEqualsAllocatedEmu(t *testing.T) {
	trainPlanEqualsAllocated(t, func(t *testing.T) *cuda.Backend { return cuda.EmuBackend(t, cuda.Options{}) })
}

// TestTrainPlanEqualsAllocatedGPU: the same on CUDA device 0 (the device
// memory cuBLAS and the driver keep for themselves is not the backend's).
func TestTrainPlanEqualsAllocatedGPU(t *testing.T) {
	trainPlanEqualsAllocated(t, gpuBackend)
}

// gpuBackend opens CUDA device 0, or skips (fails under
// TRACEGRPO_REQUIRE_GPU=1).
func gpuBackend(t *testing.T) *cuda.Backend {
	be, err := cuda.OpenBackend(cuda.Options{})
	if err != nil {
		if os.Getenv("TRACEGRPO_REQUIRE_GPU") == "1" {
			t.Fatalf("no CUDA device: %v", err)
		}
		t.Skipf("no CUDA device: %v", err)
	}
	t.Cleanup(func() { be.Close() })
	return be
}

func trainPlanEqualsAllocated(t *testing.T, open func(*testing.T) *cuda.Backend) {
	for _, c := range []struct {
		name string
		sets []string
		wrap bool // behind a wrapper (a profiler's) that only Unwraps
	}{
		{"builtin", nil, false},
		// The plan and the up-front reservation reach through a wrapper
		// (they planned no scratch for a wrapped backend and reserved none).
		{"wrapped", nil, true},
		{"checkpointing_kl", []string{"policy.megatron_cfg.activation_checkpointing=true", "loss_fn.reference_policy_kl_penalty=0.01"}, false},
		// Mixed precision: the bf16 paths' scratch (the LM head's bf16 dz
		// inside the logits chunk) must be in the plan too.
		{"bf16", []string{"policy.precision=bfloat16"}, false},
		// Fully sharded on one rank: the shard arenas, the gathered and
		// gradient slots, the sampler's whole copy.
		{"sharded", nil, false},
	} {
		t.Run(c.name, func(t *testing.T) {
			be := open(t)
			// A small step (4 rollouts) keeps the emulator quick.
			sets := append([]string{"grpo.num_prompts_per_step=2", "grpo.num_generations_per_prompt=2"}, c.sets...)
			var run kernels.Backend = be
			if c.wrap {
				run = unwrapOnly{be}
			}
			o := trainer.Options{Backend: run, Out: t.TempDir(), Steps: 1, Quiet: true, Sets: sets}
			if c.name == "sharded" {
				o.Shard = trainer.ShardFull
			}
			tr, err := trainer.New(o)
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

// TestSparsePlanEqualsAllocatedEmu: a sparse model's memory plan (its
// arenas, and the backend's scratch for its workload: ExpertRoute's
// counts among them) equals what the backend holds after a training step,
// byte for byte, fp32 and bf16. (The trainer's plan is the sum of these
// parts: TestTrainPlanEqualsAllocatedEmu; one built-in job step of a
// sparse model on the emulator takes minutes.)
func TestSparsePlanEqualsAllocatedEmu(t *testing.T) {
	cfg, err := model.LoadConfig("../../model/testdata/moe_k8_step2/config.json")
	if err != nil {
		t.Fatal(err)
	}
	for _, prec := range []kernels.DType{kernels.F32, kernels.BF16} {
		t.Run(prec.String(), func(t *testing.T) {
			be := cuda.EmuBackend(t, cuda.Options{})
			opt := model.Options{MaxTokens: 40, MaxSeqs: 8, Precision: prec}
			fp, err := model.PlanModel(cfg, opt)
			if err != nil {
				t.Fatal(err)
			}
			work, err := model.PlanWorkload(cfg, opt)
			if err != nil {
				t.Fatal(err)
			}
			want := fp.Total() + be.PlanWorkspace(work)
			live0, _ := be.Allocated()
			m, err := model.New(be, cfg, opt)
			if err != nil {
				t.Fatal(err)
			}
			defer m.Close()
			if err := be.ReserveWorkspace(work); err != nil {
				t.Fatal(err)
			}
			m.InitRandom(3)
			tokens := []int32{5, 9, 100, 7, 3, 3, 60, 127, 1, 2, 8, 40}
			if _, _, err := m.Forward(tokens, []int32{0, 5, 12}, 1); err != nil {
				t.Fatal(err)
			}
			m.SetRouterLossWeight(0.01)
			if err := m.Backward(make([]float32, len(tokens))); err != nil {
				t.Fatal(err)
			}
			live, peak := be.Allocated()
			// live0 is the backend's own fixed buffers, which PlanWorkspace counts.
			if got := peak; got != want || live != peak || live0 == 0 {
				t.Errorf("plan %d bytes (model %d + workspace %d), the backend held %d at most, %d at the end (%d before)",
					want, fp.Total(), be.PlanWorkspace(work), peak, live, live0)
			}
		})
	}
}

// unwrapOnly hides every optional interface of the backend it wraps but
// Unwrap, as a profiling wrapper does.
type unwrapOnly struct{ kernels.Backend }

func (u unwrapOnly) Unwrap() kernels.Backend { return u.Backend }

// TestHybridPlanEqualsAllocatedEmu: a tiny Nemotron-H model's memory plan
// (its arenas, and the backend's scratch for its workload: the Mamba
// scan's states, checkpoints and dB/dC partials, the conv's and the gated
// norm's partials, the expert counts) equals what the backend holds after
// a training step, byte for byte: fp32 and bf16, a micro-batch of more
// sequences than one scan runs (the scans in pieces).
func TestHybridPlanEqualsAllocatedEmu(t *testing.T) {
	cfg, err := model.LoadConfig("../../model/testdata/nh_blocks/config.json")
	if err != nil {
		t.Fatal(err)
	}
	lens := []int{3, 1, 5, 2, 4, 6, 2, 3, 1, 7, 2, 2, 5, 3, 4, 1, 2, 6, 3, 2} // 20 sequences
	cu := []int32{0}
	for _, n := range lens {
		cu = append(cu, cu[len(cu)-1]+int32(n))
	}
	T := int(cu[len(cu)-1])
	tokens := make([]int32, T)
	for i := range tokens {
		tokens[i] = int32((i*29 + 3) % cfg.VocabSize)
	}
	for _, prec := range []kernels.DType{kernels.F32, kernels.BF16} {
		t.Run(prec.String(), func(t *testing.T) {
			be := cuda.EmuBackend(t, cuda.Options{})
			opt := model.Options{MaxTokens: T, MaxSeqs: len(lens), MaxSeqLen: 8, Precision: prec, Recompute: true}
			fp, err := model.PlanModel(cfg, opt)
			if err != nil {
				t.Fatal(err)
			}
			work, err := model.PlanWorkload(cfg, opt)
			if err != nil {
				t.Fatal(err)
			}
			if len(work.Scans) != 1 {
				t.Fatalf("the plan lists %d scans, want the Mamba blocks' one", len(work.Scans))
			}
			want := fp.Total() + be.PlanWorkspace(work)
			live0, _ := be.Allocated()
			m, err := model.New(be, cfg, opt)
			if err != nil {
				t.Fatal(err)
			}
			defer m.Close()
			if err := be.ReserveWorkspace(work); err != nil {
				t.Fatal(err)
			}
			m.InitRandom(3)
			if _, _, err := m.Forward(tokens, cu, 1); err != nil {
				t.Fatal(err)
			}
			if err := m.Backward(make([]float32, len(tokens))); err != nil {
				t.Fatal(err)
			}
			if err := be.Sync(); err != nil {
				t.Fatal(err)
			}
			live, peak := be.Allocated()
			if peak != want || live != peak || live0 == 0 {
				t.Errorf("plan %d bytes (model %d + workspace %d), the backend held %d at most, %d at the end (%d before)",
					want, fp.Total(), be.PlanWorkspace(work), peak, live, live0)
			}
		})
	}
}
