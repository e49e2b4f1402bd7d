package bench

import (
	"encoding/json"
	"fmt"
	"math/big"
	"math/rand/v2"
	"runtime"
	"runtime/debug"
	"slices"
	"strconv"
	"strings"
	"time"

	"github.com/tracegrpo/tracegrpo/grpo"
	"github.com/tracegrpo/tracegrpo/internal/meminfo"
	"github.com/tracegrpo/tracegrpo/internal/quote"
	"github.com/tracegrpo/tracegrpo/kernels"
	"github.com/tracegrpo/tracegrpo/model"
	"github.com/tracegrpo/tracegrpo/trainer"
)

// treeSpec is bench's --tree L0,B1,L1,B2,L2,...: a root segment of L0
// tokens (a prompt), and below it levels of segments: every node of level
// i−1 has Bi children of Li tokens. Each root-to-leaf path is a trace.
type treeSpec struct {
	root   int
	levels [][2]int // (children per node, tokens per child)
}

func parseTreeSpec(s string) (treeSpec, error) {
	var sp treeSpec
	f := strings.Split(s, ",")
	if len(f) < 3 || len(f)%2 == 0 {
		return sp, fmt.Errorf("%w: --tree %q: want P,K,S (K children of S tokens under a P-token root) or P,K1,S1,K2,S2 and so on", trainer.ErrUsage, s)
	}
	n := make([]int, len(f))
	for i, x := range f {
		v, err := strconv.Atoi(strings.TrimSpace(x))
		if err != nil || v < 1 || v > 1<<20 {
			return sp, fmt.Errorf("%w: --tree %q: field %d is %q, want a whole number from 1 to %d", trainer.ErrUsage, s, i+1, x, 1<<20)
		}
		n[i] = v
	}
	sp.root = n[0]
	for i := 1; i < len(n); i += 2 {
		sp.levels = append(sp.levels, [2]int{n[i], n[i+1]})
	}
	// The rows are built whole (every trace holds its path's tokens): the
	// product of the fields, not each field, decides their size.
	traces, tokens := sp.size()
	if traces.Cmp(big.NewInt(MaxTreeTraces)) > 0 || tokens.Cmp(big.NewInt(MaxTreeTokens)) > 0 {
		return sp, fmt.Errorf("%w: --tree %s: %s traces, %s trace tokens; bench builds at most %d traces and %d trace tokens (each trace holds its whole path): fewer levels or smaller branching",
			trainer.ErrUsage, quote.Cut(s), count(traces), count(tokens), MaxTreeTraces, MaxTreeTokens)
	}
	return sp, nil
}

// The most traces, and trace tokens (the rows' tokens: each trace holds its
// whole root-to-leaf path), that bench --tree builds.
const (
	MaxTreeTraces = 1 << 16
	MaxTreeTokens = 1 << 24
)

// size is the tree's number of traces (the product of the branchings) and
// of trace tokens (traces × a path's length), exactly.
func (sp treeSpec) size() (traces, tokens *big.Int) {
	traces, path := big.NewInt(1), big.NewInt(int64(sp.root))
	for _, l := range sp.levels {
		traces.Mul(traces, big.NewInt(int64(l[0])))
		path.Add(path, big.NewInt(int64(l[1])))
	}
	return traces, new(big.Int).Mul(traces, path)
}

// count writes n in full, or as 3.27e+150 when it has more than 18 digits.
func count(n *big.Int) string {
	if n.IsInt64() && n.Int64() < 1e18 {
		return n.String()
	}
	return new(big.Float).SetInt(n).Text('g', 3)
}

