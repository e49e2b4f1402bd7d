package main

import (
	"fmt"
	"io"
	"strconv"
	"strings"

	"github.com/tracegrpo/tracegrpo/config"
	"github.com/tracegrpo/tracegrpo/kernels"
	"github.com/tracegrpo/tracegrpo/kernels/cpu"
	"github.com/tracegrpo/tracegrpo/kernels/cuda"
	"github.com/tracegrpo/tracegrpo/model"
	"github.com/tracegrpo/tracegrpo/trainer"
)

func init() {
	register(command{
		name:    "plan",
		summary: "print the memory a run will allocate, part by part, on the CPU or a GPU (needs neither)",
		run:     runPlan,
	})
}

const planSynopsis = `train plan [--config FILE]... [OVERRIDE]... [--set k=v]... (--init-from DIR | --model config.json)
           [--rows R] [--seq T] [--backend cpu|cuda] [--rollouts PATH] [--resume]
           [--world-size W] [--shard full|none] [--reshard-after-forward=false] [--memory SIZE] [--json]

Prints the memory a train run with these recipes and overrides allocates on
the backend, part by part: the fp32 weights, their bf16 copy (mixed
precision, policy.precision=bfloat16 on cuda), the gradients, AdamW's
moments, the activations (with activation checkpointing as the recipe sets
it; both figures are printed), the frozen KL reference policy (when
loss_fn.reference_policy_kl_penalty is not 0), the in-process sampler's KV
cache (the built-in job; not with --rollouts), and the workspace (token
buffers, RoPE tables and the backend's own scratch). It runs on any
machine: planning for cuda needs no GPU. The figures come from the code that
sizes the allocations, and train, train bench and train score check them
against the free memory before allocating anything.

With --world-size W the plan is one rank's of W (default: the recipe's
cluster.num_nodes × cluster.gpus_per_node). --shard full plans fully
sharded data parallel (each rank holds 1/W of the weights, gradients and
Adam moments, plus the communication buffers: the gathered groups and the
gradients being reduce-scattered); the default is the recipe's choice, as
train makes it. --memory SIZE (e.g. 80G) checks the plan against SIZE per
rank and names the smallest world size that fits fully sharded.

--rows and --seq default to policy.train_micro_batch_size and
policy.max_total_sequence_length (one micro-batch of rows × seq tokens).
Without --init-from or --model the recipe's policy.model_name is planned
(the built-in model, or a directory holding config.json).

Flags:`

