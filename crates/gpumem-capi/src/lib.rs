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
//! The header `include/gpumem.h` is generated from this file by cbindgen (a test regenerates
//! it and fails when the committed one differs).

// The C entry points take raw pointers from C; each use is checked and commented.
#![allow(unsafe_code)]
#![warn(missing_docs)]

mod state;

use std::ffi::{c_char, c_int, c_void, CStr};
use std::sync::Arc;

use gpumem_device::DevicePtr;
use gpumem_pool::PoolError;

pub use state::{CapiError, GPUMEM_MAX_DEVICES};
use state::{Change, DevicePool};

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
    /// An argument is not valid (a null string, an unknown policy, a bad size or ordinal).
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
}

impl CapiError {
    /// The status code a C call returns for this error.
    pub fn status(&self) -> GpumemStatus {
        match self {
            CapiError::UnknownBackend(_) | CapiError::SimCapacity { .. } => {
                GpumemStatus::GpumemConfig
            }
            CapiError::DeviceOrdinal(_) | CapiError::InvalidArgument { .. } => {
                GpumemStatus::GpumemInvalidArgument
            }
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
        }
    }
}

/// `size` for [`gpumem_free`] when the caller does not know the allocation's size: no check.
pub const GPUMEM_ANY_SIZE: usize = !0;

/// Records a failure as this thread's last error (and, for an OOM, as the device's last OOM)
/// and returns its status.
fn fail(error: &CapiError) -> GpumemStatus {
    let text = error.to_string();
    if let (true, CapiError::Pool { device, .. }) = (error.is_out_of_memory(), error) {
        if let Some(entry) = state::existing(*device) {
            entry.note_oom(&text);
        }
    }
    state::set_last_error(&text);
    error.status()
}

fn status(result: Result<(), CapiError>) -> GpumemStatus {
    match result {
        Ok(()) => GpumemStatus::GpumemOk,
        Err(e) => fail(&e),
    }
}

fn pool_of(device: c_int) -> Result<(usize, Arc<DevicePool>), CapiError> {
    let device = state::ordinal(device.into())?;
    Ok((device, state::device_pool(device)?))
}

fn allocate(size: usize, device: c_int, stream: u64) -> Result<DevicePtr, CapiError> {
    let (device, entry) = pool_of(device)?;
    let stream = entry.stream(stream);
    entry
        .pool
        .allocate(size as u64, stream)
        .map(|a| a.ptr)
        .map_err(|source| CapiError::Pool { device, source })
}

/// Frees `ptr` of `device`, checking the size when one is given: a pointer of another device's
/// pool, or a wrong size, is an error and frees nothing.
fn release(ptr: DevicePtr, size: Option<u64>, device: c_int) -> Result<(), CapiError> {
    if ptr == 0 {
        return Ok(());
    }
    let (device, entry) = pool_of(device)?;
    let Some(live) = entry.pool.allocation(ptr) else {
        let owner = state::all_pools()
            .into_iter()
            .find(|(d, other)| *d != device && other.pool.allocation(ptr).is_some());
        return Err(match owner {
            Some((owner, _)) => CapiError::WrongDevice {
                ptr,
                given: device,
                owner,
            },
            None => CapiError::Pool {
                device,
                source: PoolError::UnknownPointer { ptr, what: "free" },
            },
        });
    };
    if let Some(given) = size.filter(|&s| s != live.size) {
        return Err(CapiError::SizeMismatch {
            device,
            ptr,
            allocated: live.size,
            given,
        });
    }
    entry
        .pool
        .free(ptr)
        .map_err(|source| CapiError::Pool { device, source })
}

extern "C-unwind" {
    /// Throws the C++ exception for a failed PyTorch allocation (`src/throw.cpp`).
    fn gpumem_capi_throw(message: *const c_char, out_of_memory: c_int) -> !;
}

/// PyTorch's `CUDAPluggableAllocator` allocation function: `size` bytes on `device` for use on
/// `stream` (PyTorch's current `cudaStream_t`, which becomes the pool's stream for the block).
/// Returns NULL for a zero-byte request. On failure it throws a C++ exception — a
/// `c10::OutOfMemoryError` (Python: `torch.OutOfMemoryError`) for an OOM, carrying gpumem's
/// explanation, a `std::runtime_error` otherwise — because PyTorch would put a NULL return
/// into a tensor; call it only from C++ that expects that (use [`gpumem_alloc`] from C).
#[no_mangle]
pub extern "C-unwind" fn gpumem_torch_alloc(
    size: usize,
    device: c_int,
    stream: *mut c_void,
) -> *mut c_void {
    let error = match allocate(size, device, stream as u64) {
        Ok(ptr) => return ptr as *mut c_void,
        Err(error) => error,
    };
    fail(&error);
    let out_of_memory = c_int::from(error.is_out_of_memory());
    let message = state::with_last_error(|text| text.clone());
    drop(error);
    // SAFETY: `message` is a NUL-terminated string alive for the call; the function copies it
    // before throwing, and the exception unwinds through this frame ("C-unwind"), dropping
    // `message`.
    unsafe { gpumem_capi_throw(message.as_ptr(), out_of_memory) }
}

