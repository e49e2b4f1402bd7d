//go:build cgo

// Package mpi runs dist's collectives over Open MPI, on the CPU backend's
// host buffers. Open MPI is loaded at run time (dlopen of libmpi.so.40,
// Open MPI 4.x and 5.x's soname, RTLD_GLOBAL so that its plugins find its
// symbols) with prototypes written here, like kernels/cuda binds the CUDA
// driver: the binary builds without MPI's headers and starts without MPI
// installed; only a run that asks for MPI needs it.
//
// The handles are Open MPI's (MPI_COMM_WORLD is the address of the global
// ompi_mpi_comm_world, and so on); MPICH's integer handles are not
// supported. MPI is initialized with MPI_THREAD_SERIALIZED and every call
// is made under one mutex, so any goroutine on any OS thread may call.
package mpi

/*
#cgo LDFLAGS: -ldl
#include <dlfcn.h>
#include <stddef.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

typedef void* tg_h;

typedef struct {
	void* lib;
	int (*Initialized)(int*);
	int (*Init_thread)(int*, char***, int, int*);
	int (*Comm_rank)(tg_h, int*);
	int (*Comm_size)(tg_h, int*);
	int (*Allreduce)(const void*, void*, int, tg_h, tg_h, tg_h);
	int (*Reduce_scatter_block)(const void*, void*, int, tg_h, tg_h, tg_h);
	int (*Bcast)(void*, int, tg_h, int, tg_h);
	int (*Sendrecv)(const void*, int, tg_h, int, int, void*, int, tg_h, int, int, tg_h, void*);
	int (*Barrier)(tg_h);
	int (*Abort)(tg_h, int);
	int (*Finalize)(void);
	int (*Error_string)(int, char*, int*);
	tg_h world, f32, i32, byte, sum;
} tg_mpi;

static const struct { const char* name; size_t off; } tg_mpi_syms[] = {
	{"MPI_Initialized", offsetof(tg_mpi, Initialized)},
	{"MPI_Init_thread", offsetof(tg_mpi, Init_thread)},
	{"MPI_Comm_rank", offsetof(tg_mpi, Comm_rank)},
	{"MPI_Comm_size", offsetof(tg_mpi, Comm_size)},
	{"MPI_Allreduce", offsetof(tg_mpi, Allreduce)},
	{"MPI_Reduce_scatter_block", offsetof(tg_mpi, Reduce_scatter_block)},
	{"MPI_Bcast", offsetof(tg_mpi, Bcast)},
	{"MPI_Sendrecv", offsetof(tg_mpi, Sendrecv)},
	{"MPI_Barrier", offsetof(tg_mpi, Barrier)},
	{"MPI_Abort", offsetof(tg_mpi, Abort)},
	{"MPI_Finalize", offsetof(tg_mpi, Finalize)},
	{"MPI_Error_string", offsetof(tg_mpi, Error_string)},
	{"ompi_mpi_comm_world", offsetof(tg_mpi, world)},
	{"ompi_mpi_float", offsetof(tg_mpi, f32)},
	{"ompi_mpi_int", offsetof(tg_mpi, i32)},
	{"ompi_mpi_byte", offsetof(tg_mpi, byte)},
	{"ompi_mpi_op_sum", offsetof(tg_mpi, sum)},
};

// tg_mpi_open loads path into m. 0: ok; 1: dlopen failed; 2: a symbol is
// missing; err gets the reason.
static int tg_mpi_open(const char* path, tg_mpi* m, char* err, size_t errlen) {
	void* lib = dlopen(path, RTLD_NOW | RTLD_GLOBAL);
	if (!lib) {
		const char* e = dlerror();
		snprintf(err, errlen, "%s", e ? e : "dlopen failed");
		return 1;
	}
	for (size_t i = 0; i < sizeof tg_mpi_syms / sizeof tg_mpi_syms[0]; i++) {
		void* sym = dlsym(lib, tg_mpi_syms[i].name);
		if (!sym) {
			snprintf(err, errlen, "%s", tg_mpi_syms[i].name);
			dlclose(lib);
			return 2;
		}
		*(void**)((char*)m + tg_mpi_syms[i].off) = sym;
	}
	m->lib = lib;
	return 0;
}

enum { TG_THREAD_SERIALIZED = 2 };
#define TG_IN_PLACE ((void*)1)

static int tg_mpi_init(tg_mpi* m, int* provided, int* rank, int* size) {
	int done = 0, r;
	if ((r = m->Initialized(&done))) return r;
	if (!done && (r = m->Init_thread(NULL, NULL, TG_THREAD_SERIALIZED, provided))) return r;
	if (done) *provided = TG_THREAD_SERIALIZED;
	if ((r = m->Comm_rank(m->world, rank))) return r;
	return m->Comm_size(m->world, size);
}

// kind: 0 float32, 1 int32, 2 bytes (bf16 is moved as two bytes an element).
static tg_h tg_type(tg_mpi* m, int kind) { return kind == 2 ? m->byte : kind == 1 ? m->i32 : m->f32; }

static int tg_allreduce(tg_mpi* m, void* buf, int n, int i32) {
	return m->Allreduce(TG_IN_PLACE, buf, n, tg_type(m, i32), m->sum, m->world);
}
static int tg_reduce_scatter(tg_mpi* m, const void* src, void* dst, int n, int i32) {
	return m->Reduce_scatter_block(src, dst, n, tg_type(m, i32), m->sum, m->world);
}
// tg_reduce_scatter_ring sums src (size·n floats) over the ranks into dst
// (n), rank r getting block r, along a ring: in step s each rank sends its
// running sum of block (r−s−1) mod size to the next rank and adds its own
// src to the sum of block (r−s−2) mod size received from the previous one;
// after size−1 steps dst holds block r summed over every rank. Each
// element is summed once, in one order, and only its owner keeps it; the
// only scratch is n floats (tmp), where Open MPI's own algorithms allocate
// the whole src on some rank.
static int tg_reduce_scatter_ring(tg_mpi* m, const float* src, float* dst, float* tmp, int n, int rank, int size) {
	int next = (rank + 1) % size, prev = (rank + size - 1) % size;
	int blk = ((rank - 1) % size + size) % size;
	memcpy(dst, src + (size_t)blk * n, (size_t)n * sizeof(float));
	for (int s = 0; s < size - 1; s++) {
		int r = m->Sendrecv(dst, n, m->f32, next, 7, tmp, n, m->f32, prev, 7, m->world, (void*)0);
		if (r) return r;
		blk = ((rank - s - 2) % size + size) % size;
		const float* own = src + (size_t)blk * n;
		for (int i = 0; i < n; i++) dst[i] = tmp[i] + own[i];
	}
	return 0;
}

// tg_allreduce_ring sums buf (n floats) over the ranks in place along a
// ring: a reduce-scatter of size blocks (block b is [b·n/size,
// (b+1)·n/size)), in step s each rank sending its running sum of block
// (r−s) mod size to the next rank and adding the previous one's sum of
// block (r−s−1) mod size to its own; then an all-gather of the summed
// blocks, each received straight into its place. Every step moves its
// block in pieces of at most chunk floats (the same count of pieces on
// every rank), so the only scratch is chunk floats (tmp), where Open MPI's
// own algorithms allocate a temporary of up to the whole buffer. Each
// element is summed once, in one order, and every rank gets its bits.
static int tg_allreduce_ring(tg_mpi* m, float* buf, int n, float* tmp, int chunk, int rank, int size) {
	int next = (rank + 1) % size, prev = (rank + size - 1) % size;
#define TG_LO(b) ((int)((long long)(b) * n / size))
	int pieces = ((n + size - 1) / size + chunk - 1) / chunk;
	for (int s = 0; s < size - 1; s++) {
		int sb = ((rank - s) % size + size) % size, rb = ((rank - s - 1) % size + size) % size;
		int slo = TG_LO(sb), sn = TG_LO(sb + 1) - slo, rlo = TG_LO(rb), rn = TG_LO(rb + 1) - rlo;
		for (int p = 0; p < pieces; p++) {
			int off = p * chunk;
			int sc = sn - off, rc = rn - off;
			sc = sc < 0 ? 0 : sc > chunk ? chunk : sc;
			rc = rc < 0 ? 0 : rc > chunk ? chunk : rc;
			int r = m->Sendrecv(buf + slo + (sc ? off : 0), sc, m->f32, next, 9, tmp, rc, m->f32, prev, 9, m->world, (void*)0);
			if (r) return r;
			float* d = buf + rlo + off;
			for (int i = 0; i < rc; i++) d[i] += tmp[i];
		}
	}
	for (int s = 0; s < size - 1; s++) {
		int sb = ((rank + 1 - s) % size + size) % size, rb = ((rank - s) % size + size) % size;
		int r = m->Sendrecv(buf + TG_LO(sb), TG_LO(sb + 1) - TG_LO(sb), m->f32, next, 10,
			buf + TG_LO(rb), TG_LO(rb + 1) - TG_LO(rb), m->f32, prev, 10, m->world, (void*)0);
		if (r) return r;
	}
#undef TG_LO
	return 0;
}

// tg_allgather_ring gathers every rank's n elements of kind (see tg_type)
// into dst in rank order over a ring of MPI_Sendrecv: size-1 steps, each
// passing on the block received last, straight into its place in dst.
// Open MPI's own MPI_Allgather picks Bruck's algorithm for some world
// sizes (3 ranks), where every rank but 0 allocates a temporary as large
// as dst: memory no plan counts.
static int tg_allgather_ring(tg_mpi* m, const void* src, void* dst, int n, int kind, int rank, int size) {
	size_t bytes = (size_t)n * (kind == 2 ? 1 : 4);
	char* d = dst;
	memmove(d + (size_t)rank * bytes, src, bytes);
	int next = (rank + 1) % size, prev = (rank + size - 1) % size;
	for (int s = 0; s < size - 1; s++) {
		int sb = (rank - s + size) % size, rb = (rank - s - 1 + size) % size;
		int r = m->Sendrecv(d + (size_t)sb * bytes, n, tg_type(m, kind), next, 8,
			d + (size_t)rb * bytes, n, tg_type(m, kind), prev, 8, m->world, (void*)0);
		if (r) return r;
	}
	return 0;
}
static int tg_bcast(tg_mpi* m, void* buf, int n, int i32, int root) {
	return m->Bcast(buf, n, tg_type(m, i32), root, m->world);
}
static int tg_barrier(tg_mpi* m) { return m->Barrier(m->world); }
static int tg_abort(tg_mpi* m, int code) { return m->Abort(m->world, code); }
static int tg_finalize(tg_mpi* m) { return m->Finalize(); }
static void tg_errstr(tg_mpi* m, int code, char* buf, int len) {
	int n = 0;
	buf[0] = 0;
	if (m->Error_string(code, buf, &n) == 0 && n < len) buf[n] = 0;
}
*/
import "C"

