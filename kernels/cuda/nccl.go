//go:build cgo

package cuda

// NCCL: dist's collectives over device buffers, on the backend's stream.
// libnccl.so.2 is dlopen'ed at run time with the prototypes below, like the
// driver and cuBLAS: a binary that never runs with several GPUs needs no
// NCCL. Every C function makes the backend's context current first.

/*
#cgo LDFLAGS: -ldl
#include <dlfcn.h>
#include <stddef.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

typedef struct { char internal[128]; } tg_nccl_id;
typedef int (*tg_setctx)(void*);

typedef struct {
	void* lib;
	int (*getVersion)(int*);
	int (*getUniqueId)(tg_nccl_id*);
	int (*commInitRank)(void**, int, tg_nccl_id, int);
	int (*commDestroy)(void*);
	int (*commAbort)(void*);
	const char* (*getErrorString)(int);
	int (*allReduce)(const void*, void*, size_t, int, int, void*, void*);
	int (*reduceScatter)(const void*, void*, size_t, int, int, void*, void*);
	int (*allGather)(const void*, void*, size_t, int, void*, void*);
	int (*broadcast)(const void*, void*, size_t, int, int, void*, void*);
} tg_nccl;

typedef struct { const char* name; size_t off; } tg_sym; // as in driver.go
int tg_open(const char* path, void* tab, const tg_sym* syms, size_t nsyms, char* err, size_t errlen); // driver.go

static const tg_sym tg_nccl_syms[] = {
	{"ncclGetVersion", offsetof(tg_nccl, getVersion)},
	{"ncclGetUniqueId", offsetof(tg_nccl, getUniqueId)},
	{"ncclCommInitRank", offsetof(tg_nccl, commInitRank)},
	{"ncclCommDestroy", offsetof(tg_nccl, commDestroy)},
	{"ncclCommAbort", offsetof(tg_nccl, commAbort)},
	{"ncclGetErrorString", offsetof(tg_nccl, getErrorString)},
	{"ncclAllReduce", offsetof(tg_nccl, allReduce)},
	{"ncclReduceScatter", offsetof(tg_nccl, reduceScatter)},
	{"ncclAllGather", offsetof(tg_nccl, allGather)},
	{"ncclBroadcast", offsetof(tg_nccl, broadcast)},
};

static const tg_sym* tg_nccl_table(size_t* n) {
	*n = sizeof tg_nccl_syms / sizeof tg_nccl_syms[0];
	return tg_nccl_syms;
}

static const char* tg_nccl_err(tg_nccl* n, int code) { return n->getErrorString(code); }
static int tg_nccl_version(tg_nccl* n, int* v) { return n->getVersion(v); }
static int tg_nccl_unique_id(tg_nccl* n, tg_nccl_id* id) { return n->getUniqueId(id); }

static int tg_nccl_init(tg_nccl* n, void* setctx, void* ctx, void** comm, int nranks, const tg_nccl_id* id, int rank) {
	int r = ((tg_setctx)setctx)(ctx);
	if (r) return -1000 - r;  // a CUresult, not an ncclResult_t
	return n->commInitRank(comm, nranks, *id, rank);
}
static int tg_nccl_destroy(tg_nccl* n, void* setctx, void* ctx, void* comm, int abort) {
	((tg_setctx)setctx)(ctx);
	return abort ? n->commAbort(comm) : n->commDestroy(comm);
}
static int tg_nccl_all_reduce(tg_nccl* n, void* setctx, void* ctx, void* comm, void* stream,
                              unsigned long long buf, size_t count, int dtype) {
	((tg_setctx)setctx)(ctx);
	return n->allReduce((const void*)buf, (void*)buf, count, dtype, 0, comm, stream);
}
static int tg_nccl_reduce_scatter(tg_nccl* n, void* setctx, void* ctx, void* comm, void* stream,
                                  unsigned long long src, unsigned long long dst, size_t count, int dtype) {
	((tg_setctx)setctx)(ctx);
	return n->reduceScatter((const void*)src, (void*)dst, count, dtype, 0, comm, stream);
}
static int tg_nccl_all_gather(tg_nccl* n, void* setctx, void* ctx, void* comm, void* stream,
                              unsigned long long src, unsigned long long dst, size_t count, int dtype) {
	((tg_setctx)setctx)(ctx);
	return n->allGather((const void*)src, (void*)dst, count, dtype, comm, stream);
}
static int tg_nccl_broadcast(tg_nccl* n, void* setctx, void* ctx, void* comm, void* stream,
                             unsigned long long buf, size_t count, int dtype, int root) {
	((tg_setctx)setctx)(ctx);
	return n->broadcast((const void*)buf, (void*)buf, count, dtype, root, comm, stream);
}
*/
import "C"

