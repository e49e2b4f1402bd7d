package model

import (
	"bytes"
	"fmt"
	"math"
	"math/rand/v2"
	"os"
	"path/filepath"
	"runtime"
	"slices"
	"strings"
	"testing"

	"github.com/google/go-cmp/cmp"
	"github.com/google/go-cmp/cmp/cmpopts"
	"github.com/tracegrpo/tracegrpo/internal/safetensors"
	"github.com/tracegrpo/tracegrpo/kernels"
	"github.com/tracegrpo/tracegrpo/kernels/cpu"
)

// TestParamTableMatchesHF: the table's names and shapes are exactly the
// tensors PyTorch's script wrote, and the arena is contiguous.
func TestParamTableMatchesHF(t *testing.T) {
	for _, v := range goldenVariants {
		t.Run(v, func(t *testing.T) {
			cfg, err := LoadConfig(filepath.Join("testdata", v, "config.json"))
			if err != nil {
				t.Fatal(err)
			}
			f, err := safetensors.Open(filepath.Join("testdata", v, "model.safetensors"))
			if err != nil {
				t.Fatal(err)
			}
			defer f.Close()
			want := map[string][]int{}
			for _, ti := range f.Tensors() {
				want[ti.Name] = ti.Shape
			}
			tab := NewParamTable(cfg)
			got := map[string][]int{}
			off := 0
			for _, p := range tab.Params {
				got[p.Name] = p.Shape
				if p.Offset != off {
					t.Errorf("%s: offset %d, want %d (contiguous)", p.Name, p.Offset, off)
				}
				off += p.N
				if wantDecay := len(p.Shape) == 2; p.Decay != wantDecay {
					t.Errorf("%s: decay %v, want %v (norm weights exempt)", p.Name, p.Decay, wantDecay)
				}
			}
			if off != tab.Total {
				t.Errorf("Total %d, sum of sizes %d", tab.Total, off)
			}
			if d := cmp.Diff(want, got); d != "" {
				t.Errorf("parameters (-pytorch +table):\n%s", d)
			}
		})
	}
}

// TestQwen2BiasLayout: a Qwen2 layer's q, k and v biases follow its q, k
// and v weights side by side (one contiguous run each, for a later fused
// q/k/v projection), are exempt from weight decay and start at zero.
func TestQwen2BiasLayout(t *testing.T) {
	cfg, err := LoadConfig(filepath.Join("testdata", "qwen2_untied", "config.json"))
	if err != nil {
		t.Fatal(err)
	}
	tab := NewParamTable(cfg)
	for l := 0; l < cfg.NumHiddenLayers; l++ {
		var prev Param
		for i, n := range []string{"q_proj.weight", "k_proj.weight", "v_proj.weight", "q_proj.bias", "k_proj.bias", "v_proj.bias", "o_proj.weight"} {
			p, ok := tab.Lookup(fmt.Sprintf("model.layers.%d.self_attn.%s", l, n))
			if !ok {
				t.Fatalf("no parameter %s in layer %d", n, l)
			}
			if i > 0 && p.Offset != prev.Offset+prev.N {
				t.Errorf("layer %d: %s at %d, want right after %s (%d)", l, n, p.Offset, prev.Name, prev.Offset+prev.N)
			}
			if isBias := strings.HasSuffix(n, ".bias"); p.Bias != isBias || (isBias && p.Decay) {
				t.Errorf("%s: Bias %v Decay %v", p.Name, p.Bias, p.Decay)
			}
			prev = p
		}
	}
	b := cpu.New(1)
	defer b.Close()
	m, err := New(b, cfg, Options{MaxTokens: 4})
	if err != nil {
		t.Fatal(err)
	}
	defer m.Close()
	m.InitRandom(3)
	host := m.ParamsHost()
	for _, p := range m.Table().Params {
		v := host[p.Offset : p.Offset+p.N]
		switch {
		case p.Bias && slices.ContainsFunc(v, func(x float32) bool { return x != 0 }):
			t.Errorf("%s: InitRandom bias not zero", p.Name)
		case !p.Bias && len(p.Shape) == 2 && !slices.ContainsFunc(v, func(x float32) bool { return x != 0 }):
			t.Errorf("%s: InitRandom weight all zero", p.Name)
		}
	}
}

