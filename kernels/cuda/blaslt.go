//go:build cgo

package cuda

// cuBLASLt: the GEMMs' library when it loads (matmul.go falls back to
// cublasGemmEx when it does not). libcublasLt is dlopen'ed at run time
// with the prototypes below, like the driver and cuBLAS. Each distinct
// GEMM (its shape, leading dimensions, types, compute type, operand
// alignment and epilogue) is planned once: its descriptors are made and
// cublasLtMatmulAlgoGetHeuristic is asked for one algorithm under the
// backend's fixed workspace; the plan is kept for the backend's lifetime,
// so every later call of that GEMM runs the same algorithm over the same
// workspace, and its bits repeat (an algorithm fixes the GEMM's summation
// order, split-K's included; the heuristic's choice depends on the
// workspace it may use, so both are fixed).

/*
#cgo LDFLAGS: -ldl
#include <stddef.h>
#include <stdint.h>
#include <stdlib.h>

typedef int (*tg_setctx)(void*);

// cublasLtMatmulHeuristicResult_t (cublasLt.h): the algorithm is 8 opaque
// words.
typedef struct {
	uint64_t algo[8];
	size_t workspaceSize;
	int state;
	float wavesCount;
	int reserved[4];
} tg_lt_result;

typedef struct {
	void* lib;
	int (*create)(void**);
	int (*destroy)(void*);
	size_t (*getVersion)(void);
	int (*descCreate)(void**, int, int);
	int (*descDestroy)(void*);
	int (*descSet)(void*, int, const void*, size_t);
	int (*layoutCreate)(void**, int, uint64_t, uint64_t, int64_t);
	int (*layoutDestroy)(void*);
	int (*prefCreate)(void**);
	int (*prefDestroy)(void*);
	int (*prefSet)(void*, int, const void*, size_t);
	int (*heuristic)(void*, void*, void*, void*, void*, void*, void*, int, tg_lt_result*, int*);
	int (*matmul)(void*, void*, const void*, const void*, void*, const void*, void*, const void*,
	              const void*, void*, void*, void*, const void*, void*, size_t, void*);
} tg_lt;

typedef struct { const char* name; size_t off; } tg_sym; // as in driver.go
int tg_open(const char* path, void* tab, const tg_sym* syms, size_t nsyms, char* err, size_t errlen); // driver.go

static const tg_sym tg_lt_syms[] = {
	{"cublasLtCreate", offsetof(tg_lt, create)},
	{"cublasLtDestroy", offsetof(tg_lt, destroy)},
	{"cublasLtGetVersion", offsetof(tg_lt, getVersion)},
	{"cublasLtMatmulDescCreate", offsetof(tg_lt, descCreate)},
	{"cublasLtMatmulDescDestroy", offsetof(tg_lt, descDestroy)},
	{"cublasLtMatmulDescSetAttribute", offsetof(tg_lt, descSet)},
	{"cublasLtMatrixLayoutCreate", offsetof(tg_lt, layoutCreate)},
	{"cublasLtMatrixLayoutDestroy", offsetof(tg_lt, layoutDestroy)},
	{"cublasLtMatmulPreferenceCreate", offsetof(tg_lt, prefCreate)},
	{"cublasLtMatmulPreferenceDestroy", offsetof(tg_lt, prefDestroy)},
	{"cublasLtMatmulPreferenceSetAttribute", offsetof(tg_lt, prefSet)},
	{"cublasLtMatmulAlgoGetHeuristic", offsetof(tg_lt, heuristic)},
	{"cublasLtMatmul", offsetof(tg_lt, matmul)},
};

static const tg_sym* tg_lt_table(size_t* n) {
	*n = sizeof tg_lt_syms / sizeof tg_lt_syms[0];
	return tg_lt_syms;
}

// Attribute ids (cublasLt.h): cublasLtMatmulDescAttributes_t's TRANSA and
// TRANSB (int32 cublasOperation_t), cublasLtMatmulPreferenceAttributes_t's
// MAX_WORKSPACE_BYTES (uint64) and MIN_ALIGNMENT_{A,B,C,D}_BYTES (uint32).
enum { TG_LT_TRANSA = 3, TG_LT_TRANSB = 4, TG_LT_PREF_WORKSPACE = 1, TG_LT_PREF_ALIGN_A = 5 };

// tg_lt_plan is one GEMM's descriptors and its algorithm.
typedef struct {
	void *desc, *a, *b, *c, *d;
	tg_lt_result res;
} tg_lt_plan;

static size_t tg_lt_version(tg_lt* l) { return l->getVersion(); }

static int tg_lt_create(tg_lt* l, void* setctx, void* ctx, void** h) {
	int r = ((tg_setctx)setctx)(ctx);
	if (r) return -1000 - r;
	return l->create(h);
}

static int tg_lt_destroy(tg_lt* l, void* setctx, void* ctx, void* h) {
	((tg_setctx)setctx)(ctx);
	return l->destroy(h);
}

static void tg_lt_plan_free(tg_lt* l, tg_lt_plan* p) {
	if (!p) return;
	if (p->desc) l->descDestroy(p->desc);
	if (p->a) l->layoutDestroy(p->a);
	if (p->b) l->layoutDestroy(p->b);
	if (p->c) l->layoutDestroy(p->c);
	if (p->d) l->layoutDestroy(p->d);
	free(p);
}

// tg_lt_plan_make describes column-major D (m,n) = alpha·op(A)·op(B) +
// beta·C (A, B of type ab; C, D of type cd; fp32 scale) and asks the
// heuristic for one algorithm that needs at most ws bytes of workspace and
// works with operands aligned to align[0..3] bytes. *found is 0 when the
// heuristic offers none. The plan is returned in *out either way (free it
// with tg_lt_plan_free).
static int tg_lt_plan_make(tg_lt* l, void* setctx, void* ctx, void* h, int ta, int tb, int m, int n, int k,
                           int ab, int lda, int ldb, int cd, int ldc, int ldd, int compute, uint64_t ws,
                           const uint32_t* align, tg_lt_plan** out, int* found) {
	*found = 0;
	int r = ((tg_setctx)setctx)(ctx);
	if (r) return -1000 - r;
	tg_lt_plan* p = calloc(1, sizeof(tg_lt_plan));
	*out = p;
	int32_t opA = ta, opB = tb;
	if ((r = l->descCreate(&p->desc, compute, 0))) return r;
	if ((r = l->descSet(p->desc, TG_LT_TRANSA, &opA, sizeof opA))) return r;
	if ((r = l->descSet(p->desc, TG_LT_TRANSB, &opB, sizeof opB))) return r;
	if ((r = l->layoutCreate(&p->a, ab, ta ? k : m, ta ? m : k, lda))) return r;
	if ((r = l->layoutCreate(&p->b, ab, tb ? n : k, tb ? k : n, ldb))) return r;
	if ((r = l->layoutCreate(&p->c, cd, m, n, ldc))) return r;
	if ((r = l->layoutCreate(&p->d, cd, m, n, ldd))) return r;
	void* pref = NULL;
	if ((r = l->prefCreate(&pref))) return r;
	r = l->prefSet(pref, TG_LT_PREF_WORKSPACE, &ws, sizeof ws);
	for (int i = 0; i < 4 && !r; i++) r = l->prefSet(pref, TG_LT_PREF_ALIGN_A + i, &align[i], sizeof align[i]);
	if (!r) {
		int got = 0;
		r = l->heuristic(h, p->desc, p->a, p->b, p->c, p->d, pref, 1, &p->res, &got);
		*found = got > 0 && p->res.state == 0;
		if (r == 15) r = 0;  // CUBLAS_STATUS_NOT_SUPPORTED: no algorithm, not an error
	}
	l->prefDestroy(pref);
	return r;
}

static int tg_lt_matmul(tg_lt* l, void* setctx, void* ctx, void* h, tg_lt_plan* p, float alpha, uint64_t A,
                        uint64_t B, float beta, uint64_t C, uint64_t D, uint64_t ws, size_t wsBytes, void* stream) {
	int r = ((tg_setctx)setctx)(ctx);
	if (r) return -1000 - r;
	return l->matmul(h, p->desc, &alpha, (const void*)A, p->a, (const void*)B, p->b, &beta, (const void*)C, p->c,
	                 (void*)D, p->d, p->res.algo, (void*)ws, wsBytes, stream);
}

// The metering device's cuBLASLt (OpenMeter): every call succeeds and
// does nothing; the heuristic offers one algorithm that needs no
// workspace.
static int tgml_handle(void** h) { static char obj[64]; *h = obj; return 0; }
static int tgml_ok1(void* p) { return 0; }
static size_t tgml_version(void) { return 130000; }
static int tgml_desc(void** d, int c, int s) { return tgml_handle(d); }
static int tgml_set(void* d, int a, const void* v, size_t n) { return 0; }
static int tgml_layout(void** d, int t, uint64_t r, uint64_t c, int64_t ld) { return tgml_handle(d); }
static int tgml_heur(void* h, void* d, void* a, void* b, void* c, void* dd, void* p, int n, tg_lt_result* res, int* got) {
	res->state = 0;
	res->workspaceSize = 0;
	*got = 1;
	return 0;
}
static int tgml_matmul(void* h, void* d, const void* al, const void* A, void* ad, const void* B, void* bd,
                       const void* be, const void* C, void* cd, void* D, void* dd, const void* algo, void* ws,
                       size_t wsn, void* s) { return 0; }

static tg_lt* tg_meter_lt(void) {
	static char lib;
	tg_lt* l = calloc(1, sizeof(tg_lt));
	l->lib = &lib;
	l->create = tgml_handle;
	l->destroy = tgml_ok1;
	l->getVersion = tgml_version;
	l->descCreate = tgml_desc;
	l->descDestroy = tgml_ok1;
	l->descSet = tgml_set;
	l->layoutCreate = tgml_layout;
	l->layoutDestroy = tgml_ok1;
	l->prefCreate = tgml_handle;
	l->prefDestroy = tgml_ok1;
	l->prefSet = tgml_set;
	l->heuristic = tgml_heur;
	l->matmul = tgml_matmul;
	return l;
}
*/
import "C"

