package main

import (
	"bytes"
	"encoding/json"
	"errors"
	"fmt"
	"os"
	"path/filepath"
	"slices"
	"sort"
	"strings"
	"testing"

	"github.com/tracegrpo/tracegrpo/checkpoint"
	"github.com/tracegrpo/tracegrpo/gym"
	"github.com/tracegrpo/tracegrpo/internal/safetensors"
)

// biasGolden is the part of trainer/testdata/bias_grpo/<variant>/golden.json
// (scripts/golden_bias_grpo.py) these tests read.
type biasGolden struct {
	Sets  map[string]any `json:"sets"`
	Steps []struct {
		Rollouts []struct {
			Task  int `json:"task"`
			Index int `json:"index"`
			Calls []struct {
				Prompt     []int32   `json:"prompt"`
				Generation []int32   `json:"generation"`
				GenLP      []float64 `json:"generation_logprobs"`
			} `json:"calls"`
			Reward float64 `json:"reward"`
		} `json:"rollouts"`
	} `json:"steps"`
}

// biasGoldenRun writes the golden in dir's rollouts as NeMo Gym records and
// captures under tmp and returns the train arguments of its two steps
// (without --out).
func biasGoldenRun(t *testing.T, dir, tmp string) []string {
	t.Helper()
	raw, err := os.ReadFile(filepath.Join(dir, "golden.json"))
	if err != nil {
		t.Fatalf("%v (regenerate with /usr/bin/python3 scripts/golden_bias_grpo.py)", err)
	}
	var g biasGolden
	if err := json.Unmarshal(raw, &g); err != nil {
		t.Fatal(err)
	}
	caps, steps := filepath.Join(tmp, "captures"), filepath.Join(tmp, "steps")
	if err := os.MkdirAll(steps, 0o755); err != nil {
		t.Fatal(err)
	}
	w, err := gym.NewWriter(caps)
	if err != nil {
		t.Fatal(err)
	}
	w.SetFsync(false)
	for s, st := range g.Steps {
		var recs bytes.Buffer
		for _, r := range st.Rollouts {
			rid := fmt.Sprintf("bias-%d-%d-%d", s+1, r.Task, r.Index)
			for c, call := range r.Calls {
				parent := ""
				if c > 0 {
					parent = fmt.Sprintf("c%d", c)
				}
				if err := w.Put(gym.NewCallEntry(rid, fmt.Sprintf("c%d", c+1), "m", call.Prompt, call.Generation, call.GenLP, parent, "")); err != nil {
					t.Fatal(err)
				}
			}
			if err := w.Freeze(rid); err != nil && !errors.Is(err, gym.ErrFrozen) {
				t.Fatal(err)
			}
			fmt.Fprintf(&recs, `{"_ng_task_index": %d, "_ng_rollout_index": %d, "_ng_rollout_id": %q, "reward": %v, "response": {"id": "r"}}`+"\n",
				r.Task, r.Index, rid, r.Reward)
		}
		if err := os.WriteFile(filepath.Join(steps, fmt.Sprintf("step_%d.jsonl", s+1)), recs.Bytes(), 0o644); err != nil {
			t.Fatal(err)
		}
	}
	args := []string{"--steps", "2", "--quiet", "--backend", "cpu", "--rollouts", steps, "--captures", caps, "--init-from", dir,
		"--set", "checkpointing.save_period=1"}
	keys := make([]string, 0, len(g.Sets))
	for k := range g.Sets {
		keys = append(keys, k)
	}
	sort.Strings(keys)
	for _, k := range keys {
		args = append(args, "--set", fmt.Sprintf("%s=%v", k, g.Sets[k]))
	}
	return args
}

// TestMpirunShardedExpertBias: the expert-bias golden's two steps (a tiny
// Super-shaped Nemotron-H whose routers' selection biases move by the step's
// expert load, the MTP block's too; and a Nano-shaped one packed as token
// tries) on mpirun -np 2 with --shard full end each step with one
// process's selection biases bit for bit, and its other weights within
// distTol: every rank's load is in the one update.
func TestMpirunShardedExpertBias(t *testing.T) {
	for _, v := range []string{"mtp", "nano"} {
		t.Run(v, func(t *testing.T) {
			dir := filepath.Join("..", "..", "trainer", "testdata", "bias_grpo", v)
			tmp := t.TempDir()
			args := biasGoldenRun(t, dir, tmp)
			one, two := filepath.Join(tmp, "one"), filepath.Join(tmp, "two")
			mustTrain(t, append([]string{"--out", one}, args...)...)
			mustMpirun(t, 2, append([]string{"--out", two, "--shard", "full", "--set", "cluster.num_nodes=1", "--set", "cluster.gpus_per_node=2"}, args...)...)
			init := hfTensors(t, filepath.Join(dir, "model.safetensors"))
			for s := 1; s <= 2; s++ {
				a, b := ckptWeights(t, one, s), shardedWeights(t, two, s, init)
				biases := 0
				for name, x := range a {
					if !strings.HasSuffix(name, "e_score_correction_bias") {
						continue
					}
					biases++
					if !slices.Equal(x, b[name]) {
						t.Errorf("step %d: %s on 2 sharded ranks %v, one process %v", s, name, b[name], x)
					}
					if slices.Equal(x, init[name]) {
						t.Errorf("step %d: %s did not move", s, name)
					}
				}
				if biases == 0 {
					t.Fatal("no selection bias in the checkpoint")
				}
				if d, where := maxDiff(a, b); d > distTol {
					t.Errorf("step %d: weights on 2 sharded ranks differ from one process by %.3g at %s", s, d, where)
				}
			}
		})
	}
}

// hfTensors reads every tensor of a safetensors file in fp32.
func hfTensors(t *testing.T, path string) map[string][]float32 {
	t.Helper()
	f, err := safetensors.Open(path)
	if err != nil {
		t.Fatal(err)
	}
	defer f.Close()
	out := map[string][]float32{}
	for _, ti := range f.Tensors() {
		x := make([]float32, ti.NumElements())
		if err := f.ReadF32(ti.Name, x); err != nil {
			t.Fatal(err)
		}
		out[ti.Name] = x
	}
	return out
}

// shardedWeights reads step's weights of a sharded run's checkpoint, the
// tensors named in like.
func shardedWeights(t *testing.T, out string, step int, like map[string][]float32) map[string][]float32 {
	t.Helper()
	tens, err := checkpoint.OpenTensors(filepath.Join(out, "checkpoints", checkpoint.StepDir(int64(step))))
	if err != nil {
		t.Fatal(err)
	}
	defer tens.Close()
	w := map[string][]float32{}
	for name, x := range like {
		v := make([]float32, len(x))
		if err := tens.Read(name, checkpoint.KindWeights, 0, v); err != nil {
			t.Fatal(err)
		}
		w[name] = v
	}
	return w
}