import (
	"fmt"
	"math"
	"os"
	"sync"
	"unsafe"

	"github.com/tracegrpo/tracegrpo/collective"
	"github.com/tracegrpo/tracegrpo/kernels"
	"github.com/tracegrpo/tracegrpo/kernels/cpu"
)

// DefaultLib is the library Open loads when $TRACEGRPO_MPI_LIB is unset.
const DefaultLib = "libmpi.so.40"

// lib is the process's MPI: initialized once, finalized once.
var lib struct {
	sync.Mutex
	m          *C.tg_mpi
	path       string
	rank, size int
	err        error
	finalized  bool
}

// Open initializes MPI (once per process) and returns the world
// communicator over b's buffers. libPath "" means $TRACEGRPO_MPI_LIB, else
// DefaultLib on the loader's path.
func Open(b *cpu.Backend, libPath string) (collective.Comm, error) {
	lib.Lock()
	defer lib.Unlock()
	if lib.m == nil && lib.err == nil {
		lib.err = load(libPath)
	}
	if lib.err != nil {
		return nil, lib.err
	}
	if lib.finalized {
		return nil, fmt.Errorf("mpi: MPI was finalized; it cannot be initialized twice in one process")
	}
	return &comm{b: b}, nil
}

func load(path string) error {
	if path == "" {
		path = os.Getenv("TRACEGRPO_MPI_LIB")
	}
	if path == "" {
		path = DefaultLib
	}
	m := (*C.tg_mpi)(C.calloc(1, C.size_t(unsafe.Sizeof(C.tg_mpi{}))))
	cpath := C.CString(path)
	defer C.free(unsafe.Pointer(cpath))
	var buf [512]C.char
	switch C.tg_mpi_open(cpath, m, &buf[0], C.size_t(len(buf))) {
	case 0:
	case 1:
		C.free(unsafe.Pointer(m))
		return fmt.Errorf("mpi: load %q: %s (install Open MPI: Debian package openmpi-bin; or set TRACEGRPO_MPI_LIB)", path, C.GoString(&buf[0]))
	default:
		C.free(unsafe.Pointer(m))
		return fmt.Errorf("mpi: load %q: the library has no symbol %s (tracegrpo binds Open MPI 4 or 5; MPICH is not supported)", path, C.GoString(&buf[0]))
	}
	var provided, rank, size C.int
	if r := C.tg_mpi_init(m, &provided, &rank, &size); r != 0 {
		return fmt.Errorf("mpi: MPI_Init_thread: %s", errText(m, r))
	}
	if provided < C.TG_THREAD_SERIALIZED {
		return fmt.Errorf("mpi: MPI_Init_thread provided thread level %d, tracegrpo needs MPI_THREAD_SERIALIZED (2)", provided)
	}
	lib.m, lib.path, lib.rank, lib.size = m, path, int(rank), int(size)
	return nil
}

