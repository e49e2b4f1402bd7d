//go:build cgo

package cuda

// The binding: the CUDA driver API and cuBLAS, dlopen'ed at run time with
// the prototypes below (no CUDA header is included). Every C function here
// returns an int status (a CUresult or cublasStatus_t; -1 for our own
// failures), makes the context current on the calling OS thread first, and
// keeps no pointer it was given past its return.

/*
#cgo LDFLAGS: -ldl
#include <dlfcn.h>
#include <stddef.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

typedef unsigned long long tg_dptr;

typedef struct {
	void* lib;
	int (*cuInit)(unsigned);
	int (*cuDriverGetVersion)(int*);
	int (*cuDeviceGetCount)(int*);
	int (*cuDeviceGet)(int*, int);
	int (*cuDeviceGetName)(char*, int, int);
	int (*cuDeviceGetAttribute)(int*, int, int);
	int (*cuDeviceTotalMem)(size_t*, int);
	int (*cuDevicePrimaryCtxRetain)(void**, int);
	int (*cuDevicePrimaryCtxRelease)(int);
	int (*cuCtxSetCurrent)(void*);
	int (*cuMemAlloc)(tg_dptr*, size_t);
	int (*cuMemGetInfo)(size_t*, size_t*);
	int (*cuMemFree)(tg_dptr);
	int (*cuMemcpyHtoDAsync)(tg_dptr, const void*, size_t, void*);
	int (*cuMemcpyDtoHAsync)(void*, tg_dptr, size_t, void*);
	int (*cuMemcpyDtoDAsync)(tg_dptr, tg_dptr, size_t, void*);
	int (*cuMemsetD8Async)(tg_dptr, unsigned char, size_t, void*);
	int (*cuMemsetD32Async)(tg_dptr, unsigned, size_t, void*);
	int (*cuStreamCreate)(void**, unsigned);
	int (*cuStreamDestroy)(void*);
	int (*cuStreamSynchronize)(void*);
	int (*cuEventCreate)(void**, unsigned);
	int (*cuEventDestroy)(void*);
	int (*cuEventRecord)(void*, void*);
	int (*cuEventSynchronize)(void*);
	int (*cuEventElapsedTime)(float*, void*, void*);
	int (*cuStreamWaitEvent)(void*, void*, unsigned);
	int (*cuModuleLoadDataEx)(void**, const void*, unsigned, int*, void**);
	int (*cuModuleUnload)(void*);
	int (*cuModuleGetFunction)(void**, void*, const char*);
	int (*cuFuncSetAttribute)(void*, int, int);
	int (*cuLaunchKernel)(void*, unsigned, unsigned, unsigned, unsigned, unsigned, unsigned,
	                      unsigned, void*, void**, void**);
	int (*cuGetErrorString)(int, const char**);
	int (*cuGetErrorName)(int, const char**);
} tg_driver;

// tg_sym names one function of a library and where its pointer goes in a
// table (a struct whose first field is the library handle).
typedef struct { const char* name; size_t off; } tg_sym;

// Exported symbol names; cuda.h maps several API names to _v2 symbols.
static const tg_sym tg_driver_syms[] = {
	{"cuInit", offsetof(tg_driver, cuInit)},
	{"cuDriverGetVersion", offsetof(tg_driver, cuDriverGetVersion)},
	{"cuDeviceGetCount", offsetof(tg_driver, cuDeviceGetCount)},
	{"cuDeviceGet", offsetof(tg_driver, cuDeviceGet)},
	{"cuDeviceGetName", offsetof(tg_driver, cuDeviceGetName)},
	{"cuDeviceGetAttribute", offsetof(tg_driver, cuDeviceGetAttribute)},
	{"cuDeviceTotalMem_v2", offsetof(tg_driver, cuDeviceTotalMem)},
	{"cuDevicePrimaryCtxRetain", offsetof(tg_driver, cuDevicePrimaryCtxRetain)},
	{"cuDevicePrimaryCtxRelease_v2", offsetof(tg_driver, cuDevicePrimaryCtxRelease)},
	{"cuCtxSetCurrent", offsetof(tg_driver, cuCtxSetCurrent)},
	{"cuMemAlloc_v2", offsetof(tg_driver, cuMemAlloc)},
	{"cuMemGetInfo_v2", offsetof(tg_driver, cuMemGetInfo)},
	{"cuMemFree_v2", offsetof(tg_driver, cuMemFree)},
	{"cuMemcpyHtoDAsync_v2", offsetof(tg_driver, cuMemcpyHtoDAsync)},
	{"cuMemcpyDtoHAsync_v2", offsetof(tg_driver, cuMemcpyDtoHAsync)},
	{"cuMemcpyDtoDAsync_v2", offsetof(tg_driver, cuMemcpyDtoDAsync)},
	{"cuMemsetD8Async", offsetof(tg_driver, cuMemsetD8Async)},
	{"cuMemsetD32Async", offsetof(tg_driver, cuMemsetD32Async)},
	{"cuStreamCreate", offsetof(tg_driver, cuStreamCreate)},
	{"cuStreamDestroy_v2", offsetof(tg_driver, cuStreamDestroy)},
	{"cuStreamSynchronize", offsetof(tg_driver, cuStreamSynchronize)},
	{"cuEventCreate", offsetof(tg_driver, cuEventCreate)},
	{"cuEventDestroy_v2", offsetof(tg_driver, cuEventDestroy)},
	{"cuEventRecord", offsetof(tg_driver, cuEventRecord)},
	{"cuEventSynchronize", offsetof(tg_driver, cuEventSynchronize)},
	{"cuEventElapsedTime", offsetof(tg_driver, cuEventElapsedTime)},
	{"cuStreamWaitEvent", offsetof(tg_driver, cuStreamWaitEvent)},
	{"cuModuleLoadDataEx", offsetof(tg_driver, cuModuleLoadDataEx)},
	{"cuModuleUnload", offsetof(tg_driver, cuModuleUnload)},
	{"cuModuleGetFunction", offsetof(tg_driver, cuModuleGetFunction)},
	{"cuFuncSetAttribute", offsetof(tg_driver, cuFuncSetAttribute)},
	{"cuLaunchKernel", offsetof(tg_driver, cuLaunchKernel)},
	{"cuGetErrorString", offsetof(tg_driver, cuGetErrorString)},
	{"cuGetErrorName", offsetof(tg_driver, cuGetErrorName)},
};

typedef struct {
	void* lib;
	int (*create)(void**);
	int (*destroy)(void*);
	int (*setStream)(void*, void*);
	int (*getVersion)(void*, int*);
	int (*gemmEx)(void*, int, int, int, int, int, const void*, const void*, int, int,
	              const void*, int, int, const void*, void*, int, int, int, int);
} tg_blas;

#include "meter.h"

// tg_meter_driver and tg_meter_blas allocate the metering tables.
static tg_driver* tg_meter_driver(void) {
	tg_driver* d = calloc(1, sizeof(tg_driver));
	tg_blas* b = calloc(1, sizeof(tg_blas));
	tg_meter_tables(d, b);
	free(b);
	return d;
}
static tg_blas* tg_meter_blas(void) {
	tg_driver* d = calloc(1, sizeof(tg_driver));
	tg_blas* b = calloc(1, sizeof(tg_blas));
	tg_meter_tables(d, b);
	free(d);
	return b;
}

static const tg_sym tg_blas_syms[] = {
	{"cublasCreate_v2", offsetof(tg_blas, create)},
	{"cublasDestroy_v2", offsetof(tg_blas, destroy)},
	{"cublasSetStream_v2", offsetof(tg_blas, setStream)},
	{"cublasGetVersion_v2", offsetof(tg_blas, getVersion)},
	{"cublasGemmEx", offsetof(tg_blas, gemmEx)},
};

// tg_open loads path and fills the function table at tab (whose first field
// is the library handle) from syms. 0: ok; 1: dlopen failed; 2: a symbol is
// missing. err gets the reason. Not static: nccl.go loads NCCL with it.
int tg_open(const char* path, void* tab, const tg_sym* syms, size_t nsyms, char* err, size_t errlen) {
	void* lib = dlopen(path, RTLD_NOW | RTLD_LOCAL);
	if (!lib) {
		const char* e = dlerror();
		snprintf(err, errlen, "%s", e ? e : "dlopen failed");
		return 1;
	}
	for (size_t i = 0; i < nsyms; i++) {
		void* sym = dlsym(lib, syms[i].name);
		if (!sym) {
			snprintf(err, errlen, "%s", syms[i].name);
			dlclose(lib);
			return 2;
		}
		*(void**)((char*)tab + syms[i].off) = sym;
	}
	*(void**)tab = lib;
	return 0;
}

// tg_preload dlopens path and keeps it loaded (it is never closed), so that
// a library opened next finds it as a dependency by its soname. 0: ok.
static int tg_preload(const char* path, char* err, size_t errlen) {
	if (dlopen(path, RTLD_NOW | RTLD_LOCAL)) return 0;
	const char* e = dlerror();
	snprintf(err, errlen, "%s", e ? e : "dlopen failed");
	return 1;
}

static const tg_sym* tg_driver_table(size_t* n) {
	*n = sizeof tg_driver_syms / sizeof tg_driver_syms[0];
	return tg_driver_syms;
}
static const tg_sym* tg_blas_table(size_t* n) {
	*n = sizeof tg_blas_syms / sizeof tg_blas_syms[0];
	return tg_blas_syms;
}

static int tg_err_text(tg_driver* d, int code, const char** name, const char** str) {
	*name = NULL;
	*str = NULL;
	d->cuGetErrorName(code, name);
	return d->cuGetErrorString(code, str);
}

static int tg_driver_version(tg_driver* d, int* v) {
	int r = d->cuInit(0);
	if (r) return r;
	return d->cuDriverGetVersion(v);
}

static int tg_device_count(tg_driver* d, int* n) {
	int r = d->cuInit(0);
	if (r) return r;
	return d->cuDeviceGetCount(n);
}

// Attribute ids from cuda.h's CUdevice_attribute.
enum { TG_ATTR_SMS = 16, TG_ATTR_CC_MAJOR = 75, TG_ATTR_CC_MINOR = 76, TG_ATTR_SMEM_OPTIN = 97 };

static int tg_device_info(tg_driver* d, int ordinal, int* dev, char* name, int namelen,
                          int* major, int* minor, int* sms, int* smem_optin, size_t* mem) {
	int r = d->cuInit(0);
	if (r) return r;
	if ((r = d->cuDeviceGet(dev, ordinal))) return r;
	if ((r = d->cuDeviceGetName(name, namelen, *dev))) return r;
	if ((r = d->cuDeviceGetAttribute(major, TG_ATTR_CC_MAJOR, *dev))) return r;
	if ((r = d->cuDeviceGetAttribute(minor, TG_ATTR_CC_MINOR, *dev))) return r;
	if ((r = d->cuDeviceGetAttribute(sms, TG_ATTR_SMS, *dev))) return r;
	if ((r = d->cuDeviceGetAttribute(smem_optin, TG_ATTR_SMEM_OPTIN, *dev))) return r;
	return d->cuDeviceTotalMem(mem, *dev);
}

static int tg_context(tg_driver* d, int dev, void** ctx, void** stream) {
	int r = d->cuDevicePrimaryCtxRetain(ctx, dev);
	if (r) return r;
	if ((r = d->cuCtxSetCurrent(*ctx))) return r;
	return d->cuStreamCreate(stream, 0);
}

static int tg_release(tg_driver* d, int dev, void* ctx, void* stream) {
	int r = d->cuCtxSetCurrent(ctx);
	if (r) return r;
	if (stream && (r = d->cuStreamDestroy(stream))) return r;
	return d->cuDevicePrimaryCtxRelease(dev);
}

static int tg_alloc(tg_driver* d, void* ctx, void* stream, tg_dptr* p, size_t bytes) {
	int r = d->cuCtxSetCurrent(ctx);
	if (r) return r;
	if ((r = d->cuMemAlloc(p, bytes))) return r;
	if ((r = d->cuMemsetD8Async(*p, 0, bytes, stream))) return r;
	return d->cuStreamSynchronize(stream);
}

static int tg_mem_info(tg_driver* d, void* ctx, size_t* free, size_t* total) {
	int r = d->cuCtxSetCurrent(ctx);
	if (r) return r;
	return d->cuMemGetInfo(free, total);
}

static int tg_free(tg_driver* d, void* ctx, tg_dptr p) {
	int r = d->cuCtxSetCurrent(ctx);
	if (r) return r;
	return d->cuMemFree(p);
}

// Host memory is only read or written before these return.
static int tg_htod(tg_driver* d, void* ctx, void* stream, tg_dptr dst, const void* src, size_t n) {
	int r = d->cuCtxSetCurrent(ctx);
	if (r) return r;
	if ((r = d->cuMemcpyHtoDAsync(dst, src, n, stream))) return r;
	return d->cuStreamSynchronize(stream);
}

static int tg_dtoh(tg_driver* d, void* ctx, void* stream, void* dst, tg_dptr src, size_t n) {
	int r = d->cuCtxSetCurrent(ctx);
	if (r) return r;
	if ((r = d->cuMemcpyDtoHAsync(dst, src, n, stream))) return r;
	return d->cuStreamSynchronize(stream);
}

static int tg_dtod(tg_driver* d, void* ctx, void* stream, tg_dptr dst, tg_dptr src, size_t n) {
	int r = d->cuCtxSetCurrent(ctx);
	if (r) return r;
	return d->cuMemcpyDtoDAsync(dst, src, n, stream);
}

static int tg_memset8(tg_driver* d, void* ctx, void* stream, tg_dptr dst, unsigned char v, size_t n) {
	int r = d->cuCtxSetCurrent(ctx);
	if (r) return r;
	return d->cuMemsetD8Async(dst, v, n, stream);
}

static int tg_memset32(tg_driver* d, void* ctx, void* stream, tg_dptr dst, unsigned v, size_t n) {
	int r = d->cuCtxSetCurrent(ctx);
	if (r) return r;
	return d->cuMemsetD32Async(dst, v, n, stream);
}

// tg_setctx_fn is cuCtxSetCurrent, for the other C files of this package
// (nccl.go), which make the context current before their calls too.
static void* tg_setctx_fn(tg_driver* d) { return (void*)d->cuCtxSetCurrent; }

static int tg_sync(tg_driver* d, void* ctx, void* stream) {
	int r = d->cuCtxSetCurrent(ctx);
	if (r) return r;
	return d->cuStreamSynchronize(stream);
}

// JIT option ids from cuda.h's CUjit_option.
enum { TG_JIT_ERROR_LOG_BUFFER = 5, TG_JIT_ERROR_LOG_BUFFER_SIZE_BYTES = 6 };

static int tg_module_load(tg_driver* d, void* ctx, const char* image, void** mod, char* log,
                          size_t loglen) {
	int r = d->cuCtxSetCurrent(ctx);
	if (r) return r;
	int opts[2] = {TG_JIT_ERROR_LOG_BUFFER, TG_JIT_ERROR_LOG_BUFFER_SIZE_BYTES};
	void* vals[2] = {log, (void*)loglen};
	log[0] = 0;
	return d->cuModuleLoadDataEx(mod, image, 2, opts, vals);
}

static int tg_module_unload(tg_driver* d, void* ctx, void* mod) {
	int r = d->cuCtxSetCurrent(ctx);
	if (r) return r;
	return d->cuModuleUnload(mod);
}

static int tg_function(tg_driver* d, void* ctx, void* mod, const char* name, void** fn) {
	int r = d->cuCtxSetCurrent(ctx);
	if (r) return r;
	return d->cuModuleGetFunction(fn, mod, name);
}

// CU_FUNC_ATTRIBUTE_MAX_DYNAMIC_SHARED_SIZE_BYTES: a kernel may use more
// than the default 48 KiB of dynamic shared memory only after this.
enum { TG_FUNC_MAX_DYN_SMEM = 8 };

static int tg_func_smem(tg_driver* d, void* ctx, void* fn, int bytes) {
	int r = d->cuCtxSetCurrent(ctx);
	if (r) return r;
	return d->cuFuncSetAttribute(fn, TG_FUNC_MAX_DYN_SMEM, bytes);
}

static int tg_launch(tg_driver* d, void* ctx, void* stream, void* fn, unsigned gx, unsigned gy,
                     unsigned gz, unsigned bx, unsigned smem, void** params) {
	int r = d->cuCtxSetCurrent(ctx);
	if (r) return r;
	return d->cuLaunchKernel(fn, gx, gy, gz, bx, 1, 1, smem, stream, params, NULL);
}

static int tg_event_create(tg_driver* d, void* ctx, void** ev) {
	int r = d->cuCtxSetCurrent(ctx);
	if (r) return r;
	return d->cuEventCreate(ev, 0);
}

static int tg_event_destroy(tg_driver* d, void* ctx, void* ev) {
	int r = d->cuCtxSetCurrent(ctx);
	if (r) return r;
	return d->cuEventDestroy(ev);
}

static int tg_event_record(tg_driver* d, void* ctx, void* ev, void* stream) {
	int r = d->cuCtxSetCurrent(ctx);
	if (r) return r;
	return d->cuEventRecord(ev, stream);
}

static int tg_stream_create(tg_driver* d, void* ctx, void** stream) {
	int r = d->cuCtxSetCurrent(ctx);
	if (r) return r;
	return d->cuStreamCreate(stream, 0);
}

static int tg_stream_destroy(tg_driver* d, void* ctx, void* stream) {
	int r = d->cuCtxSetCurrent(ctx);
	if (r) return r;
	return d->cuStreamDestroy(stream);
}

// tg_stream_after makes stream wait for every operation queued on other
// so far, through ev (recorded on other, waited for by stream).
static int tg_stream_after(tg_driver* d, void* ctx, void* stream, void* other, void* ev) {
	int r = d->cuCtxSetCurrent(ctx);
	if (r) return r;
	if ((r = d->cuEventRecord(ev, other))) return r;
	return d->cuStreamWaitEvent(stream, ev, 0);
}

static int tg_event_elapsed(tg_driver* d, void* ctx, void* a, void* b, float* ms) {
	int r = d->cuCtxSetCurrent(ctx);
	if (r) return r;
	if ((r = d->cuEventSynchronize(b))) return r;
	return d->cuEventElapsedTime(ms, a, b);
}

static int tg_blas_create(tg_driver* d, void* ctx, tg_blas* b, void* stream, void** h, int* ver) {
	int r = d->cuCtxSetCurrent(ctx);
	if (r) return r;
	if ((r = b->create(h))) return r;
	if ((r = b->setStream(*h, stream))) return r;
	return b->getVersion(*h, ver);
}

static int tg_blas_destroy(tg_driver* d, void* ctx, tg_blas* b, void* h) {
	int r = d->cuCtxSetCurrent(ctx);
	if (r) return r;
	return b->destroy(h);
}

// Column-major C (m,n) = alpha·op(A)·op(B) + beta·C, fp32 scalars (compute
// types 32F and 32F_FAST_TF32).
static int tg_gemm(tg_driver* d, void* ctx, tg_blas* b, void* h, int ta, int tb, int m, int n,
                   int k, float alpha, tg_dptr A, int at, int lda, tg_dptr B, int bt, int ldb,
                   float beta, tg_dptr C, int ct, int ldc, int compute) {
	int r = d->cuCtxSetCurrent(ctx);
	if (r) return r;
	return b->gemmEx(h, ta, tb, m, n, k, &alpha, (const void*)A, at, lda, (const void*)B, bt, ldb,
	                 &beta, (void*)C, ct, ldc, compute, -1);
}
*/
import "C"

