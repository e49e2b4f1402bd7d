//go:build !unix

package trainer

// lockFile is the run directory's lock file name (unused without flock).
const lockFile = ".lock"

// lockDir is a no-op where flock is not available.
func lockDir(string) (func(), error) { return func() {}, nil }
