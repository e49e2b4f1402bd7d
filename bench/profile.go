package bench

import (
	"fmt"
	"io"
	"runtime"
	"sort"
	"time"

	"github.com/tracegrpo/tracegrpo/kernels"
)

// opStat accumulates one op's calls, time and floating-point work.
type opStat struct {
	calls int
	dur   time.Duration
	cpu   time.Duration // the process's CPU time during the calls
	flops float64       // 0: the op is not counted (memory-bound, or no formula)
	cur   time.Duration // in the step under way
	best  time.Duration // in the step that took it least (endStep)
}

// timedBackend wraps a backend and times every op (syncing after each so a
// device backend's time lands on the op that spent it).
type timedBackend struct {
	kernels.Backend
	stats map[string]*opStat
	err   error
	cpuOK bool // the CPU time of the calls was read
}

// Unwrap returns the backend being timed (its memory plan and free memory
// are the wrapped backend's).
func (p *timedBackend) Unwrap() kernels.Backend { return p.Backend }

func newTimedBackend(b kernels.Backend) *timedBackend {
	return &timedBackend{Backend: b, stats: map[string]*opStat{}}
}

func (p *timedBackend) reset() { p.stats = map[string]*opStat{} }

// endStep closes a timed step: each op's time in it competes for its best.
// On a shared machine other processes steal time from some steps; the
// best step is the one least disturbed, as the peak's best trial is.
func (p *timedBackend) endStep() {
	for _, s := range p.stats {
		if s.best == 0 || s.cur < s.best {
			s.best = s.cur
		}
		s.cur = 0
	}
}

func (p *timedBackend) time(name string, f func()) { p.timeWork(name, 0, f) }