func errText(m *C.tg_mpi, code C.int) string {
	var buf [256]C.char
	C.tg_errstr(m, code, &buf[0], C.int(len(buf)))
	if s := C.GoString(&buf[0]); s != "" {
		return fmt.Sprintf("%s (error %d)", s, code)
	}
	return fmt.Sprintf("error %d", code)
}

// comm is MPI_COMM_WORLD over a CPU backend's host buffers.
type comm struct {
	b       *cpu.Backend
	scratch []float32 // the reduce-scatter ring's received block
	chunk   []float32 // the all-reduce ring's received piece
}

func (c *comm) Rank() int    { return lib.rank }
func (c *comm) Size() int    { return lib.size }
func (c *comm) Name() string { return "mpi" }

// host returns the address and kind of a CPU buffer after the backend's
// queued work is done.
func (c *comm) host(buf kernels.Buf, what string) (unsafe.Pointer, C.int, error) {
	if err := c.b.Sync(); err != nil {
		return nil, 0, err
	}
	if buf.N > math.MaxInt32 {
		return nil, 0, fmt.Errorf("mpi: %s of %d elements exceeds MPI's int count", what, buf.N)
	}
	switch buf.DType {
	case kernels.F32:
		s := c.b.F32(buf)
		if len(s) == 0 {
			return nil, 0, nil
		}
		return unsafe.Pointer(&s[0]), 0, nil
	case kernels.I32:
		s := c.b.I32(buf)
		if len(s) == 0 {
			return nil, 1, nil
		}
		return unsafe.Pointer(&s[0]), 1, nil
	case kernels.BF16:
		if what != "MPI_Allgather" && what != "MPI_Bcast" {
			break // sums are F32 or I32
		}
		s := c.b.BF16(buf)
		if len(s) == 0 {
			return nil, 2, nil
		}
		return unsafe.Pointer(&s[0]), 2, nil
	}
	return nil, 0, fmt.Errorf("mpi: %s of %s buffers (F32 and I32; bf16 is gathered and broadcast, never summed)", what, buf.DType)
}

