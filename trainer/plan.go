package trainer

import (
	"encoding/json"
	"fmt"
	"io"
	"maps"
	"math"
	"os"
	"slices"
	"strconv"
	"strings"
	"sync/atomic"

	"github.com/tracegrpo/tracegrpo/collective"
	"github.com/tracegrpo/tracegrpo/config"
	"github.com/tracegrpo/tracegrpo/internal/checked"
	"github.com/tracegrpo/tracegrpo/internal/meminfo"
	"github.com/tracegrpo/tracegrpo/kernels"
	"github.com/tracegrpo/tracegrpo/model"
	"github.com/tracegrpo/tracegrpo/optim"
)

// Component is one part of a memory plan.
type Component struct {
	Name  string `json:"name"`
	Bytes int64  `json:"bytes"`
	What  string `json:"what"`
	// Shrink names the config keys or flags that make this part smaller.
	Shrink []string `json:"shrink_with,omitempty"`
}

// MemPlan is the memory a run allocates on its backend, part by part, from
// the same code that sizes the allocations (model.PlanModel and friends,
// each backend's PlanWorkspace).
type MemPlan struct {
	Backend       string `json:"backend"`
	Model         string `json:"model"`
	Params        int    `json:"params"`
	Precision     string `json:"precision"` // what the backend computes in
	Checkpointing bool   `json:"activation_checkpointing"`
	Rows          int    `json:"rows"`
	Seq           int    `json:"seq"`
	// Activations of the configured run, with and without checkpointing.
	ActivationsCheckpointed int64       `json:"activations_with_checkpointing_bytes"`
	ActivationsFull         int64       `json:"activations_without_checkpointing_bytes"`
	Components              []Component `json:"components"`
	TotalBytes              int64       `json:"total_bytes"`
	// World and Sharded: the plan is one rank's of World, sharded or not.
	World   int      `json:"world_size"`
	Sharded bool     `json:"sharded"`
	Notes   []string `json:"notes,omitempty"`

	work  kernels.Workload // the ops the run's shapes run, for ReserveWorkspace
	total checked.Sum      // TotalBytes, summed by add
	req   *PlanRequest     // what was planned, for FitWorld (train runs)
}

// maxFitWorld bounds the world sizes FitWorld considers (a variable for
// tests).
var maxFitWorld = 4096

// planRuns counts the plans PlanRun makes (tests count FitWorld's work).
var planRuns atomic.Int64

// FitWorld returns the smallest number of ranks, up to 4096, whose fully
// sharded plan (--shard full) fits in free bytes per rank, and that plan;
// ok is false when none does (or the plan is not a train run's). The parts
// of a rank's plan that shard (weights, gradients, Adam moments, the KL
// reference) shrink as W grows and the others (activations, workspace,
// the sampler's cache, a gathered group) do not, so a rank's total does
// not grow with W but for two small terms (a gathered group is padded to a
// multiple of W, and the rank exchange holds 16 KiB a rank): FitWorld
// bisects over W, about a dozen plans where trying every W made up to
// 4096, and finds the smallest W unless free falls within those few
// bytes of a plan. When even 4096 ranks do not fit, fitWorld also says
// which parts more ranks leave as they are.
func (p *MemPlan) FitWorld(free int64) (world int, plan *MemPlan, ok bool) {
	r := p.fitWorld(free)
	return r.world, r.plan, r.ok
}

// fitResult is FitWorld's answer, and when nothing fits, what the most
// ranks leave: the plan at maxFitWorld, and the parts more ranks do not
// shrink (those that do not halve from maxFitWorld/2 to maxFitWorld ranks).
type fitResult struct {
	world     int
	plan      *MemPlan
	ok        bool
	most      *MemPlan
	fixed     int64
	fixedPart []Component
}

