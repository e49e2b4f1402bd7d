package model

import (
	"errors"
	"fmt"
	"io"
	"math"
	"math/rand/v2"
	"os"
	"path/filepath"
	"runtime"
	"strings"
	"sync"

	"github.com/tracegrpo/tracegrpo/internal/atomicfile"
	"github.com/tracegrpo/tracegrpo/internal/safetensors"
	"github.com/tracegrpo/tracegrpo/kernels"
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

// InitRandom sets every weight matrix to N(0, InitStd²), every norm weight
// to 1 and every bias to 0, from a PCG seeded with seed (HF's _init_weights
// for these models); a Mamba-2 mixer's A_log, dt_bias and conv weight as
// transformers' NemotronH _init_weights and PyTorch's Conv1d draw them
// (Param.Init), its selection biases 0. It stages initChunk values at a time, in the order the
// generator draws them, so a model of any size needs 4 MiB of host memory
// beyond what its memory plan counts (staging a whole embedding of a
// Llama-3.2-1B held 1 GiB that the plan did not).
func (m *Model) InitRandom(seed uint64) {
	r := rand.New(rand.NewPCG(seed, 0x7472616365677270)) // "tracegrp"
	largest := 0
	for _, p := range m.table.Params {
		largest = max(largest, p.N)
	}
	host := make([]float32, min(largest, initChunk))
	for i, p := range m.table.Params {
		for off := 0; off < p.N; off += len(host) {
			dst := host[:min(len(host), p.N-off)]
			m.initValues(p, off, dst, r)
			m.uploadOwned(i, off, dst)
		}
	}
	m.ParamsChanged()
}

// InitRandomParallel sets the weights as InitRandom's rules do (the same
// distribution of every kind of parameter), drawing each initChunk values
// of a parameter from a PCG of their own (seeded by seed, the parameter's
// index and the chunk's), on every core: the values do not depend on the
// number of cores, and a 1.7B model takes a second on 16 (InitRandom draws
// on one goroutine: 15 to 38 s). The values differ from InitRandom's, whose
// single stream goldens were written from; train bench times on these.
func (m *Model) InitRandomParallel(seed uint64) {
	type chunk struct{ i, off int }
	work := make(chan chunk)
	var wg sync.WaitGroup
	var mu sync.Mutex // uploads, one at a time: a backend's queue is one stream
	for w := 0; w < runtime.GOMAXPROCS(0); w++ {
		wg.Add(1)
		go func() {
			defer wg.Done()
			host := make([]float32, initChunk)
			for c := range work {
				p := m.table.Params[c.i]
				dst := host[:min(initChunk, p.N-c.off)]
				r := rand.New(rand.NewPCG(seed, 0x7472616365677270^(uint64(c.i+1)<<32|uint64(c.off/initChunk))))
				m.initValues(p, c.off, dst, r)
				mu.Lock()
				m.uploadOwned(c.i, c.off, dst)
				mu.Unlock()
			}
		}()
	}
	for i, p := range m.table.Params {
		for off := 0; off < p.N; off += initChunk {
			work <- chunk{i, off}
		}
	}
	close(work)
	wg.Wait()
	m.ParamsChanged()
}

// initValues draws values off..off+len(dst) of parameter p into dst by
// InitRandom's rules, from r.
func (m *Model) initValues(p Param, off int, dst []float32, r *rand.Rand) {
	mc := m.cfg.Mamba
	switch {
	case p.Init == InitALog:
		for i := range dst {
			dst[i] = float32(math.Log(float64(off + i + 1)))
		}
	case p.Init == InitDtBias:
		lmin, lmax := math.Log(mc.TimeStepMin), math.Log(mc.TimeStepMax)
		for i := range dst {
			dt := math.Max(math.Exp(r.Float64()*(lmax-lmin)+lmin), mc.TimeStepFloor)
			dst[i] = float32(dt + math.Log(-math.Expm1(-dt))) // softplus⁻¹(dt)
		}
	case p.Init == InitConv:
		bound := 1 / math.Sqrt(float64(p.Shape[len(p.Shape)-1]))
		for i := range dst {
			dst[i] = float32((2*r.Float64() - 1) * bound)
		}
	case p.Bias || p.Buffer:
		clear(dst)
	case len(p.Shape) == 1:
		for i := range dst {
			dst[i] = 1
		}
	default:
		for i := range dst {
			dst[i] = float32(r.NormFloat64() * InitStd)
		}
	}
}

// uploadOwned uploads the part this rank owns of values off..off+len(dst)
// of parameter i (all of them, unsharded).
func (m *Model) uploadOwned(i, off int, dst []float32) {
	lo, hi, at := m.Owned(i) // a sharded model draws every value and keeps its own
	if a, b := max(off, lo), min(off+len(dst), hi); a < b {
		m.b.UploadF32(m.params.Slice(at+a-lo, b-a), dst[a-off:b-off])
	}
}

// initChunk is how many values InitRandom stages at a time (4 MiB).
const initChunk = 1 << 20

// ParamsHost downloads the parameter arena (a sharded model's shard
// arena).
func (m *Model) ParamsHost() []float32 {
	host := make([]float32, m.params.N)
	m.b.DownloadF32(host, m.params)
	return host
}

// SetParamsHost uploads a whole parameter arena (a sharded model's shard
// arena).
func (m *Model) SetParamsHost(host []float32) error {
	if len(host) != m.params.N {
		return fmt.Errorf("model: %d parameters given, the arena holds %d", len(host), m.params.N)
	}
	m.b.UploadF32(m.params, host)
	m.ParamsChanged()
	return nil
}

// ignoredTensor reports HF tensors that carry no weights of the model (old
// Llama checkpoints store the rotary inverse frequencies) or that
// transformers does not load: a Nemotron-H checkpoint's multi-token
// prediction layers (NemotronHPreTrainedModel's
// _keys_to_ignore_on_load_unexpected, mtp.*).
func (m *Model) ignoredTensor(name string) bool {
	return strings.HasSuffix(name, ".rotary_emb.inv_freq") || (m.cfg.Hybrid() && strings.HasPrefix(name, "mtp."))
}

// LoadHF reads dir/model.safetensors (or the shards of
// dir/model.safetensors.index.json), converting F32, BF16 or F16 to the
// fp32 parameter arena one tensor at a time. Every parameter must be present
// with its exact shape and finite values; a tensor the model has no place for
// is an error (for a tied model, a stored lm_head.weight must equal the
// embedding). A sparse layer's experts may be stored per expert
// (mlp.experts.N.{gate,up,down}_proj.weight, the Hub's layout) or fused as
// transformers v5 holds them (mlp.experts.gate_up_proj (E, 2·Im, C), gate
// rows first, and mlp.experts.down_proj (E, C, Im)); one layer holds one
// layout. The checks run before anything is uploaded; after a read error
// the parameters are unspecified.
func (m *Model) LoadHF(dir string) error {
	set, err := safetensors.OpenDir(dir)
	if err != nil {
		return fmt.Errorf("model: load %s: %w", dir, err)
	}
	defer set.Close()
	srcs, used, err := m.sources(set)
	if err != nil {
		return err
	}
	largest := 0
	for _, p := range m.table.Params {
		largest = max(largest, p.N)
	}
	tiedHead := false
	for _, ti := range set.Tensors() {
		if _, ok := m.table.Lookup(ti.Name); ok || used[ti.Name] || m.ignoredTensor(ti.Name) {
			continue
		}
		if ti.Name == "lm_head.weight" && m.cfg.TieWordEmbeddings {
			wte, _ := m.table.Lookup("model.embed_tokens.weight")
			if !equalShape(ti.Shape, wte.Shape) {
				return fmt.Errorf("model: load %s: tensor lm_head.weight of a tied model: expected shape %v, found %v", set.Source(), wte.Shape, ti.Shape)
			}
			tiedHead = true
			continue
		}
		return fmt.Errorf("model: load %s: unexpected tensor %s (shape %v): this %s config.json has no such parameter", set.Source(), ti.Name, ti.Shape, m.cfg.Arch)
	}
	// Tensors stream through initChunk-sized buffers: a model needs 8 MiB of
	// host memory beyond its plan, not its largest tensor (twice over for a
	// tied head checked against the embedding).
	host := make([]float32, min(largest, initChunk))
	var head []float32
	if tiedHead {
		head = make([]float32, len(host))
	}
	for i, p := range m.table.Params {
		src := srcs[i]
		lo, hi, at := m.Owned(i) // a sharded model reads the ranges it holds
		for off := lo; off < hi; off += len(host) {
			buf := host[:min(len(host), hi-off)]
			if err := set.ReadF32At(src.tensor, src.off+off, buf); err != nil {
				return fmt.Errorf("model: load: %w", err)
			}
			for j, x := range buf {
				if math.IsNaN(float64(x)) || math.IsInf(float64(x), 0) {
					return fmt.Errorf("model: load %s: tensor %s element %d is %g", set.Source(), src.tensor, src.off+off+j, x)
				}
			}
			if tiedHead && p.Name == "model.embed_tokens.weight" {
				h := head[:len(buf)]
				if err := set.ReadF32At("lm_head.weight", off, h); err != nil {
					return fmt.Errorf("model: load: %w", err)
				}
				for j, x := range h {
					if x != buf[j] {
						return fmt.Errorf("model: load %s: tie_word_embeddings is true but lm_head.weight differs from model.embed_tokens.weight at element %d (%g vs %g)", set.Source(), off+j, x, buf[j])
					}
				}
			}
			m.b.UploadF32(m.params.Slice(at+off-lo, len(buf)), buf)
			m.ParamsChanged()
		}
	}
	if err := m.b.Sync(); err != nil {
		return fmt.Errorf("model: load: %w", err)
	}
	return nil
}

// source is where a parameter's values are stored in a checkpoint: a
// tensor, from element off on (an expert's slice of a fused v5 tensor).
type source struct {
	tensor string
	off    int
}

// Names of transformers v5's fused expert tensors of layer prefix p.
func fusedGateUp(p string) string { return p + "mlp.experts.gate_up_proj" }
func fusedDown(p string) string   { return p + "mlp.experts.down_proj" }

// sources finds every parameter's values in set, checking shapes and
// dtypes, and returns the fused tensors it reads from.
func (m *Model) sources(set *safetensors.Set) ([]source, map[string]bool, error) {
	srcs := make([]source, len(m.table.Params))
	used := map[string]bool{}
	check := func(name string, ti safetensors.TensorInfo, shape []int) error {
		if !equalShape(ti.Shape, shape) {
			return fmt.Errorf("model: load %s: tensor %s: expected shape %v from config.json, found %v", set.Source(), name, shape, ti.Shape)
		}
		if !ti.DType.Float() {
			return fmt.Errorf("model: load %s: tensor %s: expected dtype F32, BF16 or F16, found %s", set.Source(), name, ti.DType)
		}
		return nil
	}
	for i, p := range m.table.Params {
		name := p.Name
		if _, ok := set.Tensor(name); !ok && m.cfg.Hybrid() && strings.HasPrefix(name, "backbone.") {
			name = "model." + strings.TrimPrefix(name, "backbone.") // transformers' in-memory name
		}
		if ti, ok := set.Tensor(name); ok {
			if err := check(name, ti, p.Shape); err != nil {
				return nil, nil, err
			}
			srcs[i] = source{tensor: name}
			used[name] = true
		}
	}
	if m.cfg.Hybrid() {
		if err := m.stackedExperts(set, srcs, used, check); err != nil {
			return nil, nil, err
		}
	}
	C, E, Im := m.cfg.HiddenSize, m.cfg.MoE.NumExperts, m.cfg.MoE.IntermediateSize
	for l, li := range m.lidx {
		if li.router < 0 || m.cfg.Hybrid() {
			continue
		}
		p := fmt.Sprintf("model.layers.%d.", l)
		gu, hasGU := set.Tensor(fusedGateUp(p))
		dn, hasDown := set.Tensor(fusedDown(p))
		perExpert := false
		for i := li.eguFirst; i <= li.eguLast; i++ {
			perExpert = perExpert || srcs[i].tensor != ""
		}
		for i := li.edownFirst; i <= li.edownLast; i++ {
			perExpert = perExpert || srcs[i].tensor != ""
		}
		if (hasGU || hasDown) && perExpert {
			return nil, nil, fmt.Errorf("model: load %s: layer %d stores its experts both per expert (mlp.experts.N.*_proj.weight) and fused (%s, %s): expected one layout", set.Source(), l, fusedGateUp(p), fusedDown(p))
		}
		if hasGU {
			if err := check(fusedGateUp(p), gu, []int{E, 2 * Im, C}); err != nil {
				return nil, nil, err
			}
			used[gu.Name] = true
			for i := li.eguFirst; i <= li.eguLast; i++ {
				k := i - li.eguFirst // expert k/2, gate (even) then up
				srcs[i] = source{tensor: gu.Name, off: (k/2)*2*Im*C + (k%2)*Im*C}
			}
		}
		if hasDown {
			if err := check(fusedDown(p), dn, []int{E, C, Im}); err != nil {
				return nil, nil, err
			}
			used[dn.Name] = true
			for i := li.edownFirst; i <= li.edownLast; i++ {
				srcs[i] = source{tensor: dn.Name, off: (i - li.edownFirst) * C * Im}
			}
		}
	}
	for i, p := range m.table.Params {
		if srcs[i].tensor != "" {
			continue
		}
		if l, ok := expertLayer(m.lidx, i); ok && m.cfg.Hybrid() {
			return nil, nil, fmt.Errorf("model: load %s: tensor %s is missing (expected shape %v for this config.json; or transformers' stacked backbone.layers.%d.mixer.experts.up_proj and down_proj)",
				set.Source(), p.Name, p.Shape, l)
		} else if ok {
			pre := fmt.Sprintf("model.layers.%d.", l)
			return nil, nil, fmt.Errorf("model: load %s: tensor %s is missing (expected shape %v for this config.json; or transformers v5's fused %s and %s)",
				set.Source(), p.Name, p.Shape, fusedGateUp(pre), fusedDown(pre))
		}
		return nil, nil, fmt.Errorf("model: load %s: tensor %s is missing (expected shape %v for this config.json)", set.Source(), p.Name, p.Shape)
	}
	return srcs, used, nil
}

// stackedExperts finds a hybrid model's experts stored as transformers
// holds them in memory (NemotronHExperts: mixer.experts.up_proj
// (E, Im, In) and mixer.experts.down_proj (E, In, Im), under backbone. or
// model.); a block holds one layout.
func (m *Model) stackedExperts(set *safetensors.Set, srcs []source, used map[string]bool,
	check func(string, safetensors.TensorInfo, []int) error) error {
	E, Im, In := m.cfg.MoE.NumExperts, m.cfg.MoE.IntermediateSize, m.cfg.expertIn()
	for l, li := range m.lidx {
		if li.router < 0 {
			continue
		}
		for _, pre := range []string{"backbone.", "model."} {
			up, hasUp := set.Tensor(fmt.Sprintf("%slayers.%d.mixer.experts.up_proj", pre, l))
			dn, hasDown := set.Tensor(fmt.Sprintf("%slayers.%d.mixer.experts.down_proj", pre, l))
			if !hasUp && !hasDown {
				continue
			}
			for i := li.eguFirst; i <= li.edownLast; i++ {
				if srcs[i].tensor != "" {
					return fmt.Errorf("model: load %s: block %d stores its experts both per expert (mixer.experts.N.*_proj.weight) and stacked (mixer.experts.up_proj, down_proj): expected one layout", set.Source(), l)
				}
			}
			if !hasUp || !hasDown {
				return fmt.Errorf("model: load %s: block %d stores its experts stacked but has only one of %sLAYER.mixer.experts.up_proj and down_proj", set.Source(), l, pre)
			}
			if err := check(up.Name, up, []int{E, Im, In}); err != nil {
				return err
			}
			if err := check(dn.Name, dn, []int{E, In, Im}); err != nil {
				return err
			}
			used[up.Name], used[dn.Name] = true, true
			for i := li.eguFirst; i <= li.eguLast; i++ {
				srcs[i] = source{tensor: up.Name, off: (i - li.eguFirst) * Im * In}
			}
			for i := li.edownFirst; i <= li.edownLast; i++ {
				srcs[i] = source{tensor: dn.Name, off: (i - li.edownFirst) * In * Im}
			}
		}
	}
	return nil
}

// expertLayer returns the layer of an expert weight's table index.
func expertLayer(lidx []layerIdx, i int) (int, bool) {
	for l, li := range lidx {
		if li.router >= 0 && ((i >= li.eguFirst && i <= li.eguLast) || (i >= li.edownFirst && i <= li.edownLast)) {
			return l, true
		}
	}
	return 0, false
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
	return m.SaveHFWith(dir, dtype, nil)
}

// SaveHFWith is SaveHFAs with meta as the file's __metadata__ (nil: format
// "pt" with FormatName and FormatVersion), for a checkpoint's own. A sharded
// model's save is a collective (see WriteHF): every rank calls it, and rank
// 0 writes the files.
func (m *Model) SaveHFWith(dir string, dtype safetensors.DType, meta map[string]string) error {
	torchName, err := torchDType(dtype)
	if err != nil {
		return err
	}
	rank0 := m.fs == nil || m.fs.sh.Rank == 0
	var f *atomicfile.File
	var werr error // rank 0's own failure: under sharding it keeps gathering with the others
	if rank0 {
		if werr = os.MkdirAll(dir, 0o755); werr == nil {
			f, werr = atomicfile.Create(filepath.Join(dir, safetensors.SingleFileName))
		}
	}
	if werr != nil && m.fs == nil {
		return fmt.Errorf("model: save: %w", werr)
	}
	var w io.Writer
	if f != nil {
		defer f.Abort()
		w = f
	}
	err = errors.Join(werr, m.WriteHF(w, dtype, meta))
	if err == nil && f != nil {
		err = f.Commit()
	}
	if err != nil {
		return fmt.Errorf("model: save: %w", err)
	}
	if !rank0 {
		return nil
	}
	cfgJSON, err := m.cfg.JSON(torchName)
	if err != nil {
		return err
	}
	if err := atomicfile.WriteFile(filepath.Join(dir, "config.json"), cfgJSON); err != nil {
		return fmt.Errorf("model: %w", err)
	}
	return nil
}

// HFConfigJSON is the config.json of the model's weights saved in dtype
// (its torch_dtype), as SaveHFAs writes it.
func (m *Model) HFConfigJSON(dtype safetensors.DType) ([]byte, error) {
	torchName, err := torchDType(dtype)
	if err != nil {
		return nil, err
	}
	return m.cfg.JSON(torchName)
}

func torchDType(dtype safetensors.DType) (string, error) {
	torchName := map[safetensors.DType]string{safetensors.F32: "float32", safetensors.BF16: "bfloat16", safetensors.F16: "float16"}[dtype]
	if torchName == "" {
		return "", fmt.Errorf("model: save: dtype %s: expected F32, BF16 or F16", dtype)
	}
	return torchName, nil
}

// WriteHF streams the weights to out as one safetensors file: HF names,
// rounded to dtype (F32, BF16 or F16), with meta as its __metadata__ (nil:
// format "pt" with FormatName and FormatVersion). One tensor, or one chunk
// of one, is on the host at a time.
//
// For a sharded model it is a collective: every rank calls it, and the ranks
// gather one group at a time, in the file's tensor order, while rank 0
// streams each tensor into out (the other ranks pass nil), so no rank holds
// more than one group. The bytes are those a model holding every weight
// writes. A rank 0 with a nil out (it could not open its file) still takes
// part in every gather, so that no rank waits for it.
func (m *Model) WriteHF(out io.Writer, dtype safetensors.DType, meta map[string]string) error {
	if _, err := torchDType(dtype); err != nil {
		return err
	}
	if meta == nil {
		meta = map[string]string{"format": "pt", "tracegrpo_format": FormatName, "tracegrpo_format_version": FormatVersion}
	}
	specs := m.saveSpecs(dtype)
	if m.fs != nil {
		return m.writeSharded(out, specs, meta)
	}
	w, err := safetensors.NewWriter(out, specs, meta)
	if err != nil {
		return err
	}
	largest := 0
	for _, p := range m.table.Params {
		largest = max(largest, p.N)
	}
	host := make([]float32, largest)
	for _, t := range w.Tensors() {
		p, _ := m.table.Lookup(t.Name)
		m.b.DownloadF32(host[:p.N], m.params.Slice(p.Offset, p.N))
		if err := m.b.Sync(); err != nil {
			return err
		}
		if err := w.WriteF32(t.Name, host[:p.N]); err != nil {
			return err
		}
	}
	return w.Close()
}

// saveSpecs are the tensors WriteHF writes: every parameter in dtype, the
// buffers (Nemotron-H's e_score_correction_bias) in fp32 whatever it is,
// as transformers keeps them (_keep_in_fp32_modules_strict).
func (m *Model) saveSpecs(dtype safetensors.DType) []safetensors.Spec {
	specs := make([]safetensors.Spec, len(m.table.Params))
	for i, p := range m.table.Params {
		dt := dtype
		if p.Buffer {
			dt = safetensors.F32
		}
		specs[i] = safetensors.Spec{Name: p.Name, DType: dt, Shape: p.Shape}
	}
	return specs
}

// writeSharded is WriteHF of a sharded model.
func (m *Model) writeSharded(out io.Writer, specs []safetensors.Spec, meta map[string]string) error {
	rank0 := m.fs.sh.Rank == 0
	order, err := safetensors.NewWriter(io.Discard, specs, meta)
	if err != nil {
		return err
	}
	var groups []int
	var runs [][]int
	for _, t := range order.Tensors() {
		i := m.table.byName[t.Name]
		g := m.table.Params[i].Group
		if len(groups) == 0 || groups[len(groups)-1] != g {
			groups, runs = append(groups, g), append(runs, nil)
		}
		runs[len(runs)-1] = append(runs[len(runs)-1], i)
	}
	var w *safetensors.Writer
	var werr error // rank 0's own failure: it keeps gathering with the others
	var host []float32
	if rank0 && out != nil {
		w, werr = safetensors.NewWriter(out, specs, meta)
		host = make([]float32, initChunk)
	}
	k := 0
	err = m.gatherGroups(groups, func(g int, mat, vec kernels.Buf) {
		run := runs[k]
		k++
		if w == nil || werr != nil {
			return
		}
		for _, i := range run {
			p := m.table.Params[i]
			src := mat
			if p.Flat == FlatVector {
				src = vec
			}
			for off := 0; off < p.N && werr == nil; off += len(host) {
				n := min(len(host), p.N-off)
				m.b.DownloadF32(host[:n], src.Slice(p.FlatOffset+off, n))
				if werr = m.b.Sync(); werr == nil {
					werr = w.WriteF32(p.Name, host[:n])
				}
			}
		}
	})
	if err == nil && werr == nil && w != nil {
		werr = w.Close()
	}
	return errors.Join(err, werr)
}
