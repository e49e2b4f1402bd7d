//go:build cgo

package cuda

import (
	"fmt"
	"math/rand/v2"
	"os"
	"strconv"
	"strings"
	"testing"

	"github.com/tracegrpo/tracegrpo/kernels"
	"github.com/tracegrpo/tracegrpo/kernels/kerneltest"
)

// TestConformanceEmu runs the conformance suite on the CPU emulator of the
// driver and cuBLAS: the real backend and the real kernel sources, compiled
// for the CPU. LogitsScratch is small so TokenLogprob works in several
// vocabulary chunks, DecodeSplit so AttentionDecode combines several
// splits, and maxBlocks so that every grid-stride kernel's blocks loop over
// several rows (a barrier missing between two rows shows only then).
//
// It runs once per emulator schedule seed (emuSeeds: the block, warp and
// lane orders and so which interleavings a missing barrier exposes), each
// on a backend of its own, as subtest seed=N; make test runs three. The
// first seed runs the reduced suite, the others its schedule subset.
func TestConformanceEmu(t *testing.T) {
	seeds, err := emuSeeds()
	if err != nil {
		t.Fatal(err)
	}
	for i, seed := range seeds {
		t.Run(fmt.Sprintf("seed=%d", seed), func(t *testing.T) {
			t.Setenv(emuSeedEnv, strconv.FormatUint(seed, 10))
			// The first seed runs the reduced suite, the others its
			// schedule subset (kerneltest.Options.Schedule): every case, the
			// slow three on fewer shapes, so that three seeds cost about
			// two runs, not three.
			opt := kerneltest.Options{Reduced: true, Schedule: i > 0}
			replay := fmt.Sprintf("%s=%d", emuSeedsEnv, seed)
			if opt.Schedule {
				replay = fmt.Sprintf("%s=\"1 %d\"", emuSeedsEnv, seed)
			}
			t.Logf("emulator schedule seed %d (schedule subset: %v); replay with %s go test ./kernels/cuda -run '^TestConformanceEmu$'", seed, opt.Schedule, replay)
			b := emuBackend(t, Options{LogitsScratch: 37 * 64, DecodeSplit: 32, maxBlocks: 3})
			kerneltest.RunOptions(t, func() kernels.Backend { return noClose{b} }, opt)
		})
	}
}

// The emulator's schedule seeds: the fake driver reads $TRACEGRPO_EMU_SEED
// when the backend opens (testdata/emu/fakecuda.cpp's cuInit; default 1);
// TestConformanceEmu runs under every seed of $TRACEGRPO_EMU_SEEDS.
const (
	emuSeedEnv  = "TRACEGRPO_EMU_SEED"
	emuSeedsEnv = "TRACEGRPO_EMU_SEEDS"
)

// emuSeeds parses $TRACEGRPO_EMU_SEEDS, decimal seeds separated by spaces
// or commas, where "random" draws a fresh one (its number is in the
// subtest's name, so a failure can be replayed). Unset, it is the one seed
// $TRACEGRPO_EMU_SEED, else 1.
func emuSeeds() ([]uint64, error) {
	list := os.Getenv(emuSeedsEnv)
	if strings.TrimSpace(list) == "" {
		list = os.Getenv(emuSeedEnv)
		if list == "" {
			list = "1"
		}
	}
	var seeds []uint64
	for _, f := range strings.FieldsFunc(list, func(r rune) bool { return r == ',' || r == ' ' }) {
		if f == "random" {
			seeds = append(seeds, uint64(rand.Uint32()))
			continue
		}
		s, err := strconv.ParseUint(f, 10, 64)
		if err != nil {
			return nil, fmt.Errorf("$%s=%q: %q is neither a decimal seed nor \"random\"", emuSeedsEnv, list, f)
		}
		seeds = append(seeds, s)
	}
	return seeds, nil
}

// noClose keeps kerneltest from closing a backend emuBackend closes.
type noClose struct{ *Backend }

func (noClose) Close() error { return nil }

// TestConformanceGPU runs the conformance suite on CUDA device 0 against the
// CPU, every shape (with TRACEGRPO_CONFORMANCE_REDUCED=1 the emulator's
// reduced set: compute-sanitizer's runs and gpu-check's dry run). It skips
// when no driver or device is present (CI), and fails when
// TRACEGRPO_REQUIRE_GPU=1 (scripts/gpu-check.sh) and none is.
func TestConformanceGPU(t *testing.T) {
	b, err := OpenBackend(Options{Matmul: MatmulFP32, LogitsScratch: 37 * 64, DecodeSplit: 32})
	if err != nil {
		if os.Getenv("TRACEGRPO_REQUIRE_GPU") == "1" {
			t.Fatalf("no CUDA device: %v", err)
		}
		t.Skipf("no CUDA device: %v", err)
	}
	t.Logf("device: %s", b.Info())
	opt := kerneltest.Options{Reduced: os.Getenv("TRACEGRPO_CONFORMANCE_REDUCED") == "1"}
	kerneltest.RunOptions(t, func() kernels.Backend { return noClose{b} }, opt)
	t.Log(b.ModulesLine()) // under gpu-check's sanitizer (TRACEGRPO_CUDA_LOAD=lazy): the files the cases loaded
	if err := b.Close(); err != nil {
		t.Error(err)
	}
}
