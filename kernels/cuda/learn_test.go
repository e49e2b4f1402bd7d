//go:build cgo

package cuda_test

import (
	"math"
	"os"
	"path/filepath"
	"testing"

	"github.com/tracegrpo/tracegrpo/kernels/cuda"
	"github.com/tracegrpo/tracegrpo/trainer"
)

// longEnv runs the tests that take many minutes on the emulator.
const longEnv = "TRACEGRPO_LONG"

// The learning guards of trainer's TestBuiltinJobLearnsInBF16
// (trainer/train_test.go: learnGainMin, bf16GainSpread).
const (
	learnGainMin   = 0.08
	bf16GainSpread = 0.135
)

// TestBuiltinJobLearnsBF16Emu: 50 steps of the built-in job in bf16 mixed
// precision on the emulated CUDA backend learn as fp32 does there. About 15
// s a step on 2 cores, so it runs only with TRACEGRPO_LONG=1; the trainer's
// test runs the same on the CPU's bf16 reference kernels in every CI run.
func TestBuiltinJobLearnsBF16Emu(t *testing.T) {
	if os.Getenv(longEnv) != "1" {
		t.Skipf("takes about half an hour on the emulator: set %s=1", longEnv)
	}
	builtinJobLearnsBF16(t, func(t *testing.T) *cuda.Backend { return cuda.EmuBackend(t, cuda.Options{}) })
}

// TestBuiltinJobLearnsBF16GPU: the same on CUDA device 0; with
// TRACEGRPO_LONG=1 (scripts/gpu-check.sh's budget leaves it out by default).
func TestBuiltinJobLearnsBF16GPU(t *testing.T) {
	if os.Getenv(longEnv) != "1" {
		t.Skipf("set %s=1 to run it", longEnv)
	}
	builtinJobLearnsBF16(t, gpuBackend)
}

func builtinJobLearnsBF16(t *testing.T, open func(*testing.T) *cuda.Backend) {
	gains := map[string]float64{}
	for _, prec := range []string{"float32", "bfloat16"} {
		be := open(t)
		out := t.TempDir()
		tr, err := trainer.New(trainer.Options{Backend: be, Out: out, Steps: 50, Quiet: true, Sets: []string{
			"policy.precision=" + prec, "policy.megatron_cfg.optimizer.lr=3e-3", "checkpointing.enabled=false"}})
		if err != nil {
			t.Fatal(err)
		}
		if err := tr.Run(); err != nil {
			t.Fatal(err)
		}
		tr.Close()
		ms, _, err := trainer.ReadMetrics(filepath.Join(out, "metrics.jsonl"))
		if err != nil {
			t.Fatal(err)
		}
		_, first, last := trainer.RewardEnds(ms)
		gains[prec] = last - first
		t.Logf("%s: mean reward of the first 10 steps %.3f, of the last 10 %.3f (gain %.3f)", prec, first, last, last-first)
	}
	if g := gains["bfloat16"]; g < learnGainMin || math.Abs(g-gains["float32"]) > bf16GainSpread {
		t.Errorf("bf16 gain %.3f, fp32 gain %.3f: want ≥ %.2f and within %.3f of fp32's", g, gains["float32"], learnGainMin, bf16GainSpread)
	}
}
