//go:build cgo

package cuda

// EmuBackend opens the backend on the CPU emulator for the external tests.
var EmuBackend = emuBackend

// EmuNCCL is the emulator's one-rank NCCL library (built with the emulator).
func EmuNCCL() string {
	buildEmu()
	return emu.nccl
}
