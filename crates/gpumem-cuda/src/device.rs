//! [`CudaDevice`]: one CUDA device through its primary context, as a [`Device`] and a
//! [`VirtualMemory`]; [`DeviceInfo`]: what a device is and can do.

use std::collections::{BTreeMap, HashMap};
use std::fmt;
use std::sync::{Arc, Mutex, MutexGuard};

use cudarc::driver::sys::CUdevice_attribute as Attr;
use gpumem_device::vmm_ledger::{check_granularity_multiple, VmmLedger};
use gpumem_device::{
    Device, DeviceError, DevicePtr, EventId, InFlight, ManagedAdvice, MemInfo, MemoryLocation,
    PhysicalHandle, PinnedBuffer, StreamId, VirtualMemory,
};

use crate::error::{cuda_error, driver};
use crate::ffi::{
    AsyncCopyError, CUresult, DeviceHandle, Driver, Event, Physical, PrimaryContext, Stream,
    MANAGED_SYMBOLS, VMM_SYMBOLS,
};

/// 2 MiB: what [`VirtualMemory::granularity`] reports on a device without VMM (the trait
/// has no error for it; [`CudaDevice::vmm`](Device::vmm) is `None` there).
const FALLBACK_GRANULARITY: u64 = 2 << 20;

/// What a CUDA device is and can do, for listings (a `gpumem devices` command) and for
/// choosing a policy.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct DeviceInfo {
    /// The device ordinal, as `CUDA_VISIBLE_DEVICES` renumbers them (`cuda:N`).
    pub ordinal: usize,
    /// The driver's name for it, e.g. "NVIDIA H100 80GB HBM3".
    pub name: String,
    /// Device memory in bytes (`cuDeviceTotalMem`).
    pub total_memory: u64,
    /// Compute capability, (major, minor): (9, 0) for Hopper.
    pub compute_capability: (u32, u32),
    /// The VMM granularity in bytes when the device and driver support virtual memory
    /// management (`CU_DEVICE_ATTRIBUTE_VIRTUAL_MEMORY_MANAGEMENT_SUPPORTED`, the VMM
    /// functions exported, `cuMemGetAllocationGranularity` answered); `None` otherwise.
    pub vmm_granularity: Option<u64>,
    /// Whether the device supports managed (unified) memory, `cuMemAllocManaged`
    /// (`CU_DEVICE_ATTRIBUTE_MANAGED_MEMORY`, and the driver exports the managed-memory
    /// functions).
    pub managed_memory: bool,
    /// Whether host and device share one address space (`CU_DEVICE_ATTRIBUTE_UNIFIED_ADDRESSING`).
    pub unified_addressing: bool,
    /// The driver's CUDA version, (major, minor), e.g. (12, 4).
    pub driver_version: (u32, u32),
}

impl DeviceInfo {
    /// Asks the driver about the device with this ordinal, without creating its context
    /// where the driver allows (the VMM granularity may need one: then the primary context is
    /// retained for the question and released).
    pub fn query(ordinal: usize) -> Result<DeviceInfo, DeviceError> {
        let drv = driver()?;
        let dev = device_handle(drv, ordinal)?;
        query_info(drv, ordinal, dev, None)
    }

    /// Whether the device supports virtual memory management.
    pub fn vmm_supported(&self) -> bool {
        self.vmm_granularity.is_some()
    }
}

impl fmt::Display for DeviceInfo {
    /// One line: `cuda:0  NVIDIA H100 80GB HBM3  79.19 GiB  sm_90  VMM 2 MiB  managed  driver 12.4`.
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        let (major, minor) = self.compute_capability;
        write!(
            f,
            "cuda:{}  {}  {:.2} GiB  sm_{major}{minor}  ",
            self.ordinal,
            self.name,
            self.total_memory as f64 / (1u64 << 30) as f64
        )?;
        match self.vmm_granularity {
            Some(g) if g % (1 << 20) == 0 => write!(f, "VMM {} MiB", g >> 20)?,
            Some(g) => write!(f, "VMM {g} B")?,
            None => f.write_str("no VMM")?,
        }
        if self.managed_memory {
            f.write_str("  managed")?;
        }
        write!(
            f,
            "  driver {}.{}",
            self.driver_version.0, self.driver_version.1
        )
    }
}

