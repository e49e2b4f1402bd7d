// fakecuda.cpp: a CPU stand-in for libcuda.so.1 exporting the driver calls
// kernels/cuda binds, running the real kernels (compiled from csrc/*.cu with
// cuda_emu.h) on fibers. Device memory is host memory with a PROT_NONE page
// right after each allocation, so a kernel writing or reading past the end
// of a buffer crashes the test instead of passing silently. Launches check
// the limits a GPU enforces (block size, grid y/z, 48 KiB of dynamic shared
// memory unless cuFuncSetAttribute raised a kernel's limit, up to the 163 KiB
// an sm_80 block may opt in to) and abort on a barrier deadlock (divergent
// __syncthreads or a thread exiting while others wait at one).
//
// The schedule: a launch runs its blocks one at a time in a shuffled order,
// and each block's warps and lanes in shuffled orders (run_block), all drawn
// from one generator that cuInit seeds from $TRACEGRPO_EMU_SEED (default 1),
// so a seed replays a schedule exactly. Shared memory, static (the
// tg_emu_smem section, cuda_emu.h) and dynamic, is poisoned (0xFF bytes:
// NaN as a float, -1 as an int) at the start of every block, so a read of
// shared memory no thread of the block wrote shows.
//
// The warp-level tensor-core instructions (csrc/mma.cuh) are emulated here
// from the PTX ISA's fragment layouts: each lane deposits its fragments (or
// ldmatrix row address) in its warp's scratch, the warp meets at a barrier,
// and each lane computes its own result from the gathered operands. The
// scratch is double-buffered by barrier generation, so one barrier per
// instruction suffices: a lane can write the buffer again only after the
// next barrier, which every lane reaches after reading this one.
// mma.sync adds the 16 exact bf16 products and the addend one at a time in
// fp32, so its rounding is of the hardware's order (the tensor cores align
// the products to the largest exponent and truncate: at most an fp32 ulp of
// the largest partial sum per step), never the exact sum a double would give.
// Built with -DTG_EMU_MMA_MUTANT, the A fragment's lane mapping is wrong on
// purpose (the layout test must then fail: kernels/cuda's TestMMALayoutEmu).
#include <sys/mman.h>
#include <time.h>
#include <setjmp.h>
#include <ucontext.h>
#include <unistd.h>

#include <algorithm>
#include <cstdio>
#include <cstdlib>
#include <map>
#include <string>
#include <vector>

#include "cuda_emu.h"

static const int kSmemOptin = 163 * 1024;  // sm_80's per-block shared memory opt-in limit

typedef void (*tg_invoker)(void** params);
struct tg_kernel {
  const char* name;
  tg_invoker fn;
};
extern const tg_kernel tg_kernels[];
extern const int tg_nkernels;

tg_dim3 threadIdx, blockIdx, blockDim, gridDim;
char* tg_emu_dyn_smem;

// The bounds of the tg_emu_smem section (every static __shared__ variable
// of the kernels), which emu_test.go's linker script defines; weak, so that
// a build without that script still links (and poisons none).
extern "C" char __start_tg_emu_smem[] __attribute__((weak, visibility("hidden")));
extern "C" char __stop_tg_emu_smem[] __attribute__((weak, visibility("hidden")));

namespace {
// A fiber starts through makecontext/swapcontext once per block and then
// switches with _setjmp/_longjmp, which (unlike swapcontext) make no
// sigprocmask system call: the emulator spends its time in the kernels.
// One cp.async in flight: its data are captured at issue (the source is
// not written while a copy is in flight in these kernels) and land in dst
// at the wait.
struct CpOp {
  char* dst;
  unsigned char data[16];
  int size;
};
struct Fiber {
  ucontext_t ctx;
  jmp_buf jb;
  char* stack = nullptr;
  bool done = false, started = false;
  long wait_gen = -1;  // the block-barrier generation it waits on, or -1
  std::vector<CpOp> cp;          // cp.async ops issued and not yet waited for
  std::vector<size_t> cp_groups; // end index in cp of each committed group
};
const size_t kStack = 256 << 10;
ucontext_t sched;
jmp_buf sched_jb;
std::vector<Fiber> fibers;
int cur, nthreads;
int blk_arrived;
unsigned blk_gen;
int warp_arrived[32];
unsigned warp_gen[32];
uint64_t slots[32][32];
long progress;
uint64_t rng_state = 0x9e3779b97f4a7c15ull;
tg_invoker cur_fn;
void** cur_params;

void yield() {
  if (!_setjmp(fibers[cur].jb)) _longjmp(sched_jb, 1);
}

void cp_land(Fiber& f, size_t n) {  // completes the first n ops of f.cp
  for (size_t i = 0; i < n; i++) memcpy(f.cp[i].dst, f.cp[i].data, f.cp[i].size);
  f.cp.erase(f.cp.begin(), f.cp.begin() + n);
  for (size_t& e : f.cp_groups) e -= n;
}

void entry() {
  cur_fn(cur_params);
  cp_land(fibers[cur], fibers[cur].cp.size());  // copies left in flight still land
  fibers[cur].cp_groups.clear();
  fibers[cur].done = true;
  progress++;
  _longjmp(sched_jb, 1);  // never returns
}

void set_thread(int t) {
  cur = t;
  threadIdx = {(unsigned)t, 0, 0};
}
}  // namespace

