package trainer

import (
	_ "embed"
	"encoding/json"
	"fmt"
	"io"
	"os"
	"path/filepath"
	"strings"

	"github.com/tracegrpo/tracegrpo/collective"
	"github.com/tracegrpo/tracegrpo/config"
	"github.com/tracegrpo/tracegrpo/grpo"
	"github.com/tracegrpo/tracegrpo/internal/inputfile"
	"github.com/tracegrpo/tracegrpo/internal/tfevents"
	"github.com/tracegrpo/tracegrpo/kernels"
	"github.com/tracegrpo/tracegrpo/model"
	"github.com/tracegrpo/tracegrpo/optim"
	"github.com/tracegrpo/tracegrpo/rollout"
)

//go:embed builtin/recipe.yaml
var builtinRecipe []byte

//go:embed builtin/tiny-qwen3.json
var builtinModelConfig []byte

//go:embed builtin/tiny-qwen3-moe.json
var builtinMoEConfig []byte

//go:embed builtin/tiny-nemotron-h.json
var builtinHybridConfig []byte

// builtinModelName is the policy.model_name of the embedded tiny model.
const builtinModelName = "tracegrpo/tiny-qwen3"

// BuiltinModelName is the policy.model_name of the embedded tiny model.
const BuiltinModelName = builtinModelName

// builtinModels are the embedded models policy.model_name may name, with
// random weights from grpo.seed: the built-in job's dense model, and a
// sparse one of the same shape whose layers route each token to 2 of 8
// experts of half the dense MLP's width (the same active parameters); and
// a Nemotron-H of the same width whose four blocks are a Mamba-2 mixer,
// attention, a Mamba-2 mixer and a sparse block (8 experts, 2 per token,
// and a shared expert).
var builtinModels = map[string]struct {
	file string
	cfg  []byte
}{
	builtinModelName:            {"builtin/tiny-qwen3.json", builtinModelConfig},
	"tracegrpo/tiny-qwen3-moe":  {"builtin/tiny-qwen3-moe.json", builtinMoEConfig},
	"tracegrpo/tiny-nemotron-h": {"builtin/tiny-nemotron-h.json", builtinHybridConfig},
}

// IsBuiltinModel reports whether policy.model_name names an embedded model.
func IsBuiltinModel(name string) bool { return builtinModels[name].cfg != nil }

// Trainer holds everything one run needs. Its fields are set once by New;
// the loop in Run mutates only the step state.
type Trainer struct {
	o        Options
	cfg      config.Config
	name     string // run name (recipe base name, or "builtin")
	out      string // run directory
	maxSteps int

	be        kernels.Backend
	modelCfg  model.Config
	model     *model.Model
	ref       *model.Model // frozen initial policy; nil when β = 0
	init      initSource
	opt       *optim.AdamW
	sched     optim.Schedule
	lossOpt   grpo.LossOptions
	batchOpt  grpo.BatchOptions
	builder   string
	temp      float32
	maxTokens int  // tokens of one packed micro-batch
	maxSegs   int  // segments of one packed tree
	shared    bool // policy.shared_prefix: micro-batches are token tries
	// routerLossCoef weighs a sparse model's load-balancing loss in the
	// step's loss (0: not part of it; see newModels).
	routerLossCoef float64
	// biasRate is the selection biases' update rate (aux-loss-free load
	// balancing, expertbias.go): policy.megatron_cfg.moe_router_bias_update_rate
	// for a model whose routers have one, else 0.
	biasRate float64
	// loadViolation is the last step's expert_load_max_violation (nil
	// without selection biases or routed tokens).
	loadViolation *float64
	// mtp is the multi-token prediction loss (mtp.go).
	mtp    mtpRun
	mtpBuf mtpBuffers

	// streams keys every random decision of the built-in rollouts by
	// (seed, step, task group, rollout, call): nothing to checkpoint.
	streams rollout.Streams
	source  rolloutSource

	stop *stopWatch // the first stop request (SIGINT/SIGTERM)

	wout      *weightsOut // --weights-out (nil: none)
	maxMasked float64     // --max-masked-fraction

	shardFull   bool         // fully sharded data parallel (shard.go)
	shardWhy    string       // what asked for it
	sampleModel *model.Model // the sampler's gathered weights when sharded (built-in job)
	restoreRead int64        // bytes of tensor files the resume read (sharded layout reader)

	comm        collective.Comm      // the ranks of the run (collective.Single for one)
	plan        *MemPlan             // the plan checkPlan checked
	gatherer    *collective.Gatherer // the ranks' exchanges of metrics, errors and hashes (buffers reserved in New)
	rank        int
	rowMultiple int // grpo.RowMultiple: physical rows are padded (in count) to it

	metricsFile metricsFile      // metrics.jsonl, open for appending (rank 0)
	tb          *tfevents.Writer // TensorBoard events (rank 0, logger.tensorboard_enabled)
	progress    *progressLine
	unlock      func() // releases the run directory's lock

	// resumeFrom is the checkpoint a --resume run continues ("" to start at
	// step 0); resumeNote says why none was usable.
	resumeFrom, resumeNote string
	loaded                 *config.Loaded // the recipe as read, for the effective config

	// step state
	step     int    // GRPO steps completed
	consumed int64  // logical rollouts consumed
	runID    string // the run's id (checkpoint.TrainerState.RunID), rank 0's in a save

	// per-step scratch, sized on first use
	rowLP, rowLPOld, rowLPRef, rowEnt, rowDLP [][]float64
	// Under a top-k/top-p filter with a KL penalty: the unfiltered current
	// log-probs the KL reads and their gradient; and, per row, the
	// positions whose target the filter drops (NeMo RL's −inf, masked).
	rowLPFull, rowDLPFull [][]float64
	rowNegInf             [][]bool
	stageErr              error       // hostCopy's staging of a bf16 arena failed
	stage                 kernels.Buf // F32 staging of bf16 moments for checkpoints (the plan's moment_staging)
	dlogprobFull          []float32
	lossRows              []grpo.LossRow
	rowPosts              []rowPost
	dlogprob              []float32
	dpair                 []float64
}