/// PyTorch's `CUDAPluggableAllocator` free function: `ptr`, `size`, `device` and `stream` are
/// what PyTorch recorded at allocation. NULL is ignored. It cannot fail back to PyTorch (it
/// runs in tensor destructors): misuse — an unknown pointer, a wrong size or device — frees
/// nothing, sets the last error and prints it to stderr.
#[no_mangle]
pub extern "C" fn gpumem_torch_free(
    ptr: *mut c_void,
    size: usize,
    device: c_int,
    stream: *mut c_void,
) {
    let _ = stream;
    if let Err(e) = release(ptr as DevicePtr, Some(size as u64), device) {
        fail(&e);
        eprintln!("gpumem: {e}");
    }
}

/// CuPy's `CFunctionAllocator` allocation function (`param` is unused; pass 0): `size` bytes
/// on `device`'s default stream. Returns NULL on failure with the reason in
/// [`gpumem_last_error`] and, for an OOM, [`gpumem_last_oom`] (Python's `gpumem.cupy.use`
/// raises CuPy's `OutOfMemoryError` with it).
#[no_mangle]
pub extern "C" fn gpumem_cupy_malloc(
    param: *mut c_void,
    size: usize,
    device: c_int,
) -> *mut c_void {
    let _ = param;
    match allocate(size, device, 0) {
        Ok(ptr) => ptr as *mut c_void,
        Err(e) => {
            fail(&e);
            std::ptr::null_mut()
        }
    }
}

/// CuPy's `CFunctionAllocator` free function. NULL is ignored; an unknown pointer frees
/// nothing and sets the last error.
#[no_mangle]
pub extern "C" fn gpumem_cupy_free(param: *mut c_void, ptr: *mut c_void, device: c_int) {
    let _ = param;
    if let Err(e) = release(ptr as DevicePtr, None, device) {
        fail(&e);
    }
}

/// Allocates `size` bytes on `device` for use on `stream` (a `cudaStream_t`; NULL is the
/// default stream) and stores the address in `*out` (NULL for zero bytes).
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
    if out.is_null() {
        return fail(&invalid("out", "NULL", "a pointer to store the address in"));
    }
    match allocate(size, device, stream as u64) {
        Ok(ptr) => {
            // SAFETY: `out` is non-null and, by the contract, writable.
            unsafe { *out = ptr as *mut c_void };
            GpumemStatus::GpumemOk
        }
        Err(e) => {
            // SAFETY: as above.
            unsafe { *out = std::ptr::null_mut() };
            fail(&e)
        }
    }
}

/// Frees `ptr` (allocated on `device`) after checking that it was allocated with `size` bytes
/// ([`GPUMEM_ANY_SIZE`] skips the check). NULL is a no-op; an unknown pointer, a wrong size or
/// a wrong device frees nothing and returns an error.
#[no_mangle]
pub extern "C" fn gpumem_free(ptr: *mut c_void, size: usize, device: c_int) -> GpumemStatus {
    let size = (size != GPUMEM_ANY_SIZE).then_some(size as u64);
    status(release(ptr as DevicePtr, size, device))
}

/// This thread's last error message ("" if none): valid until the next gpumem call on this
/// thread fails. Never NULL.
#[no_mangle]
pub extern "C" fn gpumem_last_error() -> *const c_char {
    // The CString lives in a thread-local that is only replaced by a later failure on this
    // thread, so the pointer stays valid as documented.
    state::with_last_error(|text| text.as_ptr())
}

/// Copies `text` into `buffer` (at most `capacity` bytes, NUL-terminated) and returns the
/// bytes the whole text needs with its NUL.
///
/// # Safety
/// `buffer` must be NULL with `capacity == 0`, or writable for `capacity` bytes.
unsafe fn copy_out(text: &str, buffer: *mut c_char, capacity: usize) -> usize {
    let bytes = text.as_bytes();
    if !buffer.is_null() && capacity > 0 {
        let n = bytes.len().min(capacity - 1);
        // SAFETY: `buffer` is writable for `capacity` > n bytes; the source is `n` bytes of
        // `text`; they cannot overlap (`text` is ours).
        unsafe {
            std::ptr::copy_nonoverlapping(bytes.as_ptr(), buffer.cast::<u8>(), n);
            *buffer.add(n) = 0;
        }
    }
    bytes.len() + 1
}