import (
	"fmt"
	"os"
	"path/filepath"
	"strings"
	"unsafe"
)

// ltLib is a loaded cuBLASLt.
type ltLib struct {
	choice  LibraryChoice
	l       *C.tg_lt // C memory
	version int
}

// ltKey is what a plan is made for: one GEMM's shape, layouts, types,
// compute type, operand alignments and epilogue (C ≠ D: the residual).
type ltKey struct {
	ta, tb             bool
	m, n, k            int
	lda, ldb, ldc, ldd int
	ab, cd, compute    int
	alA, alB, alC, alD uint32
	residual           bool
}

// ltPlan is a planned GEMM; found is false when the heuristic offered no
// algorithm (the GEMM then runs on cublasGemmEx).
type ltPlan struct {
	p     *C.tg_lt_plan
	found bool
}

// ltState is a device's cuBLASLt: the library, its handle, the workspace
// and the plans made so far.
type ltState struct {
	lib    *ltLib
	handle unsafe.Pointer
	work   uintptr
	plans  map[ltKey]ltPlan
	// queries counts the heuristic's calls (one per plan).
	queries int
}

// ltCandidates returns where cuBLASLt is looked for, for the cuBLAS at
// blasPath: the library beside it (libcublas.X → libcublasLt.X, the name
// also of the emulator's stand-in beside its cuBLAS), else the loader's
// search for that name.
func ltCandidates(blasPath string) []libCandidate {
	dir, base := filepath.Split(blasPath)
	name := strings.Replace(base, "cublas.", "cublasLt.", 1)
	if name == base {
		return nil
	}
	if dir == "" {
		return []libCandidate{{name, "the loader's search, for the cuBLAS of that name"}}
	}
	return []libCandidate{{filepath.Join(dir, name), "beside cuBLAS"}}
}