/// Every CUDA device the driver sees, in ordinal order.
pub fn devices() -> Result<Vec<DeviceInfo>, DeviceError> {
    (0..CudaDevice::count()?).map(DeviceInfo::query).collect()
}

/// The driver's CUDA version, (major, minor): the quickest check that a usable driver is
/// installed. Errors as [`CudaDevice::open`] does.
pub fn driver_version() -> Result<(u32, u32), DeviceError> {
    let drv = driver()?;
    let v = drv.version().map_err(cuda_error)?;
    Ok(split_version(v))
}

fn split_version(v: i32) -> (u32, u32) {
    let v = v.max(0) as u32;
    (v / 1000, (v % 1000) / 10)
}

fn device_handle(drv: Driver, ordinal: usize) -> Result<DeviceHandle, DeviceError> {
    let count = drv.device_count().map_err(cuda_error)?;
    if ordinal >= count {
        return Err(DeviceError::InvalidValue(format!(
            "no CUDA device {ordinal}: the driver sees {count}"
        )));
    }
    drv.device(ordinal).map_err(cuda_error)
}

fn query_info(
    drv: Driver,
    ordinal: usize,
    dev: DeviceHandle,
    ctx: Option<&Arc<PrimaryContext>>,
) -> Result<DeviceInfo, DeviceError> {
    let attr = |a: Attr| drv.attribute(dev, a).map_err(cuda_error);
    let capability = (
        attr(Attr::CU_DEVICE_ATTRIBUTE_COMPUTE_CAPABILITY_MAJOR)?.max(0) as u32,
        attr(Attr::CU_DEVICE_ATTRIBUTE_COMPUTE_CAPABILITY_MINOR)?.max(0) as u32,
    );
    let vmm_attribute = attr(Attr::CU_DEVICE_ATTRIBUTE_VIRTUAL_MEMORY_MANAGEMENT_SUPPORTED)? != 0;
    let vmm_granularity = if vmm_attribute && drv.has_symbols(VMM_SYMBOLS) {
        vmm_granularity(drv, dev, ctx)
    } else {
        None
    };
    Ok(DeviceInfo {
        ordinal,
        name: drv.device_name(dev).map_err(cuda_error)?,
        total_memory: drv.total_memory(dev).map_err(cuda_error)?,
        compute_capability: capability,
        vmm_granularity,
        managed_memory: attr(Attr::CU_DEVICE_ATTRIBUTE_MANAGED_MEMORY)? != 0
            && drv.has_symbols(MANAGED_SYMBOLS),
        unified_addressing: attr(Attr::CU_DEVICE_ATTRIBUTE_UNIFIED_ADDRESSING)? != 0,
        driver_version: split_version(drv.version().map_err(cuda_error)?),
    })
}

/// The granularity, asked without a context first; with the primary context if the driver
/// wants one. `None` if the driver cannot say (then VMM is reported missing).
fn vmm_granularity(
    drv: Driver,
    dev: DeviceHandle,
    ctx: Option<&Arc<PrimaryContext>>,
) -> Option<u64> {
    let answer = match drv.granularity(dev) {
        Err(CUresult::CUDA_ERROR_INVALID_CONTEXT) => match ctx {
            Some(ctx) => ctx.granularity(),
            None => drv.retain_primary(dev).and_then(|ctx| ctx.granularity()),
        },
        other => other,
    };
    answer.ok().filter(|g| *g > 0 && g.is_power_of_two())
}

