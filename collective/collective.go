// Package collective is data-parallel training's communication: the collective
// operations ranks use (Comm), the single-process implementation that costs
// nothing, helpers over host bytes, and what a launcher (torchrun, Slurm's
// srun, Open MPI's mpirun) tells a process about its place (Launch). It
// holds no cgo: Open MPI is bound in collective/mpi and NCCL in kernels/cuda,
// both loaded at run time, so a binary that never runs with several ranks
// needs neither library.
//
// Invariants every implementation keeps: an operation over a buffer gives
// every rank the same bits (an all-reduce is reduced once per element and
// the result shared, never recomputed per rank in another order); buffers
// are the backend's (host memory on the CPU, device memory on CUDA); every
// rank calls the same operations in the same order.
package collective

import (
	"errors"
	"fmt"
	"strconv"
	"strings"
	"time"

	"github.com/tracegrpo/tracegrpo/kernels"
)

// Comm is a communicator over the ranks of one run.
type Comm interface {
	// Rank is this process's rank in [0, Size).
	Rank() int
	// Size is the number of ranks (the world size).
	Size() int
	// Name says which implementation this is ("single", "mpi", "nccl").
	Name() string
	// AllReduceSum replaces buf (F32 or I32) on every rank by the sum over
	// ranks of buf.
	AllReduceSum(buf kernels.Buf) error
	// ReduceScatterSum sets dst (n) on rank r to the sum over ranks of
	// src[r·n : (r+1)·n], for src (Size·n).
	ReduceScatterSum(dst, src kernels.Buf) error
	// AllGather sets dst (Size·n) on every rank to the concatenation, in
	// rank order, of every rank's src (n).
	AllGather(dst, src kernels.Buf) error
	// Broadcast replaces buf on every rank by root's.
	Broadcast(buf kernels.Buf, root int) error
	// Barrier returns once every rank has called it (and, on a device,
	// every operation queued before it has finished).
	Barrier() error
	// Abort ends the run on every rank at once: a rank that failed calls
	// it so that the others do not wait forever in a collective.
	Abort(code int)
	// Close releases the communicator.
	Close() error
}

// Pending is a collective an Overlapper queued.
type Pending interface {
	// Wait orders the backend's work queued after it behind the collective
	// (on a device, the compute stream waits for an event; the host does
	// not block).
	Wait() error
}

// Overlapper is implemented by a Comm that can run collectives concurrently
// with the backend's compute (NCCL, on a stream of its own). Each call is
// queued after every operation the backend has queued so far, so the
// collective sees their results and they are done reading its buffers; the
// backend's later work sees its result only after Wait. A Comm without it
// runs each collective in order with the backend's work.
type Overlapper interface {
	AllGatherAsync(dst, src kernels.Buf) (Pending, error)
	ReduceScatterSumAsync(dst, src kernels.Buf) (Pending, error)
}

// Deadliner is implemented by a Comm whose collectives can give up waiting
// for the other ranks (collective/mpi, Local): after SetTimeout(d) (0:
// wait forever), a collective that has waited d fails with an error that
// is ErrRankTimeout and names the ranks that went silent.
type Deadliner interface {
	SetTimeout(d time.Duration)
}

// ErrRankTimeout is wrapped by the error of a collective that waited
// longer than its timeout for another rank.
var ErrRankTimeout = errors.New("dist: a rank went silent")

