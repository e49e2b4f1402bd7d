package model

import (
	"errors"
	"fmt"

	"github.com/tracegrpo/tracegrpo/collective"
	"github.com/tracegrpo/tracegrpo/kernels"
)

// Fully sharded data parallel (ZeRO-3, PyTorch's FSDP2): each of W ranks
// owns 1/W of every ParamGroup's two flats (the fp32 master weights, their
// gradients and, in the optimizer, their Adam moments) and gathers a
// group's whole flats, in the compute precision, just before the group is
// used. Gradients are computed into a group's whole flats and
// reduce-scattered (summed) to their owners after the group's backward.
//
// # Layout
//
// Sharding fixes, for every group g and flat f, one shard length
// Len[g][f] = ⌈FlatN / W⌉ rounded up to shardAlign elements: rank r owns
// elements [r·Len, (r+1)·Len) of the flat, and the tail past FlatN is
// padding (zero weights, zero gradients, never updated, never counted in a
// norm), so no size needs to divide by W. A rank's shard arena holds every
// group's matrix shard, in group order, then every group's vector shard.
//
// # Buffers
//
// A group is gathered into a slot (matrices in the compute precision,
// vectors fp32) and its gradients computed in a gradient slot (fp32), then
// reduce-scattered into a shard-sized scratch and added to the shard
// gradients. Slots are assigned statically: with ReshardAfterForward, the
// embedding, the head and two alternating slots for the decoder layers (the
// embedding and the head share one when they are not tied); without it, a
// slot per group (every group stays gathered until the weights change).
// Gradient slots are always the edge ones and two alternating layer slots.
// A group already in its slot (gathered since the last ParamsChanged) is not
// gathered again.
//
// # Schedule
//
// Forward: the embedding and layer 0, then at the start of layer l the
// gather of layer l+1 (or the head) is issued and joined only before the
// norm fused at the end of layer l, which reads layer l+1's ln1 weight. On a
// communicator that implements collective.Overlapper (NCCL), the gather
// runs on its own stream while layer l computes; a reduce-scatter of a
// layer's gradients runs while the layer below computes its backward. Every
// rank runs the same collectives in the same order whatever its tokens: a
// micro-batch of no tokens still gathers and reduce-scatters (zeros), so
// ranks with fewer micro-batches run empty ones.

// shardAlign is the element multiple of every shard length: 16 bytes of
// bf16, 32 of fp32, so every shard and gathered flat starts aligned for
// the GPU kernels' vector loads.
const shardAlign = 8

// Sharding is how W ranks split a ParamTable.
type Sharding struct {
	World, Rank int
	// Len and Off are, per group and flat, each rank's shard length in
	// elements (padded) and that shard's offset in the shard arena.
	Len, Off [][NumFlats]int
	// Region is the length of each flat kind's region of the arena:
	// matrices [0, Region[FlatMatrix]), then vectors.
	Region [NumFlats]int
	Total  int // shard arena length
}

// NewSharding lays t out over world ranks, for rank.
func NewSharding(t *ParamTable, world, rank int) (Sharding, error) {
	if world < 1 || rank < 0 || rank >= world {
		return Sharding{}, fmt.Errorf("model: sharding for rank %d of %d", rank, world)
	}
	s := Sharding{World: world, Rank: rank, Len: make([][NumFlats]int, len(t.Groups)), Off: make([][NumFlats]int, len(t.Groups))}
	for f := range NumFlats {
		for g, grp := range t.Groups {
			n := grp.FlatN[f]
			q := world * shardAlign
			s.Len[g][f] = (n + q - 1) / q * shardAlign
			s.Off[g][f] = s.Total
			s.Total += s.Len[g][f]
			s.Region[f] += s.Len[g][f]
		}
	}
	return s, nil
}

// Padded returns group g's flat f as gathered: World · Len elements.
func (s *Sharding) Padded(g int, f FlatKind) int { return s.World * s.Len[g][f] }

// OwnedBy returns the part of t.Params[i] that rank owns: elements [lo, hi)
// of the parameter (flattened, row-major), stored from element at of that
// rank's shard arena. hi == lo (and at == -1) when it owns none.
func (s *Sharding) OwnedBy(t *ParamTable, i, rank int) (lo, hi, at int) {
	p := t.Params[i]
	n := s.Len[p.Group][p.Flat]
	a, b := max(p.FlatOffset, rank*n), min(p.FlatOffset+p.N, (rank+1)*n)
	if a >= b {
		return 0, 0, -1
	}
	return a - p.FlatOffset, b - p.FlatOffset, s.Off[p.Group][p.Flat] + a - rank*n
}

