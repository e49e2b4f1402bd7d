//go:build cgo

package mpi

import (
	"bytes"
	"encoding/binary"
	"fmt"
	"hash/fnv"
	"math"
	"math/rand/v2"
	"os"
	"os/exec"
	"strings"
	"syscall"
	"testing"
	"time"

	"github.com/tracegrpo/tracegrpo/collective"
	"github.com/tracegrpo/tracegrpo/internal/meminfo"
	"github.com/tracegrpo/tracegrpo/internal/testtool"
	"github.com/tracegrpo/tracegrpo/kernels"
	"github.com/tracegrpo/tracegrpo/kernels/cpu"
)

// mpirunArgs are the flags every test launch uses: root is allowed (CI
// runs as root), more ranks than cores are allowed (CI has 2), and the
// shared-memory transport copies through a buffer (containers often forbid
// the cross-process reads of its default).
var mpirunArgs = []string{"--allow-run-as-root", "--oversubscribe", "--mca", "btl_vader_single_copy_mechanism", "none"}

// Mpirun returns the mpirun command for n ranks of argv, or skips (fails
// when $TRACEGRPO_REQUIRE_MPI=1, as make test sets) without Open MPI.
func Mpirun(t testing.TB, n int, argv ...string) *exec.Cmd {
	t.Helper()
	path := testtool.Path(t, "mpirun", "TRACEGRPO_REQUIRE_MPI")
	args := append(append([]string{"-np", fmt.Sprint(n)}, mpirunArgs...), argv...)
	return exec.Command(path, args...)
}

// TestOpenErrors: a missing library, or one that is not Open MPI, is
// refused naming the path and what is wrong, without touching MPI.
func TestOpenErrors(t *testing.T) {
	b := cpu.New(1)
	defer b.Close()
	for _, c := range []struct{ lib, want string }{
		{"/nonexistent/libmpi.so.40", "openmpi-bin"},
		{"libm.so.6", "no symbol MPI_Initialized"},
	} {
		if err := load(c.lib); err == nil || !strings.Contains(err.Error(), c.lib) || !strings.Contains(err.Error(), c.want) {
			t.Errorf("load(%s) = %v; want the path and %q", c.lib, err, c.want)
		}
	}
}

// TestCollectivesUnderMpirun runs TestRankCollectives in 3 ranks.
func TestCollectivesUnderMpirun(t *testing.T) { passUnderMpirun(t, 3, "TestRankCollectives") }

// passUnderMpirun runs the test named test (one rank's side) in n ranks
// under mpirun, and fails unless every rank passes it.
func passUnderMpirun(t *testing.T, n int, test string) {
	t.Helper()
	if os.Getenv("TRACEGRPO_MPI_CHILD") != "" {
		t.Skip("in an mpirun child")
	}
	cmd := Mpirun(t, n, os.Args[0], "-test.run=^"+test+"$", "-test.v", "-test.count=1")
	cmd.Env = append(os.Environ(), "TRACEGRPO_MPI_CHILD=1")
	out, err := cmd.CombinedOutput()
	if err != nil {
		t.Fatalf("mpirun: %v\n%s", err, out)
	}
	if got := bytes.Count(out, []byte("--- PASS: "+test)); got != n {
		t.Fatalf("%d of %d ranks passed:\n%s", got, n, out)
	}
}

// rankData is rank r's deterministic input, which every rank can compute.
func rankData(r, n int) []float32 {
	rng := rand.New(rand.NewPCG(uint64(r), 11))
	v := make([]float32, n)
	for i := range v {
		v[i] = float32(rng.NormFloat64())
	}
	return v
}

