// fakenccl.cpp: a CPU stand-in for libnccl.so.2 exporting the calls
// kernels/cuda binds. Device memory is host memory under the emulator, so
// the collectives run on the host: a world of one rank is the identity (or
// a copy); a world of several ranks (one process each, as mpirun or
// torchrun starts them) meets in a POSIX shared-memory segment named after
// the unique id, where every rank deposits its part and reads the others'.
// Sums run in rank order, once per element, so every rank gets the same
// bits. The stream argument is ignored (the emulator runs everything at
// once), so it tests the binding and the communication, not overlap.
//
// With FAKENCCL_LOG set it appends each collective's name, source and
// destination pointers, count and type to that file. FAKENCCL_TIMEOUT_MS
// (default 120000) bounds every wait for the other ranks: a rank that
// never arrives fails the collective instead of hanging the test.
#include <fcntl.h>
#include <sched.h>
#include <sys/mman.h>
#include <sys/stat.h>
#include <time.h>
#include <unistd.h>

#include <atomic>
#include <cstdint>
#include <cstdio>
#include <cstdlib>
#include <cstring>

#define API extern "C" __attribute__((visibility("default")))

struct ncclUniqueId {
  char internal[128];
};
enum {
  ncclSuccess = 0,
  ncclSystemError = 2,
  ncclInvalidArgument = 4,
  ncclInvalidUsage = 5,
  ncclRemoteError = 6,
};

static size_t typeSize(int t) {
  switch (t) {
    case 2: return 4;  // int32
    case 7: return 4;  // float32
    case 9: return 2;  // bfloat16
  }
  return 0;
}

// The segment: a header, then one slot of kSlot bytes per rank.
static const size_t kSlot = 8 << 20;
struct Header {
  std::atomic<int> count;       // ranks at the current barrier
  std::atomic<unsigned> gen;    // barriers completed
  std::atomic<int> aborted;     // a rank called ncclCommAbort (rank+1)
};

struct Comm {
  int nranks, rank;
  Header* h;
  char* slots;  // nranks × kSlot
  size_t bytes;
  int err;  // sticky: a failed wait
};

static int live = 0;
static char lastError[256];

static long timeoutMs() {
  const char* s = getenv("FAKENCCL_TIMEOUT_MS");
  return s ? atol(s) : 120000;
}

static long nowMs() {
  timespec ts;
  clock_gettime(CLOCK_MONOTONIC, &ts);
  return ts.tv_sec * 1000 + ts.tv_nsec / 1000000;
}

// barrier waits until every rank has arrived (sense by generation).
static int barrier(Comm* c) {
  if (c->err) return c->err;
  Header* h = c->h;
  unsigned g = h->gen.load();
  if (h->count.fetch_add(1) == c->nranks - 1) {
    h->count.store(0);
    h->gen.fetch_add(1);
    return ncclSuccess;
  }
  long deadline = nowMs() + timeoutMs();
  for (int spin = 0; h->gen.load() == g; spin++) {
    if (h->aborted.load()) {
      snprintf(lastError, sizeof lastError, "fake NCCL: rank %d aborted the communicator", h->aborted.load() - 1);
      return c->err = ncclRemoteError;
    }
    if (spin > 100) {
      if (nowMs() > deadline) {
        snprintf(lastError, sizeof lastError, "fake NCCL: rank %d of %d waited %ld ms for the other ranks", c->rank,
                 c->nranks, timeoutMs());
        return c->err = ncclSystemError;
      }
      usleep(spin > 1000 ? 200 : 20);
    } else {
      sched_yield();
    }
  }
  return ncclSuccess;
}

static char* slot(Comm* c, int r) { return c->slots + (size_t)r * kSlot; }

API int ncclGetVersion(int* v) {
  *v = 22105;
  return ncclSuccess;
}
API int ncclGetUniqueId(ncclUniqueId* id) {
  memset(id, 0, sizeof *id);
  const char* env = getenv("NCCL_COMM_ID");
  if (env) {
    snprintf(id->internal, sizeof id->internal, "fakenccl:%s", env);
  } else {
    timespec ts;
    clock_gettime(CLOCK_REALTIME, &ts);
    snprintf(id->internal, sizeof id->internal, "fakenccl:%d-%ld-%ld", (int)getpid(), (long)ts.tv_sec, ts.tv_nsec);
  }
  return ncclSuccess;
}

