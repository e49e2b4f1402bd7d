//go:build !cgo

package cuda

import (
	"github.com/tracegrpo/tracegrpo/collective"
	"github.com/tracegrpo/tracegrpo/kernels"
)

// Open reports that this binary has no CUDA support (built with CGO_ENABLED=0).
func Open(Options) (kernels.Backend, error) { return nil, ErrNotBuilt }

// Probe reports that this binary has no CUDA support.
func Probe(Options) (string, error) { return "", ErrNotBuilt }

// Libraries reports that CUDA is not built in.
func Libraries(Options) []LibraryChoice { return []LibraryChoice{{Name: "CUDA", Err: ErrNotBuilt}} }

// OpenNCCL reports that CUDA is not built in.
func OpenNCCL(kernels.Backend, NCCLOptions) (collective.Comm, error) { return nil, ErrNotBuilt }

// OpenMeter reports that CUDA is not built in.
func OpenMeter(Options) (kernels.Backend, error) { return nil, ErrNotBuilt }
