//! gpumem's caching pool as a C library, for PyTorch, CuPy and C.
//!
//! One pool per device, made on first use, on the CUDA backend (the device's primary context,
//! the one PyTorch and CuPy use) or, when `GPUMEM_DEVICE=sim`, on a simulated address-only
//! device of `GPUMEM_SIM_CAPACITY` bytes (16 GiB by default), for tests. The pools are
//! configured by the environment as [`gpumem_pool::PoolConfig::from_env`] reads it
//! (`GPUMEM_POOL`, `GPUMEM_SOFT_LIMIT`, `GPUMEM_HARD_LIMIT`, `GPUMEM_HISTORY`, …) and at run
//! time by [`gpumem_configure`] and [`gpumem_set_limits`]; a bad value is an error code with
//! the reason in [`gpumem_last_error`], never a silent default.
//!
//! - PyTorch: `torch.cuda.memory.CUDAPluggableAllocator(path, "gpumem_torch_alloc",
//!   "gpumem_torch_free")`. A failed allocation throws a C++ exception (PyTorch has no other
//!   way to hear of it): `torch.OutOfMemoryError` with gpumem's explanation.
//! - CuPy: `cupy.cuda.CFunctionAllocator(0, gpumem_cupy_malloc, gpumem_cupy_free, owner)`.
//! - C: [`gpumem_alloc`] and [`gpumem_free`] return a [`GpumemStatus`].
//!
//! Everything PyTorch's pluggable path loses is here: statistics with `memory_stats` keys,
//! `pool_status` text, `empty_cache`, limits, history and memory_viz snapshots, the last OOM's
//! explanation. Every function is thread-safe. Strings come back through a caller's buffer:
//! the functions return the bytes needed including the terminating NUL and write at most
//! `capacity` bytes (always NUL-terminated when `capacity > 0`), so a caller can ask with
//! `capacity = 0` first.
//!
//! No entry point lets a panic out: a panic inside gpumem (a bug) is caught where the call
//! entered, and becomes the call's failure — [`GpumemStatus::GpumemInternal`], NULL or 0, a
//! C++ `std::runtime_error` from [`gpumem_torch_alloc`] — with [`gpumem_last_error`] naming the
//! entry point and the panic. A pool the panic struck while its state was locked is unusable
//! from then on: every later call on its device fails with [`GpumemStatus::GpumemUnusable`]
//! and the reason, instead of going on with state that may be half-updated; the other pools,
//! and that one when the panic struck outside its locked state, go on working. The
//! `fault-injection` feature (tests only) adds `gpumem_test_inject_panic` to provoke one.
//!
//! The header `include/gpumem.h` is generated from this file by cbindgen (a test regenerates
//! it and fails when the committed one differs).

// The C entry points take raw pointers from C; each use is checked and commented.
#![allow(unsafe_code)]
#![warn(missing_docs)]

pub mod api;
#[cfg(feature = "fault-injection")]
mod fault;
mod state;

use std::ffi::{c_char, c_int, c_void, CStr};
use std::panic::AssertUnwindSafe;

use gpumem_device::DevicePtr;
use gpumem_pool::PoolError;
use gpumem_publish::PublishError;

#[cfg(feature = "fault-injection")]
pub use fault::gpumem_test_inject_panic;
pub use state::{CapiError, GPUMEM_MAX_DEVICES};

/// What a gpumem C call returns: 0 for success, otherwise what went wrong
/// ([`gpumem_last_error`] says more).
#[repr(C)]
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum GpumemStatus {
    /// Success.
    GpumemOk = 0,
    /// The allocation does not fit, even after freeing the cache; [`gpumem_last_oom`]
    /// explains.
    GpumemOutOfMemory = 1,
    /// An argument is not valid (a null string, an unknown policy, a bad size or ordinal, a
    /// free on another stream than the allocation's).
    GpumemInvalidArgument = 2,
    /// A pointer that is not a live allocation of the device's pool (never allocated, already
    /// freed, or of another device).
    GpumemUnknownPointer = 3,
    /// A free whose size differs from the allocation's.
    GpumemSizeMismatch = 4,
    /// A configuration value (environment or run time) that cannot be used.
    GpumemConfig = 5,
    /// The device failed, or its backend could not be opened.
    GpumemDevice = 6,
    /// A file could not be written.
    GpumemIo = 7,
    /// The policy cannot change while allocations are live.
    GpumemBusy = 8,
    /// gpumem panicked inside this call (a bug): [`gpumem_last_error`] names the entry point
    /// and the panic, and says whether a pool was left unusable.
    GpumemInternal = 9,
    /// The device's pool is unusable after an earlier internal error (a panic that struck
    /// while its state was locked); [`gpumem_last_error`] says which. Restart the process.
    GpumemUnusable = 10,
}