/// One CUDA device, reached through its primary context (the one the CUDA runtime and PyTorch
/// use), made current on the calling thread for every call and the caller's context restored
/// after. Thread-safe: share it as `Arc<dyn Device>`.
///
/// - **Memory**: `cuMemAlloc`/`cuMemFree`, `cuMemGetInfo`. The device keeps the sizes of its
///   allocations and mappings, so that it frees, unmaps and copies only memory it handed out
///   (other addresses are [`DeviceError::InvalidAddress`]).
/// - **Streams**: [`StreamId::DEFAULT`] is the legacy default stream (the null `CUstream`);
///   [`Device::create_stream`] makes a non-blocking stream whose id is its raw `CUstream`
///   value, as PyTorch snapshots record `cudaStream_t`. Events ([`EventId`]) are raw `CUevent`
///   values likewise. Only streams made by this device or adopted with
///   [`CudaDevice::adopt_stream`] (a caller's `cudaStream_t`), and events made by it, are
///   accepted.
/// - **Copies**: synchronous ones use the driver's synchronous calls after synchronising the
///   stream (the driver stages pageable host memory itself); asynchronous ones run on the
///   stream from page-locked memory (see [`Device::copy_to_device_async`] below for pageable
///   buffers).
/// - **VMM**: when [`DeviceInfo::vmm_granularity`] is known, [`Device::vmm`] is this device
///   (`cuMemAddressReserve`, `cuMemCreate`, `cuMemMap` + `cuMemSetAccess`, `cuMemUnmap`,
///   `cuMemRelease`, `cuMemAddressFree`); otherwise `None`, and the pool's policies fall back
///   as they do on a simulated device without VMM.
///
/// Dropping the device destroys the streams and events it made and releases its hold on the
/// primary context; it does not free memory it handed out (a pool frees its own first).
pub struct CudaDevice {
    ctx: Arc<PrimaryContext>,
    info: DeviceInfo,
    legacy: Arc<Stream>,
    state: Mutex<State>,
}

/// What this device handed out, by raw value.
#[derive(Default)]
struct State {
    /// `cuMemAlloc` allocations: start → size.
    allocations: BTreeMap<DevicePtr, u64>,
    /// `cuMemAllocManaged` allocations: start → size.
    managed: BTreeMap<DevicePtr, u64>,
    /// Reservations and mappings.
    vmm: VmmLedger<()>,
    /// Physical chunks not yet released, by handle.
    physical: HashMap<u64, Arc<Physical>>,

    /// Streams made by `create_stream`, by raw handle.
    streams: HashMap<u64, Arc<Stream>>,
    /// Live events, by raw handle.
    events: HashMap<u64, Arc<Event>>,
}

/// Handle `id` of `table` (streams, events, physical chunks), shared with the caller, or the
/// error naming the unknown handle.
fn shared<T>(
    table: &HashMap<u64, Arc<T>>,
    kind: &'static str,
    id: u64,
) -> Result<Arc<T>, DeviceError> {
    table
        .get(&id)
        .cloned()
        .ok_or(DeviceError::UnknownHandle { kind, id })
}

/// Takes handle `id` out of `table`: `Some` when the caller held the last reference and must
/// destroy it now, `None` when a call on another thread still holds it (its drop destroys it
/// when that call ends).
fn take_last<T>(
    table: &mut HashMap<u64, Arc<T>>,
    kind: &'static str,
    id: u64,
) -> Result<Option<T>, DeviceError> {
    let held = table
        .remove(&id)
        .ok_or(DeviceError::UnknownHandle { kind, id })?;
    Ok(Arc::try_unwrap(held).ok())
}

impl State {
    /// Checks that `[ptr, ptr + len)` lies in one allocation or in consecutive mappings.
    fn check_range(&self, ptr: DevicePtr, len: u64) -> Result<(), DeviceError> {
        // An overflowing range ends at the top of the address space, which no allocation
        // reaches: `spans` then reports the overflow.
        let end = ptr.saturating_add(len);
        for table in [&self.allocations, &self.managed] {
            if let Some((&start, &size)) = table.range(..=ptr).next_back() {
                if end <= start + size {
                    return Ok(());
                }
            }
        }
        self.vmm.spans(ptr, len).map(|_| ())
    }
}

impl CudaDevice {
    /// How many CUDA devices the driver sees. Errors: no driver library (or one too old) is
    /// [`DeviceError::Unsupported`] naming the library; a driver that fails to initialise
    /// is its `CUresult` (`CUDA_ERROR_NO_DEVICE` with no GPU).
    pub fn count() -> Result<usize, DeviceError> {
        driver()?.device_count().map_err(cuda_error)
    }

