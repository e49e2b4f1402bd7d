//go:build cgo

package cuda_test

import (
	"bytes"
	"fmt"
	"math"
	"math/rand/v2"
	"os"
	"os/exec"
	"path/filepath"
	"strings"
	"testing"

	"github.com/tracegrpo/tracegrpo/collective"
	"github.com/tracegrpo/tracegrpo/collective/mpi"
	"github.com/tracegrpo/tracegrpo/kernels"
	"github.com/tracegrpo/tracegrpo/kernels/cpu"
	"github.com/tracegrpo/tracegrpo/kernels/cuda"
	"github.com/tracegrpo/tracegrpo/model"
	"github.com/tracegrpo/tracegrpo/trainer"
)

// Fully sharded data parallel on the CUDA backend with NCCL, on the
// emulator: the fake NCCL (testdata/emu/fakenccl.cpp) runs a world of
// several processes through shared memory, so mpirun starts the ranks (one
// emulated device each) and NCCL does the gathers and reduce-scatters. The
// fake NCCL ignores streams, so this tests the binding, the sharded math
// and the plan, not overlap: that needs a GPU.

// Environment of the ranks: the emulator's libraries, built once by the
// parent test.
const (
	shardChildEnv  = "TRACEGRPO_SHARD_NCCL_CHILD"
	emuDriverEnv   = "TRACEGRPO_TEST_EMU_DRIVER"
	emuBlasEnv     = "TRACEGRPO_TEST_EMU_BLAS"
	emuNCCLEnv     = "TRACEGRPO_TEST_EMU_NCCL"
	shardChildTemp = "TRACEGRPO_TEST_SHARD_OUT"
)

// shardGradTol bounds a sharded gradient against one whole model's on the
// same emulated device: the ranks' gradients are summed over the ranks (in
// rank order) and then over micro-batches, where one model accumulates
// every micro-batch in its kernels: a reassociated float32 sum of a few
// terms, ~1e-7 relative of gradients of size ≲ 1.
var shardGradTol = struct{ atol, rtol float64 }{1e-6, 1e-5}

// TestShardedNCCLEmu: on 2 emulated ranks over the fake NCCL, a sharded
// model (its collectives through NCCL's async path, on a stream of its
// own and joined by events) computes exactly the log-probabilities one
// whole model computes on the same device, its shard gradients are the
// whole model's summed over both ranks' micro-batches (one of them empty),
// and its memory plan equals the device bytes the model holds; with
// TRACEGRPO_LONG=1 a sharded train step's plan equals the bytes the backend
// held through the step too.
func TestShardedNCCLEmu(t *testing.T) {
	if os.Getenv(shardChildEnv) != "" {
		t.Skip("in an mpirun child")
	}
	drv, blas, nccl, skip, err := cuda.EmuLibs()
	if skip != "" {
		cuda.SkipNoEmu(t, skip)
	}
	if err != nil {
		t.Fatal(err)
	}
	path, err := exec.LookPath("mpirun")
	if err != nil {
		if os.Getenv("TRACEGRPO_REQUIRE_MPI") == "1" {
			t.Fatal("TRACEGRPO_REQUIRE_MPI=1 but there is no mpirun on PATH")
		}
		t.Skip("NOT RUN: no mpirun on PATH (Debian package openmpi-bin)")
	}
	cmd := exec.Command(path, "-np", "2", "--allow-run-as-root", "--oversubscribe", "--mca", "btl_vader_single_copy_mechanism", "none",
		os.Args[0], "-test.run=^TestShardedNCCLRankEmu$", "-test.v", "-test.count=1")
	cmd.Env = append(os.Environ(), shardChildEnv+"=1", emuDriverEnv+"="+drv, emuBlasEnv+"="+blas, emuNCCLEnv+"="+nccl,
		shardChildTemp+"="+t.TempDir())
	out, err := cmd.CombinedOutput()
	if err != nil {
		t.Fatalf("mpirun: %v\n%s", err, out)
	}
	if n := bytes.Count(out, []byte("--- PASS: TestShardedNCCLRankEmu")); n != 2 {
		t.Fatalf("%d of 2 ranks passed:\n%s", n, out)
	}
	for _, l := range strings.Split(string(out), "\n") {
		if strings.Contains(l, "shard_test.go") {
			t.Log(strings.TrimSpace(l))
		}
	}
}

