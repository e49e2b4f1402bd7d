package main

import (
	"encoding/json"
	"fmt"
	"io"
	"math/rand/v2"
	"runtime"
	"sort"
	"time"

	"github.com/tracegrpo/tracegrpo/collective"
	"github.com/tracegrpo/tracegrpo/internal/checked"
	"github.com/tracegrpo/tracegrpo/internal/meminfo"
	"github.com/tracegrpo/tracegrpo/kernels"
	"github.com/tracegrpo/tracegrpo/kernels/cpu"
	"github.com/tracegrpo/tracegrpo/kernels/cuda"
	"github.com/tracegrpo/tracegrpo/model"
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
	MsPerStep   float64 `json:"ms_per_step"`
	MsMin       float64 `json:"ms_min"`
	TokensPerS  float64 `json:"tokens_per_s"`
	PeakRSSMiB  float64 `json:"peak_rss_mib,omitempty"`
	PlanMiB     float64 `json:"plan_mib"` // train plan's total for this shape
	Precision   string  `json:"precision"`
	FinalLogp   float64 `json:"mean_logprob_last_step"`
	WeightsFrom string  `json:"weights"`
}

func runBench(args []string, stdout, stderr io.Writer) error {
	fs := newFlags("bench", "train bench --model CONFIG.json --rows R --seq T [--steps N] [--backend B]", stdout)
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
	if err := parseFlags(fs, args, 0); err != nil {
		return err
	}
	if *cfgPath == "" || *rows <= 0 || *seq <= 0 || *steps <= 0 {
		return fmt.Errorf("%w: bench needs --model and positive --rows, --seq, --steps", errUsage)
	}
	if T, ok := checked.Mul(int64(*rows), int64(*seq)); !ok || T > model.MaxTokens {
		return fmt.Errorf("%w: bench: --rows %d × --seq %d tokens: more than %d in one step (token positions and offsets are int32)", errUsage, *rows, *seq, model.MaxTokens)
	}
	if *precision != "float32" && *precision != "bfloat16" {
		return fmt.Errorf("%w: bench: --precision %q: want float32 or bfloat16", errUsage, *precision)
	}
	cfg, err := model.LoadConfig(*cfgPath)
	if err != nil {
		return fmt.Errorf("bench: %w", err)
	}
	l, err := detectLaunch()
	if err != nil {
		return fmt.Errorf("bench: %w", err)
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
	plan, err := trainer.PlanModelRun(trainer.PlanSpec{
		Request: trainer.PlanRequest{Model: cfg, ModelName: *cfgPath, Backend: be.Name(), Rows: myRows,
			Workspace: trainer.WorkspacePlanner(be)},
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
	m, err := model.New(be, cfg, opt)
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
	mom, err := be.Alloc(kernels.F32, 2*m.Table().Total)
	if err != nil {
		return fmt.Errorf("bench: AdamW moments: %w", err)
	}
	defer be.Free(mom)
	r := rand.New(rand.NewPCG(*seed, 2))
	tokens := make([]int32, T)
	for i := range tokens {
		tokens[i] = int32(r.IntN(cfg.VocabSize))
	}
	cu := make([]int32, myRows+1)
	for s := range cu {
		cu[s] = int32(s * *seq)
	}
	dl := make([]float32, T)
	for i := range dl {
		dl[i] = float32(r.NormFloat64()) / float32(T)
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
		if l.comm != nil && l.Size > 1 {
			if err := l.comm.AllReduceSum(m.Grads()); err != nil {
				return err
			}
		}
		benchAdamW(be, m, mom, n)
		return be.Sync()
	}
	if err := step(1); err != nil {
		return fmt.Errorf("bench: warm-up step: %w", err)
	}
	if prof != nil {
		prof.reset()
	}
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

// benchAdamW updates every parameter with AdamW (weight decay 0.01 on
// matrices, none on norm weights), one call per parameter tensor.
func benchAdamW(be kernels.Backend, m *model.Model, mom kernels.Buf, step int) {
	const lr, b1, b2 = 1e-6, 0.9, 0.999
	tot := m.Table().Total
	for _, p := range m.Table().Params {
		wd := float32(0)
		if p.Decay {
			wd = 0.01
		}
		be.AdamW(m.Params().Slice(p.Offset, p.N), m.Grads().Slice(p.Offset, p.N),
			mom.Slice(p.Offset, p.N), mom.Slice(tot+p.Offset, p.N), kernels.NewAdamWStep(lr, b1, b2, 1e-8, float64(wd), int64(step), 1))
	}
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