    /// Opens device `ordinal`: loads the driver on first use (never panics when it is
    /// missing, see [`CudaDevice::count`] for the errors) and retains the device's primary
    /// context. An ordinal beyond the devices present is [`DeviceError::InvalidValue`].
    pub fn open(ordinal: usize) -> Result<CudaDevice, DeviceError> {
        let drv = driver()?;
        let dev = device_handle(drv, ordinal)?;
        let ctx = drv.retain_primary(dev).map_err(cuda_error)?;
        let info = query_info(drv, ordinal, dev, Some(&ctx))?;
        Ok(CudaDevice {
            legacy: Arc::new(ctx.legacy_stream()),
            ctx,
            info,
            state: Mutex::new(State::default()),
        })
    }

    /// What this device is and can do.
    pub fn info(&self) -> &DeviceInfo {
        &self.info
    }

    /// The device ordinal.
    pub fn ordinal(&self) -> usize {
        self.info.ordinal
    }

    /// Accepts `raw`, a `CUstream`/`cudaStream_t` created by someone else in this device's
    /// primary context (PyTorch's current stream, say), as [`StreamId`]`(raw)` from now on.
    /// The device never destroys it ([`Device::destroy_stream`] only forgets it): its
    /// creator must keep it alive while memory allocated on it is in use. Adopting a stream
    /// already known, or the default stream (0), does nothing.
    pub fn adopt_stream(&self, raw: u64) -> StreamId {
        if raw != 0 {
            self.lock()
                .streams
                .entry(raw)
                .or_insert_with(|| Arc::new(self.ctx.foreign_stream(raw)));
        }
        StreamId(raw)
    }

    fn lock(&self) -> MutexGuard<'_, State> {
        // Every update of the state is a single insert or remove: a panic cannot leave it
        // half-done, so a poisoned lock is taken over.
        self.state.lock().unwrap_or_else(|p| p.into_inner())
    }

    fn stream(&self, stream: StreamId) -> Result<Arc<Stream>, DeviceError> {
        if stream == StreamId::DEFAULT {
            return Ok(Arc::clone(&self.legacy));
        }
        shared(&self.lock().streams, "stream", stream.0)
    }

    fn event(&self, event: EventId) -> Result<Arc<Event>, DeviceError> {
        shared(&self.lock().events, "event", event.0)
    }

    fn check_range(&self, ptr: DevicePtr, len: u64) -> Result<(), DeviceError> {
        self.lock().check_range(ptr, len)
    }

    /// Keeps `event` and returns its id.
    fn keep_event(&self, event: Arc<Event>) -> EventId {
        let id = event.id();
        self.lock().events.insert(id, event);
        EventId(id)
    }

    fn new_event(&self) -> Result<Arc<Event>, DeviceError> {
        self.ctx.create_event().map(Arc::new).map_err(cuda_error)
    }

    /// Checks that managed memory is supported and `[ptr, ptr + len)` lies in one managed
    /// allocation of this device.
    fn check_managed(&self, ptr: DevicePtr, len: u64) -> Result<(), DeviceError> {
        self.managed_supported()?;
        let state = self.lock();
        let inside = state
            .managed
            .range(..=ptr)
            .next_back()
            .is_some_and(|(&start, &size)| {
                ptr.checked_add(len).is_some_and(|end| end <= start + size)
            });
        if inside {
            Ok(())
        } else {
            Err(DeviceError::InvalidAddress {
                ptr,
                what: format!("{len} bytes that are not inside one managed allocation"),
            })
        }
    }

    fn managed_supported(&self) -> Result<(), DeviceError> {
        if self.info.managed_memory {
            Ok(())
        } else {
            Err(DeviceError::unsupported(
                self.name(),
                "managed memory (the device or driver lacks it)",
            ))
        }
    }

    fn vmm_granularity(&self) -> Result<u64, DeviceError> {
        self.info.vmm_granularity.ok_or_else(|| {
            DeviceError::unsupported(
                self.name(),
                "virtual memory management (the device or driver lacks it)",
            )
        })
    }

    /// The driver's error for a `requested`-byte allocation; when it is out of memory, with
    /// what was asked and what was free.
    fn out_of_memory(&self, code: CUresult, requested: u64) -> DeviceError {
        let mut error = cuda_error(code);
        if let DeviceError::OutOfMemory {
            requested: asked,
            info,
            ..
        } = &mut error
        {
            *asked = Some(requested);
            *info = self.mem_info().ok();
        }
        error
    }

    fn async_error(&self, error: AsyncCopyError) -> DeviceError {
        match error {
            AsyncCopyError::Driver(code) => cuda_error(code),
            AsyncCopyError::NotPageLocked => DeviceError::InvalidValue(
                "a staging buffer from alloc_pinned is not page-locked".into(),
            ),
        }
    }
}

