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
#include <time.h>

typedef void* tg_h;

typedef struct {
	void* lib;
	int (*Initialized)(int*);
	int (*Init_thread)(int*, char***, int, int*);
	int (*Comm_rank)(tg_h, int*);
	int (*Comm_size)(tg_h, int*);
	int (*Isend)(const void*, int, tg_h, int, int, tg_h, tg_h*);
	int (*Irecv)(void*, int, tg_h, int, int, tg_h, tg_h*);
	int (*Test)(tg_h*, int*, void*);
	int (*Testall)(int, tg_h*, int*, void*);
	int (*Iallreduce)(const void*, void*, int, tg_h, tg_h, tg_h, tg_h*);
	int (*Ireduce_scatter_block)(const void*, void*, int, tg_h, tg_h, tg_h, tg_h*);
	int (*Ibcast)(void*, int, tg_h, int, tg_h, tg_h*);
	int (*Ibarrier)(tg_h, tg_h*);
	int (*Cancel)(tg_h*);
	int (*Wait)(tg_h*, void*);
	int (*Request_free)(tg_h*);
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
	{"MPI_Isend", offsetof(tg_mpi, Isend)},
	{"MPI_Irecv", offsetof(tg_mpi, Irecv)},
	{"MPI_Test", offsetof(tg_mpi, Test)},
	{"MPI_Testall", offsetof(tg_mpi, Testall)},
	{"MPI_Iallreduce", offsetof(tg_mpi, Iallreduce)},
	{"MPI_Ireduce_scatter_block", offsetof(tg_mpi, Ireduce_scatter_block)},
	{"MPI_Ibcast", offsetof(tg_mpi, Ibcast)},
	{"MPI_Ibarrier", offsetof(tg_mpi, Ibarrier)},
	{"MPI_Cancel", offsetof(tg_mpi, Cancel)},
	{"MPI_Wait", offsetof(tg_mpi, Wait)},
	{"MPI_Request_free", offsetof(tg_mpi, Request_free)},
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

// Every operation is started nonblocking and completed by tg_wait, which
// polls it (as Open MPI's blocking calls poll their progress engine), so
// that a wait can end: after timeout_ns without completing (each step of a
// ring is its own wait: the clock measures a lack of progress) it returns
// TG_TIMEOUT, and the caller takes a roll call (tg_rollcall) to name the
// ranks that went silent. While it polls, a rank answers the roll calls of
// others (tg_serve): each rank keeps a receive posted for a question from
// every other rank (tag TG_TAG_ASK), and answers with its rank (tag
// TG_TAG_ANSWER). After 50 ms without completion a wait sleeps 200 µs
// between polls instead of spinning: a rank waiting long for another does
// not burn a core. (MPI_STATUS_IGNORE and MPI_STATUSES_IGNORE are null in
// Open MPI.)
enum { TG_TAG_ASK = 11, TG_TAG_ANSWER = 12, TG_TIMEOUT = -1 };

typedef struct {
	int rank, size;
	long long timeout_ns; // 0: wait forever
	tg_h* q;              // (size) the posted question receives; self's unused
	int* qbuf;            // (size)
	int answer;           // this rank: what it answers
} tg_roll;

static long long tg_now(void) {
	struct timespec ts;
	clock_gettime(CLOCK_MONOTONIC, &ts);
	return (long long)ts.tv_sec * 1000000000LL + ts.tv_nsec;
}

static int tg_roll_open(tg_mpi* m, tg_roll* st, int rank, int size) {
	st->rank = rank, st->size = size, st->timeout_ns = 0, st->answer = rank;
	st->q = calloc((size_t)size, sizeof(tg_h));
	st->qbuf = calloc((size_t)size, sizeof(int));
	if (!st->q || !st->qbuf) return 1;
	for (int p = 0; p < size; p++) {
		if (p == rank) continue;
		int r = m->Irecv(&st->qbuf[p], 1, m->i32, p, TG_TAG_ASK, m->world, &st->q[p]);
		if (r) return r;
	}
	return 0;
}

// tg_roll_close cancels the posted question receives (before MPI_Finalize).
static void tg_roll_close(tg_mpi* m, tg_roll* st) {
	for (int p = 0; st->q && p < st->size; p++) {
		if (p == st->rank) continue;
		m->Cancel(&st->q[p]);
		m->Wait(&st->q[p], NULL);
	}
}

// tg_serve answers every roll call that has arrived.
static int tg_serve(tg_mpi* m, tg_roll* st) {
	for (int p = 0; p < st->size; p++) {
		if (p == st->rank) continue;
		int flag = 0, r;
		if ((r = m->Test(&st->q[p], &flag, NULL))) return r;
		if (!flag) continue;
		tg_h req;
		if ((r = m->Isend(&st->answer, 1, m->i32, p, TG_TAG_ANSWER, m->world, &req))) return r;
		if ((r = m->Request_free(&req))) return r;
		if ((r = m->Irecv(&st->qbuf[p], 1, m->i32, p, TG_TAG_ASK, m->world, &st->q[p]))) return r;
	}
	return 0;
}

// tg_wait completes the n requests reqs: 0, an MPI error, or TG_TIMEOUT.
static int tg_wait(tg_mpi* m, tg_roll* st, int n, tg_h* reqs) {
	long long start = 0, serve = 0;
	for (unsigned long it = 0;; it++) {
		int flag = 0, r;
		if ((r = m->Testall(n, reqs, &flag, NULL))) return r;
		if (flag) return 0;
		if ((it & 63) != 63) continue;
		long long now = tg_now();
		if (!start) start = now;
		if (now >= serve) {
			if ((r = tg_serve(m, st))) return r;
			serve = now + 1000000;
		}
		if (st->timeout_ns > 0 && now - start > st->timeout_ns) return TG_TIMEOUT;
		if (now - start > 50000000LL) {
			struct timespec d = {0, 200000};
			nanosleep(&d, NULL);
		}
	}
}

// tg_rollcall asks every other rank to answer and waits up to grace_ns for
// the answers, answering others' questions meanwhile; alive[p] is set for
// every rank that answered (and this one). The receives of answers that did
// not come stay posted, into buffers it keeps: the caller ends the run.
static int tg_rollcall(tg_mpi* m, tg_roll* st, long long grace_ns, unsigned char* alive) {
	int size = st->size, r;
	tg_h* ans = calloc((size_t)size, sizeof(tg_h));
	int* abuf = calloc((size_t)size, sizeof(int));
	if (!ans || !abuf) return 1;
	alive[st->rank] = 1;
	for (int p = 0; p < size; p++) {
		abuf[p] = -1;
		if (p == st->rank) continue;
		tg_h req;
		if ((r = m->Irecv(&abuf[p], 1, m->i32, p, TG_TAG_ANSWER, m->world, &ans[p]))) return r;
		if ((r = m->Isend(&st->answer, 1, m->i32, p, TG_TAG_ASK, m->world, &req))) return r;
		if ((r = m->Request_free(&req))) return r;
	}
	for (long long end = tg_now() + grace_ns; tg_now() < end;) {
		int all = 1;
		for (int p = 0; p < size; p++) {
			if (alive[p]) continue;
			int flag = 0;
			if ((r = m->Test(&ans[p], &flag, NULL))) return r;
			// An answer carries its sender's rank (a receive that ended
			// otherwise, as the job is being aborted, is no answer).
			if (flag && abuf[p] == p) alive[p] = 1;
			else all = 0;
		}
		if (all) break;
		if ((r = tg_serve(m, st))) return r;
		struct timespec d = {0, 1000000};
		nanosleep(&d, NULL);
	}
	return 0;
}

static int tg_allreduce(tg_mpi* m, tg_roll* st, void* buf, int n, int i32) {
	tg_h req;
	int r = m->Iallreduce(TG_IN_PLACE, buf, n, tg_type(m, i32), m->sum, m->world, &req);
	return r ? r : tg_wait(m, st, 1, &req);
}
static int tg_reduce_scatter(tg_mpi* m, tg_roll* st, const void* src, void* dst, int n, int i32) {
	tg_h req;
	int r = m->Ireduce_scatter_block(src, dst, n, tg_type(m, i32), m->sum, m->world, &req);
	return r ? r : tg_wait(m, st, 1, &req);
}

// tg_sendrecv is MPI_Sendrecv through tg_wait.
static int tg_sendrecv(tg_mpi* m, tg_roll* st, const void* sbuf, int sn, tg_h type, int dest, int tag, void* rbuf, int rn, int src) {
	tg_h reqs[2];
	int r = m->Irecv(rbuf, rn, type, src, tag, m->world, &reqs[0]);
	if (r) return r;
	if ((r = m->Isend(sbuf, sn, type, dest, tag, m->world, &reqs[1]))) return r;
	return tg_wait(m, st, 2, reqs);
}
// tg_reduce_scatter_ring sums src (size·n floats) over the ranks into dst
// (n), rank r getting block r, along a ring: in step s each rank sends its
// running sum of block (r−s−1) mod size to the next rank and adds its own
// src to the sum of block (r−s−2) mod size received from the previous one;
// after size−1 steps dst holds block r summed over every rank. Each
// element is summed once, in one order, and only its owner keeps it; the
// only scratch is n floats (tmp), where Open MPI's own algorithms allocate
// the whole src on some rank.
static int tg_reduce_scatter_ring(tg_mpi* m, tg_roll* st, const float* src, float* dst, float* tmp, int n, int rank, int size) {
	int next = (rank + 1) % size, prev = (rank + size - 1) % size;
	int blk = ((rank - 1) % size + size) % size;
	memcpy(dst, src + (size_t)blk * n, (size_t)n * sizeof(float));
	for (int s = 0; s < size - 1; s++) {
		int r = tg_sendrecv(m, st, dst, n, m->f32, next, 7, tmp, n, prev);
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
static int tg_allreduce_ring(tg_mpi* m, tg_roll* st, float* buf, int n, float* tmp, int chunk, int rank, int size) {
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
			int r = tg_sendrecv(m, st, buf + slo + (sc ? off : 0), sc, m->f32, next, 9, tmp, rc, prev);
			if (r) return r;
			float* d = buf + rlo + off;
			for (int i = 0; i < rc; i++) d[i] += tmp[i];
		}
	}
	for (int s = 0; s < size - 1; s++) {
		int sb = ((rank + 1 - s) % size + size) % size, rb = ((rank - s) % size + size) % size;
		int r = tg_sendrecv(m, st, buf + TG_LO(sb), TG_LO(sb + 1) - TG_LO(sb), m->f32, next, 10,
			buf + TG_LO(rb), TG_LO(rb + 1) - TG_LO(rb), prev);
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
static int tg_allgather_ring(tg_mpi* m, tg_roll* st, const void* src, void* dst, int n, int kind, int rank, int size) {
	size_t bytes = (size_t)n * (kind == 2 ? 1 : 4);
	char* d = dst;
	memmove(d + (size_t)rank * bytes, src, bytes);
	int next = (rank + 1) % size, prev = (rank + size - 1) % size;
	for (int s = 0; s < size - 1; s++) {
		int sb = (rank - s + size) % size, rb = (rank - s - 1 + size) % size;
		int r = tg_sendrecv(m, st, d + (size_t)sb * bytes, n, tg_type(m, kind), next, 8,
			d + (size_t)rb * bytes, n, prev);
		if (r) return r;
	}
	return 0;
}
static int tg_bcast(tg_mpi* m, tg_roll* st, void* buf, int n, int i32, int root) {
	tg_h req;
	int r = m->Ibcast(buf, n, tg_type(m, i32), root, m->world, &req);
	return r ? r : tg_wait(m, st, 1, &req);
}
static int tg_barrier(tg_mpi* m, tg_roll* st) {
	tg_h req;
	int r = m->Ibarrier(m->world, &req);
	return r ? r : tg_wait(m, st, 1, &req);
}
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
	"time"
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
	roll       *C.tg_roll // the roll call's state (tg_wait, tg_rollcall)
	timeout    time.Duration
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
	roll := (*C.tg_roll)(C.calloc(1, C.size_t(unsafe.Sizeof(C.tg_roll{}))))
	if r := C.tg_roll_open(m, roll, rank, size); r != 0 {
		return fmt.Errorf("mpi: post the roll call's receives: %s", errText(m, r))
	}
	lib.m, lib.roll, lib.path, lib.rank, lib.size = m, roll, path, int(rank), int(size)
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
	r := f()
	switch {
	case r == C.TG_TIMEOUT:
		return silentRanks(what)
	case r != 0:
		return fmt.Errorf("mpi: %s: %s", what, errText(lib.m, r))
	}
	return nil
}

// SetTimeout makes a collective that has waited d for the other ranks
// give up (0: wait forever, as MPI does): its error names the ranks that
// did not answer a roll call (collective.ErrRankTimeout).
func (c *comm) SetTimeout(d time.Duration) {
	lib.Lock()
	defer lib.Unlock()
	lib.timeout = max(d, 0)
	lib.roll.timeout_ns = C.longlong(lib.timeout.Nanoseconds())
}

// rollCallGrace is how long a rank whose collective timed out waits for
// the others to answer its roll call: a live rank answers from its next
// poll, or when it next enters a collective.
func rollCallGrace(timeout time.Duration) time.Duration {
	return min(max(timeout/4, time.Second), time.Minute)
}

// silentRanks takes the roll call after a collective timed out (lib held)
// and returns the error naming the ranks that did not answer.
func silentRanks(what string) error {
	grace := rollCallGrace(lib.timeout)
	alive := make([]C.uchar, lib.size)
	if r := C.tg_rollcall(lib.m, lib.roll, C.longlong(grace.Nanoseconds()), &alive[0]); r != 0 {
		return fmt.Errorf("%w: rank %d waited %v in %s (--rank-timeout), and its roll call failed: %s", collective.ErrRankTimeout, lib.rank, lib.timeout, what, errText(lib.m, r))
	}
	var silent []int
	for p, a := range alive {
		if a == 0 {
			silent = append(silent, p)
		}
	}
	return collective.SilentError(lib.rank, lib.timeout, what, silent, fmt.Sprintf("did not answer a roll call within %v", grace))
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
		return c.call("MPI_Allreduce", func() C.int { return C.tg_allreduce(lib.m, lib.roll, p, C.int(buf.N), k) })
	}
	if piece := min((buf.N+lib.size-1)/lib.size, collective.HostAllReduceChunk); cap(c.chunk) < piece {
		c.chunk = make([]float32, piece)
	}
	tmp := unsafe.Pointer(&c.chunk[0])
	return c.call("MPI_Sendrecv (all-reduce ring)", func() C.int {
		return C.tg_allreduce_ring(lib.m, lib.roll, (*C.float)(p), C.int(buf.N), (*C.float)(tmp), C.int(cap(c.chunk)), C.int(lib.rank), C.int(lib.size))
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
		return c.call("MPI_Reduce_scatter_block", func() C.int { return C.tg_reduce_scatter(lib.m, lib.roll, s, d, C.int(dst.N), k) })
	}
	if cap(c.scratch) < dst.N {
		c.scratch = make([]float32, dst.N)
	}
	tmp := unsafe.Pointer(&c.scratch[0])
	return c.call("MPI_Sendrecv (reduce-scatter ring)", func() C.int {
		return C.tg_reduce_scatter_ring(lib.m, lib.roll, (*C.float)(s), (*C.float)(d), (*C.float)(tmp), C.int(dst.N), C.int(lib.rank), C.int(lib.size))
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
		return C.tg_allgather_ring(lib.m, lib.roll, s, d, C.int(n), k, C.int(lib.rank), C.int(lib.size))
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
	return c.call("MPI_Bcast", func() C.int { return C.tg_bcast(lib.m, lib.roll, p, C.int(n), k, C.int(root)) })
}

func (c *comm) Barrier() error {
	if err := c.b.Sync(); err != nil {
		return err
	}
	return c.call("MPI_Barrier", func() C.int { return C.tg_barrier(lib.m, lib.roll) })
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
	C.tg_roll_close(lib.m, lib.roll)
	if r := C.tg_finalize(lib.m); r != 0 {
		return fmt.Errorf("mpi: MPI_Finalize: %s", errText(lib.m, r))
	}
	return nil
}
