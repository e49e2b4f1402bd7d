package trainer

import (
	"fmt"
	"io"
	"math"
	"strconv"

	"github.com/tracegrpo/tracegrpo/checkpoint"
	"github.com/tracegrpo/tracegrpo/config"
	"github.com/tracegrpo/tracegrpo/internal/safetensors"
	"github.com/tracegrpo/tracegrpo/model"
)

// DiskPlan is what a run writes to disk, per step: the weights directory
// published for the generator every step (--weights-out) and the full
// checkpoint every checkpointing.save_period steps. The tensor files'
// sizes are exact (their safetensors headers are encoded as the writers
// encode them); the JSON files beside them are not counted (a few KiB).
type DiskPlan struct {
	WeightsDType string
	// Weights is one step directory's model.safetensors in WeightsDType.
	Weights int64
	// CheckpointWeights and CheckpointMoments are a checkpoint's fp32
	// model.safetensors and optimizer.safetensors (0 when
	// checkpointing.save_optimizer is false).
	CheckpointWeights, CheckpointMoments int64
	SavePeriod                           int // 0: checkpointing off
	Publishes                            bool
}

// Checkpoint is one full checkpoint's tensor bytes.
func (d DiskPlan) Checkpoint() int64 { return d.CheckpointWeights + d.CheckpointMoments }

// PlanDisk plans the disk writes of a run with config c of model mc.
func PlanDisk(c *config.Config, mc model.Config) (DiskPlan, error) {
	dir, dtype, _, err := c.WeightsOut()
	if err != nil {
		return DiskPlan{}, err
	}
	d := DiskPlan{WeightsDType: dtype, Publishes: dir != ""}
	if c.Checkpointing.Enabled {
		d.SavePeriod = max(c.Checkpointing.SavePeriod, 0)
	}
	tab := model.NewParamTable(mc)
	specs := func(dt safetensors.DType, suffixes ...string) []safetensors.Spec {
		var s []safetensors.Spec
		for _, p := range tab.Params {
			pdt := dt
			if p.Buffer { // kept in fp32 whatever the dtype, as the writers keep it
				pdt = safetensors.F32
			}
			for _, suf := range suffixes {
				s = append(s, safetensors.Spec{Name: p.Name + suf, DType: pdt, Shape: p.Shape})
			}
		}
		return s
	}
	meta := map[string]string{"format": "pt", "tracegrpo_format": "generator-weights", "step": strconv.Itoa(c.GRPO.MaxNumSteps)}
	if d.Weights, err = safetensors.FileSize(specs(weightsDTypes[dtype], ""), meta); err != nil {
		return d, err
	}
	ckMeta := checkpoint.ModelMetadata(int64(c.GRPO.MaxNumSteps))
	ckMeta["format"] = "pt"
	if d.CheckpointWeights, err = safetensors.FileSize(specs(safetensors.F32, ""), ckMeta); err != nil {
		return d, err
	}
	if c.SavesOptimizer() {
		d.CheckpointMoments, err = safetensors.FileSize(specs(safetensors.F32, ".exp_avg", ".exp_avg_sq"), ckMeta)
	}
	return d, err
}

// WriteText prints the plan, with the time each write takes at rate bytes
// a second.
func (d DiskPlan) WriteText(w io.Writer, rate int64) {
	at := func(n int64) string {
		return fmt.Sprintf("%.1f s at %s/s", float64(n)/float64(rate), Bytes(rate))
	}
	fmt.Fprintf(w, "disk plan: the tensor files a step writes (JSON files beside them aside)\n")
	pub := "with --weights-out (policy.generation.weights_out)"
	if d.Publishes {
		pub = "policy.generation.weights_out is set"
	}
	fmt.Fprintf(w, "  weights for the generator  %9s  every step, %s model.safetensors (%s): %s\n", Bytes(d.Weights), d.WeightsDType, pub, at(d.Weights))
	switch {
	case d.SavePeriod == 0:
		fmt.Fprintf(w, "  full checkpoint            %9s  at the end only (checkpointing off, or save_period 0)\n", Bytes(d.Checkpoint()))
	default:
		moments := "with Adam moments " + Bytes(d.CheckpointMoments)
		if d.CheckpointMoments == 0 {
			moments = "no Adam moments (checkpointing.save_optimizer false)"
		}
		fmt.Fprintf(w, "  full checkpoint            %9s  every %d steps (checkpointing.save_period): fp32 weights %s, %s: %s\n",
			Bytes(d.Checkpoint()), d.SavePeriod, Bytes(d.CheckpointWeights), moments, at(d.Checkpoint()))
		avg := d.Checkpoint() / int64(d.SavePeriod)
		fmt.Fprintf(w, "  a step on average          %9s  the weights every step and 1/%d of a checkpoint: %.2f of a full checkpoint every step\n",
			Bytes(d.Weights+avg), d.SavePeriod, float64(d.Weights+avg)/math.Max(1, float64(d.Checkpoint())))
	}
}
