//! The wgpu backend of gpumem: a [`Device`] over any GPU wgpu drives natively (Vulkan on
//! Linux, Metal on Apple platforms, DX12 on Windows), and over Mesa's software Vulkan driver
//! (lavapipe) on machines without a GPU.
//!
//! # Memory: buffers in an address space
//!
//! wgpu has buffers, not pointers. [`WgpuDevice::malloc`] creates one storage buffer (usage
//! `STORAGE | COPY_SRC | COPY_DST`) per call and places it at a fresh, aligned range of a
//! per-device address space (`[2^32, 2^48)`, see [`ADDRESS_ALIGNMENT`]), so that a pool can
//! treat it like any device memory: split it into blocks, hand out addresses inside it. Any
//! address inside a live buffer resolves to the buffer and an offset
//! ([`WgpuDevice::resolve`]), which is how copies find their buffers and how compute passes
//! bind a block ([`BufferRange::binding`]). [`WgpuDevice::free`] destroys the buffer (wgpu
//! keeps it alive until submitted work that uses it has finished). Addresses mean something
//! only to the device that handed them out. There is no virtual memory management, so
//! [`Device::vmm`] is `None` and policies that need it say so.
//!
//! # Memory info
//!
//! wgpu reports no device memory size or budget through its safe API, so
//! [`WgpuDevice::memory`] says where its figures come from ([`MemorySource`]), best first:
//! - the [`WgpuOptions::memory_limit`] given to [`WgpuDevice::open`], which `malloc` then
//!   enforces with [`DeviceError::OutOfMemory`]; free is the limit less this device's bytes;
//! - on Vulkan, the driver's own figures: the total is the largest device-local memory heap,
//!   and free is that heap's budget less the process's usage of it where the driver has
//!   `VK_EXT_memory_budget` ([`MemorySource::Budget`]), else the heap less this device's bytes
//!   ([`MemorySource::HeapSize`]);
//! - elsewhere (Metal, DX12) an estimate with no source, [`ESTIMATE_BUFFERS`] times
//!   `max_buffer_size` ([`MemorySource::Estimate`]).
//!
//! Without a limit only the driver refuses memory.
//! Buffer creation is also refused, as out of memory, once the native memory budget is
//! [`BUDGET_PERCENT`] used, where the backend reports a budget (DX12; Vulkan with
//! `VK_EXT_memory_budget`).
//!
//! # Streams and events
//!
//! The queue is the only stream: [`Device::create_stream`] returns [`StreamId::DEFAULT`] and
//! every stream id names the queue. An event is a submission: [`Device::record_event`] submits
//! an empty batch (which also flushes queued buffer writes) and remembers its submission
//! index; the event completes when the queue has finished it.
//!
//! # Copies
//!
//! wgpu copies in 4-byte words ([`wgpu::COPY_BUFFER_ALIGNMENT`]); gpumem's copies take any
//! address and length:
//! - host to device: `Queue::write_buffer` at the resolved offset; when the range does not
//!   start or end on a word boundary, the partial edge words are read from the device first
//!   and written back whole (read-modify-write), so the bytes around the range are kept;
//! - device to host: a copy into a `MAP_READ` staging buffer of the word-aligned covering
//!   range, mapped once the submission completes;
//! - device to device: `copy_buffer_to_buffer` when both offsets and the length are multiples
//!   of 4 (through a temporary buffer when both ranges are in one buffer, which wgpu does not
//!   copy within); otherwise through host memory. Each range must lie inside one allocation.
//!
//! The asynchronous copies return an [`InFlight`] whose event is the copy's submission. A
//! host-to-device copy has taken its bytes when it returns (wgpu stages them), and a
//! device-to-host copy gives back a buffer whose bytes are filled in from the staging buffer
//! when the device sees the copy's event complete.
//!
//! # Errors
//!
//! Every call runs inside wgpu error scopes; what they catch maps through
//! [`DeviceError::from_backend`] with the kinds numbered in [`codes`]
//! ([`wgpu::Error::OutOfMemory`] is out of memory, so a pool frees its cache and retries).
//! Requests wgpu could never satisfy are refused before wgpu sees them, with a typed error:
//! a size beyond the adapter's `max_buffer_size` is [`DeviceError::InvalidValue`] naming the
//! limit, an address in no live buffer or a range that runs past its buffer is
//! [`DeviceError::InvalidAddress`].

#![deny(unsafe_code)]
#![warn(missing_docs)]

mod address_space;
mod errors;
mod native_memory;
mod readback;

use std::collections::HashMap;
use std::future::Future;
use std::num::NonZeroU64;
use std::pin::pin;
use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::{Arc, Mutex, MutexGuard};
use std::task::{Context, Poll, Waker};
use std::time::{Duration, Instant};

use gpumem_device::{
    Device, DeviceError, DevicePtr, EventId, InFlight, MemInfo, PinnedBuffer, StreamId,
};

pub use address_space::{BASE as ADDRESS_BASE, END as ADDRESS_END};
pub use errors::{codes, BACKEND};
/// The wgpu this backend is built on, so that callers bind [`BufferRange`]s with the same
/// version.
pub use wgpu;

use address_space::AddressSpace;
use readback::Readback;

/// The least alignment of the addresses `malloc` returns: wgpu's largest allowed
/// `min_storage_buffer_offset_alignment`, so any returned address can be bound as is. An
/// adapter that asks for more gets more.
pub const ADDRESS_ALIGNMENT: u64 = 256;