// Owned is OwnedBy for this rank.
func (s *Sharding) Owned(t *ParamTable, i int) (lo, hi, at int) { return s.OwnedBy(t, i, s.Rank) }

// Piece is the part of one parameter a rank owns.
type Piece struct {
	Param  int // index in ParamTable.Params
	Lo, Hi int // elements [Lo, Hi) of the parameter
	At     int // where they start in the shard arena
}

// Pieces lists this rank's owned parts, in arena order (the optimizer's
// groups and the checkpoint's shard file follow it).
func (s *Sharding) Pieces(t *ParamTable) []Piece {
	var out []Piece
	for f := range NumFlats {
		for _, g := range t.Groups {
			for i := g.First; i < g.End; i++ {
				if t.Params[i].Flat != f {
					continue
				}
				if lo, hi, at := s.Owned(t, i); hi > lo {
					out = append(out, Piece{Param: i, Lo: lo, Hi: hi, At: at})
				}
			}
		}
	}
	return out
}

// ShardOptions configure a sharded model.
type ShardOptions struct {
	Comm collective.Comm
	// ReshardAfterForward frees each decoder layer's gathered weights
	// after its forward and gathers them again for its backward (FSDP's
	// reshard_after_forward, PyTorch fully_shard's default): two layers'
	// weights are gathered at a time. Without it every group stays
	// gathered until the weights change (the gathered weights of the
	// whole model, in the compute precision).
	ReshardAfterForward bool
}

// CommStats counts a sharded model's collectives: the bytes of every
// gathered flat (W shards, padding included) and of every reduce-scattered
// one (fp32), as the collectives move them, whatever the algorithm.
type CommStats struct {
	Gathers, ReduceScatters         int
	GatherBytes, ReduceScatterBytes int64
}

// wslot holds one gathered group: the matrix flat in the compute precision
// (fp32 for the embedding: a lookup table), the vector flat in fp32, and for
// a tied embedding under bf16 its rounded copy (the LM head's GEMM weight).
// A policy and its reference share slots; owner and group say whose group
// it holds, valid that its weights are current.
type wslot struct {
	mat, vec, matW kernels.Buf
	owner          *Model
	group          int
	valid          bool
	convert        bool // matW is to be made from mat once the gather is joined
	pending        []collective.Pending
}

// rslot holds one group's gradients (fp32, both flats) while its backward
// runs, and the shard-sized scratch its reduce-scatter writes; busy says a
// reduce-scatter into the scratch waits to be added to the shard gradients.
type rslot struct {
	mat, vec       kernels.Buf
	tmpMat, tmpVec kernels.Buf
	group          int
	busy           bool
	pending        []collective.Pending
}

// fsdp is a sharded model's state.
type fsdp struct {
	comm    collective.Comm
	ov      collective.Overlapper // nil: each collective in order with the compute
	sh      Sharding
	reshard bool
	// The shard arenas. mat32 holds fp32 matrix shards from element 0 of
	// the matrix region (a bf16 reference: the embedding's only, its lookup
	// table); matW the bf16 matrix shards from element wOff (the region
	// past the embedding, which is gathered in fp32): the policy's copy,
	// remade when stale, a reference's only copy.
	mat32, matW, vec kernels.Buf
	wOff             int
	stale            bool
	wslots           []*wslot // shared with a reference
	wslotOf          []int    // group → wslot
	rslots           []*rslot // nil for a forward-only model
	rslotOf          []int    // group → rslot
	own              []kernels.Buf
	err              error
	stats            CommStats
}

// slotPlan assigns groups to slots and sizes them.
type slotPlan struct {
	wOf, rOf         []int
	wDT              []kernels.DType // each gathered slot's matrix precision
	wMat, wVec, wW   []int           // capacities (elements); wW: the tied bf16 head
	rMat, rVec       []int
	rTmpMat, rTmpVec []int
}

