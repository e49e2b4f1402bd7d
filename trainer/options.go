package trainer

import (
	"errors"
	"fmt"
	"io"
	"math"
	"os"
	"strconv"
	"time"

	"github.com/spf13/pflag"
	"github.com/tracegrpo/tracegrpo/collective"
	"github.com/tracegrpo/tracegrpo/kernels"
	"github.com/tracegrpo/tracegrpo/rollout"
)

// ErrUsage marks an error that is a usage problem (bad flag values or
// combinations): a command line maps it to exit status 2.
var ErrUsage = errors.New("usage")

// Options are the settings of one run: the command line's flags, and what
// the caller chose for it (the backend). A program that builds Options
// itself gets the flags' defaults for the zero values of Tasks and
// OnNonFinite; a zero Wait does not wait (the flag's default is 10m).
type Options struct {
	ConfigFiles []string      // NeMo RL recipes, later ones merged over earlier ones; none: the built-in job
	Overrides   []string      // Hydra overrides (key=v, +key=v, ++key=v, ~key) of the composed recipe, as NeMo RL's run_grpo.py takes them
	Sets        []string      // key.path=value overrides after the files, the overrides and the defaults
	Out         string        // run directory ("": runs/<recipe name>)
	Resume      bool          // continue from the newest complete checkpoint in Out
	Fallback    bool          // with Resume: fall back to an older checkpoint that verifies
	InitFrom    string        // Hugging Face weights directory
	Steps       int           // GRPO steps in all (0: grpo.max_num_steps)
	Rollouts    string        // Gym rollout records: a JSONL file or a directory of step_<N>.jsonl
	Captures    string        // Gym capture directory of Rollouts
	Wait        time.Duration // how long to wait for each step_<N>.jsonl (0: not at all)
	Tasks       []string      // built-in tasks to cycle through
	OnNonFinite string        // "skip" or "abort"
	Quiet       bool          // no setup or progress lines
	// Shard is --shard: "full" shards weights, gradients and Adam moments
	// over the ranks (ZeRO-3, FSDP), "none" keeps them whole on every rank,
	// "" follows the recipe (ShardChoice).
	Shard string
	// NoReshard keeps each layer's gathered weights from its forward
	// through its backward (--reshard-after-forward=false).
	NoReshard bool
	// SharedPrefix sets policy.shared_prefix ("auto" or "off"; "": the
	// config's, auto by default).
	SharedPrefix string

	// SaveCaptures writes the built-in job's captures to Out/captures (or
	// env.nemo_gym.token_id_capture.dir) instead of keeping them in memory.
	SaveCaptures bool

	// WeightsOut, WeightsDType and WeightsKeep set
	// policy.generation.weights_out, weights_dtype and weights_keep ("" and
	// 0: the config's): a servable weights directory for the generator
	// every step (package loop).
	WeightsOut   string
	WeightsDType string
	WeightsKeep  int
	// MaxMaskedFraction stops a step whose masked share of logical
	// rollouts exceeds it (nil: DefaultMaxMaskedFraction).
	MaxMaskedFraction *float64

	// Log receives setup lines and one progress line per step (nil: none).
	Log io.Writer
	// Backend runs the model and the optimizer. Required; the caller closes it.
	Backend kernels.Backend
	// Comm is the data-parallel communicator over Backend's buffers (nil:
	// one process). Every rank runs New and Run with the same options; rank
	// 0 alone writes files. The caller closes it.
	Comm collective.Comm
	// Signals delivers stop requests (a scheduler's SIGTERM, Ctrl-C): the
	// first ends the run after the step in progress, or at once while it
	// waits for rollouts, with a checkpoint. nil: the run never stops early.
	// WatchSignals provides one for the process's signals.
	Signals <-chan os.Signal
}

// defaultWait is --wait's default.
const defaultWait = 10 * time.Minute

// DefaultMaxMaskedFraction is --max-masked-fraction's default.
const DefaultMaxMaskedFraction = 0.5

