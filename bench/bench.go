// Package bench times training steps of a model, as `train bench` runs them:
// forward, backward and AdamW on random tokens packed as rows (RunRows: one
// process or data-parallel ranks, sharded or not, with an optional time per
// op), or on a synthetic tree of traces packed each as its own sequence and
// as token tries in the same process (RunTree).
//
// Each run prints one JSON line per measurement to Env.Stdout (Result,
// TreeResult, and for two tree modes a line with their ratio) and notes to
// Env.Stderr. Every run checks its memory plan (trainer.PlanModelRun) against
// the backend's free memory before allocating, and reports the plan beside
// the peak resident memory it measured. Timings are medians over Steps timed
// steps after one warm-up step; nothing here asserts or compares them.
//
// The caller (cmd/train) parses flags, loads the model's config, detects the
// launch, opens the backend and the collectives, and hands them over in Env;
// bench never chooses a backend.
package bench

import (
	"fmt"
	"io"
	"slices"
	"sort"

	"github.com/tracegrpo/tracegrpo/collective"
	"github.com/tracegrpo/tracegrpo/internal/meminfo"
	"github.com/tracegrpo/tracegrpo/kernels"
	"github.com/tracegrpo/tracegrpo/model"
	"github.com/tracegrpo/tracegrpo/optim"
)

// Env is where a benchmark runs.
type Env struct {
	Backend kernels.Backend
	Threads int             // the CPU backend's threads (0: not a CPU backend), for the JSON line
	Comm    collective.Comm // the ranks' collectives; nil for one process
	Rank    int             // this process among Size ranks
	Size    int
	Stdout  io.Writer // JSON lines (io.Discard on ranks other than 0)
	Stderr  io.Writer // notes and the --profile table
	// Peak measures the backend's peak floating-point rate, for
	// --profile's fractions of peak; nil where none is known.
	Peak func() Peak
}

// Peak is a backend's measured peak floating-point rate.
type Peak struct {
	GFLOPS    float64 // all its threads together
	PerThread float64 // one thread (one core) alone
	How       string  // how it was measured, for the profile
}

// Common are the settings both kinds of run share.
type Common struct {
	Model     model.Config
	ModelName string // the config's path, as the JSON lines name it
	Weights   string // load HF weights from this directory ("": random weights from Seed)
	Steps     int    // timed steps after one warm-up step
	Seed      uint64 // random weights and tokens
	LR, Eps   float64
	Recompute bool // activation checkpointing
	// BF16 asks for mixed precision: cuda computes in bf16, other backends
	// in fp32, and say so.
	BF16 bool
}

// precision returns the compute precision of c on be, and its name in the
// JSON lines.
func (c Common) precision(be kernels.Backend, stderr io.Writer) (kernels.DType, string) {
	if c.BF16 {
		if be.Name() == "cuda" {
			return kernels.BF16, "bfloat16"
		}
		fmt.Fprintf(stderr, "bench: note: --precision bfloat16: the %s backend computes in fp32 (mixed precision runs on cuda)\n", be.Name())
	}
	return kernels.F32, "float32"
}

// benchOptimizer is AdamW (weight decay on matrices, none on norm
// weights; no clipping) over the model's arenas, or its shard.
func benchOptimizer(be kernels.Backend, m *model.Model, comm collective.Comm, sharded bool, eps float64) (*optim.AdamW, error) {
	cfg := optim.Config{Beta1: 0.9, Beta2: 0.999, Eps: eps}
	tab := m.Table()
	var groups []optim.Group
	if !sharded {
		for _, p := range tab.Params {
			groups = append(groups, optim.Group{Off: p.Offset, N: p.N, Decay: p.Decay})
		}
		return optim.New(be, m.Params(), m.Grads(), groups, cfg)
	}
	var ids []int
	for _, pc := range m.Sharding().Pieces(tab) {
		groups = append(groups, optim.Group{Off: pc.At, N: pc.Hi - pc.Lo, Decay: tab.Params[pc.Param].Decay})
		ids = append(ids, pc.Param)
	}
	return optim.NewSharded(be, m.Params(), m.Grads(), groups, cfg, optim.Sharded{Comm: comm, IDs: len(tab.Params), GroupID: ids})
}

// median and minimum of the step times (ms).
func medianMin(times []float64) (med, lo float64) {
	sorted := slices.Clone(times)
	sort.Float64s(sorted)
	med = sorted[len(sorted)/2]
	if len(sorted)%2 == 0 {
		med = (sorted[len(sorted)/2-1] + sorted[len(sorted)/2]) / 2
	}
	return med, sorted[0]
}

func sumOf(x []float64) float64 {
	var s float64
	for _, v := range x {
		s += v
	}
	return s
}

// peakRSSMiB reads VmHWM from /proc/self/status (0 where unavailable).
func peakRSSMiB() float64 {
	_, peak, _ := meminfo.Self()
	return float64(peak) / (1 << 20)
}