// rows returns the synthetic step of a tree spec: one row per root-to-leaf
// path with random tokens. The root is a prompt (no loss); every other
// segment is one model call's generation, owned by the first trace through
// it: its tokens carry loss in that trace's row only (as Gym's ownership
// rule makes them).
func (sp treeSpec) rows(V int, r *rand.Rand) *grpo.Batch {
	b := &grpo.Batch{}
	toks := func(n int) []int32 {
		t := make([]int32, n)
		for i := range t {
			t[i] = int32(r.IntN(V))
		}
		return t
	}
	var grow func(prefix []int32, owned []bool, level int)
	grow = func(prefix []int32, owned []bool, level int) {
		if level == len(sp.levels) {
			row := grpo.Row{TokenIDs: prefix, TokenMask: make([]int8, len(prefix)), GenLogprobs: make([]float64, len(prefix)),
				SampleMask: 1, Valid: true}
			for i, o := range owned {
				if o {
					row.TokenMask[i] = 1
				}
			}
			b.Rows = append(b.Rows, row)
			return
		}
		k, n := sp.levels[level][0], sp.levels[level][1]
		for c := range k {
			seq := append(slices.Clone(prefix), toks(n)...)
			own := slices.Clone(owned)
			if c > 0 { // the segments above belong to the first child's trace
				clear(own)
			}
			for range n {
				own = append(own, true)
			}
			grow(seq, own, level+1)
		}
	}
	grow(toks(sp.root), make([]bool, sp.root), 0)
	return b
}

// TreeResult is one mode's JSON line of RunTree.
type TreeResult struct {
	Mode           string  `json:"shared_prefix"`
	Backend        string  `json:"backend"`
	Threads        int     `json:"threads,omitempty"`
	Model          string  `json:"model"`
	Params         int     `json:"params"`
	Tree           string  `json:"tree"`
	Traces         int     `json:"traces"`
	TraceTokens    int     `json:"trace_tokens"`
	ComputedTokens int     `json:"computed_tokens"`
	PrefixReuse    float64 `json:"prefix_reuse"`
	LossTokens     int     `json:"loss_tokens"`
	HeadRows       int     `json:"lm_head_rows"`
	MicroBatches   int     `json:"micro_batches"`
	MicroTokens    int     `json:"micro_batch_tokens"`
	Recompute      bool    `json:"recompute"`
	Precision      string  `json:"precision"`
	Steps          int     `json:"steps"`
	MsPerStep      float64 `json:"ms_per_step"`
	MsMin          float64 `json:"ms_min"`
	TraceTokensPS  float64 `json:"trace_tokens_per_s"`
	PlanMiB        float64 `json:"plan_mib"`
	PeakRSSMiB     float64 `json:"peak_rss_mib,omitempty"`
	MeanLogp       float64 `json:"mean_logprob_last_step"`
}

// Tree is a run on a synthetic tree of traces (TreeSpec's grammar: P,K,S
// or P,K1,S1,K2,S2,...), in one process.
type Tree struct {
	Common
	Spec     string
	Modes    []string // "off" (each trace its own sequence), "auto" (token tries), in the order run
	MBTokens int      // computed tokens per micro-batch in both modes (0: the whole trie's)
}

