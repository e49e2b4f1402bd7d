package collective

import (
	"fmt"
	"net"
	"os"
	"sort"
	"strconv"
	"strings"

	"github.com/tracegrpo/tracegrpo/internal/quote"
)

// Launch is what the launcher told this process: its rank, the world size,
// its rank on its node (the CUDA device it uses), and where rank 0 is.
type Launch struct {
	Rank, Size, LocalRank int
	// LocalSize is the number of ranks on this node (0: the launcher did
	// not say): torchrun's LOCAL_WORLD_SIZE, Open MPI's
	// OMPI_COMM_WORLD_LOCAL_SIZE, Slurm's SLURM_NTASKS_PER_NODE.
	LocalSize int
	// Launchers names the launchers whose variables were found
	// ("torchrun", "slurm", "mpirun"); none means a plain single process.
	Launchers []string
	// MasterAddr and MasterPort are torchrun's MASTER_ADDR and MASTER_PORT
	// ("" and 0 when unset).
	MasterAddr string
	MasterPort int
}

// launcherVars are the variables each launcher sets for rank, world size
// and local rank.
var launcherVars = []struct {
	name                             string
	rank, size, localRank, localSize string
}{
	{"torchrun", "RANK", "WORLD_SIZE", "LOCAL_RANK", "LOCAL_WORLD_SIZE"},
	{"slurm", "SLURM_PROCID", "SLURM_NTASKS", "SLURM_LOCALID", "SLURM_NTASKS_PER_NODE"},
	{"mpirun", "OMPI_COMM_WORLD_RANK", "OMPI_COMM_WORLD_SIZE", "OMPI_COMM_WORLD_LOCAL_RANK", "OMPI_COMM_WORLD_LOCAL_SIZE"},
}

// DetectLaunch reads the launch from getenv (os.Getenv in a process). Each
// launcher present must set its rank and world size as integers, in range,
// and numbers that can be: a local rank below the world size and below the
// ranks on its node, no more ranks on a node than in the world, and a
// MASTER_PORT that is a TCP port (an impossible launch is refused naming
// the variables, before any rank waits for another that cannot exist).
// torchrun and mpirun start the ranks themselves: when both are present
// they must agree on all three numbers (a disagreement is an error naming
// the variables). Inside a Slurm allocation their numbers win over
// Slurm's, which then describe the batch step or the srun task that
// started the launcher (one torchrun per node), not the ranks: Slurm's
// tasks per node are then not compared with them. Slurm's numbers are the
// ranks' only when srun started them directly; an allocation's shell
// (salloc), which has SLURM_NTASKS but no SLURM_PROCID, is one process.
func DetectLaunch(getenv func(string) string) (Launch, error) {
	l := Launch{Size: 1}
	type seen struct {
		name                             string
		rank, size, localRank, localSize int
		vars                             [3]string
		localSizeVar                     string
	}
	var found []seen
	for _, v := range launcherVars {
		rs, ss := getenv(v.rank), getenv(v.size)
		if rs == "" && (ss == "" || v.name == "slurm") {
			continue // none, or an allocation's shell (salloc): no task of srun's
		}
		s := seen{name: v.name, vars: [3]string{v.rank, v.size, v.localRank}, localSizeVar: v.localSize}
		var err error
		if s.rank, err = envInt(v.rank, rs); err != nil {
			return l, err
		}
		if s.size, err = envInt(v.size, ss); err != nil {
			return l, err
		}
		s.localRank = 0
		if lr := getenv(v.localRank); lr != "" {
			if s.localRank, err = envInt(v.localRank, lr); err != nil {
				return l, err
			}
		}
		if s.size < 1 || s.rank < 0 || s.rank >= s.size {
			return l, fmt.Errorf("dist: %s=%d with %s=%d: the rank must be in [0, world size)", v.rank, s.rank, v.size, s.size)
		}
		if s.localRank < 0 || s.localRank >= s.size {
			return l, fmt.Errorf("dist: %s=%d with %s=%d: the local rank must be in [0, world size)", v.localRank, s.localRank, v.size, s.size)
		}
		found = append(found, s)
	}
	// The ranks' numbers: those of torchrun and mpirun (which must agree),
	// else Slurm's.
	var starters []seen
	for _, f := range found {
		if f.name != "slurm" {
			starters = append(starters, f)
		}
	}
	if len(starters) == 0 {
		starters = found
	}
	// Each starter's ranks on a node: at least one, at most the world, and
	// more than its local rank.
	for i := range starters {
		f := &starters[i]
		ls := getenv(f.localSizeVar)
		if ls == "" {
			continue
		}
		n, err := envInt(f.localSizeVar, ls)
		if err != nil {
			return l, err
		}
		if n < 1 || n > f.size {
			return l, fmt.Errorf("dist: %s=%d with %s=%d: the ranks on a node must be in [1, world size]", f.localSizeVar, n, f.vars[1], f.size)
		}
		if f.localRank >= n {
			return l, fmt.Errorf("dist: %s=%d with %s=%d: the local rank must be below the ranks on its node", f.vars[2], f.localRank, f.localSizeVar, n)
		}
		f.localSize = n
	}
	for _, f := range starters[min(1, len(starters)):] {
		a := starters[0]
		for i, pair := range [][2]int{{a.rank, f.rank}, {a.size, f.size}, {a.localRank, f.localRank}} {
			if pair[0] != pair[1] {
				return l, fmt.Errorf("dist: the launchers disagree: %s=%d (%s) but %s=%d (%s); launch with one of them, or make them agree",
					a.vars[i], pair[0], a.name, f.vars[i], pair[1], f.name)
			}
		}
	}
	if len(starters) > 0 {
		l.Rank, l.Size, l.LocalRank = starters[0].rank, starters[0].size, starters[0].localRank
		for _, f := range starters {
			if f.localSize > 0 {
				l.LocalSize = f.localSize
				break
			}
		}
		for _, f := range found {
			l.Launchers = append(l.Launchers, f.name)
		}
	}
	l.MasterAddr = getenv("MASTER_ADDR")
	if p := getenv("MASTER_PORT"); p != "" {
		port, err := envInt("MASTER_PORT", p)
		if err != nil {
			return l, err
		}
		if port < 1 || port > 65535 {
			return l, fmt.Errorf("dist: MASTER_PORT=%d: not a TCP port (want 1 to 65535)", port)
		}
		l.MasterPort = port
	}
	return l, nil
}