func (p *MemPlan) fitWorld(free int64) fitResult {
	if p.req == nil {
		return fitResult{}
	}
	planAt := func(w int) *MemPlan {
		req := *p.req
		req.World, req.Shard = w, true
		q, err := PlanRun(req)
		if err != nil {
			return nil
		}
		return q
	}
	fits := func(q *MemPlan) bool { return q != nil && q.TotalBytes <= free }
	most := planAt(maxFitWorld)
	if most == nil {
		return fitResult{}
	}
	if !fits(most) {
		// Say at once what more ranks cannot shrink.
		res := fitResult{most: most}
		if half := planAt(max(maxFitWorld/2, 1)); half != nil {
			at := map[string]int64{}
			for _, c := range half.Components {
				at[c.Name] = c.Bytes
			}
			for _, c := range most.Components {
				// A part that shards halves from maxFitWorld/2 to
				// maxFitWorld ranks; one that does not (up to padding to
				// a multiple of W) stays.
				if float64(c.Bytes) > 0.75*float64(at[c.Name]) {
					res.fixed += c.Bytes
					res.fixedPart = append(res.fixedPart, c)
				}
			}
		}
		return res
	}
	// fits(lo) is false (lo = 0 stands for none), fits(hi) is true.
	lo, hi, best := 0, maxFitWorld, most
	for hi-lo > 1 {
		mid := lo + (hi-lo)/2
		if q := planAt(mid); fits(q) {
			hi, best = mid, q
		} else {
			lo = mid
		}
	}
	return fitResult{world: hi, plan: best, ok: true}
}
func (p *MemPlan) add(c Component) {
	if c.Bytes == 0 {
		return
	}
	p.Components = append(p.Components, c)
	p.total.Add(c.Bytes)
}

// finish sets TotalBytes, or refuses a plan whose parts do not sum in an
// int64 (or one of which is negative: a size that wrapped).
func (p *MemPlan) finish() error {
	total, ok := p.total.Value()
	if !ok {
		return checked.Overflow("memory plan: the parts of %s's plan do not sum in an int64", p.Model)
	}
	p.TotalBytes = total
	return nil
}

// PlanRequest is what to plan: a run's configuration on a backend.
type PlanRequest struct {
	Config    *config.Config
	Model     model.Config
	ModelName string // for the plan's header
	Backend   string // "cpu" or "cuda"
	// Workspace sizes the scratch the backend's ops allocate for a workload
	// (cpu.PlanWorkspace or cuda.PlanWorkspace).
	Workspace func(kernels.Workload) int64
	// Rows and Seq override policy.train_micro_batch_size and
	// policy.max_total_sequence_length (0: the config's).
	Rows, Seq int
	// Builtin: the run generates its rollouts in-process (the built-in
	// job), so it holds a sampler and its KV cache.
	Builtin bool
	// Resume: the run starts by reading a checkpoint (on the CPU the
	// loaded tensors sit in host memory while they are copied in).
	Resume bool
	// World is the number of ranks (0 means 1); Shard plans one rank of a
	// fully sharded run (--shard full), NoReshard with every layer kept
	// gathered through backward.
	World            int
	Shard, NoReshard bool
}

// maxSamplerSlots caps the in-process sampler's batch: its KV cache holds
// that many sequences of policy.max_total_sequence_length tokens, and the
// calls of a round beyond it wait for a slot (SampleOptions.Refill).
var maxSamplerSlots = 256

// samplerSlots is the in-process sampler's batch: twice a step's logical
// rollouts, at most maxSamplerSlots.
func samplerSlots(c *config.Config) int {
	return min(c.Policy.TrainGlobalBatchSize, maxSamplerSlots/2) * 2
}

// cpuMixedPrecision makes the CPU backend run bf16 mixed precision as the
// recipe asks, through its widening reference kernels, where it otherwise
// computes in fp32: tests use it to train the mixed-precision path quickly.
var cpuMixedPrecision = false

// runShape is the model options and sampler shape a run uses: New and
// PlanRun both take them from here.
type runShape struct {
	rows, seq          int
	opt                model.Options
	precision          string // the config's policy.precision
	ckptKey            string
	sampler            bool
	samplerB, samplerL int
}