void __syncthreads() {
  unsigned g = blk_gen;
  progress++;
  if (++blk_arrived == nthreads) {
    blk_arrived = 0;
    blk_gen++;
    return;
  }
  int me = cur;
  fibers[me].wait_gen = g;
  while (blk_gen == g) {
    yield();
    set_thread(me);
  }
  fibers[me].wait_gen = -1;
}

void tg_emu_warp_barrier() {
  int w = threadIdx.x >> 5;
  unsigned g = warp_gen[w];
  progress++;
  if (++warp_arrived[w] == 32) {
    warp_arrived[w] = 0;
    warp_gen[w]++;
    return;
  }
  int me = cur;
  while (warp_gen[w] == g) {
    yield();
    set_thread(me);
  }
}

uint64_t* tg_emu_warp_slots() { return slots[threadIdx.x >> 5]; }

namespace {
// Per-warp operand scratch of the tensor-core instructions, two buffers
// used alternately by barrier generation.
struct WarpOps {
  unsigned a[32][4];
  unsigned b[32][2];
  const char* addr[32];
};
WarpOps warp_ops[32][2];

float lo_f(unsigned x) {
  uint32_t u = x << 16;
  float f;
  memcpy(&f, &u, 4);
  return f;
}
float hi_f(unsigned x) {
  uint32_t u = x & 0xffff0000u;
  float f;
  memcpy(&f, &u, 4);
  return f;
}

void emu_fail(const char* what) {
  fprintf(stderr, "fakecuda: thread %u of block (%u,%u,%u): %s\n", threadIdx.x, blockIdx.x, blockIdx.y,
          blockIdx.z, what);
  abort();
}
}  // namespace

