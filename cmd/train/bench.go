package main

import (
	"encoding/json"
	"fmt"
	"io"
	"math/rand/v2"
	"runtime"
	"sort"
	"strconv"
	"time"

	"github.com/tracegrpo/tracegrpo/collective"
	"github.com/tracegrpo/tracegrpo/internal/checked"
	"github.com/tracegrpo/tracegrpo/internal/meminfo"
	"github.com/tracegrpo/tracegrpo/kernels"
	"github.com/tracegrpo/tracegrpo/kernels/cpu"
	"github.com/tracegrpo/tracegrpo/kernels/cuda"
	"github.com/tracegrpo/tracegrpo/model"
	"github.com/tracegrpo/tracegrpo/optim"
	"github.com/tracegrpo/tracegrpo/trainer"
)

func init() {
	register(command{
		name:    "bench",
		summary: "time forward + backward + AdamW of a model on random tokens",
		run:     runBench,
	})
}

// benchResult is the JSON line bench prints.
type benchResult struct {
	Backend     string  `json:"backend"`
	Threads     int     `json:"threads,omitempty"`
	Model       string  `json:"model"`
	Params      int     `json:"params"`
	Rows        int     `json:"rows"`
	Seq         int     `json:"seq"`
	Steps       int     `json:"steps"`
	Recompute   bool    `json:"recompute"`
	Ranks       int     `json:"ranks,omitempty"`
	Sharded     bool    `json:"sharded,omitempty"`
	MsPerStep   float64 `json:"ms_per_step"`
	MsMin       float64 `json:"ms_min"`
	TokensPerS  float64 `json:"tokens_per_s"`
	PeakRSSMiB  float64 `json:"peak_rss_mib,omitempty"`
	PlanMiB     float64 `json:"plan_mib"` // train plan's total for this shape
	Precision   string  `json:"precision"`
	FinalLogp   float64 `json:"mean_logprob_last_step"`
	WeightsFrom string  `json:"weights"`
	// With several ranks: every rank's peak RSS and plan (rank order), and
	// with --shard full the bytes one step's collectives moved on a rank
	// (gathered flats, reduce-scattered gradients: model.CommStats).
	PeakRSSRanksMiB []float64 `json:"peak_rss_ranks_mib,omitempty"`
	PlanRanksMiB    []float64 `json:"plan_ranks_mib,omitempty"`
	CommGatherMiB   float64   `json:"comm_gather_mib_per_step,omitempty"`
	CommReduceMiB   float64   `json:"comm_reduce_scatter_mib_per_step,omitempty"`
	ModelStateMiB   float64   `json:"model_state_mib,omitempty"`
	CommBuffersMiB  float64   `json:"comm_buffers_mib,omitempty"`
}