// sparse: the model has sparse (MoE) layers, whose traces are never packed
// as token tries (see sharedFor).
func shapeOf(c *config.Config, backend string, rows, seq int, builtin, sparse bool) (runShape, error) {
	var s runShape
	fromFlags := rows > 0 || seq > 0 // plan's --rows and --seq: usage errors
	rowsKey, seqKey := "--rows", "--seq"
	if rows <= 0 {
		rows, rowsKey = c.Policy.TrainMicroBatchSize, "policy.train_micro_batch_size"
	}
	if seq <= 0 {
		seq, seqKey = c.Policy.MaxTotalSequenceLength, "policy.max_total_sequence_length"
	}
	if rows < 1 {
		return s, fmt.Errorf("config: policy.train_micro_batch_size=%d: must be ≥ 1", rows)
	}
	if seq < 1 {
		return s, fmt.Errorf("config: policy.max_total_sequence_length=%d: must be ≥ 1", seq)
	}
	if T, ok := checked.Mul(int64(rows), int64(seq)); !ok || T > model.MaxTokens {
		msg := fmt.Sprintf("%s=%d × %s=%d tokens per micro-batch: more than %d (token positions and offsets are int32)",
			rowsKey, rows, seqKey, seq, model.MaxTokens)
		if fromFlags {
			return s, fmt.Errorf("%w: plan: %s", ErrUsage, msg)
		}
		return s, fmt.Errorf("config: %s", msg)
	}
	var err error
	if s.precision, err = c.TrainingPrecision(); err != nil {
		return s, err
	}
	var ckpt bool
	ckpt, s.ckptKey = c.ActivationCheckpointing()
	T := rows * seq
	s.rows, s.seq = rows, seq
	shared, err := c.SharedPrefixOn()
	if err != nil {
		return s, err
	}
	shared = shared && !sparse
	s.opt = model.Options{MaxTokens: T, MaxSeqs: T/2 + 1, Recompute: ckpt, Precision: kernels.F32, Tree: shared,
		FreezeRouter: c.Policy.MegatronCfg.Enabled && c.Policy.MegatronCfg.FreezeMoERouter}
	if s.precision == config.PrecisionBFloat16 && (backend != "cpu" || cpuMixedPrecision) {
		s.opt.Precision = kernels.BF16
	}
	if !trainUnfiltered {
		s.opt.HeadFilter = headFilter(c)
		s.opt.HeadFull = s.opt.HeadFilter != (kernels.TopKTopP{}) && c.LossFn.ReferencePolicyKLPenalty != 0
	}
	if builtin {
		s.sampler = true
		s.samplerB, s.samplerL = samplerSlots(c), seq
	}
	return s, nil
}

// mambaTreeSegs is the most segments of a packed tree of a model with
// Mamba blocks: its scans keep a state of every head for each segment of
// a tree (at Nemotron-3-Nano's 64 × 64 × 128, 6 MiB a segment in the CUDA
// backend's scratch: each one's final state, initial-state gradient and
// a checkpoint), where a micro-batch of 49,152 tokens may otherwise hold
// 24,577 segments. A tree of more is packed as more micro-batches
// (grpo.PackTrees).
const mambaTreeSegs = 32

// limitTrees caps the trees of a model with Mamba blocks at
// mambaTreeSegs segments (Options.MaxTreeSegs).
func limitTrees(mc model.Config, s *runShape) {
	if s.opt.Tree && mc.CountLayers(model.LayerMamba) > 0 {
		s.opt.MaxTreeSegs = min(s.opt.MaxSeqs, mambaTreeSegs)
	}
}

// treeSegs is the most segments of a tree a run packs.
func treeSegs(opt model.Options) int {
	if opt.MaxTreeSegs > 0 {
		return min(opt.MaxTreeSegs, opt.MaxSeqs)
	}
	return opt.MaxSeqs
}

// trainUnfiltered makes the training head ignore policy.generation's
// filter (the sampler still applies it): tests show with it what the
// filter changes.
var trainUnfiltered = false

// headFilter is policy.generation's top-k/top-p filter, which NeMo RL's
// training log-probabilities use (kernels.TopKTopP): top_k null or ≤ 0
// and top_p 1 switch it off.
func headFilter(c *config.Config) kernels.TopKTopP {
	g := &c.Policy.Generation
	var f kernels.TopKTopP
	if g.TopK != nil && *g.TopK > 0 {
		f.TopK = *g.TopK
	}
	if g.TopP != 1 {
		f.TopP = g.TopP
	}
	return f
}

// checkTopK refuses a top_k above the model's vocabulary: NeMo RL's
// torch.topk raises there (the filter keeps every token at top_k = V).
func checkTopK(c *config.Config, V int) error {
	if g := c.Policy.Generation; g.TopK != nil && *g.TopK > V {
		return &config.Refusal{Key: "policy.generation.top_k", Value: fmt.Sprint(*g.TopK),
			Why: fmt.Sprintf("more than the model's vocabulary of %d tokens: NeMo RL's torch.topk raises (selected index k out of range); top_k %d keeps every token", V, V)}
	}
	return nil
}

