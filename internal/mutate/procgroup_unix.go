//go:build unix

package mutate

import (
	"os/exec"
	"syscall"
)

// ownProcessGroup starts cmd in a process group of its own, which a
// cancellation kills whole (go test, its test binary, and what that
// started: g++, mpirun, a trainer).
func ownProcessGroup(cmd *exec.Cmd) {
	cmd.SysProcAttr = &syscall.SysProcAttr{Setpgid: true}
	cmd.Cancel = func() error { return syscall.Kill(-cmd.Process.Pid, syscall.SIGKILL) }
}
