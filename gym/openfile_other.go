//go:build !unix

package gym

import "os"

// openNoBlock opens a file for reading. Off unix there are no FIFOs to
// block on; the caller has already checked that the path is a regular file.
func openNoBlock(path string) (*os.File, error) {
	return os.Open(path)
}
