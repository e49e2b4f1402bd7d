// meter.h: the metering device's driver and cuBLAS tables (OpenMeter).
// Included by driver.go's cgo preamble after tg_driver and tg_blas. Every
// function succeeds and does nothing: allocations are addresses from a
// counter with no memory behind them (the device is an H200's 143771 MiB),
// launches and GEMMs return at once, downloads read zeros. The backend's
// own code (its shapes, grids, kernel choices, scratch) runs unchanged
// above it, and its ledger records what a real device would be asked to do.
#pragma once

#define TGM_TOTAL ((size_t)143771 << 20)
#define TGM_BASE 0x10000000000ull
#define TGM_MAXALLOC 65536

// Live allocations: address and size (frees are rare and allocations few).
static tg_dptr tgm_ptr[TGM_MAXALLOC];
static size_t tgm_size[TGM_MAXALLOC];
static int tgm_n;
static tg_dptr tgm_next = TGM_BASE;
static size_t tgm_live;
static char tgm_objs[4096];  // the handles the tables hand out
static int tgm_obj;

static void* tgm_handle(void) { return &tgm_objs[tgm_obj++ % 4096]; }

static int tgm_init(unsigned f) { return 0; }
static int tgm_version(int* v) { *v = 13000; return 0; }
static int tgm_count(int* n) { *n = 1; return 0; }
static int tgm_get(int* d, int o) { *d = o; return 0; }
static int tgm_name(char* s, int n, int d) { snprintf(s, n, "NVIDIA H200 (metered: nothing runs)"); return 0; }
static int tgm_attr(int* v, int attr, int d) {
	switch (attr) {
	case 16: *v = 132; return 0;     // SMs
	case 75: *v = 9; return 0;       // compute capability 9.0
	case 76: *v = 0; return 0;
	case 97: *v = 232448; return 0;  // 227 KiB of shared memory a block may opt in to
	}
	return 1;
}
static int tgm_total(size_t* m, int d) { *m = TGM_TOTAL; return 0; }
static int tgm_retain(void** c, int d) { *c = tgm_handle(); return 0; }
static int tgm_release(int d) { return 0; }
static int tgm_setctx(void* c) { return 0; }
static int tgm_alloc(tg_dptr* p, size_t n) {
	if (tgm_n == TGM_MAXALLOC || tgm_live + n > TGM_TOTAL) return 2;  // CUDA_ERROR_OUT_OF_MEMORY
	*p = tgm_next;
	tgm_next += (n + 511) / 512 * 512;
	tgm_ptr[tgm_n] = *p;
	tgm_size[tgm_n++] = n;
	tgm_live += n;
	return 0;
}
static int tgm_meminfo(size_t* f, size_t* t) { *t = TGM_TOTAL; *f = TGM_TOTAL - tgm_live; return 0; }
static int tgm_free(tg_dptr p) {
	for (int i = 0; i < tgm_n; i++) {
		if (tgm_ptr[i] == p) {
			tgm_live -= tgm_size[i];
			tgm_ptr[i] = tgm_ptr[--tgm_n];
			tgm_size[i] = tgm_size[tgm_n];
			return 0;
		}
	}
	return 1;
}
static int tgm_htod(tg_dptr d, const void* s, size_t n, void* st) { return 0; }
static int tgm_dtoh(void* d, tg_dptr s, size_t n, void* st) { memset(d, 0, n); return 0; }
static int tgm_dtod(tg_dptr d, tg_dptr s, size_t n, void* st) { return 0; }
static int tgm_memset8(tg_dptr d, unsigned char v, size_t n, void* st) { return 0; }
static int tgm_memset32(tg_dptr d, unsigned v, size_t n, void* st) { return 0; }
static int tgm_stream_create(void** s, unsigned f) { *s = tgm_handle(); return 0; }
static int tgm_ptr_op(void* p) { return 0; }
static int tgm_event_create(void** e, unsigned f) { *e = tgm_handle(); return 0; }
static int tgm_event_record(void* e, void* s) { return 0; }
static int tgm_elapsed(float* ms, void* a, void* b) { *ms = 0; return 0; }
static int tgm_wait(void* s, void* e, unsigned f) { return 0; }
static int tgm_load(void** m, const void* img, unsigned n, int* o, void** v) { *m = tgm_handle(); return 0; }
static int tgm_getfn(void** fn, void* m, const char* name) { *fn = tgm_handle(); return 0; }
static int tgm_fnattr(void* fn, int a, int v) { return 0; }
static int tgm_launch(void* f, unsigned gx, unsigned gy, unsigned gz, unsigned bx, unsigned by, unsigned bz,
                      unsigned smem, void* s, void** p, void** e) { return 0; }
static int tgm_errstr(int code, const char** s) { *s = "metered device"; return 0; }

static int tgmb_create(void** h) { *h = tgm_handle(); return 0; }
static int tgmb_setstream(void* h, void* s) { return 0; }
static int tgmb_version(void* h, int* v) { *v = 130000; return 0; }
static int tgmb_gemm(void* h, int ta, int tb, int m, int n, int k, const void* al, const void* A, int at,
                     int lda, const void* B, int bt, int ldb, const void* be, void* C, int ct, int ldc,
                     int compute, int algo) { return 0; }

// tg_meter_tables fills d and b with the metering functions.
static void tg_meter_tables(tg_driver* d, tg_blas* b) {
	static char lib;
	d->lib = &lib;
	d->cuInit = tgm_init;
	d->cuDriverGetVersion = tgm_version;
	d->cuDeviceGetCount = tgm_count;
	d->cuDeviceGet = tgm_get;
	d->cuDeviceGetName = tgm_name;
	d->cuDeviceGetAttribute = tgm_attr;
	d->cuDeviceTotalMem = tgm_total;
	d->cuDevicePrimaryCtxRetain = tgm_retain;
	d->cuDevicePrimaryCtxRelease = tgm_release;
	d->cuCtxSetCurrent = tgm_setctx;
	d->cuMemAlloc = tgm_alloc;
	d->cuMemGetInfo = tgm_meminfo;
	d->cuMemFree = tgm_free;
	d->cuMemcpyHtoDAsync = tgm_htod;
	d->cuMemcpyDtoHAsync = tgm_dtoh;
	d->cuMemcpyDtoDAsync = tgm_dtod;
	d->cuMemsetD8Async = tgm_memset8;
	d->cuMemsetD32Async = tgm_memset32;
	d->cuStreamCreate = tgm_stream_create;
	d->cuStreamDestroy = tgm_ptr_op;
	d->cuStreamSynchronize = tgm_ptr_op;
	d->cuEventCreate = tgm_event_create;
	d->cuEventDestroy = tgm_ptr_op;
	d->cuEventRecord = tgm_event_record;
	d->cuEventSynchronize = tgm_ptr_op;
	d->cuEventElapsedTime = tgm_elapsed;
	d->cuStreamWaitEvent = tgm_wait;
	d->cuModuleLoadDataEx = tgm_load;
	d->cuModuleUnload = tgm_ptr_op;
	d->cuModuleGetFunction = tgm_getfn;
	d->cuFuncSetAttribute = tgm_fnattr;
	d->cuLaunchKernel = tgm_launch;
	d->cuGetErrorString = tgm_errstr;
	d->cuGetErrorName = tgm_errstr;
	b->lib = &lib;
	b->create = tgmb_create;
	b->destroy = tgm_ptr_op;
	b->setStream = tgmb_setstream;
	b->getVersion = tgmb_version;
	b->gemmEx = tgmb_gemm;
}