/// Where neither a [`WgpuOptions::memory_limit`] nor the driver gives the device memory
/// ([`MemorySource::Estimate`]), it is taken to be this many buffers of the adapter's
/// `max_buffer_size` (capped at the address space). A guess with no source or measurement
/// behind it: it only keeps `mem_info` from reporting nothing, and says it is an estimate.
pub const ESTIMATE_BUFFERS: u64 = 4;

/// Where the figures of [`WgpuDevice::memory`] (and so of [`Device::mem_info`]) come from.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash)]
pub enum MemorySource {
    /// The [`WgpuOptions::memory_limit`] the device was opened with: the total is the limit,
    /// free the limit less this device's bytes, and `malloc` enforces it.
    Limit,
    /// The driver's memory budget (Vulkan `VK_EXT_memory_budget`), read at each call: the
    /// total is the largest device-local heap, free that heap's budget less what the process
    /// uses of it (so other devices and allocators of the process count too).
    Budget,
    /// The driver's heap size, without a budget (Vulkan without `VK_EXT_memory_budget`): the
    /// total is the largest device-local heap, free that less this device's bytes (other
    /// users of the heap are not seen).
    HeapSize,
    /// Nothing from the driver (a backend this crate does not ask, or no device-local heap):
    /// the total is [`ESTIMATE_BUFFERS`] times `max_buffer_size`, a guess, free that less this
    /// device's bytes.
    Estimate,
}

impl MemorySource {
    /// Whether the figures are a guess rather than a limit or the driver's own.
    pub fn is_estimate(self) -> bool {
        self == MemorySource::Estimate
    }
}

/// Free and total device memory with where they come from: [`WgpuDevice::memory`].
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct WgpuMemInfo {
    /// The figures, as [`Device::mem_info`] reports them.
    pub info: MemInfo,
    /// Where they come from.
    pub source: MemorySource,
}

/// The percentage of the native memory budget at which buffer creation fails as out of memory
/// (`wgpu::MemoryBudgetThresholds::for_resource_creation`), on backends that report a budget.
pub const BUDGET_PERCENT: u8 = 95;

/// How long a wait goes on polling for the callbacks of a finished submission that another
/// thread is running.
const CALLBACK_WAIT: Duration = Duration::from_secs(60);

/// wgpu copies whole 4-byte words.
const WORD: u64 = wgpu::COPY_BUFFER_ALIGNMENT;

/// Which adapter [`WgpuDevice::open`] picks.
#[derive(Clone, Debug, Default, PartialEq, Eq)]
pub enum AdapterChoice {
    /// wgpu's choice for high performance (a discrete GPU before an integrated one, a software
    /// driver last).
    #[default]
    HighPerformance,
    /// wgpu's choice for low power (an integrated GPU first).
    LowPower,
    /// The adapter at this position of [`WgpuDevice::adapters`].
    Index(usize),
    /// The first adapter whose name contains this text, ignoring case.
    Name(String),
}

/// How to open a [`WgpuDevice`].
#[derive(Clone, Debug, Default, PartialEq, Eq)]
pub struct WgpuOptions {
    /// Which adapter to open.
    pub adapter: AdapterChoice,
    /// The device memory in bytes, which `mem_info` reports as the total and `malloc` enforces
    /// (a request beyond the free bytes is [`DeviceError::OutOfMemory`]). `None`: the driver's
    /// figures where it gives them, else an estimate (see [`MemorySource`]), not enforced.
    pub memory_limit: Option<u64>,
}

/// One adapter wgpu can open, as [`WgpuDevice::adapters`] lists them.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct AdapterSummary {
    /// Its position in the list: what [`AdapterChoice::Index`] takes.
    pub index: usize,
    /// The adapter's name, e.g. `"llvmpipe (LLVM 15.0.6, 256 bits)"`.
    pub name: String,
    /// The backend that drives it: `"vulkan"`, `"metal"` or `"dx12"`.
    pub backend: String,
    /// `"discrete"`, `"integrated"`, `"virtual"`, `"cpu"` or `"other"`.
    pub device_type: String,
    /// The driver's name, e.g. `"llvmpipe"`.
    pub driver: String,
    /// The driver's version text, e.g. `"Mesa 22.3.6 (LLVM 15.0.6)"`.
    pub driver_info: String,
    /// The largest buffer, and so the largest `malloc`, in bytes.
    pub max_buffer_size: u64,
}

/// A range of device memory as wgpu sees it: a buffer and a byte range inside it, from
/// [`WgpuDevice::resolve`].
#[derive(Clone, Debug)]
pub struct BufferRange {
    /// The buffer `malloc` created for the allocation.
    pub buffer: wgpu::Buffer,
    /// The address of the buffer's first byte.
    pub base: DevicePtr,
    /// The range's first byte, from the start of the buffer.
    pub offset: u64,
    /// The range's length in bytes.
    pub size: u64,
}

impl BufferRange {
    /// The range as a buffer binding for a bind group (a storage buffer in a compute pass,
    /// say). wgpu requires the offset to be a multiple of the device's
    /// `min_storage_buffer_offset_alignment` (every address `malloc` returns is) and the size
    /// to be non-zero (a multiple of 4 for storage buffers).
    pub fn binding(&self) -> wgpu::BufferBinding<'_> {
        wgpu::BufferBinding {
            buffer: &self.buffer,
            offset: self.offset,
            size: NonZeroU64::new(self.size),
        }
    }
}

