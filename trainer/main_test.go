package trainer

import (
	"errors"
	"fmt"
	"io"
	"os"

	"github.com/spf13/pflag"
	"github.com/tracegrpo/tracegrpo/kernels/cpu"
)

// testSignals, when set, is the run's Options.Signals (tests deliver a
// signal through it without signalling the test binary).
var testSignals chan os.Signal

// run is train's command line for the tests of this package: the run's
// flags, the CPU backend, and train's exit statuses (0, 1 for a failure,
// 2 for a usage error).
func run(args []string, stdout, stderr io.Writer) int {
	var o Options
	fs := pflag.NewFlagSet("train", pflag.ContinueOnError)
	fs.SetOutput(io.Discard)
	o.AddFlags(fs)
	if err := fs.Parse(args); err != nil {
		fmt.Fprintf(stderr, "train: %v\n", err)
		return 2
	}
	be := cpu.New(2)
	defer be.Close()
	o.Backend, o.Log = be, stderr
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
