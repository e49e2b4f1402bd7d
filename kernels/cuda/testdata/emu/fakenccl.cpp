// fakenccl.cpp: a CPU stand-in for libnccl.so.2 exporting the calls
// kernels/cuda binds, for a world of ONE rank only (device memory is host
// memory under the emulator): every collective is the identity or a copy.
// It exercises the binding (argument order, counts, dtypes, pointers,
// errors) without a GPU; it cannot test communication between ranks. With
// FAKENCCL_LOG set it appends each collective's name, source and
// destination pointers, count and type to that file, so that tests check
// what an in-place collective (the identity here) was asked to cover.
#include <cstdint>
#include <cstdio>
#include <cstdlib>
#include <cstring>

#define API extern "C" __attribute__((visibility("default")))

struct ncclUniqueId {
  char internal[128];
};
enum { ncclSuccess = 0, ncclInvalidArgument = 4, ncclInvalidUsage = 5 };

static size_t typeSize(int t) {
  switch (t) {
    case 2: return 4;  // int32
    case 7: return 4;  // float32
    case 9: return 2;  // bfloat16
  }
  return 0;
}

static int live = 0;

API int ncclGetVersion(int* v) {
  *v = 22105;
  return ncclSuccess;
}
API int ncclGetUniqueId(ncclUniqueId* id) {
  memset(id, 0, sizeof *id);
  const char* env = getenv("NCCL_COMM_ID");
  snprintf(id->internal, sizeof id->internal, "fakenccl:%s", env ? env : "random");
  return ncclSuccess;
}
API int ncclCommInitRank(void** comm, int nranks, ncclUniqueId id, int rank) {
  if (nranks != 1 || rank != 0 || strncmp(id.internal, "fakenccl:", 9) != 0) return ncclInvalidUsage;
  *comm = &live;
  live++;
  return ncclSuccess;
}
API int ncclCommDestroy(void* comm) {
  if (comm != &live || live == 0) return ncclInvalidArgument;
  live--;
  return ncclSuccess;
}
API int ncclCommAbort(void* comm) { return ncclCommDestroy(comm); }
API const char* ncclGetErrorString(int r) {
  switch (r) {
    case ncclSuccess: return "no error";
    case ncclInvalidArgument: return "invalid argument";
    case ncclInvalidUsage: return "invalid usage (the fake NCCL has one rank)";
  }
  return "unknown result";
}
static int copy(const char* name, const void* s, void* d, size_t n, int t, void* comm) {
  if (comm != &live || typeSize(t) == 0) return ncclInvalidArgument;
  if (const char* log = getenv("FAKENCCL_LOG")) {
    if (FILE* f = fopen(log, "a")) {
      fprintf(f, "%s %llx %llx %zu %d\n", name, (unsigned long long)(uintptr_t)s, (unsigned long long)(uintptr_t)d, n, t);
      fclose(f);
    }
  }
  if (s != d) memmove(d, s, n * typeSize(t));
  return ncclSuccess;
}
API int ncclAllReduce(const void* s, void* d, size_t n, int t, int op, void* comm, void*) {
  if (op != 0) return ncclInvalidArgument;
  return copy("AllReduce", s, d, n, t, comm);
}
API int ncclReduceScatter(const void* s, void* d, size_t n, int t, int op, void* comm, void*) {
  if (op != 0) return ncclInvalidArgument;
  return copy("ReduceScatter", s, d, n, t, comm);
}
API int ncclAllGather(const void* s, void* d, size_t n, int t, void* comm, void*) { return copy("AllGather", s, d, n, t, comm); }
API int ncclBroadcast(const void* s, void* d, size_t n, int t, int root, void* comm, void*) {
  if (root != 0) return ncclInvalidArgument;
  return copy("Broadcast", s, d, n, t, comm);
}
