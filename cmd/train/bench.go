package main

import (
	"fmt"
	"io"

	"github.com/tracegrpo/tracegrpo/bench"
	"github.com/tracegrpo/tracegrpo/internal/checked"
	"github.com/tracegrpo/tracegrpo/kernels/cpu"
	"github.com/tracegrpo/tracegrpo/kernels/cuda"
	"github.com/tracegrpo/tracegrpo/model"
)

func init() {
	register(command{
		name:    "bench",
		summary: "time forward + backward + AdamW of a model on random tokens",
		run:     runBench,
	})
}

// runBench parses bench's flags, opens the backend and the launch's
// collectives, and hands them to the bench package.
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
	ledger := fs.Bool("ledger", false, "cuda: after the timed steps, one more step with each launch timed on the device, printed to stderr beside the roofline's prediction per op (train gpu-model's table, measured)")
	recompute := fs.Bool("recompute", false, "recompute layer activations in the backward pass (activation checkpointing)")
	precision := fs.String("precision", "float32", "float32, or bfloat16: mixed precision (cuda; the CPU computes in fp32 and says so)")
	seed := fs.Uint64("seed", 1, "seed of the random weights and tokens")
	distMode := fs.String("dist", "auto", "data parallel under torchrun/srun/mpirun: the rows are split among the ranks and the gradients all-reduced (auto, none, mpi, nccl)")
	rankTimeout := addRankTimeout(fs)
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
	mbTokens := fs.Int("mb-tokens", 0, "with --tree: computed tokens per micro-batch, the same for both modes (0: the smallest that holds the whole trie, "+
		"its computed tokens or its loss tokens when more, so that auto needs one micro-batch)")
	if err := parseFlags(fs, args, 0); err != nil {
		return err
	}
	if *cfgPath == "" {
		return fmt.Errorf("%w: bench needs --model CONFIG.json", errUsage)
	}
	for _, f := range []struct {
		name string
		v    int
	}{{"rows", *rows}, {"seq", *seq}, {"steps", *steps}} {
		if f.v <= 0 {
			return fmt.Errorf("%w: bench: --%s %d: want a positive count", errUsage, f.name, f.v)
		}
	}
	if *mbTokens < 0 || *mbTokens > model.MaxTokens {
		return fmt.Errorf("%w: bench: --mb-tokens %d: want 0 (the whole trie's) or a count of tokens up to %d", errUsage, *mbTokens, model.MaxTokens)
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
	env := bench.Env{Rank: l.Rank, Stdout: stdout, Stderr: stderr}
	switch *backend {
	case "cpu":
		c, err := newCPU(l.threadsPerRank(*threads))
		if err != nil {
			return fmt.Errorf("bench: %w", err)
		}
		defer c.Close()
		env.Backend, env.Threads = c, c.Threads()
		env.Peak = func() bench.Peak {
			p, how := cpu.PeakSummary(c.Threads())
			return bench.Peak{GFLOPS: p.GFLOPS(), PerThread: p.PerThread, How: how}
		}
		fmt.Fprintf(stderr, "bench: backend cpu (%d threads), %s\n", c.Threads(), cpu.SIMDChoice())
	case "cuda":
		if env.Backend, err = cuda.Open(cuda.Options{Device: l.LocalRank}); err != nil {
			return fmt.Errorf("bench: %w", err)
		}
		defer closeBackend(env.Backend)
	default:
		return fmt.Errorf("%w: --backend: expected cpu or cuda, found %q", errUsage, *backend)
	}
	if err := l.openComm(*distMode, env.Backend, *rankTimeout); err != nil {
		return fmt.Errorf("bench: %w", err)
	}
	defer l.close()
	env.Comm, env.Size = l.comm, l.Size
	common := bench.Common{Model: cfg, ModelName: *cfgPath, Weights: *weights, Steps: *steps, Seed: *seed, LR: *lr, Eps: *eps,
		Recompute: *recompute, BF16: *precision == "bfloat16"}
	if *tree != "" {
		if l.Size > 1 {
			return fmt.Errorf("%w: bench: --tree runs in one process (%d ranks)", errUsage, l.Size)
		}
		if *profile || *ledger {
			return fmt.Errorf("%w: bench: --profile and --ledger time rows × seq steps; they do not go with --tree", errUsage)
		}
		return bench.RunTree(env, bench.Tree{Common: common, Spec: *tree, Modes: modes, MBTokens: *mbTokens})
	}
	return bench.RunRows(env, bench.Rows{Common: common, Rows: *rows, Seq: *seq, Shard: *shard == "full", NoReshard: noReshard,
		Save: *save, Profile: *profile, Ledger: *ledger})
}
