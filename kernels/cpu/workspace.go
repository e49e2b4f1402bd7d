package cpu

import "github.com/tracegrpo/tracegrpo/kernels"

// PlanWorkspace returns the bytes of scratch the CPU backend's ops allocate
// for themselves running w on threads workers: the shared buffers exactly
// (the packed GEMM operands, the LM head's logits chunk, the norms' and
// reductions' partial sums), and each worker's buffers at their bound (they
// grow by a quarter past a request).
func PlanWorkspace(w kernels.Workload, threads int) int64 {
	shared, perWorker := planScratch(w)
	return shared + int64(threads)*perWorker
}

// PlanWorkspace is PlanWorkspace for this backend's thread count.
func (b *Backend) PlanWorkspace(w kernels.Workload) int64 { return PlanWorkspace(w, b.threads) }

// planScratch returns the bytes of the shared scratch w needs and the bound
// of one worker's.
func planScratch(w kernels.Workload) (shared, perWorker int64) {
	var packA, packB, dz, rms, partials, maxLen, treeCtx, attnD, attnPack int
	gemm := func(M, N, K int) {
		pa, pb := gemmShared(M, N, K)
		packA, packB = max(packA, pa), max(packB, pb)
	}
	for _, g := range w.GEMMs {
		gemm(g.T, g.OC, g.C) // Matmul: out = inp·weightᵀ
		if g.Backward {
			gemm(g.T, g.C, g.OC) // dinp += dout·weight
			gemm(g.OC, g.C, g.T) // dweight += doutᵀ·inp
		}
	}
	for _, g := range w.Grouped { // one expert may own every row
		gemm(g.N, g.OC, g.C)
		if g.Backward {
			gemm(g.N, g.C, g.OC)
			gemm(g.OC, g.C, g.N)
		}
	}
	for _, h := range w.Heads {
		vc := tlpChunk(h.T, h.V)
		dz = max(dz, h.T*vc)
		partials = max(partials, 4*h.T)
		gemm(h.T, vc, h.C)
		if h.Backward {
			gemm(h.T, h.C, vc)
			gemm(vc, h.C, h.T)
		}
	}
	for _, r := range w.RowNorms {
		if r.Backward {
			rms = max(rms, (r.N+rmsBlock-1)/rmsBlock*r.C)
		}
	}
	for _, n := range w.SumSquares {
		partials = max(partials, (n+reduceBlock-1)/reduceBlock)
	}
	for _, a := range w.Attention {
		maxLen = max(maxLen, a.MaxLen)
		// One sequence's keys and values packed (attnPacks; the backward's
		// three copies reuse the forward's two slots and add one).
		attnPack = max(attnPack, 3*max(packedBSize(a.MaxLen, a.HD), packedBSize(a.HD, a.MaxLen)))
	}
	for _, d := range w.Decode {
		maxLen = max(maxLen, d.Tmax)
	}
	for _, a := range w.Trees {
		// A query block's scores over its whole context, and the
		// gathered context's keys and values.
		maxLen = max(maxLen, a.MaxCtx)
		treeCtx = max(treeCtx, 2*a.MaxCtx*a.HD)
		if a.Backward {
			attnD = max(attnD, a.T*a.NH)
		}
	}
	worker := (tileM+gemmMR-1)/gemmMR*gemmMR*gemmKC + // packA
		gemmNC*gemmKC + // packB
		gemmMR*gemmNR + // tile
		2*attnQBlock*maxLen + attnQBlock + // attention scores, probabilities
		tlpRowBlock*tlpVChunk + max(elemGrain, tlpVChunk) + // logits rows, a row
		treeCtx + // a tree's gathered context
		attnPack // a sequence's keys and values, packed
	worker += worker / 4
	return 4*int64(packA+packB+dz+rms+attnD) + 8*int64(partials), 4 * int64(worker)
}

// scratchBytes returns the bytes the backend's scratch holds now: shared
// buffers, and the largest worker's.
func (b *Backend) scratchBytes() (shared, worker int64) {
	for _, x := range b.scratch.shared {
		shared += 4 * int64(cap(x))
	}
	shared += 8 * int64(cap(b.scratch.partials))
	for _, w := range b.scratch.w {
		var n int64
		for _, x := range w.bufs {
			n += 4 * int64(cap(x))
		}
		worker = max(worker, n)
	}
	return shared, worker
}