// planSlots assigns the groups of t to slots: the embedding and the head
// share one when untied and fp32; the decoder layers alternate between two
// (with reshard; else a gathered slot per group).
func planSlots(t *ParamTable, sh *Sharding, wdt kernels.DType, tied, reshard bool) slotPlan {
	G := len(t.Groups)
	var p slotPlan
	p.wOf, p.rOf = make([]int, G), make([]int, G)
	shareW := !tied && wdt == kernels.F32
	slotOf := func(g int, share bool) int {
		base := 2
		if share {
			base = 1
		}
		switch {
		case t.Groups[g].Layer >= 0:
			return base + t.Groups[g].Layer%2
		case t.Groups[g].Name == "head" && !share:
			return 1
		}
		return 0
	}
	nw, nr := 0, 0
	for g := range G {
		p.rOf[g] = slotOf(g, !tied)
		if reshard {
			p.wOf[g] = slotOf(g, shareW)
		} else {
			p.wOf[g] = g
		}
		nw, nr = max(nw, p.wOf[g]+1), max(nr, p.rOf[g]+1)
	}
	p.wDT = make([]kernels.DType, nw)
	p.wMat, p.wVec, p.wW = make([]int, nw), make([]int, nw), make([]int, nw)
	p.rMat, p.rVec, p.rTmpMat, p.rTmpVec = make([]int, nr), make([]int, nr), make([]int, nr), make([]int, nr)
	for g := range G {
		w, r := p.wOf[g], p.rOf[g]
		p.wDT[w] = wdt
		if g == 0 {
			p.wDT[w] = kernels.F32
			if tied && wdt != kernels.F32 {
				p.wW[w] = sh.Padded(g, FlatMatrix)
			}
		}
		p.wMat[w] = max(p.wMat[w], sh.Padded(g, FlatMatrix))
		p.wVec[w] = max(p.wVec[w], sh.Padded(g, FlatVector))
		p.rMat[r] = max(p.rMat[r], sh.Padded(g, FlatMatrix))
		p.rVec[r] = max(p.rVec[r], sh.Padded(g, FlatVector))
		p.rTmpMat[r] = max(p.rTmpMat[r], sh.Len[g][FlatMatrix])
		p.rTmpVec[r] = max(p.rTmpVec[r], sh.Len[g][FlatVector])
	}
	return p
}

// shardSizes are the bytes of a sharded model's allocations.
type shardSizes struct {
	mat32, matW, vec int // shard arenas (elements)
	wOff             int // first matrix element matW covers
	grads            int // shard gradients (elements)
	gathered         int64
	reduce           int64 // gradient slots and their scratch
}

func (m *Model) shardSizes(sh *Sharding, reshard bool) (shardSizes, slotPlan) {
	var z shardSizes
	z.vec = sh.Region[FlatVector]
	z.mat32 = sh.Region[FlatMatrix]
	if m.wdt != kernels.F32 {
		z.wOff = sh.Len[0][FlatMatrix]
		z.matW = sh.Region[FlatMatrix] - z.wOff
		if m.forwardOnly {
			z.mat32 = z.wOff // a bf16 reference keeps the embedding's lookup table only in fp32
		}
	}
	p := planSlots(&m.table, sh, m.wdt, m.cfg.TieWordEmbeddings, reshard)
	if !m.forwardOnly {
		z.grads = sh.Total
		for i := range p.rMat {
			z.reduce += 4 * int64(p.rMat[i]+p.rVec[i]+p.rTmpMat[i]+p.rTmpVec[i])
		}
	}
	if m.owner == nil {
		for i := range p.wMat {
			z.gathered += int64(p.wMat[i])*int64(p.wDT[i].Size()) + 4*int64(p.wVec[i]) + 2*int64(p.wW[i])
		}
	}
	return z, p
}

