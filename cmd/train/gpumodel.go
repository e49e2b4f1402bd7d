package main

import (
	"fmt"
	"io"

	"github.com/tracegrpo/tracegrpo/kernels"
	"github.com/tracegrpo/tracegrpo/kernels/cuda"
	"github.com/tracegrpo/tracegrpo/kernels/cuda/gpumodel"
	"github.com/tracegrpo/tracegrpo/model"
)

func init() {
	register(command{
		name:    "gpu-model",
		summary: "predict a CUDA training step's time per op on an H200, from its launch ledger (no GPU needed)",
		run:     runGPUModel,
	})
}

func runGPUModel(args []string, stdout, stderr io.Writer) error {
	fs := newFlags("gpu-model", "train gpu-model --model CONFIG.json [--rows R --seq T --precision bfloat16|float32]", stdout)
	cfgPath := fs.String("model", "", "HF config.json of the model")
	rows := fs.Int("rows", 8, "packed sequences per step")
	seq := fs.Int("seq", 4096, "tokens per sequence")
	precision := fs.String("precision", "bfloat16", "bfloat16 (mixed precision) or float32")
	recompute := fs.Bool("recompute", false, "recompute layer activations in the backward pass")
	sm90a := fs.Bool("sm90a", false, "predict on the what-if device of an sm_90a path that is not built (wgmma at cuBLAS's rate in our tensor-core kernels, TMA-fed loads: docs/gpu.md)")
	if err := parseFlags(fs, args, 0); err != nil {
		return err
	}
	if *cfgPath == "" || *rows <= 0 || *seq <= 0 {
		return fmt.Errorf("%w: gpu-model needs --model and positive --rows and --seq", errUsage)
	}
	prec := kernels.BF16
	switch *precision {
	case "bfloat16":
	case "float32":
		prec = kernels.F32
	default:
		return fmt.Errorf("%w: gpu-model: --precision %q: want bfloat16 or float32", errUsage, *precision)
	}
	cfg, err := model.LoadConfig(*cfgPath)
	if err != nil {
		return fmt.Errorf("gpu-model: %w", err)
	}
	dev := cuda.H200
	if *sm90a {
		dev = cuda.H200SM90a
	}
	res, err := gpumodel.Run(cfg, gpumodel.Step{Rows: *rows, Seq: *seq, Precision: prec, Recompute: *recompute}, dev)
	if err != nil {
		return err
	}
	fmt.Fprintf(stdout, "%s, %d × %d tokens, %s: one training step (forward, backward, AdamW) metered, predicted on %s\n\n",
		*cfgPath, *rows, *seq, *precision, dev.Name)
	fmt.Fprint(stdout, res.Prediction.Table(res.ModelFLOPs))
	return nil
}