// initSource says where the initial weights came from, so that a resumed run
// can rebuild the frozen reference policy.
type initSource struct {
	Kind string `json:"kind"` // "random" or "hf"
	Seed uint64 `json:"seed,omitempty"`
	Dir  string `json:"dir,omitempty"`
}

// New checks the configuration and every input, builds the policy, the
// optimizer and the rollout source on o.Backend, and resumes when asked.
// Nothing is trained until Run. The caller closes the backend after Close.
func New(o Options) (_ *Trainer, err error) {
	if o.Backend == nil {
		return nil, fmt.Errorf("trainer: Options.Backend is nil")
	}
	if o.Log == nil {
		o.Log = io.Discard
	}
	if o.Tasks == nil {
		o.Tasks = rollout.TaskNames()
	}
	if o.OnNonFinite == "" {
		o.OnNonFinite = "skip"
	}
	if o.MaxMaskedFraction == nil {
		f := DefaultMaxMaskedFraction
		o.MaxMaskedFraction = &f
	}
	t := &Trainer{o: o, comm: o.Comm, be: o.Backend}
	if t.comm == nil {
		t.comm = collective.Single(o.Backend)
	}
	t.gatherer = collective.NewGatherer(t.comm, t.be) // allocates when first used, and at setupPolicy
	t.rank = t.comm.Rank()
	if t.rank != 0 {
		t.o.Quiet = true // rank 0 speaks for the run
	}
	defer func() {
		if err != nil {
			t.Close()
		}
	}()
	t.watchSignals()

	// Every rank sets up the same run; after each phase the ranks agree,
	// so that a failure on one fails all, naming it, and none waits.
	if err := t.agree(t.setupConfig()); err != nil {
		return nil, err
	}
	if err := t.agreeOnIdentity(); err != nil {
		return nil, err
	}
	if err := t.agree(t.setupRunDir()); err != nil {
		return nil, err
	}
	if err := t.agree(t.checkOutWritable()); err != nil {
		return nil, err
	}
	if err := t.agree(t.setupPolicy()); err != nil {
		return nil, err
	}
	if err := t.checkSameWeights("start"); err != nil {
		return nil, err
	}
	if err := t.agree(t.setupFiles()); err != nil {
		return nil, err
	}
	if err := t.agree(t.reserveWorkspace()); err != nil {
		return nil, err
	}
	return t, nil
}

