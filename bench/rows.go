package bench

import (
	"encoding/json"
	"fmt"
	"math/rand/v2"
	"strconv"
	"time"

	"github.com/tracegrpo/tracegrpo/collective"
	"github.com/tracegrpo/tracegrpo/kernels"
	"github.com/tracegrpo/tracegrpo/kernels/cuda"
	"github.com/tracegrpo/tracegrpo/kernels/cuda/gpumodel"
	"github.com/tracegrpo/tracegrpo/model"
	"github.com/tracegrpo/tracegrpo/trainer"
)

// Result is the JSON line RunRows prints.
type Result struct {
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
	// The backend's kernel path and rounding path, where it has them
	// (kernels.Numerics: the CPU's SIMD micro-kernel and its CPU).
	KernelPath   string `json:"kernel_path,omitempty"`
	RoundingPath string `json:"rounding_path,omitempty"`
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

// Rows is a run on random tokens: Rows packed sequences of Seq tokens per
// step, split among the ranks in blocks (collective.Block), the gradients
// all-reduced, or with Shard fully sharded data parallel.
type Rows struct {
	Common
	Rows, Seq int
	Shard     bool   // shard weights, gradients and Adam moments over the ranks
	NoReshard bool   // with Shard: keep every layer gathered from forward to backward
	Save      string // write the final weights as HF safetensors here ("": do not)
	Profile   bool   // print the time per op to Env.Stderr
	// Ledger: after the timed steps, one more step with each launch timed
	// on the device, printed to Env.Stderr beside the roofline's
	// prediction of each (cuda.Prediction.Compare; a CUDA backend only).
	Ledger bool
}

// RunRows runs one warm-up step and r.Steps timed steps, and prints a Result.
func RunRows(env Env, r Rows) error {
	be := env.Backend
	res := Result{Backend: be.Name(), Threads: env.Threads, Model: r.ModelName, Rows: r.Rows, Seq: r.Seq, Steps: r.Steps,
		Recompute: r.Recompute, WeightsFrom: "random", Ranks: env.Size}
	if n, ok := be.(kernels.Numerics); ok {
		res.KernelPath, res.RoundingPath = n.KernelPath(), n.RoundingPath()
	}
	var tl cuda.TimedLedgered
	if r.Ledger {
		var ok bool
		if tl, ok = be.(cuda.TimedLedgered); !ok {
			return fmt.Errorf("bench: --ledger times each launch on a CUDA device; the %s backend has no launch ledger", be.Name())
		}
	}
	var prof *timedBackend
	if r.Profile {
		prof = newTimedBackend(be)
		be = prof.profiled()
	}
	// This rank's share of the rows (all of them for one process).
	lo, hi := collective.Block(r.Rows, env.Rank, env.Size)
	myRows := hi - lo
	T := myRows * r.Seq
	opt := model.Options{MaxTokens: T, MaxSeqs: myRows, Recompute: r.Recompute}
	opt.Precision, res.Precision = r.precision(be, env.Stderr)
	sharded := r.Shard
	comm := env.Comm
	if comm == nil {
		comm = collective.Single(be)
	}
	res.Sharded = sharded
	planSpec := trainer.PlanSpec{
		Request: trainer.PlanRequest{Model: r.Model, ModelName: r.ModelName, Backend: be.Name(), Rows: myRows,
			Workspace: trainer.WorkspacePlanner(be), World: env.Size, Shard: sharded, NoReshard: r.NoReshard},
		Options: opt, Optimizer: true,
		Shrink: map[string][]string{"activations": {"--rows", "--seq", "--recompute"}, "workspace": {"--rows", "--seq"},
			"weights": {"a smaller --model"}, "gradients": {"a smaller --model"}, "adam_moments": {"a smaller --model"}},
	}
	plan, err := trainer.PlanModelRun(planSpec)
	if err != nil {
		return fmt.Errorf("bench: %w", err)
	}
	if err := trainer.CheckFree(plan, be); err != nil {
		return fmt.Errorf("bench: %w", err)
	}
	// The LM head's logits scratch as train sizes it, from what the plan
	// leaves free (CUDA), so that the bench times train's step.
	if sz, ok := be.(interface {
		SizeLogitsScratch(headroom int64) (int, bool)
	}); ok {
		if free, _, ok, err := trainer.Free(be); err == nil && ok {
			if _, changed := sz.SizeLogitsScratch(free - plan.TotalBytes); changed {
				if plan, err = trainer.PlanModelRun(planSpec); err != nil {
					return fmt.Errorf("bench: %w", err)
				}
			}
		}
	}
	res.PlanMiB = float64(plan.TotalBytes) / (1 << 20)
	var m *model.Model
	if sharded {
		m, err = model.NewSharded(be, r.Model, opt, model.ShardOptions{Comm: comm, ReshardAfterForward: !r.NoReshard})
	} else {
		m, err = model.New(be, r.Model, opt)
	}
	if err != nil {
		return fmt.Errorf("bench: %w", err)
	}
	defer m.Close()
	res.Params = m.Table().Total
	if r.Weights != "" {
		if err := m.LoadHF(r.Weights); err != nil {
			return fmt.Errorf("bench: %w", err)
		}
		res.WeightsFrom = r.Weights
	} else {
		m.InitRandomParallel(r.Seed) // on every core: a 1.7B model's single stream took 15-38 s
	}
	opts, err := benchOptimizer(be, m, comm, sharded, r.Eps)
	if err != nil {
		return fmt.Errorf("bench: %w", err)
	}
	defer opts.Close()
	// The step's tokens and dL/dlogprob for every row, drawn the same on
	// every rank; this rank takes its block of rows.
	rng := rand.New(rand.NewPCG(r.Seed, 2))
	all := r.Rows * r.Seq
	tokens := make([]int32, all)
	for i := range tokens {
		tokens[i] = int32(rng.IntN(r.Model.VocabSize))
	}
	dl := make([]float32, all)
	for i := range dl {
		dl[i] = float32(rng.NormFloat64()) / float32(all)
	}
	tokens, dl = tokens[lo*r.Seq:hi*r.Seq], dl[lo*r.Seq:hi*r.Seq]
	cu := make([]int32, myRows+1)
	for s := range cu {
		cu[s] = int32(s * r.Seq)
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
		if env.Comm != nil && env.Size > 1 && !sharded {
			if err := env.Comm.AllReduceSum(m.Grads()); err != nil {
				return err
			}
		}
		if _, err := opts.Step(r.LR, 0.01); err != nil {
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
	times := make([]float64, r.Steps)
	for i := range times {
		t0 := time.Now()
		if err := step(i + 2); err != nil {
			return fmt.Errorf("bench: step %d: %w", i+1, err)
		}
		times[i] = float64(time.Since(t0).Nanoseconds()) / 1e6
		if prof != nil {
			prof.endStep()
		}
	}
	if tl != nil {
		tl.StartTimedLedger()
		err := step(r.Steps + 2)
		led := tl.TakeLedger()
		if err == nil {
			err = env.Backend.Sync()
		}
		if err != nil {
			return fmt.Errorf("bench: the timed-ledger step: %w", err)
		}
		pred := cuda.H200.PredictLedger(led, nil)
		fmt.Fprint(env.Stderr, pred.Compare(gpumodel.ModelFLOPs(r.Model, r.Rows, r.Seq)))
	}
	res.MsPerStep, res.MsMin = medianMin(times)
	res.TokensPerS = float64(r.Rows*r.Seq) / (res.MsPerStep / 1e3) // every rank's tokens
	res.PeakRSSMiB = peakRSSMiB()
	res.FinalLogp = lastMean
	if sharded {
		after := m.CommStats()
		res.CommGatherMiB = float64(after.GatherBytes-before.GatherBytes) / float64(r.Steps) / (1 << 20)
		res.CommReduceMiB = float64(after.ReduceScatterBytes-before.ReduceScatterBytes) / float64(r.Steps) / (1 << 20)
	}
	for _, c := range plan.Components {
		switch c.Name {
		case "weights", "weights_bf16", "gradients", "adam_moments":
			res.ModelStateMiB += float64(c.Bytes) / (1 << 20)
		case "gathered_weights", "gradient_reduce":
			res.CommBuffersMiB += float64(c.Bytes) / (1 << 20)
		}
	}
	// Every rank's peak RSS is read here, after the steps and before the
	// save, as the one process's is: the plan is the training step's, and
	// rank 0's save (its host chunk, the garbage of the gathers) would add
	// to rank 0's alone, by as much as the collector had not yet freed.
	mine := []byte(strconv.FormatFloat(res.PeakRSSMiB, 'f', 3, 64) + " " + strconv.FormatFloat(res.PlanMiB, 'f', 3, 64))
	if r.Save != "" {
		if err := m.SaveHF(r.Save); err != nil {
			return fmt.Errorf("bench: save: %w", err)
		}
	}
	if env.Size > 1 {
		// Every rank's peak RSS, for the memory plan's check per rank.
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
		var peak Peak
		if env.Peak != nil {
			peak = env.Peak()
		}
		prof.report(env.Stderr, r.Steps, sumOf(times), peak)
	}
	b, _ := json.Marshal(res)
	fmt.Fprintln(env.Stdout, string(b))
	return nil
}
