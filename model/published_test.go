package model

import (
	"crypto/sha256"
	"encoding/json"
	"fmt"
	"math"
	"os"
	"path/filepath"
	"testing"

	"github.com/google/go-cmp/cmp"
	"github.com/google/go-cmp/cmp/cmpopts"
)

// publishedConfigs are the config.json files of NeMo RL's reference models
// (testdata/published/PROVENANCE.md) and what each must load as.
var publishedConfigs = []struct {
	file       string
	arch       Arch
	theta      float32
	scaling    RopeScaling
	tied, bias bool
	headDim    int
	params     float64 // published parameter count
	exact      bool    // params is exact (else to the published 3 digits)
	notes      int
}{
	{"qwen2.5-1.5b.v5.config.json", Qwen2, 1e6, RopeScaling{}, true, true, 128, 1543714304, true, 1},
	{"deepseek-r1-distill-qwen-1.5b.config.json", Qwen2, 10000, RopeScaling{}, false, true, 128, 1.78e9, false, 1},
	{"llama-3.2-1b.config.json", Llama, 500000, RopeScaling{Type: RopeLlama3, Factor: 32, LowFreqFactor: 1, HighFreqFactor: 4, OriginalMaxPositionEmbeddings: 8192}, true, false, 64, 1.24e9, false, 0},
	{"llama-3.1-8b.config.json", Llama, 500000, RopeScaling{Type: RopeLlama3, Factor: 8, LowFreqFactor: 1, HighFreqFactor: 4, OriginalMaxPositionEmbeddings: 8192}, false, false, 128, 8.03e9, false, 0},
	// Qwen3-1.7B, tied: 1,720,574,976 parameters. Not the "2.03B" the Hub
	// shows: that is the checkpoint's count, which stores lm_head.weight as
	// a byte-identical copy of embed_tokens (publishedCheckpoints). The same
	// shapes with the head dropped, measured independently: Qwen3-1.7B-Base,
	// whose single model.safetensors has no lm_head, holds 310 BF16 tensors
	// and 1,720,574,976 parameters; and by hand, V·C + L·(2C + 2·NH·HD·C +
	// 2·NKV·HD·C + 2·HD + 3·I·C) + C = 311,164,928 + 28·50,336,000 + 2,048.
	// The card's "1.7B / 1.4B non-embedding" agrees (1,409,410,048).
	{"qwen3-1.7b.config.json", Qwen3, 1e6, RopeScaling{}, true, false, 128, 1720574976, true, 1},
	// Qwen2.5-7B, untied: 7,615,616,512 = the index total_size 15,231,233,024
	// / 2 bytes (all BF16) recorded for Qwen2.5-7B-Instruct, which has these
	// shapes and shard sizes; the card says 7.61B total, 6.53B non-embedding
	// (6,525,621,760 here).
	{"qwen2.5-7b.config.json", Qwen2, 1e6, RopeScaling{}, false, true, 128, 7615616512, true, 1},
	// Qwen2.5-32B, untied: 32,763,876,352, the count an independent
	// architecture-count test fixture states for exactly these shapes
	// (PROVENANCE.md); the card's "32.5B / 31.0B non-embedding" is rounded.
	{"qwen2.5-32b.config.json", Qwen2, 1e6, RopeScaling{}, false, true, 128, 32763876352, true, 1},
	// Qwen3-30B-A3B, 48 sparse layers of 128 experts: 30,532,122,624 = the
	// index total_size 61,064,245,248 bytes / 2 (all BF16, 16 shards); the
	// card says 30.5B total, 29.9B non-embedding (29,909,792,768 here).
	{"qwen3-30b-a3b.config.json", Qwen3MoE, 1e6, RopeScaling{}, false, false, 128, 30532122624, true, 1},
}

// publishedActive are sparse models' parameters per token (PROVENANCE.md):
// Qwen3-30B-A3B's 3,353,032,704, the "3.3B activated" of its card.
var publishedActive = map[string]int{"qwen3-30b-a3b.config.json": 3353032704}

// publishedCheckpoints are facts about the Hub files of the models whose
// config.json is byte-identical to the Hub's (testdata/published/PROVENANCE.md):
// the file's SHA-256 as published, and the parameters the checkpoint stores,
// model.safetensors.index.json's metadata.total_size / 2 (every tensor is
// BF16). headStored: the checkpoint stores lm_head.weight although the
// embeddings are tied, so it holds V·C more than the model has.
var publishedCheckpoints = map[string]struct {
	sha256     string
	stored     int
	headStored bool
}{
	// Qwen/Qwen3-1.7B 70d244cc86ccca08cf5af4e1e306ecf908b1ad5e: total_size
	// 4,063,479,808; shard 2 is 622,329,984 bytes: lm_head (622,329,856) and
	// a header.
	"qwen3-1.7b.config.json": {"1ddb5b89ebc90dcb417a45c213d818577e65976454d29385c8f6140771d95197", 2031739904, true},
	// Qwen/Qwen2.5-7B d149729398750b98c0af14eb82c78cfe92750796: total_size
	// 15,231,233,024 (as recorded for -Instruct; see PROVENANCE.md).
	"qwen2.5-7b.config.json": {"267ce68584c5f24c3b267d934db2de68dd21d1ca677fb78ed809eb60067f7642", 7615616512, false},
}

