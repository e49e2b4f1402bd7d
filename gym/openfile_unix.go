//go:build unix

package gym

import (
	"os"
	"syscall"
)

// openNoBlock opens a file for reading without blocking: opening a FIFO
// with no writer returns at once instead of hanging.
func openNoBlock(path string) (*os.File, error) {
	return os.OpenFile(path, os.O_RDONLY|syscall.O_NONBLOCK, 0)
}
