//! The crate's only unsafe code: every call into the CUDA driver (cudarc's raw `driver::sys`
//! bindings, loaded at run time) and the page-locked host memory, behind safe functions.
//!
//! What this module guarantees, so that no safe code elsewhere can break it:
//!
//! - **No call without the library.** cudarc panics when a driver function is called and
//!   `libcuda` cannot be loaded, or lacks the symbol. Every call here goes through a [`Driver`]
//!   token, which exists only once the library was found, every symbol the crate calls was
//!   looked up, and `cuInit` succeeded; or through a [`PrimaryContext`], made from a token.
//! - **The right context.** Every call that needs a context makes the device's primary
//!   context current on the calling thread first and restores the previous one after
//!   ([`PrimaryContext::bind`]).
//! - **No handle after it was destroyed.** Streams, events and physical chunks are owned values
//!   ([`Stream`], [`Event`], [`Physical`]) that destroy their handle exactly once; callers
//!   share them behind `Arc`s, so a handle is destroyed only once nobody is using it. Raw handle
//!   values leave this module only as numbers, and never come back in.
//! - **No host memory under a running copy.** Synchronous copies use the driver's synchronous
//!   calls, which return once the host buffer is no longer read or written. Asynchronous copies
//!   run only from and to page-locked memory allocated here ([`PinnedHost`]); each allocation
//!   has a fence that holds the events recorded behind its copies, and every access to its
//!   bytes, and its release, waits for the fence first.
//!
//! Device addresses are plain integers: the driver validates them, and a bad one is an error
//! code, never a host-memory access.

#![allow(unsafe_code)]

use std::collections::BTreeMap;
use std::ffi::{c_char, c_void, CStr};
use std::marker::PhantomData;
use std::ptr::{self, NonNull};
use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::{Arc, Mutex, MutexGuard, OnceLock};

use cudarc::driver::sys;
use gpumem_device::{HostStorage, PinnedBuffer};

pub(crate) use sys::CUresult;

/// The result of a driver call: the value, or the `CUresult` it failed with.
pub(crate) type CuResult<T> = Result<T, CUresult>;

fn check(result: CUresult) -> CuResult<()> {
    if result == CUresult::CUDA_SUCCESS {
        Ok(())
    } else {
        Err(result)
    }
}

/// Every driver function a [`crate::CudaDevice`] calls, checked before the first call so that
/// an old driver is an error rather than cudarc's panic on a missing symbol.
const CORE_SYMBOLS: &[&str] = &[
    "cuInit",
    "cuDriverGetVersion",
    "cuGetErrorName",
    "cuGetErrorString",
    "cuDeviceGetCount",
    "cuDeviceGet",
    "cuDeviceGetName",
    "cuDeviceTotalMem_v2",
    "cuDeviceGetAttribute",
    "cuDevicePrimaryCtxRetain",
    "cuDevicePrimaryCtxRelease_v2",
    "cuCtxGetCurrent",
    "cuCtxSetCurrent",
    "cuCtxSynchronize",
    "cuMemGetInfo_v2",
    "cuMemAlloc_v2",
    "cuMemFree_v2",
    "cuMemHostAlloc",
    "cuMemFreeHost",
    "cuMemcpyHtoD_v2",
    "cuMemcpyDtoH_v2",
    "cuMemcpyHtoDAsync_v2",
    "cuMemcpyDtoHAsync_v2",
    "cuMemcpyDtoDAsync_v2",
    "cuStreamCreate",
    "cuStreamDestroy_v2",
    "cuStreamSynchronize",
    "cuStreamWaitEvent",
    "cuEventCreate",
    "cuEventRecord",
    "cuEventQuery",
    "cuEventSynchronize",
    "cuEventDestroy_v2",
];

/// The virtual-memory-management functions; a driver without them has no VMM.
pub(crate) const VMM_SYMBOLS: &[&str] = &[
    "cuMemGetAllocationGranularity",
    "cuMemAddressReserve",
    "cuMemAddressFree",
    "cuMemCreate",
    "cuMemRelease",
    "cuMemMap",
    "cuMemSetAccess",
    "cuMemUnmap",
];

/// The managed-memory functions (the location-taking forms, CUDA 12.2 and later); a driver
/// without them has no managed memory.
pub(crate) const MANAGED_SYMBOLS: &[&str] = &[
    "cuMemAllocManaged",
    "cuMemPrefetchAsync_v2",
    "cuMemAdvise_v2",
];

/// The host, or device `dev`, as a managed-memory location.
fn managed_location(dev: DeviceHandle, host: bool) -> sys::CUmemLocation {
    if host {
        sys::CUmemLocation {
            type_: sys::CUmemLocationType::CU_MEM_LOCATION_TYPE_HOST,
            id: 0,
        }
    } else {
        device_location(dev)
    }
}

/// Why the driver cannot be used.
#[derive(Clone, Debug, PartialEq, Eq)]
pub(crate) enum LoadError {
    /// No library of these names could be loaded.
    NoLibrary {
        /// The file names tried, in order.
        tried: Vec<String>,
    },
    /// The library lacks a function the crate calls.
    MissingSymbol(&'static str),
    /// `cuInit` failed (no device, a stub library, a driver/kernel-module mismatch …).
    Init(CUresult),
}

/// Proof that the driver library is loaded, has every symbol the crate calls, and is
/// initialised. Zero-sized; only [`Driver::get`] makes one.
#[derive(Clone, Copy, Debug)]
pub(crate) struct Driver {
    _private: (),
}

static DRIVER: OnceLock<Result<Driver, LoadError>> = OnceLock::new();

/// Set once the library is loaded with all its symbols (even if `cuInit` then failed), so
/// that error codes can be described by the driver itself.
static SYMBOLS_FOUND: AtomicBool = AtomicBool::new(false);

impl Driver {
    /// Loads and initialises the driver on first use; later calls return the same outcome.
    pub(crate) fn get() -> Result<Driver, LoadError> {
        DRIVER.get_or_init(load).clone()
    }

