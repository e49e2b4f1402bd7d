package trainer

import (
	"encoding/json"
	"errors"
	"fmt"
	"os"
	"path/filepath"
	"runtime"
	"strings"
	"syscall"
	"testing"

	"github.com/google/go-cmp/cmp"
	"github.com/tracegrpo/tracegrpo/checkpoint"
)

// watchedMetrics wraps metrics.jsonl and records, at each line written and
// each Sync, which checkpoints are published at that moment; it fails the
// write or the Sync that follows step failAt's line when asked.
type watchedMetrics struct {
	metricsFile
	ckpts  string // the run's checkpoints directory
	events []metricsEvent
	last   int // the step of the last line written

	failAt       int    // a step whose line (or its Sync) fails; 0: none
	failOp       string // "write" or "sync"
	writesFailed int
	syncsFailed  int
}

// metricsEvent is one write ("line N") or Sync ("sync after line N") and
// whether checkpoint step N was already published then.
type metricsEvent struct {
	Op        string
	Step      int
	Published bool
}

var errInjected = errors.New("injected failure")

func (w *watchedMetrics) published(step int) bool {
	_, err := os.Stat(filepath.Join(w.ckpts, checkpoint.StepDir(int64(step))))
	return err == nil
}

func (w *watchedMetrics) Write(b []byte) (int, error) {
	var m struct{ Step int }
	if err := json.Unmarshal(b, &m); err != nil {
		return 0, fmt.Errorf("the trainer wrote a line that is not JSON: %q", b)
	}
	w.last = m.Step
	w.events = append(w.events, metricsEvent{"line", m.Step, w.published(m.Step)})
	if w.failAt == m.Step && w.failOp == "write" {
		w.writesFailed++
		return 0, errInjected
	}
	return w.metricsFile.Write(b)
}

func (w *watchedMetrics) Sync() error {
	w.events = append(w.events, metricsEvent{"sync", w.last, w.published(w.last)})
	if w.failAt == w.last && w.failOp == "sync" {
		w.syncsFailed++
		return errInjected
	}
	return w.metricsFile.Sync()
}

// runWatched runs train with args in one process, its metrics.jsonl
// wrapped by w (w.ckpts is filled in), and returns Run's error.
func runWatched(t *testing.T, w *watchedMetrics, args ...string) error {
	t.Helper()
	errs, logs := eachLocalRank(t, 1, args, nil, func(_ int, tr *Trainer) error {
		w.ckpts = tr.checkpointDir()
		w.metricsFile = tr.metricsFile
		tr.metricsFile = w
		return tr.Run()
	})
	if errs[0] != nil && !errors.Is(errs[0], errInjected) {
		t.Fatalf("%v\n%s", errs[0], logs[0])
	}
	return errs[0]
}

// TestCheckpointPublishedAfterItsSyncedLine: each step's metrics line is
// written before the step's checkpoint is published, and synced in
// between, so that whatever moment a crash comes at, a checkpoint of step
// N never exists without line N on disk. (A random-kill test almost never
// kills inside that window; this one sees the order of every write.)
func TestCheckpointPublishedAfterItsSyncedLine(t *testing.T) {
	w := &watchedMetrics{}
	runWatched(t, w, trainArgs(t.TempDir(), 4)...) // checkpoints at steps 2 and 4
	var got []metricsEvent
	for _, e := range w.events {
		if e.Step%2 == 0 { // other lines may be synced or not
			got = append(got, e)
		}
	}
	want := []metricsEvent{
		{"line", 2, false}, {"sync", 2, false},
		{"line", 4, false}, {"sync", 4, false},
	}
	if d := cmp.Diff(want, got); d != "" {
		t.Errorf("writes and syncs of the checkpointed steps' lines (-want +got):\n%s\nall events: %+v", d, w.events)
	}
	for _, s := range []int{2, 4} {
		if !w.published(s) {
			t.Errorf("no checkpoint of step %d after the run", s)
		}
	}
}

// TestFailedMetricsLineLeavesNoCheckpoint: when the line of a checkpointed
// step cannot be written or synced, the run fails naming metrics and the
// step's checkpoint is never published (nor left half-written).
func TestFailedMetricsLineLeavesNoCheckpoint(t *testing.T) {
	for _, op := range []string{"write", "sync"} {
		t.Run(op, func(t *testing.T) {
			w := &watchedMetrics{failAt: 2, failOp: op}
			err := runWatched(t, w, trainArgs(t.TempDir(), 4)...)
			if !errors.Is(err, errInjected) || !strings.Contains(err.Error(), "metrics") {
				t.Fatalf("the %s of step 2's line failed: Run returned %v, want the metrics error", op, err)
			}
			if w.writesFailed+w.syncsFailed != 1 {
				t.Fatalf("the injected %s failure never happened (events %+v)", op, w.events)
			}
			ents, _ := os.ReadDir(w.ckpts)
			var names []string
			for _, e := range ents {
				names = append(names, e.Name())
			}
			if len(names) != 0 {
				t.Errorf("after step 2's line failed, the checkpoints directory holds %v, want nothing", names)
			}
		})
	}
}

// TestSignalStopCheckpointsOnRankZeroOnly: a stop request on one rank of
// two ends both after the step in progress, with one checkpoint of that
// step, written by rank 0 alone (every rank saving raced on the shared
// run directory). Rank 1 is given a run directory of its own here, so that
// anything it writes is seen. The stop is an error every rank agrees on:
// it was not, so cmd/train had every rank of a clean stop abort the run,
// and an abort could cut another rank's last exchange short.
func TestSignalStopCheckpointsOnRankZeroOnly(t *testing.T) {
	out, rank1Out := t.TempDir(), t.TempDir()
	// No periodic checkpoint before step 4: the stop's is the only one.
	args := trainArgs(out, 4, "--set", "checkpointing.save_period=100")
	errs, logs := eachLocalRank(t, 2, args, nil, func(r int, tr *Trainer) error {
		if r == 1 {
			tr.out = rank1Out
			sigs := make(chan os.Signal, 1)
			sigs <- syscall.SIGTERM
			tr.o.Signals = sigs
			tr.watchSignals()
			for tr.interrupted() == nil { // the request is in before step 1 ends
				runtime.Gosched()
			}
		}
		return tr.Run()
	})
	for r, err := range errs {
		if !errors.Is(err, errInterrupted) || !strings.Contains(err.Error(), "after step 1") || !Agreed(err) {
			t.Fatalf("rank %d: %v (agreed %v), want a stop after step 1 that every rank agrees on\n%s", r, err, Agreed(err), logs[r])
		}
	}
	if !strings.Contains(errs[0].Error(), "checkpoint of step 1 written") {
		t.Errorf("rank 0: %v, want it to name the checkpoint", errs[0])
	}
	dir := filepath.Join(out, "checkpoints", checkpoint.StepDir(1))
	if _, err := checkpoint.Load(dir, checkpoint.LoadOptions{}); err != nil {
		t.Errorf("the stop's checkpoint: %v", err)
	}
	ents, _ := os.ReadDir(filepath.Join(out, "checkpoints"))
	if len(ents) != 1 {
		t.Errorf("%d entries in the checkpoints directory, want step_1 alone", len(ents))
	}
	if ents, _ := os.ReadDir(rank1Out); len(ents) != 0 {
		t.Errorf("rank 1 wrote into the run directory: %v", ents)
	}
}
