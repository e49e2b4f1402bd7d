package collective

import (
	"bytes"
	"errors"
	"fmt"
	"math"
	"math/rand/v2"
	"strings"
	"sync"
	"testing"
	"time"

	"github.com/tracegrpo/tracegrpo/kernels"
	"github.com/tracegrpo/tracegrpo/kernels/cpu"
)

// TestBlock: the blocks of every (n, size) partition [0, n) in rank order,
// and their sizes differ by at most one.
func TestBlock(t *testing.T) {
	for n := 0; n <= 40; n++ {
		for size := 1; size <= 9; size++ {
			next, small, big := 0, n, 0
			for r := 0; r < size; r++ {
				lo, hi := Block(n, r, size)
				if lo != next || hi < lo {
					t.Fatalf("Block(%d, %d, %d) = [%d, %d), want to start at %d", n, r, size, lo, hi, next)
				}
				next = hi
				small, big = min(small, hi-lo), max(big, hi-lo)
			}
			if next != n || big-small > 1 {
				t.Fatalf("n=%d size=%d: blocks end at %d, sizes %d..%d", n, size, next, small, big)
			}
		}
	}
}

func env(kv ...string) func(string) string {
	m := map[string]string{}
	for i := 0; i < len(kv); i += 2 {
		m[kv[i]] = kv[i+1]
	}
	return func(k string) string { return m[k] }
}

func TestDetectLaunch(t *testing.T) {
	for _, c := range []struct {
		name string
		env  func(string) string
		want Launch
		err  string
	}{
		{"none", env(), Launch{Size: 1}, ""},
		{"torchrun", env("RANK", "3", "WORLD_SIZE", "4", "LOCAL_RANK", "1", "MASTER_ADDR", "node0", "MASTER_PORT", "29500"),
			Launch{Rank: 3, Size: 4, LocalRank: 1, Launchers: []string{"torchrun"}, MasterAddr: "node0", MasterPort: 29500}, ""},
		{"slurm", env("SLURM_PROCID", "5", "SLURM_NTASKS", "8", "SLURM_LOCALID", "1"),
			Launch{Rank: 5, Size: 8, LocalRank: 1, Launchers: []string{"slurm"}}, ""},
		{"mpirun", env("OMPI_COMM_WORLD_RANK", "1", "OMPI_COMM_WORLD_SIZE", "2", "OMPI_COMM_WORLD_LOCAL_RANK", "1"),
			Launch{Rank: 1, Size: 2, LocalRank: 1, Launchers: []string{"mpirun"}}, ""},
		{"slurm and mpirun agree", env("SLURM_PROCID", "1", "SLURM_NTASKS", "2", "SLURM_LOCALID", "0",
			"OMPI_COMM_WORLD_RANK", "1", "OMPI_COMM_WORLD_SIZE", "2", "OMPI_COMM_WORLD_LOCAL_RANK", "0"),
			Launch{Rank: 1, Size: 2, Launchers: []string{"slurm", "mpirun"}}, ""},
		{"rank conflict", env("RANK", "0", "WORLD_SIZE", "2", "OMPI_COMM_WORLD_RANK", "1", "OMPI_COMM_WORLD_SIZE", "2"),
			Launch{}, "RANK=0 (torchrun) but OMPI_COMM_WORLD_RANK=1 (mpirun)"},
		{"size conflict", env("RANK", "0", "WORLD_SIZE", "2", "OMPI_COMM_WORLD_RANK", "0", "OMPI_COMM_WORLD_SIZE", "4"),
			Launch{}, "WORLD_SIZE=2 (torchrun) but OMPI_COMM_WORLD_SIZE=4 (mpirun)"},
		// Inside a Slurm allocation (issue 26, item 16): mpirun or torchrun
		// started there sets the ranks' numbers; Slurm's describe the batch
		// step or the srun that started the launcher, and are not compared.
		{"mpirun in a slurm allocation", env("SLURM_PROCID", "0", "SLURM_NTASKS", "8", "SLURM_LOCALID", "0",
			"OMPI_COMM_WORLD_RANK", "1", "OMPI_COMM_WORLD_SIZE", "2", "OMPI_COMM_WORLD_LOCAL_RANK", "1"),
			Launch{Rank: 1, Size: 2, LocalRank: 1, Launchers: []string{"slurm", "mpirun"}}, ""},
		{"torchrun under srun", env("SLURM_PROCID", "1", "SLURM_NTASKS", "2", "SLURM_LOCALID", "0",
			"RANK", "9", "WORLD_SIZE", "16", "LOCAL_RANK", "1"),
			Launch{Rank: 9, Size: 16, LocalRank: 1, Launchers: []string{"torchrun", "slurm"}}, ""},
		{"salloc shell", env("SLURM_NTASKS", "8", "SLURM_JOB_ID", "7"), Launch{Size: 1}, ""},
		{"mpirun's numbers inconsistent", env("SLURM_PROCID", "0", "SLURM_NTASKS", "2", "OMPI_COMM_WORLD_RANK", "2", "OMPI_COMM_WORLD_SIZE", "2"),
			Launch{}, "OMPI_COMM_WORLD_RANK=2 with OMPI_COMM_WORLD_SIZE=2"},
		{"not a number", env("RANK", "one", "WORLD_SIZE", "2"), Launch{}, `RANK="one"`},
		{"rank out of range", env("RANK", "2", "WORLD_SIZE", "2"), Launch{}, "RANK=2 with WORLD_SIZE=2"},
		{"size missing", env("RANK", "0"), Launch{}, `WORLD_SIZE=""`},
		{"bad port", env("MASTER_PORT", "70000"), Launch{}, "MASTER_PORT=70000"},
	} {
		got, err := DetectLaunch(c.env)
		if c.err != "" {
			if err == nil || !strings.Contains(err.Error(), c.err) {
				t.Errorf("%s: %v, want an error containing %q", c.name, err, c.err)
			}
			continue
		}
		if err != nil {
			t.Errorf("%s: %v", c.name, err)
			continue
		}
		if fmt.Sprint(got) != fmt.Sprint(c.want) || got.MasterAddr != c.want.MasterAddr || got.MasterPort != c.want.MasterPort {
			t.Errorf("%s: %+v, want %+v", c.name, got, c.want)
		}
	}
}

