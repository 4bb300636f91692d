/* A mock CUDA driver (libcuda.so.1) over host memory, for tests/mock_driver.rs: it lets the
 * gpumem-cuda backend run end to end on a machine without a GPU. It models what the backend
 * relies on, not CUDA: device pointers are host addresses, copies are memcpy and complete at
 * once, streams and events are tokens that are always complete. VMM is real address-space
 * work: a reservation is a PROT_NONE mapping, a physical chunk a memfd, a mapping a MAP_SHARED
 * view of it, so one chunk mapped at two addresses shows the same bytes at both.
 *
 * It checks what a real driver would refuse: every call that needs a context fails with
 * CUDA_ERROR_INVALID_CONTEXT (201) unless the primary context is current on the calling
 * thread; allocations beyond MOCK_CUDA_MEM bytes (default 1 GiB) fail with
 * CUDA_ERROR_OUT_OF_MEMORY (2); unknown pointers and handles are CUDA_ERROR_INVALID_VALUE.
 * Environment: MOCK_CUDA_MEM, MOCK_CUDA_NO_VMM (report no VMM), MOCK_CUDA_INIT (cuInit's
 * result, e.g. 100 for CUDA_ERROR_NO_DEVICE). Page-locked host memory is handed out filled
 * with 0xAB, so a backend that does not zero it shows. Linux only (memfd_create). */
#define _GNU_SOURCE
#include <pthread.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/mman.h>
#include <unistd.h>

typedef int CUresult;
typedef unsigned long long CUdeviceptr;
enum { OK = 0, INVALID_VALUE = 1, OUT_OF_MEMORY = 2, INVALID_DEVICE = 101, INVALID_CONTEXT = 201 };

static pthread_mutex_t mu = PTHREAD_MUTEX_INITIALIZER;
static unsigned long long capacity = 1ull << 30, used = 0;
static __thread void *current = 0;
static int primary; /* the one context: its address is the CUcontext */

struct alloc { uintptr_t p; size_t n; struct alloc *next; };
static struct alloc *allocs;
struct phys { int fd; size_t n; };

static int need_ctx(void) { return current == &primary ? OK : INVALID_CONTEXT; }
static int take(size_t n) {
  pthread_mutex_lock(&mu);
  int ok = used + n <= capacity;
  if (ok) used += n;
  pthread_mutex_unlock(&mu);
  return ok;
}
static void give(size_t n) { pthread_mutex_lock(&mu); used -= n; pthread_mutex_unlock(&mu); }

CUresult cuInit(unsigned flags) {
  const char *mem = getenv("MOCK_CUDA_MEM"), *init = getenv("MOCK_CUDA_INIT");
  if (flags) return INVALID_VALUE;
  if (mem) capacity = strtoull(mem, 0, 0);
  return init ? atoi(init) : OK;
}
CUresult cuDriverGetVersion(int *v) { *v = 12040; return OK; }
static const char *name_of(CUresult e) {
  switch (e) {
  case OK: return "CUDA_SUCCESS";
  case INVALID_VALUE: return "CUDA_ERROR_INVALID_VALUE";
  case OUT_OF_MEMORY: return "CUDA_ERROR_OUT_OF_MEMORY";
  case 100: return "CUDA_ERROR_NO_DEVICE";
  case INVALID_DEVICE: return "CUDA_ERROR_INVALID_DEVICE";
  case INVALID_CONTEXT: return "CUDA_ERROR_INVALID_CONTEXT";
  case 600: return "CUDA_ERROR_NOT_READY";
  default: return 0;
  }
}
CUresult cuGetErrorName(CUresult e, const char **s) { *s = name_of(e); return *s ? OK : INVALID_VALUE; }
CUresult cuGetErrorString(CUresult e, const char **s) {
  *s = name_of(e) ? "mock driver error" : 0;
  return *s ? OK : INVALID_VALUE;
}