import (
	"fmt"
	"os"
	"path/filepath"
	"slices"
	"strings"
	"unsafe"
)

// driver is a loaded libcuda.
type driver struct {
	path   string
	choice LibraryChoice
	d      *C.tg_driver // C memory
}

// blasLib is a loaded cuBLAS.
type blasLib struct {
	path    string
	choices []LibraryChoice // cuBLASLt's first, when it was loaded from beside cuBLAS
	b       *C.tg_blas      // C memory
}

// loadTable dlopens path and resolves the n symbols at syms (a C tg_sym
// array) into the C struct at tab; what names the library in errors.
func loadTable(path string, tab, syms unsafe.Pointer, n C.size_t, what string) error {
	cpath := C.CString(path)
	defer C.free(unsafe.Pointer(cpath))
	var buf [512]C.char
	switch C.tg_open(cpath, tab, (*C.tg_sym)(syms), n, &buf[0], C.size_t(len(buf))) {
	case 0:
		return nil
	case 1:
		return fmt.Errorf("cuda: load %s %q: %s", what, path, C.GoString(&buf[0]))
	default:
		return fmt.Errorf("cuda: load %s %q: the library has no symbol %s (is it really the %s?)",
			what, path, C.GoString(&buf[0]), what)
	}
}

// openLib loads a library into the C function table at tab from the n
// symbols at syms: explicit when it is not empty (as it is, its error
// unchanged), else the first of cands that loads. A candidate that fails
// (missing, another architecture, a dependency missing, a symbol missing)
// is passed over, and the choice says why (passed starts that list: what
// the caller left out); prepare, if not nil, runs before each candidate is
// opened and says what else it loaded. hint ends the error when nothing
// loads.
func openLib(spec libSpec, explicit string, cands []libCandidate, passed []string, tab, syms unsafe.Pointer, n C.size_t,
	prepare func(path string) ([]LibraryChoice, error), hint string) (LibraryChoice, []LibraryChoice, error) {
	if explicit != "" {
		c := LibraryChoice{Name: spec.name, Path: explicit, From: "named explicitly"}
		if err := loadTable(explicit, tab, syms, n, spec.name); err != nil {
			c.Path, c.Err = "", err
			return c, nil, err
		}
		return c, nil, nil
	}
	c := LibraryChoice{Name: spec.name, Passed: passed}
	var lastErr error
	onDisk := len(passed) > 0 // a file was found, and not loaded
	for _, cand := range cands {
		var pre []LibraryChoice
		if prepare != nil {
			var err error
			if pre, err = prepare(cand.Path); err != nil {
				c.Passed = append(c.Passed, fmt.Sprintf("%s (%s): %v", cand.Path, cand.From, err))
				continue
			}
		}
		if err := loadTable(cand.Path, tab, syms, n, spec.name); err != nil {
			c.Passed = append(c.Passed, fmt.Sprintf("%s (%s): %v", cand.Path, cand.From, err))
			lastErr = err
			onDisk = onDisk || strings.Contains(cand.Path, "/")
			continue
		}
		c.Path, c.From = cand.Path, cand.From
		return c, pre, nil
	}
	if spec.brief && lastErr != nil && !onDisk {
		// Nothing of the name on disk: one line (what --backend auto prints
		// on every machine without a GPU).
		c.Err = fmt.Errorf("%w (nor in the %d directories searched: %s); %s", lastErr, len(hostSearch.dirs(spec)), hostSearch.froms(spec), hint)
		return c, nil, c.Err
	}
	c.Err = fmt.Errorf("cuda: no %s found: no %s loads from the directories searched%s\nnor through the loader's own search; tried:\n  %s\n%s",
		spec.name, strings.Join(spec.files, ", "), hostSearch.searched(spec), strings.Join(c.Passed, "\n  "), hint)
	return c, nil, c.Err
}

