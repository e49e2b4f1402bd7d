//go:build unix

package trainer

import (
	"os"
	"syscall"
)

// stopSignals are the signals that request a stop: Ctrl-C, a scheduler's
// SIGTERM, and SIGUSR1, which mpirun forwards to every rank without
// killing them afterwards (as it does after forwarding a SIGTERM), and
// which Slurm sends ahead of a time limit when asked (--signal=USR1@120).
var stopSignals = []os.Signal{os.Interrupt, syscall.SIGTERM, syscall.SIGUSR1}

// sigUSR1 names SIGUSR1 in messages.
var sigUSR1 = syscall.SIGUSR1