impl CapiError {
    /// The status code a C call returns for this error.
    pub fn status(&self) -> GpumemStatus {
        match self {
            CapiError::UnknownBackend(_) | CapiError::SimCapacity { .. } => {
                GpumemStatus::GpumemConfig
            }
            CapiError::DeviceOrdinal(_)
            | CapiError::InvalidArgument { .. }
            | CapiError::WrongStream { .. } => GpumemStatus::GpumemInvalidArgument,
            CapiError::Open { .. } => GpumemStatus::GpumemDevice,
            CapiError::Pool { source, .. } => match source {
                PoolError::OutOfMemory(_) => GpumemStatus::GpumemOutOfMemory,
                PoolError::UnknownPointer { .. } => GpumemStatus::GpumemUnknownPointer,
                PoolError::Device(_) => GpumemStatus::GpumemDevice,
                PoolError::Config(_) => GpumemStatus::GpumemConfig,
            },
            CapiError::SizeMismatch { .. } => GpumemStatus::GpumemSizeMismatch,
            CapiError::WrongDevice { .. } => GpumemStatus::GpumemUnknownPointer,
            CapiError::PolicyBusy { .. } => GpumemStatus::GpumemBusy,
            CapiError::Io { .. } => GpumemStatus::GpumemIo,
            CapiError::Panic { .. } => GpumemStatus::GpumemInternal,
            CapiError::Unusable { .. } => GpumemStatus::GpumemUnusable,
            CapiError::Publish(PublishError::BadEnv { .. }) => GpumemStatus::GpumemConfig,
            CapiError::Publish(_) => GpumemStatus::GpumemIo,
        }
    }
}

/// Records a failure as this thread's last error and returns its status.
fn fail(error: &CapiError) -> GpumemStatus {
    state::set_last_error(&error.to_string());
    error.status()
}

fn status(result: Result<(), CapiError>) -> GpumemStatus {
    match result {
        Ok(()) => GpumemStatus::GpumemOk,
        Err(e) => fail(&e),
    }
}

/// What an entry point returns when its body panicked: its return type's failure (the
/// error's status, NULL, 0, nothing), the panic being the last error by then.
trait PanicReturn {
    /// The failure value for the caught panic `error`.
    fn after_panic(error: &CapiError) -> Self;
}

impl PanicReturn for GpumemStatus {
    fn after_panic(error: &CapiError) -> Self {
        error.status()
    }
}

impl PanicReturn for *mut c_void {
    fn after_panic(_: &CapiError) -> Self {
        std::ptr::null_mut()
    }
}

impl PanicReturn for usize {
    fn after_panic(_: &CapiError) -> Self {
        0
    }
}

impl PanicReturn for () {
    fn after_panic(_: &CapiError) -> Self {}
}

impl PanicReturn for *const c_char {
    fn after_panic(_: &CapiError) -> Self {
        c"".as_ptr()
    }
}

/// Runs the body of the entry point `entry` with panics caught: a panic becomes
/// [`CapiError::Panic`], and the pools it struck while their state was locked are marked
/// unusable ([`state::panicked`]). Nothing unwinds out of gpumem into C, C++ or Python.
fn catch<R>(entry: &'static str, body: impl FnOnce() -> R) -> Result<R, CapiError> {
    // Unwind safety is handled rather than assumed: the library's own mutexes hold values
    // replaced whole and are taken over when poisoned, and a pool whose lock a panic poisoned
    // is refused from then on (the registry's `unusable`).
    std::panic::catch_unwind(AssertUnwindSafe(|| {
        #[cfg(feature = "fault-injection")]
        let _fault = fault::enter(entry);
        body()
    }))
    .map_err(|payload| state::panicked(entry, &*payload))
}

/// [`catch`] for entry points that report errors by return value: a panic is recorded as the
/// last error and the entry point returns its failure value.
fn guard<R: PanicReturn>(entry: &'static str, body: impl FnOnce() -> R) -> R {
    catch(entry, body).unwrap_or_else(|error| {
        fail(&error);
        R::after_panic(&error)
    })
}