func openDriver(path string) (*driver, error) {
	if path == "" {
		path = os.Getenv("TRACEGRPO_CUDA_DRIVER")
	}
	d := (*C.tg_driver)(C.calloc(1, C.size_t(unsafe.Sizeof(C.tg_driver{}))))
	var nsyms C.size_t
	syms := C.tg_driver_table(&nsyms)
	// The loader's own libcuda.so.1 first: on a machine with a driver it
	// is the right one; the search is for containers whose loader cache
	// does not list the mounted driver.
	cands := []libCandidate{{"libcuda.so.1", "the loader's search"}}
	if path == "" {
		for _, c := range hostSearch.candidates(driverSpec) {
			if c.Path != "libcuda.so.1" {
				cands = append(cands, c)
			}
		}
	}
	choice, _, err := openLib(driverSpec, path, cands, nil, unsafe.Pointer(d), unsafe.Pointer(syms), nsyms, nil,
		"no NVIDIA driver on this machine? use --backend cpu, or set TRACEGRPO_CUDA_DRIVER to libcuda.so.1")
	if err != nil {
		C.free(unsafe.Pointer(d))
		if path != "" && !strings.Contains(path, "/") && !strings.Contains(err.Error(), "no symbol") {
			err = fmt.Errorf("%w (no NVIDIA driver on this machine? use --backend cpu)", err)
		}
		return nil, err
	}
	if path == "" {
		choice.From = cands[0].From
		for _, c := range cands {
			if c.Path == choice.Path {
				choice.From = c.From
			}
		}
	}
	return &driver{path: choice.Path, choice: choice, d: d}, nil
}

