// Package scripts holds the tests of the repository's shell scripts that
// CI can run without their targets: scripts/gpu-check.sh's transfer-size
// guard, its stage selection and its lease plan, on stand-in binaries (the
// real run needs a GPU; make gpu-check-dry runs it on the emulator).
package scripts