// PlanRun returns the memory plan of a train run.
func PlanRun(req PlanRequest) (p *MemPlan, err error) {
	planRuns.Add(1)
	c := req.Config
	sh, err := shapeOf(c, req.Backend, req.Rows, req.Seq, req.Builtin, noTrees(req.Model))
	if err != nil {
		return nil, err
	}
	limitTrees(req.Model, &sh)
	if err := checkTopK(c, req.Model.VocabSize); err != nil {
		return nil, err
	}
	defer func(r PlanRequest) {
		if p != nil {
			p.req = &r
		}
	}(req)
	kl := c.LossFn.ReferencePolicyKLPenalty != 0
	seqKeys := []string{"policy.max_total_sequence_length", "policy.train_micro_batch_size"}
	actKeys := slices.Clone(seqKeys)
	if !sh.opt.Recompute {
		actKeys = append(actKeys, sh.ckptKey+"=true")
	}
	return buildPlan(planParts{
		req: req, rows: sh.rows, seq: sh.seq, opt: sh.opt, precision: sh.precision, kl: kl, optimizer: true,
		sampler: sh.sampler, samplerB: sh.samplerB, samplerL: sh.samplerL,
		keys: map[string][]string{
			"activations":      actKeys,
			"reference_policy": {"loss_fn.reference_policy_kl_penalty=0"},
			"sampler_kv_cache": {"grpo.num_prompts_per_step", "grpo.num_generations_per_prompt", "policy.max_total_sequence_length"},
			"sampler_buffers":  {"grpo.num_prompts_per_step", "grpo.num_generations_per_prompt"},
			"workspace":        seqKeys,
			"weights":          {"a smaller model"},
			"gradients":        {"a smaller model"},
			"adam_moments":     {"a smaller model"},
			"weights_bf16":     {"policy.precision=float32"},
		},
	})
}

// PlanSpec is the shape of a run of a command other than train (bench,
// score): its model options as they are, with or without an optimizer, and
// the flags that shrink each part.
type PlanSpec struct {
	Request   PlanRequest
	Options   model.Options
	Optimizer bool
	Shrink    map[string][]string // component name → keys or flags
}

// PlanModelRun returns the memory plan of a model run with spec's options:
// the same parts as a train run's without the reference and the sampler.
func PlanModelRun(spec PlanSpec) (*MemPlan, error) {
	rows := spec.Request.Rows
	seq := 0
	if rows > 0 {
		seq = spec.Options.MaxTokens / rows
	}
	prec := config.PrecisionFloat32
	if spec.Options.Precision == kernels.BF16 {
		prec = config.PrecisionBFloat16
	}
	return buildPlan(planParts{req: spec.Request, rows: rows, seq: seq, opt: spec.Options, precision: prec,
		optimizer: spec.Optimizer, keys: spec.Shrink})
}

// planParts is everything buildPlan needs, for train, bench and score.
type planParts struct {
	req                PlanRequest
	rows, seq          int
	opt                model.Options
	precision          string // requested
	kl, optimizer      bool
	sampler            bool
	samplerB, samplerL int
	keys               map[string][]string
}