/// A text about `device` into `buffer`, or 0 with the last error set.
///
/// # Safety
/// As [`copy_out`].
unsafe fn text_out(
    device: c_int,
    buffer: *mut c_char,
    capacity: usize,
    text: impl FnOnce(usize, &DevicePool) -> Result<String, CapiError>,
) -> usize {
    match pool_of(device).and_then(|(d, entry)| text(d, &entry)) {
        // SAFETY: forwarded from the caller.
        Ok(t) => unsafe { copy_out(&t, buffer, capacity) },
        Err(e) => {
            fail(&e);
            0
        }
    }
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
    // SAFETY: forwarded from the caller.
    unsafe {
        text_out(device, buffer, capacity, |_, entry| {
            Ok(serde_json::Value::from(
                entry
                    .pool
                    .stats()
                    .to_map()
                    .into_iter()
                    .map(|(k, v)| (k, serde_json::Value::from(v)))
                    .collect::<serde_json::Map<_, _>>(),
            )
            .to_string())
        })
    }
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
    // SAFETY: forwarded from the caller.
    unsafe {
        text_out(device, buffer, capacity, |d, entry| {
            let policy = entry.pool.policy_name();
            entry
                .pool
                .status()
                .map(|s| format!("device {d}, policy {policy}\n{s}"))
                .map_err(|source| CapiError::Pool { device: d, source })
        })
    }
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
    // SAFETY: forwarded from the caller.
    unsafe {
        text_out(device, buffer, capacity, |_, entry| {
            Ok(entry.last_oom().unwrap_or_default())
        })
    }
}

/// Gives `device`'s cached memory back to the device (`torch.cuda.empty_cache`); stores the
/// bytes released in `*released` when it is not NULL.
///
/// # Safety
/// `released` must be NULL or writable.
#[no_mangle]
pub unsafe extern "C" fn gpumem_empty_cache(device: c_int, released: *mut u64) -> GpumemStatus {
    let result = pool_of(device).and_then(|(d, entry)| {
        entry
            .pool
            .empty_cache()
            .map_err(|source| CapiError::Pool { device: d, source })
    });
    match result {
        Ok(bytes) => {
            if !released.is_null() {
                // SAFETY: non-null and, by the contract, writable.
                unsafe { *released = bytes };
            }
            GpumemStatus::GpumemOk
        }
        Err(e) => fail(&e),
    }
}

/// Sets every peak statistic of `device` to its current value
/// (`torch.cuda.reset_peak_memory_stats`).
#[no_mangle]
pub extern "C" fn gpumem_reset_peak_stats(device: c_int) -> GpumemStatus {
    status(pool_of(device).map(|(_, entry)| entry.pool.reset_peak_stats()))
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

/// The limits of a change from C strings: NULL leaves a limit as it is.
///
/// # Safety
/// Each string must be NULL or NUL-terminated.
unsafe fn limits_change(soft: *const c_char, hard: *const c_char) -> Result<Change, CapiError> {
    // SAFETY: forwarded from the caller.
    let (soft, hard) = unsafe {
        (
            optional_str("soft limit", soft)?,
            optional_str("hard limit", hard)?,
        )
    };
    Ok(Change {
        soft_limit: soft.map(|s| state::limit("soft limit", s)).transpose()?,
        hard_limit: hard.map(|h| state::limit("hard limit", h)).transpose()?,
        ..Change::default()
    })
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
    let change = (|| {
        // SAFETY: forwarded from the caller.
        let mut change = unsafe { limits_change(soft_limit, hard_limit)? };
        // SAFETY: forwarded from the caller.
        change.policy = unsafe { optional_str("policy", policy)? }
            .map(state::policy)
            .transpose()?;
        change.history = usize::try_from(history).ok();
        Ok(change)
    })();
    status(change.and_then(|c| state::configure(&c, None)))
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
    // SAFETY: forwarded from the caller.
    let change = unsafe { limits_change(soft_limit, hard_limit) };
    status(change.and_then(|c| {
        let device = state::ordinal(device.into())?;
        state::configure(&c, Some(device))
    }))
}

/// Starts (`capacity` > 0 events) or stops (0) recording `device`'s allocation history for
/// snapshots.
#[no_mangle]
pub extern "C" fn gpumem_set_history(device: c_int, capacity: usize) -> GpumemStatus {
    status(pool_of(device).map(|(_, entry)| entry.pool.set_history_capacity(capacity)))
}

/// Writes `device`'s pool as a PyTorch memory snapshot to `path`: a pickle that
/// <https://pytorch.org/memory_viz> and `pickle.load` open (JSON when the name ends in
/// `.json`), with the recorded history as its trace.
///
/// # Safety
/// `path` must be a NUL-terminated string.
#[no_mangle]
pub unsafe extern "C" fn gpumem_snapshot(device: c_int, path: *const c_char) -> GpumemStatus {
    // SAFETY: forwarded from the caller.
    let path = unsafe { optional_str("path", path) };
    status(path.and_then(|path| {
        let path = path.ok_or_else(|| invalid("path", "NULL", "a file name is needed"))?;
        let (_, entry) = pool_of(device)?;
        entry
            .pool
            .snapshot()
            .write_path(path)
            .map_err(|source| CapiError::Io {
                path: path.to_string(),
                source,
            })
    }))
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
    // SAFETY: forwarded from the caller.
    unsafe {
        text_out(device, buffer, capacity, |_, entry| {
            Ok(entry.pool.policy_name().to_string())
        })
    }
}
