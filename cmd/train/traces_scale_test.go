package main

import (
	"bufio"
	"fmt"
	"os"
	"path/filepath"
	"strings"
	"syscall"
	"testing"
	"time"

	"github.com/tracegrpo/tracegrpo/gym"
)

// tracesScaleInput writes n rollouts, each a record of about 20 KB (a long
// response passed through, as Gym's are) and two captured calls, and
// returns the capture store, the rollouts file and its size.
func tracesScaleInput(t *testing.T, dir string, n int) (caps, recs string, bytes int64) {
	t.Helper()
	caps = filepath.Join(dir, "captures")
	w, err := gym.NewWriter(caps)
	if err != nil {
		t.Fatal(err)
	}
	w.SetFsync(false)
	recs = filepath.Join(dir, "rollouts.jsonl")
	f, err := os.Create(recs)
	if err != nil {
		t.Fatal(err)
	}
	bw := bufio.NewWriterSize(f, 1<<20)
	text := strings.Repeat("the agent called a tool and read its answer. ", 450)
	for i := range n {
		rid := fmt.Sprintf("r%d", i)
		for _, e := range []*gym.TokenEntry{
			stampedCall(rid, "a", []int32{1, 2, int32(3 + i%50)}, []int32{10, 11}, ""),
			stampedCall(rid, "b", []int32{1, 2, int32(3 + i%50), 10, 11, 4}, []int32{12, 13}, "a"),
		} {
			if err := w.Put(e); err != nil {
				t.Fatal(err)
			}
		}
		fmt.Fprintf(bw, `{"reward":%d,"_ng_task_index":%d,"_ng_rollout_index":%d,"_ng_rollout_id":%q,"response":{"output_text":%q}}`+"\n", i%2, i/4, i%4, rid, text)
	}
	if err := bw.Flush(); err != nil {
		t.Fatal(err)
	}
	st, err := f.Stat()
	if err != nil {
		t.Fatal(err)
	}
	f.Close()
	return caps, recs, st.Size()
}

// tracesPeak runs train traces as a process and returns its peak resident
// memory and its time.
func tracesPeak(t *testing.T, caps, recs string) (rssMiB float64, d time.Duration) {
	t.Helper()
	out := filepath.Join(filepath.Dir(recs), "traces.jsonl")
	cmd := trainCommand("traces", "--captures", caps, "--rollouts", recs, "--out", out, "--jobs", "2")
	start := time.Now()
	if b, err := cmd.CombinedOutput(); err != nil {
		t.Fatalf("traces: %v\n%s", err, b)
	}
	d = time.Since(start)
	ru, _ := cmd.ProcessState.SysUsage().(*syscall.Rusage)
	return float64(ru.Maxrss) / 1024, d
}

// TestTracesMemoryIsFlat (issue 26, a case that passed, kept): train
// traces streams its input: four times the rollouts (32 MB against 8 MB of
// records here, 200 MB against 50 MB with TRACEGRPO_LONG=1) take about the
// same peak memory, and about four times the time (the bound is loose: the
// machine is shared).
func TestTracesMemoryIsFlat(t *testing.T) {
	small := 400
	if os.Getenv("TRACEGRPO_LONG") == "1" {
		small = 2500
	}
	var rss [2]float64
	var took [2]time.Duration
	var size [2]int64
	for i, n := range []int{small, 4 * small} {
		caps, recs, b := tracesScaleInput(t, t.TempDir(), n)
		size[i] = b
		rss[i], took[i] = tracesPeak(t, caps, recs)
		t.Logf("%d rollouts, %.1f MB of records: peak RSS %.1f MiB, %v (shared machine)", n, float64(b)/1e6, rss[i], took[i].Round(time.Millisecond))
	}
	// Flat: the input grew by 3× its size; memory may not grow by a third of that.
	if grew := rss[1] - rss[0]; grew > float64(size[1]-size[0])/(1<<20)/3 {
		t.Errorf("peak memory grew by %.1f MiB for %.1f MB more records: traces holds its input", grew, float64(size[1]-size[0])/1e6)
	}
	if took[1] > 12*took[0]+2*time.Second {
		t.Errorf("4× the rollouts took %v against %v: not linear", took[1], took[0])
	}
}
