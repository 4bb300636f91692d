//! Loading the driver library: every symbol the crate calls is looked up before the first
//! call, then `cuInit`; the [`Driver`] token proves all of that happened.

use std::ffi::{c_char, CStr};
use std::ptr;
use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::{Arc, OnceLock};

use cudarc::driver::sys;

use super::context::{granularity, DeviceHandle, PrimaryContext};
use super::{check, CUresult, CuResult};

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