import (
	"errors"
	"fmt"
	"os"
	"unsafe"

	"github.com/tracegrpo/tracegrpo/collective"
	"github.com/tracegrpo/tracegrpo/kernels"
)

// ncclDataType_t and ncclRedOp_t values (nccl.h).
const (
	ncclInt32    = 2
	ncclFloat32  = 7
	ncclBfloat16 = 9
)

// ncclLib is a loaded NCCL.
type ncclLib struct {
	path    string
	choice  LibraryChoice
	n       *C.tg_nccl
	version int
}

// openNCCLLib loads NCCL: path, else $TRACEGRPO_NCCL_LIB, else the first
// libnccl.so.2 libsearch.go's search finds that loads (the nvidia-nccl pip
// wheels' nvidia/nccl/lib under any Python environment included).
func openNCCLLib(path string) (*ncclLib, error) {
	if path == "" {
		path = os.Getenv("TRACEGRPO_NCCL_LIB")
	}
	var cands []libCandidate
	if path == "" {
		cands = hostSearch.candidates(ncclSpec)
	}
	n := (*C.tg_nccl)(C.calloc(1, C.size_t(unsafe.Sizeof(C.tg_nccl{}))))
	var nsyms C.size_t
	syms := C.tg_nccl_table(&nsyms)
	choice, _, err := openLib(ncclSpec, path, cands, nil, unsafe.Pointer(n), unsafe.Pointer(syms), nsyms, nil,
		"pip install nvidia-nccl-cu13 (or nvidia-nccl-cu12), or set TRACEGRPO_NCCL_LIB to libnccl.so.2")
	if err != nil {
		C.free(unsafe.Pointer(n))
		return nil, err
	}
	var v C.int
	C.tg_nccl_version(n, &v)
	return &ncclLib{path: choice.Path, choice: choice, n: n, version: int(v)}, nil
}

func (l *ncclLib) errText(code C.int) string {
	if code <= -1000 {
		return fmt.Sprintf("making the context current failed (CUresult %d)", -1000-code)
	}
	return fmt.Sprintf("%s (ncclResult %d)", C.GoString(C.tg_nccl_err(l.n, code)), code)
}

// ncclComm is a NCCL communicator on a backend's device and stream.
type ncclComm struct {
	b          *Backend
	lib        *ncclLib
	comm       unsafe.Pointer
	rank, size int
	one        kernels.Buf // (1) I32 for Barrier
	closed     bool

	// Overlap (collective.Overlapper): the async collectives run on a
	// stream of their own, ordered against the compute stream by events
	// taken from a pool (an event can be recorded again as soon as the
	// wait on it is queued).
	stream unsafe.Pointer
	events []event
}