func TestChoose(t *testing.T) {
	one, two := Launch{Size: 1}, Launch{Size: 2, Launchers: []string{"torchrun"}}
	for _, c := range []struct {
		mode    string
		l       Launch
		backend string
		want    string
		err     bool
	}{
		{ModeAuto, one, "cpu", ModeNone, false},
		{ModeAuto, one, "cuda", ModeNone, false},
		{ModeAuto, two, "cpu", ModeMPI, false},
		{ModeAuto, two, "cuda", ModeNCCL, false},
		{ModeNone, one, "cpu", ModeNone, false},
		{ModeNone, two, "cpu", "", true},
		{ModeMPI, one, "cpu", ModeMPI, false},
		{ModeMPI, two, "cuda", ModeMPI, false},
		{ModeNCCL, two, "cpu", "", true},
		{ModeNCCL, two, "cuda", ModeNCCL, false},
		{"gloo", two, "cpu", "", true},
	} {
		got, err := Choose(c.mode, c.l, c.backend)
		if (err != nil) != c.err || got != c.want {
			t.Errorf("Choose(%s, size %d, %s) = %q, %v; want %q (error %v)", c.mode, c.l.Size, c.backend, got, err, c.want, c.err)
		}
	}
}

// TestForMode (issue 26, item 16): --dist none inside a Slurm allocation
// (a batch script sees SLURM_PROCID=0 and SLURM_NTASKS) runs one process,
// saying which variables it ignored; srun's other tasks, and processes
// that mpirun or torchrun started, are still refused with --dist none.
func TestForMode(t *testing.T) {
	slurm := Launch{Rank: 0, Size: 8, Launchers: []string{"slurm"}}
	for _, c := range []struct {
		name, mode string
		l          Launch
		want       Launch
		note, err  string
	}{
		{"one process", ModeNone, Launch{Size: 1}, Launch{Size: 1}, "", ""},
		{"batch script, --dist none", ModeNone, slurm, Launch{Size: 1}, "SLURM_NTASKS=8", ""},
		{"batch script, --dist auto", ModeAuto, slurm, slurm, "", ""},
		{"srun task 3, --dist none", ModeNone, Launch{Rank: 3, Size: 8, Launchers: []string{"slurm"}}, Launch{}, "", "task 3 of 8"},
		{"mpirun, --dist none", ModeNone, Launch{Rank: 0, Size: 2, Launchers: []string{"slurm", "mpirun"}}, Launch{}, "", "mpirun"},
	} {
		got, note, err := c.l.ForMode(c.mode)
		switch {
		case c.err != "" && (err == nil || !strings.Contains(err.Error(), c.err)):
			t.Errorf("%s: %v, want an error containing %q", c.name, err, c.err)
		case c.err == "" && err != nil:
			t.Errorf("%s: %v", c.name, err)
		case c.err == "" && (fmt.Sprint(got) != fmt.Sprint(c.want) || !strings.Contains(note, c.note) || (c.note == "") != (note == "")):
			t.Errorf("%s: %+v, note %q; want %+v, a note containing %q", c.name, got, note, c.want, c.note)
		}
	}
}