func TestConfig(t *testing.T) {
	base := `"model_type":"qwen3","hidden_size":64,"intermediate_size":128,"num_hidden_layers":2,"num_attention_heads":4,"vocab_size":512`
	t.Run("defaults", func(t *testing.T) {
		c, err := ParseConfig([]byte(`{`+base+`,"eos_token_id":[1,2],"bos_token_id":7}`), "cfg")
		if err != nil {
			t.Fatal(err)
		}
		want := Config{Arch: Qwen3, HiddenSize: 64, IntermediateSize: 128, NumHiddenLayers: 2, NumAttentionHeads: 4,
			NumKeyValueHeads: 4, HeadDim: 16, RMSNormEps: 1e-6, RopeTheta: 10000, VocabSize: 512, EOSTokenIDs: []int32{1, 2},
			Notes: []string{"cfg states no rope_theta (nor rope_parameters.rope_theta): using 10000, transformers' default for model_type qwen3"},
		}
		if d := cmp.Diff(want, c, cmpopts.IgnoreFields(Config{}, "Extra")); d != "" {
			t.Errorf("(-want +got):\n%s", d)
		}
		if string(c.Extra["bos_token_id"]) != "7" {
			t.Errorf("extra key not kept: %v", c.Extra)
		}
	})
	for _, c := range []struct{ name, json, field string }{
		{"unknown arch", `{"model_type":"gpt2"}`, "model_type"},
		{"architectures mismatch", `{` + base + `,"architectures":["LlamaForCausalLM"]}`, "architectures"},
		{"rope scaling", `{` + base + `,"rope_scaling":{"rope_type":"llama3"}}`, "rope_scaling.factor"},
		{"attention bias", `{` + base + `,"attention_bias":true}`, "attention_bias"},
		{"act", `{` + base + `,"hidden_act":"gelu"}`, "hidden_act"},
		{"fractional", `{` + base + `,"head_dim":16.5}`, "head_dim"},
		{"missing", `{"model_type":"llama","hidden_size":64}`, "intermediate_size"},
		{"gqa", `{` + base + `,"num_key_value_heads":3}`, "num_key_value_heads"},
		{"odd head dim", `{` + base + `,"head_dim":15}`, "head_dim"},
		{"eos", `{` + base + `,"eos_token_id":"x"}`, "eos_token_id"},
	} {
		t.Run(c.name, func(t *testing.T) {
			_, err := ParseConfig([]byte(c.json), "cfg.json")
			if err == nil || !strings.Contains(err.Error(), c.field) || !strings.Contains(err.Error(), "cfg.json") {
				t.Fatalf("error %v: want one naming cfg.json and field %s", err, c.field)
			}
		})
	}
}

// TestSaveLoadRoundTrip: SaveHF then LoadHF restores every parameter
// bit for bit, the config.json parses back to the same Config, and the
// safetensors metadata carries format pt and our format name.
func TestSaveLoadRoundTrip(t *testing.T) {
	for _, v := range []string{"qwen3_untied", "llama_tied", "qwen2_tied", "llama31_long"} {
		t.Run(v, func(t *testing.T) {
			b := cpu.New(1)
			defer b.Close()
			m := loadTestModel(t, v, b, Options{MaxTokens: 8})
			defer m.Close()
			dir := filepath.Join(t.TempDir(), "out")
			if err := m.SaveHF(dir); err != nil {
				t.Fatal(err)
			}
			m2 := loadModelDir(t, dir, b, Options{MaxTokens: 8})
			defer m2.Close()
			if d := cmp.Diff(m.ParamsHost(), m2.ParamsHost()); d != "" {
				t.Fatalf("parameters changed (-saved +loaded):\n%s", d)
			}
			want := m.Config()
			got := m2.Config()
			if d := cmp.Diff(want, got, cmpopts.IgnoreFields(Config{}, "TorchDType", "Extra", "Notes")); d != "" {
				t.Errorf("config (-want +got):\n%s", d)
			}
			if got.TorchDType != "float32" {
				t.Errorf("torch_dtype %q, want float32", got.TorchDType)
			}
			f, err := safetensors.Open(filepath.Join(dir, "model.safetensors"))
			if err != nil {
				t.Fatal(err)
			}
			defer f.Close()
			md := f.Metadata()
			if md["format"] != "pt" || md["tracegrpo_format"] != FormatName || md["tracegrpo_format_version"] != FormatVersion {
				t.Errorf("metadata %v", md)
			}
			if _, ok := f.Tensor("lm_head.weight"); ok == m.Config().TieWordEmbeddings {
				t.Errorf("lm_head.weight present = %v for tie_word_embeddings = %v", ok, m.Config().TieWordEmbeddings)
			}
			// BF16 export rounds each weight like torch.
			if err := m.SaveHFAs(dir, safetensors.BF16); err != nil {
				t.Fatal(err)
			}
			m3 := loadModelDir(t, dir, b, Options{MaxTokens: 8})
			defer m3.Close()
			p, p3 := m.ParamsHost(), m3.ParamsHost()
			for i := range p {
				if want := safetensors.BF16ToF32(safetensors.F32ToBF16(p[i])); p3[i] != want {
					t.Fatalf("bf16 export: element %d is %g, want %g", i, p3[i], want)
				}
			}
		})
	}
}