/// A GPU driven through wgpu, as a gpumem [`Device`]. Cheap to share behind an `Arc`; every
/// method takes `&self`.
pub struct WgpuDevice {
    info: wgpu::AdapterInfo,
    limits: wgpu::Limits,
    device: wgpu::Device,
    queue: wgpu::Queue,
    /// The alignment of the addresses `malloc` returns.
    align: u64,
    /// The total of [`WgpuDevice::memory`], fixed at open.
    total: u64,
    memory_limit: Option<u64>,
    /// The driver's device-local heap, where it reports one (Vulkan).
    heap: Option<native_memory::Heap>,
    state: Mutex<State>,
}

struct State {
    space: AddressSpace<Allocation>,
    /// Bytes of all live buffers.
    allocated: u64,
    events: HashMap<u64, Event>,
    next_event: u64,
}

struct Allocation {
    buffer: wgpu::Buffer,
}

/// A recorded submission.
struct Event {
    index: wgpu::SubmissionIndex,
    /// Set once the submission has finished: by the queue's work-done callback, or for a
    /// read by the staging buffer's map callback (which comes after the submission finished).
    done: Arc<AtomicBool>,
    /// What to do once, when the device first sees the event complete (take the bytes of an
    /// asynchronous read out of its staging buffer).
    on_complete: Option<Box<dyn FnOnce() -> Result<(), DeviceError> + Send>>,
}

/// A read into a staging buffer, submitted; its bytes can be taken once the submission
/// has finished.
struct PendingRead {
    staging: wgpu::Buffer,
    index: wgpu::SubmissionIndex,
    /// The outcome of mapping the staging buffer, once known.
    mapped: Arc<Mutex<Option<Result<(), wgpu::BufferAsyncError>>>>,
    /// Set, after `mapped`, by the map callback.
    ready: Arc<AtomicBool>,
}

impl PendingRead {
    /// Hands the bytes to `take`; `ready` must be set.
    fn finish<R>(self, take: impl FnOnce(&[u8]) -> R) -> Result<R, DeviceError> {
        let mapped = self.mapped.lock().unwrap_or_else(|p| p.into_inner()).take();
        match mapped {
            Some(Ok(())) => {}
            Some(Err(e)) => {
                return Err(errors::driver(
                    codes::MAP,
                    "BufferAsyncError",
                    format!("mapping a staging buffer for reading: {e}"),
                ))
            }
            None => {
                return Err(errors::driver(
                    codes::MAP,
                    "BufferAsyncError",
                    "the staging buffer was not mapped after its copy completed",
                ))
            }
        }
        let result = {
            let view = self.staging.get_mapped_range(..).map_err(|e| {
                errors::driver(
                    codes::MAP,
                    "MapRangeError",
                    format!("reading a staging buffer: {e}"),
                )
            })?;
            take(&view)
        };
        self.staging.unmap();
        self.staging.destroy();
        Ok(result)
    }
}

/// Runs a future that wgpu's native backends complete at once (adapter and device requests,
/// error scopes).
fn block_on<F: Future>(future: F) -> F::Output {
    let mut future = pin!(future);
    let mut cx = Context::from_waker(Waker::noop());
    loop {
        if let Poll::Ready(output) = future.as_mut().poll(&mut cx) {
            return output;
        }
        std::thread::yield_now();
    }
}

/// An instance with the backends this build enables, or a typed error on a platform where it
/// enables none.
fn instance() -> Result<wgpu::Instance, DeviceError> {
    let backends = wgpu::Instance::enabled_backend_features();
    if backends.is_empty() {
        return Err(DeviceError::unsupported(
            BACKEND,
            "gpumem-wgpu enables Vulkan, Metal and DX12 only on Linux, Apple platforms and \
             Windows",
        ));
    }
    let mut desc = wgpu::InstanceDescriptor::new_without_display_handle();
    desc.backends = backends;
    desc.flags = wgpu::InstanceFlags::from_build_config().with_env();
    desc.memory_budget_thresholds = wgpu::MemoryBudgetThresholds {
        for_resource_creation: Some(BUDGET_PERCENT),
        for_device_loss: None,
    };
    Ok(wgpu::Instance::new(desc))
}

/// Every adapter `instance` finds, in a stable order.
fn list(instance: &wgpu::Instance) -> Vec<wgpu::Adapter> {
    block_on(instance.enumerate_adapters(wgpu::Instance::enabled_backend_features()))
}

fn device_type_name(t: wgpu::DeviceType) -> &'static str {
    match t {
        wgpu::DeviceType::DiscreteGpu => "discrete",
        wgpu::DeviceType::IntegratedGpu => "integrated",
        wgpu::DeviceType::VirtualGpu => "virtual",
        wgpu::DeviceType::Cpu => "cpu",
        wgpu::DeviceType::Other => "other",
    }
}

fn summary(index: usize, adapter: &wgpu::Adapter) -> AdapterSummary {
    let info = adapter.get_info();
    AdapterSummary {
        index,
        name: info.name,
        backend: info.backend.to_str().into(),
        device_type: device_type_name(info.device_type).into(),
        driver: info.driver,
        driver_info: info.driver_info,
        max_buffer_size: adapter.limits().max_buffer_size,
    }
}

/// What to install when no adapter is found, for messages.
pub const NO_ADAPTER_HINT: &str = "no GPU adapter found; without a GPU, install Mesa's software \
     Vulkan driver (Debian/Ubuntu: apt-get install mesa-vulkan-drivers libvulkan1, or run \
     scripts/install-test-deps.sh)";