/// An allocation for callers that take NULL as failure: the reason goes to the last error.
fn allocate_or_null(size: usize, device: c_int, stream: u64) -> *mut c_void {
    match api::allocate(size as u64, device.into(), stream) {
        Ok(ptr) => ptr as *mut c_void,
        Err(e) => {
            fail(&e);
            std::ptr::null_mut()
        }
    }
}

extern "C-unwind" {
    /// Throws the C++ exception for a failed PyTorch allocation (`src/throw.cpp`).
    fn gpumem_capi_throw(message: *const c_char, out_of_memory: c_int) -> !;
}

/// PyTorch's `CUDAPluggableAllocator` allocation function: `size` bytes on `device` for use on
/// `stream` (PyTorch's current `cudaStream_t`, which becomes the pool's stream for the block).
/// Returns NULL for a zero-byte request. On failure it throws a C++ exception, because
/// PyTorch would put a NULL return into a tensor: a `c10::OutOfMemoryError` (Python:
/// `torch.OutOfMemoryError`) for an OOM, carrying gpumem's explanation, a `std::runtime_error`
/// (Python: `RuntimeError`) for any other error, a caught panic included. Call it only from
/// C++ that expects that (use [`gpumem_alloc`] from C).
#[no_mangle]
pub extern "C-unwind" fn gpumem_torch_alloc(
    size: usize,
    device: c_int,
    stream: *mut c_void,
) -> *mut c_void {
    let allocated = catch("gpumem_torch_alloc", || {
        api::allocate(size as u64, device.into(), stream as u64)
    });
    // A panic is thrown as the other errors are, here, outside `catch`: a C++ exception
    // must not unwind through `catch_unwind`.
    let error = match allocated.and_then(|result| result) {
        Ok(ptr) => return ptr as *mut c_void,
        Err(error) => error,
    };
    fail(&error);
    let out_of_memory = c_int::from(error.is_out_of_memory());
    let message = state::with_last_error(|text| text.to_owned());
    drop(error);
    // SAFETY: `message` is a NUL-terminated string alive for the call; the function copies it
    // before throwing, and the exception unwinds through this frame ("C-unwind"), dropping
    // `message`.
    unsafe { gpumem_capi_throw(message.as_ptr(), out_of_memory) }
}

/// The allocation function for a `torch.cuda.MemPool` backed by gpumem: as
/// [`gpumem_torch_alloc`] but returning NULL on failure instead of throwing. PyTorch's caching
/// allocator calls it for a pool's segments and treats NULL as `cudaErrorMemoryAllocation`: it
/// frees its own cache, retries, and raises `torch.OutOfMemoryError`; gpumem's explanation is
/// in [`gpumem_last_oom`].
#[no_mangle]
pub extern "C" fn gpumem_torch_pool_alloc(
    size: usize,
    device: c_int,
    stream: *mut c_void,
) -> *mut c_void {
    guard("gpumem_torch_pool_alloc", || {
        allocate_or_null(size, device, stream as u64)
    })
}

/// PyTorch's `CUDAPluggableAllocator` free function: `ptr`, `size`, `device` and `stream` are
/// what PyTorch recorded at allocation. NULL is ignored. It cannot fail back to PyTorch (it
/// runs in tensor destructors): misuse — an unknown pointer, a wrong size, device or stream — frees
/// nothing, sets the last error and prints it to stderr.
#[no_mangle]
pub extern "C" fn gpumem_torch_free(
    ptr: *mut c_void,
    size: usize,
    device: c_int,
    stream: *mut c_void,
) {
    guard("gpumem_torch_free", || {
        let stream = Some(stream as u64);
        if let Err(e) = api::free(ptr as DevicePtr, Some(size as u64), device.into(), stream) {
            fail(&e);
            eprintln!("gpumem: {e}");
        }
    })
}

/// CuPy's `CFunctionAllocator` allocation function (`param` is unused; pass 0): `size` bytes
/// on `device`'s default stream. Returns NULL on failure with the reason in
/// [`gpumem_last_error`] and, for an OOM, [`gpumem_last_oom`].
#[no_mangle]
pub extern "C" fn gpumem_cupy_malloc(
    param: *mut c_void,
    size: usize,
    device: c_int,
) -> *mut c_void {
    let _ = param;
    guard("gpumem_cupy_malloc", || allocate_or_null(size, device, 0))
}