// openBlasLt loads cuBLASLt: path, else $TRACEGRPO_CUDA_BLASLT, else the
// one beside the cuBLAS at blasPath. ltNone, or no library found, returns
// nil and says why in the choice.
func openBlasLt(path, blasPath string) (*ltLib, LibraryChoice) {
	if path == "" {
		path = os.Getenv("TRACEGRPO_CUDA_BLASLT")
	}
	if path == ltNone {
		return nil, LibraryChoice{Name: "cuBLASLt", Err: fmt.Errorf("cuda: cuBLASLt off (%q): the GEMMs run on cublasGemmEx", ltNone)}
	}
	c := LibraryChoice{Name: "cuBLASLt", Path: path, From: "named explicitly"}
	if path == "" {
		cands := ltCandidates(blasPath)
		if len(cands) == 0 {
			c.Err = fmt.Errorf("cuda: no cuBLASLt name follows from cuBLAS %q: the GEMMs run on cublasGemmEx", blasPath)
			return nil, c
		}
		c.Path, c.From = cands[0].Path, cands[0].From
	}
	l := (*C.tg_lt)(C.calloc(1, C.size_t(unsafe.Sizeof(C.tg_lt{}))))
	var nsyms C.size_t
	syms := C.tg_lt_table(&nsyms)
	if err := loadTable(c.Path, unsafe.Pointer(l), unsafe.Pointer(syms), nsyms, "cuBLASLt"); err != nil {
		C.free(unsafe.Pointer(l))
		c.Passed = []string{fmt.Sprintf("%s (%s): %v", c.Path, c.From, err)}
		c.Path, c.Err = "", fmt.Errorf("%w: the GEMMs run on cublasGemmEx", err)
		return nil, c
	}
	return &ltLib{choice: c, l: l, version: int(C.tg_lt_version(l))}, c
}