// SilentError is the error of rank's collective what that waited timeout
// for the ranks in silent, which how ("did not answer a roll call within
// 1s") says what they did not do (none: every rank answered after all).
func SilentError(rank int, timeout time.Duration, what string, silent []int, how string) error {
	if len(silent) == 0 {
		// Open MPI continues a stopped rank (SIGCONT) before it kills it, so
		// a roll call taken while another rank ends the job can find every
		// rank answering.
		return fmt.Errorf("%w: rank %d waited %v in %s (--rank-timeout), and then every rank answered its roll call: a rank was stopped or hung "+
			"and has gone on (or another rank is ending the job); every rank stops", ErrRankTimeout, rank, timeout, what)
	}
	names := make([]string, len(silent))
	for i, r := range silent {
		names[i] = strconv.Itoa(r)
	}
	who, verb := "rank "+names[0], "is"
	if len(names) > 1 {
		who, verb = "ranks "+strings.Join(names, ", "), "are"
	}
	return fmt.Errorf("%w: %s %s silent: rank %d waited %v in %s (--rank-timeout) and %s %s "+
		"(a stopped or hung process, a dead node or network); every rank stops",
		ErrRankTimeout, who, verb, rank, timeout, what, who, how)
}

// ErrNotBuilt is returned by implementations this binary was built without
// (CGO_ENABLED=0).
var ErrNotBuilt = errors.New("dist: not built in (this binary was built with CGO_ENABLED=0)")

// single is the one-process communicator: every operation is the identity
// (or a copy), at no cost.
type single struct{ mem kernels.Backend }

// Single returns the communicator of a run with one process. b is used only
// by ReduceScatterSum and AllGather, which copy src to dst (f32, bf16 and
// i32 buffers: a sharded bf16 model gathers its layers' bf16 shards).
func Single(b kernels.Backend) Comm { return single{b} }

func (single) Rank() int                      { return 0 }
func (single) Size() int                      { return 1 }
func (single) Name() string                   { return "single" }
func (single) AllReduceSum(kernels.Buf) error { return nil }
func (single) Broadcast(buf kernels.Buf, root int) error {
	if root != 0 {
		return fmt.Errorf("dist: broadcast from rank %d of 1", root)
	}
	return nil
}
func (single) Barrier() error { return nil }
func (single) Abort(int)      {}
func (single) Close() error   { return nil }

func (s single) ReduceScatterSum(dst, src kernels.Buf) error { return s.copy(dst, src) }
func (s single) AllGather(dst, src kernels.Buf) error        { return s.copy(dst, src) }

func (s single) copy(dst, src kernels.Buf) error {
	if dst.N != src.N || dst.DType != src.DType {
		return fmt.Errorf("dist: %d × %s into %d × %s", src.N, src.DType, dst.N, dst.DType)
	}
	if dst == src {
		return nil
	}
	switch src.DType {
	case kernels.F32, kernels.BF16: // a sharded bf16 model gathers its layers' bf16 shards
		s.mem.Copy(dst, src)
	case kernels.I32:
		h := make([]int32, src.N)
		s.mem.DownloadI32(h, src)
		s.mem.UploadI32(dst, h)
	default:
		return fmt.Errorf("dist: copy of %s", src.DType)
	}
	return s.mem.Sync()
}

// GatherBytes gives every rank every rank's local bytes, in rank order
// (Gatherer.Bytes with buffers of its own, freed before it returns).
func GatherBytes(c Comm, mem kernels.Backend, local []byte) ([][]byte, error) {
	g := NewGatherer(c, mem)
	defer g.Close()
	return g.Bytes(local)
}

// Gatherer gathers bytes from every rank through AllGather over I32 buffers
// of a backend that it keeps and grows (to a power of two, at least 256
// words), so that a run gathering every step allocates on the backend only
// when a payload outgrows every earlier one.
type Gatherer struct {
	c        Comm
	mem      kernels.Backend
	src, dst kernels.Buf
	words    int // capacity of src, in I32 (dst holds Size() times it)
	hostOut  []int32
}

// NewGatherer returns a gatherer over c's ranks with buffers on mem.
func NewGatherer(c Comm, mem kernels.Backend) *Gatherer { return &Gatherer{c: c, mem: mem} }

// Close frees the gatherer's buffers.
func (g *Gatherer) Close() {
	if g.words > 0 {
		g.mem.Free(g.src)
		g.mem.Free(g.dst)
		g.words = 0
	}
}