CUresult cuDeviceGetCount(int *n) { *n = 1; return OK; }
CUresult cuDeviceGet(int *d, int ordinal) { if (ordinal != 0) return INVALID_DEVICE; *d = 0; return OK; }
CUresult cuDeviceGetName(char *b, int len, int d) { snprintf(b, len, "gpumem mock GPU"); return d ? INVALID_DEVICE : OK; }
CUresult cuDeviceTotalMem_v2(size_t *b, int d) { *b = capacity; return d ? INVALID_DEVICE : OK; }
CUresult cuDeviceGetAttribute(int *v, int attr, int d) {
  switch (attr) {
  case 75: *v = 9; break;                                /* compute capability major */
  case 76: *v = 0; break;                                /* minor */
  case 102: *v = getenv("MOCK_CUDA_NO_VMM") ? 0 : 1; break; /* VMM supported */
  case 83: *v = 1; break;                                /* managed memory */
  case 41: *v = 1; break;                                /* unified addressing */
  default: *v = 0;
  }
  return d ? INVALID_DEVICE : OK;
}
CUresult cuDevicePrimaryCtxRetain(void **c, int d) { *c = &primary; return d ? INVALID_DEVICE : OK; }
CUresult cuDevicePrimaryCtxRelease_v2(int d) { return d ? INVALID_DEVICE : OK; }
CUresult cuCtxGetCurrent(void **c) { *c = current; return OK; }
CUresult cuCtxSetCurrent(void *c) {
  if (c && c != &primary) return INVALID_CONTEXT;
  current = c;
  return OK;
}
CUresult cuCtxSynchronize(void) { return need_ctx(); }

CUresult cuMemGetInfo_v2(size_t *f, size_t *t) {
  if (need_ctx()) return INVALID_CONTEXT;
  pthread_mutex_lock(&mu);
  *f = capacity - used;
  *t = capacity;
  pthread_mutex_unlock(&mu);
  return OK;
}
CUresult cuMemAlloc_v2(CUdeviceptr *p, size_t n) {
  void *m = 0;
  if (need_ctx()) return INVALID_CONTEXT;
  if (n == 0) return INVALID_VALUE;
  if (!take(n)) return OUT_OF_MEMORY;
  if (posix_memalign(&m, 512, n)) { give(n); return OUT_OF_MEMORY; }
  struct alloc *a = malloc(sizeof *a);
  pthread_mutex_lock(&mu);
  a->p = (uintptr_t)m; a->n = n; a->next = allocs; allocs = a;
  pthread_mutex_unlock(&mu);
  *p = (uintptr_t)m;
  return OK;
}
CUresult cuMemFree_v2(CUdeviceptr p) {
  if (need_ctx()) return INVALID_CONTEXT;
  pthread_mutex_lock(&mu);
  for (struct alloc **a = &allocs; *a; a = &(*a)->next) {
    if ((*a)->p == p) {
      struct alloc *x = *a;
      *a = x->next;
      used -= x->n;
      pthread_mutex_unlock(&mu);
      free((void *)x->p);
      free(x);
      return OK;
    }
  }
  pthread_mutex_unlock(&mu);
  return INVALID_VALUE;
}
CUresult cuMemHostAlloc(void **p, size_t n, unsigned flags) {
  (void)flags;
  if (need_ctx()) return INVALID_CONTEXT;
  if (!(*p = malloc(n))) return OUT_OF_MEMORY;
  memset(*p, 0xAB, n);
  return OK;
}
CUresult cuMemFreeHost(void *p) { free(p); return OK; }

CUresult cuMemcpyHtoD_v2(CUdeviceptr d, const void *s, size_t n) {
  if (need_ctx()) return INVALID_CONTEXT;
  memcpy((void *)(uintptr_t)d, s, n);
  return OK;
}
CUresult cuMemcpyDtoH_v2(void *d, CUdeviceptr s, size_t n) {
  if (need_ctx()) return INVALID_CONTEXT;
  memcpy(d, (void *)(uintptr_t)s, n);
  return OK;
}
CUresult cuMemcpyHtoDAsync_v2(CUdeviceptr d, const void *s, size_t n, void *stream) {
  (void)stream;
  return cuMemcpyHtoD_v2(d, s, n);
}
CUresult cuMemcpyDtoHAsync_v2(void *d, CUdeviceptr s, size_t n, void *stream) {
  (void)stream;
  return cuMemcpyDtoH_v2(d, s, n);
}
CUresult cuMemcpyDtoDAsync_v2(CUdeviceptr d, CUdeviceptr s, size_t n, void *stream) {
  (void)stream;
  if (need_ctx()) return INVALID_CONTEXT;
  memmove((void *)(uintptr_t)d, (void *)(uintptr_t)s, n);
  return OK;
}

CUresult cuStreamCreate(void **s, unsigned flags) {
  (void)flags;
  if (need_ctx()) return INVALID_CONTEXT;
  *s = malloc(16);
  return OK;
}
CUresult cuStreamDestroy_v2(void *s) { free(s); return need_ctx(); }
CUresult cuStreamSynchronize(void *s) { (void)s; return need_ctx(); }
CUresult cuStreamWaitEvent(void *s, void *e, unsigned flags) { (void)s; (void)e; (void)flags; return need_ctx(); }
CUresult cuEventCreate(void **e, unsigned flags) {
  (void)flags;
  if (need_ctx()) return INVALID_CONTEXT;
  *e = malloc(16);
  return OK;
}
CUresult cuEventRecord(void *e, void *s) { (void)e; (void)s; return need_ctx(); }
CUresult cuEventQuery(void *e) { (void)e; return need_ctx(); }
CUresult cuEventSynchronize(void *e) { (void)e; return need_ctx(); }
CUresult cuEventDestroy_v2(void *e) { free(e); return need_ctx(); }

