package trainer

import (
	"bufio"
	"bytes"
	"encoding/json"
	"errors"
	"fmt"
	"io"
	"os"
	"os/exec"
	"strings"
	"sync"
	"syscall"
	"testing"
	"time"

	"github.com/spf13/pflag"
	"github.com/tracegrpo/tracegrpo/kernels"
	"github.com/tracegrpo/tracegrpo/kernels/cpu"
)

// TestMain runs this test binary as a trainer when the environment asks
// for it (TRACEGRPO_TRAINER_ARGS, a JSON list of arguments), so that tests
// can kill a real trainer process.
func TestMain(m *testing.M) {
	if os.Getenv(watchSignalsEnv) == "1" {
		// WatchSignals alone, its stop requests never taken: only a second
		// signal ends this process.
		WatchSignals(os.Stderr)
		fmt.Println("watching")
		select {}
	}
	if a := os.Getenv("TRACEGRPO_TRAINER_ARGS"); a != "" {
		var args []string
		if err := json.Unmarshal([]byte(a), &args); err != nil {
			fmt.Fprintln(os.Stderr, err)
			os.Exit(2)
		}
		os.Exit(run(args, os.Stdout, os.Stderr))
	}
	os.Exit(m.Run())
}

// trainerCommand is this test binary started as a trainer with args.
func trainerCommand(t *testing.T, args ...string) *exec.Cmd {
	t.Helper()
	a, _ := json.Marshal(args)
	cmd := exec.Command(os.Args[0], "-test.run=^$")
	cmd.Env = append(os.Environ(), "TRACEGRPO_TRAINER_ARGS="+string(a))
	return cmd
}

// testSignals, when set, is the run's Options.Signals (tests deliver a
// signal through it without signalling the test binary).
var testSignals chan os.Signal

// testWrap, when set, wraps the run's backend (to count its calls).
var testWrap func(kernels.Backend) kernels.Backend

// run is train's command line for the tests of this package: the run's
// flags, the CPU backend, and train's exit statuses (0, 1 for a failure,
// 2 for a usage error).
func run(args []string, stdout, stderr io.Writer) int {
	var o Options
	fs := newTestFlags()
	o.AddFlags(fs)
	if err := fs.Parse(args); err != nil {
		fmt.Fprintf(stderr, "train: %v\n", err)
		return 2
	}
	be := cpu.New(2)
	defer be.Close()
	o.Backend, o.Log = be, stderr
	if testWrap != nil {
		o.Backend = testWrap(be)
	}
	if testSignals != nil {
		o.Signals = testSignals
	}
	t, err := New(o)
	if err == nil {
		err = t.Run()
		t.Close()
	}
	switch {
	case err == nil:
		return 0
	case errors.Is(err, ErrUsage):
		fmt.Fprintf(stderr, "train: %v\n", err)
		return 2
	default:
		fmt.Fprintf(stderr, "train: %v\n", err)
		return 1
	}
}

func newTestFlags() *pflag.FlagSet {
	fs := pflag.NewFlagSet("train", pflag.ContinueOnError)
	fs.SetOutput(io.Discard)
	return fs
}

// watchSignalsEnv runs this test binary as WatchSignals alone.
const watchSignalsEnv = "TRACEGRPO_TEST_WATCH_SIGNALS"

// TestSecondSignalKillsBySignal: with the first stop request still pending
// (a step that does not end), a second SIGINT or SIGTERM ends the process
// at once, by that signal, saying so. cmd/train's test of two signals on a
// real run may see the run stop cleanly on the first; this one cannot.
func TestSecondSignalKillsBySignal(t *testing.T) {
	for _, sig := range []syscall.Signal{syscall.SIGINT, syscall.SIGTERM} {
		cmd := exec.Command(os.Args[0], "-test.run=^$")
		cmd.Env = append(os.Environ(), watchSignalsEnv+"=1")
		stderr := &lockedBuffer{}
		cmd.Stderr = stderr
		stdout, err := cmd.StdoutPipe()
		if err != nil {
			t.Fatal(err)
		}
		if err := cmd.Start(); err != nil {
			t.Fatal(err)
		}
		line, _ := bufio.NewReader(stdout).ReadString('\n')
		if line != "watching\n" {
			cmd.Process.Kill()
			t.Fatalf("helper said %q", line)
		}
		cmd.Process.Signal(sig)
		// The second is sent once the first was taken: two signals of a
		// kind pending at once are one.
		for deadline := time.Now().Add(time.Minute); !strings.Contains(stderr.String(), "stopping after the step in progress"); time.Sleep(5 * time.Millisecond) {
			if time.Now().After(deadline) {
				cmd.Process.Kill()
				t.Fatalf("%v: the first signal was not announced:\n%s", sig, stderr.String())
			}
		}
		cmd.Process.Signal(sig)
		done := make(chan error, 1)
		go func() { done <- cmd.Wait() }()
		select {
		case err = <-done:
		case <-time.After(20 * time.Second):
			cmd.Process.Kill()
			t.Fatalf("%v: the process did not end after a second signal:\n%s", sig, stderr.String())
		}
		var ee *exec.ExitError
		if !errors.As(err, &ee) {
			t.Fatalf("%v: %v", sig, err)
		}
		if ws, _ := ee.Sys().(syscall.WaitStatus); !ws.Signaled() || ws.Signal() != sig {
			t.Errorf("%v: ended with %v, want death by the signal", sig, ws)
		}
		for _, w := range []string{"stopping after the step in progress", "second " + signalName(sig) + ": stopping at once"} {
			if !strings.Contains(stderr.String(), w) {
				t.Errorf("%v: stderr lacks %q:\n%s", sig, w, stderr.String())
			}
		}
	}
}

// lockedBuffer collects a process's output, readable while it runs.
type lockedBuffer struct {
	mu sync.Mutex
	b  bytes.Buffer
}

func (l *lockedBuffer) Write(p []byte) (int, error) {
	l.mu.Lock()
	defer l.mu.Unlock()
	return l.b.Write(p)
}

func (l *lockedBuffer) String() string {
	l.mu.Lock()
	defer l.mu.Unlock()
	return l.b.String()
}