// openBlas loads cuBLAS: path, else $TRACEGRPO_CUDA_BLAS, else the newest
// cuBLAS a driver of CUDA version driverVersion (0: unknown) runs, found
// by libsearch.go's search. A cuBLAS found in a directory is opened after
// the cuBLASLt beside it, which it needs and whose directory the loader
// may not search.
func openBlas(path string, driverVersion int) (*blasLib, error) {
	if path == "" {
		path = os.Getenv("TRACEGRPO_CUDA_BLAS")
	}
	majors := blasMajors(driverVersion)
	spec := blasSpec(majors)
	var cands []libCandidate
	var passed []string
	if path == "" {
		cands = hostSearch.candidates(spec)
		// A cuBLAS newer than the driver is found but not loaded: say so.
		for _, m := range []int{13, 12, 11} {
			if !slices.Contains(majors, m) {
				for _, c := range hostSearch.candidates(blasSpec([]int{m})) {
					if strings.Contains(c.Path, "/") {
						passed = append(passed, fmt.Sprintf("%s (%s): it needs a CUDA %d driver, this one is CUDA %d.%d",
							c.Path, c.From, m, driverVersion/1000, driverVersion%1000/10))
					}
				}
			}
		}
	}
	prepare := func(p string) ([]LibraryChoice, error) {
		if !strings.Contains(p, "/") {
			return nil, nil
		}
		lt := filepath.Join(filepath.Dir(p), strings.Replace(filepath.Base(p), "libcublas.", "libcublasLt.", 1))
		if _, err := os.Stat(lt); err != nil {
			return nil, nil
		}
		clt := C.CString(lt)
		defer C.free(unsafe.Pointer(clt))
		var buf [512]C.char
		if C.tg_preload(clt, &buf[0], C.size_t(len(buf))) != 0 {
			return nil, fmt.Errorf("load cuBLASLt %q beside it: %s", lt, C.GoString(&buf[0]))
		}
		return []LibraryChoice{{Name: "cuBLASLt", Path: lt, From: "beside cuBLAS, loaded first so that cuBLAS finds it"}}, nil
	}
	b := (*C.tg_blas)(C.calloc(1, C.size_t(unsafe.Sizeof(C.tg_blas{}))))
	var nsyms C.size_t
	syms := C.tg_blas_table(&nsyms)
	choice, pre, err := openLib(spec, path, cands, passed, unsafe.Pointer(b), unsafe.Pointer(syms), nsyms, prepare,
		"set TRACEGRPO_CUDA_LIBS to the directory holding libcublas.so.N (pip install nvidia-cublas for CUDA 13, nvidia-cublas-cu12 for 12)")
	if err != nil {
		C.free(unsafe.Pointer(b))
		return nil, err
	}
	return &blasLib{path: choice.Path, choices: append(pre, choice), b: b}, nil
}

