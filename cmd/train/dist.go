package main

import (
	"fmt"
	"io"
	"os"
	"runtime"
	"time"

	"github.com/spf13/pflag"
	"github.com/tracegrpo/tracegrpo/collective"
	"github.com/tracegrpo/tracegrpo/collective/mpi"
	"github.com/tracegrpo/tracegrpo/kernels"
	"github.com/tracegrpo/tracegrpo/kernels/cpu"
	"github.com/tracegrpo/tracegrpo/kernels/cuda"
)

// launch is how this process was started: its place among the ranks and
// the collectives it uses.
type launch struct {
	collective.Launch
	mode string          // collective.ModeNone, ModeMPI or ModeNCCL
	comm collective.Comm // nil for one process
	note string          // what --dist none ignored ("" for nothing)
}

// detectLaunch reads the launcher's environment (torchrun, Slurm, mpirun)
// as --dist mode runs it: --dist none inside a Slurm allocation is one
// process.
func detectLaunch(mode string) (launch, error) {
	l, err := collective.DetectLaunch(os.Getenv)
	if err != nil {
		return launch{}, err
	}
	l, note, err := l.ForMode(mode)
	if err != nil {
		return launch{}, fmt.Errorf("%w: %v", errUsage, err)
	}
	return launch{Launch: l, note: note}, nil
}

// threadsPerRank divides the machine's cores among the ranks on it when
// --threads is 0 (all cores for one process).
func (l launch) threadsPerRank(threads int) int {
	if threads > 0 || l.Size == 1 {
		return threads
	}
	local := l.LocalSize
	if local == 0 {
		local = l.Size
	}
	return max(1, runtime.NumCPU()/local)
}

// defaultRankTimeout is --rank-timeout's default: far longer than any one
// collective waits in a healthy run (a rank saving a checkpoint, or
// reading its weights, while the others wait for it).
const defaultRankTimeout = 30 * time.Minute

// addRankTimeout registers --rank-timeout on a command that opens the
// collectives.
func addRankTimeout(fs *pflag.FlagSet) *time.Duration {
	return fs.Duration("rank-timeout", defaultRankTimeout, "with several ranks: how long a collective may wait for the others without progress before every rank stops, "+
		"naming the ranks that went silent (a stopped or hung process, a dead node); 0 waits forever. Enforced by --dist mpi, not by nccl (its collectives run on the device)")
}

// openComm opens the collectives of --dist mode on be (none for one
// process), checks that they agree with the launcher, and gives them the
// rank timeout (collective.Deadliner).
func (l *launch) openComm(mode string, be kernels.Backend, timeout time.Duration) error {
	if timeout < 0 {
		return fmt.Errorf("%w: --rank-timeout %v: want 0 (wait forever) or a positive duration", errUsage, timeout)
	}
	if err := l.openCollectives(mode, be); err != nil {
		return err
	}
	if d, ok := l.comm.(collective.Deadliner); ok {
		d.SetTimeout(timeout)
	}
	return nil
}

func (l *launch) openCollectives(mode string, be kernels.Backend) error {
	var err error
	if l.mode, err = collective.Choose(mode, l.Launch, be.Name()); err != nil {
		return fmt.Errorf("%w: %v", errUsage, err)
	}
	switch l.mode {
	case collective.ModeNone:
		return nil
	case collective.ModeMPI:
		cb, ok := be.(*cpu.Backend)
		if !ok {
			return fmt.Errorf("%w: --dist mpi runs on the cpu backend; on cuda use --dist nccl", errUsage)
		}
		if l.comm, err = mpi.Open(cb, ""); err != nil {
			return err
		}
	case collective.ModeNCCL:
		id, err := collective.NCCLCommID(l.Launch, os.Getenv)
		if err != nil {
			return err
		}
		opt := cuda.NCCLOptions{Rank: l.Rank, Size: l.Size, CommID: id}
		if id == "" {
			opt.ShareID = l.shareIDOverMPI
		}
		if l.comm, err = cuda.OpenNCCL(be, opt); err != nil {
			return err
		}
	}
	if l.comm.Rank() != l.Rank || l.comm.Size() != l.Size {
		hint := "launch a --dist mpi run with mpirun"
		if len(l.Launchers) == 1 && l.Launchers[0] == "slurm" {
			hint = "inside a Slurm allocation, start the ranks with mpirun or srun --mpi=pmix, or run one process with --dist none"
		}
		err := fmt.Errorf("dist: %s sees rank %d of %d, but the launcher (%s) says rank %d of %d: %s",
			l.comm.Name(), l.comm.Rank(), l.comm.Size(), l.Launch, l.Rank, l.Size, hint)
		l.comm.Close()
		l.comm = nil
		return err
	}
	return nil
}

// shareIDOverMPI broadcasts rank 0's NCCL id with MPI (under mpirun, when
// no MASTER_ADDR names NCCL's own bootstrap address).
func (l *launch) shareIDOverMPI(id []byte) ([]byte, error) {
	host := cpu.New(1)
	defer host.Close()
	c, err := mpi.Open(host, "")
	if err != nil {
		return nil, fmt.Errorf("no MASTER_ADDR or NCCL_COMM_ID for NCCL's bootstrap, and MPI is not available to share its id: %w", err)
	}
	defer c.Close()
	words := make([]int32, len(id)/4)
	for i := range words {
		words[i] = int32(uint32(id[4*i]) | uint32(id[4*i+1])<<8 | uint32(id[4*i+2])<<16 | uint32(id[4*i+3])<<24)
	}
	buf, err := host.Alloc(kernels.I32, len(words))
	if err != nil {
		return nil, err
	}
	host.UploadI32(buf, words)
	if err := c.Broadcast(buf, 0); err != nil {
		return nil, err
	}
	host.DownloadI32(words, buf)
	out := make([]byte, len(id))
	for i, w := range words {
		out[4*i], out[4*i+1], out[4*i+2], out[4*i+3] = byte(w), byte(w>>8), byte(w>>16), byte(w>>24)
	}
	return out, nil
}

// abort reports err, which only this rank knows of, and ends every rank
// (MPI_Abort ends the whole job at once; with NCCL the launcher ends the
// other ranks when this one exits).
func (l *launch) abort(err error, stderr io.Writer) {
	fmt.Fprintf(stderr, "train: rank %d: %v\ntrain: rank %d: aborting every rank\n", l.Rank, err, l.Rank)
	if l.comm != nil {
		l.comm.Abort(1)
	}
}

func (l *launch) close() {
	if l.comm != nil {
		l.comm.Close()
	}
}