// A (16x16, row-major) element (r, k) lives in lane (r%8)*4 + (k%8)/2,
// register r/8 + 2*(k/8), half k%2; B (16x8, "col": stored n-major) element
// (k, n) in lane n*4 + (k%8)/2, register k/8, half k%2; D element (r, n) in
// lane (r%8)*4 + n/2, register 2*(r/8) + n%2 (PTX ISA, mma.m16n8k16).
void tg_emu_mma_bf16_16816(float acc[4], const unsigned a[4], const unsigned b[2]) {
  const int w = threadIdx.x >> 5, lane = threadIdx.x & 31;
  WarpOps& o = warp_ops[w][warp_gen[w] & 1];
  memcpy(o.a[lane], a, sizeof o.a[lane]);
  memcpy(o.b[lane], b, sizeof o.b[lane]);
  tg_emu_warp_barrier();
  // This lane's D elements are rows g, g+8 and columns 2t, 2t+1: gather
  // rows g and g+8 of A (from lanes 4g..4g+3) and columns 2t, 2t+1 of B
  // (from lanes 8t..8t+7), then four 16-term dot products.
  const int g = lane >> 2, t = lane & 3;
  float A0[16], A1[16], B0[16], B1[16];
  for (int q = 0; q < 4; q++) {  // lane 4g+q holds columns 2q, 2q+1 and 2q+8, 2q+9
#ifdef TG_EMU_MMA_MUTANT
    const unsigned* ar = o.a[q * 8 + g];  // lanes transposed: wrong on purpose
#else
    const unsigned* ar = o.a[g * 4 + q];
#endif
    A0[2 * q] = lo_f(ar[0]), A0[2 * q + 1] = hi_f(ar[0]);
    A1[2 * q] = lo_f(ar[1]), A1[2 * q + 1] = hi_f(ar[1]);
    A0[2 * q + 8] = lo_f(ar[2]), A0[2 * q + 9] = hi_f(ar[2]);
    A1[2 * q + 8] = lo_f(ar[3]), A1[2 * q + 9] = hi_f(ar[3]);
    const unsigned* b0 = o.b[(2 * t) * 4 + q];  // column n in lanes 4n..4n+3
    const unsigned* b1 = o.b[(2 * t + 1) * 4 + q];
    B0[2 * q] = lo_f(b0[0]), B0[2 * q + 1] = hi_f(b0[0]);
    B0[2 * q + 8] = lo_f(b0[1]), B0[2 * q + 9] = hi_f(b0[1]);
    B1[2 * q] = lo_f(b1[0]), B1[2 * q + 1] = hi_f(b1[0]);
    B1[2 * q + 8] = lo_f(b1[1]), B1[2 * q + 9] = hi_f(b1[1]);
  }
  // A bf16 product has 16 significant bits, so it is exact in fp32; each
  // addition rounds to fp32 (the file's header says why).
  float d0 = acc[0], d1 = acc[1], d2 = acc[2], d3 = acc[3];
  for (int k = 0; k < 16; k++) {
    d0 += A0[k] * B0[k];
    d1 += A0[k] * B1[k];
    d2 += A1[k] * B0[k];
    d3 += A1[k] * B1[k];
  }
  acc[0] = d0;
  acc[1] = d1;
  acc[2] = d2;
  acc[3] = d3;
}

void tg_emu_ldmatrix(unsigned* r, int num, bool trans, const void* p) {
  const int w = threadIdx.x >> 5, lane = threadIdx.x & 31;
  if (((uintptr_t)p & 15) != 0 && lane < 8 * num) emu_fail("ldmatrix row address not 16-byte aligned");
  WarpOps& o = warp_ops[w][warp_gen[w] & 1];
  o.addr[lane] = (const char*)p;
  tg_emu_warp_barrier();
  for (int j = 0; j < num; j++) {
    uint16_t e[2];
    if (!trans) {
      memcpy(e, o.addr[8 * j + lane / 4] + 4 * (lane % 4), 4);
    } else {
      memcpy(&e[0], o.addr[8 * j + 2 * (lane % 4)] + 2 * (lane / 4), 2);
      memcpy(&e[1], o.addr[8 * j + 2 * (lane % 4) + 1] + 2 * (lane / 4), 2);
    }
    r[j] = (unsigned)e[0] | ((unsigned)e[1] << 16);
  }
}

void tg_emu_cp_async(void* dst, const void* src, int size, int src_bytes) {
  if (((uintptr_t)dst & (size - 1)) != 0 || ((uintptr_t)src & (size - 1)) != 0)
    emu_fail("cp.async address not aligned to its size");
  if (src_bytes < 0 || src_bytes > size) emu_fail("cp.async src-size outside [0, cp-size]");
  CpOp op;
  op.dst = (char*)dst;
  op.size = size;
  memset(op.data, 0, sizeof op.data);
  if (src_bytes > 0) memcpy(op.data, src, src_bytes);
  memset(dst, 0xFF, size);  // undefined (NaN) until the wait
  fibers[cur].cp.push_back(op);
}

void tg_emu_check_align(const void* p, int n) {
  if (((uintptr_t)p & (n - 1)) != 0) {
    char what[96];
    snprintf(what, sizeof what, "%d-byte vector access at %p, not %d-byte aligned", n, p, n);
    emu_fail(what);
  }
}

void tg_emu_cp_commit() { fibers[cur].cp_groups.push_back(fibers[cur].cp.size()); }

void tg_emu_cp_wait(int n) {
  Fiber& f = fibers[cur];
  if ((int)f.cp_groups.size() <= n) return;
  size_t land = f.cp_groups[f.cp_groups.size() - 1 - n];
  f.cp_groups.erase(f.cp_groups.begin(), f.cp_groups.end() - n);
  cp_land(f, land);
}

static uint64_t next_rand() {
  rng_state = rng_state * 6364136223846793005ull + 1442695040888963407ull;
  return rng_state >> 33;
}