// OpenNCCL creates the NCCL communicator of opt.Rank of opt.Size on be's
// device (the caller opened be, a CUDA backend, on the local rank's
// device). Every rank must call it; it returns once all have.
func OpenNCCL(be kernels.Backend, opt NCCLOptions) (collective.Comm, error) {
	b, ok := be.(*Backend)
	if !ok {
		return nil, fmt.Errorf("cuda: NCCL runs on the cuda backend, not %s", be.Name())
	}
	if opt.Size < 1 || opt.Rank < 0 || opt.Rank >= opt.Size {
		return nil, fmt.Errorf("cuda: NCCL rank %d of %d", opt.Rank, opt.Size)
	}
	lib, err := openNCCLLib(opt.Lib)
	if err != nil {
		return nil, err
	}
	var id C.tg_nccl_id
	if opt.CommID != "" {
		// NCCL derives the id from NCCL_COMM_ID on every rank, and rank 0's
		// ncclCommInitRank listens there.
		if err := os.Setenv("NCCL_COMM_ID", opt.CommID); err != nil {
			return nil, err
		}
		if rc := C.tg_nccl_unique_id(lib.n, &id); rc != 0 {
			return nil, fmt.Errorf("cuda: ncclGetUniqueId with NCCL_COMM_ID=%s: %s", opt.CommID, lib.errText(rc))
		}
	} else {
		if opt.ShareID == nil {
			return nil, errors.New("cuda: NCCL needs NCCL_COMM_ID or MASTER_ADDR (its bootstrap address), or MPI to share its id")
		}
		mine := make([]byte, NCCLIDBytes)
		if opt.Rank == 0 {
			if rc := C.tg_nccl_unique_id(lib.n, &id); rc != 0 {
				return nil, fmt.Errorf("cuda: ncclGetUniqueId: %s", lib.errText(rc))
			}
			copy(mine, C.GoBytes(unsafe.Pointer(&id), NCCLIDBytes))
		}
		got, err := opt.ShareID(mine)
		if err != nil {
			return nil, fmt.Errorf("cuda: share NCCL's id: %w", err)
		}
		if len(got) != NCCLIDBytes {
			return nil, fmt.Errorf("cuda: NCCL's id came back as %d bytes", len(got))
		}
		C.memcpy(unsafe.Pointer(&id), unsafe.Pointer(&got[0]), NCCLIDBytes)
	}
	c := &ncclComm{b: b, lib: lib, rank: opt.Rank, size: opt.Size}
	b.mu.Lock()
	rc := C.tg_nccl_init(lib.n, b.d.setCtxFn(), b.d.ctx, &c.comm, C.int(opt.Size), &id, C.int(opt.Rank))
	b.mu.Unlock()
	if rc != 0 {
		return nil, fmt.Errorf("cuda: ncclCommInitRank (rank %d of %d, %s): %s", opt.Rank, opt.Size, lib.path, lib.errText(rc))
	}
	if c.one, err = b.Alloc(kernels.I32, 1); err != nil {
		c.Close()
		return nil, err
	}
	return c, nil
}

func (c *ncclComm) Rank() int    { return c.rank }
func (c *ncclComm) Size() int    { return c.size }
func (c *ncclComm) Name() string { return "nccl" }

func ncclType(dt kernels.DType) (C.int, error) {
	switch dt {
	case kernels.F32:
		return ncclFloat32, nil
	case kernels.I32:
		return ncclInt32, nil
	case kernels.BF16:
		return ncclBfloat16, nil
	}
	return 0, fmt.Errorf("cuda: NCCL of %s buffers", dt)
}

// run queues one NCCL call on the backend's stream.
func (c *ncclComm) run(what string, dt kernels.DType, f func(t C.int) C.int) error {
	t, err := ncclType(dt)
	if err != nil {
		return err
	}
	c.b.mu.Lock()
	defer c.b.mu.Unlock()
	if c.closed {
		return fmt.Errorf("cuda: %s after Close", what)
	}
	if rc := f(t); rc != 0 {
		return fmt.Errorf("cuda: %s: %s", what, c.lib.errText(rc))
	}
	return nil
}