impl WgpuDevice {
    /// The adapters wgpu finds with the backends of this build, in the order
    /// [`AdapterChoice::Index`] counts them. Empty when there are none (no driver installed).
    pub fn adapters() -> Vec<AdapterSummary> {
        let Ok(instance) = instance() else {
            return Vec::new();
        };
        list(&instance)
            .iter()
            .enumerate()
            .map(|(i, a)| summary(i, a))
            .collect()
    }

    /// Opens the adapter `options` picks and creates a device on it with the adapter's own
    /// limits (not WebGPU's defaults), so buffers may be as large as the hardware allows.
    ///
    /// Fails with a typed error and never panics when there is no adapter (no GPU and no
    /// software driver: [`codes::NO_ADAPTER`], whose message says what to install), when the
    /// choice names no adapter, or when the device cannot be created.
    pub fn open(options: WgpuOptions) -> Result<WgpuDevice, DeviceError> {
        if options.memory_limit == Some(0) {
            return Err(DeviceError::InvalidValue(
                "the wgpu device's memory limit must be non-zero".into(),
            ));
        }
        let instance = instance()?;
        let no_adapter = |detail: String| {
            errors::driver(
                codes::NO_ADAPTER,
                "NoAdapter",
                format!("{detail}: {NO_ADAPTER_HINT}"),
            )
        };
        let adapter = match &options.adapter {
            choice @ (AdapterChoice::HighPerformance | AdapterChoice::LowPower) => {
                let power_preference = if *choice == AdapterChoice::LowPower {
                    wgpu::PowerPreference::LowPower
                } else {
                    wgpu::PowerPreference::HighPerformance
                };
                let request = wgpu::RequestAdapterOptions {
                    power_preference,
                    ..Default::default()
                };
                block_on(instance.request_adapter(&request))
                    .map_err(|e| no_adapter(format!("requesting an adapter: {e}")))?
            }
            AdapterChoice::Index(i) => {
                let all = list(&instance);
                if all.is_empty() {
                    return Err(no_adapter("listing adapters".into()));
                }
                let count = all.len();
                all.into_iter().nth(*i).ok_or_else(|| {
                    DeviceError::InvalidValue(format!(
                        "no wgpu adapter {i}: there are {count} (0 to {})",
                        count - 1
                    ))
                })?
            }
            AdapterChoice::Name(name) => {
                let all = list(&instance);
                if all.is_empty() {
                    return Err(no_adapter("listing adapters".into()));
                }
                let wanted = name.to_lowercase();
                let names: Vec<String> = all.iter().map(|a| a.get_info().name).collect();
                let found = names
                    .iter()
                    .position(|n| n.to_lowercase().contains(&wanted));
                match found {
                    Some(i) => all.into_iter().nth(i).expect("position is in range"),
                    None => {
                        return Err(DeviceError::InvalidValue(format!(
                            "no wgpu adapter's name contains {name:?}; there are: {}",
                            names.join(", ")
                        )))
                    }
                }
            }
        };
        let info = adapter.get_info();
        let limits = adapter.limits();
        let desc = wgpu::DeviceDescriptor {
            label: Some("gpumem"),
            required_limits: limits.clone(),
            ..Default::default()
        };
        let (device, queue) = block_on(adapter.request_device(&desc)).map_err(|e| {
            errors::driver(
                codes::REQUEST_DEVICE,
                "RequestDeviceError",
                format!("opening {}: {e}", info.name),
            )
        })?;
        let align = ADDRESS_ALIGNMENT.max(u64::from(limits.min_storage_buffer_offset_alignment));
        let heap = native_memory::heap(&device);
        let total = match (options.memory_limit, heap) {
            (Some(limit), _) => limit,
            (None, Some(heap)) => heap.size,
            (None, None) => limits
                .max_buffer_size
                .saturating_mul(ESTIMATE_BUFFERS)
                .min(ADDRESS_END - ADDRESS_BASE),
        };
        Ok(WgpuDevice {
            info,
            limits,
            device,
            queue,
            align,
            total,
            memory_limit: options.memory_limit,
            heap,
            state: Mutex::new(State {
                space: AddressSpace::new(align),
                allocated: 0,
                events: HashMap::new(),
                next_event: 1,
            }),
        })
    }

    /// The adapter this device runs on.
    pub fn adapter_info(&self) -> &wgpu::AdapterInfo {
        &self.info
    }

    /// The device's limits (the adapter's own).
    pub fn limits(&self) -> &wgpu::Limits {
        &self.limits
    }

    /// The wgpu device, to create pipelines and bind groups over [`BufferRange`]s.
    pub fn wgpu_device(&self) -> &wgpu::Device {
        &self.device
    }

    /// The queue: the device's only stream. Work submitted here is ordered with gpumem's
    /// copies and events.
    pub fn queue(&self) -> &wgpu::Queue {
        &self.queue
    }

    /// The alignment of every address `malloc` returns (at least [`ADDRESS_ALIGNMENT`]).
    pub fn address_alignment(&self) -> u64 {
        self.align
    }

    /// Free and total device memory, and where they come from (see [`MemorySource`]).
    pub fn memory(&self) -> WgpuMemInfo {
        self.memory_with(self.lock().allocated)
    }