func runBench(args []string, stdout, stderr io.Writer) error {
	fs := newFlags("bench", "train bench --model CONFIG.json (--rows R --seq T | --tree P,K,S [--shared-prefix auto|off|both]) [--steps N] [--backend B]", stdout)
	cfgPath := fs.String("model", "", "HF config.json of the model to time")
	rows := fs.Int("rows", 8, "packed sequences per step")
	seq := fs.Int("seq", 256, "tokens per sequence")
	steps := fs.Int("steps", 5, "timed steps (after one warm-up step); the median is reported")
	backend := fs.String("backend", "cpu", "cpu or cuda")
	threads := fs.Int("threads", 0, "CPU threads (0: all)")
	weights := fs.String("weights", "", "load HF weights from this directory instead of random ones")
	profile := fs.Bool("profile", false, "print time per op to stderr")
	recompute := fs.Bool("recompute", false, "recompute layer activations in the backward pass (activation checkpointing)")
	precision := fs.String("precision", "float32", "float32, or bfloat16: mixed precision (cuda; the CPU computes in fp32 and says so)")
	seed := fs.Uint64("seed", 1, "seed of the random weights and tokens")
	distMode := fs.String("dist", "auto", "data parallel under torchrun/srun/mpirun: the rows are split among the ranks and the gradients all-reduced (auto, none, mpi, nccl)")
	shard := fs.String("shard", "none", "full: shard the weights, gradients and Adam moments over the ranks (fully sharded data parallel); none: every rank holds the whole model")
	noReshard := false
	rf := fs.VarPF(newNegBool(&noReshard), "reshard-after-forward", "", "with --shard full: gather each layer again for its backward (false: keep every layer gathered)")
	rf.NoOptDefVal, rf.DefValue = "true", "true"
	lr := fs.Float64("lr", 1e-6, "AdamW's learning rate (weight decay 0.01 on matrices, betas 0.9/0.999, no clipping)")
	eps := fs.Float64("eps", 1e-8, "AdamW's eps")
	save := fs.String("save", "", "write the final weights as Hugging Face safetensors into this directory (with --shard full the ranks stream them through rank 0)")
	tree := fs.String("tree", "", "time a tree of traces instead of random rows: P,K,S is a GRPO group (K responses of S tokens sharing a P-token prompt); "+
		"P,K1,S1,K2,S2,... nests levels (an agent's turns, each branching K ways). The responses carry the loss; see --shared-prefix")
	shared := fs.String("shared-prefix", "both", "with --tree: auto packs the traces as token tries (every shared prefix computed once), off packs each trace as its own sequence, "+
		"both times off then auto in the same process and prints their ratio")
	mbTokens := fs.Int("mb-tokens", 0, "with --tree: computed tokens per micro-batch, the same for both modes (0: the whole trie's, so that auto needs one micro-batch)")
	if err := parseFlags(fs, args, 0); err != nil {
		return err
	}
	if *cfgPath == "" || *rows <= 0 || *seq <= 0 || *steps <= 0 || *mbTokens < 0 {
		return fmt.Errorf("%w: bench needs --model and positive --rows, --seq, --steps", errUsage)
	}
	if T, ok := checked.Mul(int64(*rows), int64(*seq)); !ok || T > model.MaxTokens {
		return fmt.Errorf("%w: bench: --rows %d × --seq %d tokens: more than %d in one step (token positions and offsets are int32)", errUsage, *rows, *seq, model.MaxTokens)
	}
	if *shard != "full" && *shard != "none" {
		return fmt.Errorf("%w: bench: --shard %q: want full or none", errUsage, *shard)
	}
	var modes []string
	switch *shared {
	case "both":
		modes = []string{"off", "auto"}
	case "auto", "off":
		modes = []string{*shared}
	default:
		return fmt.Errorf("%w: bench: --shared-prefix %q: want auto, off or both", errUsage, *shared)
	}
	if *tree == "" && (fs.Changed("shared-prefix") || fs.Changed("mb-tokens")) {
		return fmt.Errorf("%w: bench: --shared-prefix and --mb-tokens go with --tree", errUsage)
	}
	if *precision != "float32" && *precision != "bfloat16" {
		return fmt.Errorf("%w: bench: --precision %q: want float32 or bfloat16", errUsage, *precision)
	}
	cfg, err := model.LoadConfig(*cfgPath)
	if err != nil {
		return fmt.Errorf("bench: %w", err)
	}
	l, err := detectLaunch(*distMode)
	if err != nil {
		return fmt.Errorf("bench: %w", err)
	}
	if l.note != "" && l.Rank == 0 {
		fmt.Fprintf(stderr, "bench: %s\n", l.note)
	}
	if *rows < l.Size {
		return fmt.Errorf("%w: bench: --rows %d for %d ranks: every rank needs a row", errUsage, *rows, l.Size)
	}
	if l.Rank != 0 {
		stdout, stderr = io.Discard, io.Discard
	}
	for _, n := range cfg.Notes {
		fmt.Fprintf(stderr, "bench: note: %s\n", n)
	}
	var be kernels.Backend
	res := benchResult{Backend: *backend, Model: *cfgPath, Rows: *rows, Seq: *seq, Steps: *steps, Recompute: *recompute, WeightsFrom: "random"}
	switch *backend {
	case "cpu":
		c := cpu.New(l.threadsPerRank(*threads))
		defer c.Close()
		be, res.Threads = c, c.Threads()
	case "cuda":
		if be, err = cuda.Open(cuda.Options{Device: l.LocalRank}); err != nil {
			return fmt.Errorf("bench: %w", err)
		}
		if c, ok := be.(interface{ Close() error }); ok {
			defer c.Close()
		}
	default:
		return fmt.Errorf("%w: --backend: expected cpu or cuda, found %q", errUsage, *backend)
	}
	if err := l.openComm(*distMode, be); err != nil {
		return fmt.Errorf("bench: %w", err)
	}
	defer l.close()
	res.Ranks = l.Size
	if *tree != "" {
		if l.Size > 1 {
			return fmt.Errorf("%w: bench: --tree runs in one process (%d ranks)", errUsage, l.Size)
		}
		a := treeBenchArgs{spec: *tree, modes: modes, mbTokens: *mbTokens, steps: *steps, seed: *seed, lr: *lr, eps: *eps, recompute: *recompute,
			prec: kernels.F32, precisionName: "float32", cfg: cfg, cfgPath: *cfgPath, weights: *weights, be: be, threads: res.Threads,
			stdout: stdout, stderr: stderr}
		if *precision == "bfloat16" {
			if be.Name() == "cuda" {
				a.prec, a.precisionName = kernels.BF16, "bfloat16"
			} else {
				fmt.Fprintf(stderr, "bench: note: --precision bfloat16: the %s backend computes in fp32 (mixed precision runs on cuda)\n", be.Name())
			}
		}
		if *profile {
			return fmt.Errorf("%w: bench: --profile times rows × seq steps; it does not go with --tree", errUsage)
		}
		return runTreeBench(a)
	}
	var prof *timedBackend
	if *profile {
		prof = newTimedBackend(be)
		be = prof
	}
	// This rank's share of the rows (all of them for one process).
	lo, hi := collective.Block(*rows, l.Rank, l.Size)
	myRows := hi - lo
	T := myRows * *seq
	opt := model.Options{MaxTokens: T, MaxSeqs: myRows, Recompute: *recompute, Precision: kernels.F32}
	res.Precision = "float32"
	if *precision == "bfloat16" {
		if be.Name() == "cuda" {
			opt.Precision, res.Precision = kernels.BF16, "bfloat16"
		} else {
			fmt.Fprintf(stderr, "bench: note: --precision bfloat16: the %s backend computes in fp32 (mixed precision runs on cuda)\n", be.Name())
		}
	}
	sharded := *shard == "full"
	comm := l.comm
	if comm == nil {
		comm = collective.Single(be)
	}
	res.Sharded = sharded
	plan, err := trainer.PlanModelRun(trainer.PlanSpec{
		Request: trainer.PlanRequest{Model: cfg, ModelName: *cfgPath, Backend: be.Name(), Rows: myRows,
			Workspace: trainer.WorkspacePlanner(be), World: l.Size, Shard: sharded, NoReshard: noReshard},
		Options: opt, Optimizer: true,
		Shrink: map[string][]string{"activations": {"--rows", "--seq", "--recompute"}, "workspace": {"--rows", "--seq"},
			"weights": {"a smaller --model"}, "gradients": {"a smaller --model"}, "adam_moments": {"a smaller --model"}},
	})
	if err != nil {
		return fmt.Errorf("bench: %w", err)
	}
	if err := trainer.CheckFree(plan, be); err != nil {
		return fmt.Errorf("bench: %w", err)
	}
	res.PlanMiB = float64(plan.TotalBytes) / (1 << 20)
	var m *model.Model
	if sharded {
		m, err = model.NewSharded(be, cfg, opt, model.ShardOptions{Comm: comm, ReshardAfterForward: !noReshard})
	} else {
		m, err = model.New(be, cfg, opt)
	}
	if err != nil {
		return fmt.Errorf("bench: %w", err)
	}
	defer m.Close()
	res.Params = m.Table().Total
	if *weights != "" {
		if err := m.LoadHF(*weights); err != nil {
			return fmt.Errorf("bench: %w", err)
		}
		res.WeightsFrom = *weights
	} else {
		m.InitRandom(*seed)
	}
	opts, err := benchOptimizer(be, m, comm, sharded, *eps)
	if err != nil {
		return fmt.Errorf("bench: %w", err)
	}
	defer opts.Close()
	// The step's tokens and dL/dlogprob for every row, drawn the same on
	// every rank; this rank takes its block of rows.
	r := rand.New(rand.NewPCG(*seed, 2))
	all := *rows * *seq
	tokens := make([]int32, all)
	for i := range tokens {
		tokens[i] = int32(r.IntN(cfg.VocabSize))
	}
	dl := make([]float32, all)
	for i := range dl {
		dl[i] = float32(r.NormFloat64()) / float32(all)
	}
	tokens, dl = tokens[lo**seq:hi**seq], dl[lo**seq:hi**seq]
	cu := make([]int32, myRows+1)
	for s := range cu {
		cu[s] = int32(s * *seq)
	}
	var lastMean float64
	step := func(n int) error {
		m.ZeroGrad()
		lp, _, err := m.Forward(tokens, cu, 1)
		if err != nil {
			return err
		}
		lastMean = 0
		for _, x := range lp {
			lastMean += float64(x)
		}
		lastMean /= float64(len(lp))
		if err := m.Backward(dl); err != nil {
			return err
		}
		if l.comm != nil && l.Size > 1 && !sharded {
			if err := l.comm.AllReduceSum(m.Grads()); err != nil {
				return err
			}
		}
		if _, err := opts.Step(*lr, 0.01); err != nil {
			return err
		}
		m.ParamsChanged()
		return be.Sync()
	}
	if err := step(1); err != nil {
		return fmt.Errorf("bench: warm-up step: %w", err)
	}
	if prof != nil {
		prof.reset()
	}
	before := m.CommStats()
	times := make([]float64, *steps)
	for i := range times {
		t0 := time.Now()
		if err := step(i + 2); err != nil {
			return fmt.Errorf("bench: step %d: %w", i+1, err)
		}
		times[i] = float64(time.Since(t0).Nanoseconds()) / 1e6
	}
	sorted := append([]float64(nil), times...)
	sort.Float64s(sorted)
	med := sorted[len(sorted)/2]
	if len(sorted)%2 == 0 {
		med = (sorted[len(sorted)/2-1] + sorted[len(sorted)/2]) / 2
	}
	res.MsPerStep, res.MsMin = med, sorted[0]
	res.TokensPerS = float64(*rows**seq) / (med / 1e3) // every rank's tokens
	res.PeakRSSMiB = peakRSSMiB()
	res.FinalLogp = lastMean
	if sharded {
		after := m.CommStats()
		res.CommGatherMiB = float64(after.GatherBytes-before.GatherBytes) / float64(*steps) / (1 << 20)
		res.CommReduceMiB = float64(after.ReduceScatterBytes-before.ReduceScatterBytes) / float64(*steps) / (1 << 20)
	}
	for _, c := range plan.Components {
		switch c.Name {
		case "weights", "weights_bf16", "gradients", "adam_moments":
			res.ModelStateMiB += float64(c.Bytes) / (1 << 20)
		case "gathered_weights", "gradient_reduce":
			res.CommBuffersMiB += float64(c.Bytes) / (1 << 20)
		}
	}
	if *save != "" {
		if err := m.SaveHF(*save); err != nil {
			return fmt.Errorf("bench: save: %w", err)
		}
	}
	if l.Size > 1 {
		// Every rank's peak RSS, for the memory plan's check per rank.
		mine := []byte(strconv.FormatFloat(peakRSSMiB(), 'f', 3, 64) + " " + strconv.FormatFloat(res.PlanMiB, 'f', 3, 64))
		all, err := collective.GatherBytes(comm, be, mine)
		if err != nil {
			return fmt.Errorf("bench: %w", err)
		}
		for _, b := range all {
			var rss, plan float64
			fmt.Sscan(string(b), &rss, &plan)
			res.PeakRSSRanksMiB = append(res.PeakRSSRanksMiB, rss)
			res.PlanRanksMiB = append(res.PlanRanksMiB, plan)
		}
	}
	if prof != nil {
		prof.report(stderr, *steps, sumOf(times))
	}
	b, _ := json.Marshal(res)
	fmt.Fprintln(stdout, string(b))
	return nil
}