func runPlan(args []string, stdout, stderr io.Writer) error {
	fs := newFlags("plan", planSynopsis, stdout)
	var o trainer.Options
	fs.StringArrayVar(&o.ConfigFiles, "config", nil, "NeMo RL recipe (YAML); repeatable, later files override earlier ones (none: the built-in job)")
	fs.StringArrayVar(&o.Sets, "set", nil, "override one config key after the files (repeatable)")
	fs.StringVar(&o.InitFrom, "init-from", "", "Hugging Face model directory (its config.json is read; no weights are)")
	cfgPath := fs.String("model", "", "a Hugging Face config.json")
	rows := fs.Int("rows", 0, "rows per micro-batch (default policy.train_micro_batch_size)")
	seq := fs.Int("seq", 0, "tokens per row (default policy.max_total_sequence_length)")
	backend := fs.String("backend", "cuda", "plan for cpu or cuda")
	threads := fs.Int("threads", 0, "CPU threads the run uses (cpu; 0: all)")
	fs.StringVar(&o.Rollouts, "rollouts", "", "the run reads NeMo Gym rollouts (no in-process sampler); the path is not read")
	fs.BoolVar(&o.Resume, "resume", false, "the run resumes from a checkpoint (cpu: the checkpoint is read into memory first)")
	asJSON := fs.Bool("json", false, "print one JSON object (total_bytes, components, ...) instead of text")
	world := fs.Int("world-size", 0, "plan one rank of this many (default: cluster.num_nodes × cluster.gpus_per_node)")
	fs.StringVar(&o.Shard, "shard", "", "full: fully sharded data parallel; none: every rank holds the whole model; default: the recipe's (as train decides)")
	f := fs.VarPF(newNegBool(&o.NoReshard), "reshard-after-forward", "", "with --shard full: layers gathered again for backward (false: every layer kept gathered)")
	f.NoOptDefVal, f.DefValue = "true", "true"
	memory := fs.String("memory", "", "check the plan against this much memory per rank (e.g. 80G) and name the smallest fully sharded world size that fits")
	diskPlan := fs.Bool("disk", false, "also print the disk plan: the bytes a step writes (the weights for the generator with --weights-out, every step; the full checkpoint every checkpointing.save_period steps) and their time at --write-rate")
	writeRate := fs.String("write-rate", "1G", "with --disk: the write rate, bytes a second (e.g. 2G)")
	if err := parseFlags(fs, args, -1); err != nil {
		return err
	}
	var err error
	if o.Overrides, err = overrideArgs(fs); err != nil {
		return err
	}
	if *rows < 0 || *seq < 0 {
		return fmt.Errorf("%w: plan: --rows and --seq must be positive", errUsage)
	}
	if *cfgPath != "" && o.InitFrom != "" {
		return fmt.Errorf("%w: plan: give --init-from or --model, not both", errUsage)
	}
	ld, _, err := trainer.LoadRecipeWith(o.ConfigFiles, o.Overrides, o.Sets)
	if err != nil {
		return err
	}
	var mc model.Config
	var name string
	if *cfgPath != "" {
		if mc, err = model.LoadConfig(*cfgPath); err != nil {
			return err
		}
		name = *cfgPath
	} else if mc, name, err = trainer.ModelConfig(&ld.Config, o.InitFrom); err != nil {
		return err
	}
	// The recipe's refusals, with the keys that configure experts decided
	// by this model: a plan is no promise that train will run it.
	if refused, _ := config.SplitRefusals(trainer.CheckFor(ld, 0, trainer.ExpertsOf(mc))); len(refused) > 0 {
		var keys []string
		for _, r := range refused {
			keys = append(keys, r.RefusedKey())
		}
		fmt.Fprintf(stderr, "train plan: note: train would refuse this recipe with this model (train config --check --init-from DIR says why): %s\n", strings.Join(keys, ", "))
	}
	ws, err := planWorkspace(*backend, *threads)
	if err != nil {
		return err
	}
	w := *world
	if w == 0 {
		w = ld.Config.Cluster.NumNodes * ld.Config.Cluster.GPUsPerNode
	}
	if w < 1 {
		return fmt.Errorf("%w: plan: --world-size %d: want at least 1", errUsage, w)
	}
	full, _, err := trainer.ShardChoice(&ld.Config, o.Shard, w)
	if err != nil {
		return err
	}
	p, err := trainer.PlanRun(trainer.PlanRequest{
		Config: &ld.Config, Model: mc, ModelName: name, Backend: *backend, Workspace: ws,
		Rows: *rows, Seq: *seq, Builtin: o.Rollouts == "", Resume: o.Resume,
		World: w, Shard: full, NoReshard: o.NoReshard,
	})
	if err != nil {
		return err
	}
	var fit error
	if *memory != "" {
		n, err := trainer.ParseBytes(*memory)
		if err != nil {
			return fmt.Errorf("%w: plan: --memory: %v", errUsage, err)
		}
		fit = p.Check(n, "--memory")
	}
	rate, err := trainer.ParseBytes(*writeRate)
	if err != nil || rate <= 0 {
		return fmt.Errorf("%w: plan: --write-rate %q: want a positive size a second, e.g. 2G", errUsage, *writeRate)
	}
	disk, err := trainer.PlanDisk(&ld.Config, mc)
	if err != nil {
		return err
	}
	if *asJSON {
		fmt.Fprintf(stdout, "%s\n", p.JSON())
	} else {
		p.WriteText(stdout)
		if *diskPlan {
			disk.WriteText(stdout, rate)
		}
	}
	if fit != nil {
		return fit
	}
	if *memory != "" && !*asJSON {
		fmt.Fprintf(stdout, "  fits in --memory %s per rank\n", *memory)
	}
	return nil
}

// negBool is a bool flag stored negated (the field's zero value is the
// flag's default, true).
type negBool bool

func newNegBool(p *bool) *negBool { return (*negBool)(p) }

func (b *negBool) String() string { return strconv.FormatBool(!bool(*b)) }
func (b *negBool) Type() string   { return "bool" }
func (b *negBool) Set(s string) error {
	v, err := strconv.ParseBool(s)
	if err != nil {
		return fmt.Errorf("want true or false, found %q", s)
	}
	*b = negBool(!v)
	return nil
}

// planWorkspace returns how a backend, not opened, sizes its ops' scratch.
func planWorkspace(backend string, threads int) (func(kernels.Workload) int64, error) {
	switch backend {
	case "cpu":
		if threads <= 0 {
			threads = cpu.DefaultThreads()
		}
		return func(w kernels.Workload) int64 { return cpu.PlanWorkspace(w, threads) }, nil
	case "cuda":
		return func(w kernels.Workload) int64 { return cuda.PlanWorkspace(w, cuda.Options{}) }, nil
	}
	return nil, fmt.Errorf("%w: --backend %q: want cpu or cuda", errUsage, backend)
}