    /// [`WgpuDevice::memory`] with `allocated` bytes live through this device.
    fn memory_with(&self, allocated: u64) -> WgpuMemInfo {
        let total = self.total;
        let less_ours = |source| WgpuMemInfo {
            info: MemInfo {
                free: total.saturating_sub(allocated),
                total,
            },
            source,
        };
        if self.memory_limit.is_some() {
            return less_ours(MemorySource::Limit);
        }
        let Some(heap) = self.heap else {
            return less_ours(MemorySource::Estimate);
        };
        match native_memory::budget(&self.device, heap) {
            Some(b) => WgpuMemInfo {
                info: MemInfo {
                    free: b.budget.saturating_sub(b.usage).min(total),
                    total,
                },
                source: MemorySource::Budget,
            },
            None => less_ours(MemorySource::HeapSize),
        }
    }

    /// Bytes of all live buffers (`malloc` sizes rounded up to whole 4-byte words).
    pub fn allocated(&self) -> u64 {
        self.lock().allocated
    }

    /// Live allocations.
    pub fn live_allocations(&self) -> usize {
        self.lock().space.len()
    }

    /// The buffer and offset of `[ptr, ptr + len)`, if the range lies inside one live
    /// allocation (`len` may be 0: then `ptr` must lie inside one). For binding a block in a
    /// compute pass: [`BufferRange::binding`].
    pub fn resolve(&self, ptr: DevicePtr, len: u64) -> Option<BufferRange> {
        self.locate(ptr, len).ok()
    }

