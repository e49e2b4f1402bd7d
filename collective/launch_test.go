package collective

import (
	"fmt"
	"math/rand/v2"
	"strings"
	"testing"
)

// TestImpossibleLaunchesRefused (issue 33, item 9): over random launcher
// environments, each launcher alone with every variable set, unset,
// negative, zero or past the others, a launch is accepted exactly when
// its numbers can be (a rank and a local rank below the world size, a
// local rank below the ranks on its node, no more ranks on a node than in
// the world, a MASTER_PORT that is a TCP port), and then gives those
// numbers; otherwise the error names the variables of a broken rule with
// their values. The rules are restated here as the set of launches a
// cluster can start (nodes of LOCAL_WORLD_SIZE ranks), not as the checks.
func TestImpossibleLaunchesRefused(t *testing.T) {
	type family struct{ name, rank, size, localRank, localSize string }
	families := []family{
		{"torchrun", "RANK", "WORLD_SIZE", "LOCAL_RANK", "LOCAL_WORLD_SIZE"},
		{"mpirun", "OMPI_COMM_WORLD_RANK", "OMPI_COMM_WORLD_SIZE", "OMPI_COMM_WORLD_LOCAL_RANK", "OMPI_COMM_WORLD_LOCAL_SIZE"},
		{"slurm", "SLURM_PROCID", "SLURM_NTASKS", "SLURM_LOCALID", "SLURM_NTASKS_PER_NODE"},
	}
	rng := rand.New(rand.NewPCG(33, 9))
	// value draws small numbers around the interesting edges, or unset (-99).
	value := func(unset bool) int {
		if unset && rng.IntN(4) == 0 {
			return -99
		}
		return rng.IntN(7) - 1 // -1 .. 5
	}
	accepted, refused := 0, 0
	for trial := 0; trial < 4000; trial++ {
		f := families[trial%len(families)]
		rank, size := value(false), value(false)
		localRank, localSize, port := value(true), value(true), value(true)
		switch rng.IntN(6) { // ports worth trying
		case 0:
			port = 0
		case 1:
			port = 65535
		case 2:
			port = 65536
		case 3:
			port = 29500
		}
		m := map[string]string{f.rank: fmt.Sprint(rank), f.size: fmt.Sprint(size)}
		set := func(k string, v int) {
			if v != -99 {
				m[k] = fmt.Sprint(v)
			}
		}
		set(f.localRank, localRank)
		set(f.localSize, localSize)
		set("MASTER_PORT", port)
		// Can a cluster start this process? Every rank of a world of size
		// ranks, on nodes of localSize ranks each (one node holding them
		// all when unset), has a node-local index below localSize.
		lr, ls := max(localRank, 0), size
		if localRank == -99 {
			lr = 0
		}
		if localSize != -99 {
			ls = localSize
		}
		type rule struct {
			ok   bool
			vars []string
		}
		rules := []rule{
			{size >= 1 && rank >= 0 && rank < size, []string{f.rank, f.size}},
			{localRank == -99 || (localRank >= 0 && localRank < max(size, 0)), []string{f.localRank, f.size}},
			{localSize == -99 || (localSize >= 1 && localSize <= size), []string{f.localSize, f.size}},
			{localSize == -99 || localRank == -99 || localRank < localSize, []string{f.localRank, f.localSize}},
			{port == -99 || (port >= 1 && port <= 65535), []string{"MASTER_PORT"}},
		}
		possible := true
		for _, r := range rules {
			possible = possible && r.ok
		}
		got, err := DetectLaunch(func(k string) string { return m[k] })
		if possible {
			accepted++
			wantPort := max(port, 0)
			wantLocal := 0
			if localSize != -99 {
				wantLocal = ls
			}
			if err != nil || got.Rank != rank || got.Size != size || got.LocalRank != lr || got.LocalSize != wantLocal || got.MasterPort != wantPort {
				t.Fatalf("%v: got %+v, %v; want rank %d of %d, local rank %d of %d, port %d", m, got, err, rank, size, lr, wantLocal, wantPort)
			}
			continue
		}
		refused++
		if err == nil {
			t.Fatalf("%v: accepted as %+v; no cluster starts such a process", m, got)
		}
		named := false
		for _, r := range rules {
			if r.ok {
				continue
			}
			all := true
			for _, v := range r.vars {
				all = all && strings.Contains(err.Error(), v+"="+m[v])
			}
			named = named || all
		}
		if !named {
			t.Fatalf("%v: %v; want the variables of a broken rule named with their values", m, err)
		}
	}
	if accepted < 200 || refused < 200 {
		t.Fatalf("%d accepted and %d refused: the draws miss one side", accepted, refused)
	}
}

// TestImpossibleLaunchMessages: the four launches issue 33 names, as a
// user meets them.
func TestImpossibleLaunchMessages(t *testing.T) {
	for _, c := range []struct {
		env  []string
		want string
	}{
		{[]string{"RANK", "1", "WORLD_SIZE", "4", "LOCAL_RANK", "2", "LOCAL_WORLD_SIZE", "2"}, "LOCAL_RANK=2 with LOCAL_WORLD_SIZE=2"},
		{[]string{"RANK", "1", "WORLD_SIZE", "4", "LOCAL_RANK", "4"}, "LOCAL_RANK=4 with WORLD_SIZE=4"},
		{[]string{"RANK", "1", "WORLD_SIZE", "4", "LOCAL_RANK", "1", "LOCAL_WORLD_SIZE", "8"}, "LOCAL_WORLD_SIZE=8 with WORLD_SIZE=4"},
		{[]string{"OMPI_COMM_WORLD_RANK", "0", "OMPI_COMM_WORLD_SIZE", "2", "OMPI_COMM_WORLD_LOCAL_RANK", "1", "OMPI_COMM_WORLD_LOCAL_SIZE", "1"},
			"OMPI_COMM_WORLD_LOCAL_RANK=1 with OMPI_COMM_WORLD_LOCAL_SIZE=1"},
		{[]string{"RANK", "0", "WORLD_SIZE", "2", "MASTER_PORT", "0"}, "MASTER_PORT=0"},
	} {
		if _, err := DetectLaunch(env(c.env...)); err == nil || !strings.Contains(err.Error(), c.want) {
			t.Errorf("%v: %v; want an error naming %q", c.env, err, c.want)
		}
	}
}