func TestNCCLCommID(t *testing.T) {
	for _, c := range []struct {
		l    Launch
		env  func(string) string
		want string
	}{
		{Launch{MasterAddr: "10.0.0.1", MasterPort: 29500}, env(), "10.0.0.1:29501"},
		{Launch{MasterAddr: "node0"}, env(), "node0:29501"},
		{Launch{MasterAddr: "fe80::1", MasterPort: 1234}, env(), "[fe80::1]:1235"},
		{Launch{MasterAddr: "h", MasterPort: 65535}, env(), "h:65534"},
		{Launch{MasterAddr: "h", MasterPort: 1}, env("NCCL_COMM_ID", "x:9"), "x:9"},
		{Launch{}, env(), ""},
	} {
		got, err := NCCLCommID(c.l, c.env)
		if err != nil || got != c.want {
			t.Errorf("NCCLCommID(%+v) = %q, %v; want %q", c.l, got, err, c.want)
		}
		if got != "" && c.l.MasterPort != 0 && got == fmt.Sprintf("%s:%d", c.l.MasterAddr, c.l.MasterPort) {
			t.Errorf("NCCL's bootstrap would take MASTER_PORT: %s", got)
		}
	}
}

// runRanks runs f on n in-process ranks over CPU backends and returns the
// first error.
func runRanks(t *testing.T, n int, f func(c Comm, b kernels.Backend) error) {
	t.Helper()
	mems := make([]kernels.Backend, n)
	for i := range mems {
		b := cpu.New(1)
		t.Cleanup(b.Close)
		mems[i] = b
	}
	comms := Local(mems)
	var wg sync.WaitGroup
	errs := make([]error, n)
	for r := 0; r < n; r++ {
		wg.Add(1)
		go func() {
			defer wg.Done()
			errs[r] = f(comms[r], mems[r])
		}()
	}
	wg.Wait()
	for r, err := range errs {
		if err != nil {
			t.Fatalf("rank %d: %v", r, err)
		}
	}
}