// shmName derives the segment's name from the id.
static void shmName(const ncclUniqueId& id, char* out, size_t n) {
  uint64_t h = 1469598103934665603ull;
  for (size_t i = 0; i < sizeof id.internal && id.internal[i]; i++) h = (h ^ (unsigned char)id.internal[i]) * 1099511628211ull;
  snprintf(out, n, "/tracegrpo-fakenccl-%016llx", (unsigned long long)h);
}

API int ncclCommInitRank(void** comm, int nranks, ncclUniqueId id, int rank) {
  if (nranks < 1 || rank < 0 || rank >= nranks || strncmp(id.internal, "fakenccl:", 9) != 0) return ncclInvalidUsage;
  Comm* c = new Comm{nranks, rank, nullptr, nullptr, 0, 0};
  if (nranks > 1) {
    char name[64];
    shmName(id, name, sizeof name);
    int fd = shm_open(name, O_CREAT | O_RDWR, 0600);
    if (fd < 0) {
      snprintf(lastError, sizeof lastError, "fake NCCL: shm_open %s failed", name);
      delete c;
      return ncclSystemError;
    }
    c->bytes = 4096 + (size_t)nranks * kSlot;
    struct stat st;
    if ((fstat(fd, &st) == 0 && (size_t)st.st_size < c->bytes && ftruncate(fd, c->bytes) != 0)) {
      close(fd);
      delete c;
      return ncclSystemError;
    }
    void* p = mmap(nullptr, c->bytes, PROT_READ | PROT_WRITE, MAP_SHARED, fd, 0);
    close(fd);
    if (p == MAP_FAILED) {
      delete c;
      return ncclSystemError;
    }
    c->h = (Header*)p;
    c->slots = (char*)p + 4096;
    int r = barrier(c);  // every rank has the segment: its name can go
    if (rank == 0) shm_unlink(name);
    if (r != ncclSuccess) {
      munmap(p, c->bytes);
      delete c;
      return r;
    }
  }
  *comm = c;
  live++;
  return ncclSuccess;
}
API int ncclCommDestroy(void* comm) {
  Comm* c = (Comm*)comm;
  if (!c || live == 0) return ncclInvalidArgument;
  if (c->h) munmap(c->h, c->bytes);
  delete c;
  live--;
  return ncclSuccess;
}
API int ncclCommAbort(void* comm) {
  Comm* c = (Comm*)comm;
  if (c && c->h) c->h->aborted.store(c->rank + 1);
  return ncclCommDestroy(comm);
}
API const char* ncclGetErrorString(int r) {
  switch (r) {
    case ncclSuccess: return "no error";
    case ncclInvalidArgument: return "invalid argument";
    case ncclInvalidUsage: return "invalid usage";
    case ncclSystemError:
    case ncclRemoteError: return lastError[0] ? lastError : "system error";
  }
  return "unknown result";
}

static int logCall(const char* name, const void* s, const void* d, size_t n, int t, void* comm) {
  if (!comm || typeSize(t) == 0) return ncclInvalidArgument;
  if (const char* log = getenv("FAKENCCL_LOG")) {
    if (FILE* f = fopen(log, "a")) {
      fprintf(f, "%s %llx %llx %zu %d\n", name, (unsigned long long)(uintptr_t)s, (unsigned long long)(uintptr_t)d, n, t);
      fclose(f);
    }
  }
  return ncclSuccess;
}

// sum adds n elements of type t from src into dst.
static int sum(void* dst, const void* src, size_t n, int t) {
  if (t == 7) {
    float* d = (float*)dst;
    const float* s = (const float*)src;
    for (size_t i = 0; i < n; i++) d[i] += s[i];
  } else if (t == 2) {
    int32_t* d = (int32_t*)dst;
    const int32_t* s = (const int32_t*)src;
    for (size_t i = 0; i < n; i++) d[i] += s[i];
  } else {
    return ncclInvalidArgument;  // the fake sums float32 and int32 only
  }
  return ncclSuccess;
}

