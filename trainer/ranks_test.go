package trainer

import (
	"bytes"
	"errors"
	"fmt"
	"math"
	"os"
	"path/filepath"
	"strings"
	"sync"
	"sync/atomic"
	"testing"

	"github.com/tracegrpo/tracegrpo/checkpoint"
	"github.com/tracegrpo/tracegrpo/collective"
	"github.com/tracegrpo/tracegrpo/kernels"
	"github.com/tracegrpo/tracegrpo/kernels/cpu"
)

// runLocalRanks runs train with args on n in-process ranks (goroutines, each
// with its own CPU backend, over collective.Local) and returns each rank's error
// and log.
func runLocalRanks(t *testing.T, n int, args ...string) ([]error, []string) {
	t.Helper()
	return eachLocalRank(t, n, args, nil, func(_ int, tr *Trainer) error { return tr.Run() })
}

// eachLocalRank sets up train with args on n in-process ranks (wrap, when
// not nil, wraps each rank's CPU backend), runs body on each rank's trainer
// concurrently, and returns each rank's error (New's or body's) and log.
func eachLocalRank(t *testing.T, n int, args []string, wrap func(r int, b kernels.Backend) kernels.Backend, body func(r int, tr *Trainer) error) ([]error, []string) {
	t.Helper()
	mems := make([]kernels.Backend, n)
	for i := range mems {
		b := cpu.New(1)
		t.Cleanup(b.Close)
		mems[i] = b
	}
	comms := collective.Local(mems)
	errs := make([]error, n)
	logs := make([]bytes.Buffer, n)
	var wg sync.WaitGroup
	for r := 0; r < n; r++ {
		wg.Add(1)
		go func() {
			defer wg.Done()
			var o Options
			fs := newTestFlags()
			o.AddFlags(fs)
			if err := fs.Parse(args); err != nil {
				errs[r] = err
				comms[r].Abort(1)
				return
			}
			o.Backend, o.Comm, o.Log = mems[r], comms[r], &logs[r]
			if wrap != nil {
				o.Backend = wrap(r, mems[r])
			}
			tr, err := New(o)
			if err == nil {
				err = body(r, tr)
				tr.Close()
			}
			if err != nil && !Agreed(err) {
				comms[r].Abort(1) // as cmd/train does: the others must not wait
			}
			errs[r] = err
		}()
	}
	wg.Wait()
	out := make([]string, n)
	for r := range logs {
		out[r] = logs[r].String()
	}
	return errs, out
}

func mustRanks(t *testing.T, n int, args ...string) {
	t.Helper()
	errs, logs := runLocalRanks(t, n, args...)
	for r, err := range errs {
		if err != nil {
			t.Fatalf("%d ranks, rank %d: %v\n%s", n, r, err, logs[r])
		}
	}
}

// rankTol bounds the weight difference between runs at different world
// sizes: the ranks sum their gradients in another order than one process
// (each rank its micro-batches, then the ranks' sums), so a gradient moves
// by δg ≲ 1e-8 (float32 sums, ~1e-7 relative, of elements up to ~0.1), and
// AdamW with the same-update tests' eps (1e-4) amplifies that by at most
// lr/eps = 10 per step. 1e-6 (1e-3·lr) bounds 3 steps (cmd/train's mpirun
// test measures 1.2e-7 after 4), while a wrong divisor or a dropped rank's
// gradient moves weights by ~1e-4.
const rankTol = 1e-6

// TestRanksTrainLikeOneProcess: the built-in job on 2 and 3 in-process
// ranks samples the same rollouts as one process (metrics equal), gets the
// same weights after every step within rankTol, twice the same run is bit
// identical, and only rank 0's files exist.
func TestRanksTrainLikeOneProcess(t *testing.T) {
	const steps = 3
	args := func(out string) []string {
		return append(trainArgs(out, steps, sameUpdateSets...), "--set", "checkpointing.save_period=1")
	}
	ref := t.TempDir()
	mustTrain(t, args(ref)...)
	want := metricsNoTimes(t, ref)
	for _, n := range []int{2, 3} {
		t.Run(fmt.Sprintf("%d ranks", n), func(t *testing.T) {
			outs := []string{t.TempDir(), t.TempDir()}
			for _, out := range outs {
				mustRanks(t, n, args(out)...)
			}
			got := metricsNoTimes(t, outs[0])
			if len(got) != steps {
				t.Fatalf("%d metric lines", len(got))
			}
			for i := range got {
				w, g := want[i], got[i]
				if g.RewardMean != w.RewardMean || g.LogicalRollouts != w.LogicalRollouts || g.EligibleTokens != w.EligibleTokens ||
					g.Traces != w.Traces || g.PhysicalRows != w.PhysicalRows || g.PaddingRows != w.PaddingRows || g.TrainTokens != w.TrainTokens {
					t.Errorf("step %d: %d ranks trained other data than one process:\n got %+v\nwant %+v", i+1, n, g, w)
				}
				if d := math.Abs(float64(g.Loss - w.Loss)); d > 1e-6*math.Max(1, math.Abs(float64(w.Loss))) {
					t.Errorf("step %d: loss %v, one process %v", i+1, g.Loss, w.Loss)
				}
			}
			for s := 1; s <= steps; s++ {
				d, where := maxAbsDiff(weights(t, ref, s), weights(t, outs[0], s))
				if d > rankTol {
					t.Errorf("step %d: weights differ from one process by %.3g at %s", s, d, where)
				}
				t.Logf("step %d: largest weight difference from one process %.3g (bound %g)", s, d, rankTol)
			}
			for _, f := range []string{checkpoint.ModelFile, "optimizer.safetensors"} {
				if !bytes.Equal(checkpointBytes(t, outs[0], steps, f), checkpointBytes(t, outs[1], steps, f)) {
					t.Errorf("two runs on %d ranks: %s differs", n, f)
				}
			}
			sameFiles(t, ref, outs[0])
		})
	}
}

