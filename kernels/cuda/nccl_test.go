//go:build cgo

package cuda

import (
	"fmt"
	"os"
	"path/filepath"
	"strings"
	"testing"

	"github.com/google/go-cmp/cmp"
	"github.com/tracegrpo/tracegrpo/kernels"
	"github.com/tracegrpo/tracegrpo/kernels/kerneltest"
)

// TestNCCLNotFound: without the library, or with another one, OpenNCCL
// says what it tried and what is missing; nothing needs NCCL otherwise.
func TestNCCLNotFound(t *testing.T) {
	b := emuBackend(t, Options{})
	dir := t.TempDir()
	t.Setenv("TRACEGRPO_CUDA_LIBS", dir)
	t.Setenv("LD_LIBRARY_PATH", "")
	t.Setenv("TRACEGRPO_NCCL_LIB", "")
	t.Setenv("VIRTUAL_ENV", dir)
	if _, err := OpenNCCL(b, NCCLOptions{Rank: 0, Size: 1, CommID: "127.0.0.1:1"}); err == nil {
		t.Log("a libnccl.so.2 is installed on this machine's default path")
	} else if !strings.Contains(err.Error(), dir+" ($TRACEGRPO_CUDA_LIBS)") || !strings.Contains(err.Error(), "nvidia-nccl") {
		t.Errorf("no NCCL: %v; want the paths tried and the pip package named", err)
	}
	for _, c := range []struct{ lib, want string }{
		{"/nonexistent/libnccl.so.2", "/nonexistent/libnccl.so.2"},
		{"libm.so.6", "no symbol ncclGetVersion"},
	} {
		if _, err := OpenNCCL(b, NCCLOptions{Lib: c.lib, Size: 1, CommID: "h:1"}); err == nil || !strings.Contains(err.Error(), c.want) {
			t.Errorf("OpenNCCL(%s): %v, want %q", c.lib, err, c.want)
		}
	}
	if _, err := OpenNCCL(b, NCCLOptions{Rank: 2, Size: 2}); err == nil {
		t.Error("rank 2 of 2 accepted")
	}
}

// TestNCCLWorldOfOneEmu runs the binding against the emulator's one-rank
// NCCL: every collective is the identity or a copy of the right bytes, the
// unique id comes from NCCL_COMM_ID or from ShareID, and NCCL's errors name
// the call.
func TestNCCLWorldOfOneEmu(t *testing.T) {
	b := emuBackend(t, Options{})
	_, _, _, err := buildEmu()
	if err != nil {
		t.Fatal(err)
	}
	shared := 0
	for _, opt := range []NCCLOptions{
		{Lib: emu.nccl, Size: 1, CommID: "127.0.0.1:29501"},
		{Lib: emu.nccl, Size: 1, ShareID: func(id []byte) ([]byte, error) { shared++; return id, nil }},
	} {
		calls := filepath.Join(t.TempDir(), "calls")
		t.Setenv("FAKENCCL_LOG", calls)
		c, err := OpenNCCL(b, opt)
		if err != nil {
			t.Fatal(err)
		}
		if c.Rank() != 0 || c.Size() != 1 || c.Name() != "nccl" {
			t.Fatalf("rank %d of %d (%s)", c.Rank(), c.Size(), c.Name())
		}
		x, _ := b.Alloc(kernels.F32, 5)
		y, _ := b.Alloc(kernels.F32, 5)
		in := []float32{1, 2, 3, 4, 5}
		b.UploadF32(x, in)
		check := func(what string, buf kernels.Buf) {
			t.Helper()
			got := make([]float32, 5)
			b.DownloadF32(got, buf)
			if err := b.Sync(); err != nil {
				t.Fatal(err)
			}
			if msg := kerneltest.Compare(in, got, kerneltest.TolExact); msg != "" {
				t.Errorf("%s: %s", what, msg)
			}
		}
		if err := c.AllReduceSum(x); err != nil {
			t.Fatal(err)
		}
		check("all-reduce", x)
		for _, f := range []func() error{func() error { return c.ReduceScatterSum(y, x) }, func() error { return c.AllGather(y, x) }} {
			b.Fill(y, 0)
			if err := f(); err != nil {
				t.Fatal(err)
			}
			check("reduce-scatter/all-gather", y)
		}
		if err := c.Broadcast(x, 0); err != nil {
			t.Fatal(err)
		}
		if err := c.Broadcast(x, 1); err == nil {
			t.Error("broadcast from rank 1 of 1 accepted")
		}
		if err := c.Barrier(); err != nil {
			t.Fatal(err)
		}
		z, _ := b.Alloc(kernels.BF16, 3)
		if err := c.AllReduceSum(z); err != nil {
			t.Errorf("bf16 all-reduce: %v", err)
		}
		// Each collective covered the buffers asked for: the fake's copies
		// are identities in place, so only its log shows a wrong pointer,
		// count or type (NCCL's ncclFloat32 7, ncclInt32 2, ncclBfloat16 9).
		line := func(name string, s, d kernels.Buf, n, typ int) string {
			return fmt.Sprintf("%s %x %x %d %d", name, ptr(s), ptr(d), n, typ)
		}
		one := c.(*ncclComm).one
		want := []string{
			line("AllReduce", x, x, 5, 7),
			line("ReduceScatter", x, y, 5, 7),
			line("AllGather", x, y, 5, 7),
			line("Broadcast", x, x, 5, 7),
			line("AllReduce", one, one, 1, 2), // Barrier
			line("AllReduce", z, z, 3, 9),
		}
		log, err := os.ReadFile(calls)
		if err != nil {
			t.Fatal(err)
		}
		if d := cmp.Diff(want, strings.Split(strings.TrimSpace(string(log)), "\n")); d != "" {
			t.Errorf("the collectives NCCL was asked for (-want +got):\n%s", d)
		}
		b.Free(x)
		b.Free(y)
		b.Free(z)
		if err := c.Close(); err != nil {
			t.Fatal(err)
		}
		if err := c.AllReduceSum(x); err == nil || !strings.Contains(err.Error(), "after Close") {
			t.Errorf("a collective after Close: %v", err)
		}
	}
	if shared != 1 {
		t.Errorf("ShareID called %d times, want 1", shared)
	}
	// Rank 0 of two whose partner never comes fails in ncclCommInitRank
	// (the fake's bounded wait), named with NCCL's own message. The id is
	// this process's own: the fake's shared-memory segment is named by it,
	// and a test binary run at the same time on the machine (another
	// checkout's) must not be the partner.
	os.Unsetenv("NCCL_COMM_ID")
	t.Setenv("FAKENCCL_TIMEOUT_MS", "300")
	_, err = OpenNCCL(b, NCCLOptions{Lib: emu.nccl, Rank: 0, Size: 2, CommID: fmt.Sprintf("h:%d", os.Getpid())})
	if err == nil || !strings.Contains(err.Error(), "ncclCommInitRank (rank 0 of 2") || !strings.Contains(err.Error(), "waited 300 ms for the other ranks") {
		t.Errorf("two ranks on the fake NCCL, one missing: %v", err)
	}
}