// setupConfig reads the configuration (the recipe or the built-in one,
// --set, --steps), runs every capability guard, and checks the rollout
// source's inputs, before any work.
func (t *Trainer) setupConfig() error {
	o := &t.o
	if err := t.loadConfig(); err != nil {
		return err
	}
	c := &t.cfg
	// The same refusals train config --check makes; the model decides the
	// keys that configure experts (a model that cannot be resolved fails
	// in setupPolicy, naming why).
	experts := config.ExpertsUnknown
	if mc, _, err := resolveModel(c, o.InitFrom); err == nil {
		experts = ExpertsOf(mc)
	}
	if err := CheckFor(t.loaded, o.Steps, experts); err != nil {
		return err
	}
	t.maxSteps = c.GRPO.MaxNumSteps
	t.builder = c.Env.NemoGym.TokenIDCapture.Builder
	t.temp = float32(c.Policy.Generation.Temperature)
	var err error
	if t.lossOpt, err = grpo.NewLossOptions(&c.LossFn); err != nil {
		return err
	}
	switch o.OnNonFinite {
	case "skip", "abort":
	default:
		return fmt.Errorf("%w: --on-nonfinite %q: want skip or abort", ErrUsage, o.OnNonFinite)
	}
	if o.Wait < 0 {
		return fmt.Errorf("%w: --wait %v: want 0 (do not wait) or a positive duration", ErrUsage, o.Wait)
	}
	if f := *o.MaxMaskedFraction; !(f >= 0 && f <= 1) {
		return fmt.Errorf("%w: --max-masked-fraction %v: want a share from 0 (stop at any mask) to 1 (never stop)", ErrUsage, f)
	}
	t.maxMasked = *o.MaxMaskedFraction
	if o.WeightsKeep < 0 {
		return fmt.Errorf("%w: --weights-keep %d: want at least 1", ErrUsage, o.WeightsKeep)
	}
	if _, _, _, err := c.WeightsOut(); err != nil {
		return err
	}
	if len(o.ConfigFiles) > 0 { // the built-in job runs on any number of ranks
		if err := checkCluster(c, t.comm.Size()); err != nil {
			return err
		}
	}
	if t.shardFull, t.shardWhy, err = ShardChoice(c, o.Shard, t.comm.Size()); err != nil {
		return err
	}
	if n := t.comm.Size(); n > c.GRPO.NumPromptsPerStep {
		t.logf("warning: %d ranks share %d task groups per step: %d ranks train nothing", n, c.GRPO.NumPromptsPerStep, n-c.GRPO.NumPromptsPerStep)
	}
	t.source, err = t.newSource()
	return err
}

// setupRunDir opens the run directory (rank 0: locked, checked against the
// inputs) and decides where a resumed run starts before anything in it is
// written; every rank decides from the same checkpoints.
func (t *Trainer) setupRunDir() error {
	t.out = t.o.Out
	if t.out == "" {
		t.out = filepath.Join("runs", t.name)
	}
	if t.rank == 0 {
		if err := t.openRunDir(); err != nil {
			return err
		}
	}
	if t.o.Resume {
		if err := t.findCheckpoint(); err != nil {
			return err
		}
	}
	return t.setupWeightsOut()
}

// gatherReserve is the payload, in bytes, the ranks' gather buffers hold
// from setup on: a step's exchanges (its metrics, an error, a weights hash)
// take a few hundred bytes.
const gatherReserve = 16 << 10

// setupPolicy builds the policy, the optimizer and the rollout source, and
// restores a resumed run's state.
func (t *Trainer) setupPolicy() error {
	c := &t.cfg
	if err := t.newModels(); err != nil {
		return err
	}
	if err := t.gatherer.Reserve(gatherReserve); err != nil {
		return err
	}
	// Each rank builds rows for its own share: no padding (a count in the
	// metrics, over the whole step) and no refusal of a share with nothing
	// to train (the step as a whole is checked).
	t.rowMultiple = grpo.RowMultiple(c)
	t.batchOpt = grpo.BatchOptions{
		PadTokenID:  padToken(t.modelCfg),
		MaxSeqLen:   c.Policy.MaxTotalSequenceLength,
		RowMultiple: 1,
		Advantage:   grpo.AdvantageOptionsFrom(c),
		Shard:       true,
	}
	if err := t.newOptimizer(); err != nil {
		return err
	}
	t.streams = rollout.Streams{Seed: uint64(c.GRPO.Seed)}
	if err := t.source.start(t); err != nil {
		return err
	}
	var err error
	if t.runID, err = t.newRunID(); err != nil {
		return err
	}
	if t.resumeFrom != "" {
		return t.restore()
	}
	if t.o.Resume {
		t.logf("resume: no complete checkpoint in %s%s: starting at step 0", t.checkpointDir(), t.resumeNote)
	}
	return nil
}