// RunTree times one GRPO-shaped step (forward, backward and AdamW of
// every micro-batch) over a synthetic tree of traces, with the traces packed
// each as its own sequence (off) and as token tries (auto), in the same
// process one after the other, and prints a JSON line per mode and one with
// the ratio. Both modes run the same model shape and micro-batch budget of
// computed tokens, and the LM head over the same loss positions.
func RunTree(env Env, a Tree) error {
	sp, err := parseTreeSpec(a.Spec)
	if err != nil {
		return err
	}
	b := sp.rows(a.Model.VocabSize, rand.New(rand.NewPCG(a.Seed, 3)))
	idx := make([]int, len(b.Rows))
	longest, trace := 0, 0
	for i := range idx {
		idx[i] = i
		longest = max(longest, len(b.Rows[i].TokenIDs))
		trace += len(b.Rows[i].TokenIDs)
	}
	// dL/dlogprob at every loss position, the same in both modes.
	r := rand.New(rand.NewPCG(a.Seed, 4))
	coef := make([][]float32, len(b.Rows))
	loss := 0
	for i := range b.Rows {
		coef[i] = make([]float32, len(b.Rows[i].TokenIDs))
		for t, m := range b.Rows[i].TokenMask {
			if m != 0 {
				coef[i][t] = float32(r.NormFloat64())
				loss++
			}
		}
	}
	whole := grpo.BuildTree(b, idx)
	budget := a.MBTokens
	if budget == 0 {
		// The smallest budget that packs the whole trie in one micro-batch:
		// its computed tokens, or the traces' loss positions (LM-head
		// pairs, counted per trace) when there are more: many short traces
		// under one prefix.
		budget = max(len(whole.Tokens), loss)
	}
	if budget < longest {
		return fmt.Errorf("%w: bench: --mb-tokens %d: a trace of the tree has %d tokens", trainer.ErrUsage, budget, longest)
	}
	prec, precName := a.precision(env.Backend, env.Stderr)
	var res []TreeResult
	for _, mode := range a.Modes {
		runtime.GC()
		debug.FreeOSMemory()
		peakOK := meminfo.ResetPeak()
		out, err := treeBenchMode(env, a, prec, precName, b, idx, budget, coef, mode)
		if err != nil {
			return err
		}
		out.LossTokens = loss
		if _, peak, ok := meminfo.Self(); ok && peakOK {
			out.PeakRSSMiB = float64(peak) / (1 << 20)
		}
		j, _ := json.Marshal(out)
		fmt.Fprintln(env.Stdout, string(j))
		res = append(res, out)
	}
	if len(res) == 2 {
		off, on := res[0], res[1]
		j, _ := json.Marshal(map[string]any{
			"tree": a.Spec, "speedup_off_over_auto": off.MsPerStep / on.MsPerStep, "prefix_reuse": on.PrefixReuse,
			"ms_per_step_off": off.MsPerStep, "ms_per_step_auto": on.MsPerStep,
			"peak_rss_mib_off": off.PeakRSSMiB, "peak_rss_mib_auto": on.PeakRSSMiB,
			"plan_mib_off": off.PlanMiB, "plan_mib_auto": on.PlanMiB,
		})
		fmt.Fprintln(env.Stdout, string(j))
	}
	return nil
}