// sameFiles fails when the run directories hold other files (names,
// recursively) than the one-process run's.
func sameFiles(t *testing.T, ref, out string) {
	t.Helper()
	list := func(dir string) string {
		var names []string
		filepath.Walk(dir, func(p string, info os.FileInfo, err error) error {
			if err == nil && p != dir {
				rel, _ := filepath.Rel(dir, p)
				names = append(names, rel)
			}
			return nil
		})
		return strings.Join(names, "\n")
	}
	if a, b := list(ref), list(out); a != b {
		t.Errorf("the run directory holds other files than one process's:\none process:\n%s\nranks:\n%s", a, b)
	}
}

// allocCounter counts a backend's allocations.
type allocCounter struct {
	kernels.Backend
	n atomic.Int64
}

func (a *allocCounter) Alloc(dt kernels.DType, n int) (kernels.Buf, error) {
	a.n.Add(1)
	return a.Backend.Alloc(dt, n)
}

// TestRanksAllocateNothingDuringSteps: with two ranks, the steps (their
// gathers of metrics, errors and weight hashes included) allocate nothing on
// the backend after New: the ranks' exchanges allocated and freed device
// buffers in every gather, 8 allocations a step.
func TestRanksAllocateNothingDuringSteps(t *testing.T) {
	const n = 2
	counters := make([]*allocCounter, n)
	during := make([]int64, n)
	errs, logs := eachLocalRank(t, n, trainArgs(t.TempDir(), 3, "--set", "checkpointing.save_period=1"),
		func(r int, b kernels.Backend) kernels.Backend {
			counters[r] = &allocCounter{Backend: b}
			return counters[r]
		},
		func(r int, tr *Trainer) error {
			before := counters[r].n.Load()
			err := tr.Run()
			during[r] = counters[r].n.Load() - before
			return err
		})
	for r := range n {
		if errs[r] != nil {
			t.Fatalf("rank %d: %v\n%s", r, errs[r], logs[r])
		}
		if during[r] != 0 {
			t.Errorf("rank %d allocated %d buffers on its backend during 3 steps, want 0", r, during[r])
		}
	}
}

// TestRanksKeepUsageErrors: a usage error stays one (exit status 2 in
// cmd/train) on every rank, as in one process; the ranks' agreement passed
// errors on as text and every rank exited 1.
func TestRanksKeepUsageErrors(t *testing.T) {
	errs, _ := runLocalRanks(t, 2, trainArgs(t.TempDir(), 1, "--on-nonfinite", "bogus")...)
	for r, err := range errs {
		if !errors.Is(err, ErrUsage) || !Agreed(err) {
			t.Errorf("rank %d: %v (usage %v, agreed %v), want an agreed usage error", r, err, errors.Is(err, ErrUsage), Agreed(err))
		}
	}
}

// TestRanksCatchDivergedWeights: when one rank's weights differ from rank
// 0's, every rank fails the weights check together, naming the rank.
func TestRanksCatchDivergedWeights(t *testing.T) {
	const n = 2
	same, diverged := make([]error, n), make([]error, n)
	errs, _ := eachLocalRank(t, n, trainArgs(t.TempDir(), 1), nil, func(r int, tr *Trainer) error {
		same[r] = tr.checkSameWeights("test")
		if r == 1 {
			tr.model.InitRandom(99)
		}
		diverged[r] = tr.checkSameWeights("test")
		return nil
	})
	for r := range n {
		switch {
		case errs[r] != nil:
			t.Fatalf("rank %d: %v", r, errs[r])
		case same[r] != nil:
			t.Errorf("same weights, rank %d: %v", r, same[r])
		case diverged[r] == nil || !Agreed(diverged[r]) || !strings.Contains(diverged[r].Error(), "rank 1's weights differ"):
			t.Errorf("rank 1 diverged, rank %d: %v; want an agreed error naming rank 1", r, diverged[r])
		}
	}
}