func sumOf(x []float64) float64 {
	var s float64
	for _, v := range x {
		s += v
	}
	return s
}

// benchOptimizer is AdamW (weight decay on matrices, none on norm
// weights; no clipping) over the model's arenas, or its shard.
func benchOptimizer(be kernels.Backend, m *model.Model, comm collective.Comm, sharded bool, eps float64) (*optim.AdamW, error) {
	cfg := optim.Config{Beta1: 0.9, Beta2: 0.999, Eps: eps}
	tab := m.Table()
	var groups []optim.Group
	if !sharded {
		for _, p := range tab.Params {
			groups = append(groups, optim.Group{Off: p.Offset, N: p.N, Decay: p.Decay})
		}
		return optim.New(be, m.Params(), m.Grads(), groups, cfg)
	}
	var ids []int
	for _, pc := range m.Sharding().Pieces(tab) {
		groups = append(groups, optim.Group{Off: pc.At, N: pc.Hi - pc.Lo, Decay: tab.Params[pc.Param].Decay})
		ids = append(ids, pc.Param)
	}
	return optim.NewSharded(be, m.Params(), m.Grads(), groups, cfg, optim.Sharded{Comm: comm, IDs: len(tab.Params), GroupID: ids})
}

// peakRSSMiB reads VmHWM from /proc/self/status (0 where unavailable).
func peakRSSMiB() float64 {
	_, peak, _ := meminfo.Self()
	return float64(peak) / (1 << 20)
}