// shuffle permutes v with the schedule's generator (Fisher-Yates).
template <class T>
static void shuffle(std::vector<T>& v) {
  for (int i = (int)v.size() - 1; i > 0; i--) {
    int j = (int)(next_rand() % (uint64_t)(i + 1));
    T tmp = v[i];
    v[i] = v[j];
    v[j] = tmp;
  }
}

static int run_block(const char* name) {
  blk_arrived = 0;
  memset(warp_arrived, 0, sizeof warp_arrived);
  for (int t = 0; t < nthreads; t++) {
    Fiber& f = fibers[t];
    f.done = false;
    f.started = false;
    f.cp.clear();
    f.cp_groups.clear();
    getcontext(&f.ctx);
    f.ctx.uc_stack.ss_sp = f.stack;
    f.ctx.uc_stack.ss_size = kStack;
    f.ctx.uc_link = &sched;
    makecontext(&f.ctx, entry, 0);
  }
  // Warps run one at a time, in a new pseudo-random order for every phase
  // between two __syncthreads, each as far as it can go (to the next
  // __syncthreads or its end) before the next warp starts; lanes within a
  // warp are resumed in a random order too. So warps drift as far apart as
  // the barriers allow: a thread that reads shared memory another warp
  // writes without a __syncthreads in between sees the wrong phase's data
  // and the kernel's result changes. Missing barriers fail tests.
  static std::vector<int> worder, lorder;
  const int nwarps = (nthreads + 31) / 32;
  worder.resize(nwarps);
  for (int w = 0; w < nwarps; w++) worder[w] = w;
  lorder.resize(32);
  for (int i = 0; i < 32; i++) lorder[i] = i;
  auto runnable = [](int t) {
    return !fibers[t].done && (fibers[t].wait_gen < 0 || (long)blk_gen != fibers[t].wait_gen);
  };
  int remaining = nthreads;
  while (remaining > 0) {
    long before = progress;
    shuffle(worder);
    for (int w : worder) {
      for (;;) {  // run warp w until none of its lanes can move
        long wbefore = progress;
        bool any = false;
        shuffle(lorder);
        for (int li : lorder) {
          int t = w * 32 + li;
          if (t >= nthreads || !runnable(t)) continue;
          any = true;
          set_thread(t);
          if (!_setjmp(sched_jb)) {
            if (!fibers[t].started) {
              fibers[t].started = true;
              swapcontext(&sched, &fibers[t].ctx);
            } else {
              _longjmp(fibers[t].jb, 1);
            }
          }
          if (fibers[t].done) remaining--;
        }
        if (!any || progress == wbefore) break;
      }
    }
    if (remaining > 0 && progress == before) {
      fprintf(stderr,
              "fakecuda: kernel %s block (%u,%u,%u): barrier deadlock, %d of %d threads "
              "waiting (divergent __syncthreads/shuffle, or a thread exited early)\n",
              name, blockIdx.x, blockIdx.y, blockIdx.z, remaining, nthreads);
      abort();
    }
  }
  return 0;
}

static std::map<uint64_t, std::pair<char*, size_t>> allocs;  // ptr -> (mapping, length)

#define API extern "C" __attribute__((visibility("default"))) int

// cuInit (called whenever the backend opens or probes the device) restarts
// the schedule from $TRACEGRPO_EMU_SEED, default 1: the block, warp and
// lane orders of everything a backend runs follow from the seed alone.
API cuInit(unsigned) {
  uint64_t seed = 1;
  if (const char* s = getenv("TRACEGRPO_EMU_SEED")) {
    char* end;
    seed = strtoull(s, &end, 10);
    if (*s == 0 || *end != 0) {
      fprintf(stderr, "fakecuda: TRACEGRPO_EMU_SEED=%s is not a decimal number\n", s);
      return 1;  // CUDA_ERROR_INVALID_VALUE
    }
  }
  uint64_t z = seed + 0x9e3779b97f4a7c15ull;  // splitmix64: nearby seeds, unrelated states
  z = (z ^ (z >> 30)) * 0xbf58476d1ce4e5b9ull;
  z = (z ^ (z >> 27)) * 0x94d049bb133111ebull;
  rng_state = z ^ (z >> 31);
  return 0;
}
API cuDriverGetVersion(int* v) {
  *v = 11080;
  return 0;
}
API cuDeviceGetCount(int* n) {
  *n = 1;
  return 0;
}
API cuDeviceGet(int* d, int ord) {
  if (ord != 0) return 101;  // CUDA_ERROR_INVALID_DEVICE
  *d = 0;
  return 0;
}
API cuDeviceGetName(char* name, int len, int) {
  snprintf(name, len, "tracegrpo CPU emulator");
  return 0;
}
// The compute capability the device reports, as major·10 + minor: 80, or
// $TRACEGRPO_EMU_CC (90 makes the backend load its sm_90 cubins, which
// cuModuleLoadDataEx then accepts: the kernels still run from this
// library).
static int emu_cc() {
  const char* s = getenv("TRACEGRPO_EMU_CC");
  return s && *s ? atoi(s) : 80;
}

