package trainer

import (
	"bytes"
	"encoding/json"
	"errors"
	"fmt"
	"os"
	"path/filepath"
	"runtime"
	"slices"
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

// TestResumeWarnsOfLostMetricsLines (issue 34): a resume whose
// metrics.jsonl lost lines of steps before the checkpoint warns, under
// --quiet too, naming the missing steps; the kept lines stay, the run
// continues after the checkpoint, and a complete log resumes silently.
func TestResumeWarnsOfLostMetricsLines(t *testing.T) {
	for _, c := range []struct {
		name string
		drop map[int]bool // steps whose lines are lost
		want string
	}{
		{"complete", nil, ""},
		{"two lines lost", map[int]bool{2: true, 3: true}, "no line for steps 2-3 (2) of the 4 steps"},
		{"first and last lost", map[int]bool{1: true, 4: true}, "no line for steps 1, 4 (2) of the 4 steps"},
		{"all lost", map[int]bool{1: true, 2: true, 3: true, 4: true}, "no line for steps 1-4 (4) of the 4 steps"},
	} {
		t.Run(c.name, func(t *testing.T) {
			out := t.TempDir()
			mustTrain(t, trainArgs(out, 4, "--set", "policy.megatron_cfg.scheduler.lr_decay_iters=6")...)
			path := filepath.Join(out, "metrics.jsonl")
			var kept []int
			var buf bytes.Buffer
			for _, m := range metricsNoTimes(t, out) {
				if !c.drop[m.Step] {
					b, _ := json.Marshal(m)
					buf.Write(append(b, '\n'))
					kept = append(kept, m.Step)
				}
			}
			if err := os.WriteFile(path, buf.Bytes(), 0o644); err != nil {
				t.Fatal(err)
			}
			log := mustTrain(t, trainArgs(out, 6, "--resume", "--set", "policy.megatron_cfg.scheduler.lr_decay_iters=6")...)
			warned := strings.Contains(log, "warning: resume: "+path)
			if c.want == "" && warned || c.want != "" && (!warned || !strings.Contains(log, c.want)) {
				t.Fatalf("resume log:\n%s\nwant a warning containing %q", log, c.want)
			}
			var steps []int
			for _, m := range metricsNoTimes(t, out) {
				steps = append(steps, m.Step)
			}
			if want := append(kept, 5, 6); !slices.Equal(steps, want) {
				t.Fatalf("metrics.jsonl holds steps %v after the resume, want %v", steps, want)
			}
		})
	}
}

func TestStepRanges(t *testing.T) {
	many := make([]int, 0, 60)
	for s := 1; s <= 120; s += 2 {
		many = append(many, s)
	}
	for _, c := range []struct {
		steps []int
		want  string
	}{
		{[]int{7}, "step 7 (1)"},
		{[]int{1, 2, 3, 5, 9, 10}, "steps 1-3, 5, 9-10 (6)"},
		{many, "steps 1, 3, 5, 7, 9, 11, 13, 15, 17, 19, 21, 23, 25, 27, 29, 31, 33, 35, 37, 39 and 40 more (60)"},
	} {
		if got := stepRanges(c.steps); got != c.want {
			t.Errorf("stepRanges(%v) = %q, want %q", c.steps, got, c.want)
		}
	}
}