// NewSharded allocates rank so.Comm.Rank()'s share of a model sharded over
// so.Comm's ranks (see the doc of Sharding): its shard arenas, gathered
// slots, gradient slots and a whole model's activations. Every rank calls
// it, and then the same Forward and Backward calls in the same order.
// Params and Grads are the shard arenas (Sharding().Total floats); Table
// is the whole model's.
func NewSharded(b kernels.Backend, cfg Config, opt Options, so ShardOptions) (*Model, error) {
	if so.Comm == nil {
		return nil, errors.New("model: NewSharded without a communicator")
	}
	m, err := shell(cfg, opt)
	if err != nil {
		return nil, err
	}
	m.setBackend(b)
	if err := m.checkBackend(); err != nil {
		return nil, err
	}
	if err := m.checkFilter(); err != nil {
		return nil, err
	}
	sh, err := NewSharding(&m.table, so.Comm.Size(), so.Comm.Rank())
	if err != nil {
		return nil, err
	}
	fs := &fsdp{comm: so.Comm, sh: sh, reshard: so.ReshardAfterForward}
	fs.ov, _ = so.Comm.(collective.Overlapper)
	m.fs = fs
	z, sp := m.shardSizes(&sh, fs.reshard)
	sz, p, err := m.sizes()
	if err != nil {
		return nil, err
	}
	fail := func(what string, n int, err error) error {
		m.Close()
		return fmt.Errorf("model: %s of %d elements: %w", what, n, err)
	}
	if m.params, err = b.Alloc(kernels.F32, z.mat32+z.vec); err != nil {
		return nil, fail("shard arena", z.mat32+z.vec, err)
	}
	b.Fill(m.params, 0) // padding stays zero
	fs.mat32, fs.vec, fs.wOff = m.params.Slice(0, z.mat32), m.params.Slice(z.mat32, z.vec), z.wOff
	if z.matW > 0 {
		if fs.matW, err = b.Alloc(kernels.BF16, z.matW); err != nil {
			return nil, fail("bf16 shard arena", z.matW, err)
		}
		fs.own = append(fs.own, fs.matW)
	}
	fs.stale = true
	if z.grads > 0 {
		if m.grads, err = b.Alloc(kernels.F32, z.grads); err != nil {
			return nil, fail("shard gradients", z.grads, err)
		}
		b.Fill(m.grads, 0)
	}
	if err := m.allocSlots(sp); err != nil {
		return nil, err
	}
	m.views()
	ws := &workspace{}
	m.ws = ws
	if ws.acts, err = b.Alloc(kernels.F32, sz.acts); err != nil {
		return nil, fail("activations", sz.acts, err)
	}
	if sz.actsW > 0 {
		if ws.actsW, err = b.Alloc(m.wdt, sz.actsW); err != nil {
			return nil, fail("activations", sz.actsW, err)
		}
	}
	if ws.ints, err = b.Alloc(kernels.I32, sz.ints); err != nil {
		return nil, fail("token buffers", sz.ints, err)
	}
	p.cut(m, ws)
	if err := m.ensureRope(m.opt.MaxSeqLen); err != nil {
		m.Close()
		return nil, err
	}
	m.hostStaging()
	return m, nil
}

// allocSlots allocates the gathered slots (unless a policy's are shared)
// and the gradient slots.
func (m *Model) allocSlots(sp slotPlan) error {
	fs, b := m.fs, m.b
	fs.wslotOf, fs.rslotOf = sp.wOf, sp.rOf
	alloc := func(dt kernels.DType, n int) (kernels.Buf, error) {
		if n == 0 {
			return kernels.Buf{DType: dt}, nil
		}
		x, err := b.Alloc(dt, n)
		if err != nil {
			m.Close()
			return x, fmt.Errorf("model: sharded model's buffers, %d × %s: %w", n, dt, err)
		}
		fs.own = append(fs.own, x)
		return x, nil
	}
	var err error
	if m.owner == nil {
		for i := range sp.wMat {
			s := &wslot{group: -1}
			if s.mat, err = alloc(sp.wDT[i], sp.wMat[i]); err != nil {
				return err
			}
			if s.vec, err = alloc(kernels.F32, sp.wVec[i]); err != nil {
				return err
			}
			if s.matW, err = alloc(kernels.BF16, sp.wW[i]); err != nil {
				return err
			}
			fs.wslots = append(fs.wslots, s)
		}
	} else {
		fs.wslots = m.owner.fs.wslots
	}
	if m.forwardOnly {
		fs.rslotOf = nil
		return nil
	}
	for i := range sp.rMat {
		s := &rslot{group: -1}
		if s.mat, err = alloc(kernels.F32, sp.rMat[i]); err != nil {
			return err
		}
		if s.vec, err = alloc(kernels.F32, sp.rVec[i]); err != nil {
			return err
		}
		if s.tmpMat, err = alloc(kernels.F32, sp.rTmpMat[i]); err != nil {
			return err
		}
		if s.tmpVec, err = alloc(kernels.F32, sp.rTmpVec[i]); err != nil {
			return err
		}
		fs.rslots = append(fs.rslots, s)
	}
	return nil
}

// Sharding returns the model's layout over its ranks (nil when the model
// is not sharded).
func (m *Model) Sharding() *Sharding {
	if m.fs == nil {
		return nil
	}
	return &m.fs.sh
}

