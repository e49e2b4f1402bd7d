//go:build cgo

package cuda

// EmuBackend opens the backend on the CPU emulator for the external tests.
var EmuBackend = emuBackend