    /// The library file names tried, in order.
    pub(crate) fn candidates() -> Vec<String> {
        cudarc::get_lib_name_candidates("cuda")
    }

    /// The driver's CUDA version, e.g. 12040 for 12.4.
    pub(crate) fn version(self) -> CuResult<i32> {
        let mut version = 0;
        // SAFETY: the driver is loaded (self); the out-pointer is a live local.
        check(unsafe { sys::cuDriverGetVersion(&mut version) })?;
        Ok(version)
    }

    /// How many CUDA devices the driver sees.
    pub(crate) fn device_count(self) -> CuResult<usize> {
        let mut count = 0;
        // SAFETY: the driver is initialised (self); the out-pointer is a live local.
        check(unsafe { sys::cuDeviceGetCount(&mut count) })?;
        Ok(usize::try_from(count).unwrap_or(0))
    }

    /// The device with this ordinal.
    pub(crate) fn device(self, ordinal: usize) -> CuResult<DeviceHandle> {
        let ordinal = i32::try_from(ordinal).map_err(|_| CUresult::CUDA_ERROR_INVALID_DEVICE)?;
        let mut dev = 0;
        // SAFETY: the driver is initialised; the out-pointer is a live local; a bad ordinal
        // is an error code.
        check(unsafe { sys::cuDeviceGet(&mut dev, ordinal) })?;
        Ok(DeviceHandle(dev))
    }

    /// The device's name, e.g. "NVIDIA H100 80GB HBM3".
    pub(crate) fn device_name(self, dev: DeviceHandle) -> CuResult<String> {
        let mut buf = [0 as c_char; 256];
        // SAFETY: the driver writes at most `len` bytes, NUL included, into the live buffer.
        check(unsafe { sys::cuDeviceGetName(buf.as_mut_ptr(), buf.len() as i32, dev.0) })?;
        let bytes = buf.map(|c| c as u8);
        Ok(CStr::from_bytes_until_nul(&bytes)
            .map(|name| name.to_string_lossy().into_owned())
            .unwrap_or_default())
    }

    /// The device's memory in bytes.
    pub(crate) fn total_memory(self, dev: DeviceHandle) -> CuResult<u64> {
        let mut bytes = 0usize;
        // SAFETY: the driver is initialised; the out-pointer is a live local.
        check(unsafe { sys::cuDeviceTotalMem_v2(&mut bytes, dev.0) })?;
        Ok(bytes as u64)
    }

    /// A device attribute.
    pub(crate) fn attribute(
        self,
        dev: DeviceHandle,
        attr: sys::CUdevice_attribute,
    ) -> CuResult<i32> {
        let mut value = 0;
        // SAFETY: the driver is initialised; the out-pointer is a live local.
        check(unsafe { sys::cuDeviceGetAttribute(&mut value, attr, dev.0) })?;
        Ok(value)
    }

    /// Whether the library exports every one of `names`.
    pub(crate) fn has_symbols(self, names: &[&str]) -> bool {
        names.iter().all(|name| has_symbol(name))
    }

    /// The VMM granularity (`CU_MEM_ALLOC_GRANULARITY_MINIMUM`) of pinned device memory on
    /// `dev`, asked without a current context. Needs [`VMM_SYMBOLS`].
    pub(crate) fn granularity(self, dev: DeviceHandle) -> CuResult<u64> {
        granularity(dev)
    }