/* VMM. The structs as the CUDA headers lay them out. */
struct location { int type, id; };
struct prop { int type, handle_types; struct location location; void *win32; unsigned char flags[8]; };
struct access { struct location location; int flags; };
static int device_memory_on_0(const struct location *l) { return l->type == 1 && l->id == 0; }

CUresult cuMemGetAllocationGranularity(size_t *g, const struct prop *p, int option) {
  if (p->type != 1 || !device_memory_on_0(&p->location) || option < 0 || option > 1) return INVALID_VALUE;
  *g = 2 << 20;
  return OK;
}
CUresult cuMemAddressReserve(CUdeviceptr *p, size_t n, size_t align, CUdeviceptr addr, unsigned long long flags) {
  (void)addr; (void)flags;
  if (need_ctx()) return INVALID_CONTEXT;
  if (align == 0) align = 2 << 20;
  char *m = mmap(0, n + align, PROT_NONE, MAP_PRIVATE | MAP_ANONYMOUS | MAP_NORESERVE, -1, 0);
  if (m == MAP_FAILED) return OUT_OF_MEMORY;
  uintptr_t start = ((uintptr_t)m + align - 1) & ~(uintptr_t)(align - 1);
  if (start > (uintptr_t)m) munmap(m, start - (uintptr_t)m);
  size_t tail = (uintptr_t)m + n + align - (start + n);
  if (tail) munmap((void *)(start + n), tail);
  *p = start;
  return OK;
}
CUresult cuMemAddressFree(CUdeviceptr p, size_t n) {
  if (need_ctx()) return INVALID_CONTEXT;
  return munmap((void *)(uintptr_t)p, n) ? INVALID_VALUE : OK;
}
CUresult cuMemCreate(unsigned long long *h, size_t n, const struct prop *p, unsigned long long flags) {
  if (need_ctx()) return INVALID_CONTEXT;
  if (flags || p->type != 1 || !device_memory_on_0(&p->location) || n % (2 << 20)) return INVALID_VALUE;
  if (!take(n)) return OUT_OF_MEMORY;
  int fd = memfd_create("gpumem-mock-cuda", 0);
  if (fd < 0 || ftruncate(fd, n)) { give(n); return OUT_OF_MEMORY; }
  struct phys *x = malloc(sizeof *x);
  x->fd = fd;
  x->n = n;
  *h = (uintptr_t)x;
  return OK;
}
/* Memory is given back at release (a real driver waits for the last unmap); the mappings keep
 * the memfd's pages alive either way. */
CUresult cuMemRelease(unsigned long long h) {
  struct phys *x = (struct phys *)(uintptr_t)h;
  if (need_ctx()) return INVALID_CONTEXT;
  close(x->fd);
  give(x->n);
  free(x);
  return OK;
}
CUresult cuMemMap(CUdeviceptr p, size_t n, size_t offset, unsigned long long h, unsigned long long flags) {
  struct phys *x = (struct phys *)(uintptr_t)h;
  if (need_ctx()) return INVALID_CONTEXT;
  if (flags || offset + n > x->n) return INVALID_VALUE;
  void *m = mmap((void *)(uintptr_t)p, n, PROT_READ | PROT_WRITE, MAP_SHARED | MAP_FIXED, x->fd, offset);
  return m == MAP_FAILED ? INVALID_VALUE : OK;
}
CUresult cuMemSetAccess(CUdeviceptr p, size_t n, const struct access *d, size_t count) {
  (void)p; (void)n;
  if (need_ctx()) return INVALID_CONTEXT;
  return count == 1 && device_memory_on_0(&d->location) && d->flags == 3 ? OK : INVALID_VALUE;
}
CUresult cuMemUnmap(CUdeviceptr p, size_t n) {
  if (need_ctx()) return INVALID_CONTEXT;
  void *m = mmap((void *)(uintptr_t)p, n, PROT_NONE, MAP_PRIVATE | MAP_ANONYMOUS | MAP_FIXED | MAP_NORESERVE, -1, 0);
  return m == MAP_FAILED ? INVALID_VALUE : OK;
}