API cuDeviceGetAttribute(int* v, int attr, int) {
  switch (attr) {
    case 16: *v = 2; return 0;   // SMs: small, so grid-stride loops wrap
    case 97: *v = kSmemOptin; return 0;  // MAX_SHARED_MEMORY_PER_BLOCK_OPTIN
    case 75: *v = emu_cc() / 10; return 0;  // compute capability: 8.0, or $TRACEGRPO_EMU_CC
    case 76: *v = emu_cc() % 10; return 0;
  }
  return 1;
}
API cuDeviceTotalMem_v2(size_t* m, int) {
  *m = (size_t)1 << 30;
  return 0;
}
API cuDevicePrimaryCtxRetain(void** ctx, int) {
  static int c;
  *ctx = &c;
  return 0;
}
API cuDevicePrimaryCtxRelease_v2(int) { return 0; }
API cuCtxSetCurrent(void*) { return 0; }

static size_t allocated;  // bytes mapped by cuMemAlloc (for cuMemGetInfo)
API cuMemAlloc_v2(uint64_t* p, size_t bytes) {
  size_t page = sysconf(_SC_PAGESIZE);
  size_t body = (bytes + page - 1) / page * page;
  char* m = (char*)mmap(nullptr, body + page, PROT_READ | PROT_WRITE, MAP_PRIVATE | MAP_ANONYMOUS, -1, 0);
  if (m == MAP_FAILED) return 2;  // CUDA_ERROR_OUT_OF_MEMORY
  mprotect(m + body, page, PROT_NONE);
  char* user = m + body - (bytes + 15) / 16 * 16;  // end flush with the guard page, 16-aligned
  memset(user, 0xA5, body - (user - m));           // garbage, as cuMemAlloc gives
  allocs[(uint64_t)user] = {m, body + page};
  allocated += body + page;
  *p = (uint64_t)user;
  return 0;
}
// The emulated device holds 1 GiB; free is what the allocations leave.
API cuMemGetInfo_v2(size_t* free, size_t* total) {
  *total = (size_t)1 << 30;
  *free = allocated > *total ? 0 : *total - allocated;
  return 0;
}
API cuMemFree_v2(uint64_t p) {
  auto it = allocs.find(p);
  if (it == allocs.end()) return 1;  // CUDA_ERROR_INVALID_VALUE
  munmap(it->second.first, it->second.second);
  allocated -= it->second.second;
  allocs.erase(it);
  return 0;
}
// The write log ($TRACEGRPO_EMU_WRITELOG: a file path): for every kernel
// launch and device-to-device copy, a line "NAME BYTES" with the bytes of
// device memory it changed (every allocation compared before and after).
// kernels/cuda's TestLedgerWritesEmu checks each launch's ledger entry
// against it: a launch cannot change more than the bytes it says it writes.
static FILE* write_log() {
  static FILE* f;
  static std::string path;  // f's, read again each call: tests set it in turn
  const char* p = getenv("TRACEGRPO_EMU_WRITELOG");
  const std::string want = p ? p : "";
  if (want != path) {
    if (f) fclose(f);
    f = want.empty() ? nullptr : fopen(want.c_str(), "a");
    path = want;
  }
  return f;
}
struct Snapshot {
  std::vector<std::pair<const unsigned char*, std::vector<unsigned char>>> bufs;
  void take() {
    bufs.clear();
    for (auto& a : allocs) {
      const unsigned char* user = (const unsigned char*)a.first;
      const size_t page = sysconf(_SC_PAGESIZE);
      const size_t n = (size_t)(a.second.first + a.second.second - page - (char*)user);
      bufs.push_back({user, std::vector<unsigned char>(user, user + n)});
    }
  }
  size_t changed() const {
    size_t c = 0;
    for (auto& b : bufs)
      for (size_t i = 0; i < b.second.size(); i++) c += b.first[i] != b.second[i];
    return c;
  }
};
static void log_writes(const char* name, const Snapshot& before) {
  fprintf(write_log(), "%s %zu\n", name, before.changed());
  fflush(write_log());
}