func (c *comm) call(what string, f func() C.int) error {
	lib.Lock()
	defer lib.Unlock()
	if lib.finalized {
		return fmt.Errorf("mpi: %s after Close", what)
	}
	if r := f(); r != 0 {
		return fmt.Errorf("mpi: %s: %s", what, errText(lib.m, r))
	}
	return nil
}

// AllReduceSum sums F32 over a ring of MPI_Sendrecv (tg_allreduce_ring:
// scratch of one block, at most collective.HostAllReduceChunk floats,
// which the comm keeps) and I32 with MPI_Allreduce.
func (c *comm) AllReduceSum(buf kernels.Buf) error {
	p, k, err := c.host(buf, "MPI_Allreduce")
	if err != nil || buf.N == 0 {
		return err
	}
	if k != 0 || lib.size == 1 {
		return c.call("MPI_Allreduce", func() C.int { return C.tg_allreduce(lib.m, p, C.int(buf.N), k) })
	}
	if piece := min((buf.N+lib.size-1)/lib.size, collective.HostAllReduceChunk); cap(c.chunk) < piece {
		c.chunk = make([]float32, piece)
	}
	tmp := unsafe.Pointer(&c.chunk[0])
	return c.call("MPI_Sendrecv (all-reduce ring)", func() C.int {
		return C.tg_allreduce_ring(lib.m, (*C.float)(p), C.int(buf.N), (*C.float)(tmp), C.int(cap(c.chunk)), C.int(lib.rank), C.int(lib.size))
	})
}