/// CuPy's `CFunctionAllocator` free function. NULL is ignored; an unknown pointer frees
/// nothing and sets the last error.
#[no_mangle]
pub extern "C" fn gpumem_cupy_free(param: *mut c_void, ptr: *mut c_void, device: c_int) {
    let _ = param;
    guard("gpumem_cupy_free", || {
        if let Err(e) = api::free(ptr as DevicePtr, None, device.into(), None) {
            fail(&e);
        }
    })
}

/// Allocates `size` bytes on `device` for use on `stream` (a `cudaStream_t`; NULL is the
/// default stream) and stores the address in `*out` (NULL for zero bytes and on failure).
///
/// # Safety
/// `out` must be NULL or point to writable storage for one pointer.
#[no_mangle]
pub unsafe extern "C" fn gpumem_alloc(
    size: usize,
    device: c_int,
    stream: *mut c_void,
    out: *mut *mut c_void,
) -> GpumemStatus {
    guard("gpumem_alloc", || {
        if out.is_null() {
            return fail(&invalid("out", "NULL", "a pointer to store the address in"));
        }
        // SAFETY: `out` is non-null and, by the contract, writable. NULL first, so that it
        // is NULL if the allocation panics.
        unsafe { *out = std::ptr::null_mut() };
        let result = api::allocate(size as u64, device.into(), stream as u64);
        // SAFETY: as above.
        unsafe { *out = *result.as_ref().unwrap_or(&0) as *mut c_void };
        status(result.map(|_| ()))
    })
}

/// `size` for [`gpumem_free`] when the caller does not know the allocation's size: no check.
pub const GPUMEM_ANY_SIZE: usize = !0;

/// Frees `ptr` (allocated on `device`) after checking that it was allocated with `size` bytes
/// ([`GPUMEM_ANY_SIZE`] skips the check). NULL is a no-op; an unknown pointer, a wrong size or
/// a wrong device frees nothing and returns an error.
#[no_mangle]
pub extern "C" fn gpumem_free(ptr: *mut c_void, size: usize, device: c_int) -> GpumemStatus {
    guard("gpumem_free", || {
        let size = (size != GPUMEM_ANY_SIZE).then_some(size as u64);
        status(api::free(ptr as DevicePtr, size, device.into(), None))
    })
}

/// This thread's last error message ("" if none): valid until the next gpumem call on this
/// thread fails. Never NULL.
#[no_mangle]
pub extern "C" fn gpumem_last_error() -> *const c_char {
    // The CString lives in a thread-local that is only replaced by a later failure on this
    // thread, so the pointer stays valid as documented.
    guard("gpumem_last_error", || {
        state::with_last_error(|text| text.as_ptr())
    })
}

/// A text result into `buffer` (at most `capacity` bytes, NUL-terminated): the bytes the
/// whole text needs with its NUL, or 0 with the last error set.
///
/// # Safety
/// `buffer` must be NULL with `capacity == 0`, or writable for `capacity` bytes.
unsafe fn text_out(text: Result<String, CapiError>, buffer: *mut c_char, capacity: usize) -> usize {
    let text = match text {
        Ok(text) => text,
        Err(e) => {
            fail(&e);
            return 0;
        }
    };
    let bytes = text.as_bytes();
    if !buffer.is_null() && capacity > 0 {
        let n = bytes.len().min(capacity - 1);
        // SAFETY: `buffer` is writable for `capacity` > n bytes; the source is `n` bytes of
        // `text`, which is ours, so they cannot overlap.
        unsafe {
            std::ptr::copy_nonoverlapping(bytes.as_ptr(), buffer.cast::<u8>(), n);
            *buffer.add(n) = 0;
        }
    }
    bytes.len() + 1
}

/// `device`'s statistics as one JSON object with `torch.cuda.memory_stats()`'s keys
/// (`allocated_bytes.all.current`, `reserved_bytes.all.peak`, `num_ooms`, …, plus gpumem's
/// `device_calls.*`), into `buffer`. Returns the bytes needed with the NUL, or 0 on error.
///
/// # Safety
/// `buffer` must be NULL with `capacity == 0`, or writable for `capacity` bytes.
#[no_mangle]
pub unsafe extern "C" fn gpumem_memory_stats(
    device: c_int,
    buffer: *mut c_char,
    capacity: usize,
) -> usize {
    guard("gpumem_memory_stats", || {
        let json = api::memory_stats(device.into()).map(|stats| {
            let object: serde_json::Map<String, serde_json::Value> =
                stats.into_iter().map(|(k, v)| (k, v.into())).collect();
            serde_json::Value::Object(object).to_string()
        });
        // SAFETY: forwarded from the caller.
        unsafe { text_out(json, buffer, capacity) }
    })
}