func (c *ncclComm) AllReduceSum(buf kernels.Buf) error {
	if buf.N == 0 {
		return nil
	}
	return c.run("ncclAllReduce", buf.DType, func(t C.int) C.int {
		return C.tg_nccl_all_reduce(c.lib.n, c.b.d.setCtxFn(), c.b.d.ctx, c.comm, c.b.d.stream, C.ulonglong(ptr(buf)), C.size_t(buf.N), t)
	})
}

func (c *ncclComm) ReduceScatterSum(dst, src kernels.Buf) error {
	if src.N != dst.N*c.size || src.DType != dst.DType {
		return fmt.Errorf("cuda: reduce-scatter of %d × %s into %d × %s over %d ranks", src.N, src.DType, dst.N, dst.DType, c.size)
	}
	if dst.N == 0 {
		return nil
	}
	return c.run("ncclReduceScatter", dst.DType, func(t C.int) C.int {
		return C.tg_nccl_reduce_scatter(c.lib.n, c.b.d.setCtxFn(), c.b.d.ctx, c.comm, c.b.d.stream,
			C.ulonglong(ptr(src)), C.ulonglong(ptr(dst)), C.size_t(dst.N), t)
	})
}

func (c *ncclComm) AllGather(dst, src kernels.Buf) error {
	if dst.N != src.N*c.size || src.DType != dst.DType {
		return fmt.Errorf("cuda: all-gather of %d × %s into %d × %s over %d ranks", src.N, src.DType, dst.N, dst.DType, c.size)
	}
	if src.N == 0 {
		return nil
	}
	return c.run("ncclAllGather", src.DType, func(t C.int) C.int {
		return C.tg_nccl_all_gather(c.lib.n, c.b.d.setCtxFn(), c.b.d.ctx, c.comm, c.b.d.stream,
			C.ulonglong(ptr(src)), C.ulonglong(ptr(dst)), C.size_t(src.N), t)
	})
}

func (c *ncclComm) Broadcast(buf kernels.Buf, root int) error {
	if root < 0 || root >= c.size {
		return fmt.Errorf("cuda: broadcast from rank %d of %d", root, c.size)
	}
	if buf.N == 0 {
		return nil
	}
	return c.run("ncclBroadcast", buf.DType, func(t C.int) C.int {
		return C.tg_nccl_broadcast(c.lib.n, c.b.d.setCtxFn(), c.b.d.ctx, c.comm, c.b.d.stream, C.ulonglong(ptr(buf)), C.size_t(buf.N), t, C.int(root))
	})
}

// ncclPending is an async collective: done is recorded on the comm
// stream after it.
type ncclPending struct {
	c    *ncclComm
	done event
}

// Wait makes the compute stream wait for the collective.
func (p *ncclPending) Wait() error {
	c := p.c
	c.b.mu.Lock()
	defer c.b.mu.Unlock()
	if p.done.p == nil {
		return nil
	}
	err := c.b.d.streamAfter(c.b.d.stream, c.stream, p.done)
	c.events = append(c.events, p.done)
	p.done = event{}
	return err
}

// event takes an event from the pool (b.mu held).
func (c *ncclComm) event() (event, error) {
	if n := len(c.events); n > 0 {
		e := c.events[n-1]
		c.events = c.events[:n-1]
		return e, nil
	}
	return c.b.d.newEvent()
}

// async queues f on the comm stream after everything queued on the
// compute stream so far, and returns its pending completion.
func (c *ncclComm) async(what string, dt kernels.DType, f func(t C.int, stream unsafe.Pointer) C.int) (collective.Pending, error) {
	t, err := ncclType(dt)
	if err != nil {
		return nil, err
	}
	c.b.mu.Lock()
	defer c.b.mu.Unlock()
	if c.closed {
		return nil, fmt.Errorf("cuda: %s after Close", what)
	}
	if c.stream == nil {
		if c.stream, err = c.b.d.newStream(); err != nil {
			return nil, err
		}
	}
	ready, err := c.event()
	if err != nil {
		return nil, err
	}
	if err := c.b.d.streamAfter(c.stream, c.b.d.stream, ready); err != nil {
		return nil, err
	}
	c.events = append(c.events, ready) // the wait is queued: it may be recorded again
	if rc := f(t, c.stream); rc != 0 {
		return nil, fmt.Errorf("cuda: %s: %s", what, c.lib.errText(rc))
	}
	done, err := c.event()
	if err != nil {
		return nil, err
	}
	if err := c.b.d.recordOn(done, c.stream); err != nil {
		return nil, err
	}
	return &ncclPending{c: c, done: done}, nil
}