// ReduceScatterSum sums F32 over a ring of MPI_Sendrecv (see
// tg_reduce_scatter_ring: scratch of one block, which the comm keeps) and
// I32 with MPI_Reduce_scatter_block.
func (c *comm) ReduceScatterSum(dst, src kernels.Buf) error {
	if src.N != dst.N*lib.size || src.DType != dst.DType {
		return fmt.Errorf("mpi: reduce-scatter of %d × %s into %d × %s over %d ranks", src.N, src.DType, dst.N, dst.DType, lib.size)
	}
	s, k, err := c.host(src, "MPI_Reduce_scatter_block")
	if err != nil || dst.N == 0 {
		return err
	}
	d, _, err := c.host(dst, "MPI_Reduce_scatter_block")
	if err != nil {
		return err
	}
	if k != 0 || lib.size == 1 {
		return c.call("MPI_Reduce_scatter_block", func() C.int { return C.tg_reduce_scatter(lib.m, s, d, C.int(dst.N), k) })
	}
	if cap(c.scratch) < dst.N {
		c.scratch = make([]float32, dst.N)
	}
	tmp := unsafe.Pointer(&c.scratch[0])
	return c.call("MPI_Sendrecv (reduce-scatter ring)", func() C.int {
		return C.tg_reduce_scatter_ring(lib.m, (*C.float)(s), (*C.float)(d), (*C.float)(tmp), C.int(dst.N), C.int(lib.rank), C.int(lib.size))
	})
}

// ScratchBytes is the host memory the comm keeps for its collectives: one
// block of the largest reduce-scatter so far, and the all-reduce's piece.
func (c *comm) ScratchBytes() int64 { return 4 * int64(cap(c.scratch)+cap(c.chunk)) }

// AllGather gathers over a ring of MPI_Sendrecv (tg_allgather_ring): it
// needs no memory beyond dst, whatever the world size.
func (c *comm) AllGather(dst, src kernels.Buf) error {
	if dst.N != src.N*lib.size || src.DType != dst.DType {
		return fmt.Errorf("mpi: all-gather of %d × %s into %d × %s over %d ranks", src.N, src.DType, dst.N, dst.DType, lib.size)
	}
	s, k, err := c.host(src, "MPI_Allgather")
	if err != nil || src.N == 0 {
		return err
	}
	d, _, err := c.host(dst, "MPI_Allgather")
	if err != nil {
		return err
	}
	n := src.N
	if k == 2 {
		n *= 2
	}
	if n > math.MaxInt32 {
		return fmt.Errorf("mpi: MPI_Allgather of %d bytes exceeds MPI's int count", n)
	}
	return c.call("MPI_Sendrecv (all-gather ring)", func() C.int {
		return C.tg_allgather_ring(lib.m, s, d, C.int(n), k, C.int(lib.rank), C.int(lib.size))
	})
}

func (c *comm) Broadcast(buf kernels.Buf, root int) error {
	if root < 0 || root >= lib.size {
		return fmt.Errorf("mpi: broadcast from rank %d of %d", root, lib.size)
	}
	p, k, err := c.host(buf, "MPI_Bcast")
	if err != nil || buf.N == 0 {
		return err
	}
	n := buf.N
	if k == 2 {
		n *= 2
	}
	if n > math.MaxInt32 {
		return fmt.Errorf("mpi: MPI_Bcast of %d bytes exceeds MPI's int count", n)
	}
	return c.call("MPI_Bcast", func() C.int { return C.tg_bcast(lib.m, p, C.int(n), k, C.int(root)) })
}

func (c *comm) Barrier() error {
	if err := c.b.Sync(); err != nil {
		return err
	}
	return c.call("MPI_Barrier", func() C.int { return C.tg_barrier(lib.m) })
}

// Abort ends every rank of the job at once (MPI_Abort): a rank that failed
// calls it so that the others do not wait forever in a collective.
func (c *comm) Abort(code int) {
	lib.Lock()
	defer lib.Unlock()
	if !lib.finalized {
		C.tg_abort(lib.m, C.int(code))
	}
}

// Close finalizes MPI (once per process).
func (c *comm) Close() error {
	lib.Lock()
	defer lib.Unlock()
	if lib.finalized {
		return nil
	}
	lib.finalized = true
	if r := C.tg_finalize(lib.m); r != 0 {
		return fmt.Errorf("mpi: MPI_Finalize: %s", errText(lib.m, r))
	}
	return nil
}
