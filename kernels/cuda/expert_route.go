//go:build cgo

package cuda

// ExpertRoute: csrc/expert_route.cu.

import (
	"fmt"

	"github.com/tracegrpo/tracegrpo/kernels"
)

// routeThreads is ROUTE_THREADS of csrc/expert_route.cu.
const routeThreads = 256

// ExpertRoute implements kernels.Experts: offsets (E+1) =, order (N) =,
// slot (N) = from experts (T,K), all I32; a stable counting sort, one block
// per expert, its per-expert counts in scratch.
func (b *Backend) ExpertRoute(offsets, order, slot, experts kernels.Buf, T, K, E int) {
	if T < 0 || K < 1 || E < 1 {
		panic(fmt.Sprintf("cuda: ExpertRoute: T=%d K=%d E=%d", T, K, E))
	}
	N := T * K
	want(offsets, kernels.I32, E+1, "ExpertRoute offsets")
	want(order, kernels.I32, N, "ExpertRoute order")
	want(slot, kernels.I32, N, "ExpertRoute slot")
	want(experts, kernels.I32, N, "ExpertRoute experts")
	defer b.lock()()
	counts := b.work(workExpertCounts, expertCountsWork(E))
	if counts == 0 {
		return
	}
	// Each of E blocks scans the N expert ids.
	b.launch("expert_count", rw(nil).plus(int64(E)*bytesOf(experts), int64(4*E)), E, 1, 1, routeThreads, 0, pu(counts), pa(experts), ia(N), ia(E), pu(b.flags))
	b.launch("expert_place", rw(nil, offsets, order, slot).plus(int64(E)*bytesOf(experts)+int64(4*E), 0), E, 1, 1, routeThreads, 0, pa(offsets), pa(order), pa(slot), pu(counts), pa(experts), ia(N), ia(E))
}