    /// Retains the device's primary context (`cuDevicePrimaryCtxRetain`): the context the
    /// CUDA runtime, and so PyTorch, uses on this device.
    pub(crate) fn retain_primary(self, dev: DeviceHandle) -> CuResult<Arc<PrimaryContext>> {
        let mut raw = ptr::null_mut();
        // SAFETY: the driver is initialised; the out-pointer is a live local. The retain is
        // balanced by the release in `PrimaryContext::drop`.
        check(unsafe { sys::cuDevicePrimaryCtxRetain(&mut raw, dev.0) })?;
        Ok(Arc::new(PrimaryContext { raw, dev }))
    }
}

fn load() -> Result<Driver, LoadError> {
    // SAFETY: this only tries to open the library (dlopen), which runs its initialisers: those
    // of the NVIDIA driver library, as in every CUDA program.
    if !unsafe { sys::is_culib_present() } {
        return Err(LoadError::NoLibrary {
            tried: Driver::candidates(),
        });
    }
    for name in CORE_SYMBOLS {
        if !has_symbol(name) {
            return Err(LoadError::MissingSymbol(name));
        }
    }
    SYMBOLS_FOUND.store(true, Ordering::Release);
    // SAFETY: every symbol is present (checked above), so cudarc loads rather than panics;
    // cuInit takes flags, which must be 0, and may be called any number of times.
    check(unsafe { sys::cuInit(0) }).map_err(LoadError::Init)?;
    Ok(Driver { _private: () })
}

/// Whether the driver library exports `name`. Call only once the library is known present.
fn has_symbol(name: &str) -> bool {
    // SAFETY: `load` checked that the library can be loaded, so `culib` loads it rather than
    // panicking; looking a symbol up does not call it.
    unsafe {
        sys::culib()
            .get::<unsafe extern "C" fn()>(name.as_bytes())
            .is_ok()
    }
}

/// The code's name and the driver's description of it (`cuGetErrorName`,
/// `cuGetErrorString`). Without a loaded driver: the name from the bindings and no message.
pub(crate) fn describe(code: CUresult) -> (String, Option<String>) {
    let fallback = format!("{code:?}");
    if !SYMBOLS_FOUND.load(Ordering::Acquire) {
        return (fallback, None);
    }
    let text = |f: unsafe fn(CUresult, *mut *const c_char) -> CUresult| {
        let mut s: *const c_char = ptr::null();
        // SAFETY: the symbols are present (SYMBOLS_FOUND); on success the driver points `s` at
        // a static NUL-terminated string, which is copied at once.
        unsafe {
            if f(code, &mut s) == CUresult::CUDA_SUCCESS && !s.is_null() {
                Some(CStr::from_ptr(s).to_string_lossy().into_owned())
            } else {
                None
            }
        }
    };
    let name = text(sys::cuGetErrorName).unwrap_or(fallback);
    (name, text(sys::cuGetErrorString))
}

/// A device (`CUdevice`), as the driver numbers it.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub(crate) struct DeviceHandle(sys::CUdevice);

/// Where VMM chunks live and who may access them: device memory on `dev`.
fn device_location(dev: DeviceHandle) -> sys::CUmemLocation {
    sys::CUmemLocation {
        type_: sys::CUmemLocationType::CU_MEM_LOCATION_TYPE_DEVICE,
        id: dev.0,
    }
}

/// The properties of a VMM chunk: pinned device memory on `dev`, no exportable handle, no
/// compression (what PyTorch's expandable segments create).
fn chunk_properties(dev: DeviceHandle) -> sys::CUmemAllocationProp {
    sys::CUmemAllocationProp {
        type_: sys::CUmemAllocationType::CU_MEM_ALLOCATION_TYPE_PINNED,
        requestedHandleTypes: sys::CUmemAllocationHandleType::CU_MEM_HANDLE_TYPE_NONE,
        location: device_location(dev),
        win32HandleMetaData: ptr::null_mut(),
        allocFlags: sys::CUmemAllocationProp_st__bindgen_ty_1 {
            compressionType: 0,
            gpuDirectRDMACapable: 0,
            usage: 0,
            reserved: [0; 4],
        },
    }
}

fn granularity(dev: DeviceHandle) -> CuResult<u64> {
    let prop = chunk_properties(dev);
    let mut granularity = 0usize;
    // SAFETY: called only with a `Driver` or a `PrimaryContext`, after `VMM_SYMBOLS` were
    // found; the property struct and out-pointer are live locals.
    check(unsafe {
        sys::cuMemGetAllocationGranularity(
            &mut granularity,
            &prop,
            sys::CUmemAllocationGranularity_flags::CU_MEM_ALLOC_GRANULARITY_MINIMUM,
        )
    })?;
    Ok(granularity as u64)
}

/// A retained primary context. Released on drop; every call through it runs with it current.
#[derive(Debug)]
pub(crate) struct PrimaryContext {
    raw: sys::CUcontext,
    dev: DeviceHandle,
}

// SAFETY: a CUcontext is a handle that any thread may make current and use; the driver
// synchronises its own state. This type never dereferences it.
unsafe impl Send for PrimaryContext {}
// SAFETY: as for Send; `&PrimaryContext` only passes the handle to the driver.
unsafe impl Sync for PrimaryContext {}

impl Drop for PrimaryContext {
    fn drop(&mut self) {
        // SAFETY: balances the retain in `Driver::retain_primary`; nothing holds this
        // `PrimaryContext` any more (streams, events, chunks and pinned buffers hold an `Arc`
        // of it, so they are gone).
        let _ = unsafe { sys::cuDevicePrimaryCtxRelease_v2(self.dev.0) };
    }
}

/// The context made current on this thread until it is dropped, which restores the previous
/// one (so that a caller's own CUDA code, PyTorch's for instance, finds its device unchanged).
pub(crate) struct Bound<'a> {
    previous: sys::CUcontext,
    changed: bool,
    _context: PhantomData<&'a PrimaryContext>,
    /// A current context is a property of the thread: the guard must not move to another one.
    _not_send: PhantomData<*const ()>,
}

impl Drop for Bound<'_> {
    fn drop(&mut self) {
        if self.changed {
            // SAFETY: `previous` was current on this thread when the guard was made, so it is a
            // live context (or null, which unbinds).
            let _ = unsafe { sys::cuCtxSetCurrent(self.previous) };
        }
    }
}