// TestGatherBytes: every rank gets every rank's bytes, whatever their
// lengths (0, not multiples of 4); with one rank, no collective runs.
func TestGatherBytes(t *testing.T) {
	for _, n := range []int{1, 2, 3, 5} {
		payload := func(r int) []byte {
			b := make([]byte, (r*7)%11)
			for i := range b {
				b[i] = byte(r*31 + i)
			}
			return b
		}
		var mu sync.Mutex
		got := map[int][][]byte{}
		runRanks(t, n, func(c Comm, b kernels.Backend) error {
			comm := c
			if n == 1 {
				comm = Single(b)
			}
			all, err := GatherBytes(comm, b, payload(c.Rank()))
			mu.Lock()
			got[c.Rank()] = all
			mu.Unlock()
			return err
		})
		for r := 0; r < n; r++ {
			if len(got[r]) != n {
				t.Fatalf("n=%d rank %d: %d payloads", n, r, len(got[r]))
			}
			for s := 0; s < n; s++ {
				if !bytes.Equal(got[r][s], payload(s)) {
					t.Fatalf("n=%d rank %d: payload of rank %d is %v, want %v", n, r, s, got[r][s], payload(s))
				}
			}
		}
	}
}

// TestLocalCollectives checks the in-process ranks' collectives against
// their definitions on random data.
func TestLocalCollectives(t *testing.T) {
	const n, per = 3, 7
	data := make([][]float32, n)
	rng := rand.New(rand.NewPCG(1, 2))
	for r := range data {
		data[r] = make([]float32, n*per)
		for i := range data[r] {
			data[r][i] = float32(rng.NormFloat64())
		}
	}
	results := make([][][]float32, n)
	runRanks(t, n, func(c Comm, b kernels.Backend) error {
		r := c.Rank()
		full, _ := b.Alloc(kernels.F32, n*per)
		part, _ := b.Alloc(kernels.F32, per)
		b.UploadF32(full, data[r])
		if err := c.AllReduceSum(full); err != nil {
			return err
		}
		sum := make([]float32, n*per)
		b.DownloadF32(sum, full)
		b.UploadF32(full, data[r])
		if err := c.ReduceScatterSum(part, full); err != nil {
			return err
		}
		rs := make([]float32, per)
		b.DownloadF32(rs, part)
		b.UploadF32(part, data[r][:per])
		if err := c.AllGather(full, part); err != nil {
			return err
		}
		ag := make([]float32, n*per)
		b.DownloadF32(ag, full)
		b.UploadF32(part, data[r][:per])
		if err := c.Broadcast(part, 2); err != nil {
			return err
		}
		bc := make([]float32, per)
		b.DownloadF32(bc, part)
		if err := c.Barrier(); err != nil {
			return err
		}
		results[r] = [][]float32{sum, rs, ag, bc}
		return b.Sync()
	})
	for r := 0; r < n; r++ {
		sum, rs, ag, bc := results[r][0], results[r][1], results[r][2], results[r][3]
		for i := 0; i < n*per; i++ {
			var want float32
			for s := 0; s < n; s++ {
				want += data[s][i]
			}
			if sum[i] != want {
				t.Fatalf("rank %d: all-reduce [%d] = %v, want %v", r, i, sum[i], want)
			}
			if ag[i] != data[i/per][i%per] {
				t.Fatalf("rank %d: all-gather [%d] = %v, want %v", r, i, ag[i], data[i/per][i%per])
			}
		}
		for i := 0; i < per; i++ {
			if rs[i] != sum[r*per+i] || bc[i] != data[2][i] {
				t.Fatalf("rank %d: reduce-scatter or broadcast [%d] wrong", r, i)
			}
		}
	}
}

