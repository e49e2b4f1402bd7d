//go:build !unix

package bench

import "time"

// processCPU is not read on this system: --profile shows wall time alone.
func processCPU() (time.Duration, bool) { return 0, false }