impl PrimaryContext {
    /// Makes the context current on this thread, until the guard is dropped.
    pub(crate) fn bind(&self) -> CuResult<Bound<'_>> {
        let mut previous = ptr::null_mut();
        // SAFETY: the driver is initialised (a PrimaryContext exists); the out-pointer is a
        // live local.
        check(unsafe { sys::cuCtxGetCurrent(&mut previous) })?;
        let changed = previous != self.raw;
        if changed {
            // SAFETY: `self.raw` is retained for as long as `self` lives.
            check(unsafe { sys::cuCtxSetCurrent(self.raw) })?;
        }
        Ok(Bound {
            previous,
            changed,
            _context: PhantomData,
            _not_send: PhantomData,
        })
    }

    /// Free and total device memory (`cuMemGetInfo`).
    pub(crate) fn mem_info(&self) -> CuResult<(u64, u64)> {
        let _bound = self.bind()?;
        let (mut free, mut total) = (0usize, 0usize);
        // SAFETY: context current; out-pointers are live locals.
        check(unsafe { sys::cuMemGetInfo_v2(&mut free, &mut total) })?;
        Ok((free as u64, total as u64))
    }

    /// `cuMemAlloc`.
    pub(crate) fn malloc(&self, size: u64) -> CuResult<u64> {
        let _bound = self.bind()?;
        let mut ptr = 0;
        // SAFETY: context current; the out-pointer is a live local.
        check(unsafe { sys::cuMemAlloc_v2(&mut ptr, size as usize) })?;
        Ok(ptr)
    }

    /// `cuMemFree`.
    pub(crate) fn free(&self, ptr: u64) -> CuResult<()> {
        let _bound = self.bind()?;
        // SAFETY: context current. cuMemFree releases device memory only: an address that is
        // not a live cuMemAlloc allocation (page-locked host memory included) is an error code.
        check(unsafe { sys::cuMemFree_v2(ptr) })
    }

    /// `cuMemAllocManaged`, attached globally (any stream may use it). Call only after
    /// [`MANAGED_SYMBOLS`] were found.
    pub(crate) fn alloc_managed(&self, size: u64) -> CuResult<u64> {
        let _bound = self.bind()?;
        let mut ptr = 0;
        let flags = sys::CUmemAttach_flags_enum::CU_MEM_ATTACH_GLOBAL as u32;
        // SAFETY: context current; the out-pointer is a live local. The memory is reached
        // only through the driver's copy calls (as device memory), never dereferenced here.
        check(unsafe { sys::cuMemAllocManaged(&mut ptr, size as usize, flags) })?;
        Ok(ptr)
    }

    /// `cuMemPrefetchAsync` of managed memory to this device (or the host) on `stream`.
    /// Call only after [`MANAGED_SYMBOLS`] were found.
    pub(crate) fn prefetch_managed(
        &self,
        ptr: u64,
        len: u64,
        to_host: bool,
        stream: &Stream,
    ) -> CuResult<()> {
        let _bound = self.bind()?;
        let to = managed_location(self.dev, to_host);
        // SAFETY: context current; `stream` is live. The driver validates the range; a
        // migration moves pages but no host memory is read or written through Rust.
        check(unsafe { sys::cuMemPrefetchAsync_v2(ptr, len as usize, to, 0, stream.raw) })
    }

    /// `cuMemAdvise` about managed memory, for this device (or the host). Call only after
    /// [`MANAGED_SYMBOLS`] were found.
    pub(crate) fn advise_managed(
        &self,
        ptr: u64,
        len: u64,
        advice: sys::CUmem_advise_enum,
        for_host: bool,
    ) -> CuResult<()> {
        let _bound = self.bind()?;
        let location = managed_location(self.dev, for_host);
        // SAFETY: context current; advice only changes placement, the driver validates the
        // range.
        check(unsafe { sys::cuMemAdvise_v2(ptr, len as usize, advice, location) })
    }

    /// Blocks until all work in the context has finished (`cuCtxSynchronize`).
    pub(crate) fn synchronize(&self) -> CuResult<()> {
        let _bound = self.bind()?;
        // SAFETY: context current.
        check(unsafe { sys::cuCtxSynchronize() })
    }

    /// The legacy default stream (the null `CUstream`).
    pub(crate) fn legacy_stream(self: &Arc<Self>) -> Stream {
        Stream {
            raw: ptr::null_mut(),
            ctx: Arc::clone(self),
            owned: false,
        }
    }

    /// A stream someone else created in this context (PyTorch's `cudaStream_t`), used but
    /// never destroyed: its creator owns it and must keep it alive while this device uses it.
    pub(crate) fn foreign_stream(self: &Arc<Self>, raw: u64) -> Stream {
        Stream {
            raw: raw as sys::CUstream,
            ctx: Arc::clone(self),
            owned: false,
        }
    }

    /// A new stream that does not synchronise with the legacy default stream
    /// (`CU_STREAM_NON_BLOCKING`, as PyTorch's side streams).
    pub(crate) fn create_stream(self: &Arc<Self>) -> CuResult<Stream> {
        let _bound = self.bind()?;
        let mut raw = ptr::null_mut();
        // SAFETY: context current; the out-pointer is a live local.
        check(unsafe {
            sys::cuStreamCreate(&mut raw, sys::CUstream_flags::CU_STREAM_NON_BLOCKING as u32)
        })?;
        Ok(Stream {
            raw,
            ctx: Arc::clone(self),
            owned: true,
        })
    }

    /// A new event without timing (`CU_EVENT_DISABLE_TIMING`, as PyTorch's allocator uses),
    /// not yet recorded.
    pub(crate) fn create_event(self: &Arc<Self>) -> CuResult<Event> {
        let _bound = self.bind()?;
        let mut raw = ptr::null_mut();
        // SAFETY: context current; the out-pointer is a live local.
        check(unsafe {
            sys::cuEventCreate(&mut raw, sys::CUevent_flags::CU_EVENT_DISABLE_TIMING as u32)
        })?;
        Ok(Event {
            raw,
            done: AtomicBool::new(false),
            ctx: Arc::clone(self),
        })
    }

    /// Copies `src` to device memory at `dst` after the work queued on `after`, and returns once
    /// the bytes have arrived. Synchronous driver calls: the host slice is not read after this
    /// returns, whether it is page-locked or not (the driver stages pageable memory itself).
    pub(crate) fn copy_to_device(&self, dst: u64, src: &[u8], after: &Stream) -> CuResult<()> {
        let _bound = self.bind()?;
        // SAFETY: context current; `after` is a live stream (or null, the legacy stream).
        check(unsafe { sys::cuStreamSynchronize(after.raw) })?;
        // SAFETY: `src` is a live slice for the whole call, and cuMemcpyHtoD returns only once
        // it no longer reads it (pinned: the copy is done; pageable: the bytes are staged).
        check(unsafe { sys::cuMemcpyHtoD_v2(dst, src.as_ptr().cast::<c_void>(), src.len()) })?;
        // SAFETY: context current. Waits for the legacy stream, on which cuMemcpyHtoD ran, so
        // that staged bytes have arrived too.
        check(unsafe { sys::cuStreamSynchronize(ptr::null_mut()) })
    }

    /// Copies device memory at `src` into `dst` after the work queued on `after`, and returns
    /// once the bytes have arrived.
    pub(crate) fn copy_to_host(&self, dst: &mut [u8], src: u64, after: &Stream) -> CuResult<()> {
        let _bound = self.bind()?;
        // SAFETY: context current; `after` is a live stream (or null, the legacy stream).
        check(unsafe { sys::cuStreamSynchronize(after.raw) })?;
        // SAFETY: `dst` is a live, exclusively borrowed slice for the whole call, and
        // cuMemcpyDtoH returns only once the copy has completed, into pageable or pinned memory.
        check(unsafe { sys::cuMemcpyDtoH_v2(dst.as_mut_ptr().cast::<c_void>(), src, dst.len()) })
    }

    /// Enqueues a copy of `len` bytes between device addresses on `stream`.
    pub(crate) fn enqueue_device_copy(
        &self,
        dst: u64,
        src: u64,
        len: u64,
        stream: &Stream,
    ) -> CuResult<()> {
        let _bound = self.bind()?;
        // SAFETY: context current; `stream` is live. Device-to-device: no host memory.
        check(unsafe { sys::cuMemcpyDtoDAsync_v2(dst, src, len as usize, stream.raw) })
    }

    /// Allocates `len` zeroed bytes of page-locked host memory (`cuMemHostAlloc`, portable: any
    /// context may copy from and to it).
    pub(crate) fn alloc_pinned(self: &Arc<Self>, len: usize) -> CuResult<PinnedHost> {
        let fence = Arc::new(Fence::default());
        if len == 0 {
            return Ok(PinnedHost {
                ptr: NonNull::dangling(),
                len: 0,
                fence,
                ctx: None,
            });
        }
        let _bound = self.bind()?;
        let mut raw: *mut c_void = ptr::null_mut();
        // SAFETY: context current; the out-pointer is a live local.
        check(unsafe { sys::cuMemHostAlloc(&mut raw, len, sys::CU_MEMHOSTALLOC_PORTABLE) })?;
        let Some(ptr) = NonNull::new(raw.cast::<u8>()) else {
            return Err(CUresult::CUDA_ERROR_OUT_OF_MEMORY);
        };
        // SAFETY: the driver returned `len` writable bytes at `ptr`, which nothing else uses;
        // zeroing them makes them initialised (the trait promises zeroed bytes).
        unsafe { ptr.as_ptr().write_bytes(0, len) };
        lock(&PINNED).insert(ptr.as_ptr() as usize, (len, Arc::clone(&fence)));
        Ok(PinnedHost {
            ptr,
            len,
            fence,
            ctx: Some(Arc::clone(self)),
        })
    }

    /// Enqueues a copy of `src` to device memory at `dst` on `stream` and records `event`
    /// behind it. `src` must be page-locked memory from [`PrimaryContext::alloc_pinned`]
    /// (any device's); other memory is refused with [`AsyncCopyError::NotPageLocked`], before
    /// anything is enqueued, so the caller can stage it.
    pub(crate) fn enqueue_upload(
        &self,
        dst: u64,
        src: &PinnedBuffer,
        stream: &Stream,
        event: &Arc<Event>,
    ) -> Result<(), AsyncCopyError> {
        // Reading through the storage settles any earlier copy into the buffer.
        let bytes: &[u8] = src;
        let registry = lock(&PINNED);
        let fence = fence_of(&registry, bytes.as_ptr() as usize, bytes.len())
            .ok_or(AsyncCopyError::NotPageLocked)?;
        let _bound = self.bind()?;
        // SAFETY: context current; `stream` is live. `bytes` lies inside a live page-locked
        // allocation of this module: it is in the registry, and an allocation leaves the
        // registry (under the lock held here) before it is freed. The copy engine reads the
        // bytes until `event` completes, and from here on the allocation's fence holds `event`
        // (or is poisoned, see `fence_behind`): every access to the bytes and the release of the
        // allocation wait for it first.
        check(unsafe {
            sys::cuMemcpyHtoDAsync_v2(
                dst,
                bytes.as_ptr().cast::<c_void>(),
                bytes.len(),
                stream.raw,
            )
        })?;
        fence_behind(&fence, stream, event)
    }

    /// Enqueues a copy of `dst.len()` bytes of device memory at `src` into `dst` on `stream`
    /// and records `event` behind it; as [`PrimaryContext::enqueue_upload`] otherwise.
    pub(crate) fn enqueue_download(
        &self,
        dst: &mut PinnedBuffer,
        src: u64,
        stream: &Stream,
        event: &Arc<Event>,
    ) -> Result<(), AsyncCopyError> {
        let bytes: &mut [u8] = dst;
        let (at, len) = (bytes.as_mut_ptr(), bytes.len());
        let registry = lock(&PINNED);
        let fence = fence_of(&registry, at as usize, len).ok_or(AsyncCopyError::NotPageLocked)?;
        let _bound = self.bind()?;
        // SAFETY: as in `enqueue_upload`; the copy engine writes the bytes until `event`
        // completes, and until then nothing reads or frees them (the fence).
        check(unsafe { sys::cuMemcpyDtoHAsync_v2(at.cast::<c_void>(), src, len, stream.raw) })?;
        fence_behind(&fence, stream, event)
    }

    /// The VMM granularity, asked with the context current.
    pub(crate) fn granularity(&self) -> CuResult<u64> {
        let _bound = self.bind()?;
        granularity(self.dev)
    }

    /// Reserves `size` bytes of device address space aligned to `align`
    /// (`cuMemAddressReserve`).
    pub(crate) fn reserve(&self, size: u64, align: u64) -> CuResult<u64> {
        let _bound = self.bind()?;
        let mut ptr = 0;
        // SAFETY: context current (VMM symbols checked by the caller); out-pointer live.
        check(unsafe { sys::cuMemAddressReserve(&mut ptr, size as usize, align as usize, 0, 0) })?;
        Ok(ptr)
    }

    /// Frees a reservation (`cuMemAddressFree`).
    pub(crate) fn release_reservation(&self, ptr: u64, size: u64) -> CuResult<()> {
        let _bound = self.bind()?;
        // SAFETY: context current; device address space only.
        check(unsafe { sys::cuMemAddressFree(ptr, size as usize) })
    }

    /// Creates a physical chunk of `size` bytes of device memory (`cuMemCreate`).
    pub(crate) fn create_physical(self: &Arc<Self>, size: u64) -> CuResult<Physical> {
        let _bound = self.bind()?;
        let prop = chunk_properties(self.dev);
        let mut handle = 0;
        // SAFETY: context current; the property struct and out-pointer are live locals.
        check(unsafe { sys::cuMemCreate(&mut handle, size as usize, &prop, 0) })?;
        Ok(Physical {
            handle: Some(handle),
            size,
            ctx: Arc::clone(self),
        })
    }

    /// Maps the whole of `chunk` at `ptr` (`cuMemMap`) and makes it readable and writable by
    /// this device (`cuMemSetAccess`); undoes the mapping if access cannot be set.
    pub(crate) fn map(&self, ptr: u64, chunk: &Physical) -> CuResult<()> {
        let Some(handle) = chunk.handle else {
            return Err(CUresult::CUDA_ERROR_INVALID_HANDLE);
        };
        let _bound = self.bind()?;
        let size = chunk.size as usize;
        // SAFETY: context current; `handle` is live (owned by `chunk`, borrowed here). Maps
        // device address space only.
        check(unsafe { sys::cuMemMap(ptr, size, 0, handle, 0) })?;
        let access = sys::CUmemAccessDesc {
            location: device_location(self.dev),
            flags: sys::CUmemAccess_flags::CU_MEM_ACCESS_FLAGS_PROT_READWRITE,
        };
        // SAFETY: context current; one live descriptor.
        if let Err(e) = check(unsafe { sys::cuMemSetAccess(ptr, size, &access, 1) }) {
            // SAFETY: undoes the mapping made just above.
            let _ = unsafe { sys::cuMemUnmap(ptr, size) };
            return Err(e);
        }
        Ok(())
    }

    /// Unmaps `[ptr, ptr + size)` (`cuMemUnmap`).
    pub(crate) fn unmap(&self, ptr: u64, size: u64) -> CuResult<()> {
        let _bound = self.bind()?;
        // SAFETY: context current; device address space only.
        check(unsafe { sys::cuMemUnmap(ptr, size as usize) })
    }
}

