package checkpoint

import (
	"bufio"
	"bytes"
	"errors"
	"fmt"
	"math/rand/v2"
	"os"
	"os/exec"
	"path/filepath"
	"strings"
	"syscall"
	"testing"
	"time"

	"github.com/google/go-cmp/cmp"
)

// crashDirEnv makes the test binary a checkpoint writer (see TestMain).
const crashDirEnv = "TRACEGRPO_CHECKPOINT_CRASH_DIR"

// crashTensorSize keeps each save small (~0.3 MB) so that the 30 trials take
// a few seconds and the kills land at many different points of a save.
const crashTensorSize = 20000

// The writer's lines on stdout: writerReady once it has resumed, just before
// its first save, then writerSaved with the step and the save's duration in
// nanoseconds after every save. The test times its kills from them, so the
// kills land among the saves however slowly a loaded machine starts a
// process or writes a file.
const (
	writerReady = "writer: saving"
	writerSaved = "writer: saved"
)

func TestMain(m *testing.M) {
	if dir := os.Getenv(crashDirEnv); dir != "" {
		os.Exit(crashWriter(dir))
	}
	os.Exit(m.Run())
}

// crashWriter resumes from the newest checkpoint in dir, checks it is the
// state that step should have, and then saves step after step until killed.
// Exit status 3 reports a wrong or unloadable checkpoint.
func crashWriter(dir string) int {
	start := int64(1)
	res, err := LoadLatest(dir, LoadOptions{})
	switch {
	case err == nil:
		want := testState(res.State.Trainer.Step, crashTensorSize)
		sortTensors(want.Model)
		sortTensors(want.Optimizer)
		if diff := cmp.Diff(want, res.State, bitsEqual); diff != "" {
			fmt.Fprintf(os.Stderr, "resumed %s differs from the state saved (-want +got):\n%s", res.Path, diff)
			return 3
		}
		start = res.State.Trainer.Step + 1
	case errors.Is(err, ErrNoCheckpoint):
	default:
		fmt.Fprintf(os.Stderr, "resume: %v\n", err)
		return 3
	}
	fmt.Println(writerReady)
	// Stop if the test that started us is gone, or after a bound, so that a
	// writer is never left running.
	parent, deadline := os.Getppid(), time.Now().Add(time.Minute)
	for step := start; os.Getppid() == parent && time.Now().Before(deadline); step++ {
		t0 := time.Now()
		if _, err := Save(dir, testState(step, crashTensorSize), SaveOptions{KeepTopK: 3, CompressOptimizer: step%2 == 0}); err != nil {
			fmt.Fprintf(os.Stderr, "save step %d: %v\n", step, err)
			return 3
		}
		fmt.Printf("%s %d %d\n", writerSaved, step, time.Since(t0).Nanoseconds())
	}
	return 0
}

// TestCrashSafety runs the writer in a subprocess and SIGKILLs it at random
// moments (fixed seed). After every kill, every step_N directory must load
// and hold exactly the state of step N, the newest two must exist once two
// saves have finished, and the next writer must resume from the newest.
func TestCrashSafety(t *testing.T) {
	const trials = 30
	dir := t.TempDir()
	rng := rand.New(rand.NewPCG(2026, 11))
	midSave, lastStep := 0, int64(0)
	saveTime := 50 * time.Millisecond // until the writer has timed one
	for trial := 0; trial < trials; trial++ {
		cmd := exec.Command(os.Args[0], "-test.run=^$")
		cmd.Env = append(os.Environ(), crashDirEnv+"="+dir)
		var out bytes.Buffer
		cmd.Stderr = &out
		stdout, err := cmd.StdoutPipe()
		if err != nil {
			t.Fatal(err)
		}
		if err := cmd.Start(); err != nil {
			t.Fatal(err)
		}
		// Let the writer finish 0, 1 or 2 saves, then kill it at a random
		// point of the next one: a delay up to 1.25 times the last save's
		// duration.
		lines := make(chan string)
		go func() {
			defer close(lines)
			sc := bufio.NewScanner(stdout)
			for sc.Scan() {
				lines <- sc.Text()
			}
		}()
		wantSaves, saves := rng.IntN(3), 0
		for started := false; !started || saves < wantSaves; {
			select {
			case line, ok := <-lines:
				switch {
				case !ok:
					cmd.Wait()
					t.Fatalf("trial %d: writer ended before the kill; output:\n%s", trial, out.String())
				case line == writerReady:
					started = true
				case strings.HasPrefix(line, writerSaved+" "):
					var step, ns int64
					if _, err := fmt.Sscanf(line, writerSaved+" %d %d", &step, &ns); err != nil {
						t.Fatalf("trial %d: writer said %q: %v", trial, line, err)
					}
					saves, saveTime = saves+1, time.Duration(ns)
				}
			case <-time.After(time.Minute):
				cmd.Process.Kill()
				cmd.Wait()
				t.Fatalf("trial %d: writer did not save within a minute; output:\n%s", trial, out.String())
			}
		}
		time.Sleep(time.Duration(rng.Int64N(int64(saveTime)*5/4 + 1)))
		go func() {
			for range lines { // drain, so the reader ends when the pipe closes
			}
		}()
		if err := cmd.Process.Signal(syscall.SIGKILL); err != nil {
			t.Fatalf("trial %d: kill: %v (writer output: %s)", trial, err, out.String())
		}
		err = cmd.Wait()
		var ee *exec.ExitError
		if !errors.As(err, &ee) || ee.Sys().(syscall.WaitStatus).Signal() != syscall.SIGKILL {
			t.Fatalf("trial %d: writer ended with %v before the kill; output:\n%s", trial, err, out.String())
		}
		ents, err := os.ReadDir(dir)
		if err != nil {
			t.Fatal(err)
		}
		for _, e := range ents {
			if strings.HasPrefix(e.Name(), tmpPrefix) || strings.HasPrefix(e.Name(), trashPrefix) {
				midSave++
				break
			}
		}
		steps, err := List(dir)
		if err != nil {
			t.Fatal(err)
		}
		for _, e := range steps {
			st, err := Load(e.Path, LoadOptions{})
			if err != nil {
				t.Fatalf("trial %d: %s does not load: %v", trial, filepath.Base(e.Path), err)
			}
			want := testState(e.Step, crashTensorSize)
			sortTensors(want.Model)
			sortTensors(want.Optimizer)
			if diff := cmp.Diff(want, st, bitsEqual); diff != "" {
				t.Fatalf("trial %d: %s loads but differs from what was saved (-want +got):\n%s", trial, filepath.Base(e.Path), diff)
			}
		}
		if len(steps) > 0 {
			if steps[0].Step < lastStep {
				t.Fatalf("trial %d: newest checkpoint went back from step %d to %d", trial, lastStep, steps[0].Step)
			}
			lastStep = steps[0].Step
			if steps[0].Step >= 2 && (len(steps) < 2 || steps[1].Step != steps[0].Step-1) {
				t.Fatalf("trial %d: newest is step %d but the previous one is missing (have %v)", trial, steps[0].Step, steps)
			}
		}
	}
	t.Logf("%d trials: reached step %d; %d kills left a save in progress", trials, lastStep, midSave)
	if lastStep < trials/2 {
		t.Errorf("only %d saves finished over %d trials: the kills came too early to test resuming", lastStep, trials)
	}
	if midSave == 0 {
		t.Errorf("no kill landed inside a save: the test did not exercise a crash mid-write")
	}
}
