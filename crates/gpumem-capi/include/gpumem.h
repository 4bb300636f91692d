/* gpumem: GPU memory pool for PyTorch, CuPy and C. Generated from crates/gpumem-capi/src/lib.rs by cbindgen; do not edit (cargo test -p gpumem-capi --test header regenerates it with GPUMEM_UPDATE_HEADER=1). */

#ifndef GPUMEM_H
#define GPUMEM_H

#include <stddef.h>
#include <stdint.h>

// `size` for [`gpumem_free`] when the caller does not know the allocation's size: no check.
#define GPUMEM_ANY_SIZE ~0

// The most device ordinals the library serves (ordinals 0 to 63).
#define GPUMEM_MAX_DEVICES 64

// What a gpumem C call returns: 0 for success, otherwise what went wrong
// ([`gpumem_last_error`] says more).
typedef enum GpumemStatus {
  // Success.
  GPUMEM_OK = 0,
  // The allocation does not fit, even after freeing the cache; [`gpumem_last_oom`]
  // explains.
  GPUMEM_OUT_OF_MEMORY = 1,
  // An argument is not valid (a null string, an unknown policy, a bad size or ordinal, a
  // free on another stream than the allocation's).
  GPUMEM_INVALID_ARGUMENT = 2,
  // A pointer that is not a live allocation of the device's pool (never allocated, already
  // freed, or of another device).
  GPUMEM_UNKNOWN_POINTER = 3,
  // A free whose size differs from the allocation's.
  GPUMEM_SIZE_MISMATCH = 4,
  // A configuration value (environment or run time) that cannot be used.
  GPUMEM_CONFIG = 5,
  // The device failed, or its backend could not be opened.
  GPUMEM_DEVICE = 6,
  // A file could not be written.
  GPUMEM_IO = 7,
  // The policy cannot change while allocations are live.
  GPUMEM_BUSY = 8,
  // gpumem panicked inside this call (a bug): [`gpumem_last_error`] names the entry point
  // and the panic, and says whether a pool was left unusable.
  GPUMEM_INTERNAL = 9,
  // The device's pool is unusable after an earlier internal error (a panic that struck
  // while its state was locked); [`gpumem_last_error`] says which. Restart the process.
  GPUMEM_UNUSABLE = 10,
} GpumemStatus;