impl fmt::Debug for CudaDevice {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.debug_struct("CudaDevice")
            .field("info", &self.info)
            .finish_non_exhaustive()
    }
}

impl Device for CudaDevice {
    /// `cuda:0 (NVIDIA H100 80GB HBM3)`.
    fn name(&self) -> String {
        format!("cuda:{} ({})", self.info.ordinal, self.info.name)
    }

    fn mem_info(&self) -> Result<MemInfo, DeviceError> {
        let (free, total) = self.ctx.mem_info().map_err(cuda_error)?;
        Ok(MemInfo { free, total })
    }

    fn malloc(&self, size: u64) -> Result<DevicePtr, DeviceError> {
        if size == 0 {
            return Err(DeviceError::InvalidValue("malloc of zero bytes".into()));
        }
        let ptr = self
            .ctx
            .malloc(size)
            .map_err(|code| self.out_of_memory(code, size))?;
        self.lock().allocations.insert(ptr, size);
        Ok(ptr)
    }

    fn free(&self, ptr: DevicePtr) -> Result<(), DeviceError> {
        let size =
            self.lock()
                .allocations
                .remove(&ptr)
                .ok_or_else(|| DeviceError::InvalidAddress {
                    ptr,
                    what: "free of an address that no live malloc of this device returned".into(),
                })?;
        self.ctx.free(ptr).map_err(|code| {
            self.lock().allocations.insert(ptr, size);
            cuda_error(code)
        })
    }

    fn vmm(&self) -> Option<&dyn VirtualMemory> {
        self.info
            .vmm_granularity
            .map(|_| self as &dyn VirtualMemory)
    }

    /// A new non-blocking stream (`cuStreamCreate` with `CU_STREAM_NON_BLOCKING`); its id is
    /// the raw `CUstream` value. Destroy it with [`CudaDevice::destroy_stream`].
    fn create_stream(&self) -> Result<StreamId, DeviceError> {
        let stream = self.ctx.create_stream().map_err(cuda_error)?;
        let id = stream.id();
        self.lock().streams.insert(id, Arc::new(stream));
        Ok(StreamId(id))
    }

    /// `cuStreamDestroy` (work queued on the stream still completes); a stream taken in with
    /// [`CudaDevice::adopt_stream`] is only forgotten. The default stream cannot be destroyed.
    fn destroy_stream(&self, stream: StreamId) -> Result<(), DeviceError> {
        let last = take_last(&mut self.lock().streams, "stream", stream.0)?;
        last.map_or(Ok(()), |stream| stream.destroy().map_err(cuda_error))
    }

    /// `cuEventCreate` (no timing) + `cuEventRecord`; the id is the raw `CUevent` value.
    fn record_event(&self, stream: StreamId) -> Result<EventId, DeviceError> {
        let stream = self.stream(stream)?;
        let event = self.new_event()?;
        event.record(&stream).map_err(cuda_error)?;
        Ok(self.keep_event(event))
    }

    /// `cuEventQuery`.
    fn event_completed(&self, event: EventId) -> Result<bool, DeviceError> {
        self.event(event)?.query().map_err(cuda_error)
    }

    /// `cuEventSynchronize`.
    fn wait_event(&self, event: EventId) -> Result<(), DeviceError> {
        self.event(event)?.synchronize().map_err(cuda_error)
    }