/// Why an asynchronous copy was not enqueued.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub(crate) enum AsyncCopyError {
    /// The host buffer is not page-locked memory from this module; nothing was enqueued.
    NotPageLocked,
    /// The driver failed.
    Driver(CUresult),
}

impl From<CUresult> for AsyncCopyError {
    fn from(code: CUresult) -> Self {
        AsyncCopyError::Driver(code)
    }
}

/// After an asynchronous copy was enqueued on `stream`: records `event` behind it and adds the
/// event to the buffer's fence. If the event cannot be recorded, waits for the stream (or the
/// whole context) instead; if even that fails the fence is poisoned, so that the buffer is
/// never read or freed again.
fn fence_behind(fence: &Fence, stream: &Stream, event: &Arc<Event>) -> Result<(), AsyncCopyError> {
    match event.record(stream) {
        Ok(()) => {
            fence.hold(event);
            Ok(())
        }
        Err(e) => {
            if stream.synchronize().is_err() && stream.ctx.synchronize().is_err() {
                fence.poison();
            }
            Err(AsyncCopyError::Driver(e))
        }
    }
}

/// Takes a lock; a poisoned one is taken over (the data behind these locks stays consistent
/// across a panic: each update is a single insert, remove or push).
fn lock<T>(mutex: &Mutex<T>) -> MutexGuard<'_, T> {
    mutex.lock().unwrap_or_else(|p| p.into_inner())
}