// buildPlan sums a run's parts: the policy, its optimizer, the reference,
// the sampler and the backend's own scratch.
func buildPlan(pp planParts) (*MemPlan, error) {
	req, opt := pp.req, pp.opt
	mc := req.Model
	// PlanModel first: it validates the config (sizes capped) before the
	// parameter table is built.
	f, err := model.PlanModel(mc, opt)
	if err != nil {
		return nil, err
	}
	table := model.NewParamTable(mc)
	world := max(req.World, 1)
	p := &MemPlan{Backend: req.Backend, Model: req.ModelName, Params: table.Total,
		Precision: "float32", Checkpointing: opt.Recompute, World: world, Sharded: req.Shard}
	if opt.Precision == kernels.BF16 {
		p.Precision = "bfloat16 (mixed: fp32 master weights, gradients and Adam)"
	} else if pp.precision == config.PrecisionBFloat16 {
		p.Notes = append(p.Notes, "policy.precision=bfloat16: the CPU backend computes in fp32 (mixed precision runs on CUDA)")
	}
	p.Rows, p.Seq = pp.rows, pp.seq
	if req.Shard {
		if f, err = model.PlanSharded(mc, opt, world, !req.NoReshard); err != nil {
			return nil, err
		}
	}
	other := opt
	other.Recompute = !opt.Recompute
	fo, err := model.PlanModel(mc, other)
	if err != nil {
		return nil, err
	}
	if opt.Recompute {
		p.ActivationsCheckpointed, p.ActivationsFull = f.Activations, fo.Activations
	} else {
		p.ActivationsCheckpointed, p.ActivationsFull = fo.Activations, f.Activations
	}
	k := maps.Clone(pp.keys)
	if k == nil {
		k = map[string][]string{}
	}
	shard := ""
	stateN := p.Params
	if req.Shard {
		shard = fmt.Sprintf(": this rank's shard, 1/%d", world)
		stateN = int(f.Grads / 4)
		if !pp.optimizer || f.Grads == 0 {
			stateN = int(f.Weights / 4)
		}
		const more = "--shard full on more ranks"
		for _, c := range []string{"weights", "weights_bf16", "gradients", "adam_moments", "reference_policy"} {
			k[c] = append(slices.Clone(k[c]), more)
		}
	}
	p.add(Component{Name: "weights", Bytes: f.Weights, What: "fp32 master weights" + shard, Shrink: k["weights"]})
	p.add(Component{Name: "weights_bf16", Bytes: f.WeightsBF16, What: "bf16 copy of the weights, remade once per optimizer step" + shard, Shrink: k["weights_bf16"]})
	p.add(Component{Name: "gradients", Bytes: f.Grads, What: "fp32 gradients" + shard, Shrink: k["gradients"]})
	if pp.optimizer {
		groups := len(table.Params)
		mdt, what := kernels.F32, "AdamW's two fp32 moments"
		if req.Config != nil {
			if oc, _, err := req.Config.Optim(); err == nil && oc.BF16Moments {
				mdt, what = kernels.BF16, "AdamW's two bf16 moments (FusedAdam exp_avg_dtype, exp_avg_sq_dtype)"
			}
		}
		p.add(Component{Name: "adam_moments", Bytes: optim.PlanBytes(stateN, groups, mdt), What: what + shard, Shrink: k["adam_moments"]})
		if mdt == kernels.BF16 {
			if opt.Precision == kernels.BF16 {
				p.Precision = "bfloat16 (mixed: fp32 master weights and gradients, bf16 Adam moments)"
			}
			p.add(Component{Name: "moment_staging", Bytes: int64(4 * min(stageChunk, stateN)), What: "float32 staging of the bf16 moments while a checkpoint is written or read"})
		}
	}
	if req.Shard {
		re := "two decoder layers at a time (reshard after forward)"
		if req.NoReshard {
			re = "every group at once (--reshard-after-forward=false)"
		}
		p.add(Component{Name: "gathered_weights", Bytes: f.Gathered,
			What:   "communication: groups all-gathered for compute (matrices in the compute precision, the embedding and vectors fp32), " + re,
			Shrink: []string{"--reshard-after-forward=true"}})
		p.add(Component{Name: "gradient_reduce", Bytes: f.GradReduce,
			What: "communication: fp32 gradients of the groups in backward and their reduce-scatters' shard-sized scratch"})
		switch {
		case req.Backend == "cpu" && world > 1:
			sh, err := model.NewSharding(&table, world, 0)
			if err != nil {
				return nil, err
			}
			block := 0
			for _, l := range sh.Len {
				block = max(block, l[model.FlatMatrix], l[model.FlatVector])
			}
			p.add(Component{Name: "collective_scratch", Bytes: 4 * int64(block),
				What: "Open MPI: the reduce-scatter ring's receive block (the largest shard)"})
		case req.Backend == "cuda" && world > 1:
			p.Notes = append(p.Notes, "NCCL's own buffers (NCCL_BUFFSIZE, 4 MiB by default, per channel and peer) are not in this plan")
		}
	} else if req.Backend == "cpu" && world > 1 {
		piece := min((table.Total+world-1)/world, collective.HostAllReduceChunk)
		p.add(Component{Name: "collective_scratch", Bytes: 4 * int64(piece),
			What: "Open MPI: the gradients' all-reduce ring's receive piece"})
	}
	what := fmt.Sprintf("%d tokens per micro-batch", opt.MaxTokens)
	if opt.Recompute {
		what += ", activation checkpointing on"
	} else {
		what += ", activation checkpointing off"
	}
	p.add(Component{Name: "activations", Bytes: f.Activations, What: what, Shrink: k["activations"]})
	if note, err := mtpPlanNote(mc, opt, f); err != nil {
		return nil, err
	} else if note != "" {
		p.Notes = append(p.Notes, note)
	}
	if pp.kl {
		r, err := model.PlanReference(mc, opt)
		what := "frozen KL reference: weights only, forward in the policy's activations"
		if req.Shard {
			r, err = model.PlanShardedReference(mc, opt, world)
			what = "frozen KL reference: this rank's shard of its weights (bf16 under mixed precision), gathered into the policy's buffers for its forward"
		}
		if err != nil {
			return nil, err
		}
		p.add(Component{Name: "reference_policy", Bytes: r.Total(), What: what, Shrink: k["reference_policy"]})
	}
	w, err := model.PlanWorkload(mc, opt)
	if err != nil {
		return nil, err
	}
	w.SumSquares = []int{p.Params}
	if pp.sampler {
		s, err := model.PlanSampler(mc, opt, pp.samplerB, pp.samplerL)
		if err != nil {
			return nil, err
		}
		if req.Shard {
			r, err := model.PlanReference(mc, opt) // a whole forward-only copy
			if err != nil {
				return nil, err
			}
			p.add(Component{Name: "sampler_weights", Bytes: r.Total(), What: "in-process generation of a sharded run: every weight, gathered before each step's rollouts",
				Shrink: []string{"--rollouts (generate outside the trainer)"}})
		}
		p.add(Component{Name: "sampler_kv_cache", Bytes: s.KVCache,
			What: fmt.Sprintf("in-process generation: keys and values of %d sequences of %d tokens", pp.samplerB, pp.samplerL), Shrink: k["sampler_kv_cache"]})
		p.add(Component{Name: "sampler_buffers", Bytes: s.Buffers + s.Rope, What: "decode activations and logits", Shrink: k["sampler_buffers"]})
		sw, err := model.SamplerWorkload(mc, opt, pp.samplerB, pp.samplerL)
		if err != nil {
			return nil, err
		}
		w = mergeWorkloads(w, sw)
	}
	p.work = w
	ws := f.Inputs + f.Rope
	if req.Workspace != nil {
		ws += req.Workspace(w)
	}
	if world > 1 && pp.optimizer && req.Config != nil {
		p.add(Component{Name: "rank_exchange", Bytes: collective.GathererBytes(world, gatherReserve),
			What: "the ranks' exchanges of each step's metrics, errors and checks (the gather buffers reserved at setup)"})
	}
	p.add(Component{Name: "workspace", Bytes: ws, What: "token buffers, RoPE tables and the backend's own scratch", Shrink: k["workspace"]})
	if req.Backend == "cpu" {
		if rss, _, ok := meminfo.Self(); ok {
			p.add(Component{Name: "process", Bytes: rss, What: "the process itself before the run allocates: Go runtime, program, configuration (measured in this process)"})
		}
	}
	if req.Backend == "cpu" && req.Resume && !req.Shard {
		n := 3 * 4 * int64(p.Params)
		p.add(Component{Name: "checkpoint_staging", Bytes: n, What: "resume: the checkpoint's weights and moments read into memory before they are copied in"})
	}
	if err := p.finish(); err != nil {
		return nil, err
	}
	return p, nil
}