// setupFiles writes the effective config and opens the metrics log (rank
// 0), and says what the run is.
func (t *Trainer) setupFiles() error {
	c := &t.cfg
	if t.rank == 0 {
		if err := t.writeEffectiveConfig(); err != nil {
			return err
		}
		if err := t.openMetrics(); err != nil {
			return err
		}
	}
	if err := t.openLoggers(); err != nil {
		return err
	}
	if f := headFilter(c); f.On(t.modelCfg.VocabSize) {
		kl := ""
		if c.LossFn.ReferencePolicyKLPenalty != 0 {
			kl = "; the KL penalty reads the unfiltered ones, against an unfiltered reference"
		}
		t.logf("policy.generation top_k=%s top_p=%v: the training log-probabilities and entropy are NeMo RL's top-k/top-p filtered ones "+
			"(a token outside the filter counts with log-probability 0 and no gradient, as NeMo RL masks it)%s", ptrStr(c.Policy.Generation.TopK), c.Policy.Generation.TopP, kl)
	}
	t.progress = newProgressLine(t.o.Log, t.o.Quiet, t.maxSteps)
	ranks := ""
	if n := t.comm.Size(); n > 1 {
		ranks = fmt.Sprintf(", %d ranks (%s)", n, t.comm.Name())
	}
	if t.shardFull {
		re := "gathered again for backward"
		if t.o.NoReshard {
			re = "kept gathered through backward"
		}
		ranks += fmt.Sprintf(", fully sharded (%s; layer weights %s)", t.shardWhy, re)
	}
	t.logf("run %s: %s (%d parameters), %d steps of %d logical rollouts, builder %s, out %s%s",
		t.name, t.modelCfg.Arch, t.model.Table().Total, t.maxSteps, c.Policy.TrainGlobalBatchSize, t.builder, t.out, ranks)
	t.logf("effective config: %s (also in every checkpoint's trainer_state.json)", filepath.Join(t.out, "config.yaml"))
	mo := t.model.Options()
	ckpt := "off"
	if mo.Recompute {
		ckpt = "on"
	}
	_, key := c.ActivationCheckpointing()
	pack := "each trace its own sequence (policy.shared_prefix=off)"
	if t.shared {
		pack = "token tries, every shared prefix once (policy.shared_prefix=auto)"
	}
	t.logf("compute: %s on %s, activation checkpointing %s (%s), %d tokens per micro-batch packed as %s", precisionName(mo.Precision), t.be.Name(), ckpt, key, mo.MaxTokens, pack)
	return nil
}

func precisionName(p kernels.DType) string {
	if p == kernels.BF16 {
		return "bf16 mixed precision (fp32 master weights, gradients and Adam)"
	}
	return "fp32"
}

// Close releases what New built (not the backend).
func (t *Trainer) Close() {
	if t.metricsFile != nil {
		t.metricsFile.Close()
	}
	if t.tb != nil {
		t.tb.Close()
	}
	if t.source != nil {
		t.source.close()
	}
	if t.opt != nil {
		t.opt.Close()
	}
	if t.stage.N > 0 {
		t.be.Free(t.stage)
		t.stage = kernels.Buf{}
	}
	if t.ref != nil {
		t.ref.Close()
	}
	if t.sampleModel != nil {
		t.sampleModel.Close()
	}
	if t.model != nil {
		t.model.Close()
	}
	if t.gatherer != nil {
		t.gatherer.Close()
	}
	if t.unlock != nil {
		t.unlock()
		t.unlock = nil
	}
}

// logf writes one line of setup information to stderr.
func (t *Trainer) logf(format string, args ...any) {
	if !t.o.Quiet {
		fmt.Fprintf(t.o.Log, "train: "+format+"\n", args...)
	}
}

// maxSamples bounds the logical rollouts a run may schedule: the scheduler
// counts them in int64 and derives its iterations in float64, where
// integers are exact up to 2^53.
const maxSamples = 1 << 53

// checkStepCount refuses a run length that is not positive or whose rollout
// count overflows the schedule, naming --steps when it came from there.
func checkStepCount(c *config.Config, flagSteps int) error {
	name := "grpo.max_num_steps"
	if flagSteps > 0 {
		name = "--steps"
	}
	n, gbs := int64(c.GRPO.MaxNumSteps), int64(c.Policy.TrainGlobalBatchSize)
	if n < 1 {
		return fmt.Errorf("%w: %s=%d: a run needs at least one step", ErrUsage, name, n)
	}
	if gbs > 0 && n > maxSamples/gbs {
		return fmt.Errorf("%w: %s=%d: %d steps of %d logical rollouts overflow the schedule's rollout count (at most %d steps at this batch size)",
			ErrUsage, name, n, n, gbs, maxSamples/gbs)
	}
	return nil
}