    fn lock(&self) -> MutexGuard<'_, State> {
        // Every update of the state is completed before anything that could panic, so the
        // state of a poisoned lock is consistent.
        self.state.lock().unwrap_or_else(|p| p.into_inner())
    }

    /// [`WgpuDevice::resolve`], with the reason when it fails.
    fn locate(&self, ptr: DevicePtr, len: u64) -> Result<BufferRange, DeviceError> {
        let state = self.lock();
        match state.space.find(ptr, len) {
            Some((base, _, allocation)) => Ok(BufferRange {
                buffer: allocation.buffer.clone(),
                base,
                offset: ptr - base,
                size: len,
            }),
            None => {
                let what = match state.space.find(ptr, 0) {
                    Some((base, size, _)) => format!(
                        "{len} bytes from here run past the end of the allocation at {base:#x} \
                         ({size} bytes); a range must lie inside one allocation"
                    ),
                    None => "no live allocation of this device holds this address".into(),
                };
                Err(DeviceError::InvalidAddress { ptr, what })
            }
        }
    }

    /// Runs `f` inside error scopes for every kind of wgpu error and maps what they catch.
    fn scoped<R>(&self, what: &str, f: impl FnOnce() -> R) -> Result<R, DeviceError> {
        let oom = self.device.push_error_scope(wgpu::ErrorFilter::OutOfMemory);
        let validation = self.device.push_error_scope(wgpu::ErrorFilter::Validation);
        let internal = self.device.push_error_scope(wgpu::ErrorFilter::Internal);
        let result = f();
        // Innermost first; each pop takes effect at once, the futures are ready.
        let caught = [internal.pop(), validation.pop()]
            .into_iter()
            .map(block_on)
            .chain(std::iter::once(block_on(oom.pop())))
            .flatten()
            .next();
        match caught {
            Some(error) => Err(errors::from_wgpu(what, error)),
            None => Ok(result),
        }
    }

    /// Blocks until the submission `index` has finished and its callbacks have run.
    fn wait_index(&self, what: &str, index: wgpu::SubmissionIndex) -> Result<(), DeviceError> {
        self.device
            .poll(wgpu::PollType::Wait {
                submission_index: Some(index),
                timeout: None,
            })
            .map(drop)
            .map_err(|e| errors::from_poll(what, e))
    }

    /// Blocks until the submission `index` has finished and `done`, which a callback of that
    /// submission sets, is set. The callbacks of a finished submission run on the thread that
    /// polls first, which may be another one still running them when our wait returns: then
    /// we poll until they have run.
    fn wait_flag(
        &self,
        what: &str,
        index: wgpu::SubmissionIndex,
        done: &AtomicBool,
    ) -> Result<(), DeviceError> {
        if done.load(Ordering::Acquire) {
            return Ok(());
        }
        self.wait_index(what, index)?;
        let deadline = Instant::now() + CALLBACK_WAIT;
        while !done.load(Ordering::Acquire) {
            if Instant::now() > deadline {
                return Err(errors::driver(
                    codes::POLL,
                    "CallbackTimeout",
                    format!("{what}: a finished submission's callback did not run within {CALLBACK_WAIT:?}"),
                ));
            }
            self.device
                .poll(wgpu::PollType::Poll)
                .map_err(|e| errors::from_poll(what, e))?;
            std::thread::yield_now();
        }
        Ok(())
    }

    /// Submits an empty batch (flushing queued buffer writes) and returns its index.
    fn submit_marker(&self, what: &str) -> Result<wgpu::SubmissionIndex, DeviceError> {
        self.scoped(what, || self.queue.submit([]))
    }

    /// Makes an event of the submission `index`, the latest submitted: it completes when the
    /// queue has finished it.
    fn event_after(&self, index: wgpu::SubmissionIndex) -> EventId {
        let done = Arc::new(AtomicBool::new(false));
        let flag = done.clone();
        // Fires once the latest submission, `index` or a later one, has finished.
        self.queue
            .on_submitted_work_done(move || flag.store(true, Ordering::Release));
        self.new_event(index, done, None)
    }

    /// Makes an event of the submission `index` that completes once `done` is set (by a
    /// callback of that submission), and then runs `on_complete` once.
    fn new_event(
        &self,
        index: wgpu::SubmissionIndex,
        done: Arc<AtomicBool>,
        on_complete: Option<Box<dyn FnOnce() -> Result<(), DeviceError> + Send>>,
    ) -> EventId {
        let mut state = self.lock();
        let id = state.next_event;
        state.next_event += 1;
        state.events.insert(
            id,
            Event {
                index,
                done,
                on_complete,
            },
        );
        EventId(id)
    }

    fn event(
        &self,
        event: EventId,
    ) -> Result<(wgpu::SubmissionIndex, Arc<AtomicBool>), DeviceError> {
        let state = self.lock();
        let e = state
            .events
            .get(&event.0)
            .ok_or(DeviceError::UnknownHandle {
                kind: "event",
                id: event.0,
            })?;
        Ok((e.index.clone(), e.done.clone()))
    }

    /// Runs the event's completion work, if it has not run yet. The event has completed.
    fn complete(&self, event: EventId) -> Result<(), DeviceError> {
        let work = self
            .lock()
            .events
            .get_mut(&event.0)
            .and_then(|e| e.on_complete.take());
        match work {
            Some(work) => work(),
            None => Ok(()),
        }
    }

    /// Copies the word-aligned `(start, len)` ranges of `buffer`, one after the other, into a
    /// new staging buffer and submits the copy; the bytes come out of [`PendingRead::finish`]
    /// once its map callback has run.
    fn read_words(
        &self,
        buffer: &wgpu::Buffer,
        ranges: &[(u64, u64)],
    ) -> Result<PendingRead, DeviceError> {
        let total: u64 = ranges.iter().map(|&(_, len)| len).sum();
        let mapped = Arc::new(Mutex::new(None));
        let ready = Arc::new(AtomicBool::new(false));
        let (slot, flag) = (mapped.clone(), ready.clone());
        let (staging, index) = self.scoped("reading device memory", || {
            let staging = self.device.create_buffer(&wgpu::BufferDescriptor {
                label: Some("gpumem readback"),
                size: total,
                usage: wgpu::BufferUsages::MAP_READ | wgpu::BufferUsages::COPY_DST,
                mapped_at_creation: false,
            });
            let mut encoder = self
                .device
                .create_command_encoder(&wgpu::CommandEncoderDescriptor::default());
            let mut at = 0;
            for &(start, len) in ranges {
                encoder.copy_buffer_to_buffer(buffer, start, &staging, at, len);
                at += len;
            }
            let index = self.queue.submit([encoder.finish()]);
            staging.map_async(wgpu::MapMode::Read, .., move |result| {
                *slot.lock().unwrap_or_else(|p| p.into_inner()) = Some(result);
                flag.store(true, Ordering::Release);
            });
            (staging, index)
        })?;
        Ok(PendingRead {
            staging,
            index,
            mapped,
            ready,
        })
    }

    /// Reads `dst.len()` bytes at offset `offset` of `buffer` (anywhere: the word-aligned
    /// range around it is read) and returns once they have arrived.
    fn read(&self, buffer: &wgpu::Buffer, offset: u64, dst: &mut [u8]) -> Result<(), DeviceError> {
        let (start, len) = word_cover(offset, dst.len() as u64);
        let pending = self.read_words(buffer, &[(start, len)])?;
        self.wait_flag(
            "reading device memory",
            pending.index.clone(),
            &pending.ready,
        )?;
        let skip = (offset - start) as usize;
        pending.finish(|bytes| dst.copy_from_slice(&bytes[skip..skip + dst.len()]))
    }

    /// Queues a write of `src` at offset `offset` of `buffer` (anywhere: partial edge words
    /// are read first and written back whole). The write reaches the device with the next
    /// submission.
    fn write(&self, buffer: &wgpu::Buffer, offset: u64, src: &[u8]) -> Result<(), DeviceError> {
        let len = src.len() as u64;
        let (start, cover) = word_cover(offset, len);
        if start == offset && cover == len {
            return self.scoped("writing device memory", || {
                self.queue.write_buffer(buffer, offset, src)
            });
        }
        let mut words = vec![0u8; cover as usize];
        let head = offset != start;
        let tail = offset + len != start + cover;
        let mut edges = Vec::new();
        if head {
            edges.push((start, WORD));
        }
        if tail && (!head || cover > WORD) {
            edges.push((start + cover - WORD, WORD));
        }
        let pending = self.read_words(buffer, &edges)?;
        self.wait_flag(
            "reading the edges of a write",
            pending.index.clone(),
            &pending.ready,
        )?;
        pending.finish(|bytes| {
            let w = WORD as usize;
            let mut at = 0;
            if head {
                words[..w].copy_from_slice(&bytes[..w]);
                at = w;
            }
            if at < bytes.len() {
                let end = words.len();
                words[end - w..].copy_from_slice(&bytes[at..at + w]);
            }
        })?;
        let skip = (offset - start) as usize;
        words[skip..skip + src.len()].copy_from_slice(src);
        self.scoped("writing device memory", || {
            self.queue.write_buffer(buffer, start, &words)
        })
    }

    /// Queues a device-to-device copy when wgpu can do it on the device (offsets and length
    /// in whole words) and returns its submission; `None` when it cannot (the caller goes
    /// through host memory).
    fn enqueue_device_copy(
        &self,
        dst: &BufferRange,
        src: &BufferRange,
    ) -> Result<Option<wgpu::SubmissionIndex>, DeviceError> {
        let len = src.size;
        if !(src.offset.is_multiple_of(WORD)
            && dst.offset.is_multiple_of(WORD)
            && len.is_multiple_of(WORD))
        {
            return Ok(None);
        }
        self.scoped("copying on the device", || {
            let mut encoder = self
                .device
                .create_command_encoder(&wgpu::CommandEncoderDescriptor::default());
            let temporary = if src.base == dst.base {
                // wgpu does not copy within one buffer; this also makes overlapping ranges
                // copy as if through a temporary, like memmove.
                let temporary = self.device.create_buffer(&wgpu::BufferDescriptor {
                    label: Some("gpumem copy"),
                    size: len,
                    usage: wgpu::BufferUsages::COPY_SRC | wgpu::BufferUsages::COPY_DST,
                    mapped_at_creation: false,
                });
                encoder.copy_buffer_to_buffer(&src.buffer, src.offset, &temporary, 0, len);
                encoder.copy_buffer_to_buffer(&temporary, 0, &dst.buffer, dst.offset, len);
                Some(temporary)
            } else {
                encoder.copy_buffer_to_buffer(
                    &src.buffer,
                    src.offset,
                    &dst.buffer,
                    dst.offset,
                    len,
                );
                None
            };
            let index = self.queue.submit([encoder.finish()]);
            // Freed once the copy has finished.
            drop(temporary);
            Some(index)
        })
    }
}