// TestShardedNCCLRankEmu is one rank's side of TestShardedNCCLEmu.
func TestShardedNCCLRankEmu(t *testing.T) {
	if os.Getenv(shardChildEnv) == "" {
		t.Skip("runs under mpirun (TestShardedNCCLEmu)")
	}
	be, err := cuda.OpenBackend(cuda.Options{DriverLib: os.Getenv(emuDriverEnv), BlasLib: os.Getenv(emuBlasEnv)})
	if err != nil {
		t.Fatal(err)
	}
	defer be.Close()
	host := cpu.New(1)
	defer host.Close()
	mc, err := mpi.Open(host, "")
	if err != nil {
		t.Fatal(err)
	}
	defer mc.Close()
	rank, world := mc.Rank(), mc.Size()
	comm, err := cuda.OpenNCCL(be, cuda.NCCLOptions{Lib: os.Getenv(emuNCCLEnv), Rank: rank, Size: world,
		ShareID: func(id []byte) ([]byte, error) { return shareBytes(host, mc, id) }})
	if err != nil {
		t.Fatal(err)
	}
	defer comm.Close()
	if _, ok := comm.(collective.Overlapper); !ok {
		t.Fatal("the NCCL communicator does not overlap (collective.Overlapper)")
	}
	cfg, err := model.LoadConfig("../../model/testdata/qwen2_untied/config.json")
	if err != nil {
		t.Fatal(err)
	}
	opt := model.Options{MaxTokens: 24, MaxSeqs: 6}
	// Both ranks' micro-batches, the same on every rank: rank 1's second
	// is empty.
	r := rand.New(rand.NewPCG(3, 5))
	type mb struct {
		tokens, cu []int32
		dlp        []float32
	}
	mbs := make([][]mb, world)
	for rk := range world {
		for i := range 2 {
			if rk == 1 && i == 1 {
				mbs[rk] = append(mbs[rk], mb{cu: []int32{0}})
				continue
			}
			n := 9 + r.IntN(12)
			x := mb{tokens: make([]int32, n), cu: []int32{0, int32(n / 2), int32(n)}, dlp: make([]float32, n)}
			for j := range x.tokens {
				x.tokens[j] = int32(r.IntN(cfg.VocabSize))
				x.dlp[j] = float32(r.NormFloat64()) / 8
			}
			mbs[rk] = append(mbs[rk], x)
		}
	}
	whole, err := model.New(be, cfg, opt)
	if err != nil {
		t.Fatal(err)
	}
	whole.InitRandom(7)
	var wantLP [][]float32
	for rk := range world {
		for _, x := range mbs[rk] {
			lp, _, err := whole.Forward(x.tokens, x.cu, 1)
			if err != nil {
				t.Fatal(err)
			}
			if rk == rank {
				wantLP = append(wantLP, append([]float32(nil), lp...))
			}
			if err := whole.Backward(x.dlp); err != nil {
				t.Fatal(err)
			}
		}
	}
	tab := whole.Table()
	wantG := make([]float32, tab.Total)
	be.DownloadF32(wantG, whole.Grads())
	if err := be.Sync(); err != nil {
		t.Fatal(err)
	}
	whole.Close()
	live0, _ := be.Allocated()
	m, err := model.NewSharded(be, cfg, opt, model.ShardOptions{Comm: comm, ReshardAfterForward: true})
	if err != nil {
		t.Fatal(err)
	}
	live1, _ := be.Allocated()
	plan, err := model.PlanSharded(cfg, opt, world, true)
	if err != nil {
		t.Fatal(err)
	}
	if live1-live0 != plan.Total() {
		t.Errorf("the sharded model holds %d device bytes, its plan says %d", live1-live0, plan.Total())
	}
	m.InitRandom(7)
	for i, x := range mbs[rank] {
		lp, _, err := m.Forward(x.tokens, x.cu, 1)
		if err != nil {
			t.Fatal(err)
		}
		for j := range lp {
			if lp[j] != wantLP[i][j] {
				t.Fatalf("micro-batch %d: logprob[%d] = %g, the whole model's %g", i, j, lp[j], wantLP[i][j])
			}
		}
		if err := m.Backward(x.dlp); err != nil {
			t.Fatal(err)
		}
	}
	grads := make([]float32, m.Grads().N)
	be.DownloadF32(grads, m.Grads())
	if err := be.Sync(); err != nil {
		t.Fatal(err)
	}
	worst := 0.0
	for i, p := range tab.Params {
		lo, hi, at := m.Owned(i)
		for k := lo; k < hi; k++ {
			got, want := float64(grads[at+k-lo]), float64(wantG[p.Offset+k])
			d := math.Abs(got - want)
			if d > shardGradTol.atol+shardGradTol.rtol*math.Abs(want) || math.IsNaN(got) {
				t.Fatalf("gradient of %s[%d] = %g, the whole model's summed over the ranks %g", p.Name, k, got, want)
			}
			worst = max(worst, d)
		}
	}
	st := m.CommStats()
	t.Logf("rank %d: sharded gradients within %.3g of the whole model's; %d gathers (%d bytes) and %d reduce-scatters (%d bytes) through NCCL",
		rank, worst, st.Gathers, st.GatherBytes, st.ReduceScatters, st.ReduceScatterBytes)
	m.Close()

	// One sharded train step of the built-in job on a fresh backend: its
	// plan is the most the backend held through it, and what it holds.
	// About a minute on the emulator: TRACEGRPO_LONG=1 runs it (the
	// sharded plan of one rank is TestTrainPlanEqualsAllocatedEmu's).
	if os.Getenv(longEnv) != "1" {
		t.Logf("rank %d: the sharded train step on %d ranks runs with %s=1", rank, world, longEnv)
		return
	}
	be2, err := cuda.OpenBackend(cuda.Options{DriverLib: os.Getenv(emuDriverEnv), BlasLib: os.Getenv(emuBlasEnv)})
	if err != nil {
		t.Fatal(err)
	}
	defer be2.Close()
	opened, _ := be2.Allocated() // the backend's own fixed scratch: in the plan's workspace
	comm2, err := cuda.OpenNCCL(be2, cuda.NCCLOptions{Lib: os.Getenv(emuNCCLEnv), Rank: rank, Size: world,
		ShareID: func(id []byte) ([]byte, error) { return shareBytes(host, mc, id) }})
	if err != nil {
		t.Fatal(err)
	}
	defer comm2.Close()
	liveT0, _ := be2.Allocated()
	liveT0 -= opened // NCCL's barrier word: not the run's
	out := filepath.Join(os.Getenv(shardChildTemp), "run")
	tr, err := trainer.New(trainer.Options{Backend: be2, Comm: comm2, Out: out, Steps: 1, Quiet: true, Shard: trainer.ShardFull,
		Sets: []string{"grpo.num_prompts_per_step=2", "grpo.num_generations_per_prompt=2", "checkpointing.enabled=false"}})
	if err != nil {
		t.Fatal(err)
	}
	defer tr.Close()
	if err := tr.Run(); err != nil {
		t.Fatal(err)
	}
	p, err := tr.Plan()
	if err != nil {
		t.Fatal(err)
	}
	live, peak := be2.Allocated()
	if peak-liveT0 != p.TotalBytes || live-liveT0 != p.TotalBytes {
		t.Errorf("sharded train step: plan %d bytes, the backend held %d at most and %d at the end", p.TotalBytes, peak-liveT0, live-liveT0)
		for _, c := range p.Components {
			t.Logf("  %-18s %d", c.Name, c.Bytes)
		}
	}
	t.Logf("rank %d: sharded train step on %d ranks: plan %d bytes, held %d", rank, world, p.TotalBytes, live-liveT0)
}

// shareBytes broadcasts rank 0's bytes over MPI.
func shareBytes(host *cpu.Backend, c collective.Comm, b []byte) ([]byte, error) {
	all, err := collective.GatherBytes(c, host, b)
	if err != nil {
		return nil, err
	}
	if len(all[0]) != len(b) {
		return nil, fmt.Errorf("rank 0 sent %d bytes", len(all[0]))
	}
	return all[0], nil
}

var _ kernels.Backend = (*cuda.Backend)(nil)