/// A stream: the legacy default stream (null) or one from [`PrimaryContext::create_stream`],
/// destroyed on drop.
#[derive(Debug)]
pub(crate) struct Stream {
    raw: sys::CUstream,
    ctx: Arc<PrimaryContext>,
    /// Whether this value created the handle and so destroys it.
    owned: bool,
}

// SAFETY: a CUstream is a handle any thread may use; the driver synchronises enqueueing.
unsafe impl Send for Stream {}
// SAFETY: as for Send.
unsafe impl Sync for Stream {}

impl Stream {
    /// The raw handle as a number: 0 for the legacy default stream.
    pub(crate) fn id(&self) -> u64 {
        self.raw as u64
    }

    /// Blocks until all work queued on the stream has finished.
    pub(crate) fn synchronize(&self) -> CuResult<()> {
        let _bound = self.ctx.bind()?;
        // SAFETY: context current; the stream is live while `self` is.
        check(unsafe { sys::cuStreamSynchronize(self.raw) })
    }

    /// Destroys the stream now, reporting the driver's answer (dropping does the same silently).
    pub(crate) fn destroy(mut self) -> CuResult<()> {
        self.destroy_handle()
    }

    fn destroy_handle(&mut self) -> CuResult<()> {
        let raw = std::mem::replace(&mut self.raw, ptr::null_mut());
        if raw.is_null() || !self.owned {
            return Ok(());
        }
        let _bound = self.ctx.bind()?;
        // SAFETY: `raw` was created by cuStreamCreate and is destroyed once (it was replaced by
        // null above); nobody else holds it (this is the owner, shared only through `Arc`s).
        check(unsafe { sys::cuStreamDestroy_v2(raw) })
    }
}

