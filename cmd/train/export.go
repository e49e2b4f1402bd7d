package main

import (
	"fmt"
	"io"

	"github.com/tracegrpo/tracegrpo/internal/safetensors"
	"github.com/tracegrpo/tracegrpo/trainer"
)

func init() {
	register(command{
		name:    "export",
		summary: "write a checkpoint's Hugging Face weights (sharded or not) into a directory, on one process or many ranks",
		run:     runExport,
	})
}

const exportSynopsis = `train export CHECKPOINT --out DIR [--dtype float32|bfloat16|float16] [--backend cpu|cuda] [--dist auto|none|mpi|nccl]

Writes DIR/model.safetensors and DIR/config.json from CHECKPOINT (a
checkpoints/step_<N> directory, sharded or not): the files transformers
loads. Under mpirun, torchrun or srun every rank reads only its part of
each tensor and the ranks stream the file through rank 0, one layer at a
time, so no rank holds the whole model: a model too large for one process
exports on ranks that together hold it. The file is the same, byte for
byte, on any number of ranks.

Flags:`

func runExport(args []string, stdout, stderr io.Writer) error {
	fs := newFlags("export", exportSynopsis, stdout)
	out := fs.String("out", "", "directory to write model.safetensors and config.json into")
	dtype := fs.String("dtype", "float32", "the weights' dtype: float32 (the checkpoint's), bfloat16 or float16")
	backend := fs.String("backend", "cpu", "cpu or cuda")
	threads := fs.Int("threads", 0, "CPU threads (0: all)")
	distMode := fs.String("dist", "auto", "collectives under a launcher: auto, none, mpi or nccl")
	rankTimeout := addRankTimeout(fs)
	if err := parseFlags(fs, args, 1); err != nil {
		return err
	}
	if *out == "" || fs.NArg() != 1 {
		return fmt.Errorf("%w: export needs one CHECKPOINT and --out DIR (see train export --help)", errUsage)
	}
	dt, ok := map[string]safetensors.DType{"float32": safetensors.F32, "bfloat16": safetensors.BF16, "float16": safetensors.F16}[*dtype]
	if !ok {
		return fmt.Errorf("%w: export: --dtype %q: want float32, bfloat16 or float16", errUsage, *dtype)
	}
	l, err := detectLaunch(*distMode)
	if err != nil {
		return fmt.Errorf("export: %w", err)
	}
	if l.Rank != 0 {
		stdout, stderr = io.Discard, io.Discard
	}
	be, err := openBackend(*backend, l.threadsPerRank(*threads), l.LocalRank, stderr)
	if err != nil {
		return fmt.Errorf("export: %w", err)
	}
	defer closeBackend(be)
	if err := l.openComm(*distMode, be, *rankTimeout); err != nil {
		return fmt.Errorf("export: %w", err)
	}
	defer l.close()
	if err := trainer.ExportHF(be, l.comm, fs.Arg(0), *out, dt); err != nil {
		if l.Size > 1 && !trainer.Agreed(err) {
			l.abort(err, stderr)
		}
		if l.Rank != 0 {
			return errQuiet
		}
		return fmt.Errorf("export: %w", err)
	}
	fmt.Fprintf(stdout, "export: wrote %s from %s on %d rank(s)\n", *out, fs.Arg(0), l.Size)
	return nil
}