// Bytes gives every rank every rank's local bytes, in rank order (two
// collectives: the lengths, then the payloads padded to the longest). With
// one rank it returns local without any operation.
func (g *Gatherer) Bytes(local []byte) ([][]byte, error) {
	n := g.c.Size()
	if n == 1 {
		return [][]byte{local}, nil
	}
	lens, err := g.i32([]int32{int32(len(local))})
	if err != nil {
		return nil, err
	}
	lens = append([]int32(nil), lens...)
	longest := 0
	for _, l := range lens {
		if l < 0 {
			return nil, fmt.Errorf("dist: a rank sent a length of %d", l)
		}
		longest = max(longest, int(l))
	}
	padded := make([]byte, 4*max((longest+3)/4, 1))
	copy(padded, local)
	all, err := g.i32(bytesI32(padded))
	if err != nil {
		return nil, err
	}
	out := make([][]byte, n)
	stride := len(padded) / 4
	for r := range n {
		out[r] = i32Bytes(all[r*stride : (r+1)*stride])[:lens[r]]
	}
	return out, nil
}

// HostAllReduceChunk is the most fp32 elements of scratch a host
// all-reduce over Open MPI (collective/mpi) keeps: its ring moves each
// block (1/W of the buffer) in pieces of at most this many (1 MiB).
const HostAllReduceChunk = 1 << 18

// GathererBytes is what a Gatherer of size ranks holds on its backend once
// Reserve(n) made room for payloads of n bytes (nothing for one rank).
func GathererBytes(size, n int) int64 {
	if size <= 1 {
		return 0
	}
	words := gathererWords(max((n+3)/4, 1))
	return 4 * int64(words) * int64(1+size)
}

// gathererWords is the capacity a Gatherer grows to for k words.
func gathererWords(k int) int {
	words := 256
	for words < k {
		words *= 2
	}
	return words
}

// Reserve grows the buffers to hold payloads of up to n bytes now (with
// more than one rank), so that gathering them later allocates nothing.
func (g *Gatherer) Reserve(n int) error {
	if g.c.Size() == 1 {
		return nil
	}
	return g.grow(max((n+3)/4, 1))
}

func (g *Gatherer) grow(k int) error {
	if k <= g.words {
		return nil
	}
	words := gathererWords(k)
	g.Close()
	src, err := g.mem.Alloc(kernels.I32, words)
	if err != nil {
		return fmt.Errorf("dist: gather buffers: %w", err)
	}
	dst, err := g.mem.Alloc(kernels.I32, g.c.Size()*words)
	if err != nil {
		g.mem.Free(src)
		return fmt.Errorf("dist: gather buffers: %w", err)
	}
	g.src, g.dst, g.words = src, dst, words
	return nil
}

// i32 all-gathers local (the same length on every rank); the result is
// valid until the next call.
func (g *Gatherer) i32(local []int32) ([]int32, error) {
	n, k := g.c.Size(), len(local)
	if err := g.grow(k); err != nil {
		return nil, err
	}
	src, dst := g.src.Slice(0, k), g.dst.Slice(0, n*k)
	g.mem.UploadI32(src, local)
	if err := g.mem.Sync(); err != nil {
		return nil, err
	}
	if err := g.c.AllGather(dst, src); err != nil {
		return nil, err
	}
	if cap(g.hostOut) < n*k {
		g.hostOut = make([]int32, n*k)
	}
	out := g.hostOut[:n*k]
	g.mem.DownloadI32(out, dst)
	return out, g.mem.Sync()
}

// Block is the contiguous block [lo, hi) of n items that rank takes of
// size ranks: the first n mod size ranks take one more.
func Block(n, rank, size int) (lo, hi int) {
	q, r := n/size, n%size
	lo = rank*q + min(rank, r)
	hi = lo + q
	if rank < r {
		hi++
	}
	return lo, hi
}