// loadConfig reads the recipe, applies --set and --steps, and names the run.
func (t *Trainer) loadConfig() error {
	sets := append([]string(nil), t.o.Sets...)
	switch t.o.SharedPrefix {
	case "":
	case config.SharedPrefixAuto, config.SharedPrefixOff:
		sets = append(sets, "policy.shared_prefix="+t.o.SharedPrefix)
	default:
		return fmt.Errorf("%w: --shared-prefix %q: want auto or off", ErrUsage, t.o.SharedPrefix)
	}
	if t.o.Steps > 0 {
		sets = append(sets, fmt.Sprintf("grpo.max_num_steps=%d", t.o.Steps))
	}
	if t.o.WeightsOut != "" {
		sets = append(sets, "policy.generation.weights_out="+t.o.WeightsOut)
	}
	if t.o.WeightsDType != "" {
		if _, ok := weightsDTypes[t.o.WeightsDType]; !ok {
			return fmt.Errorf("%w: --weights-dtype %q: want bfloat16, float16 or float32", ErrUsage, t.o.WeightsDType)
		}
		sets = append(sets, "policy.generation.weights_dtype="+t.o.WeightsDType)
	}
	if t.o.WeightsKeep > 0 {
		sets = append(sets, fmt.Sprintf("policy.generation.weights_keep=%d", t.o.WeightsKeep))
	}
	ld, name, err := LoadRecipeWith(t.o.ConfigFiles, t.o.Overrides, sets)
	if err != nil {
		return err
	}
	t.cfg, t.loaded, t.name = ld.Config, ld, name
	if len(ld.Ignored) > 0 {
		n := fmt.Sprintf("%d keys", len(ld.Ignored))
		if len(ld.Ignored) == 1 {
			n = "1 key"
		}
		t.logf("%s ignored (engines and services tracegrpo does not run, keys NeMo RL never reads): train config --keys lists them and why", n)
	}
	for _, w := range ld.Warnings() {
		// Said even under --quiet: a key the run does not use.
		if t.rank == 0 {
			fmt.Fprintf(t.o.Log, "train: warning: %s\n", w)
		}
	}
	return nil
}

// BuiltinRecipeName is how the embedded built-in recipe is named in errors
// and in the effective config's header.
const BuiltinRecipeName = "built-in job (trainer/builtin/recipe.yaml)"

// LoadRecipe is LoadRecipeWith without Hydra overrides.
func LoadRecipe(files, sets []string) (*config.Loaded, string, error) {
	return LoadRecipeWith(files, nil, sets)
}

// LoadRecipeWith reads the configuration a run with these --config files,
// Hydra overrides and --set values uses (the built-in job when there are no
// files) and returns it with the run's name: "builtin", or the first
// recipe's base name (later files are overrides such as the multi-trace
// block).
func LoadRecipeWith(files, overrides, sets []string) (*config.Loaded, string, error) {
	src := config.Sources{Files: files, Overrides: overrides, Sets: sets}
	if len(files) == 0 {
		src.Base = &config.Recipe{Name: BuiltinRecipeName, Data: builtinRecipe}
		ld, err := config.LoadSources(src)
		return ld, "builtin", err
	}
	first := files[0]
	ld, err := config.LoadSources(src)
	return ld, strings.TrimSuffix(filepath.Base(first), filepath.Ext(first)), err
}

// newModels builds the policy (random or from HF weights) and, when the loss
// has a KL penalty, the frozen reference policy with the same weights.
func (t *Trainer) newModels() error {
	c := &t.cfg
	var err error
	if t.modelCfg, t.init, err = resolveModel(c, t.o.InitFrom); err != nil {
		return err
	}
	for _, n := range t.modelCfg.Notes {
		t.logf("note: %s", n)
	}
	if err := CheckModel(t.modelCfg, t.o.Rollouts == ""); err != nil {
		return err
	}
	t.sparseSettings()
	t.mtp = newMTPRun(c, t.modelCfg)
	sh, err := shapeOf(c, t.be.Name(), 0, 0, t.o.Rollouts == "", noTrees(t.modelCfg))
	if err != nil {
		return err
	}
	limitTrees(t.modelCfg, &sh)
	if err := checkTopK(c, t.modelCfg.VocabSize); err != nil {
		return err
	}
	t.maxTokens, t.maxSegs, t.shared = sh.opt.MaxTokens, treeSegs(sh.opt), sh.opt.Tree
	if on, _ := c.SharedPrefixOn(); on && !t.shared && t.modelCfg.MTP.Depths > 0 {
		// Depth k's inputs at a prefix's last k positions are the next
		// tokens of each trace: they differ across a branch point.
		t.logf("note: policy.shared_prefix=auto: multi-token prediction reads each trace's next tokens at every position (across a shared prefix's branch points they differ), so its traces are packed alone")
	} else if on && !t.shared {
		// The load-balancing loss of a sparse model averages the routing of
		// every token of a micro-batch, each shared token once per trace
		// that holds it: a trie, computing it once, would change that loss.
		t.logf("note: policy.shared_prefix=auto: a sparse (MoE) model's load-balancing loss counts each routed token once per trace, so its traces are packed alone")
	}
	if c.Policy.MaxTotalSequenceLength > t.modelCfg.MaxPositionEmbeddings && t.modelCfg.MaxPositionEmbeddings > 0 {
		t.logf("note: policy.max_total_sequence_length=%d exceeds the model's max_position_embeddings=%d",
			c.Policy.MaxTotalSequenceLength, t.modelCfg.MaxPositionEmbeddings)
	}
	if sh.precision == config.PrecisionBFloat16 && sh.opt.Precision != kernels.BF16 && t.rank == 0 {
		// Said even under --quiet: the run computes in another precision
		// than the recipe asks for.
		fmt.Fprintf(t.o.Log, "train: note: policy.precision=bfloat16: the %s backend computes in fp32 (mixed precision runs on cuda); weights, checkpoints and metrics are unchanged\n", t.be.Name())
	}
	if err := t.checkPlan(); err != nil {
		return err
	}
	if t.shardFull {
		t.model, err = model.NewSharded(t.be, t.modelCfg, sh.opt, model.ShardOptions{Comm: t.comm, ReshardAfterForward: !t.o.NoReshard})
	} else {
		t.model, err = model.New(t.be, t.modelCfg, sh.opt)
	}
	if err != nil {
		return err
	}
	if err := t.loadInitialWeights(t.model); err != nil {
		return err
	}
	if t.lossOpt.KLPenalty != 0 {
		if t.ref, err = model.NewReference(t.model); err != nil {
			return err
		}
	}
	if t.shardFull && t.o.Rollouts == "" {
		// The built-in job samples on every rank from a whole copy of the
		// weights, gathered before each step's rollouts.
		if t.sampleModel, err = model.NewGatheredCopy(t.model); err != nil {
			return err
		}
	}
	return nil
}