/// The whole words around `[offset, offset + len)`: their start and length.
fn word_cover(offset: u64, len: u64) -> (u64, u64) {
    let start = offset - offset % WORD;
    let end = (offset + len).next_multiple_of(WORD);
    (start, end - start)
}

impl Device for WgpuDevice {
    /// `"wgpu:<backend> (<adapter>)"`, e.g. `"wgpu:vulkan (llvmpipe (LLVM 15.0.6, 256 bits))"`.
    fn name(&self) -> String {
        format!("wgpu:{} ({})", self.info.backend.to_str(), self.info.name)
    }

    /// [`WgpuDevice::memory`]'s figures; see [`MemorySource`] for where they come from.
    fn mem_info(&self) -> Result<MemInfo, DeviceError> {
        Ok(self.memory().info)
    }

    /// Creates a storage buffer of `size` bytes (rounded up to whole 4-byte words) and places
    /// it in the address space.
    fn malloc(&self, size: u64) -> Result<DevicePtr, DeviceError> {
        if size == 0 {
            return Err(DeviceError::InvalidValue("malloc of 0 bytes".into()));
        }
        let max = self.limits.max_buffer_size;
        let padded = size.checked_next_multiple_of(WORD).unwrap_or(u64::MAX);
        if padded > max {
            return Err(DeviceError::InvalidValue(format!(
                "{size} bytes exceed the adapter's max_buffer_size limit of {max} bytes \
                 (the largest wgpu buffer) on {}",
                self.name()
            )));
        }
        let mut state = self.lock();
        let info = |allocated: u64| self.memory_with(allocated).info;
        if let Some(limit) = self.memory_limit {
            if padded > limit.saturating_sub(state.allocated) {
                return Err(DeviceError::out_of_memory(
                    size,
                    Some(info(state.allocated)),
                ));
            }
        }
        let created = self.scoped("creating a buffer", || {
            self.device.create_buffer(&wgpu::BufferDescriptor {
                label: None,
                size: padded,
                usage: wgpu::BufferUsages::STORAGE
                    | wgpu::BufferUsages::COPY_SRC
                    | wgpu::BufferUsages::COPY_DST,
                mapped_at_creation: false,
            })
        });
        let buffer = match created {
            Ok(buffer) => buffer,
            Err(mut e) => {
                if let DeviceError::OutOfMemory {
                    requested, info: i, ..
                } = &mut e
                {
                    *requested = Some(size);
                    *i = Some(info(state.allocated));
                }
                return Err(e);
            }
        };
        match state.space.insert(size, Allocation { buffer }) {
            Ok(ptr) => {
                state.allocated += padded;
                Ok(ptr)
            }
            Err(Allocation { buffer }) => {
                buffer.destroy();
                Err(DeviceError::out_of_memory(
                    size,
                    Some(info(state.allocated)),
                ))
            }
        }
    }

    /// Destroys the buffer `malloc` returned `ptr` for. Work already submitted that uses it
    /// still completes (wgpu frees the memory after it).
    fn free(&self, ptr: DevicePtr) -> Result<(), DeviceError> {
        let mut state = self.lock();
        match state.space.remove(ptr) {
            Some((_, Allocation { buffer })) => {
                state.allocated -= buffer.size();
                drop(state);
                buffer.destroy();
                Ok(())
            }
            None => {
                let what = if state.space.contains(ptr) {
                    "inside an allocation, not its start"
                } else {
                    "not a live allocation of this device"
                };
                Err(DeviceError::InvalidAddress {
                    ptr,
                    what: what.into(),
                })
            }
        }
    }

    /// Submits an empty batch on the queue (any `stream` names the queue) and returns its
    /// submission as the event.
    fn record_event(&self, stream: StreamId) -> Result<EventId, DeviceError> {
        let _ = stream;
        let index = self.submit_marker("recording an event")?;
        Ok(self.event_after(index))
    }

    /// Polls the device without blocking and tells whether the event's submission has
    /// finished.
    fn event_completed(&self, event: EventId) -> Result<bool, DeviceError> {
        let (_, done) = self.event(event)?;
        if !done.load(Ordering::Acquire) {
            self.device
                .poll(wgpu::PollType::Poll)
                .map_err(|e| errors::from_poll("querying an event", e))?;
        }
        if done.load(Ordering::Acquire) {
            self.complete(event)?;
            return Ok(true);
        }
        Ok(false)
    }