// Libraries loads the CUDA driver, cuBLAS (with the cuBLASLt beside it) and
// NCCL as Open and OpenNCCL would (opt's DriverLib and BlasLib, the
// environment, then libsearch.go's search), without creating a context,
// and says which file each came from and what it passed over on the way:
// scripts/gpu-check.sh's preflight prints it before anything runs.
func Libraries(opt Options) []LibraryChoice {
	var out []LibraryChoice
	dr, err := openDriver(opt.DriverLib)
	if err != nil {
		return append(out, LibraryChoice{Name: driverSpec.name, Err: err})
	}
	defer C.free(unsafe.Pointer(dr.d))
	var ver C.int
	if err := dr.check("cuInit", C.tg_driver_version(dr.d, &ver)); err != nil {
		dr.choice.Err = err
	}
	dr.choice.Name = fmt.Sprintf("CUDA driver (CUDA %d.%d)", int(ver)/1000, int(ver)%1000/10)
	out = append(out, dr.choice)
	if bl, err := openBlas(opt.BlasLib, int(ver)); err != nil {
		out = append(out, LibraryChoice{Name: "cuBLAS", Err: err})
	} else {
		out = append(out, bl.choices...)
		bl.free()
	}
	if nl, err := openNCCLLib(""); err != nil {
		out = append(out, LibraryChoice{Name: "NCCL", Err: err})
	} else {
		nl.choice.Name = "NCCL " + ncclVersionString(nl.version)
		out = append(out, nl.choice)
		C.free(unsafe.Pointer(nl.n))
	}
	return out
}

// free frees the function table; the library stays loaded (Libraries,
// tests: an open device keeps its table).
func (bl *blasLib) free() { C.free(unsafe.Pointer(bl.b)) }