impl Drop for Stream {
    fn drop(&mut self) {
        let _ = self.destroy_handle();
    }
}

/// An event from [`PrimaryContext::create_event`], destroyed on drop. Remembers once it has
/// been seen complete, so that later checks need no driver call.
#[derive(Debug)]
pub(crate) struct Event {
    raw: sys::CUevent,
    done: AtomicBool,
    ctx: Arc<PrimaryContext>,
}

// SAFETY: a CUevent is a handle any thread may use; the driver synchronises.
unsafe impl Send for Event {}
// SAFETY: as for Send; the completion flag is atomic.
unsafe impl Sync for Event {}

impl Event {
    /// The raw handle as a number.
    pub(crate) fn id(&self) -> u64 {
        self.raw as u64
    }

    /// Records the event after the work queued so far on `stream` (`cuEventRecord`).
    pub(crate) fn record(&self, stream: &Stream) -> CuResult<()> {
        let _bound = self.ctx.bind()?;
        self.done.store(false, Ordering::Release);
        // SAFETY: context current; event and stream are live while `self` and `stream` are.
        check(unsafe { sys::cuEventRecord(self.raw, stream.raw) })
    }

    /// Makes work queued on `stream` from now on wait for this event (`cuStreamWaitEvent`);
    /// the host does not wait.
    pub(crate) fn make_wait(&self, stream: &Stream) -> CuResult<()> {
        let _bound = self.ctx.bind()?;
        // SAFETY: context current; event and stream are live while `self` and `stream` are.
        check(unsafe { sys::cuStreamWaitEvent(stream.raw, self.raw, 0) })
    }

    /// Whether the work before the event has finished (`cuEventQuery`).
    pub(crate) fn query(&self) -> CuResult<bool> {
        if self.done.load(Ordering::Acquire) {
            return Ok(true);
        }
        let _bound = self.ctx.bind()?;
        // SAFETY: context current; the event is live while `self` is.
        match unsafe { sys::cuEventQuery(self.raw) } {
            CUresult::CUDA_SUCCESS => {
                self.done.store(true, Ordering::Release);
                Ok(true)
            }
            CUresult::CUDA_ERROR_NOT_READY => Ok(false),
            e => Err(e),
        }
    }

    /// Blocks until the work before the event has finished (`cuEventSynchronize`).
    pub(crate) fn synchronize(&self) -> CuResult<()> {
        if self.done.load(Ordering::Acquire) {
            return Ok(());
        }
        let _bound = self.ctx.bind()?;
        // SAFETY: context current; the event is live while `self` is.
        check(unsafe { sys::cuEventSynchronize(self.raw) })?;
        self.done.store(true, Ordering::Release);
        Ok(())
    }

    /// Destroys the event now, reporting the driver's answer (dropping does the same silently).
    pub(crate) fn destroy(mut self) -> CuResult<()> {
        self.destroy_handle()
    }

    fn destroy_handle(&mut self) -> CuResult<()> {
        if self.raw.is_null() {
            return Ok(());
        }
        let raw = std::mem::replace(&mut self.raw, ptr::null_mut());
        let _bound = self.ctx.bind()?;
        // SAFETY: `raw` was created by cuEventCreate and is destroyed once; nobody else holds
        // it (fences and tables hold this owner through `Arc`s, and it is being dropped).
        check(unsafe { sys::cuEventDestroy_v2(raw) })
    }
}

impl Drop for Event {
    fn drop(&mut self) {
        let _ = self.destroy_handle();
    }
}

/// A physical VMM chunk from [`PrimaryContext::create_physical`]; released on drop.
#[derive(Debug)]
pub(crate) struct Physical {
    handle: Option<sys::CUmemGenericAllocationHandle>,
    size: u64,
    ctx: Arc<PrimaryContext>,
}

impl Physical {
    /// The raw handle as a number.
    pub(crate) fn id(&self) -> u64 {
        self.handle.unwrap_or(0)
    }

    /// The chunk's size in bytes.
    pub(crate) fn size(&self) -> u64 {
        self.size
    }