// TestLoadHFRejects: a checkpoint that does not fit the config is an error
// naming the tensor.
func TestLoadHFRejects(t *testing.T) {
	b := cpu.New(1)
	defer b.Close()
	src := filepath.Join("testdata", "qwen3_untied")
	cfg, err := LoadConfig(filepath.Join(src, "config.json"))
	if err != nil {
		t.Fatal(err)
	}
	f, err := safetensors.Open(filepath.Join(src, "model.safetensors"))
	if err != nil {
		t.Fatal(err)
	}
	defer f.Close()
	write := func(t *testing.T, edit func([]safetensors.Tensor) []safetensors.Tensor) string {
		var ts []safetensors.Tensor
		for _, ti := range f.Tensors() {
			vals := make([]float32, ti.NumElements())
			if err := f.ReadF32(ti.Name, vals); err != nil {
				t.Fatal(err)
			}
			ts = append(ts, safetensors.Tensor{Spec: safetensors.Spec{Name: ti.Name, DType: ti.DType, Shape: ti.Shape}, F32: vals})
		}
		dir := t.TempDir()
		if err := safetensors.WriteFile(filepath.Join(dir, "model.safetensors"), edit(ts), nil); err != nil {
			t.Fatal(err)
		}
		return dir
	}
	for _, c := range []struct {
		name, want string
		edit       func([]safetensors.Tensor) []safetensors.Tensor
	}{
		{"missing", "model.norm.weight is missing", func(ts []safetensors.Tensor) []safetensors.Tensor {
			var out []safetensors.Tensor
			for _, x := range ts {
				if x.Name != "model.norm.weight" {
					out = append(out, x)
				}
			}
			return out
		}},
		{"shape", "expected shape [64]", func(ts []safetensors.Tensor) []safetensors.Tensor {
			for i := range ts {
				if ts[i].Name == "model.norm.weight" {
					ts[i].Shape = []int{2, 32}
				}
			}
			return ts
		}},
		{"nan", "model.layers.1.mlp.up_proj.weight element 7 is NaN", func(ts []safetensors.Tensor) []safetensors.Tensor {
			for i := range ts {
				if ts[i].Name == "model.layers.1.mlp.up_proj.weight" {
					ts[i].F32[7] = float32(math.NaN())
				}
			}
			return ts
		}},
		{"unexpected", "unexpected tensor model.layers.0.self_attn.q_proj.bias", func(ts []safetensors.Tensor) []safetensors.Tensor {
			return append(ts, safetensors.Tensor{Spec: safetensors.Spec{Name: "model.layers.0.self_attn.q_proj.bias", DType: safetensors.F32, Shape: []int{64}}, F32: make([]float32, 64)})
		}},
	} {
		t.Run(c.name, func(t *testing.T) {
			dir := write(t, c.edit)
			m, err := New(b, cfg, Options{MaxTokens: 4})
			if err != nil {
				t.Fatal(err)
			}
			defer m.Close()
			if err := m.LoadHF(dir); err == nil || !strings.Contains(err.Error(), c.want) {
				t.Fatalf("error %v, want one containing %q", err, c.want)
			}
		})
	}
}