    /// `cuStreamWaitEvent`: the host goes on.
    fn stream_wait_event(&self, stream: StreamId, event: EventId) -> Result<(), DeviceError> {
        let stream = self.stream(stream)?;
        self.event(event)?.make_wait(&stream).map_err(cuda_error)
    }

    /// `cuMemAllocManaged` (attached globally).
    fn alloc_managed(&self, size: u64) -> Result<DevicePtr, DeviceError> {
        self.managed_supported()?;
        if size == 0 {
            return Err(DeviceError::InvalidValue(
                "managed allocation of zero bytes".into(),
            ));
        }
        let ptr = self
            .ctx
            .alloc_managed(size)
            .map_err(|code| self.out_of_memory(code, size))?;
        self.lock().managed.insert(ptr, size);
        Ok(ptr)
    }

    /// `cuMemFree` of a managed allocation of this device.
    fn free_managed(&self, ptr: DevicePtr) -> Result<(), DeviceError> {
        let size = self
            .lock()
            .managed
            .remove(&ptr)
            .ok_or_else(|| DeviceError::InvalidAddress {
                ptr,
                what:
                    "free_managed of an address that no live alloc_managed of this device returned"
                        .into(),
            })?;
        self.ctx.free(ptr).map_err(|code| {
            self.lock().managed.insert(ptr, size);
            cuda_error(code)
        })
    }

    /// `cuMemPrefetchAsync` to this device or the host (`CU_DEVICE_CPU`).
    fn prefetch_managed(
        &self,
        ptr: DevicePtr,
        len: u64,
        to: MemoryLocation,
        stream: StreamId,
    ) -> Result<(), DeviceError> {
        self.check_managed(ptr, len)?;
        let stream = self.stream(stream)?;
        self.ctx
            .prefetch_managed(ptr, len, to == MemoryLocation::Host, &stream)
            .map_err(cuda_error)
    }

    /// `cuMemAdvise` (`SET_READ_MOSTLY`, `SET_PREFERRED_LOCATION`, `SET_ACCESSED_BY`).
    fn advise_managed(
        &self,
        ptr: DevicePtr,
        len: u64,
        advice: ManagedAdvice,
    ) -> Result<(), DeviceError> {
        use cudarc::driver::sys::CUmem_advise_enum as A;
        self.check_managed(ptr, len)?;
        let (code, location) = match advice {
            ManagedAdvice::ReadMostly => (A::CU_MEM_ADVISE_SET_READ_MOSTLY, MemoryLocation::Device),
            ManagedAdvice::PreferredLocation(at) => (A::CU_MEM_ADVISE_SET_PREFERRED_LOCATION, at),
            ManagedAdvice::AccessedBy(by) => (A::CU_MEM_ADVISE_SET_ACCESSED_BY, by),
        };
        self.ctx
            .advise_managed(ptr, len, code, location == MemoryLocation::Host)
            .map_err(cuda_error)
    }

    /// `cuEventDestroy`.
    fn destroy_event(&self, event: EventId) -> Result<(), DeviceError> {
        // Held elsewhere too (a call on another thread, a buffer's fence): destroyed when the
        // last holder lets go.
        let last = take_last(&mut self.lock().events, "event", event.0)?;
        last.map_or(Ok(()), |event| event.destroy().map_err(cuda_error))
    }

    /// `cuStreamSynchronize`.
    fn synchronize_stream(&self, stream: StreamId) -> Result<(), DeviceError> {
        self.stream(stream)?.synchronize().map_err(cuda_error)
    }

    /// `cuCtxSynchronize`.
    fn synchronize(&self) -> Result<(), DeviceError> {
        self.ctx.synchronize().map_err(cuda_error)
    }

    /// Synchronises `stream`, then `cuMemcpyHtoD` (synchronous; the driver stages pageable
    /// memory itself, no gpumem staging) and a wait for the legacy stream it ran on.
    fn copy_to_device(
        &self,
        dst: DevicePtr,
        src: &[u8],
        stream: StreamId,
    ) -> Result<(), DeviceError> {
        let stream = self.stream(stream)?;
        if src.is_empty() {
            return Ok(());
        }
        self.check_range(dst, src.len() as u64)?;
        self.ctx
            .copy_to_device(dst, src, &stream)
            .map_err(cuda_error)
    }

