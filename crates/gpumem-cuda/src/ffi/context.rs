//! The device's primary context: made current on the calling thread around every call
//! ([`PrimaryContext::bind`]), and the calls that need no handle of their own (memory,
//! synchronous copies, managed memory, VMM address space and mappings).

use std::ffi::c_void;
use std::marker::PhantomData;
use std::ptr;

use cudarc::driver::sys;

use super::handles::{Physical, Stream};
use super::{check, CUresult, CuResult};

/// A device (`CUdevice`), as the driver numbers it.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub(crate) struct DeviceHandle(pub(super) sys::CUdevice);

/// Where VMM chunks live and who may access them: device memory on `dev`.
fn device_location(dev: DeviceHandle) -> sys::CUmemLocation {
    sys::CUmemLocation {
        type_: sys::CUmemLocationType::CU_MEM_LOCATION_TYPE_DEVICE,
        id: dev.0,
    }
}

/// The properties of a VMM chunk: pinned device memory on `dev`, no exportable handle, no
/// compression (what PyTorch's expandable segments create).
pub(super) fn chunk_properties(dev: DeviceHandle) -> sys::CUmemAllocationProp {
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

pub(super) fn granularity(dev: DeviceHandle) -> CuResult<u64> {
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

/// A retained primary context. Released on drop; every call through it runs with it current.
#[derive(Debug)]
pub(crate) struct PrimaryContext {
    pub(super) raw: sys::CUcontext,
    pub(super) dev: DeviceHandle,
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
    /// [`MANAGED_SYMBOLS`](super::MANAGED_SYMBOLS) were found.
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
    /// Call only after [`MANAGED_SYMBOLS`](super::MANAGED_SYMBOLS) were found.
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
    /// [`MANAGED_SYMBOLS`](super::MANAGED_SYMBOLS) were found.
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