// errText renders a CUresult.
func (dr *driver) errText(code C.int) string {
	var name, str *C.char
	C.tg_err_text(dr.d, code, &name, &str)
	n, s := "unknown", "unknown error"
	if name != nil {
		n = C.GoString(name)
	}
	if str != nil {
		s = C.GoString(str)
	}
	return fmt.Sprintf("%s (%s, %d)", s, n, int(code))
}

func (dr *driver) check(what string, code C.int) error {
	if code == 0 {
		return nil
	}
	return fmt.Errorf("cuda: %s: %s", what, dr.errText(code))
}

// blasStatusText names a cublasStatus_t (cublas_api.h).
func blasStatusText(code C.int) string {
	names := map[int]string{
		1: "CUBLAS_STATUS_NOT_INITIALIZED", 3: "CUBLAS_STATUS_ALLOC_FAILED",
		7: "CUBLAS_STATUS_INVALID_VALUE", 8: "CUBLAS_STATUS_ARCH_MISMATCH",
		11: "CUBLAS_STATUS_MAPPING_ERROR", 13: "CUBLAS_STATUS_EXECUTION_FAILED",
		14: "CUBLAS_STATUS_INTERNAL_ERROR", 15: "CUBLAS_STATUS_NOT_SUPPORTED",
		16: "CUBLAS_STATUS_LICENSE_ERROR",
	}
	if n, ok := names[int(code)]; ok {
		return fmt.Sprintf("%s (%d)", n, int(code))
	}
	return fmt.Sprintf("cublasStatus %d", int(code))
}

// DeviceInfo describes the device a backend runs on.
type DeviceInfo struct {
	Ordinal       int
	Name          string
	Major, Minor  int // compute capability
	SMs           int
	SmemOptin     int // shared memory a block may opt in to, bytes
	TotalMem      int64
	DriverVersion int // e.g. 12080 for 12.8
	BlasVersion   int
	DriverPath    string
	BlasPath      string
	// BlasLtPath is the cuBLASLt the GEMMs run on ("" when they run on
	// cublasGemmEx: none loaded, or Options.BlasLtLib "none").
	BlasLtPath    string
	BlasLtVersion int
}

func (i DeviceInfo) String() string {
	lt := "GEMMs on cublasGemmEx"
	if i.BlasLtPath != "" {
		lt = fmt.Sprintf("GEMMs on cuBLASLt %d from %s", i.BlasLtVersion, i.BlasLtPath)
	}
	return fmt.Sprintf("%s (device %d, sm_%d%d, %d SMs, %.1f GiB, driver %d.%d, cuBLAS %d from %s, %s)",
		i.Name, i.Ordinal, i.Major, i.Minor, i.SMs, float64(i.TotalMem)/(1<<30),
		i.DriverVersion/1000, i.DriverVersion%1000/10, i.BlasVersion, i.BlasPath, lt)
}

func (dr *driver) deviceInfo(ordinal int) (DeviceInfo, C.int, error) {
	var ver, n C.int
	if err := dr.check("cuInit", C.tg_driver_version(dr.d, &ver)); err != nil {
		return DeviceInfo{}, 0, err
	}
	if err := dr.check("cuDeviceGetCount", C.tg_device_count(dr.d, &n)); err != nil {
		return DeviceInfo{}, 0, err
	}
	if ordinal < 0 || ordinal >= int(n) {
		return DeviceInfo{}, 0, fmt.Errorf("cuda: device %d requested, the driver %s sees %d device(s)", ordinal, dr.path, int(n))
	}
	var dev, major, minor, sms, optin C.int
	var mem C.size_t
	var name [256]C.char
	if err := dr.check(fmt.Sprintf("query device %d", ordinal),
		C.tg_device_info(dr.d, C.int(ordinal), &dev, &name[0], C.int(len(name)), &major, &minor, &sms, &optin, &mem)); err != nil {
		return DeviceInfo{}, 0, err
	}
	return DeviceInfo{
		Ordinal: ordinal, Name: C.GoString(&name[0]), Major: int(major), Minor: int(minor),
		SMs: int(sms), SmemOptin: int(optin), TotalMem: int64(mem), DriverVersion: int(ver), DriverPath: dr.path,
	}, dev, nil
}

// Probe loads the driver and describes device opt.Device without creating a
// context: what `--backend auto` uses to decide, and to say why.
func Probe(opt Options) (string, error) {
	dr, err := openDriver(opt.DriverLib)
	if err != nil {
		return "", err
	}
	info, _, err := dr.deviceInfo(opt.Device)
	if err != nil {
		return "", err
	}
	if info.Major < 8 {
		return "", fmt.Errorf("cuda: %s has compute capability %d.%d; the kernels need 8.0 or newer", info.Name, info.Major, info.Minor)
	}
	return fmt.Sprintf("%s (sm_%d%d, %d SMs, driver %d.%d)", info.Name, info.Major, info.Minor, info.SMs,
		info.DriverVersion/1000, info.DriverVersion%1000/10), nil
}

// device is an open context on one device: the driver, the primary context,
// one stream, cuBLAS and the kernel-argument slots. Its methods return
// errors; Backend turns them into the sticky error.
type device struct {
	dr     *driver
	bl     *blasLib
	dev    C.int
	ctx    unsafe.Pointer
	stream unsafe.Pointer
	handle unsafe.Pointer // cublasHandle_t
	info   DeviceInfo
	// lt is cuBLASLt (blaslt.go), nil when the GEMMs run on cublasGemmEx;
	// ltChoice says where it was loaded from, or why it was not.
	lt       *ltState
	ltChoice LibraryChoice

	args   *[maxArgs]uint64 // C memory: argument values
	params unsafe.Pointer   // C memory: void*[maxArgs] pointing into args
	mods   []unsafe.Pointer
	fns    map[string]unsafe.Pointer
	smem   map[unsafe.Pointer]int // dynamic shared memory opted in per kernel (above 48 KiB)

	// Bytes allocated through alloc and not yet freed, their peak, and
	// each live allocation's size (Backend.Allocated).
	live, peak int64
	sizes      map[uintptr]int
}