// AllGatherAsync is AllGather on the comm stream (collective.Overlapper).
func (c *ncclComm) AllGatherAsync(dst, src kernels.Buf) (collective.Pending, error) {
	if dst.N != src.N*c.size || src.DType != dst.DType {
		return nil, fmt.Errorf("cuda: all-gather of %d × %s into %d × %s over %d ranks", src.N, src.DType, dst.N, dst.DType, c.size)
	}
	if src.N == 0 {
		return nil, nil
	}
	return c.async("ncclAllGather", src.DType, func(t C.int, stream unsafe.Pointer) C.int {
		return C.tg_nccl_all_gather(c.lib.n, c.b.d.setCtxFn(), c.b.d.ctx, c.comm, stream,
			C.ulonglong(ptr(src)), C.ulonglong(ptr(dst)), C.size_t(src.N), t)
	})
}

// ReduceScatterSumAsync is ReduceScatterSum on the comm stream
// (collective.Overlapper).
func (c *ncclComm) ReduceScatterSumAsync(dst, src kernels.Buf) (collective.Pending, error) {
	if src.N != dst.N*c.size || src.DType != dst.DType {
		return nil, fmt.Errorf("cuda: reduce-scatter of %d × %s into %d × %s over %d ranks", src.N, src.DType, dst.N, dst.DType, c.size)
	}
	if dst.N == 0 {
		return nil, nil
	}
	return c.async("ncclReduceScatter", dst.DType, func(t C.int, stream unsafe.Pointer) C.int {
		return C.tg_nccl_reduce_scatter(c.lib.n, c.b.d.setCtxFn(), c.b.d.ctx, c.comm, stream,
			C.ulonglong(ptr(src)), C.ulonglong(ptr(dst)), C.size_t(dst.N), t)
	})
}

// Barrier is an all-reduce of one int followed by a wait for the stream:
// NCCL has no barrier of its own.
func (c *ncclComm) Barrier() error {
	if err := c.AllReduceSum(c.one); err != nil {
		return err
	}
	return c.b.Sync()
}

// Abort ends the communicator at once (ncclCommAbort), without waiting
// for the other ranks; their launcher (torchrun, srun --kill-on-bad-exit)
// ends them.
func (c *ncclComm) Abort(int) { c.close(true) }

// Close destroys the communicator.
func (c *ncclComm) Close() error { return c.close(false) }

func (c *ncclComm) close(abort bool) error {
	c.b.mu.Lock()
	if c.closed {
		c.b.mu.Unlock()
		return nil
	}
	c.closed = true
	what, ab := "ncclCommDestroy", C.int(0)
	if abort {
		what, ab = "ncclCommAbort", 1
	}
	rc := C.tg_nccl_destroy(c.lib.n, c.b.d.setCtxFn(), c.b.d.ctx, c.comm, ab)
	for _, e := range c.events {
		c.b.d.destroyEvent(e)
	}
	c.events = nil
	if c.stream != nil {
		c.b.d.destroyStream(c.stream)
		c.stream = nil
	}
	c.b.mu.Unlock()
	if c.one.N > 0 {
		c.b.Free(c.one)
	}
	if rc != 0 {
		return fmt.Errorf("cuda: %s: %s", what, c.lib.errText(rc))
	}
	return nil
}