// randomBatch returns random sequences (some of length 1) packed.
func randomBatch(r *rand.Rand, nseq, maxLen, V int) (tokens, cu []int32) {
	cu = []int32{0}
	for range nseq {
		n := 1 + r.IntN(maxLen)
		for range n {
			tokens = append(tokens, int32(r.IntN(V)))
		}
		cu = append(cu, int32(len(tokens)))
	}
	return tokens, cu
}

// TestPackingInvariance: a packed micro-batch gives each sequence the
// logprobs and gradients it gets alone, and gradients add across calls.
func TestPackingInvariance(t *testing.T) {
	for _, v := range []string{"qwen3_tied", "moe_k2_norm"} { // routing is per token: packing cannot change it
		t.Run(v, func(t *testing.T) { testPackingInvariance(t, v) })
	}
}

func testPackingInvariance(t *testing.T, v string) {
	b := cpu.New(2)
	defer b.Close()
	m := loadTestModel(t, v, b, Options{MaxTokens: 64, MaxSeqs: 8})
	defer m.Close()
	r := rand.New(rand.NewPCG(5, 6))
	for range 3 {
		tokens, cu := randomBatch(r, 1+r.IntN(5), 12, m.Config().VocabSize)
		coef := make([]float32, len(tokens))
		for i := range coef {
			coef[i] = float32(r.NormFloat64())
		}
		lp, _, err := m.Forward(tokens, cu, 0.9)
		if err != nil {
			t.Fatal(err)
		}
		packed := append([]float32(nil), lp...)
		m.ZeroGrad()
		if err := m.Backward(coef); err != nil {
			t.Fatal(err)
		}
		gPacked := make([]float32, m.Table().Total)
		b.DownloadF32(gPacked, m.Grads())
		m.ZeroGrad()
		for s := 0; s+1 < len(cu); s++ {
			lo, hi := cu[s], cu[s+1]
			lp, _, err := m.Forward(tokens[lo:hi], []int32{0, hi - lo}, 0.9)
			if err != nil {
				t.Fatal(err)
			}
			compareClose(t, "sequence alone vs packed", lp, packed[lo:hi], 2e-6, 1e-6)
			if err := m.Backward(coef[lo:hi]); err != nil {
				t.Fatal(err)
			}
		}
		gAlone := make([]float32, m.Table().Total)
		b.DownloadF32(gAlone, m.Grads())
		compareClose(t, "gradients: sum over sequences alone vs packed", gAlone, gPacked, 1e-5, 1e-4)
	}
}

// TestForwardRejects: malformed micro-batches are errors, not panics.
func TestForwardRejects(t *testing.T) {
	b := cpu.New(1)
	defer b.Close()
	m := loadTestModel(t, "llama_untied", b, Options{MaxTokens: 8, MaxSeqs: 3})
	defer m.Close()
	for _, c := range []struct {
		name   string
		tokens []int32
		cu     []int32
		temp   float32
	}{
		{"too many tokens", make([]int32, 9), []int32{0, 9}, 1},
		{"too many sequences", []int32{1, 2, 3, 4}, []int32{0, 1, 2, 3, 4}, 1},
		{"cu not ending at T", []int32{1, 2}, []int32{0, 1}, 1},
		{"cu decreasing", []int32{1, 2}, []int32{0, 2, 1, 2}, 1},
		{"token outside vocab", []int32{1, 512}, []int32{0, 2}, 1},
		{"zero temperature", []int32{1}, []int32{0, 1}, 0},
		{"no cu", []int32{1}, nil, 1},
	} {
		if _, _, err := m.Forward(c.tokens, c.cu, c.temp); err == nil {
			t.Errorf("%s: accepted", c.name)
		}
	}
	if err := m.Backward([]float32{1}); err == nil {
		t.Errorf("Backward after a failed Forward accepted")
	}
}

// TestNoAllocsPerStep: a warmed-up Forward+Backward allocates nothing.
func TestNoAllocsPerStep(t *testing.T) {
	for _, v := range []string{"qwen3_untied", "moe_k8_step2"} {
		t.Run(v, func(t *testing.T) { testNoAllocsPerStep(t, v) })
	}
}

