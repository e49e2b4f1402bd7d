package main

import (
	"fmt"
	"io"

	"github.com/tracegrpo/tracegrpo/kernels"
	"github.com/tracegrpo/tracegrpo/kernels/cpu"
	"github.com/tracegrpo/tracegrpo/kernels/cuda"
)

// openBackend opens the compute backend named by --backend, on CUDA device
// number device (a rank's local rank). auto picks CUDA when the driver loads
// and the device exists, else the CPU, and says which it picked and why.
func openBackend(name string, threads, device int, log io.Writer) (kernels.Backend, error) {
	switch name {
	case "cpu":
		b, err := newCPU(threads)
		if err != nil {
			return nil, err
		}
		fmt.Fprintf(log, "train: backend cpu (%d threads), %s\n", b.Threads(), cpu.SIMDChoice())
		return b, nil
	case "cuda":
		b, err := cuda.Open(cuda.Options{Device: device})
		if err != nil {
			return nil, fmt.Errorf("--backend cuda: device %d: %w", device, err)
		}
		fmt.Fprintf(log, "train: backend cuda (device %d)\n", device)
		return b, nil
	case "auto":
		b, err := cuda.Open(cuda.Options{Device: device})
		if err == nil {
			fmt.Fprintf(log, "train: backend auto: cuda device %d (a driver and the device were found)\n", device)
			return b, nil
		}
		c, cerr := newCPU(threads)
		if cerr != nil {
			return nil, cerr
		}
		fmt.Fprintf(log, "train: backend auto: cpu (%d threads, %s), because CUDA is unavailable: %v\n", c.Threads(), cpu.SIMDChoice(), err)
		return c, nil
	}
	return nil, fmt.Errorf("%w: --backend %q: want auto, cpu or cuda", errUsage, name)
}

// newCPU opens the CPU backend, refusing a TRACEGRPO_CPU_SIMD it cannot
// honour (a usage error: the environment asked for it).
func newCPU(threads int) (*cpu.Backend, error) {
	if err := cpu.SIMDChoice().Err; err != nil {
		return nil, fmt.Errorf("%w: %w", errUsage, err)
	}
	return cpu.New(threads), nil
}

// closeBackend closes a backend that has a Close method.
func closeBackend(b kernels.Backend) {
	switch c := b.(type) {
	case interface{ Close() error }:
		c.Close()
	case interface{ Close() }:
		c.Close()
	}
}