// CommStats returns the collectives the model has run so far.
func (m *Model) CommStats() CommStats {
	if m.fs == nil {
		return CommStats{}
	}
	return m.fs.stats
}

// paramBase returns where parameter i's values are: kind 0 its fp32
// weights, kind 1 its weights in the GEMM precision, kind 2 its gradient;
// the buffer and the parameter's element offset in it (for a sharded
// model, its slot's, which hold the group while it is gathered).
func (m *Model) paramBase(i int, kind int) (kernels.Buf, int) {
	p := m.table.Params[i]
	if m.fs == nil {
		switch kind {
		case 1:
			if m.wdt == kernels.BF16 {
				return m.paramsW, p.Offset
			}
			return m.params, p.Offset
		case 2:
			return m.grads, p.Offset
		}
		return m.params, p.Offset
	}
	fs := m.fs
	switch kind {
	case 2:
		if fs.rslotOf == nil {
			return kernels.Buf{}, 0
		}
		r := fs.rslots[fs.rslotOf[p.Group]]
		if p.Flat == FlatVector {
			return r.vec, p.FlatOffset
		}
		return r.mat, p.FlatOffset
	}
	w := fs.wslots[fs.wslotOf[p.Group]]
	switch {
	case p.Flat == FlatVector:
		return w.vec, p.FlatOffset
	case m.wdt == kernels.F32:
		return w.mat, p.FlatOffset
	case p.Group == 0 && kind == 0:
		return w.mat, p.FlatOffset // the embedding is gathered in fp32
	case p.Group == 0:
		return w.matW, p.FlatOffset // its bf16 copy, for a tied LM head
	case kind == 1:
		return w.mat, p.FlatOffset
	}
	return kernels.Buf{}, 0 // other gathered matrices exist in the GEMM precision only
}

// invalidate marks every gathered copy of m's groups stale (its shard
// weights were written).
func (fs *fsdp) invalidate(m *Model) {
	fs.stale = true
	for _, s := range fs.wslots {
		if s.owner == m {
			s.valid = false
		}
	}
}

// fail records the first collective error; later collectives are skipped.
func (fs *fsdp) fail(err error) {
	if err != nil && fs.err == nil {
		fs.err = err
	}
}

// takeErr returns and clears the recorded collective error.
func (fs *fsdp) takeErr() error {
	err := fs.err
	fs.err = nil
	return err
}

func (fs *fsdp) allGather(dst, src kernels.Buf) collective.Pending {
	if fs.err != nil || src.N == 0 {
		return nil
	}
	fs.stats.Gathers++
	fs.stats.GatherBytes += int64(dst.N) * int64(dst.DType.Size())
	if fs.ov != nil {
		p, err := fs.ov.AllGatherAsync(dst, src)
		fs.fail(err)
		return p
	}
	fs.fail(fs.comm.AllGather(dst, src))
	return nil
}

func (fs *fsdp) reduceScatter(dst, src kernels.Buf) collective.Pending {
	if fs.err != nil || dst.N == 0 {
		return nil
	}
	fs.stats.ReduceScatters++
	fs.stats.ReduceScatterBytes += int64(src.N) * 4
	if fs.ov != nil {
		p, err := fs.ov.ReduceScatterSumAsync(dst, src)
		fs.fail(err)
		return p
	}
	fs.fail(fs.comm.ReduceScatterSum(dst, src))
	return nil
}

func (fs *fsdp) wait(ps []collective.Pending) []collective.Pending {
	for _, p := range ps {
		if p != nil {
			fs.fail(p.Wait())
		}
	}
	return ps[:0]
}

// gather issues the gather of group g into its slot unless the slot holds
// it already; join waits for it.
func (m *Model) gather(g int) {
	fs := m.fs
	s := fs.wslots[fs.wslotOf[g]]
	if s.owner == m && s.group == g && s.valid {
		return
	}
	s.pending = fs.wait(s.pending)
	if fs.stale && fs.matW.N > 0 && fs.mat32.N > fs.wOff {
		m.b.Convert(fs.matW, fs.mat32.Slice(fs.wOff, fs.matW.N))
	}
	fs.stale = false
	sh := &fs.sh
	n, off := sh.Len[g][FlatMatrix], sh.Off[g][FlatMatrix]
	var src kernels.Buf
	if m.wdt == kernels.F32 || g == 0 {
		src = fs.mat32.Slice(off, n)
	} else {
		src = fs.matW.Slice(off-fs.wOff, n)
	}
	s.pending = append(s.pending, fs.allGather(s.mat.Slice(0, sh.World*n), src))
	n = sh.Len[g][FlatVector]
	s.pending = append(s.pending,
		fs.allGather(s.vec.Slice(0, sh.World*n), fs.vec.Slice(sh.Off[g][FlatVector]-sh.Region[FlatMatrix], n)))
	s.owner, s.group, s.valid = m, g, true
	s.convert = s.matW.N > 0
}