// treeBenchMode runs one mode of RunTree.
func treeBenchMode(env Env, a Tree, prec kernels.DType, precName string, b *grpo.Batch, idx []int, budget int, coef [][]float32, mode string) (TreeResult, error) {
	be := env.Backend
	res := TreeResult{Mode: mode, Backend: be.Name(), Threads: env.Threads, Model: a.ModelName, Tree: a.Spec, Traces: len(b.Rows),
		MicroTokens: budget, Recompute: a.Recompute, Precision: precName, Steps: a.Steps}
	type micro struct {
		tree   *grpo.PackedTree
		rows   []int
		tokens []int32
		cu     []int32
		need   []bool
	}
	var mbs []micro
	maxSeqs := 1
	if mode == "auto" {
		// Every segment has a token, so a micro-batch has at most budget;
		// PackTrees counts two a row (its bound), so room for every row's.
		maxSegs := max(budget, 2*len(idx))
		trees, err := grpo.PackTrees(b, idx, grpo.TreeLimits{MaxTokens: budget, MaxSegs: maxSegs})
		if err != nil {
			return res, fmt.Errorf("bench: %w", err)
		}
		for i := range trees {
			mbs = append(mbs, micro{tree: &trees[i], rows: trees[i].Rows})
			res.ComputedTokens += len(trees[i].Tokens)
			res.HeadRows += len(trees[i].PairRows)
			maxSeqs = max(maxSeqs, len(trees[i].Parent))
		}
	} else {
		cur := micro{cu: []int32{0}}
		for _, i := range idx {
			row := &b.Rows[i]
			if len(cur.tokens)+len(row.TokenIDs) > budget && len(cur.rows) > 0 {
				mbs = append(mbs, cur)
				cur = micro{cu: []int32{0}}
			}
			cur.rows = append(cur.rows, i)
			cur.tokens = append(cur.tokens, row.TokenIDs...)
			cur.cu = append(cur.cu, int32(len(cur.tokens)))
			for _, m := range row.TokenMask {
				cur.need = append(cur.need, m != 0)
				if m != 0 {
					res.HeadRows++
				}
			}
		}
		mbs = append(mbs, cur)
		for _, mb := range mbs {
			res.ComputedTokens += len(mb.tokens)
			maxSeqs = max(maxSeqs, len(mb.rows))
		}
	}
	for _, i := range idx {
		res.TraceTokens += len(b.Rows[i].TokenIDs)
	}
	res.MicroBatches = len(mbs)
	res.PrefixReuse = float64(res.TraceTokens) / float64(res.ComputedTokens)
	maxCtx := 0
	for _, i := range idx {
		maxCtx = max(maxCtx, len(b.Rows[i].TokenIDs))
	}
	opt := model.Options{MaxTokens: budget, MaxSeqs: maxSeqs, MaxSeqLen: maxCtx, Recompute: a.Recompute, Precision: prec, Tree: mode == "auto"}
	plan, err := trainer.PlanModelRun(trainer.PlanSpec{
		Request: trainer.PlanRequest{Model: a.Model, ModelName: a.ModelName, Backend: be.Name(), Rows: 1, Workspace: trainer.WorkspacePlanner(be)},
		Options: opt, Optimizer: true,
		Shrink: map[string][]string{"activations": {"--mb-tokens", "--recompute"}, "workspace": {"--mb-tokens"},
			"weights": {"a smaller --model"}, "gradients": {"a smaller --model"}, "adam_moments": {"a smaller --model"}},
	})
	if err != nil {
		return res, fmt.Errorf("bench: %w", err)
	}
	if err := trainer.CheckFree(plan, be); err != nil {
		return res, fmt.Errorf("bench: %w", err)
	}
	res.PlanMiB = float64(plan.TotalBytes) / (1 << 20)
	m, err := model.New(be, a.Model, opt)
	if err != nil {
		return res, fmt.Errorf("bench: %w", err)
	}
	defer m.Close()
	res.Params = m.Table().Total
	if a.Weights != "" {
		if err := m.LoadHF(a.Weights); err != nil {
			return res, fmt.Errorf("bench: %w", err)
		}
	} else {
		m.InitRandom(a.Seed)
	}
	opts, err := benchOptimizer(be, m, nil, false, a.Eps)
	if err != nil {
		return res, fmt.Errorf("bench: %w", err)
	}
	defer opts.Close()
	var lastMean float64
	step := func() error {
		m.ZeroGrad()
		var sum float64
		var cnt int
		for _, mb := range mbs {
			if mb.tree != nil {
				pt := mb.tree
				lp, _, err := m.ForwardTree(model.Tree{Tokens: pt.Tokens, Segs: pt.Segs, Parent: pt.Parent, Rows: pt.PairRows, Labels: pt.PairLabels}, 1)
				if err != nil {
					return err
				}
				d := make([]float32, len(lp))
				for j, row := range pt.Rows {
					for i, p := range pt.Pair[j] {
						if p >= 0 {
							d[p] += coef[row][i] / float32(len(coef))
							sum += float64(lp[p])
							cnt++
						}
					}
				}
				if err := m.Backward(d); err != nil {
					return err
				}
				continue
			}
			lp, _, err := m.ForwardMasked(mb.tokens, mb.cu, 1, mb.need)
			if err != nil {
				return err
			}
			d := make([]float32, len(lp))
			for j, row := range mb.rows {
				off := int(mb.cu[j])
				for i, c := range coef[row] {
					d[off+i] = c / float32(len(coef))
					if mb.need[off+i] {
						sum += float64(lp[off+i])
						cnt++
					}
				}
			}
			if err := m.Backward(d); err != nil {
				return err
			}
		}
		lastMean = sum / float64(max(cnt, 1))
		if _, err := opts.Step(a.LR, 0.01); err != nil {
			return err
		}
		m.ParamsChanged()
		return be.Sync()
	}
	if err := step(); err != nil {
		return res, fmt.Errorf("bench: %s: warm-up step: %w", mode, err)
	}
	times := make([]float64, a.Steps)
	for i := range times {
		t0 := time.Now()
		if err := step(); err != nil {
			return res, fmt.Errorf("bench: %s: step %d: %w", mode, i+1, err)
		}
		times[i] = float64(time.Since(t0).Nanoseconds()) / 1e6
	}
	res.MsPerStep, res.MsMin = medianMin(times)
	res.TraceTokensPS = float64(res.TraceTokens) / (res.MsPerStep / 1e3)
	res.MeanLogp = lastMean
	return res, nil
}
