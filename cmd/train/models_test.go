package main

import (
	"bytes"
	"encoding/json"
	"os"
	"path/filepath"
	"slices"
	"strings"
	"testing"

	"github.com/google/go-cmp/cmp"
	"github.com/tracegrpo/tracegrpo/checkpoint"
	"github.com/tracegrpo/tracegrpo/kernels/cpu"
	"github.com/tracegrpo/tracegrpo/model"
)

// roundTripModels are the built-in task's model shape as a Qwen2 (q/k/v
// biases, the sliding-window keys of Qwen2.5's configs) and as a Llama with
// Llama 3.2's RoPE scaling written by transformers v5 (rope_parameters,
// dtype).
var roundTripModels = []struct {
	name, config string
	v5           bool
}{
	{"qwen2", `{
  "architectures": ["Qwen2ForCausalLM"], "model_type": "qwen2",
  "hidden_size": 64, "intermediate_size": 192, "num_hidden_layers": 2, "num_attention_heads": 4, "num_key_value_heads": 2,
  "rms_norm_eps": 1e-06, "rope_theta": 1000000.0, "vocab_size": 32, "max_position_embeddings": 64,
  "tie_word_embeddings": true, "hidden_act": "silu", "bos_token_id": 1, "eos_token_id": 2, "pad_token_id": 0,
  "use_sliding_window": false, "sliding_window": 64, "max_window_layers": 2, "torch_dtype": "float32",
  "transformers_version": "4.43.1"
}`, false},
	{"llama3_v5", `{
  "architectures": ["LlamaForCausalLM"], "model_type": "llama",
  "hidden_size": 64, "intermediate_size": 192, "num_hidden_layers": 2, "num_attention_heads": 4, "num_key_value_heads": 2,
  "head_dim": 16, "rms_norm_eps": 1e-05, "vocab_size": 32, "max_position_embeddings": 256, "tie_word_embeddings": false,
  "hidden_act": "silu", "attention_bias": false, "mlp_bias": false, "bos_token_id": 1, "eos_token_id": 2, "pad_token_id": 0,
  "rope_parameters": {"factor": 32.0, "high_freq_factor": 4.0, "low_freq_factor": 1.0,
    "original_max_position_embeddings": 32, "rope_theta": 500000.0, "rope_type": "llama3"},
  "dtype": "float32", "transformers_version": "5.7.0"
}`, true},
}