// TestRankCollectives is one rank's side of TestCollectivesUnderMpirun: it
// checks every collective against its definition, and that all ranks hold
// the same bits after an all-reduce.
func TestRankCollectives(t *testing.T) {
	if os.Getenv("TRACEGRPO_MPI_CHILD") == "" {
		t.Skip("runs under mpirun (TestCollectivesUnderMpirun)")
	}
	b := cpu.New(1)
	defer b.Close()
	c, err := Open(b, "")
	if err != nil {
		t.Fatal(err)
	}
	defer c.Close()
	n, r := c.Size(), c.Rank()
	const per = 100003 // large enough for Open MPI's segmented algorithms
	data := make([][]float32, n)
	for s := range data {
		data[s] = rankData(s, n*per)
	}
	alloc := func(dt kernels.DType, k int) kernels.Buf {
		x, err := b.Alloc(dt, k)
		if err != nil {
			t.Fatal(err)
		}
		return x
	}
	full := alloc(kernels.F32, n*per)
	b.UploadF32(full, data[r])
	if err := c.AllReduceSum(full); err != nil {
		t.Fatal(err)
	}
	sum := make([]float32, n*per)
	b.DownloadF32(sum, full)
	var maxErr float64
	for i := range sum {
		var want float64
		for s := 0; s < n; s++ {
			want += float64(data[s][i])
		}
		maxErr = math.Max(maxErr, math.Abs(float64(sum[i])-want))
	}
	if maxErr > 1e-5 {
		t.Fatalf("all-reduce differs from the float64 sum by %g", maxErr)
	}
	// Every rank holds the same bits: all-gather a hash of the result.
	h := fnv.New64a()
	binary.Write(h, binary.LittleEndian, sum)
	hashes, err := collective.GatherBytes(c, b, h.Sum(nil))
	if err != nil {
		t.Fatal(err)
	}
	for s := range hashes {
		if !bytes.Equal(hashes[s], hashes[0]) {
			t.Fatalf("rank %d's all-reduce result differs from rank 0's", s)
		}
	}
	part := alloc(kernels.F32, per)
	b.UploadF32(full, data[r])
	if err := c.ReduceScatterSum(part, full); err != nil {
		t.Fatal(err)
	}
	rs := make([]float32, per)
	b.DownloadF32(rs, part)
	for i := range rs {
		var want float32
		for s := 0; s < n; s++ {
			want += data[s][r*per+i]
		}
		if math.Abs(float64(rs[i]-want)) > 1e-5 {
			t.Fatalf("reduce-scatter [%d] = %v, want %v", i, rs[i], want)
		}
	}
	ints := alloc(kernels.I32, 3)
	gathered := alloc(kernels.I32, 3*n)
	b.UploadI32(ints, []int32{int32(r), int32(10 * r), -1})
	if err := c.AllGather(gathered, ints); err != nil {
		t.Fatal(err)
	}
	g := make([]int32, 3*n)
	b.DownloadI32(g, gathered)
	for s := 0; s < n; s++ {
		if g[3*s] != int32(s) || g[3*s+1] != int32(10*s) || g[3*s+2] != -1 {
			t.Fatalf("all-gather: %v", g)
		}
	}
	// A large fp32 all-gather (a sharded layer's weights) is exact and
	// needs no memory beyond its two buffers: Open MPI's own algorithm for
	// three ranks (Bruck's) has every rank but 0 allocate a temporary of
	// the gathered size, which no memory plan counts.
	const big = 2 << 20 // 8 MiB a rank
	bigSrc, bigDst := alloc(kernels.F32, big), alloc(kernels.F32, big*n)
	for i := range b.F32(bigSrc) {
		b.F32(bigSrc)[i] = float32(r*big + i)
	}
	clear(b.F32(bigDst)) // touched: its pages are in the RSS before the gather
	_, peak0, ok := meminfo.Self()
	if err := c.AllGather(bigDst, bigSrc); err != nil {
		t.Fatal(err)
	}
	_, peak1, _ := meminfo.Self()
	for i, x := range b.F32(bigDst) {
		if x != float32(i) {
			t.Fatalf("fp32 all-gather [%d] = %v, want %d", i, x, i)
		}
	}
	if grew := peak1 - peak0; ok && grew > int64(4*big*n)/4 {
		t.Errorf("rank %d: the all-gather of %d MiB raised the peak RSS by %d MiB: memory beyond its buffers", r, 4*big*n>>20, grew>>20)
	}
	// A large fp32 all-reduce (a whole model's gradients, unsharded data
	// parallel): its ring moves blocks of several pieces, and it needs no
	// memory beyond the buffer and the comm's piece of scratch.
	const huge = 3<<20 + 7 // 12 MiB; blocks of 1M+2 and 1M+3 floats, four pieces each
	hugeBuf := alloc(kernels.F32, huge)
	hv := b.F32(hugeBuf)
	for i := range hv {
		hv[i] = float32(i%1000) + float32(r)/4
	}
	_, peak0, ok = meminfo.Self()
	if err := c.AllReduceSum(hugeBuf); err != nil {
		t.Fatal(err)
	}
	_, peak1, _ = meminfo.Self()
	for i, x := range hv {
		want := float32(n*(i%1000)) + float32(n*(n-1))/8 // exact in float32
		if x != want {
			t.Fatalf("all-reduce of %d floats [%d] = %v, want %v", huge, i, x, want)
		}
	}
	if grew := peak1 - peak0; ok && grew > 4*huge/4 {
		t.Errorf("rank %d: the all-reduce of %d MiB raised the peak RSS by %d MiB: memory beyond its buffer", r, 4*huge>>20, grew>>20)
	}
	// bf16 is gathered as bytes (the sharded model's weights).
	h16, g16 := alloc(kernels.BF16, 5), alloc(kernels.BF16, 5*n)
	for i := range b.BF16(h16) {
		b.BF16(h16)[i] = uint16(1000*r + i)
	}
	if err := c.AllGather(g16, h16); err != nil {
		t.Fatal(err)
	}
	for i, x := range b.BF16(g16) {
		if want := uint16(1000*(i/5) + i%5); x != want {
			t.Fatalf("bf16 all-gather [%d] = %d, want %d", i, x, want)
		}
	}
	if err := c.ReduceScatterSum(alloc(kernels.BF16, 1), alloc(kernels.BF16, n)); err == nil {
		t.Fatal("a bf16 reduce-scatter was accepted: sums are F32 or I32")
	}
	b.UploadI32(ints, []int32{int32(r), 7, 7})
	if err := c.Broadcast(ints, n-1); err != nil {
		t.Fatal(err)
	}
	bc := make([]int32, 3)
	b.DownloadI32(bc, ints)
	if bc[0] != int32(n-1) {
		t.Fatalf("broadcast from rank %d gave %v", n-1, bc)
	}
	if err := c.Barrier(); err != nil {
		t.Fatal(err)
	}
}

