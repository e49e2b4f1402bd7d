package kernels

// Numerics is implemented by a backend whose rounding depends on a choice
// made for the machine it runs on (kernels/cpu's SIMD path). A training run
// records both names in its checkpoints; a run resumed where the rounding
// path differs keeps working and says so, naming both.
type Numerics interface {
	// RoundingPath names how the backend's results round: two backends
	// with the same rounding path give bit-identical results (for a given
	// thread count).
	RoundingPath() string
	// KernelPath says which kernels run, on what hardware, and why they
	// were chosen.
	KernelPath() string
}