// opStat accumulates one op's calls and time.
type opStat struct {
	calls int
	dur   time.Duration
}

// timedBackend wraps a backend and times every op (syncing after each so a
// device backend's time lands on the op that spent it).
type timedBackend struct {
	kernels.Backend
	stats map[string]*opStat
	err   error
}

// Unwrap returns the backend being timed (its memory plan and free memory
// are the wrapped backend's).
func (p *timedBackend) Unwrap() kernels.Backend { return p.Backend }

func newTimedBackend(b kernels.Backend) *timedBackend {
	return &timedBackend{Backend: b, stats: map[string]*opStat{}}
}

func (p *timedBackend) reset() { p.stats = map[string]*opStat{} }

func (p *timedBackend) time(name string, f func()) {
	t0 := time.Now()
	f()
	if err := p.Backend.Sync(); err != nil && p.err == nil {
		p.err = err
	}
	s := p.stats[name]
	if s == nil {
		s = &opStat{}
		p.stats[name] = s
	}
	s.calls++
	s.dur += time.Since(t0)
}

// Sync returns an error the timing syncs collected first.
func (p *timedBackend) Sync() error {
	if p.err != nil {
		err := p.err
		p.err = nil
		return err
	}
	return p.Backend.Sync()
}

func (p *timedBackend) report(w io.Writer, steps int, totalMs float64) {
	names := make([]string, 0, len(p.stats))
	var opMs float64
	for n, s := range p.stats {
		names = append(names, n)
		opMs += float64(s.dur.Microseconds()) / 1e3
	}
	sort.Slice(names, func(i, j int) bool { return p.stats[names[i]].dur > p.stats[names[j]].dur })
	fmt.Fprintf(w, "%-22s %8s %12s %10s %7s\n", "op", "calls", "ms/step", "ms/call", "share")
	for _, n := range names {
		s := p.stats[n]
		ms := float64(s.dur.Microseconds()) / 1e3
		fmt.Fprintf(w, "%-22s %8d %12.2f %10.3f %6.1f%%\n", n, s.calls/steps, ms/float64(steps), ms/float64(s.calls), 100*ms/totalMs)
	}
	fmt.Fprintf(w, "%-22s %8s %12.2f %10s %6.1f%%\n", "(outside ops)", "", (totalMs-opMs)/float64(steps), "", 100*(totalMs-opMs)/totalMs)
	fmt.Fprintf(w, "goroutines %d, GOMAXPROCS %d\n", runtime.NumGoroutine(), runtime.GOMAXPROCS(0))
}

