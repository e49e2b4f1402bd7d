//go:build unix

package trainer

import (
	"errors"
	"fmt"
	"os"
	"strconv"
	"strings"
	"syscall"
)

// lockFile is the run directory's lock: an exclusive flock held for the
// whole run. The kernel drops it when the process dies (SIGKILL included),
// so a crashed run never leaves a stale lock behind; the file itself stays
// and names the last holder.
const lockFile = ".lock"

// lockDir takes the run directory's lock, or names the process that holds
// it. release drops it.
func lockDir(path string) (release func(), err error) {
	f, err := os.OpenFile(path, os.O_RDWR|os.O_CREATE, 0o644)
	if err != nil {
		return nil, fmt.Errorf("run directory lock %s: %w", path, err)
	}
	if err := syscall.Flock(int(f.Fd()), syscall.LOCK_EX|syscall.LOCK_NB); err != nil {
		holder, _ := os.ReadFile(path)
		f.Close()
		if errors.Is(err, syscall.EWOULDBLOCK) {
			who := strings.TrimSpace(string(holder))
			if who == "" {
				who = "another process"
			}
			return nil, fmt.Errorf("%s is locked by another trainer (%s): two runs in one directory would interleave their metrics, captures and checkpoints; wait for it to end or choose another --out", path, who)
		}
		return nil, fmt.Errorf("run directory lock %s: %w", path, err)
	}
	host, _ := os.Hostname()
	f.Truncate(0)
	f.WriteAt([]byte("pid "+strconv.Itoa(os.Getpid())+" on "+host+"\n"), 0)
	return func() {
		syscall.Flock(int(f.Fd()), syscall.LOCK_UN)
		f.Close()
	}, nil
}