#ifdef __cplusplus
extern "C" {
#endif // __cplusplus

// PyTorch's `CUDAPluggableAllocator` allocation function: `size` bytes on `device` for use on
// `stream` (PyTorch's current `cudaStream_t`, which becomes the pool's stream for the block).
// Returns NULL for a zero-byte request. On failure it throws a C++ exception, because
// PyTorch would put a NULL return into a tensor: a `c10::OutOfMemoryError` (Python:
// `torch.OutOfMemoryError`) for an OOM, carrying gpumem's explanation, a `std::runtime_error`
// (Python: `RuntimeError`) for any other error, a caught panic included. Call it only from
// C++ that expects that (use [`gpumem_alloc`] from C).
void *gpumem_torch_alloc(size_t size, int device, void *stream);

// The allocation function for a `torch.cuda.MemPool` backed by gpumem: as
// [`gpumem_torch_alloc`] but returning NULL on failure instead of throwing. PyTorch's caching
// allocator calls it for a pool's segments and treats NULL as `cudaErrorMemoryAllocation`: it
// frees its own cache, retries, and raises `torch.OutOfMemoryError`; gpumem's explanation is
// in [`gpumem_last_oom`].
void *gpumem_torch_pool_alloc(size_t size, int device, void *stream);

// PyTorch's `CUDAPluggableAllocator` free function: `ptr`, `size`, `device` and `stream` are
// what PyTorch recorded at allocation. NULL is ignored. It cannot fail back to PyTorch (it
// runs in tensor destructors): misuse — an unknown pointer, a wrong size, device or stream — frees
// nothing, sets the last error and prints it to stderr.
void gpumem_torch_free(void *ptr,
                       size_t size,
                       int device,
                       void *stream);

// CuPy's `CFunctionAllocator` allocation function (`param` is unused; pass 0): `size` bytes
// on `device`'s default stream. Returns NULL on failure with the reason in
// [`gpumem_last_error`] and, for an OOM, [`gpumem_last_oom`].
void *gpumem_cupy_malloc(void *param, size_t size, int device);

// CuPy's `CFunctionAllocator` free function. NULL is ignored; an unknown pointer frees
// nothing and sets the last error.
void gpumem_cupy_free(void *param, void *ptr, int device);

// Allocates `size` bytes on `device` for use on `stream` (a `cudaStream_t`; NULL is the
// default stream) and stores the address in `*out` (NULL for zero bytes and on failure).
//
// # Safety
// `out` must be NULL or point to writable storage for one pointer.
enum GpumemStatus gpumem_alloc(size_t size, int device, void *stream, void **out);

// Frees `ptr` (allocated on `device`) after checking that it was allocated with `size` bytes
// ([`GPUMEM_ANY_SIZE`] skips the check). NULL is a no-op; an unknown pointer, a wrong size or
// a wrong device frees nothing and returns an error.
enum GpumemStatus gpumem_free(void *ptr, size_t size, int device);

// This thread's last error message ("" if none): valid until the next gpumem call on this
// thread fails. Never NULL.
const char *gpumem_last_error(void);

// `device`'s statistics as one JSON object with `torch.cuda.memory_stats()`'s keys
// (`allocated_bytes.all.current`, `reserved_bytes.all.peak`, `num_ooms`, …, plus gpumem's
// `device_calls.*`), into `buffer`. Returns the bytes needed with the NUL, or 0 on error.
//
// # Safety
// `buffer` must be NULL with `capacity == 0`, or writable for `capacity` bytes.
size_t gpumem_memory_stats(int device, char *buffer, size_t capacity);

// `device`'s pool summary (`pool_status`: usage, limits, fragmentation) as text, into
// `buffer`. Returns the bytes needed with the NUL, or 0 on error.
//
// # Safety
// `buffer` must be NULL with `capacity == 0`, or writable for `capacity` bytes.
size_t gpumem_pool_status(int device, char *buffer, size_t capacity);

// The explanation of `device`'s last OOM (what was asked, held and free, what to try), or ""
// when none happened, into `buffer`. Returns the bytes needed with the NUL, or 0 on error.
//
// # Safety
// `buffer` must be NULL with `capacity == 0`, or writable for `capacity` bytes.
size_t gpumem_last_oom(int device, char *buffer, size_t capacity);

// The name of the policy `device`'s pool runs (`gpumem`, `torch`, `expandable`, `none`), into
// `buffer`. Returns the bytes needed with the NUL, or 0 on error.
//
// # Safety
// `buffer` must be NULL with `capacity == 0`, or writable for `capacity` bytes.
size_t gpumem_policy(int device, char *buffer, size_t capacity);

// Gives `device`'s cached memory back to the device (`torch.cuda.empty_cache`); stores the
// bytes released in `*released` when it is not NULL.
//
// # Safety
// `released` must be NULL or writable.
enum GpumemStatus gpumem_empty_cache(int device, uint64_t *released);

// Sets every peak statistic of `device` to its current value
// (`torch.cuda.reset_peak_memory_stats`).
enum GpumemStatus gpumem_reset_peak_stats(int device);

// Starts (`capacity` > 0 events) or stops (0) recording `device`'s allocation history for
// snapshots.
enum GpumemStatus gpumem_set_history(int device, size_t capacity);

// Configures every pool — those already made and those made later: the `policy` (`gpumem`,
// `torch`, `expandable`, `none`; only while a pool has no live allocations), the soft and
// hard limits (`GPUMEM_*_LIMIT` forms: `2GiB`, `80GB`, `90%`; `"none"` for no limit) and the
// history capacity (events; 0 stops recording). NULL strings and a negative `history` leave
// that setting as it is (the environment's, until changed). Everything is checked before
// anything changes.
//
// # Safety
// Each string must be NULL or NUL-terminated.
enum GpumemStatus gpumem_configure(const char *policy,
                                   const char *soft_limit,
                                   const char *hard_limit,
                                   int64_t history);

// Changes `device`'s soft and hard limits now (forms as [`gpumem_configure`]; NULL leaves a
// limit as it is, `"none"` removes it). Cached memory above a lowered hard limit is released.
//
// # Safety
// Each string must be NULL or NUL-terminated.
enum GpumemStatus gpumem_set_limits(int device, const char *soft_limit, const char *hard_limit);

// Writes `device`'s pool as a PyTorch memory snapshot to `path`: a pickle that
// <https://pytorch.org/memory_viz> and `pickle.load` open (JSON when the name ends in
// `.json`), with the recorded history as its trace.
//
// # Safety
// `path` must be a NUL-terminated string.
enum GpumemStatus gpumem_snapshot(int device, const char *path);

// Publishes this process's pools for `gpumem top`, `diagnose` and `exporter`: a Unix socket
// `<dir>/<pid>.sock` answering their statistics, `dir` NULL for the directory those tools
// read (`GPUMEM_PUBLISH_DIR`, else `$XDG_RUNTIME_DIR/gpumem`, else `<tmp>/gpumem-<uid>`).
// `GPUMEM_PUBLISH=1` does the same when the first pool is made. Publishing twice keeps the
// first endpoint.
//
// # Safety
// `dir` must be NULL or a NUL-terminated string.
enum GpumemStatus gpumem_publish(const char *dir);

#if defined(GPUMEM_FAULT_INJECTION)
// Arms one panic in the next call of `entry_point` (any thread; the call after it runs
// normally). With `while_pool_locked` 0 the panic strikes as the call begins, before it
// touches any state, so the pools stay usable; otherwise it strikes inside the pool while
// its state is locked (at the pool's next event: only the allocation and free entry points
// are accepted), which leaves that device's pool unusable. Arming again replaces the armed
// panic. Returns `GPUMEM_INVALID_ARGUMENT` for a NULL, unknown or unaccepted name.
//
// # Safety
// `entry_point` must be NULL or a NUL-terminated string.
enum GpumemStatus gpumem_test_inject_panic(const char *entry_point, int while_pool_locked);
#endif

#ifdef __cplusplus
}  // extern "C"
#endif  // __cplusplus

#endif  /* GPUMEM_H */