func mergeWorkloads(a, b kernels.Workload) kernels.Workload {
	a.GEMMs = append(a.GEMMs, b.GEMMs...)
	a.Heads = append(a.Heads, b.Heads...)
	a.RowNorms = append(a.RowNorms, b.RowNorms...)
	a.Biases = append(a.Biases, b.Biases...)
	a.QKRopes = append(a.QKRopes, b.QKRopes...)
	a.Attention = append(a.Attention, b.Attention...)
	a.Trees = append(a.Trees, b.Trees...)
	a.Decode = append(a.Decode, b.Decode...)
	a.SumSquares = append(a.SumSquares, b.SumSquares...)
	a.Grouped = append(a.Grouped, b.Grouped...)
	a.Routes = append(a.Routes, b.Routes...)
	a.Scans = append(a.Scans, b.Scans...)
	a.Convs = append(a.Convs, b.Convs...)
	return a
}

// WriteText prints the plan, one component per line, then the total.
func (p *MemPlan) WriteText(w io.Writer) {
	fmt.Fprintf(w, "memory plan: %s on %s, %s parameters, %s", p.Model, p.Backend, commas(int64(p.Params)), p.Precision)
	if p.World > 1 || p.Sharded {
		mode := "each holding the whole model"
		if p.Sharded {
			mode = "fully sharded"
		}
		fmt.Fprintf(w, ", one rank of %d (%s)", p.World, mode)
	}
	if p.Rows > 0 {
		fmt.Fprintf(w, ", %d × %d tokens", p.Rows, p.Seq)
	}
	fmt.Fprintln(w)
	for _, c := range p.Components {
		fmt.Fprintf(w, "  %-20s %12s  %s\n", c.Name, Bytes(c.Bytes), c.What)
	}
	fmt.Fprintf(w, "  %-20s %12s\n", "total", Bytes(p.TotalBytes))
	fmt.Fprintf(w, "  activations: %s with checkpointing, %s without\n", Bytes(p.ActivationsCheckpointed), Bytes(p.ActivationsFull))
	for _, n := range p.Notes {
		fmt.Fprintf(w, "  note: %s\n", n)
	}
}

