//go:build !cgo

package cuda

import (
	"errors"
	"testing"
)

// TestStubSaysNotBuilt: a CGO_ENABLED=0 binary reports that CUDA is not built in.
func TestStubSaysNotBuilt(t *testing.T) {
	if _, err := Open(Options{}); !errors.Is(err, ErrNotBuilt) {
		t.Errorf("Open = %v, want ErrNotBuilt", err)
	}
	if _, err := Probe(Options{}); !errors.Is(err, ErrNotBuilt) {
		t.Errorf("Probe = %v, want ErrNotBuilt", err)
	}
}
