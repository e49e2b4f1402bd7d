package trainer

import (
	"encoding/json"
	"errors"
	"fmt"
	"io"
	"os"
	"os/exec"
	"testing"

	"github.com/spf13/pflag"
	"github.com/tracegrpo/tracegrpo/kernels"
	"github.com/tracegrpo/tracegrpo/kernels/cpu"
)

// TestMain runs this test binary as a trainer when the environment asks
// for it (TRACEGRPO_TRAINER_ARGS, a JSON list of arguments), so that tests
// can kill a real trainer process.
func TestMain(m *testing.M) {
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
