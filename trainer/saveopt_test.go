package trainer

import (
	"os"
	"path/filepath"
	"strings"
	"testing"

	"github.com/tracegrpo/tracegrpo/checkpoint"
	"github.com/tracegrpo/tracegrpo/internal/safetensors"
)

func dirBytes(t *testing.T, dir string) int64 {
	t.Helper()
	var n int64
	ents, err := os.ReadDir(dir)
	if err != nil {
		t.Fatal(err)
	}
	for _, e := range ents {
		st, err := e.Info()
		if err != nil {
			t.Fatal(err)
		}
		n += st.Size()
	}
	return n
}

// TestSaveOptimizerFalse: checkpointing.save_optimizer false writes
// checkpoints without Adam moments (about a third of a full one, the
// weights and state alone), unsharded and sharded alike, and a resume
// from one continues with a fresh AdamW, saying so.
func TestSaveOptimizerFalse(t *testing.T) {
	noOpt := []string{"--set", "checkpointing.save_optimizer=false", "--set", "checkpointing.save_period=1", "--set", "policy.megatron_cfg.scheduler.lr_decay_iters=3"}
	full, lean := t.TempDir(), t.TempDir()
	mustTrain(t, trainArgs(full, 2, "--set", "checkpointing.save_period=1")...)
	mustTrain(t, trainArgs(lean, 2, noOpt...)...)
	fd, ld := filepath.Join(full, "checkpoints", "step_2"), filepath.Join(lean, "checkpoints", "step_2")
	if _, err := os.Stat(filepath.Join(ld, checkpoint.OptimizerFile)); !os.IsNotExist(err) {
		t.Errorf("save_optimizer=false wrote %s (%v)", checkpoint.OptimizerFile, err)
	}
	if _, err := checkpoint.Verify(ld); err != nil {
		t.Fatal(err)
	}
	fb, lb := dirBytes(t, fd), dirBytes(t, ld)
	if 3*lb > fb+fb/10 {
		t.Errorf("a weights-only checkpoint takes %d bytes, a full one %d: want about a third", lb, fb)
	}
	t.Logf("checkpoint of the built-in model: %d bytes with Adam moments, %d without", fb, lb)
	log := mustTrain(t, trainArgs(lean, 3, append(noOpt, "--resume")...)...)
	if !strings.Contains(log, "holds no optimizer state (checkpointing.save_optimizer was false): AdamW restarts from zero moments") {
		t.Errorf("the resume did not say the optimizer restarts:\n%s", log)
	}
	if ms := metricsNoTimes(t, lean); len(ms) != 3 {
		t.Errorf("%d steps after the resume, want 3", len(ms))
	}

	t.Run("sharded", func(t *testing.T) {
		out := t.TempDir()
		mustRanks(t, 2, trainArgs(out, 2, append(noOpt, "--shard", "full")...)...)
		f, err := safetensors.Open(filepath.Join(out, "checkpoints", "step_2", checkpoint.ShardFile(1, 2)))
		if err != nil {
			t.Fatal(err)
		}
		for _, ti := range f.Tensors() {
			if strings.HasSuffix(ti.Name, ".exp_avg") || strings.HasSuffix(ti.Name, ".exp_avg_sq") {
				t.Errorf("a weights-only shard holds %s", ti.Name)
			}
		}
		f.Close()
		if _, err := checkpoint.Verify(filepath.Join(out, "checkpoints", "step_2")); err != nil {
			t.Fatal(err)
		}
		mustRanks(t, 2, trainArgs(out, 3, append(noOpt, "--shard", "full", "--resume")...)...)
		if ms := metricsNoTimes(t, out); len(ms) != 3 {
			t.Errorf("%d steps after the sharded resume, want 3", len(ms))
		}
	})
}