// experts is the timed backend's sparse ops (the cpu and cuda backends
// both have them).
func (p *timedBackend) experts() kernels.Experts {
	x, ok := p.Backend.(kernels.Experts)
	if !ok {
		panic(fmt.Sprintf("bench: the %s backend has no sparse-layer ops", p.Backend.Name()))
	}
	return x
}

func (p *timedBackend) RouterTopK(probs, weights, experts, logits kernels.Buf, T, E int, r kernels.Router) {
	p.time("RouterTopK", func() { p.experts().RouterTopK(probs, weights, experts, logits, T, E, r) })
}

func (p *timedBackend) RouterTopKBackward(dlogits, dweights, probs, weights, experts, dprobs kernels.Buf, T, E int, r kernels.Router) {
	p.time("RouterTopKBackward", func() {
		p.experts().RouterTopKBackward(dlogits, dweights, probs, weights, experts, dprobs, T, E, r)
	})
}

func (p *timedBackend) ExpertRoute(offsets, order, slot, experts kernels.Buf, T, K, E int) {
	p.time("ExpertRoute", func() { p.experts().ExpertRoute(offsets, order, slot, experts, T, K, E) })
}

func (p *timedBackend) ExpertGather(dst, src, order kernels.Buf, T, K, C int) {
	p.time("ExpertGather", func() { p.experts().ExpertGather(dst, src, order, T, K, C) })
}

