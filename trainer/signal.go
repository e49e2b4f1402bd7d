package trainer

import (
	"errors"
	"fmt"
	"os"
	"os/signal"
	"syscall"
)

// Schedulers pre-empt jobs with SIGTERM and a grace period; users press
// Ctrl-C. Either ends the run after the step in progress, with a checkpoint
// of that step (when checkpointing is enabled), so that --resume loses no
// work. A second signal kills the process at once, as usual.

// watchSignals starts catching SIGINT and SIGTERM for the trainer.
func (t *Trainer) watchSignals() {
	if t.o.Signals != nil {
		t.signals = t.o.Signals
		return
	}
	ch := make(chan os.Signal, 1)
	signal.Notify(ch, os.Interrupt, syscall.SIGTERM)
	t.signals = ch
	t.stopSignals = func() { signal.Stop(ch) }
}

// interrupted returns the signal that arrived since the last check, if any.
// After the first one the default handling is restored, so a second signal
// ends the process at once.
func (t *Trainer) interrupted() os.Signal {
	select {
	case sig := <-t.signals:
		if t.stopSignals != nil {
			t.stopSignals()
			t.stopSignals = nil
		}
		return sig
	default:
		return nil
	}
}

// errInterrupted is returned when a signal stopped the run.
var errInterrupted = errors.New("interrupted")

// stopOnSignal checkpoints the step just finished (unless that was done
// already) and ends the run.
func (t *Trainer) stopOnSignal(sig os.Signal) error {
	saved := ""
	if t.cfg.Checkpointing.Enabled {
		c := t.cfg.Checkpointing
		if c.SavePeriod <= 0 || t.step%c.SavePeriod != 0 {
			if err := t.save(); err != nil {
				return fmt.Errorf("%s after step %d: checkpoint: %w", signalName(sig), t.step, err)
			}
		}
		saved = fmt.Sprintf("; checkpoint of step %d written, continue with --resume --out %s", t.step, t.out)
	} else {
		saved = "; checkpointing is disabled, so the run cannot be resumed"
	}
	return fmt.Errorf("%w by %s after step %d%s", errInterrupted, signalName(sig), t.step, saved)
}

func signalName(sig os.Signal) string {
	switch sig {
	case syscall.SIGTERM:
		return "SIGTERM"
	case os.Interrupt:
		return "SIGINT"
	}
	return sig.String()
}