const maxArgs = 32

func openDevice(opt Options) (*device, error) {
	var dr *driver
	var err error
	if opt.meter {
		dr = &driver{path: meterPath, d: C.tg_meter_driver()}
	} else if dr, err = openDriver(opt.DriverLib); err != nil {
		return nil, err
	}
	info, dev, err := dr.deviceInfo(opt.Device)
	if err != nil {
		return nil, err
	}
	if info.Major < 8 {
		return nil, fmt.Errorf("cuda: %s has compute capability %d.%d; the kernels need 8.0 or newer", info.Name, info.Major, info.Minor)
	}
	var bl *blasLib
	if opt.meter {
		bl = &blasLib{path: meterPath, b: C.tg_meter_blas()}
	} else if bl, err = openBlas(opt.BlasLib, info.DriverVersion); err != nil {
		return nil, err
	}
	info.BlasPath = bl.path
	d := &device{dr: dr, bl: bl, dev: dev, info: info, fns: map[string]unsafe.Pointer{}, smem: map[unsafe.Pointer]int{}}
	if err := dr.check("create primary context", C.tg_context(dr.d, dev, &d.ctx, &d.stream)); err != nil {
		return nil, err
	}
	var ver C.int
	if code := C.tg_blas_create(dr.d, d.ctx, bl.b, d.stream, &d.handle, &ver); code != 0 {
		d.close()
		return nil, fmt.Errorf("cuda: create cuBLAS handle (%s): %s", bl.path, blasStatusText(code))
	}
	d.info.BlasVersion = int(ver)
	var lib *ltLib
	if opt.meter {
		lib, d.ltChoice = meterLt(), LibraryChoice{Name: "cuBLASLt", Path: meterPath, From: "the metering device"}
	} else {
		lib, d.ltChoice = openBlasLt(opt.BlasLtLib, bl.path)
	}
	if lib != nil {
		if err := d.openLt(lib); err != nil {
			// A cuBLASLt that loads but cannot start leaves the GEMMs on
			// cublasGemmEx, and says so.
			d.ltChoice.Path, d.ltChoice.Err = "", fmt.Errorf("%w: the GEMMs run on cublasGemmEx", err)
		}
	}
	d.info.BlasLtPath, d.info.BlasLtVersion = d.ltChoice.Path, 0
	if d.lt != nil {
		d.info.BlasLtVersion = lib.version
	}
	d.args = (*[maxArgs]uint64)(C.calloc(maxArgs, 8))
	d.params = C.calloc(maxArgs, C.size_t(unsafe.Sizeof(uintptr(0))))
	ps := unsafe.Slice((*unsafe.Pointer)(d.params), maxArgs)
	for i := range ps {
		ps[i] = unsafe.Pointer(&d.args[i])
	}
	return d, nil
}

// loadModule loads one module image, PTX text (which the driver compiles
// for the device) or a cubin, and resolves the given entry points.
func (d *device) loadModule(file string, image []byte, entries []string) error {
	img := C.CBytes(append(image[:len(image):len(image)], 0)) // a copy in C memory, NUL-terminated for PTX
	defer C.free(img)
	var log [4096]C.char
	var mod unsafe.Pointer
	if code := C.tg_module_load(d.dr.d, d.ctx, (*C.char)(img), &mod, &log[0], C.size_t(len(log))); code != 0 {
		return fmt.Errorf("cuda: load %s: %s\n%s", file, d.dr.errText(code), C.GoString(&log[0]))
	}
	d.mods = append(d.mods, mod)
	for _, e := range entries {
		ce := C.CString(e)
		var fn unsafe.Pointer
		code := C.tg_function(d.dr.d, d.ctx, mod, ce, &fn)
		C.free(unsafe.Pointer(ce))
		if code != 0 {
			return fmt.Errorf("cuda: %s: kernel %s: %s", file, e, d.dr.errText(code))
		}
		d.fns[e] = fn
	}
	return nil
}

func (d *device) close() error {
	var first error
	keep := func(err error) {
		if first == nil {
			first = err
		}
	}
	keep(d.closeLt())
	if d.handle != nil {
		if code := C.tg_blas_destroy(d.dr.d, d.ctx, d.bl.b, d.handle); code != 0 {
			keep(fmt.Errorf("cuda: destroy cuBLAS handle: %s", blasStatusText(code)))
		}
		d.handle = nil
	}
	for _, m := range d.mods {
		keep(d.dr.check("unload module", C.tg_module_unload(d.dr.d, d.ctx, m)))
	}
	d.mods = nil
	if d.ctx != nil {
		keep(d.dr.check("release context", C.tg_release(d.dr.d, d.dev, d.ctx, d.stream)))
		d.ctx, d.stream = nil, nil
	}
	if d.args != nil {
		C.free(unsafe.Pointer(d.args))
		C.free(d.params)
		d.args, d.params = nil, nil
	}
	return first
}

func (d *device) alloc(bytes int) (uintptr, error) {
	var p C.tg_dptr
	if err := d.dr.check(fmt.Sprintf("cuMemAlloc %d bytes", bytes),
		C.tg_alloc(d.dr.d, d.ctx, d.stream, &p, C.size_t(bytes))); err != nil {
		return 0, err
	}
	if d.sizes == nil {
		d.sizes = map[uintptr]int{}
	}
	d.sizes[uintptr(p)] = bytes
	d.live += int64(bytes)
	d.peak = max(d.peak, d.live)
	return uintptr(p), nil
}

func (d *device) free(p uintptr) status {
	d.live -= int64(d.sizes[p])
	delete(d.sizes, p)
	return C.tg_free(d.dr.d, d.ctx, C.tg_dptr(p))
}

// memInfo returns the device's free and total memory (cuMemGetInfo).
func (d *device) memInfo() (free, total int64, err error) {
	var f, t C.size_t
	if err := d.dr.check("cuMemGetInfo", C.tg_mem_info(d.dr.d, d.ctx, &f, &t)); err != nil {
		return 0, 0, err
	}
	return int64(f), int64(t), nil
}