func (p *timedBackend) ExpertGatherBackward(dsrc, ddst, slot kernels.Buf, T, K, C int) {
	p.time("ExpertGatherBackward", func() { p.experts().ExpertGatherBackward(dsrc, ddst, slot, T, K, C) })
}

func (p *timedBackend) ExpertCombine(out, y, weights, slot kernels.Buf, T, K, C int) {
	p.time("ExpertCombine", func() { p.experts().ExpertCombine(out, y, weights, slot, T, K, C) })
}

func (p *timedBackend) ExpertCombineBackward(dy, dweights, dout, y, weights, order, slot kernels.Buf, T, K, C int) {
	p.time("ExpertCombineBackward", func() {
		p.experts().ExpertCombineBackward(dy, dweights, dout, y, weights, order, slot, T, K, C)
	})
}

func (p *timedBackend) GroupedMatmul(out, inp, weight, offsets kernels.Buf, N, C, OC, E int) {
	p.time("GroupedMatmul", func() { p.experts().GroupedMatmul(out, inp, weight, offsets, N, C, OC, E) })
}

func (p *timedBackend) GroupedMatmulBackward(dinp, dweight, dout, inp, weight, offsets kernels.Buf, N, C, OC, E int) {
	p.time("GroupedMatmulBackward", func() {
		p.experts().GroupedMatmulBackward(dinp, dweight, dout, inp, weight, offsets, N, C, OC, E)
	})
}

