//go:build unix

package inputfile

import (
	"os"
	"syscall"
)

// OpenNoBlock opens path for reading without blocking: opening a FIFO with
// no writer returns at once instead of hanging. (On a regular file
// O_NONBLOCK changes nothing.) Callers check what they opened.
func OpenNoBlock(path string) (*os.File, error) {
	return os.OpenFile(path, os.O_RDONLY|syscall.O_NONBLOCK, 0)
}