// JSON returns the plan as one JSON object.
func (p *MemPlan) JSON() []byte {
	b, _ := json.Marshal(p)
	return b
}

// Bytes formats a byte count for people: "1.50 GiB".
func Bytes(n int64) string {
	switch {
	case n >= 1<<30:
		return fmt.Sprintf("%.2f GiB", float64(n)/(1<<30))
	case n >= 1<<20:
		return fmt.Sprintf("%.1f MiB", float64(n)/(1<<20))
	case n >= 1<<10:
		return fmt.Sprintf("%.1f KiB", float64(n)/(1<<10))
	}
	return fmt.Sprintf("%d B", n)
}

func commas(n int64) string {
	s := strconv.FormatInt(n, 10)
	var b strings.Builder
	for i, c := range s {
		if i > 0 && (len(s)-i)%3 == 0 {
			b.WriteByte(',')
		}
		b.WriteRune(c)
	}
	return b.String()
}

// ErrWontFit marks a run refused because its memory plan exceeds the
// memory free for it.
var ErrWontFit = fmt.Errorf("the run does not fit in memory")

// backendAs returns the first backend in be's chain of wrappers (a test's
// or a profiler's, through Unwrap() kernels.Backend) that implements T.
func backendAs[T any](be kernels.Backend) (T, bool) {
	for {
		if x, ok := be.(T); ok {
			return x, true
		}
		u, ok := be.(interface{ Unwrap() kernels.Backend })
		if !ok {
			var zero T
			return zero, false
		}
		be = u.Unwrap()
	}
}

// WorkspacePlanner returns how be (or the backend it wraps) sizes its ops'
// scratch, or nil when it does not say.
func WorkspacePlanner(be kernels.Backend) func(kernels.Workload) int64 {
	if p, ok := backendAs[interface {
		PlanWorkspace(kernels.Workload) int64
	}](be); ok {
		return p.PlanWorkspace
	}
	return nil
}

// CheckFree refuses a plan that exceeds the memory free on be (Free); with
// nothing to read it refuses nothing.
func CheckFree(p *MemPlan, be kernels.Backend) error {
	free, source, ok, err := Free(be)
	if err != nil || !ok {
		return err
	}
	return p.Check(free, source)
}

// MemoryEnv overrides the free memory a plan is checked against, in bytes
// (or with a K, M, G or T suffix): for a machine shared with other jobs.
const MemoryEnv = "TRACEGRPO_MEMORY"

