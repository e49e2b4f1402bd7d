package trainer

import (
	"path/filepath"
	"testing"
	"time"

	"github.com/tracegrpo/tracegrpo/checkpoint"
	"github.com/tracegrpo/tracegrpo/internal/safetensors"
	"github.com/tracegrpo/tracegrpo/kernels/cpu"
	"github.com/tracegrpo/tracegrpo/loop"
	"github.com/tracegrpo/tracegrpo/model"
)

// benchModelJSON is the bench model (scripts/bench_torch.py's CONFIG:
// Qwen3, hidden 512, 8 layers, vocabulary 8192, 33.6M parameters).
const benchModelJSON = `{"model_type": "qwen3", "architectures": ["Qwen3ForCausalLM"], "hidden_size": 512,
    "intermediate_size": 1536, "num_hidden_layers": 8, "num_attention_heads": 8,
    "num_key_value_heads": 4, "head_dim": 64, "rms_norm_eps": 1e-6, "rope_theta": 1000000.0,
    "vocab_size": 8192, "tie_word_embeddings": false, "max_position_embeddings": 4096,
    "torch_dtype": "float32", "hidden_act": "silu", "attention_bias": false, "rope_scaling": null}`

// BenchmarkWeightsOutAgainstCheckpoint: at the bench model's size, one
// step's weights for the generator (bf16, through loop's publisher and the
// model's streaming writer) against the full checkpoint the generator read
// before (fp32 weights and both Adam moments, checkpoint.Save), in the same
// run: bytes and seconds of each, and their ratios.
//
//	go test ./trainer -run '^$' -bench WeightsOutAgainstCheckpoint -benchtime 5x
func BenchmarkWeightsOutAgainstCheckpoint(b *testing.B) {
	cfg, err := model.ParseConfig([]byte(benchModelJSON), "bench")
	if err != nil {
		b.Fatal(err)
	}
	be := cpu.New(0)
	defer be.Close()
	m, err := model.New(be, cfg, model.Options{MaxTokens: 16, ForwardOnly: true})
	if err != nil {
		b.Fatal(err)
	}
	defer m.Close()
	m.InitRandom(1)
	dir := b.TempDir()
	pub, _, err := loop.OpenPublisher(filepath.Join(dir, "weights"), 2)
	if err != nil {
		b.Fatal(err)
	}
	host := be.F32(m.Params())
	zeros := make([]float32, len(host))
	st := &checkpoint.State{Trainer: checkpoint.TrainerState{Optimizer: []byte(`{}`), Scheduler: []byte(`{}`), RolloutCursor: []byte(`{}`), Config: []byte(`{}`)}}
	if st.ModelConfig, err = m.HFConfigJSON(safetensors.F32); err != nil {
		b.Fatal(err)
	}
	for _, p := range m.Table().Params {
		spec := func(n string) safetensors.Spec {
			return safetensors.Spec{Name: n, DType: safetensors.F32, Shape: p.Shape}
		}
		st.Model = append(st.Model, checkpoint.Tensor{Spec: spec(p.Name), F32: host[p.Offset : p.Offset+p.N]})
		st.Optimizer = append(st.Optimizer, checkpoint.Tensor{Spec: spec(p.Name + ".exp_avg"), F32: zeros[p.Offset : p.Offset+p.N]},
			checkpoint.Tensor{Spec: spec(p.Name + ".exp_avg_sq"), F32: zeros[p.Offset : p.Offset+p.N]})
	}
	var pubT, ckT time.Duration
	var pubB, ckB int64
	b.ResetTimer()
	for i := 0; i < b.N; i++ {
		t0 := time.Now()
		pd, err := pub.Begin(int64(i))
		if err != nil {
			b.Fatal(err)
		}
		f, err := pd.Create(loop.ModelFile)
		if err != nil {
			b.Fatal(err)
		}
		if err := m.WriteHF(f, safetensors.BF16, nil); err != nil {
			b.Fatal(err)
		}
		if err := f.Close(); err != nil {
			b.Fatal(err)
		}
		cj, _ := m.HFConfigJSON(safetensors.BF16)
		if err := pd.WriteFile(loop.ConfigFile, cj); err != nil {
			b.Fatal(err)
		}
		d, _, err := pd.Publish("bfloat16")
		if err != nil {
			b.Fatal(err)
		}
		t1 := time.Now()
		st.Trainer.Step = int64(i)
		path, err := checkpoint.Save(filepath.Join(dir, "checkpoints"), st, checkpoint.SaveOptions{KeepTopK: 2})
		if err != nil {
			b.Fatal(err)
		}
		t2 := time.Now()
		man, err := checkpoint.Structure(path)
		if err != nil {
			b.Fatal(err)
		}
		pubT, ckT = pubT+t1.Sub(t0), ckT+t2.Sub(t1)
		pubB, ckB = d.Bytes(), 0
		for _, e := range man.Files {
			ckB += e.Size
		}
	}
	n := float64(b.N)
	b.ReportMetric(float64(pubB), "weights-bytes")
	b.ReportMetric(float64(ckB), "checkpoint-bytes")
	b.ReportMetric(float64(pubB)/float64(ckB), "bytes-ratio")
	b.ReportMetric(pubT.Seconds()/n, "weights-s")
	b.ReportMetric(ckT.Seconds()/n, "checkpoint-s")
	b.ReportMetric(pubT.Seconds()/ckT.Seconds(), "time-ratio")
}
