//go:build cgo

package cuda

// EmuBackend opens the backend on the CPU emulator for the external tests.
var EmuBackend = emuBackend

// EmuNCCL is the emulator's one-rank NCCL library (built with the emulator).
func EmuNCCL() string {
	buildEmu()
	return emu.nccl
}

// EmuLibs builds the emulator's libraries (stand-in libcuda, cuBLAS and
// NCCL) and returns their paths; skip says why they cannot be built.
func EmuLibs() (driver, blas, nccl, skip string, err error) {
	driver, blas, skip, err = buildEmu()
	return driver, blas, emu.nccl, skip, err
}

// SkipNoEmu skips (or fails under TRACEGRPO_REQUIRE_EMU=1) a test that
// needs the emulator.
var SkipNoEmu = skipNoEmu