    /// Synchronises `stream`, then `cuMemcpyDtoH` (returns once the bytes have arrived).
    fn copy_to_host(
        &self,
        dst: &mut [u8],
        src: DevicePtr,
        stream: StreamId,
    ) -> Result<(), DeviceError> {
        let stream = self.stream(stream)?;
        if dst.is_empty() {
            return Ok(());
        }
        self.check_range(src, dst.len() as u64)?;
        self.ctx.copy_to_host(dst, src, &stream).map_err(cuda_error)
    }

    /// `cuMemcpyDtoDAsync` on `stream`, then `cuStreamSynchronize`.
    fn copy_on_device(
        &self,
        dst: DevicePtr,
        src: DevicePtr,
        len: u64,
        stream: StreamId,
    ) -> Result<(), DeviceError> {
        let stream = self.stream(stream)?;
        if len == 0 {
            return Ok(());
        }
        self.check_range(dst, len)?;
        self.check_range(src, len)?;
        self.ctx
            .enqueue_device_copy(dst, src, len, &stream)
            .and_then(|()| stream.synchronize())
            .map_err(cuda_error)
    }

    /// Page-locked memory from `cuMemHostAlloc` (portable to every device's context), freed
    /// with `cuMemFreeHost` when the buffer is dropped; it keeps the primary context alive
    /// until then.
    fn alloc_pinned(&self, len: usize) -> Result<PinnedBuffer, DeviceError> {
        let storage = self.ctx.alloc_pinned(len).map_err(cuda_error)?;
        Ok(PinnedBuffer::new(Box::new(storage)))
    }

    /// `cuMemcpyHtoDAsync` on `stream` and an event behind it. A buffer that is not
    /// page-locked memory of this crate is first copied into a new page-locked buffer (pinned
    /// staging), and that buffer, with the same bytes, is the one that comes back.
    fn copy_to_device_async(
        &self,
        dst: DevicePtr,
        src: PinnedBuffer,
        stream: StreamId,
    ) -> Result<InFlight<'_, PinnedBuffer>, DeviceError> {
        let stream = self.stream(stream)?;
        if src.is_empty() {
            return Ok(InFlight::completed(src));
        }
        self.check_range(dst, src.len() as u64)?;
        let event = self.new_event()?;
        let src = match self.ctx.enqueue_upload(dst, &src, &stream, &event) {
            Ok(()) => src,
            Err(AsyncCopyError::NotPageLocked) => {
                let mut staged = self.alloc_pinned(src.len())?;
                staged.copy_from_slice(&src);
                self.ctx
                    .enqueue_upload(dst, &staged, &stream, &event)
                    .map_err(|e| self.async_error(e))?;
                staged
            }
            Err(e) => return Err(self.async_error(e)),
        };
        Ok(InFlight::pending(self, self.keep_event(event), src))
    }

    /// `cuMemcpyDtoHAsync` on `stream` and an event behind it. Into a buffer that is not
    /// page-locked memory of this crate, the copy goes to a new page-locked buffer of the same
    /// length instead (pinned staging), and that buffer is the one that comes back, filled.
    fn copy_to_host_async(
        &self,
        mut dst: PinnedBuffer,
        src: DevicePtr,
        stream: StreamId,
    ) -> Result<InFlight<'_, PinnedBuffer>, DeviceError> {
        let stream = self.stream(stream)?;
        if dst.is_empty() {
            return Ok(InFlight::completed(dst));
        }
        self.check_range(src, dst.len() as u64)?;
        let event = self.new_event()?;
        let dst = match self.ctx.enqueue_download(&mut dst, src, &stream, &event) {
            Ok(()) => dst,
            Err(AsyncCopyError::NotPageLocked) => {
                let mut staged = self.alloc_pinned(dst.len())?;
                self.ctx
                    .enqueue_download(&mut staged, src, &stream, &event)
                    .map_err(|e| self.async_error(e))?;
                staged
            }
            Err(e) => return Err(self.async_error(e)),
        };
        Ok(InFlight::pending(self, self.keep_event(event), dst))
    }

    /// `cuMemcpyDtoDAsync` on `stream` and an event behind it.
    fn copy_on_device_async(
        &self,
        dst: DevicePtr,
        src: DevicePtr,
        len: u64,
        stream: StreamId,
    ) -> Result<EventId, DeviceError> {
        let stream = self.stream(stream)?;
        if len > 0 {
            self.check_range(dst, len)?;
            self.check_range(src, len)?;
        }
        let event = self.new_event()?;
        if len > 0 {
            self.ctx
                .enqueue_device_copy(dst, src, len, &stream)
                .map_err(cuda_error)?;
        }
        event.record(&stream).map_err(cuda_error)?;
        Ok(self.keep_event(event))
    }
}