func envInt(name, s string) (int, error) {
	v, err := strconv.Atoi(strings.TrimSpace(s))
	if err != nil {
		return 0, fmt.Errorf("dist: %s=%s: want an integer", name, quote.Cut(s))
	}
	return v, nil
}

func (l Launch) String() string {
	by := "no launcher"
	if len(l.Launchers) > 0 {
		by = strings.Join(l.Launchers, "+")
	}
	return fmt.Sprintf("rank %d of %d (local rank %d, %s)", l.Rank, l.Size, l.LocalRank, by)
}

// ForMode returns the launch a --dist mode runs as, and a note on what it
// ignored. --dist none inside a Slurm allocation is one process: a batch
// script, which Slurm gives SLURM_PROCID=0 and the job's SLURM_NTASKS,
// runs train alone that way. srun's other tasks (SLURM_PROCID > 0) would
// each train alone into the same run directory, and processes that mpirun
// or torchrun started are several by construction: both stay refused.
func (l Launch) ForMode(mode string) (Launch, string, error) {
	if mode != ModeNone || l.Size == 1 {
		return l, "", nil
	}
	if len(l.Launchers) != 1 || l.Launchers[0] != "slurm" {
		return l, "", fmt.Errorf("dist: --dist none, but %s started %d processes: each would train every rollout alone; use --dist auto, mpi or nccl", strings.Join(l.Launchers, "+"), l.Size)
	}
	if l.Rank != 0 {
		return l, "", fmt.Errorf("dist: --dist none in task %d of %d that srun started: each task would train alone into the same run directory; start one task (srun -n 1), or use --dist auto to train on all %d", l.Rank, l.Size, l.Size)
	}
	note := fmt.Sprintf("--dist none: one process; Slurm's SLURM_PROCID=0 and SLURM_NTASKS=%d describe the allocation, not ranks of this run", l.Size)
	return Launch{Size: 1, MasterAddr: l.MasterAddr, MasterPort: l.MasterPort}, note, nil
}

// Modes of --dist.
const (
	ModeAuto = "auto"
	ModeNone = "none"
	ModeMPI  = "mpi"
	ModeNCCL = "nccl"
)

// Choose resolves --dist for a launch and a backend ("cpu" or "cuda"): auto
// is none for one process, MPI on the CPU and NCCL on CUDA otherwise. none
// with several ranks is refused: every rank would train the whole step alone.
func Choose(mode string, l Launch, backend string) (string, error) {
	switch mode {
	case ModeAuto:
		switch {
		case l.Size == 1:
			return ModeNone, nil
		case backend == "cuda":
			return ModeNCCL, nil
		default:
			return ModeMPI, nil
		}
	case ModeNone:
		if l.Size > 1 {
			return "", fmt.Errorf("dist: --dist none, but %s started %d processes: each would train every rollout alone; use --dist auto, mpi or nccl", strings.Join(l.Launchers, "+"), l.Size)
		}
		return ModeNone, nil
	case ModeMPI:
		return ModeMPI, nil
	case ModeNCCL:
		if backend != "cuda" {
			return "", fmt.Errorf("dist: --dist nccl needs the cuda backend (found %s); on the CPU use --dist mpi", backend)
		}
		return ModeNCCL, nil
	}
	return "", fmt.Errorf("dist: --dist %q: want auto, none, mpi or nccl", mode)
}

// NCCLCommID returns the host:port NCCL's own bootstrap uses (its
// NCCL_COMM_ID): the environment's NCCL_COMM_ID when set, else MASTER_ADDR
// and MASTER_PORT+1 (torchrun's rendezvous already listens on MASTER_PORT),
// else "" (the caller then needs another way to share NCCL's id).
func NCCLCommID(l Launch, getenv func(string) string) (string, error) {
	if id := getenv("NCCL_COMM_ID"); id != "" {
		return id, nil
	}
	if l.MasterAddr == "" {
		return "", nil
	}
	port := l.MasterPort + 1
	if l.MasterPort == 0 {
		port = 29501 // torchrun's default MASTER_PORT is 29500
	}
	if port > 65535 {
		port = l.MasterPort - 1
	}
	return net.JoinHostPort(l.MasterAddr, strconv.Itoa(port)), nil
}

// Environ lists the launch variables of the environment, sorted, for error
// messages.
func Environ() []string {
	var out []string
	for _, kv := range os.Environ() {
		k, _, _ := strings.Cut(kv, "=")
		for _, v := range launcherVars {
			if k == v.rank || k == v.size || k == v.localRank || k == v.localSize {
				out = append(out, kv)
			}
		}
		if k == "MASTER_ADDR" || k == "MASTER_PORT" || k == "NCCL_COMM_ID" {
			out = append(out, kv)
		}
	}
	sort.Strings(out)
	return out
}