// htod copies bytes from host memory at src; src is read before it returns.
func (d *device) htod(dst uintptr, src unsafe.Pointer, bytes int) status {
	if bytes == 0 {
		return 0
	}
	return C.tg_htod(d.dr.d, d.ctx, d.stream, C.tg_dptr(dst), src, C.size_t(bytes))
}

// dtoh waits for the stream and copies bytes into host memory at dst.
func (d *device) dtoh(dst unsafe.Pointer, src uintptr, bytes int) status {
	if bytes == 0 {
		return C.tg_sync(d.dr.d, d.ctx, d.stream)
	}
	return C.tg_dtoh(d.dr.d, d.ctx, d.stream, dst, C.tg_dptr(src), C.size_t(bytes))
}

func (d *device) dtod(dst, src uintptr, bytes int) status {
	if bytes == 0 {
		return 0
	}
	return C.tg_dtod(d.dr.d, d.ctx, d.stream, C.tg_dptr(dst), C.tg_dptr(src), C.size_t(bytes))
}

func (d *device) memset8(dst uintptr, v byte, n int) status {
	return C.tg_memset8(d.dr.d, d.ctx, d.stream, C.tg_dptr(dst), C.uchar(v), C.size_t(n))
}

func (d *device) memset32(dst uintptr, v uint32, n int) status {
	if n == 0 {
		return 0
	}
	return C.tg_memset32(d.dr.d, d.ctx, d.stream, C.tg_dptr(dst), C.uint(v), C.size_t(n))
}

func (d *device) sync() status { return C.tg_sync(d.dr.d, d.ctx, d.stream) }

// setCtxFn is the driver's cuCtxSetCurrent, as a C function pointer.
func (d *device) setCtxFn() unsafe.Pointer { return C.tg_setctx_fn(d.dr.d) }

// defaultSmem is the dynamic shared memory every kernel may use without
// opting in.
const defaultSmem = 48 << 10

// launch queues kernel fn with a 1-D block; args are raw 8-byte slots (the
// driver reads each parameter's size from its slot's low bytes). A launch
// with more than 48 KiB of dynamic shared memory first raises the kernel's
// limit (cuFuncSetAttribute), once per kernel and size.
func (d *device) launch(fn unsafe.Pointer, gx, gy, gz, bx, smem int, args []uint64) status {
	if len(args) > maxArgs {
		panic("cuda: too many kernel arguments")
	}
	if smem > defaultSmem && smem > d.smem[fn] {
		if code := C.tg_func_smem(d.dr.d, d.ctx, fn, C.int(smem)); code != 0 {
			return code
		}
		d.smem[fn] = smem
	}
	copy(d.args[:], args)
	return C.tg_launch(d.dr.d, d.ctx, d.stream, fn, C.uint(gx), C.uint(gy), C.uint(gz), C.uint(bx),
		C.uint(smem), (*unsafe.Pointer)(d.params))
}

// gemm is cublasGemmEx in column-major terms.
func (d *device) gemm(ta, tb bool, m, n, k int, alpha float32, A uintptr, at, lda int, B uintptr, bt, ldb int,
	beta float32, Cp uintptr, ct, ldc int, compute int) status {
	b2i := func(b bool) status {
		if b {
			return 1
		}
		return 0
	}
	return C.tg_gemm(d.dr.d, d.ctx, d.bl.b, d.handle, b2i(ta), b2i(tb), C.int(m), C.int(n), C.int(k),
		C.float(alpha), C.tg_dptr(A), C.int(at), C.int(lda), C.tg_dptr(B), C.int(bt), C.int(ldb),
		C.float(beta), C.tg_dptr(Cp), C.int(ct), C.int(ldc), C.int(compute))
}

// event is a CUDA event for timing.
type event struct{ p unsafe.Pointer }

func (d *device) newEvent() (event, error) {
	var e event
	err := d.dr.check("cuEventCreate", C.tg_event_create(d.dr.d, d.ctx, &e.p))
	return e, err
}

func (d *device) destroyEvent(e event) error {
	return d.dr.check("cuEventDestroy", C.tg_event_destroy(d.dr.d, d.ctx, e.p))
}

func (d *device) record(e event) error {
	return d.dr.check("cuEventRecord", C.tg_event_record(d.dr.d, d.ctx, e.p, d.stream))
}

// elapsed waits for b and returns the milliseconds between a and b.
func (d *device) elapsed(a, b event) (float32, error) {
	var ms C.float
	err := d.dr.check("cuEventElapsedTime", C.tg_event_elapsed(d.dr.d, d.ctx, a.p, b.p, &ms))
	return float32(ms), err
}

func (d *device) errText(code status) string { return d.dr.errText(code) }

// newStream creates a second stream on the device (NCCL's, to overlap
// collectives with the compute stream).
func (d *device) newStream() (unsafe.Pointer, error) {
	var s unsafe.Pointer
	err := d.dr.check("cuStreamCreate", C.tg_stream_create(d.dr.d, d.ctx, &s))
	return s, err
}

// recordOn records e on stream.
func (d *device) recordOn(e event, stream unsafe.Pointer) error {
	return d.dr.check("cuEventRecord", C.tg_event_record(d.dr.d, d.ctx, e.p, stream))
}

func (d *device) destroyStream(s unsafe.Pointer) error {
	return d.dr.check("cuStreamDestroy", C.tg_stream_destroy(d.dr.d, d.ctx, s))
}

// streamAfter makes stream wait for everything queued on other so far
// (ev is recorded on other; it may be recorded again once this returns).
func (d *device) streamAfter(stream, other unsafe.Pointer, ev event) error {
	return d.dr.check("cuStreamWaitEvent", C.tg_stream_after(d.dr.d, d.ctx, stream, other, ev.p))
}

// status is a CUresult or cublasStatus_t; 0 is success.
type status = C.int
