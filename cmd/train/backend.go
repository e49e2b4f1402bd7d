package main

import (
	"fmt"
	"io"

	"github.com/tracegrpo/tracegrpo/kernels"
	"github.com/tracegrpo/tracegrpo/kernels/cpu"
	"github.com/tracegrpo/tracegrpo/kernels/cuda"
)

// openBackend opens the compute backend named by --backend. auto picks CUDA
// when the driver loads and a device exists, else the CPU, and says which it
// picked and why.
func openBackend(name string, threads int, log io.Writer) (kernels.Backend, error) {
	switch name {
	case "cpu":
		b := cpu.New(threads)
		fmt.Fprintf(log, "train: backend cpu (%d threads)\n", b.Threads())
		return b, nil
	case "cuda":
		b, err := cuda.Open(cuda.Options{})
		if err != nil {
			return nil, fmt.Errorf("--backend cuda: %w", err)
		}
		fmt.Fprintf(log, "train: backend cuda\n")
		return b, nil
	case "auto":
		b, err := cuda.Open(cuda.Options{})
		if err == nil {
			fmt.Fprintf(log, "train: backend auto: cuda (a driver and a device were found)\n")
			return b, nil
		}
		c := cpu.New(threads)
		fmt.Fprintf(log, "train: backend auto: cpu (%d threads), because CUDA is unavailable: %v\n", c.Threads(), err)
		return c, nil
	}
	return nil, fmt.Errorf("%w: --backend %q: want auto, cpu or cuda", errUsage, name)
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
