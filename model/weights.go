package model

import (
	"fmt"
	"math"
	"math/rand/v2"
	"os"
	"path/filepath"
	"sort"
	"strings"

	"github.com/tracegrpo/tracegrpo/internal/safetensors"
)

// InitStd is the standard deviation of random initialisation (HF's
// initializer_range default for Llama and Qwen3).
const InitStd = 0.02

// FormatName and FormatVersion are written to __metadata__ of the
// model.safetensors SaveHF writes.
const (
	FormatName    = "tracegrpo.model"
	FormatVersion = "1"
)

// InitRandom sets every weight matrix to N(0, InitStd²) and every norm weight
// to 1, from a PCG seeded with seed (HF's _init_weights for these models).
func (m *Model) InitRandom(seed uint64) {
	r := rand.New(rand.NewPCG(seed, 0x7472616365677270)) // "tracegrp"
	host := make([]float32, m.table.Total)
	for _, p := range m.table.Params {
		dst := host[p.Offset : p.Offset+p.N]
		if len(p.Shape) == 1 {
			for i := range dst {
				dst[i] = 1
			}
			continue
		}
		for i := range dst {
			dst[i] = float32(r.NormFloat64() * InitStd)
		}
	}
	m.b.UploadF32(m.params, host)
}

// ParamsHost downloads the parameter arena.
func (m *Model) ParamsHost() []float32 {
	host := make([]float32, m.table.Total)
	m.b.DownloadF32(host, m.params)
	return host
}

// SetParamsHost uploads a whole parameter arena.
func (m *Model) SetParamsHost(host []float32) error {
	if len(host) != m.table.Total {
		return fmt.Errorf("model: %d parameters given, the table holds %d", len(host), m.table.Total)
	}
	m.b.UploadF32(m.params, host)
	return nil
}

// ignoredTensors are HF tensors that carry no weights (old Llama checkpoints
// store the rotary inverse frequencies).
func ignoredTensor(name string) bool {
	return strings.HasSuffix(name, ".rotary_emb.inv_freq")
}

// LoadHF reads dir/model.safetensors (or the shards of
// dir/model.safetensors.index.json), converting F32, BF16 or F16 to the
// fp32 parameter arena. Every parameter must be present with its exact shape;
// a tensor the model has no place for is an error (for a tied model, a stored
// lm_head.weight must equal the embedding).
func (m *Model) LoadHF(dir string) error {
	set, err := safetensors.OpenDir(dir)
	if err != nil {
		return fmt.Errorf("model: load %s: %w", dir, err)
	}
	defer set.Close()
	host := make([]float32, m.table.Total)
	for _, p := range m.table.Params {
		ti, ok := set.Tensor(p.Name)
		if !ok {
			return fmt.Errorf("model: load %s: tensor %s is missing (expected shape %v for this config.json)", set.Source(), p.Name, p.Shape)
		}
		if !equalShape(ti.Shape, p.Shape) {
			return fmt.Errorf("model: load %s: tensor %s: expected shape %v from config.json, found %v", set.Source(), p.Name, p.Shape, ti.Shape)
		}
		if err := set.ReadF32(p.Name, host[p.Offset:p.Offset+p.N]); err != nil {
			return fmt.Errorf("model: load: %w", err)
		}
	}
	for _, ti := range set.Tensors() {
		if _, ok := m.table.Lookup(ti.Name); ok || ignoredTensor(ti.Name) {
			continue
		}
		if ti.Name == "lm_head.weight" && m.cfg.TieWordEmbeddings {
			wte, _ := m.table.Lookup("model.embed_tokens.weight")
			if !equalShape(ti.Shape, wte.Shape) {
				return fmt.Errorf("model: load %s: tensor lm_head.weight of a tied model: expected shape %v, found %v", set.Source(), wte.Shape, ti.Shape)
			}
			head := make([]float32, wte.N)
			if err := set.ReadF32(ti.Name, head); err != nil {
				return fmt.Errorf("model: load: %w", err)
			}
			for i, x := range head {
				if x != host[wte.Offset+i] {
					return fmt.Errorf("model: load %s: tie_word_embeddings is true but lm_head.weight differs from model.embed_tokens.weight at element %d (%g vs %g)", set.Source(), i, x, host[wte.Offset+i])
				}
			}
			continue
		}
		return fmt.Errorf("model: load %s: unexpected tensor %s (shape %v): this %s config.json has no such parameter", set.Source(), ti.Name, ti.Shape, m.cfg.Arch)
	}
	for i, x := range host {
		if math.IsNaN(float64(x)) || math.IsInf(float64(x), 0) {
			p := m.table.at(i)
			return fmt.Errorf("model: load %s: tensor %s element %d is %g", set.Source(), p.Name, i-p.Offset, x)
		}
	}
	m.b.UploadF32(m.params, host)
	return nil
}

// at returns the parameter holding arena element i.
func (t *ParamTable) at(i int) Param {
	j := sort.Search(len(t.Params), func(j int) bool { return t.Params[j].Offset+t.Params[j].N > i })
	return t.Params[j]
}

func equalShape(a, b []int) bool {
	if len(a) != len(b) {
		return false
	}
	for i := range a {
		if a[i] != b[i] {
			return false
		}
	}
	return true
}

// SaveHF writes dir/model.safetensors (fp32, HF names) and dir/config.json so
// that HF transformers loads the directory unchanged. Both are written
// atomically; dir is created if needed.
func (m *Model) SaveHF(dir string) error {
	return m.SaveHFAs(dir, safetensors.F32)
}

// SaveHFAs is SaveHF with the weights rounded to dtype (F32, BF16 or F16).
func (m *Model) SaveHFAs(dir string, dtype safetensors.DType) error {
	torchName := map[safetensors.DType]string{safetensors.F32: "float32", safetensors.BF16: "bfloat16", safetensors.F16: "float16"}[dtype]
	if torchName == "" {
		return fmt.Errorf("model: save: dtype %s: expected F32, BF16 or F16", dtype)
	}
	if err := os.MkdirAll(dir, 0o755); err != nil {
		return fmt.Errorf("model: save: %w", err)
	}
	host := m.ParamsHost()
	if err := m.b.Sync(); err != nil {
		return fmt.Errorf("model: save: %w", err)
	}
	tensors := make([]safetensors.Tensor, len(m.table.Params))
	for i, p := range m.table.Params {
		tensors[i] = safetensors.Tensor{
			Spec: safetensors.Spec{Name: p.Name, DType: dtype, Shape: p.Shape},
			F32:  host[p.Offset : p.Offset+p.N],
		}
	}
	meta := map[string]string{"format": "pt", "tracegrpo_format": FormatName, "tracegrpo_format_version": FormatVersion}
	if err := safetensors.WriteFile(filepath.Join(dir, safetensors.SingleFileName), tensors, meta); err != nil {
		return fmt.Errorf("model: save: %w", err)
	}
	cfgJSON, err := m.cfg.JSON(torchName)
	if err != nil {
		return err
	}
	return writeFileAtomic(filepath.Join(dir, "config.json"), cfgJSON)
}