    /// Releases the handle now (`cuMemRelease`), reporting the driver's answer. The memory
    /// goes back once no mapping of it is left.
    pub(crate) fn release(mut self) -> CuResult<()> {
        self.release_handle()
    }

    fn release_handle(&mut self) -> CuResult<()> {
        let Some(handle) = self.handle.take() else {
            return Ok(());
        };
        let _bound = self.ctx.bind()?;
        // SAFETY: `handle` came from cuMemCreate and is released once (taken above).
        check(unsafe { sys::cuMemRelease(handle) })
    }
}

impl Drop for Physical {
    fn drop(&mut self) {
        let _ = self.release_handle();
    }
}

/// The live page-locked allocations of this module, by start address: length and fence. An
/// allocation leaves it before it is freed.
static PINNED: Mutex<BTreeMap<usize, (usize, Arc<Fence>)>> = Mutex::new(BTreeMap::new());

/// The fence of the allocation that contains `[at, at + len)`, if one does.
fn fence_of(
    registry: &BTreeMap<usize, (usize, Arc<Fence>)>,
    at: usize,
    len: usize,
) -> Option<Arc<Fence>> {
    let (&start, (size, fence)) = registry.range(..=at).next_back()?;
    (at.checked_add(len)? <= start + size).then(|| Arc::clone(fence))
}

/// The copies that may still use an allocation: the events recorded behind them.
#[derive(Debug, Default)]
struct Fence {
    /// Whether `state` may hold anything: lets every access to the bytes (each `buf[i]` is
    /// one) skip the lock once the fence is clear. Set under the lock, after the state changed.
    busy: AtomicBool,
    state: Mutex<FenceState>,
}

#[derive(Debug, Default)]
struct FenceState {
    pending: Vec<Arc<Event>>,
    /// A copy was enqueued and its completion could not be established.
    poisoned: bool,
}

impl Fence {
    /// Waits until no copy uses the allocation any more. Fails if that cannot be established.
    fn settle(&self) -> Result<(), String> {
        if !self.busy.load(Ordering::Acquire) {
            return Ok(());
        }
        let mut state = lock(&self.state);
        if state.poisoned {
            return Err("an asynchronous copy's completion could not be established".into());
        }
        for event in &state.pending {
            event
                .synchronize()
                .map_err(|e| format!("waiting for an asynchronous copy failed: {e:?}"))?;
        }
        state.pending.clear();
        self.busy.store(false, Ordering::Release);
        Ok(())
    }

    /// Adds the event behind a copy that uses the allocation.
    fn hold(&self, event: &Arc<Event>) {
        let mut state = lock(&self.state);
        state.pending.push(Arc::clone(event));
        self.busy.store(true, Ordering::Release);
    }

    /// A copy uses the allocation and its end cannot be known: never touch it again.
    fn poison(&self) {
        let mut state = lock(&self.state);
        state.poisoned = true;
        self.busy.store(true, Ordering::Release);
    }
}

/// Page-locked host memory from `cuMemHostAlloc`, freed with `cuMemFreeHost` on drop. It holds
/// its context, so the memory outlives the device that allocated it.
pub(crate) struct PinnedHost {
    ptr: NonNull<u8>,
    len: usize,
    fence: Arc<Fence>,
    /// `None` for the empty buffer, which owns no memory.
    ctx: Option<Arc<PrimaryContext>>,
}

// SAFETY: owns its bytes exclusively, like a `Box<[u8]>`; the fence is thread-safe.
unsafe impl Send for PinnedHost {}
// SAFETY: `&PinnedHost` gives only shared access to the bytes (after the fence), like `&[u8]`.
unsafe impl Sync for PinnedHost {}

impl PinnedHost {
    /// Waits for copies that may still use the bytes. If their completion cannot be
    /// established, the bytes must not be touched, and this accessor cannot return an error.
    fn settled(&self) {
        if let Err(why) = self.fence.settle() {
            panic!("page-locked buffer used while the device may still copy into it: {why}");
        }
    }
}

impl HostStorage for PinnedHost {
    fn bytes(&self) -> &[u8] {
        self.settled();
        // SAFETY: `ptr` points at `len` initialised bytes (zeroed at allocation) owned by
        // `self` until drop; no copy uses them any more (settled), and new copies need a shared
        // borrow of them, which this one's lifetime keeps from becoming exclusive.
        unsafe { std::slice::from_raw_parts(self.ptr.as_ptr(), self.len) }
    }

    fn bytes_mut(&mut self) -> &mut [u8] {
        self.settled();
        // SAFETY: as in `bytes`, and `&mut self` makes the borrow exclusive.
        unsafe { std::slice::from_raw_parts_mut(self.ptr.as_ptr(), self.len) }
    }

    fn is_page_locked(&self) -> bool {
        true
    }
}

impl Drop for PinnedHost {
    fn drop(&mut self) {
        let Some(ctx) = &self.ctx else {
            return;
        };
        lock(&PINNED).remove(&(self.ptr.as_ptr() as usize));
        if self.fence.settle().is_err() {
            // A copy may still use the memory: leaking it is safe, freeing it is not.
            return;
        }
        if let Ok(_bound) = ctx.bind() {
            // SAFETY: `ptr` came from cuMemHostAlloc and is freed once; it left the registry
            // above, so no new copy can start on it, and the fence says no copy uses it.
            let _ = unsafe { sys::cuMemFreeHost(self.ptr.as_ptr().cast::<c_void>()) };
        }
    }
}
