//go:build !unix

package inputfile

import "os"

// OpenNoBlock opens path for reading. Off unix there are no FIFOs to block
// on; callers check what they opened.
func OpenNoBlock(path string) (*os.File, error) {
	return os.Open(path)
}