func (m *Model) join(g int) {
	fs := m.fs
	s := fs.wslots[fs.wslotOf[g]]
	s.pending = fs.wait(s.pending)
	if s.convert && s.group == g {
		n := fs.sh.Padded(g, FlatMatrix)
		m.b.Convert(s.matW.Slice(0, n), s.mat.Slice(0, n))
		s.convert = false
	}
}

// need gathers group g (if it is not in its slot) and waits for it.
func (m *Model) need(g int) {
	m.gather(g)
	m.join(g)
}

// flush adds a reduce-scatter waiting in r's scratch to the shard
// gradients.
func (m *Model) flush(r *rslot) {
	fs := m.fs
	if !r.busy {
		return
	}
	r.pending = fs.wait(r.pending)
	sh := &fs.sh
	g := r.group
	if n := sh.Len[g][FlatMatrix]; n > 0 {
		m.b.Accumulate(m.grads.Slice(sh.Off[g][FlatMatrix], n), r.tmpMat.Slice(0, n), n)
	}
	if n := sh.Len[g][FlatVector]; n > 0 {
		m.b.Accumulate(m.grads.Slice(sh.Off[g][FlatVector], n), r.tmpVec.Slice(0, n), n)
	}
	r.busy = false
}

// takeGrads readies group g's gradient slot: the reduce-scatter of its
// last group is added to the shard gradients, and the slot is zeroed.
func (m *Model) takeGrads(g int) {
	fs := m.fs
	r := fs.rslots[fs.rslotOf[g]]
	m.flush(r)
	sh := &fs.sh
	if n := sh.Padded(g, FlatMatrix); n > 0 {
		m.b.Fill(r.mat.Slice(0, n), 0)
	}
	if n := sh.Padded(g, FlatVector); n > 0 {
		m.b.Fill(r.vec.Slice(0, n), 0)
	}
	r.group = g
}

// scatterGrads issues the reduce-scatter of group g's gradients.
func (m *Model) scatterGrads(g int) {
	fs := m.fs
	r := fs.rslots[fs.rslotOf[g]]
	sh := &fs.sh
	n := sh.Len[g][FlatMatrix]
	r.pending = append(r.pending, fs.reduceScatter(r.tmpMat.Slice(0, n), r.mat.Slice(0, sh.World*n)))
	n = sh.Len[g][FlatVector]
	r.pending = append(r.pending, fs.reduceScatter(r.tmpVec.Slice(0, n), r.vec.Slice(0, sh.World*n)))
	r.busy = true
}

// The groups of the model, by role (newTable's order: embed, the layers,
// head).
func (m *Model) embedGroup() int { return 0 }
func (m *Model) headGroup() int  { return len(m.table.Groups) - 1 }
func (m *Model) layerGroup(l int) int {
	return l + 1
}

// shardedForward runs the forward pass of the staged micro-batch (see the
// schedule in Sharding's doc); with no tokens it runs the collectives only.
func (m *Model) shardedForward() {
	run := m.lastT > 0
	L := len(m.la)
	tied := m.cfg.TieWordEmbeddings
	m.gather(m.embedGroup())
	m.gather(m.layerGroup(0))
	m.join(m.embedGroup())
	m.join(m.layerGroup(0))
	if run {
		m.embed()
		m.mtpEmbed()
		m.norm1(0)
	}
	for l := range L {
		next := m.headGroup()
		if l+1 < L {
			next = m.layerGroup(l + 1)
		}
		m.gather(next)
		if next == m.headGroup() && tied {
			m.gather(m.embedGroup())
		}
		if run {
			m.layerBody(l)
		}
		m.join(next)
		if next == m.headGroup() && tied {
			m.join(m.embedGroup())
		}
		if run {
			m.layerTail(l)
		}
	}
	if run {
		m.head()
	}
	m.mtpShardedForward(run)
}

