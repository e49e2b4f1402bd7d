//go:build !cgo

// Package mpi runs dist's collectives over Open MPI; this binary was built
// without cgo, so Open reports that MPI is not built in.
package mpi

import (
	"fmt"

	"github.com/tracegrpo/tracegrpo/collective"
	"github.com/tracegrpo/tracegrpo/kernels/cpu"
)

// DefaultLib is the library Open loads when $TRACEGRPO_MPI_LIB is unset.
const DefaultLib = "libmpi.so.40"

// Open reports that MPI is not built in.
func Open(*cpu.Backend, string) (collective.Comm, error) {
	return nil, fmt.Errorf("mpi: %w; rebuild with cgo for --dist mpi", collective.ErrNotBuilt)
}
