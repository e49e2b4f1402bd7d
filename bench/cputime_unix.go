//go:build unix

package bench

import (
	"syscall"
	"time"
)

// processCPU is the CPU time this process's threads have used (user and
// system, all threads), or false where it cannot be read.
func processCPU() (time.Duration, bool) {
	var ru syscall.Rusage
	if err := syscall.Getrusage(syscall.RUSAGE_SELF, &ru); err != nil {
		return 0, false
	}
	return time.Duration(ru.Utime.Nano() + ru.Stime.Nano()), true
}