// shardedBackward runs the backward pass of the last forward, reducing
// each group's gradients to their owners as soon as they are complete;
// with no tokens it runs the collectives only (zero gradients).
func (m *Model) shardedBackward() {
	run := m.lastT > 0
	tied := m.cfg.TieWordEmbeddings
	hg, eg := m.headGroup(), m.embedGroup()
	m.need(hg)
	if tied {
		m.need(eg)
		m.takeGrads(eg)
	}
	m.takeGrads(hg)
	m.mtpShardedBackward(run)
	if run {
		m.backwardHead()
	}
	m.scatterGrads(hg)
	for l := len(m.la) - 1; l >= 0; l-- {
		g := m.layerGroup(l)
		m.gather(g)
		if l > 0 {
			m.gather(m.layerGroup(l - 1))
		}
		m.join(g)
		m.takeGrads(g)
		if run {
			m.backwardLayer(l)
		}
		m.scatterGrads(g)
	}
	if !tied {
		m.takeGrads(eg)
	}
	if run {
		m.backwardEmbed()
	}
	m.scatterGrads(eg)
	for _, r := range m.fs.rslots {
		m.flush(r)
	}
}

// newShardedReference is NewReference of a sharded policy: a forward-only
// model sharded the same way, holding its shard of the policy's current
// weights (under bf16 in bf16 only, but for the embedding's lookup table
// and the vectors, which the forward reads in fp32 as the policy's does),
// and gathering into the policy's slots.
func newShardedReference(policy *Model) (*Model, error) {
	m, err := shell(policy.cfg, unfiltered(policy.opt))
	if err != nil {
		return nil, err
	}
	m.setBackend(policy.b)
	m.forwardOnly, m.owner = true, policy
	pf := policy.fs
	fs := &fsdp{comm: pf.comm, ov: pf.ov, sh: pf.sh, reshard: pf.reshard}
	m.fs = fs
	z, sp := m.shardSizes(&fs.sh, fs.reshard)
	b := m.b
	if m.params, err = b.Alloc(kernels.F32, z.mat32+z.vec); err != nil {
		return nil, fmt.Errorf("model: reference shard arena of %d floats: %w", z.mat32+z.vec, err)
	}
	fs.mat32, fs.vec, fs.wOff = m.params.Slice(0, z.mat32), m.params.Slice(z.mat32, z.vec), z.wOff
	b.Copy(fs.mat32, pf.mat32.Slice(0, z.mat32))
	b.Copy(fs.vec, pf.vec)
	if z.matW > 0 {
		if fs.matW, err = b.Alloc(kernels.BF16, z.matW); err != nil {
			m.Close()
			return nil, fmt.Errorf("model: reference bf16 shard arena of %d elements: %w", z.matW, err)
		}
		fs.own = append(fs.own, fs.matW)
		b.Convert(fs.matW, pf.mat32.Slice(z.wOff, z.matW))
	}
	if err := m.allocSlots(sp); err != nil {
		return nil, err
	}
	m.views()
	m.ws = policy.ws
	_, p, err := m.sizes()
	if err != nil {
		m.Close()
		return nil, err
	}
	p.cut(m, policy.ws)
	m.hostStaging()
	if err := b.Sync(); err != nil {
		m.Close()
		return nil, fmt.Errorf("model: reference: %w", err)
	}
	return m, nil
}

// NewGatheredCopy returns a forward-only model of policy's configuration
// holding every weight (fp32, with its bf16 copy under mixed precision),
// running in the policy's activations like a reference: the in-process
// sampler's weights when the policy is sharded. GatherFrom fills it.
func NewGatheredCopy(policy *Model) (*Model, error) {
	if policy.fs == nil {
		return nil, errors.New("model: NewGatheredCopy of a model that is not sharded")
	}
	m, err := shell(policy.cfg, policy.opt)
	if err != nil {
		return nil, err
	}
	m.setBackend(policy.b)
	m.forwardOnly, m.owner = true, policy
	sz, p, err := m.sizes()
	if err != nil {
		return nil, err
	}
	if err := m.allocWeights(sz); err != nil {
		return nil, err
	}
	m.views()
	m.ws = policy.ws
	p.cut(m, policy.ws)
	m.hostStaging()
	return m, nil
}