// Free returns the memory a run on be may still allocate and where the
// figure came from: cuMemGetInfo's free bytes on CUDA, the cgroup limit or
// MemAvailable on the CPU, or $TRACEGRPO_MEMORY. ok is false when nothing
// could be read (the run then is not refused).
func Free(be kernels.Backend) (bytes int64, source string, ok bool, err error) {
	if s := os.Getenv(MemoryEnv); s != "" {
		n, err := ParseBytes(s)
		if err != nil {
			return 0, "", false, fmt.Errorf("$%s: %w", MemoryEnv, err)
		}
		return n, "$" + MemoryEnv, true, nil
	}
	if mi, isDev := backendAs[interface {
		MemInfo() (free, total int64, err error)
	}](be); isDev {
		free, total, err := mi.MemInfo()
		if err != nil {
			return 0, "", false, err
		}
		return free, fmt.Sprintf("cuMemGetInfo: %s free of %s", Bytes(free), Bytes(total)), true, nil
	}
	a, ok := meminfo.Host()
	return a.Bytes, a.Source, ok, nil
}

// ParseBytes reads a byte count such as 8G or 8589934592 (K, M, G, T:
// binary multiples).
func ParseBytes(s string) (int64, error) {
	mult := int64(1)
	t := strings.TrimSpace(s)
	if n := len(t); n > 0 {
		switch strings.ToUpper(t[n-1:]) {
		case "K":
			mult = 1 << 10
		case "M":
			mult = 1 << 20
		case "G":
			mult = 1 << 30
		case "T":
			mult = 1 << 40
		}
		if mult > 1 {
			t = t[:n-1]
		}
	}
	v, err := strconv.ParseFloat(t, 64)
	if err != nil || !(v >= 0) {
		return 0, fmt.Errorf("expected a byte count such as 8G or 8589934592, found %q", s)
	}
	// float64(math.MaxInt64) rounds up to 2^63, which int64 cannot hold.
	if b := v * float64(mult); !(b < math.MaxInt64) {
		return 0, fmt.Errorf("%q is more than %d bytes (8 EiB): expected a byte count such as 8G", s, int64(math.MaxInt64))
	}
	return int64(v * float64(mult)), nil
}

// Check refuses the plan when it exceeds free bytes: the error names the
// total, the free memory and its source, and the three largest parts with
// the keys that shrink them.
func (p *MemPlan) Check(free int64, source string) error {
	if p.TotalBytes <= free {
		return nil
	}
	cs := slices.Clone(p.Components)
	slices.SortStableFunc(cs, func(a, b Component) int {
		switch {
		case a.Bytes > b.Bytes:
			return -1
		case a.Bytes < b.Bytes:
			return 1
		}
		return 0
	})
	var b strings.Builder
	fmt.Fprintf(&b, "%v: the plan needs %s on %s, %s is free (%s); the largest parts:",
		ErrWontFit, Bytes(p.TotalBytes), p.Backend, Bytes(free), source)
	for _, c := range cs[:min(3, len(cs))] {
		fmt.Fprintf(&b, "\n  %-18s %10s  %s", c.Name, Bytes(c.Bytes), c.What)
		if len(c.Shrink) > 0 {
			fmt.Fprintf(&b, " (shrink with %s)", strings.Join(c.Shrink, ", "))
		}
	}
	if r := p.fitWorld(free); r.ok && (r.world > p.World || !p.Sharded) {
		fmt.Fprintf(&b, "\nfully sharded (--shard full), it fits on %d ranks: %s per rank", r.world, Bytes(r.plan.TotalBytes))
	} else if !r.ok && r.most != nil {
		if r.fixed > free {
			var parts []string
			for _, c := range r.fixedPart {
				parts = append(parts, fmt.Sprintf("%s %s", c.Name, Bytes(c.Bytes)))
			}
			fmt.Fprintf(&b, "\nit does not fit on any number of ranks: the parts that more ranks do not shrink need %s per rank alone (%s); shrink them",
				Bytes(r.fixed), strings.Join(parts, ", "))
		} else {
			fmt.Fprintf(&b, "\nit does not fit even fully sharded (--shard full) on %d ranks: %s per rank", maxFitWorld, Bytes(r.most.TotalBytes))
		}
	}
	fmt.Fprintf(&b, "\n(train plan prints the whole plan; $%s overrides the free memory)", MemoryEnv)
	return &wontFit{msg: b.String()}
}

type wontFit struct{ msg string }

func (e *wontFit) Error() string { return e.msg }
func (e *wontFit) Unwrap() error { return ErrWontFit }
