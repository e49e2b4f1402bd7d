//go:build !unix

package trainer

import (
	"os"
	"syscall"
)

// stopSignals are the signals that request a stop: Ctrl-C and SIGTERM.
var stopSignals = []os.Signal{os.Interrupt, syscall.SIGTERM}

// sigUSR1 is no signal off unix.
var sigUSR1 = syscall.Signal(-1)