// GatherFrom sets every weight of m, a NewGatheredCopy of policy, to
// policy's current fp32 weights: every rank gathers every group (through
// the policy's gradient slots, which are free between steps), in table
// order. Every rank calls it at the same point.
func (m *Model) GatherFrom(policy *Model) error {
	if m.owner != policy || policy.fs == nil || m.fs != nil {
		return errors.New("model: GatherFrom needs a NewGatheredCopy of the sharded policy")
	}
	return policy.gatherEach(func(g int, mat, vec kernels.Buf) {
		for i := policy.table.Groups[g].First; i < policy.table.Groups[g].End; i++ {
			p := policy.table.Params[i]
			src := mat
			if p.Flat == FlatVector {
				src = vec
			}
			m.b.Copy(m.params.Slice(p.Offset, p.N), src.Slice(p.FlatOffset, p.N))
		}
		m.stale = true
	})
}

// gatherEach gathers each group's fp32 flats in turn into its gradient
// slot and calls use with them (valid until the next group): every rank
// runs the same collectives. use may queue backend work.
func (m *Model) gatherEach(use func(g int, mat, vec kernels.Buf)) error {
	return m.gatherGroups(nil, use)
}

// gatherGroups is gatherEach over the groups of order (nil: all, in table
// order), each gathered once per run of equal entries.
func (m *Model) gatherGroups(order []int, use func(g int, mat, vec kernels.Buf)) error {
	fs := m.fs
	if fs.rslots == nil {
		return errors.New("model: gathering the fp32 weights needs a training model's gradient slots")
	}
	if order == nil {
		for g := range m.table.Groups {
			order = append(order, g)
		}
	}
	for _, r := range fs.rslots {
		m.flush(r)
	}
	sh := &fs.sh
	for i, g := range order {
		if i > 0 && order[i-1] == g {
			continue
		}
		r := fs.rslots[fs.rslotOf[g]]
		nm, nv := sh.Len[g][FlatMatrix], sh.Len[g][FlatVector]
		mat, vec := r.mat.Slice(0, sh.World*nm), r.vec.Slice(0, sh.World*nv)
		fs.wait([]collective.Pending{
			fs.allGather(mat, fs.mat32.Slice(sh.Off[g][FlatMatrix], nm)),
			fs.allGather(vec, fs.vec.Slice(sh.Off[g][FlatVector]-sh.Region[FlatMatrix], nv)),
		})
		if fs.err != nil {
			break
		}
		use(g, mat, vec)
	}
	return errors.Join(fs.takeErr(), m.b.Sync())
}

// Owned returns the part of parameter i this model holds in Params:
// elements [lo, hi) of the parameter, from element at of the arena; the
// whole parameter unless the model is sharded.
func (m *Model) Owned(i int) (lo, hi, at int) {
	if m.fs == nil {
		p := m.table.Params[i]
		return 0, p.N, p.Offset
	}
	return m.fs.sh.Owned(&m.table, i)
}

// commErr returns the first collective error since the last call.
func (m *Model) commErr() error {
	if m.fs == nil {
		return nil
	}
	return m.fs.takeErr()
}

// PlanSharded returns what NewSharded allocates on one of world ranks (the
// same on every rank), without allocating.
func PlanSharded(cfg Config, opt Options, world int, reshard bool) (Footprint, error) {
	m, err := shell(cfg, opt)
	if err != nil {
		return Footprint{}, err
	}
	sh, err := NewSharding(&m.table, world, 0)
	if err != nil {
		return Footprint{}, err
	}
	z, _ := m.shardSizes(&sh, reshard)
	sz, _, err := m.sizes()
	if err != nil {
		return Footprint{}, err
	}
	f := sz.footprint(m.wdt)
	f.Weights, f.WeightsBF16, f.Grads = 4*int64(z.mat32+z.vec), 2*int64(z.matW), 4*int64(z.grads)
	f.Gathered, f.GradReduce = z.gathered, z.reduce
	return f, nil
}

// PlanShardedReference returns what NewReference allocates for a policy
// sharded over world ranks: its weight shards (their gathered slots are
// the policy's).
func PlanShardedReference(cfg Config, opt Options, world int) (Footprint, error) {
	m, err := shell(cfg, opt)
	if err != nil {
		return Footprint{}, err
	}
	m.forwardOnly, m.owner = true, &Model{}
	sh, err := NewSharding(&m.table, world, 0)
	if err != nil {
		return Footprint{}, err
	}
	z, _ := m.shardSizes(&sh, false)
	return Footprint{Weights: 4 * int64(z.mat32+z.vec), WeightsBF16: 2 * int64(z.matW)}, nil
}