// TestAllReduceRingSizesUnderMpirun (issue 33, item 4) runs
// TestRankAllReduceRingSizes in 2, 3 and 4 ranks: the fp32 all-reduce ring
// on sizes the ranks do not divide into equal blocks, around the piece
// size (collective.HostAllReduceChunk) and the block boundaries.
func TestAllReduceRingSizesUnderMpirun(t *testing.T) {
	if os.Getenv("TRACEGRPO_MPI_CHILD") != "" {
		t.Skip("in an mpirun child")
	}
	for _, np := range []int{2, 3, 4} {
		t.Run(fmt.Sprint(np, " ranks"), func(t *testing.T) { passUnderMpirun(t, np, "TestRankAllReduceRingSizes") })
	}
}

// ringSizes are the all-reduce lengths worth trying on size ranks: a few
// elements (fewer than the ranks, so some blocks are empty), and every
// length within a few elements of size·k·chunk, where blocks hold one
// element more or less than k whole pieces, for k of 1 and 2.
func ringSizes(size int) []int {
	const chunk = collective.HostAllReduceChunk
	out := []int{1, 2, 3, 5, 7, size - 1, size + 1, 3*chunk + 2}
	for _, k := range []int{1, 2} {
		for d := -size - 1; d <= size+2; d++ {
			out = append(out, size*k*chunk+d)
		}
	}
	return out
}

// TestRankAllReduceRingSizes is one rank's side of
// TestAllReduceRingSizesUnderMpirun: for every length of ringSizes, every
// element of the all-reduce is the exact sum of the ranks' values (small
// integers, whose float32 sums are exact in any order, and distinct along
// the buffer, so a piece moved to the wrong place or dropped shows), the
// same on every rank, and nothing past the buffer is written.
func TestRankAllReduceRingSizes(t *testing.T) {
	if os.Getenv("TRACEGRPO_MPI_CHILD") == "" {
		t.Skip("runs under mpirun (TestAllReduceRingSizesUnderMpirun)")
	}
	b := cpu.New(1)
	defer b.Close()
	c, err := Open(b, "")
	if err != nil {
		t.Fatal(err)
	}
	defer c.Close()
	n, r := c.Size(), c.Rank()
	val := func(rank, i int) float32 { return float32((i*7+rank*131)%1021 - 510) }
	const guard = 3 // elements past the buffer, which must stay as they are
	for _, size := range ringSizes(n) {
		if size < 1 {
			continue
		}
		whole, err := b.Alloc(kernels.F32, size+guard)
		if err != nil {
			t.Fatal(err)
		}
		buf := whole.Slice(0, size)
		hv := b.F32(whole)
		for i := range hv {
			hv[i] = val(r, i)
		}
		if err := c.AllReduceSum(buf); err != nil {
			t.Fatal(err)
		}
		bad, first, firstWant := 0, -1, float32(0)
		for i := range size {
			var want float32
			for s := 0; s < n; s++ {
				want += val(s, i)
			}
			if hv[i] != want {
				if bad++; first < 0 {
					first, firstWant = i, want
				}
			}
		}
		if bad > 0 {
			t.Fatalf("%d ranks, %d floats: %d elements are not the sum of the ranks', the first [%d] = %v, want %v",
				n, size, bad, first, hv[first], firstWant)
		}
		for i := size; i < size+guard; i++ {
			if hv[i] != val(r, i) {
				t.Fatalf("%d ranks, %d floats: element %d past the buffer was written (%v)", n, size, i, hv[i])
			}
		}
		h := fnv.New64a()
		binary.Write(h, binary.LittleEndian, hv[:size])
		hashes, err := collective.GatherBytes(c, b, h.Sum(nil))
		if err != nil {
			t.Fatal(err)
		}
		for s := range hashes {
			if !bytes.Equal(hashes[s], hashes[0]) {
				t.Fatalf("%d floats: rank %d's result differs from rank 0's", size, s)
			}
		}
		b.Free(whole)
	}
}