// checkPlan refuses a run whose memory plan exceeds the memory free for
// it, before anything is allocated.
func (t *Trainer) checkPlan() error {
	p, err := t.Plan()
	if err != nil {
		return err
	}
	t.plan = p // reserveWorkspace's sizes
	free, source, ok, err := Free(t.be)
	if err != nil {
		return err
	}
	if !ok {
		t.logf("note: free memory unknown: the memory plan (%s) is not checked", Bytes(p.TotalBytes))
		return nil
	}
	if err := p.Check(free, source); err != nil {
		return err
	}
	// The LM head's logits scratch grows into what the plan leaves free
	// (CUDA: 128 MiB to 2 GiB); the plan counts it, so it is made again.
	if sz, ok := backendAs[interface {
		SizeLogitsScratch(headroom int64) (int, bool)
	}](t.be); ok {
		if el, changed := sz.SizeLogitsScratch(free - p.TotalBytes); changed {
			if p, err = t.Plan(); err != nil {
				return err
			}
			t.plan = p
			if err := p.Check(free, source); err != nil {
				return err
			}
			t.logf("LM head: a logits scratch of %s, from the %s the plan left free", Bytes(4*int64(el)), Bytes(free-p.TotalBytes))
		}
	}
	t.logf("memory plan: %s of %s free (%s)", Bytes(p.TotalBytes), Bytes(free), source)
	return nil
}

// reserveWorkspace has a backend that can allocate its ops' scratch up
// front (CUDA) do so now, at the plan's sizes: the run then holds its whole
// plan before the first step, and never allocates during one.
func (t *Trainer) reserveWorkspace() error {
	r, ok := backendAs[interface {
		ReserveWorkspace(kernels.Workload) error
	}](t.be)
	if !ok {
		return nil
	}
	p := t.plan
	if p == nil {
		var err error
		if p, err = t.Plan(); err != nil {
			return err
		}
	}
	if err := r.ReserveWorkspace(p.work); err != nil {
		return fmt.Errorf("workspace: %w", err)
	}
	return nil
}

// Plan returns the memory plan of this run on its backend.
func (t *Trainer) Plan() (*MemPlan, error) {
	return PlanRun(PlanRequest{
		Config: &t.cfg, Model: t.modelCfg, ModelName: string(t.cfg.Policy.ModelName), Backend: t.be.Name(),
		Workspace: WorkspacePlanner(t.be), Builtin: t.o.Rollouts == "", Resume: t.o.Resume,
		World: t.comm.Size(), Shard: t.shardFull, NoReshard: t.o.NoReshard,
	})
}