// meterLt is the metering device's cuBLASLt.
func meterLt() *ltLib {
	return &ltLib{choice: LibraryChoice{Name: "cuBLASLt", Path: meterPath, From: "the metering device"}, l: C.tg_meter_lt(), version: 130000}
}

// openLt creates the handle and allocates the workspace on d.
func (d *device) openLt(lib *ltLib) error {
	s := &ltState{lib: lib, plans: map[ltKey]ltPlan{}}
	if code := C.tg_lt_create(lib.l, d.setCtxFn(), d.ctx, &s.handle); code != 0 {
		return fmt.Errorf("cuda: create cuBLASLt handle (%s): %s", lib.choice.Path, blasStatusText(code))
	}
	w, err := d.alloc(ltWorkspace)
	if err != nil {
		C.tg_lt_destroy(lib.l, d.setCtxFn(), d.ctx, s.handle)
		return fmt.Errorf("cuda: cuBLASLt workspace: %w", err)
	}
	s.work = w
	d.lt = s
	return nil
}

// closeLt frees the plans, the workspace and the handle.
func (d *device) closeLt() error {
	s := d.lt
	if s == nil {
		return nil
	}
	d.lt = nil
	for _, p := range s.plans {
		C.tg_lt_plan_free(s.lib.l, p.p)
	}
	var first error
	if code := d.free(s.work); code != 0 {
		first = fmt.Errorf("cuda: free the cuBLASLt workspace: %s", d.errText(code))
	}
	if code := C.tg_lt_destroy(s.lib.l, d.setCtxFn(), d.ctx, s.handle); code != 0 && first == nil {
		first = fmt.Errorf("cuda: destroy cuBLASLt handle: %s", blasStatusText(code))
	}
	return first
}

// alignOf is the alignment of a device address that cuBLASLt's
// preference takes: its lowest set bit, at most ltMaxAlign.
func alignOf(p uintptr) uint32 {
	a := uint32(ltMaxAlign)
	for a > 1 && p%uintptr(a) != 0 {
		a /= 2
	}
	return a
}

// ltMaxAlign caps the operand alignments a plan is keyed and asked for.
// No cuBLASLt kernel needs more than 16 bytes (its widest vector load, and
// the TMA's global-address alignment), so an operand aligned to 64, 128 or
// 256 bytes runs the same kernels as one aligned to 16; but a key that
// kept the address's full alignment made a new plan, and the heuristic's
// answer for it may be another algorithm (another split-K, other bits),
// for a weight that merely lives elsewhere: a sharded model's gathered
// layer (256-aligned) then computed other gradients than the whole model's
// views of its one parameter buffer (64- or 128-aligned) on the same
// backend. With the cap, a GEMM's plan depends on its shape, types and
// whether its operands are 16-byte aligned, not on where they live.
const ltMaxAlign = 16

// ltPlanFor returns the plan of key, making it at its first use.
func (d *device) ltPlanFor(key ltKey) (ltPlan, status) {
	s := d.lt
	if p, ok := s.plans[key]; ok {
		return p, 0
	}
	b2i := func(b bool) C.int {
		if b {
			return 1
		}
		return 0
	}
	align := [4]C.uint32_t{C.uint32_t(key.alA), C.uint32_t(key.alB), C.uint32_t(key.alC), C.uint32_t(key.alD)}
	var p *C.tg_lt_plan
	var found C.int
	s.queries++
	code := C.tg_lt_plan_make(s.lib.l, d.setCtxFn(), d.ctx, s.handle, b2i(key.ta), b2i(key.tb), C.int(key.m), C.int(key.n), C.int(key.k),
		C.int(key.ab), C.int(key.lda), C.int(key.ldb), C.int(key.cd), C.int(key.ldc), C.int(key.ldd), C.int(key.compute),
		C.uint64_t(ltWorkspace), &align[0], &p, &found)
	if code != 0 {
		C.tg_lt_plan_free(s.lib.l, p)
		return ltPlan{}, code
	}
	plan := ltPlan{p: p, found: found != 0}
	s.plans[key] = plan
	return plan, 0
}

// ltMatmul runs a planned GEMM: D = alpha·op(A)·op(B) + beta·C.
func (d *device) ltMatmul(p ltPlan, alpha float32, A, B uintptr, beta float32, Cp, D uintptr) status {
	s := d.lt
	return C.tg_lt_matmul(s.lib.l, d.setCtxFn(), d.ctx, s.handle, p.p, C.float(alpha), C.uint64_t(A), C.uint64_t(B),
		C.float(beta), C.uint64_t(Cp), C.uint64_t(D), C.uint64_t(s.work), C.size_t(ltWorkspace), d.stream)
}