API cuMemcpyHtoDAsync_v2(uint64_t d, const void* s, size_t n, void*) {
  memcpy((void*)d, s, n);
  return 0;
}
API cuMemcpyDtoHAsync_v2(void* d, uint64_t s, size_t n, void*) {
  memcpy(d, (void*)s, n);
  return 0;
}
API cuMemcpyDtoDAsync_v2(uint64_t d, uint64_t s, size_t n, void*) {
  Snapshot before;
  if (write_log()) before.take();
  memmove((void*)d, (void*)s, n);
  if (write_log()) log_writes("memcpy", before);
  return 0;
}
API cuMemsetD8Async(uint64_t d, unsigned char v, size_t n, void*) {
  memset((void*)d, v, n);
  return 0;
}
API cuMemsetD32Async(uint64_t d, unsigned v, size_t n, void*) {
  unsigned* p = (unsigned*)d;
  for (size_t i = 0; i < n; i++) p[i] = v;
  return 0;
}
API cuStreamCreate(void** s, unsigned) {
  static int st;
  *s = &st;
  return 0;
}
API cuStreamDestroy_v2(void*) { return 0; }
API cuStreamSynchronize(void*) { return 0; }
API cuEventCreate(void** e, unsigned) {
  *e = new double(0);
  return 0;
}
API cuEventDestroy_v2(void* e) {
  delete (double*)e;
  return 0;
}
API cuEventRecord(void* e, void*) {
  timespec ts;
  clock_gettime(CLOCK_MONOTONIC, &ts);
  *(double*)e = ts.tv_sec * 1e3 + ts.tv_nsec / 1e6;
  return 0;
}
API cuEventSynchronize(void*) { return 0; }
API cuStreamWaitEvent(void*, void*, unsigned flags) { return flags == 0 ? 0 : 1; }  // every stream runs in order
API cuEventElapsedTime(float* ms, void* a, void* b) {
  *ms = (float)(*(double*)b - *(double*)a);
  return 0;
}
// A module: the PTX text, or a cubin (an ELF image for the CUDA machine,
// e_machine 190, of the compute capability the device reports), whose
// symbol names cuModuleGetFunction checks: the backend must hand each
// module the image that holds its kernels.
struct Module {
  bool cubin;
  std::string image;
};
API cuModuleLoadDataEx(void** mod, const void* image, unsigned, int*, void**) {
  const unsigned char* p = (const unsigned char*)image;
  Module* m = new Module;
  if (memcmp(p, "\x7f" "ELF", 4) == 0) {
    uint16_t machine, phentsize, phnum, shentsize, shnum;
    uint32_t flags;
    uint64_t phoff, shoff;
    memcpy(&machine, p + 18, 2);
    memcpy(&phoff, p + 32, 8);
    memcpy(&shoff, p + 40, 8);
    memcpy(&flags, p + 48, 4);
    memcpy(&phentsize, p + 54, 2);
    memcpy(&phnum, p + 56, 2);
    memcpy(&shentsize, p + 58, 2);
    memcpy(&shnum, p + 60, 2);
    // e_flags' low byte is the SM version of the machine code (90 for sm_90).
    if (p[4] != 2 || machine != 190 || (int)(flags & 0xff) != emu_cc()) {
      delete m;
      return 209;  // CUDA_ERROR_NO_BINARY_FOR_GPU
    }
    m->cubin = true;
    const uint64_t end = std::max(shoff + (uint64_t)shnum * shentsize, phoff + (uint64_t)phnum * phentsize);
    m->image.assign((const char*)p, end);
  } else if (strncmp((const char*)image, "// Code generated by make ptx", 29) == 0) {
    m->cubin = false;
  } else {
    delete m;
    return 218;  // CUDA_ERROR_INVALID_PTX
  }
  *mod = m;
  return 0;
}
API cuModuleUnload(void* mod) {
  delete (Module*)mod;
  return 0;
}
// Dynamic shared memory a kernel may use, raised by cuFuncSetAttribute
// (CU_FUNC_ATTRIBUTE_MAX_DYNAMIC_SHARED_SIZE_BYTES = 8); 48 KiB otherwise.
static std::map<const void*, int> max_dyn_smem;
API cuFuncSetAttribute(void* fn, int attr, int value) {
  if (attr != 8) return 1;  // CUDA_ERROR_INVALID_VALUE: only this one is emulated
  if (value < 0 || value > kSmemOptin) return 1;
  max_dyn_smem[fn] = value;
  return 0;
}
API cuModuleGetFunction(void** fn, void* mod, const char* name) {
  const Module* m = (const Module*)mod;
  if (m->cubin && m->image.find(std::string(name) + '\0') == std::string::npos) return 500;  // not in this cubin
  for (int i = 0; i < tg_nkernels; i++) {
    if (strcmp(tg_kernels[i].name, name) == 0) {
      *fn = (void*)&tg_kernels[i];
      return 0;
    }
  }
  return 500;  // CUDA_ERROR_NOT_FOUND
}
API cuLaunchKernel(void* fn, unsigned gx, unsigned gy, unsigned gz, unsigned bx, unsigned by,
                   unsigned bz, unsigned smem, void*, void** params, void**) {
  const tg_kernel* k = (const tg_kernel*)fn;
  auto lim = max_dyn_smem.find(fn);
  const unsigned smem_max = lim == max_dyn_smem.end() ? 48 * 1024 : (unsigned)lim->second;
  if (bx == 0 || bx > 1024 || bx % 32 != 0 || by != 1 || bz != 1 || gx == 0 || gy == 0 ||
      gz == 0 || gy > 65535 || gz > 65535 || smem > smem_max) {
    fprintf(stderr, "fakecuda: %s: bad launch grid (%u,%u,%u) block (%u,%u,%u) smem %u\n", k->name,
            gx, gy, gz, bx, by, bz, smem);
    return 1;  // CUDA_ERROR_INVALID_VALUE
  }
  nthreads = bx;
  if ((int)fibers.size() < nthreads) {
    size_t old = fibers.size();
    fibers.resize(nthreads);
    for (size_t i = old; i < fibers.size(); i++) fibers[i].stack = (char*)malloc(kStack);
  }
  // 128-byte aligned like a GPU's dynamic shared memory (ldmatrix and
  // cp.async need 16-byte aligned shared addresses).
  static char* dyn_buf;
  static size_t dyn_cap;
  if (dyn_cap < smem + 16) {
    free(dyn_buf);
    dyn_cap = (smem + 16 + 127) / 128 * 128;
    dyn_buf = (char*)aligned_alloc(128, dyn_cap);
  }
  blockDim = {bx, 1, 1};
  gridDim = {gx, gy, gz};
  cur_fn = k->fn;
  cur_params = params;
  // The blocks in a shuffled order: a kernel whose blocks depend on each
  // other's order (a GPU runs them in any order, and at once) changes its
  // result.
  static std::vector<tg_dim3> order;
  order.clear();
  for (unsigned z = 0; z < gz; z++)
    for (unsigned y = 0; y < gy; y++)
      for (unsigned x = 0; x < gx; x++) order.push_back({x, y, z});
  shuffle(order);
  const size_t static_smem = __start_tg_emu_smem ? (size_t)(__stop_tg_emu_smem - __start_tg_emu_smem) : 0;
  Snapshot before;
  if (write_log()) before.take();
  for (const tg_dim3& blk : order) {
    // NaN: shared memory no thread of this block wrote shows up.
    memset(dyn_buf, 0xFF, smem + 16);
    if (static_smem) memset(__start_tg_emu_smem, 0xFF, static_smem);
    tg_emu_dyn_smem = dyn_buf;
    blockIdx = blk;
    run_block(k->name);
  }
  if (write_log()) log_writes(k->name, before);
  return 0;
}
API cuGetErrorString(int code, const char** s) {
  *s = code == 0 ? "no error" : "emulated error";
  return 0;
}
API cuGetErrorName(int code, const char** s) {
  static char buf[64];
  snprintf(buf, sizeof buf, "CUDA_ERROR_%d", code);
  *s = buf;
  return 0;
}