// resolveModel returns the policy's model configuration and where its
// initial weights come from: --init-from DIR, the built-in model (random
// weights from grpo.seed), or policy.model_name as a directory. The
// recipe's policy.hf_config_overrides patch the config.json first.
func resolveModel(c *config.Config, initFrom string) (model.Config, initSource, error) {
	name := string(c.Policy.ModelName)
	var (
		init initSource
		data []byte
		path string
		err  error
	)
	switch {
	case initFrom != "":
		init = initSource{Kind: "hf", Dir: initFrom}
		path = filepath.Join(initFrom, "config.json")
	case IsBuiltinModel(name):
		init = initSource{Kind: "random", Seed: uint64(c.GRPO.Seed)}
		data, path = builtinModels[name].cfg, builtinModels[name].file
	case name == "":
		return model.Config{}, init, fmt.Errorf("config: policy.model_name is null: name the model, policy.model_name=DIR (a directory with a Hugging Face config.json), or pass --init-from DIR")
	default:
		if st, serr := os.Stat(filepath.Join(name, "config.json")); serr != nil || st.IsDir() {
			return model.Config{}, init, fmt.Errorf("config: policy.model_name=%q: neither a built-in model (%s, tracegrpo/tiny-qwen3-moe, tracegrpo/tiny-nemotron-h) nor a directory with a Hugging Face config.json (tracegrpo never downloads weights; pass --init-from DIR)", name, builtinModelName)
		}
		init = initSource{Kind: "hf", Dir: name}
		path = filepath.Join(name, "config.json")
	}
	if data == nil {
		if data, err = inputfile.ReadFile(path, inputfile.ModelConfig); err != nil {
			return model.Config{}, init, fmt.Errorf("model: %w", err)
		}
	}
	if len(c.Policy.HFConfigOverrides) > 0 {
		if data, err = patchHFConfig(data, c.Policy.HFConfigOverrides); err != nil {
			return model.Config{}, init, fmt.Errorf("config: policy.hf_config_overrides over %s: %w", path, err)
		}
		path += " with policy.hf_config_overrides"
	}
	mc, err := model.ParseConfig(data, path)
	if err != nil {
		return mc, init, err
	}
	mc, err = withMTP(c, mc)
	return mc, init, err
}

// patchHFConfig sets each key of overrides in the config.json object data,
// replacing the file's value (a mapping replaces a mapping whole), as
// transformers' from_pretrained(**overrides) does with NeMo RL's
// policy.hf_config_overrides.
func patchHFConfig(data []byte, overrides map[string]any) ([]byte, error) {
	var raw map[string]json.RawMessage
	if err := json.Unmarshal(data, &raw); err != nil {
		return nil, err
	}
	for k, v := range overrides {
		b, err := json.Marshal(v)
		if err != nil {
			return nil, fmt.Errorf("%s: %w", k, err)
		}
		raw[k] = b
	}
	return json.Marshal(raw)
}

// ModelConfig returns the model configuration a run with this config and
// --init-from (may be empty) trains, and a name for it.
func ModelConfig(c *config.Config, initFrom string) (model.Config, string, error) {
	mc, init, err := resolveModel(c, initFrom)
	name := string(c.Policy.ModelName)
	if init.Dir != "" {
		name = init.Dir
	}
	return mc, name, err
}

func (t *Trainer) loadInitialWeights(m *model.Model) error {
	if t.init.Kind == "random" {
		m.InitRandom(t.init.Seed)
		return nil
	}
	if err := m.LoadHF(t.init.Dir); err != nil {
		return fmt.Errorf("initial weights: %w", err)
	}
	return nil
}

// adamRule is the update arithmetic of the configured optimizer.
func adamRule(oc config.Optimizer) kernels.AdamRule {
	if oc.Class == config.TEFusedAdam {
		return kernels.FusedAdam
	}
	return kernels.TorchAdamW
}

// momentDType is the dtype of the configured optimizer's Adam moments.
func momentDType(oc config.Optimizer) kernels.DType {
	if oc.BF16Moments {
		return kernels.BF16
	}
	return kernels.F32
}