/// `device`'s pool summary (`pool_status`: usage, limits, fragmentation) as text, into
/// `buffer`. Returns the bytes needed with the NUL, or 0 on error.
///
/// # Safety
/// `buffer` must be NULL with `capacity == 0`, or writable for `capacity` bytes.
#[no_mangle]
pub unsafe extern "C" fn gpumem_pool_status(
    device: c_int,
    buffer: *mut c_char,
    capacity: usize,
) -> usize {
    guard("gpumem_pool_status", || {
        // SAFETY: forwarded from the caller.
        unsafe { text_out(api::pool_status(device.into()), buffer, capacity) }
    })
}

/// The explanation of `device`'s last OOM (what was asked, held and free, what to try), or ""
/// when none happened, into `buffer`. Returns the bytes needed with the NUL, or 0 on error.
///
/// # Safety
/// `buffer` must be NULL with `capacity == 0`, or writable for `capacity` bytes.
#[no_mangle]
pub unsafe extern "C" fn gpumem_last_oom(
    device: c_int,
    buffer: *mut c_char,
    capacity: usize,
) -> usize {
    guard("gpumem_last_oom", || {
        let text = api::last_oom(device.into()).map(Option::unwrap_or_default);
        // SAFETY: forwarded from the caller.
        unsafe { text_out(text, buffer, capacity) }
    })
}

/// The name of the policy `device`'s pool runs (`gpumem`, `torch`, `expandable`, `none`), into
/// `buffer`. Returns the bytes needed with the NUL, or 0 on error.
///
/// # Safety
/// `buffer` must be NULL with `capacity == 0`, or writable for `capacity` bytes.
#[no_mangle]
pub unsafe extern "C" fn gpumem_policy(
    device: c_int,
    buffer: *mut c_char,
    capacity: usize,
) -> usize {
    guard("gpumem_policy", || {
        let name = api::policy(device.into()).map(str::to_string);
        // SAFETY: forwarded from the caller.
        unsafe { text_out(name, buffer, capacity) }
    })
}

/// Gives `device`'s cached memory back to the device (`torch.cuda.empty_cache`); stores the
/// bytes released in `*released` when it is not NULL.
///
/// # Safety
/// `released` must be NULL or writable.
#[no_mangle]
pub unsafe extern "C" fn gpumem_empty_cache(device: c_int, released: *mut u64) -> GpumemStatus {
    guard("gpumem_empty_cache", || {
        let result = api::empty_cache(device.into());
        if let (Ok(bytes), false) = (&result, released.is_null()) {
            // SAFETY: non-null and, by the contract, writable.
            unsafe { *released = *bytes };
        }
        status(result.map(|_| ()))
    })
}

/// Sets every peak statistic of `device` to its current value
/// (`torch.cuda.reset_peak_memory_stats`).
#[no_mangle]
pub extern "C" fn gpumem_reset_peak_stats(device: c_int) -> GpumemStatus {
    guard("gpumem_reset_peak_stats", || {
        status(api::reset_peak_stats(device.into()))
    })
}

/// Starts (`capacity` > 0 events) or stops (0) recording `device`'s allocation history for
/// snapshots.
#[no_mangle]
pub extern "C" fn gpumem_set_history(device: c_int, capacity: usize) -> GpumemStatus {
    guard("gpumem_set_history", || {
        status(api::set_history(device.into(), capacity))
    })
}

/// Reads an optional C string argument: NULL is `None`.
///
/// # Safety
/// `text` must be NULL or a NUL-terminated string.
unsafe fn optional_str<'a>(
    name: &'static str,
    text: *const c_char,
) -> Result<Option<&'a str>, CapiError> {
    if text.is_null() {
        return Ok(None);
    }
    // SAFETY: non-null and, by the contract, NUL-terminated.
    let text = unsafe { CStr::from_ptr(text) };
    text.to_str().map(Some).map_err(|_| {
        invalid(
            name,
            &text.to_string_lossy(),
            "not UTF-8; accepted: an ASCII value",
        )
    })
}

fn invalid(name: &'static str, value: &str, problem: &str) -> CapiError {
    CapiError::InvalidArgument {
        name,
        value: value.to_string(),
        problem: problem.to_string(),
    }
}