// timeWork times op name, which does flops floating-point operations
// (flops.go counts them from the op's shapes).
func (p *timedBackend) timeWork(name string, flops float64, f func()) {
	c0, cpuOK := processCPU()
	t0 := time.Now()
	f()
	if err := p.Backend.Sync(); err != nil && p.err == nil {
		p.err = err
	}
	c1, _ := processCPU()
	s := p.stats[name]
	if s == nil {
		s = &opStat{}
		p.stats[name] = s
	}
	d := time.Since(t0)
	s.calls++
	s.dur += d
	s.cur += d
	s.flops += flops
	if cpuOK {
		s.cpu += c1 - c0
		p.cpuOK = true
	}
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

// report prints the time per op over steps timed steps (totalMs in all).
// For the ops whose work flops.go counts it adds their rate in their best
// step (wall time) and its fraction of peak.GFLOPS, and their rate per
// core-second of the process's CPU time and its fraction of
// peak.PerThread: on a machine shared with other processes, whose threads
// stretch the wall time of every step, the second still says how well the
// op uses the cores it gets.
func (p *timedBackend) report(w io.Writer, steps int, totalMs float64, peak Peak) {
	names := make([]string, 0, len(p.stats))
	var opMs float64
	var mx opStat // the matrix ops together
	for n, s := range p.stats {
		names = append(names, n)
		opMs += ms(s.dur)
		if s.flops > 0 {
			mx.dur += s.dur
			mx.best += s.best
			mx.cpu += s.cpu
			mx.flops += s.flops
		}
	}
	sort.Slice(names, func(i, j int) bool { return p.stats[names[i]].dur > p.stats[names[j]].dur })
	rate := func(flops float64, d time.Duration, peak float64) (string, string) {
		if flops == 0 || d <= 0 {
			return "-", "-"
		}
		g := flops / d.Seconds() / 1e9
		if peak <= 0 {
			return fmt.Sprintf("%.1f", g), "-"
		}
		return fmt.Sprintf("%.1f", g), fmt.Sprintf("%.1f%%", 100*g/peak)
	}
	const row = "%-22s %6s %10s %9s %7s %10s %8s %8s %10s %8s %8s\n"
	fmt.Fprintf(w, row, "op", "calls", "ms/step", "ms/call", "share", "best ms", "GFLOP/s", "of peak", "cpu ms", "/core", "of core")
	line := func(name, calls string, s *opStat, callMs string) {
		g, f := rate(s.flops/float64(steps), s.best, peak.GFLOPS)
		cpuMs, cg, cf := "-", "-", "-"
		if p.cpuOK {
			cpuMs = fmt.Sprintf("%.2f", ms(s.cpu)/float64(steps))
			cg, cf = rate(s.flops, s.cpu, peak.PerThread)
		}
		fmt.Fprintf(w, row, name, calls, fmt.Sprintf("%.2f", ms(s.dur)/float64(steps)), callMs,
			fmt.Sprintf("%.1f%%", 100*ms(s.dur)/totalMs), fmt.Sprintf("%.2f", ms(s.best)), g, f, cpuMs, cg, cf)
	}
	for _, n := range names {
		s := p.stats[n]
		line(n, fmt.Sprint(s.calls/steps), s, fmt.Sprintf("%.3f", ms(s.dur)/float64(s.calls)))
	}
	out := totalMs - opMs
	fmt.Fprintf(w, row, "(outside ops)", "", fmt.Sprintf("%.2f", out/float64(steps)), "", fmt.Sprintf("%.1f%%", 100*out/totalMs), "", "", "", "", "", "")
	line("(matrix ops)", "", &mx, "")
	fmt.Fprintf(w, "GFLOP/s: the op's FLOPs (bench/flops.go: the products it computes, causal halves of attention) over its time in its best step of %d, of the peak of all threads; "+
		"/core: over the CPU time the process used during its calls, of one thread's peak; matrix ops: the ops that have FLOPs\n", steps)
	if peak.How != "" {
		fmt.Fprintf(w, "peak: %s\n", peak.How)
	}
	fmt.Fprintf(w, "goroutines %d, GOMAXPROCS %d\n", runtime.NumGoroutine(), runtime.GOMAXPROCS(0))
}

func ms(d time.Duration) float64 { return float64(d.Microseconds()) / 1e3 }

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
	p.timeWork("Matmul", matmulFLOPs(T, C, OC), func() { p.Backend.Matmul(out, inp, weight, T, C, OC) })
}
func (p *timedBackend) MatmulBackward(dinp, dweight, dout, inp, weight kernels.Buf, T, C, OC int) {
	p.timeWork("MatmulBackward", matmulBackwardFLOPs(dinp, dweight, T, C, OC), func() { p.Backend.MatmulBackward(dinp, dweight, dout, inp, weight, T, C, OC) })
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
	p.timeWork("Attention", attentionFLOPs(p.seqLens(seqs), NH, HD), func() { p.Backend.Attention(out, lse, q, k, v, seqs, NH, NKV, HD) })
}
func (p *timedBackend) AttentionBackward(dq, dk, dv, dout, out, lse, q, k, v kernels.Buf, seqs kernels.Seqs, NH, NKV, HD int) {
	p.timeWork("AttentionBackward", attentionBackwardFLOPs(p.seqLens(seqs), NH, HD), func() {
		p.Backend.AttentionBackward(dq, dk, dv, dout, out, lse, q, k, v, seqs, NH, NKV, HD)
	})
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
func (p *timedBackend) SwiGLURows(out, gu kernels.Buf, R, I int) {
	p.time("SwiGLURows", func() { p.Backend.SwiGLURows(out, gu, R, I) })
}
func (p *timedBackend) SwiGLURowsBackward(dgu, dout, gu kernels.Buf, R, I int) {
	p.time("SwiGLURowsBackward", func() { p.Backend.SwiGLURowsBackward(dgu, dout, gu, R, I) })
}
func (p *timedBackend) Add(out, a, b kernels.Buf, N int) {
	p.time("Add", func() { p.Backend.Add(out, a, b, N) })
}
func (p *timedBackend) Accumulate(dst, src kernels.Buf, N int) {
	p.time("Accumulate", func() { p.Backend.Accumulate(dst, src, N) })
}
func (p *timedBackend) TokenLogprob(logprob, entropy, lse, hidden, weight, targets kernels.Buf, T, C, V int, invTemp float32) {
	p.timeWork("TokenLogprob", matmulFLOPs(T, C, V), func() {
		p.Backend.TokenLogprob(logprob, entropy, lse, hidden, weight, targets, T, C, V, invTemp)
	})
}
func (p *timedBackend) TokenLogprobBackward(dhidden, dweight, dlogprob, hidden, weight, targets, lse kernels.Buf, T, C, V int, invTemp float32) {
	p.timeWork("TokenLogprobBackward", tokenLogprobBackwardFLOPs(dhidden, dweight, T, C, V), func() {
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