func testNoAllocsPerStep(t *testing.T, v string) {
	b := cpu.New(2)
	defer b.Close()
	m := loadTestModel(t, v, b, Options{MaxTokens: 40, MaxSeqs: 8})
	defer m.Close()
	m.SetRouterLossWeight(0.01) // a sparse model's load-balancing loss too
	tokens, cu := randomBatch(rand.New(rand.NewPCG(1, 1)), 4, 10, m.Config().VocabSize)
	dl := make([]float32, len(tokens))
	for i := range dl {
		dl[i] = 0.1
	}
	step := func() {
		if _, _, err := m.Forward(tokens, cu, 1); err != nil {
			t.Fatal(err)
		}
		if err := m.Backward(dl); err != nil {
			t.Fatal(err)
		}
	}
	step()
	if n := minAllocsPerRun(3, 5, step); n != 0 {
		t.Errorf("Forward+Backward allocates %v times per step after warm-up", n)
	}
}

// minAllocsPerRun is the least of tries testing.AllocsPerRun measurements.
// When the CPU backend's workers park under load, the Go runtime may allocate
// a sudog for the blocked goroutine (counted as a malloc, then cached and
// reused); an allocation the step itself makes shows up in every measurement.
func minAllocsPerRun(tries, runs int, f func()) float64 {
	best := testing.AllocsPerRun(runs, f)
	for i := 1; i < tries && best != 0; i++ {
		best = min(best, testing.AllocsPerRun(runs, f))
	}
	return best
}

func TestInitRandom(t *testing.T) {
	b := cpu.New(1)
	defer b.Close()
	cfg, err := LoadConfig(filepath.Join("testdata", "qwen3_untied", "config.json"))
	if err != nil {
		t.Fatal(err)
	}
	m, err := New(b, cfg, Options{MaxTokens: 4})
	if err != nil {
		t.Fatal(err)
	}
	defer m.Close()
	m.InitRandom(3)
	a := m.ParamsHost()
	m.InitRandom(3)
	if d := cmp.Diff(a, m.ParamsHost()); d != "" {
		t.Fatalf("same seed, different weights")
	}
	m.InitRandom(4)
	if cmp.Equal(a, m.ParamsHost()) {
		t.Fatalf("seeds 3 and 4 gave the same weights")
	}
	for _, p := range m.Table().Params {
		vals := a[p.Offset : p.Offset+p.N]
		if len(p.Shape) == 1 {
			for _, x := range vals {
				if x != 1 {
					t.Fatalf("%s: norm weight %g, want 1", p.Name, x)
				}
			}
			continue
		}
		var sum, sq float64
		for _, x := range vals {
			sum += float64(x)
			sq += float64(x) * float64(x)
		}
		n := float64(len(vals))
		std := sq/n - (sum/n)*(sum/n)
		if std < 0.018*0.018 || std > 0.022*0.022 {
			t.Errorf("%s: variance %g, want about %g", p.Name, std, InitStd*InitStd)
		}
	}
}

// TestInitRandomStagesInChunks: a tensor of several staging chunks gets the
// generator's values in order across the chunk boundaries (biases 0, norm
// weights 1), and initializing allocates one chunk of host memory, not the
// largest tensor (which held 1 GiB outside the memory plan for Llama-3.2-1B).
func TestInitRandomStagesInChunks(t *testing.T) {
	b := cpu.New(1)
	defer b.Close()
	cfg, err := LoadConfig(filepath.Join("testdata", "qwen2_tied", "config.json"))
	if err != nil {
		t.Fatal(err)
	}
	cfg.VocabSize = 4*initChunk/cfg.HiddenSize + 17 // four chunks and a partial one
	m, err := New(b, cfg, Options{MaxTokens: 4})
	if err != nil {
		t.Fatal(err)
	}
	defer m.Close()
	var before, after runtime.MemStats
	runtime.ReadMemStats(&before)
	m.InitRandom(5)
	runtime.ReadMemStats(&after)
	largest := 0
	for _, p := range m.Table().Params {
		largest = max(largest, p.N)
	}
	if largest <= 4*initChunk {
		t.Fatalf("largest tensor %d values: the test needs more than four chunks", largest)
	}
	if got, limit := after.TotalAlloc-before.TotalAlloc, uint64(initChunk*4+1<<20); got > limit {
		t.Errorf("InitRandom allocated %d bytes of host memory, want at most %d (largest tensor: %d bytes)", got, limit, 4*largest)
	}
	r := rand.New(rand.NewPCG(5, 0x7472616365677270))
	got := m.ParamsHost()
	sawBias := false
	for _, p := range m.Table().Params {
		for i, x := range got[p.Offset : p.Offset+p.N] {
			want := float32(1)
			switch {
			case p.Bias:
				want, sawBias = 0, true
			case len(p.Shape) > 1:
				want = float32(r.NormFloat64() * InitStd)
			}
			if x != want {
				t.Fatalf("%s[%d] = %g, want %g", p.Name, i, x, want)
			}
		}
	}
	if !sawBias {
		t.Fatal("the model has no bias: the test covers none")
	}
}