/// Configures every pool — those already made and those made later: the `policy` (`gpumem`,
/// `torch`, `expandable`, `none`; only while a pool has no live allocations), the soft and
/// hard limits (`GPUMEM_*_LIMIT` forms: `2GiB`, `80GB`, `90%`; `"none"` for no limit) and the
/// history capacity (events; 0 stops recording). NULL strings and a negative `history` leave
/// that setting as it is (the environment's, until changed). Everything is checked before
/// anything changes.
///
/// # Safety
/// Each string must be NULL or NUL-terminated.
#[no_mangle]
pub unsafe extern "C" fn gpumem_configure(
    policy: *const c_char,
    soft_limit: *const c_char,
    hard_limit: *const c_char,
    history: i64,
) -> GpumemStatus {
    guard("gpumem_configure", || {
        // SAFETY: forwarded from the caller.
        let strings = unsafe {
            (|| {
                Ok::<_, CapiError>((
                    optional_str("policy", policy)?,
                    optional_str("soft limit", soft_limit)?,
                    optional_str("hard limit", hard_limit)?,
                ))
            })()
        };
        status(strings.and_then(|(policy, soft, hard)| {
            api::configure(policy, soft, hard, usize::try_from(history).ok())
        }))
    })
}

/// Changes `device`'s soft and hard limits now (forms as [`gpumem_configure`]; NULL leaves a
/// limit as it is, `"none"` removes it). Cached memory above a lowered hard limit is released.
///
/// # Safety
/// Each string must be NULL or NUL-terminated.
#[no_mangle]
pub unsafe extern "C" fn gpumem_set_limits(
    device: c_int,
    soft_limit: *const c_char,
    hard_limit: *const c_char,
) -> GpumemStatus {
    guard("gpumem_set_limits", || {
        // SAFETY: forwarded from the caller.
        let strings = unsafe {
            optional_str("soft limit", soft_limit)
                .and_then(|soft| Ok((soft, optional_str("hard limit", hard_limit)?)))
        };
        status(strings.and_then(|(soft, hard)| api::set_limits(device.into(), soft, hard)))
    })
}

/// Writes `device`'s pool as a PyTorch memory snapshot to `path`: a pickle that
/// <https://pytorch.org/memory_viz> and `pickle.load` open (JSON when the name ends in
/// `.json`), with the recorded history as its trace.
///
/// # Safety
/// `path` must be a NUL-terminated string.
#[no_mangle]
pub unsafe extern "C" fn gpumem_snapshot(device: c_int, path: *const c_char) -> GpumemStatus {
    guard("gpumem_snapshot", || {
        // SAFETY: forwarded from the caller.
        let path = unsafe { optional_str("path", path) };
        status(path.and_then(|path| {
            let path = path.ok_or_else(|| invalid("path", "NULL", "a file name is needed"))?;
            api::snapshot(device.into(), path)
        }))
    })
}

/// Publishes this process's pools for `gpumem top`, `diagnose` and `exporter`: a Unix socket
/// `<dir>/<pid>.sock` answering their statistics, `dir` NULL for the directory those tools
/// read (`GPUMEM_PUBLISH_DIR`, else `$XDG_RUNTIME_DIR/gpumem`, else `<tmp>/gpumem-<uid>`).
/// `GPUMEM_PUBLISH=1` does the same when the first pool is made. Publishing twice keeps the
/// first endpoint.
///
/// # Safety
/// `dir` must be NULL or a NUL-terminated string.
#[no_mangle]
pub unsafe extern "C" fn gpumem_publish(dir: *const c_char) -> GpumemStatus {
    guard("gpumem_publish", || {
        // SAFETY: forwarded from the caller.
        let dir = unsafe { optional_str("dir", dir) };
        status(dir.and_then(|dir| api::publish(dir).map(|_| ())))
    })
}

#[cfg(test)]
mod tests {
    use super::*;
    use gpumem_pool::{PolicyKind, PoolEvent, PoolObserver};

    /// Panics at the pool's first event: a panic inside the pool, under its lock.
    struct Bomb;

    impl PoolObserver for Bomb {
        fn on_event(&mut self, _: &PoolEvent) {
            panic!("bomb");
        }
    }

    fn last_error() -> String {
        state::with_last_error(|text| text.to_string_lossy().into_owned())
    }