impl VirtualMemory for CudaDevice {
    /// `cuMemGetAllocationGranularity` (minimum) for pinned device memory; 2 MiB on a device
    /// without VMM, where the other calls fail with [`DeviceError::Unsupported`].
    fn granularity(&self) -> u64 {
        self.info.vmm_granularity.unwrap_or(FALLBACK_GRANULARITY)
    }

    /// `cuMemAddressReserve`, aligned to the granularity.
    fn reserve(&self, size: u64) -> Result<DevicePtr, DeviceError> {
        let g = self.vmm_granularity()?;
        check_granularity_multiple(size, g, "reservation")?;
        let ptr = self.ctx.reserve(size, g).map_err(cuda_error)?;
        self.lock().vmm.add_reservation(ptr, size);
        Ok(ptr)
    }

    /// `cuMemAddressFree`; the reservation must be whole and have nothing mapped in it.
    fn release_reservation(&self, ptr: DevicePtr, size: u64) -> Result<(), DeviceError> {
        self.lock().vmm.remove_reservation(ptr, size)?;
        self.ctx.release_reservation(ptr, size).map_err(|code| {
            self.lock().vmm.add_reservation(ptr, size);
            cuda_error(code)
        })
    }

    /// `cuMemCreate` of pinned device memory on this device.
    fn create_physical(&self, size: u64) -> Result<PhysicalHandle, DeviceError> {
        let g = self.vmm_granularity()?;
        check_granularity_multiple(size, g, "physical chunk")?;
        let chunk = self
            .ctx
            .create_physical(size)
            .map_err(|code| self.out_of_memory(code, size))?;
        let id = chunk.id();
        self.lock().physical.insert(id, Arc::new(chunk));
        Ok(PhysicalHandle(id))
    }

    /// `cuMemRelease`; the memory goes back once the chunk is no longer mapped.
    fn release_physical(&self, handle: PhysicalHandle) -> Result<(), DeviceError> {
        // Being mapped on another thread right now: released when that call ends.
        let last = take_last(&mut self.lock().physical, "physical handle", handle.0)?;
        last.map_or(Ok(()), |chunk| chunk.release().map_err(cuda_error))
    }

    /// `cuMemMap` of the whole chunk, then `cuMemSetAccess` (read-write for this device).
    fn map(&self, ptr: DevicePtr, handle: PhysicalHandle) -> Result<(), DeviceError> {
        let g = self.vmm_granularity()?;
        let chunk = {
            let s = self.lock();
            let chunk = shared(&s.physical, "physical handle", handle.0)?;
            s.vmm.check_map(ptr, chunk.size(), g)?;
            chunk
        };
        self.ctx.map(ptr, &chunk).map_err(cuda_error)?;
        self.lock().vmm.add_mapping(ptr, chunk.size(), ());
        Ok(())
    }

    /// `cuMemUnmap`; the range must cover whole mappings.
    fn unmap(&self, ptr: DevicePtr, size: u64) -> Result<(), DeviceError> {
        let starts = self.lock().vmm.covered_mappings(ptr, size)?;
        self.ctx.unmap(ptr, size).map_err(cuda_error)?;
        let mut s = self.lock();
        for start in starts {
            s.vmm.remove_mapping(start);
        }
        Ok(())
    }
}