// TestLoadHFStreams: LoadHF reads a tied model whose embedding spans several
// staging chunks with its stored lm_head copy, allocating about two chunks of
// host memory instead of two copies of the embedding, and names the element a
// bad value or a differing head sits at beyond the first chunk.
func TestLoadHFStreams(t *testing.T) {
	b := cpu.New(1)
	defer b.Close()
	cfg, err := LoadConfig(filepath.Join("testdata", "qwen2_tied", "config.json"))
	if err != nil {
		t.Fatal(err)
	}
	cfg.VocabSize = 4*initChunk/cfg.HiddenSize + 17
	src, err := New(b, cfg, Options{MaxTokens: 4})
	if err != nil {
		t.Fatal(err)
	}
	defer src.Close()
	src.InitRandom(8)
	want := src.ParamsHost()
	var ts []safetensors.Tensor
	var wte []float32
	for _, p := range src.Table().Params {
		vals := want[p.Offset : p.Offset+p.N]
		if p.Name == "model.embed_tokens.weight" {
			wte = vals
		}
		ts = append(ts, safetensors.Tensor{Spec: safetensors.Spec{Name: p.Name, DType: safetensors.F32, Shape: p.Shape}, F32: vals})
	}
	if len(wte) <= 4*initChunk {
		t.Fatalf("embedding of %d values: the test needs more than four chunks", len(wte))
	}
	spec := ts[0].Spec
	for _, x := range ts {
		if x.Name == "model.embed_tokens.weight" {
			spec = x.Spec
		}
	}
	spec.Name = "lm_head.weight"
	write := func(t *testing.T, head []float32, edit func([]float32)) string {
		emb := slices.Clone(wte)
		if edit != nil {
			edit(emb)
		}
		all := slices.Clone(ts)
		for i := range all {
			if all[i].Name == "model.embed_tokens.weight" {
				all[i].F32 = emb
			}
		}
		all = append(all, safetensors.Tensor{Spec: spec, F32: head})
		dir := t.TempDir()
		if err := safetensors.WriteFile(filepath.Join(dir, "model.safetensors"), all, nil); err != nil {
			t.Fatal(err)
		}
		return dir
	}
	load := func(t *testing.T, dir string) (*Model, uint64, error) {
		m, err := New(b, cfg, Options{MaxTokens: 4})
		if err != nil {
			t.Fatal(err)
		}
		var before, after runtime.MemStats
		runtime.ReadMemStats(&before)
		err = m.LoadHF(dir)
		runtime.ReadMemStats(&after)
		return m, after.TotalAlloc - before.TotalAlloc, err
	}

	m, alloc, err := load(t, write(t, wte, nil))
	if err != nil {
		t.Fatal(err)
	}
	defer m.Close()
	if d := cmp.Diff(want, m.ParamsHost()); d != "" {
		t.Fatalf("loaded weights differ from the saved ones:\n%s", d)
	}
	if limit := uint64(2*initChunk*4 + 2<<20); alloc > limit {
		t.Errorf("LoadHF allocated %d bytes of host memory, want at most %d (embedding: %d bytes)", alloc, limit, 4*len(wte))
	}

	far := 3*initChunk + 5
	head := slices.Clone(wte)
	head[far]++
	m2, _, err := load(t, write(t, head, nil))
	m2.Close()
	if w := fmt.Sprintf("lm_head.weight differs from model.embed_tokens.weight at element %d ", far); err == nil || !strings.Contains(err.Error(), w) {
		t.Errorf("differing head: error %v, want one containing %q", err, w)
	}
	m3, _, err := load(t, write(t, wte, func(e []float32) { e[far] = float32(math.Inf(1)) }))
	m3.Close()
	if w := fmt.Sprintf("model.embed_tokens.weight element %d is +Inf", far); err == nil || !strings.Contains(err.Error(), w) {
		t.Errorf("infinite weight: error %v, want one containing %q", err, w)
	}
}