API int ncclAllReduce(const void* s, void* d, size_t n, int t, int op, void* comm, void*) {
  int r;
  if (op != 0) return ncclInvalidArgument;
  if ((r = logCall("AllReduce", s, d, n, t, comm))) return r;
  Comm* c = (Comm*)comm;
  size_t es = typeSize(t);
  if (c->nranks == 1) {
    if (s != d) memmove(d, s, n * es);
    return ncclSuccess;
  }
  size_t chunk = kSlot / es;
  for (size_t off = 0; off < n; off += chunk) {
    size_t k = n - off < chunk ? n - off : chunk;
    memcpy(slot(c, c->rank), (const char*)s + off * es, k * es);
    if ((r = barrier(c))) return r;
    memcpy((char*)d + off * es, slot(c, 0), k * es);
    for (int q = 1; q < c->nranks; q++)
      if ((r = sum((char*)d + off * es, slot(c, q), k, t))) return r;
    if ((r = barrier(c))) return r;
  }
  return ncclSuccess;
}
API int ncclReduceScatter(const void* s, void* d, size_t n, int t, int op, void* comm, void*) {
  int r;
  if (op != 0) return ncclInvalidArgument;
  if ((r = logCall("ReduceScatter", s, d, n, t, comm))) return r;
  Comm* c = (Comm*)comm;
  size_t es = typeSize(t);
  if (c->nranks == 1) {
    if (s != d) memmove(d, s, n * es);
    return ncclSuccess;
  }
  // Each chunk: every rank deposits its part of every rank's block.
  size_t chunk = kSlot / es / c->nranks;
  for (size_t off = 0; off < n; off += chunk) {
    size_t k = n - off < chunk ? n - off : chunk;
    for (int q = 0; q < c->nranks; q++)
      memcpy(slot(c, c->rank) + (size_t)q * k * es, (const char*)s + ((size_t)q * n + off) * es, k * es);
    if ((r = barrier(c))) return r;
    char* out = (char*)d + off * es;
    memcpy(out, slot(c, 0) + (size_t)c->rank * k * es, k * es);
    for (int q = 1; q < c->nranks; q++)
      if ((r = sum(out, slot(c, q) + (size_t)c->rank * k * es, k, t))) return r;
    if ((r = barrier(c))) return r;
  }
  return ncclSuccess;
}
API int ncclAllGather(const void* s, void* d, size_t n, int t, void* comm, void*) {
  int r;
  if ((r = logCall("AllGather", s, d, n, t, comm))) return r;
  Comm* c = (Comm*)comm;
  size_t es = typeSize(t);
  if (c->nranks == 1) {
    if (s != d) memmove(d, s, n * es);
    return ncclSuccess;
  }
  size_t chunk = kSlot / es;
  for (size_t off = 0; off < n; off += chunk) {
    size_t k = n - off < chunk ? n - off : chunk;
    memcpy(slot(c, c->rank), (const char*)s + off * es, k * es);
    if ((r = barrier(c))) return r;
    for (int q = 0; q < c->nranks; q++) memcpy((char*)d + ((size_t)q * n + off) * es, slot(c, q), k * es);
    if ((r = barrier(c))) return r;
  }
  return ncclSuccess;
}
API int ncclBroadcast(const void* s, void* d, size_t n, int t, int root, void* comm, void*) {
  int r;
  if ((r = logCall("Broadcast", s, d, n, t, comm))) return r;
  Comm* c = (Comm*)comm;
  size_t es = typeSize(t);
  if (root < 0 || root >= c->nranks) return ncclInvalidArgument;
  if (c->nranks == 1) {
    if (s != d) memmove(d, s, n * es);
    return ncclSuccess;
  }
  size_t chunk = kSlot / es;
  for (size_t off = 0; off < n; off += chunk) {
    size_t k = n - off < chunk ? n - off : chunk;
    if (c->rank == root) memcpy(slot(c, root), (const char*)s + off * es, k * es);
    if ((r = barrier(c))) return r;
    memcpy((char*)d + off * es, slot(c, root), k * es);
    if ((r = barrier(c))) return r;
  }
  return ncclSuccess;
}