// TestLocalRankTimeout (issue 34): with a rank timeout, a collective that
// one rank never reaches fails on every rank that waits, with
// ErrRankTimeout naming the silent rank, and so does every later one; a
// rank that comes late but within the timeout is waited for.
func TestLocalRankTimeout(t *testing.T) {
	runRanks(t, 3, func(c Comm, _ kernels.Backend) error {
		c.(Deadliner).SetTimeout(1500 * time.Millisecond)
		r := c.Rank()
		if r == 1 {
			time.Sleep(100 * time.Millisecond) // late, within the timeout
		}
		if err := c.Barrier(); err != nil {
			return fmt.Errorf("first barrier: %w", err)
		}
		if r == 1 {
			return nil // goes silent
		}
		err := c.Barrier()
		switch {
		case err == nil:
			return fmt.Errorf("a barrier rank 1 never reached returned")
		case !errors.Is(err, ErrRankTimeout) || !strings.Contains(err.Error(), "rank 1 is silent"):
			return fmt.Errorf("second barrier: %v; want ErrRankTimeout naming rank 1", err)
		}
		if err := c.Barrier(); !errors.Is(err, ErrRankTimeout) {
			return fmt.Errorf("a barrier after the timeout: %v", err)
		}
		return nil
	})
}

// TestSingleCopies: the one-process communicator's AllGather and
// ReduceScatterSum copy src into dst bit for bit for every dtype a model
// hands them (issue 35: a sharded bf16 model on one rank gathers its
// layers' bf16 shards, and Single refused them: "dist: copy of bf16"), and
// refuse a dtype mismatch by naming both.
func TestSingleCopies(t *testing.T) {
	b := cpu.New(1)
	defer b.Close()
	c := Single(b)
	rng := rand.New(rand.NewPCG(3, 9))
	const n = 13
	for _, dt := range []kernels.DType{kernels.F32, kernels.BF16, kernels.I32} {
		for _, op := range []struct {
			name string
			f    func(dst, src kernels.Buf) error
		}{{"AllGather", c.AllGather}, {"ReduceScatterSum", c.ReduceScatterSum}} {
			src, _ := b.Alloc(dt, n)
			dst, _ := b.Alloc(dt, n)
			other, _ := b.Alloc(kernels.F32, n)
			want := make([]uint32, n)
			for i := range want {
				want[i] = rng.Uint32() & 0x3f7fffff // finite as f32, any bits as i32 and bf16 (the low 16)
			}
			setBits(b, src, want)
			if err := op.f(dst, src); err != nil {
				t.Fatalf("%s of %d × %s: %v", op.name, n, dt, err)
			}
			got := bits(b, dst)
			for i := range got {
				if got[i] != bits(b, src)[i] {
					t.Fatalf("%s of %d × %s: dst[%d] = %#x, src's %#x", op.name, n, dt, i, got[i], bits(b, src)[i])
				}
			}
			if dt != kernels.F32 {
				if err := op.f(other, src); err == nil || !strings.Contains(err.Error(), dt.String()) {
					t.Errorf("%s of %s into f32: error %v, want one naming %s", op.name, dt, err, dt)
				}
			}
			b.Free(src)
			b.Free(dst)
			b.Free(other)
		}
	}
}

// bits are x's elements on the CPU backend as bit patterns; setBits writes
// them (a bf16 element takes the low 16 bits).
func bits(b *cpu.Backend, x kernels.Buf) []uint32 {
	out := make([]uint32, x.N)
	switch x.DType {
	case kernels.F32:
		for i, v := range b.F32(x) {
			out[i] = math.Float32bits(v)
		}
	case kernels.BF16:
		for i, v := range b.BF16(x) {
			out[i] = uint32(v)
		}
	case kernels.I32:
		for i, v := range b.I32(x) {
			out[i] = uint32(v)
		}
	}
	return out
}

func setBits(b *cpu.Backend, x kernels.Buf, v []uint32) {
	switch x.DType {
	case kernels.F32:
		for i := range b.F32(x) {
			b.F32(x)[i] = math.Float32frombits(v[i])
		}
	case kernels.BF16:
		for i := range b.BF16(x) {
			b.BF16(x)[i] = uint16(v[i])
		}
	case kernels.I32:
		for i := range b.I32(x) {
			b.I32(x)[i] = int32(v[i])
		}
	}
}