func (p *timedBackend) Embedding(out, wte, tokens kernels.Buf, T, C int) {
	p.time("Embedding", func() { p.Backend.Embedding(out, wte, tokens, T, C) })
}
func (p *timedBackend) EmbeddingBackward(dwte, dout, tokens kernels.Buf, T, C int) {
	p.time("EmbeddingBackward", func() { p.Backend.EmbeddingBackward(dwte, dout, tokens, T, C) })
}
func (p *timedBackend) RMSNorm(out, rstd, inp, weight kernels.Buf, N, C int, eps float32) {
	p.time("RMSNorm", func() { p.Backend.RMSNorm(out, rstd, inp, weight, N, C, eps) })
}
func (p *timedBackend) RMSNormBackward(dinp, dweight, dout, inp, weight, rstd kernels.Buf, N, C int) {
	p.time("RMSNormBackward", func() { p.Backend.RMSNormBackward(dinp, dweight, dout, inp, weight, rstd, N, C) })
}
func (p *timedBackend) Matmul(out, inp, weight kernels.Buf, T, C, OC int) {
	p.time("Matmul", func() { p.Backend.Matmul(out, inp, weight, T, C, OC) })
}
func (p *timedBackend) MatmulBackward(dinp, dweight, dout, inp, weight kernels.Buf, T, C, OC int) {
	p.time("MatmulBackward", func() { p.Backend.MatmulBackward(dinp, dweight, dout, inp, weight, T, C, OC) })
}
func (p *timedBackend) AddBias(out, bias kernels.Buf, T, OC int) {
	p.time("AddBias", func() { p.Backend.AddBias(out, bias, T, OC) })
}
func (p *timedBackend) BiasBackward(dbias, dout kernels.Buf, T, OC int) {
	p.time("BiasBackward", func() { p.Backend.BiasBackward(dbias, dout, T, OC) })
}
func (p *timedBackend) Rope(x, pos, cos, sin kernels.Buf, T, H, HD int) {
	p.time("Rope", func() { p.Backend.Rope(x, pos, cos, sin, T, H, HD) })
}
func (p *timedBackend) RopeBackward(dx, pos, cos, sin kernels.Buf, T, H, HD int) {
	p.time("RopeBackward", func() { p.Backend.RopeBackward(dx, pos, cos, sin, T, H, HD) })
}
func (p *timedBackend) Attention(out, lse, q, k, v kernels.Buf, seqs kernels.Seqs, NH, NKV, HD int) {
	p.time("Attention", func() { p.Backend.Attention(out, lse, q, k, v, seqs, NH, NKV, HD) })
}
func (p *timedBackend) AttentionBackward(dq, dk, dv, dout, out, lse, q, k, v kernels.Buf, seqs kernels.Seqs, NH, NKV, HD int) {
	p.time("AttentionBackward", func() { p.Backend.AttentionBackward(dq, dk, dv, dout, out, lse, q, k, v, seqs, NH, NKV, HD) })
}
func (p *timedBackend) TreeAttention(out, lse, q, k, v kernels.Buf, tree kernels.Tree, NH, NKV, HD int) {
	p.time("TreeAttention", func() { p.Backend.TreeAttention(out, lse, q, k, v, tree, NH, NKV, HD) })
}
func (p *timedBackend) TreeAttentionBackward(dq, dk, dv, dout, out, lse, q, k, v kernels.Buf, tree kernels.Tree, NH, NKV, HD int) {
	p.time("TreeAttentionBackward", func() { p.Backend.TreeAttentionBackward(dq, dk, dv, dout, out, lse, q, k, v, tree, NH, NKV, HD) })
}
func (p *timedBackend) AttentionDecode(out, q, kc, vc, lens kernels.Buf, B, Tmax, NH, NKV, HD int) {
	p.time("AttentionDecode", func() { p.Backend.AttentionDecode(out, q, kc, vc, lens, B, Tmax, NH, NKV, HD) })
}
func (p *timedBackend) SwiGLU(out, gate, up kernels.Buf, N int) {
	p.time("SwiGLU", func() { p.Backend.SwiGLU(out, gate, up, N) })
}
func (p *timedBackend) SwiGLUBackward(dgate, dup, dout, gate, up kernels.Buf, N int) {
	p.time("SwiGLUBackward", func() { p.Backend.SwiGLUBackward(dgate, dup, dout, gate, up, N) })
}
func (p *timedBackend) Add(out, a, b kernels.Buf, N int) {
	p.time("Add", func() { p.Backend.Add(out, a, b, N) })
}
func (p *timedBackend) Accumulate(dst, src kernels.Buf, N int) {
	p.time("Accumulate", func() { p.Backend.Accumulate(dst, src, N) })
}
func (p *timedBackend) TokenLogprob(logprob, entropy, lse, hidden, weight, targets kernels.Buf, T, C, V int, invTemp float32) {
	p.time("TokenLogprob", func() { p.Backend.TokenLogprob(logprob, entropy, lse, hidden, weight, targets, T, C, V, invTemp) })
}
func (p *timedBackend) TokenLogprobBackward(dhidden, dweight, dlogprob, hidden, weight, targets, lse kernels.Buf, T, C, V int, invTemp float32) {
	p.time("TokenLogprobBackward", func() {
		p.Backend.TokenLogprobBackward(dhidden, dweight, dlogprob, hidden, weight, targets, lse, T, C, V, invTemp)
	})
}
func (p *timedBackend) ScatterRows(dst, src, idx kernels.Buf, N, W int) {
	p.time("ScatterRows", func() { p.Backend.ScatterRows(dst, src, idx, N, W) })
}
func (p *timedBackend) Fill(x kernels.Buf, v float32) {
	p.time("Fill", func() { p.Backend.Fill(x, v) })
}
func (p *timedBackend) Copy(dst, src kernels.Buf) {
	p.time("Copy", func() { p.Backend.Copy(dst, src) })
}
func (p *timedBackend) Scale(x kernels.Buf, s float32) {
	p.time("Scale", func() { p.Backend.Scale(x, s) })
}
func (p *timedBackend) AdamW(param, grad, m, v kernels.Buf, step kernels.AdamWStep) {
	p.time("AdamW", func() { p.Backend.AdamW(param, grad, m, v, step) })
}
func (p *timedBackend) SumSquares(out, x kernels.Buf) {
	p.time("SumSquares", func() { p.Backend.SumSquares(out, x) })
}