    #[test]
    fn a_panic_becomes_the_failure_of_the_entry_points_return_type() {
        let status: GpumemStatus = guard("gpumem_example", || panic!("boom {}", 1));
        assert_eq!(status, GpumemStatus::GpumemInternal);
        assert_eq!(
            last_error(),
            "internal error in gpumem_example: panicked: boom 1; it struck while no pool's \
             state was locked, so the pools stay usable"
        );
        let pointer: *mut c_void = guard("gpumem_example", || panic!("static text"));
        assert!(pointer.is_null());
        assert!(
            last_error().contains("panicked: static text;"),
            "{}",
            last_error()
        );
        let size: usize = guard("gpumem_example", || std::panic::panic_any(7_u32));
        assert_eq!(size, 0);
        assert!(
            last_error().contains("panicked: a panic without a message;"),
            "{}",
            last_error()
        );
        // Without a panic the body's value passes through, and the last error stays.
        assert_eq!(guard("gpumem_example", || 42_usize), 42);
        assert!(last_error().contains("a panic without a message"));
    }

    #[test]
    fn queries_and_bad_frees_on_an_unused_device_make_no_pool() {
        std::env::set_var("GPUMEM_DEVICE", "sim");
        let device = 57;
        let stats = api::memory_stats(device).unwrap();
        assert_eq!(stats["allocated_bytes.all.current"], 0);
        assert_eq!(api::last_oom(device).unwrap(), None);
        assert_eq!(api::empty_cache(device).unwrap(), 0);
        api::reset_peak_stats(device).unwrap();
        let refused = api::free(0x1234, None, device, None).unwrap_err();
        assert_eq!(
            refused.status(),
            GpumemStatus::GpumemUnknownPointer,
            "{refused}"
        );
        assert!(gpumem_pool::global_registry()
            .get(device as usize)
            .is_none());
        // Allocating makes it.
        let ptr = api::allocate(4096, device, 0).unwrap();
        api::free(ptr, Some(4096), device, None).unwrap();
        assert!(gpumem_pool::global_registry()
            .get(device as usize)
            .is_some());
    }

    #[test]
    fn a_policy_change_gives_the_replaced_pools_cache_back() {
        std::env::set_var("GPUMEM_DEVICE", "sim");
        let device = 59;
        let ptr = api::allocate(8 << 20, device as i64, 0).unwrap();
        api::free(ptr, Some(8 << 20), device as i64, None).unwrap();
        let replaced = state::device_pool(device).unwrap();
        let other = match replaced.policy_name() {
            "torch" => PolicyKind::Gpumem,
            _ => PolicyKind::Torch,
        };
        assert!(
            replaced.stats().reserved_bytes.all.current > 0,
            "the block is cached"
        );
        let change = state::Change {
            policy: Some(other),
            ..state::Change::default()
        };
        state::configure(&change, Some(device)).unwrap();
        assert_eq!(replaced.stats().reserved_bytes.all.current, 0);
        assert_eq!(
            state::device_pool(device).unwrap().policy_name(),
            other.as_str()
        );
    }

    #[test]
    fn a_panic_inside_a_pool_makes_every_later_call_on_its_device_an_error() {
        std::env::set_var("GPUMEM_DEVICE", "sim");
        let device = 60;
        let pool = state::device_pool(device).unwrap();
        pool.add_observer(Box::new(Bomb));
        let status = guard("gpumem_example", || {
            status(api::allocate(4096, device as i64, 0).map(|_| ()))
        });
        assert_eq!(status, GpumemStatus::GpumemInternal);
        assert!(
            last_error().ends_with(
                "it struck while the pool of device 60 was changing its state, so that pool is \
                 unusable from now on (restart the process)"
            ),
            "{}",
            last_error()
        );
        let refused = api::allocate(4096, device as i64, 0).unwrap_err();
        assert_eq!(refused.status(), GpumemStatus::GpumemUnusable);
        assert!(
            refused.to_string().starts_with(
                "the gpumem pool of device 60 is unusable after an internal error in \
                 gpumem_example: bomb; restart the process"
            ),
            "{refused}"
        );
        // Taking the poisoned lock over did not panic a second time: the pool still answers a
        // direct reader, but the library no longer hands it out.
        assert!(pool.is_poisoned());
        assert!(pool.allocation(0).is_none());
        assert!(matches!(
            state::device_pool(device),
            Err(CapiError::Unusable { device: 60, .. })
        ));
    }
}