// TestRankTimeoutUnderMpirun (issue 34) runs TestRankGoesSilent in 3
// ranks: rank 1 stops itself with SIGSTOP, as a hung or stopped process
// would, after a barrier that it reached late but within the timeout. The
// other ranks' next collective gives up after the timeout, the roll call
// names rank 1, and the rank that says so first ends the job (MPI_Abort):
// mpirun exits with an error instead of waiting forever.
func TestRankTimeoutUnderMpirun(t *testing.T) {
	if os.Getenv("TRACEGRPO_MPI_CHILD") != "" {
		t.Skip("in an mpirun child")
	}
	cmd := Mpirun(t, 3, os.Args[0], "-test.run=^TestRankGoesSilent$", "-test.v", "-test.count=1")
	cmd.Env = append(os.Environ(), "TRACEGRPO_MPI_CHILD=1")
	var out bytes.Buffer
	cmd.Stdout, cmd.Stderr = &out, &out
	if err := cmd.Start(); err != nil {
		t.Fatal(err)
	}
	done := make(chan error, 1)
	go func() { done <- cmd.Wait() }()
	select {
	case err := <-done:
		if err == nil {
			t.Fatalf("mpirun succeeded with a rank stopped:\n%s", out.String())
		}
	case <-time.After(2 * time.Minute):
		cmd.Process.Kill()
		<-done
		t.Fatalf("mpirun still waiting 2 minutes after a rank stopped (timeout 2s):\n%s", out.String())
	}
	got := out.String()
	t.Logf("mpirun's output:\n%s", got)
	checkSilent(t, got, "rank-timeout: ", "rank 1 is silent")

	if strings.Count(got, "late barrier passed") != 3 {
		t.Fatalf("the barrier that rank 1 reached late did not pass on all 3 ranks:\n%s", got)
	}
}

// checkSilent fails unless some line of out that starts with prefix names
// silent ("rank 1 is silent"), and every such line names it or says that
// every rank answered after all (Open MPI continues a stopped rank before
// it kills it, so a roll call taken while another rank ends the job may
// find it answering): never another set of ranks.
func checkSilent(t *testing.T, out, prefix, silent string) {
	t.Helper()
	named := 0
	for _, l := range strings.Split(out, "\n") {
		if _, rest, ok := strings.Cut(l, prefix); ok {
			switch {
			case strings.Contains(rest, silent+":"):
				named++
			case !strings.Contains(rest, "then every rank answered"):
				t.Errorf("a rank named other ranks than %q: %s", silent, l)
			}
		}
	}
	if named == 0 {
		t.Errorf("no rank said %q:\n%s", silent, out)
	}
}

// TestRankGoesSilent is one rank's side of TestRankTimeoutUnderMpirun:
// rank 2 enters the collective after the silent one 1.5 s later than rank
// 0, so that rank 0's roll call finds it waiting, before its own timeout,
// and it must answer from its wait.
func TestRankGoesSilent(t *testing.T) {
	if os.Getenv("TRACEGRPO_MPI_CHILD") == "" {
		t.Skip("runs under mpirun (TestRankTimeoutUnderMpirun)")
	}
	b := cpu.New(1)
	defer b.Close()
	c, err := Open(b, "")
	if err != nil {
		t.Fatal(err)
	}
	c.(collective.Deadliner).SetTimeout(2 * time.Second)
	r := c.Rank()
	if r == 1 {
		time.Sleep(500 * time.Millisecond)
	}
	if err := c.Barrier(); err != nil {
		t.Fatal(err)
	}
	fmt.Println("late barrier passed")
	if r == 1 {
		syscall.Kill(os.Getpid(), syscall.SIGSTOP)
	}
	if r == 2 {
		time.Sleep(1500 * time.Millisecond)
	}
	// Blocks of 1 MiB, past every transport's eager limit: rank 0's first
	// send, to the stopped rank, cannot complete, so its first wait starts
	// 1.5 s before rank 2's and its roll call finds rank 2 waiting.
	buf, _ := b.Alloc(kernels.F32, 3<<18)
	err = c.AllReduceSum(buf)
	fmt.Printf("rank-timeout: rank %d: %v\n", r, err)
	os.Stdout.Sync()
	c.Abort(3)
}