// newOptimizer builds AdamW over the model's arenas, with weight decay per
// parameter as the parameter table says, and the configured schedule.
func (t *Trainer) newOptimizer() error {
	oc, sc, err := t.cfg.Optim()
	if err != nil {
		return err
	}
	// freeze_moe_router: the routers are in no group (no update, no decay,
	// not in the gradient norm); nor are the selection biases, ever.
	frozen := t.model.Options().FreezeRouter
	nf := optim.SkipNonFinite
	if t.o.OnNonFinite == "abort" {
		nf = optim.AbortNonFinite
	}
	ocfg := optim.Config{Rule: adamRule(oc), Moments: momentDType(oc), Beta1: oc.Beta1, Beta2: oc.Beta2, Eps: oc.Eps, MaxGradNorm: oc.ClipGrad, NonFinite: nf}
	if t.shardFull {
		groups, ids := shardedGroups(t.model, frozen)
		ocfg.ClipSet = mtpClipSets(t.model.Table(), t.mtp.detach, len(t.model.Table().Params), nil)
		t.opt, err = optim.NewSharded(t.be, t.model.Params(), t.model.Grads(), groups, ocfg,
			optim.Sharded{Comm: t.comm, IDs: len(t.model.Table().Params), GroupID: ids})
	} else {
		// One group per parameter: optim merges adjacent ones for the update
		// and names the parameter whose gradient is not finite.
		var groups []optim.Group
		var ids []int
		for i, p := range t.model.Table().Params {
			if frozen && p.Router || p.Buffer { // a selection bias moves by its load (expertbias.go)
				continue
			}
			groups = append(groups, optim.Group{Off: p.Offset, N: p.N, Decay: p.Decay})
			ids = append(ids, i)
		}
		ocfg.ClipSet = mtpClipSets(t.model.Table(), t.mtp.detach, 0, ids)
		t.opt, err = optim.New(t.be, t.model.Params(), t.model.Grads(), groups, ocfg)
	}
	if err != nil {
		return err
	}
	if ocfg.Moments == kernels.BF16 {
		// Checkpoints widen the bf16 moments through it (the plan's
		// moment_staging), held for the run.
		n := t.model.Params().N
		if t.stage, err = t.be.Alloc(kernels.F32, min(stageChunk, max(n, 1))); err != nil {
			return fmt.Errorf("the bf16 moments' staging buffer: %w", err)
		}
	}
	switch sc.Style {
	case "megatron":
		t.sched, err = optim.NewMegatron(optim.MegatronConfig{
			LR: sc.MaxLR, MinLR: sc.MinLR, WarmupInit: sc.WarmupInit, WarmupIters: sc.WarmupIters,
			DecayIters: sc.DecayIters, DecayStyle: sc.DecayStyle,
			StartWD: sc.StartWD, EndWD: sc.EndWD, WDIncrStyle: sc.WDIncrStyle,
			TrainIters: sc.WDIncrIters, GlobalBatchSize: int64(t.cfg.Policy.TrainGlobalBatchSize),
		})
	case "phases":
		sq := optim.SequentialConfig{LR: sc.BaseLR, WeightDecay: sc.WD}
		for i, p := range sc.Phases {
			ph := optim.Phase{TotalIters: p.TotalIters}
			switch p.Kind {
			case "linear":
				ph.Kind, ph.StartFactor, ph.EndFactor = optim.PhaseLinear, p.StartFactor, p.EndFactor
			case "constant":
				ph.Kind, ph.Factor = optim.PhaseConstant, p.StartFactor
			default:
				return fmt.Errorf("config: policy.scheduler[%d]: unknown phase kind %q", i, p.Kind)
			}
			sq.Phases = append(sq.Phases, ph)
			if i > 0 {
				sq.Milestones = append(sq.Milestones, p.Start)
			}
		}
		t.sched, err = optim.NewSequential(sq)
	default:
		err = fmt.Errorf("config: unknown schedule style %q", sc.Style)
	}
	return err
}

// sparseSettings sets the weight of a sparse model's load-balancing loss:
// transformers' definition, on when the model's config.json (with
// policy.hf_config_overrides) says output_router_logits, weighted by
// router_aux_loss_coef; it is always reported (router_aux_loss). The
// router keys tracegrpo does not implement are refused with the rest of
// the recipe (config's key classes).
func (t *Trainer) sparseSettings() {
	mc := t.modelCfg
	if !mc.Sparse() {
		return
	}
	if mc.MoE.OutputRouterLogits {
		t.routerLossCoef = mc.MoE.RouterAuxLossCoef
	}
	frozen := t.cfg.Policy.MegatronCfg.Enabled && t.cfg.Policy.MegatronCfg.FreezeMoERouter
	t.expertBiasSettings()
	t.logf("note: %s: %d of %d layers sparse, %d of %d experts per token; routers %s; load-balancing loss %s",
		mc.Arch, mc.SparseLayers(), mc.NumHiddenLayers, mc.MoE.TopK, mc.MoE.NumExperts,
		map[bool]string{true: "frozen (policy.megatron_cfg.freeze_moe_router)", false: "trained"}[frozen],
		map[bool]string{true: fmt.Sprintf("in the loss × router_aux_loss_coef %g (config.json output_router_logits)", t.routerLossCoef),
			false: "reported, not in the loss (config.json output_router_logits false)"}[t.routerLossCoef != 0])
}

// padToken is the model's pad_token_id, or 0.
func padToken(c model.Config) int32 {
	if raw, ok := c.Extra["pad_token_id"]; ok {
		var id int32
		if json.Unmarshal(raw, &id) == nil && id >= 0 {
			return id
		}
	}
	return 0
}

func ptrStr(p *int) string {
	if p == nil {
		return "null"
	}
	return fmt.Sprint(*p)
}
