package trainer

import (
	"errors"
	"fmt"
	"io"
	"os"
	"os/signal"
	"slices"
	"sync"
	"syscall"
	"time"

	"github.com/tracegrpo/tracegrpo/checkpoint"
	"github.com/tracegrpo/tracegrpo/collective"
)

// Schedulers pre-empt jobs with SIGTERM and a grace period; users press
// Ctrl-C; SIGUSR1 asks the same (mpirun forwards it to every rank and
// waits for them). The first of any ends the run after the step in
// progress, or at once while it waits for rollouts, with a checkpoint of
// the last completed step (when checkpointing is enabled), so that --resume
// loses no work. A second one ends the process at once: checkpoints are
// published by one rename, so the newest complete one is never corrupted.
//
// A SIGTERM sent to mpirun itself is forwarded to the ranks, and Open MPI
// SIGKILLs them about a second later (its odls_base_sigkill_timeout): no
// step or checkpoint can finish in that time. The ranks say so when they
// get it under mpirun, and name the signal that works: SIGUSR1 to mpirun.

// WatchSignals catches the process's SIGINT, SIGTERM and SIGUSR1 for a
// run: the first is delivered on stop (pass it as Options.Signals) and
// announced on log; the second kills the process with the default action
// of that signal. release stops watching.
func WatchSignals(log io.Writer) (stop <-chan os.Signal, release func()) {
	in := make(chan os.Signal, 2)
	out := make(chan os.Signal, 1)
	signal.Notify(in, stopSignals...)
	underMpirun := false
	if l, err := collective.DetectLaunch(os.Getenv); err == nil {
		underMpirun = slices.Contains(l.Launchers, "mpirun")
	}
	done := make(chan struct{})
	go func() {
		first := true
		for {
			select {
			case sig := <-in:
				if first {
					first = false
					fmt.Fprintf(log, "train: %s: stopping after the step in progress, with a checkpoint (%s again stops at once)\n", signalName(sig), signalName(sig))
					if underMpirun && sig == syscall.SIGTERM {
						fmt.Fprintf(log, "train: note: a SIGTERM sent to mpirun is followed by Open MPI's SIGKILL of every rank about a second later "+
							"(mca odls_base_sigkill_timeout): the step and its checkpoint may not finish (the newest complete checkpoint stays intact). "+
							"To stop an mpirun job with a checkpoint, send SIGUSR1 to mpirun (kill -USR1 <mpirun pid>): it forwards it to every rank and waits for them; "+
							"or start mpirun with --mca odls_base_sigkill_timeout set to the seconds a step and a checkpoint take\n")
					}
					out <- sig
					continue
				}
				fmt.Fprintf(log, "train: second %s: stopping at once (the newest complete checkpoint is intact)\n", signalName(sig))
				signal.Stop(in)
				signal.Reset(stopSignals...)
				code := 130
				if s, ok := sig.(syscall.Signal); ok {
					code = 128 + int(s)
					syscall.Kill(os.Getpid(), s) // the default action: death by that signal
					time.Sleep(time.Second)
				}
				os.Exit(code)
			case <-done:
				return
			}
		}
	}()
	var once sync.Once
	return out, func() {
		once.Do(func() {
			signal.Stop(in)
			close(done)
		})
	}
}

// stopWatch holds the first stop request of Options.Signals.
type stopWatch struct {
	sig     os.Signal     // written once, before stopped is closed
	stopped chan struct{} // closed by the first request
}

// watchSignals starts listening to Options.Signals (none: never stops
// early).
func (t *Trainer) watchSignals() {
	t.stop = &stopWatch{stopped: make(chan struct{})}
	if t.o.Signals == nil {
		return
	}
	sigs, w := t.o.Signals, t.stop
	go func() {
		sig, ok := <-sigs
		if !ok {
			return
		}
		w.sig = sig // the close below publishes it to every reader of stopped
		close(w.stopped)
	}()
}

// interrupted returns the stop request that arrived, if any.
func (t *Trainer) interrupted() os.Signal {
	select {
	case <-t.stop.stopped:
		return t.stop.sig
	default:
		return nil
	}
}

// stopRequested reports whether a stop request reached any rank (every
// rank gets the same answer).
func (t *Trainer) stopRequested() (bool, error) {
	all, err := gather(t, t.interrupted() != nil)
	if err != nil {
		return false, err
	}
	return slices.Contains(all, true), nil
}

// errInterrupted is returned when a signal stopped the run.
var errInterrupted = errors.New("interrupted")

// errStopWaiting is returned by a rollout source that stopped waiting for
// its input because a stop request arrived.
var errStopWaiting = errors.New("stopped waiting for rollouts")

// stopOnSignal checkpoints the last completed step (unless that was done
// already) and ends the run.
func (t *Trainer) stopOnSignal(sig os.Signal) error {
	saved := ""
	if t.cfg.Checkpointing.Enabled && t.step > 0 {
		if !t.savesAt(t.step) {
			var err error
			switch {
			case t.sharded(): // every rank writes its shard
				var p *checkpoint.Pending
				if p, err = t.prepareSharded(); err != nil {
					return fmt.Errorf("%s after step %d: checkpoint: %w", signalName(sig), t.step, err)
				}
				if p != nil {
					_, err = p.Publish()
				}
			case t.rank == 0:
				err = t.save()
			}
			if err = t.agree(err); err != nil {
				return fmt.Errorf("%s after step %d: checkpoint: %w", signalName(sig), t.step, err)
			}
		}
		saved = fmt.Sprintf("; checkpoint of step %d written, continue with --resume --out %s", t.step, t.out)
	} else if t.step == 0 {
		saved = fmt.Sprintf("; no step had completed, --resume --out %s starts at step 0", t.out)
	} else {
		saved = "; checkpointing is disabled, so the run cannot be resumed"
	}
	err := fmt.Errorf("%w by %s after step %d%s", errInterrupted, signalName(sig), t.step, saved)
	if t.comm.Size() > 1 {
		// Every rank learned of the stop at the same exchange and returns
		// here: none waits for another, so none must abort the others.
		return &agreedError{err: err}
	}
	return err
}

func signalName(sig os.Signal) string {
	switch sig {
	case nil:
		return "a stop request on another rank"
	case syscall.SIGTERM:
		return "SIGTERM"
	case os.Interrupt:
		return "SIGINT"
	}
	if s, ok := sig.(syscall.Signal); ok && s == sigUSR1 {
		return "SIGUSR1"
	}
	return sig.String()
}