    fn wait_event(&self, event: EventId) -> Result<(), DeviceError> {
        let (index, done) = self.event(event)?;
        self.wait_flag("waiting for an event", index, &done)?;
        self.complete(event)
    }

    fn destroy_event(&self, event: EventId) -> Result<(), DeviceError> {
        self.lock()
            .events
            .remove(&event.0)
            .map(drop)
            .ok_or(DeviceError::UnknownHandle {
                kind: "event",
                id: event.0,
            })
    }

    /// The queue is the only stream: waits for all submitted work.
    fn synchronize_stream(&self, stream: StreamId) -> Result<(), DeviceError> {
        let _ = stream;
        self.synchronize()
    }

    fn synchronize(&self) -> Result<(), DeviceError> {
        let index = self.submit_marker("synchronizing")?;
        self.wait_index("synchronizing", index)
    }

    fn copy_to_device(
        &self,
        dst: DevicePtr,
        src: &[u8],
        stream: StreamId,
    ) -> Result<(), DeviceError> {
        let _ = stream;
        if src.is_empty() {
            return Ok(());
        }
        let range = self.locate(dst, src.len() as u64)?;
        self.write(&range.buffer, range.offset, src)?;
        let index = self.submit_marker("copying to the device")?;
        self.wait_index("copying to the device", index)
    }

    fn copy_to_host(
        &self,
        dst: &mut [u8],
        src: DevicePtr,
        stream: StreamId,
    ) -> Result<(), DeviceError> {
        let _ = stream;
        if dst.is_empty() {
            return Ok(());
        }
        let range = self.locate(src, dst.len() as u64)?;
        self.read(&range.buffer, range.offset, dst)
    }

    fn copy_on_device(
        &self,
        dst: DevicePtr,
        src: DevicePtr,
        len: u64,
        stream: StreamId,
    ) -> Result<(), DeviceError> {
        let _ = stream;
        if len == 0 {
            return Ok(());
        }
        let (s, d) = (self.locate(src, len)?, self.locate(dst, len)?);
        match self.enqueue_device_copy(&d, &s)? {
            Some(index) => self.wait_index("copying on the device", index),
            None => {
                let mut staging = vec![0u8; len as usize];
                self.read(&s.buffer, s.offset, &mut staging)?;
                self.write(&d.buffer, d.offset, &staging)?;
                let index = self.submit_marker("copying on the device")?;
                self.wait_index("copying on the device", index)
            }
        }
    }

    /// Queues the write (wgpu stages the bytes at once) and returns with the buffer held
    /// until the write's submission has finished.
    fn copy_to_device_async(
        &self,
        dst: DevicePtr,
        src: PinnedBuffer,
        stream: StreamId,
    ) -> Result<InFlight<'_, PinnedBuffer>, DeviceError> {
        let _ = stream;
        if src.is_empty() {
            return Ok(InFlight::completed(src));
        }
        let range = self.locate(dst, src.len() as u64)?;
        self.write(&range.buffer, range.offset, &src)?;
        let index = self.submit_marker("copying to the device")?;
        let event = self.event_after(index);
        Ok(InFlight::pending(self, event, src))
    }

    /// Queues a copy into a staging buffer; the returned buffer (wrapping `dst`) shows the
    /// bytes once the copy's event has completed, which is when the [`InFlight`] gives it
    /// back.
    fn copy_to_host_async(
        &self,
        dst: PinnedBuffer,
        src: DevicePtr,
        stream: StreamId,
    ) -> Result<InFlight<'_, PinnedBuffer>, DeviceError> {
        let _ = stream;
        let len = dst.len() as u64;
        if len == 0 {
            return Ok(InFlight::completed(dst));
        }
        let range = self.locate(src, len)?;
        let (start, cover) = word_cover(range.offset, len);
        let pending = self.read_words(&range.buffer, &[(start, cover)])?;
        let (index, done) = (pending.index.clone(), pending.ready.clone());
        let skip = (range.offset - start) as usize;
        let (storage, arrived) = Readback::new(dst);
        let take = move || {
            pending.finish(|bytes| {
                let _ = arrived.set(bytes[skip..skip + len as usize].to_vec());
            })
        };
        let event = self.new_event(index, done, Some(Box::new(take)));
        Ok(InFlight::pending(
            self,
            event,
            PinnedBuffer::new(Box::new(storage)),
        ))
    }

    fn copy_on_device_async(
        &self,
        dst: DevicePtr,
        src: DevicePtr,
        len: u64,
        stream: StreamId,
    ) -> Result<EventId, DeviceError> {
        if len > 0 {
            let (s, d) = (self.locate(src, len)?, self.locate(dst, len)?);
            if let Some(index) = self.enqueue_device_copy(&d, &s)? {
                return Ok(self.event_after(index));
            }
        }
        self.copy_on_device(dst, src, len, stream)?;
        self.record_event(stream)
    }
}

impl std::fmt::Debug for WgpuDevice {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("WgpuDevice")
            .field("name", &self.name())
            .field("total", &self.total)
            .field("allocated", &self.allocated())
            .finish_non_exhaustive()
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn word_cover_spans_the_partial_words() {
        assert_eq!(word_cover(0, 8), (0, 8));
        assert_eq!(word_cover(1, 2), (0, 4));
        assert_eq!(word_cover(3, 2), (0, 8));
        assert_eq!(word_cover(4, 1), (4, 4));
        assert_eq!(word_cover(6, 7), (4, 12));
    }
}