// AddFlags registers the run's flags on fs, writing into o.
func (o *Options) AddFlags(fs *pflag.FlagSet) {
	fs.StringArrayVar(&o.ConfigFiles, "config", nil, "NeMo RL recipe (YAML); repeatable, later files override earlier ones")
	fs.StringArrayVar(&o.Sets, "set", nil, "override one config key after the files, e.g. --set grpo.num_prompts_per_step=4 (repeatable)")
	fs.StringVar(&o.Out, "out", "", "run directory (default runs/<recipe name>, runs/builtin for the built-in job)")
	fs.BoolVar(&o.Resume, "resume", false, "continue from the newest complete checkpoint in --out")
	fs.BoolVar(&o.Fallback, "fallback", false, "with --resume: if the newest checkpoint is incomplete or corrupt, use the newest older one that verifies")
	fs.StringVar(&o.InitFrom, "init-from", "", "start from Hugging Face weights in DIR (config.json + model.safetensors)")
	fs.Var((*positiveInt)(&o.Steps), "steps", "run this many GRPO steps in all, a positive number (overrides grpo.max_num_steps)")
	fs.StringVar(&o.Rollouts, "rollouts", "", "train on NeMo Gym rollout records: a JSONL file, or a directory of step_<N>.jsonl files")
	fs.StringVar(&o.Captures, "captures", "", "NeMo Gym capture directory of --rollouts (default env.nemo_gym.token_id_capture.dir)")
	fs.BoolVar(&o.SaveCaptures, "save-captures", false, "built-in job: write its captures in NeMo Gym's format to --out/captures (or env.nemo_gym.token_id_capture.dir); by default they are kept in memory, one step at a time, and never written")
	fs.DurationVar(&o.Wait, "wait", defaultWait, "with a --rollouts directory: how long to wait for each step_<N>.jsonl to appear (0: do not wait); a line every 30s says what is awaited")
	fs.StringVar(&o.WeightsOut, "weights-out", "", "publish the policy's weights for a generator (vLLM, transformers) into DIR: step_0/ (the initial weights) before the first step, step_<N>/ after step N's update, "+
		"each a servable Hugging Face directory (config.json, model.safetensors, the tokenizer files and generation_config.json of --init-from; no optimizer state; mode 0644) "+
		"whose DONE file is written last; sets policy.generation.weights_out (docs/loop.md has the protocol)")
	fs.StringVar(&o.WeightsDType, "weights-dtype", "", "with --weights-out: the weights' dtype, bfloat16 (the default), float16 or float32; sets policy.generation.weights_dtype")
	fs.IntVar(&o.WeightsKeep, "weights-keep", 0, "with --weights-out: keep the newest K step directories (default 2; the newest is never deleted); sets policy.generation.weights_keep")
	o.MaxMaskedFraction = new(float64)
	*o.MaxMaskedFraction = DefaultMaxMaskedFraction
	fs.Float64Var(o.MaxMaskedFraction, "max-masked-fraction", DefaultMaxMaskedFraction, "stop a step whose masked share of logical rollouts exceeds F (0 to 1), naming each mask reason with its count: "+
		"a capture directory that does not match the rollouts masks them all (nothing_recorded); 1 never stops")
	fs.StringSliceVar(&o.Tasks, "tasks", rollout.TaskNames(), "built-in tasks to cycle through")
	fs.StringVar(&o.OnNonFinite, "on-nonfinite", "skip", "a non-finite loss or gradient: skip the update (and count it) or abort; an update that makes the weights non-finite always stops the run, saving nothing of that step")
	fs.BoolVar(&o.Quiet, "quiet", false, "no setup lines and no progress line per step (the backend choice is still printed)")
	fs.StringVar(&o.Shard, "shard", "", "data parallel: full shards the weights, gradients and Adam moments over the ranks (ZeRO-3, FSDP: each rank holds 1/W and gathers a layer's weights just before use); none keeps them whole on every rank; default: the recipe's (policy.dtensor_cfg.enabled=true shards on more than one rank; Megatron's use_distributed_optimizer is refused unless --shard is given)")
	f := fs.VarPF((*negBool)(&o.NoReshard), "reshard-after-forward", "", "with --shard full: gather each layer's weights again for its backward (two layers gathered at a time); false keeps every layer gathered from forward through backward (more memory, less communication)")
	f.NoOptDefVal = "true"
	f.DefValue = "true"
	fs.StringVar(&o.SharedPrefix, "shared-prefix", "", "auto: pack each micro-batch's traces as a token trie, so that every shared prefix "+
		"(a task group's prompt, a rollout's earlier turns) is computed once, forward and backward; off: pack every trace as its own sequence. "+
		"Sets policy.shared_prefix (default auto); the loss, its gradient and the metrics are the same either way, up to floating-point summation order. "+
		"Sparse (MoE) models fall back to off under auto (their load-balancing loss counts a shared token once per trace; the run says so at start); "+
		"data-parallel ranks, sharded (--shard full) or not, each pack their own rows as tries")
}

// negBool is a bool flag stored negated (so that the zero value of the
// field is the flag's default, true).
type negBool bool

func (b *negBool) String() string { return strconv.FormatBool(!bool(*b)) }

func (b *negBool) Set(s string) error {
	v, err := strconv.ParseBool(s)
	if err != nil {
		return fmt.Errorf("want true or false, found %q", s)
	}
	*b = negBool(!v)
	return nil
}

func (b *negBool) Type() string { return "bool" }

// positiveInt is an int flag that refuses zero, negative numbers and values
// that do not fit an int.
type positiveInt int

func (p *positiveInt) String() string {
	if *p == 0 {
		return ""
	}
	return strconv.Itoa(int(*p))
}

func (p *positiveInt) Set(s string) error {
	v, err := strconv.ParseInt(s, 10, 64)
	if err != nil || v <= 0 || v > math.MaxInt32 {
		return fmt.Errorf("want a whole number from 1 to %d, found %q", math.MaxInt32, s)
	}
	*p = positiveInt(v)
	return nil
}

func (p *positiveInt) Type() string { return "int" }