// FuzzParseConfig: any input is rejected with an error or parses to a valid
// config that survives a JSON round trip.
func FuzzParseConfig(f *testing.F) {
	for _, v := range goldenVariants {
		b, err := os.ReadFile(filepath.Join("testdata", v, "config.json"))
		if err != nil {
			f.Fatal(err)
		}
		f.Add(b)
	}
	for _, v := range longVariants {
		b, err := os.ReadFile(filepath.Join("testdata", v, "config.json"))
		if err != nil {
			f.Fatal(err)
		}
		f.Add(b)
		f.Add(v5Config(f, b)) // the same model as transformers v5 writes it
	}
	published, _ := filepath.Glob(filepath.Join("testdata", "published", "*.json"))
	for _, p := range published {
		b, err := os.ReadFile(p)
		if err != nil {
			f.Fatal(err)
		}
		f.Add(b)
	}
	f.Add([]byte(`{"model_type":"llama","hidden_size":8,"intermediate_size":4,"num_hidden_layers":1,"num_attention_heads":2,"vocab_size":3,"eos_token_id":[1,2]}`))
	for _, c := range configCases {
		f.Add([]byte(c.json))
	}
	f.Fuzz(func(t *testing.T, data []byte) {
		c, err := ParseConfig(data, "fuzz")
		if err != nil {
			return
		}
		if err := c.Validate(); err != nil {
			t.Fatalf("parsed config fails Validate: %v", err)
		}
		out, err := c.JSON("float32")
		if err != nil {
			t.Fatal(err)
		}
		c2, err := ParseConfig(out, "rewritten")
		if err != nil {
			t.Fatalf("rewritten config rejected: %v\n%s", err, out)
		}
		// The rewrite states what the first config left to defaults (RoPE
		// theta, the dtype), so the forms and notes may differ; the model
		// may not, and a second rewrite changes nothing.
		if d := cmp.Diff(c, c2, cmpopts.IgnoreFields(Config{}, "TorchDType", "Extra", "Form", "Notes"), cmpopts.EquateEmpty()); d != "" {
			t.Fatalf("round trip (-first +second):\n%s", d)
		}
		out2, err := c2.JSON("float32")
		if err != nil {
			t.Fatal(err)
		}
		if !bytes.Equal(out, out2) {
			t.Fatalf("config.json is not a fixed point of parse and write:\n%s\n%s", out, out2)
		}
		if c.HeadDim <= 1<<12 && !c.Hybrid() {
			inv := RopeInvFreq(c)
			for i, f := range inv {
				if !(f >= 0) || math.IsInf(float64(f), 0) {
					t.Fatalf("inv_freq[%d] = %g for %+v", i, f, c.RopeScaling)
				}
			}
			if cos, sin := RopeTables(c, 3); len(cos) != 3*c.HeadDim/2 || len(sin) != len(cos) {
				t.Fatalf("RoPE tables of %d and %d values for head_dim %d", len(cos), len(sin), c.HeadDim)
			}
		}
	})
}