// TestInitFromCheckpointRoundTrip: --init-from a Qwen2 or a scaled-RoPE
// model, train one step, and --init-from the checkpoint: its config.json
// states the same model (RoPE in the form read, the biases' architecture,
// every other key), the biases were trained and saved under their HF names,
// a run starts from it, and train score of it gives exactly what the
// trained weights give.
func TestInitFromCheckpointRoundTrip(t *testing.T) {
	for _, c := range roundTripModels {
		t.Run(c.name, func(t *testing.T) {
			dir := t.TempDir()
			init := filepath.Join(dir, "init")
			cfg, err := model.ParseConfig([]byte(c.config), "init/config.json")
			if err != nil {
				t.Fatal(err)
			}
			b := cpu.New(2)
			defer b.Close()
			m0, err := model.New(b, cfg, model.Options{MaxTokens: 64})
			if err != nil {
				t.Fatal(err)
			}
			m0.InitRandom(7)
			if err := m0.SaveHF(init); err != nil {
				t.Fatal(err)
			}
			m0.Close()
			// The config as published, not as tracegrpo would write it.
			if err := os.WriteFile(filepath.Join(init, "config.json"), []byte(c.config), 0o644); err != nil {
				t.Fatal(err)
			}

			out := filepath.Join(dir, "run")
			mustTrain(t, trainArgs(out, 1, "--init-from", init, "--set", "checkpointing.save_period=1")...)
			step := filepath.Join(out, "checkpoints", checkpoint.StepDir(1))
			saved, err := os.ReadFile(filepath.Join(step, "config.json"))
			if err != nil {
				t.Fatal(err)
			}
			got, err := model.LoadConfig(filepath.Join(step, "config.json"))
			if err != nil {
				t.Fatal(err)
			}
			if got.Arch != cfg.Arch || got.QKVBias() != cfg.QKVBias() || got.RopeTheta != cfg.RopeTheta || got.RopeScaling != cfg.RopeScaling ||
				got.Form.RopeV5 != c.v5 || got.Form.RopeV4 == c.v5 || got.Form.DType != c.v5 {
				t.Errorf("checkpoint config.json states another model:\n%s", saved)
			}
			var orig, back map[string]any
			json.Unmarshal([]byte(c.config), &orig)
			json.Unmarshal(saved, &back)
			for k, v := range orig {
				if k == "torch_dtype" || k == "dtype" {
					continue
				}
				if d := cmp.Diff(v, back[k]); d != "" {
					t.Errorf("checkpoint config.json key %s (-init +checkpoint):\n%s", k, d)
				}
			}
			if c.v5 && (back["rope_theta"] != nil || back["rope_scaling"] != nil || back["torch_dtype"] != nil) {
				t.Errorf("a v5 config came back with v4 keys:\n%s", saved)
			}

			// The trained weights, biases included.
			trained := checkpointWeights(t, step)
			nbias := 0
			for name, w := range trained {
				if !strings.HasSuffix(name, "_proj.bias") {
					continue
				}
				nbias++
				if !slices.ContainsFunc(w, func(x float32) bool { return x != 0 }) {
					t.Errorf("%s is still zero after a training step", name)
				}
			}
			if want := 3 * cfg.NumHiddenLayers * boolInt(cfg.QKVBias()); nbias != want {
				t.Errorf("checkpoint holds %d q/k/v biases, want %d", nbias, want)
			}
			// ... and their Adam moments.
			st, err := checkpoint.Load(step, checkpoint.LoadOptions{})
			if err != nil {
				t.Fatal(err)
			}
			moments := 0
			for _, x := range st.Optimizer {
				if strings.Contains(x.Name, "_proj.bias.exp_avg") && slices.ContainsFunc(x.F32, func(v float32) bool { return v != 0 }) {
					moments++
				}
			}
			if want := 2 * nbias; moments != want {
				t.Errorf("checkpoint holds %d nonzero bias moments, want %d (exp_avg and exp_avg_sq of each bias)", moments, want)
			}

			// A run starts from the checkpoint.
			mustTrain(t, trainArgs(filepath.Join(dir, "run2"), 1, "--init-from", step)...)

			// train score of the checkpoint = the trained weights' forward.
			seqs := [][]int32{{1, 5, 9, 3, 7, 30, 2}, {1, 4}, {1, 8, 8, 8, 12, 19, 25, 31, 0, 6, 2}}
			var in bytes.Buffer
			for _, s := range seqs {
				line, _ := json.Marshal(map[string]any{"token_ids": s})
				in.Write(append(line, '\n'))
			}
			inPath := filepath.Join(dir, "in.jsonl")
			os.WriteFile(inPath, in.Bytes(), 0o644)
			var stdout, stderr bytes.Buffer
			if code := run([]string{"score", "--model", step, "--input", inPath, "--threads", "2"}, &stdout, &stderr); code != 0 {
				t.Fatalf("score: exit %d: %s", code, stderr.String())
			}
			m, err := model.New(b, got, model.Options{MaxTokens: 64})
			if err != nil {
				t.Fatal(err)
			}
			defer m.Close()
			host := make([]float32, m.Table().Total)
			for _, p := range m.Table().Params {
				copy(host[p.Offset:p.Offset+p.N], trained[p.Name])
			}
			if err := m.SetParamsHost(host); err != nil {
				t.Fatal(err)
			}
			dec := json.NewDecoder(&stdout)
			for i, s := range seqs {
				var rec scoreOut
				if err := dec.Decode(&rec); err != nil {
					t.Fatalf("score output line %d: %v", i+1, err)
				}
				lp, ent, err := m.Forward(s, []int32{0, int32(len(s))}, 1)
				if err != nil {
					t.Fatal(err)
				}
				if d := cmp.Diff(lp[1:], rec.Logprobs); d != "" {
					t.Errorf("sequence %d: score logprobs differ from the trained weights' (-weights +score):\n%s", i, d)
				}
				if d := cmp.Diff(ent[1:], rec.Entropy); d != "" {
					t.Errorf("sequence %d: score entropies differ (-weights +score):\n%s", i, d)
				}
			}
		})
	}
}

// checkpointWeights reads a checkpoint's model weights by name.
func checkpointWeights(t *testing.T, step string) map[string][]float32 {
	t.Helper()
	st, err := checkpoint.Load(step, checkpoint.LoadOptions{})
	if err != nil {
		t.Fatal(err)
	}
	w := map[string][]float32{}
	for _, x := range st.Model {
		w[x.Name] = x.F32
	}
	return w
}

func boolInt(b bool) int {
	if b {
		return 1
	}
	return 0
}