// TestPublishedConfigs: each published config loads as the model it
// describes (architecture, RoPE, tying, biases, head size, parameter count),
// its transformers v5 (or v4) counterpart loads the same, and writing it
// back states the same model in the same form.
func TestPublishedConfigs(t *testing.T) {
	if len(publishedConfigs) < 4 {
		t.Fatal("no published configs")
	}
	for _, c := range publishedConfigs {
		t.Run(c.file, func(t *testing.T) {
			path := filepath.Join("testdata", "published", c.file)
			data, err := os.ReadFile(path)
			if err != nil {
				t.Fatal(err)
			}
			cfg, err := ParseConfig(data, path)
			if err != nil {
				t.Fatal(err)
			}
			if cfg.Arch != c.arch || cfg.RopeTheta != c.theta || cfg.RopeScaling != c.scaling || cfg.TieWordEmbeddings != c.tied ||
				cfg.QKVBias() != c.bias || cfg.HeadDim != c.headDim || cfg.TorchDType != "bfloat16" {
				t.Errorf("loaded as %s theta %g scaling %+v tied %v bias %v head_dim %d dtype %s", cfg.Arch, cfg.RopeTheta, cfg.RopeScaling,
					cfg.TieWordEmbeddings, cfg.QKVBias(), cfg.HeadDim, cfg.TorchDType)
			}
			if len(cfg.Notes) != c.notes {
				t.Errorf("notes %q, want %d", cfg.Notes, c.notes)
			}
			n := float64(NewParamTable(cfg).Total)
			if c.exact && n != c.params {
				t.Errorf("%.0f parameters, published %.0f", n, c.params)
			}
			if !c.exact && math.Abs(n-c.params) > 0.005e9*math.Max(1, c.params/1e9) {
				t.Errorf("%.0f parameters, published %.3g", n, c.params)
			}
			if want, ok := publishedActive[c.file]; ok {
				if got := ActiveParams(cfg); got != want {
					t.Errorf("%d active parameters per token, published %d", got, want)
				}
			} else if ActiveParams(cfg) != NewParamTable(cfg).Total {
				t.Errorf("a dense model's active parameters %d differ from its total %d", ActiveParams(cfg), NewParamTable(cfg).Total)
			}
			if ck, ok := publishedCheckpoints[c.file]; ok {
				if sum := fmt.Sprintf("%x", sha256.Sum256(data)); sum != ck.sha256 {
					t.Errorf("SHA-256 %s, the Hub's file has %s", sum, ck.sha256)
				}
				stored := NewParamTable(cfg).Total
				if ck.headStored {
					stored += cfg.VocabSize * cfg.HiddenSize
				}
				if stored != ck.stored {
					t.Errorf("checkpoint would store %d parameters, its index says %d", stored, ck.stored)
				}
			}
			// The other form of the same config.
			var other []byte
			if cfg.Form.RopeV5 {
				other = v4Config(t, data)
			} else {
				other = v5Config(t, data)
			}
			cfg2, err := ParseConfig(other, path+" (other form)")
			if err != nil {
				t.Fatalf("%v\n%s", err, other)
			}
			if d := cmp.Diff(cfg, cfg2, cmpopts.IgnoreFields(Config{}, "Form", "Notes", "Extra")); d != "" {
				t.Errorf("v4 and v5 forms load differently (-file +other form):\n%s", d)
			}
			// Written back: the same model, the same form, every key kept.
			out, err := cfg.JSON("bfloat16")
			if err != nil {
				t.Fatal(err)
			}
			back, err := ParseConfig(out, "written")
			if err != nil {
				t.Fatal(err)
			}
			if d := cmp.Diff(cfg, back, cmpopts.IgnoreFields(Config{}, "Notes")); d != "" {
				t.Errorf("written back (-read +written):\n%s", d)
			}
		})
	}
}

// v4Config is v5Config's inverse: a rope_parameters block back to
// rope_theta and rope_scaling (null when default), dtype to torch_dtype.
func v4Config(t testing.TB, v5 []byte) []byte {
	t.Helper()
	var m map[string]any
	if err := json.Unmarshal(v5, &m); err != nil {
		t.Fatal(err)
	}
	rp, _ := m["rope_parameters"].(map[string]any)
	delete(m, "rope_parameters")
	m["rope_theta"] = rp["rope_theta"]
	delete(rp, "rope_theta")
	if rp["rope_type"] == "default" {
		m["rope_scaling"] = nil
	} else {
		m["rope_scaling"] = rp
	}
	if d, ok := m["dtype"]; ok {
		m["torch_dtype"] = d
		delete(m, "dtype")
	}
	out, err := json.Marshal(m)
	if err != nil {
		t.Fatal(err)
	}
	return out
}