// TestForwardMasked: masked positions get 0 and no gradient; the others are
// exactly what the unmasked forward gives.
func TestForwardMasked(t *testing.T) {
	b := cpu.New(2)
	defer b.Close()
	m := loadTestModel(t, "llama_tied", b, Options{MaxTokens: 64, MaxSeqs: 8})
	defer m.Close()
	r := rand.New(rand.NewPCG(8, 9))
	tokens, cu := randomBatch(r, 5, 12, 512)
	need := make([]bool, len(tokens))
	coef := make([]float32, len(tokens))
	masked := make([]float32, len(tokens))
	for i := range need {
		need[i] = r.IntN(2) == 0
		coef[i] = float32(r.NormFloat64())
		if need[i] {
			masked[i] = coef[i]
		}
	}
	full, fullEnt, err := m.Forward(tokens, cu, 1.1)
	if err != nil {
		t.Fatal(err)
	}
	full, fullEnt = slices.Clone(full), slices.Clone(fullEnt)
	m.ZeroGrad()
	if err := m.Backward(masked); err != nil {
		t.Fatal(err)
	}
	want := make([]float32, m.Table().Total)
	b.DownloadF32(want, m.Grads())
	lp, ent, err := m.ForwardMasked(tokens, cu, 1.1, need)
	if err != nil {
		t.Fatal(err)
	}
	for i := range lp {
		wl, we := full[i], fullEnt[i]
		if !need[i] {
			wl, we = 0, 0
		}
		if lp[i] != wl || ent[i] != we {
			t.Fatalf("token %d (need %v): logprob %g entropy %g, want %g %g", i, need[i], lp[i], ent[i], wl, we)
		}
	}
	m.ZeroGrad()
	if err := m.Backward(coef); err != nil { // dlogprob at unneeded positions is ignored
		t.Fatal(err)
	}
	got := make([]float32, m.Table().Total)
	b.DownloadF32(got, m.Grads())
	compareClose(t, "masked gradients", got, want, 0, 0)
}

// TestRecompute: activation recomputation gives bit-identical logprobs,
// entropies, gradients and samples, allocates nothing per step, and uses
// less activation memory.
func TestRecompute(t *testing.T) {
	for _, c := range []struct {
		v    string
		prec kernels.DType
	}{{"qwen3_untied", kernels.F32}, {"llama_tied", kernels.F32}, {"qwen3_untied", kernels.BF16}, {"qwen2_untied", kernels.BF16}} {
		v := c.v
		t.Run(v+"_"+c.prec.String(), func(t *testing.T) {
			b := cpu.New(2)
			defer b.Close()
			plain := loadTestModel(t, v, b, Options{MaxTokens: 64, MaxSeqs: 8, Precision: c.prec})
			defer plain.Close()
			re := loadTestModel(t, v, b, Options{MaxTokens: 64, MaxSeqs: 8, Recompute: true, Precision: c.prec})
			defer re.Close()
			if re.ws.acts.N >= plain.ws.acts.N {
				t.Errorf("recompute activations %d floats, plain %d", re.ws.acts.N, plain.ws.acts.N)
			}
			r := rand.New(rand.NewPCG(11, 12))
			tokens, cu := randomBatch(r, 5, 12, 512)
			coef := make([]float32, len(tokens))
			for i := range coef {
				coef[i] = float32(r.NormFloat64())
			}
			type result struct{ lp, ent, grads []float32 }
			run := func(m *Model) result {
				lp, ent, err := m.Forward(tokens, cu, 0.8)
				if err != nil {
					t.Fatal(err)
				}
				res := result{lp: slices.Clone(lp), ent: slices.Clone(ent), grads: make([]float32, m.Table().Total)}
				m.ZeroGrad()
				if err := m.Backward(coef); err != nil {
					t.Fatal(err)
				}
				b.DownloadF32(res.grads, m.Grads())
				return res
			}
			if d := cmp.Diff(run(plain), run(re), cmp.AllowUnexported(result{})); d != "" {
				t.Fatalf("recompute differs (-plain +recompute):\n%s", d)
			}
			step := func() {
				if _, _, err := re.Forward(tokens, cu, 1); err != nil {
					t.Fatal(err)
				}
				if err := re.Backward(coef); err != nil {
					t.Fatal(err)
				}
			}
			if n := minAllocsPerRun(3, 3, step); n != 0 {
				t.Errorf("recompute step allocates %v times", n)
			}
			sample := func(m *Model) []Sample {
				s, err := NewSampler(m, 4, 20)
				if err != nil {
					t.Fatal(err)
				}
				defer s.Close()
				out, err := s.Sample(testPrompts, SampleOptions{Temperature: 1, MaxNewTokens: 6}, []*rand.Rand{rand.New(rand.NewPCG(1, 1))})
				if err != nil {
					t.Fatal(err)
				}
				return out
			}
			if d := cmp.Diff(sample(plain), sample(re)); d != "" {
				t.Fatalf("samples differ (-plain +recompute):\n%s", d)
			}
		})
	}
}
