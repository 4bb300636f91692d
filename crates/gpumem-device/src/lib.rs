//! The device abstraction under every gpumem pool.
//!
//! A pool needs few things from a GPU: raw allocations (`cudaMalloc`-like), the free and total
//! memory, optionally the virtual-memory calls that expandable segments and page stitching are
//! built on (reserve address space; create, map and unmap physical chunks of a fixed
//! granularity), streams with events so that a block freed while another stream still uses it
//! is reused only once that stream has passed the recorded event, and copies between host and
//! device. [`Device`] and [`VirtualMemory`] say exactly that, and backends implement them side
//! by side: [`sim`] (host-backed or address-only, always available) and, behind features, real
//! GPUs.
//!
//! # A small core, capabilities with defaults
//!
//! A backend must implement only memory: [`Device::name`], [`Device::mem_info`],
//! [`Device::malloc`] and [`Device::free`]. Everything else is a capability:
//!
//! - **Virtual memory** is reached through [`Device::vmm`], `None` by default. Its absence
//!   changes what a caller does (a policy picks another layout), so it is an optional
//!   capability object that callers test for.
//! - **Streams and events** default to a device that runs all work in order, as it is issued:
//!   there is one queue, every event has completed when it is recorded, and waiting does
//!   nothing. Each default method says exactly what it does. Callers never need to ask whether
//!   streams exist; on such a device their code is simply correct. A backend with a single
//!   queue overrides only the events (wgpu: the queue is the stream, a submission index the
//!   event).
//! - **Transfers**: the synchronous copies ([`Device::copy_to_device`],
//!   [`Device::copy_to_host`], [`Device::copy_on_device`]) fail with
//!   [`DeviceError::Unsupported`] by default. The asynchronous ones default to the synchronous
//!   copy and an already-completed result, so a backend that implements the synchronous copies
//!   has working asynchronous ones too, and a backend with real copy engines overrides both.
//!   (The synchronous copies are the primitives because the reverse, synchronous defaults over
//!   asynchronous ones, would make a backend with neither recurse forever.)
//!
//! These capabilities are default methods on the one [`Device`] trait rather than separate
//! traits: they have a correct degenerate behaviour, so callers never branch on them, and one
//! trait keeps `Arc<dyn Device>` the single handle every caller holds (no casting between
//! trait objects, no empty `impl` blocks in backends). Only VMM, which has no such
//! behaviour, is a separate trait.
//!
//! # Asynchronous copies
//!
//! A copy between the host and the device may overlap with host work only if the host buffer
//! stays alive and untouched until the copy completes. [`Device::copy_to_device_async`] and
//! [`Device::copy_to_host_async`] therefore take a [`PinnedBuffer`] by value and return an
//! [`InFlight`] that gives it back only after the copy's event has completed (and waits in its
//! destructor), so safe code cannot free or touch a buffer under a running copy.
//! [`Device::alloc_pinned`] allocates such buffers, page-locked where the backend can.
//!
//! # Errors
//!
//! Every backend maps its own errors through [`DeviceError::from_backend`], which keeps the
//! backend's code ([`BackendCode`]) and files its out-of-memory codes under
//! [`DeviceError::OutOfMemory`]; [`DeviceError::is_out_of_memory`] is the one place that
//! decides whether an error means "out of memory".

#![deny(unsafe_code)]
#![warn(missing_docs)]

pub mod address_map;
mod error;
pub mod hazards;
mod in_flight;
mod pinned;
pub mod sim;
pub mod vmm_ledger;

pub use address_map::{AddressMap, AddressSet};
pub use error::{BackendCode, DeviceError};
pub use hazards::{Hazard, HazardChecker, HazardKind};
pub use in_flight::InFlight;
pub use pinned::{HostStorage, PinnedBuffer};

/// A device address. Plain integer so that address-only simulations, traces and real pointers
/// share one representation.
pub type DevicePtr = u64;

/// A stream of work on the device. `StreamId::DEFAULT` (0) is the legacy default stream, the
/// same value PyTorch snapshots and RMM logs use for it.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash, PartialOrd, Ord, Default)]
pub struct StreamId(pub u64);

impl StreamId {
    /// The default stream.
    pub const DEFAULT: StreamId = StreamId(0);
}

/// A marker recorded on a stream; it completes once the stream has finished the work queued
/// before it.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash, PartialOrd, Ord)]
pub struct EventId(pub u64);

/// A chunk of physical device memory created through [`VirtualMemory::create_physical`].
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash, PartialOrd, Ord)]
pub struct PhysicalHandle(pub u64);

/// Free and total device memory, as `cudaMemGetInfo` reports them.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Default)]
pub struct MemInfo {
    /// Bytes the device can still hand out.
    pub free: u64,
    /// Bytes the device has in all.
    pub total: u64,
}

/// Where managed (unified) memory should be: the hint of [`Device::prefetch_managed`] and
/// [`ManagedAdvice`].
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash)]
pub enum MemoryLocation {
    /// The device's own memory.
    Device,
    /// Host memory.
    Host,
}

/// Advice about how managed memory is used (`cuMemAdvise`), so that the driver places and
/// migrates it well. Advice never changes what a program computes.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash)]
pub enum ManagedAdvice {
    /// Mostly read: the driver may keep read-only copies where it is read.
    ReadMostly,
    /// Keep the memory at this location where possible.
    PreferredLocation(MemoryLocation),
    /// This location accesses the memory: map it there to avoid faults.
    AccessedBy(MemoryLocation),
}

/// What a memory pool needs from a GPU.
///
/// Only the memory methods are required; streams, events and transfers have defaults that
/// describe an in-order, synchronous device without copies (see the [crate] documentation).
/// All methods take `&self`: backends synchronise internally so that one device can be shared
/// by several pools and threads (`Arc<dyn Device>`).
pub trait Device: Send + Sync {
    /// A human name for messages, e.g. `"sim (24.00 GiB, host-backed)"`.
    fn name(&self) -> String;
    /// Free and total memory right now.
    fn mem_info(&self) -> Result<MemInfo, DeviceError>;
    /// Allocates `size` bytes of device memory (one `cudaMalloc`). `size` must be non-zero.
    fn malloc(&self, size: u64) -> Result<DevicePtr, DeviceError>;
    /// Frees memory from [`Device::malloc`]; `ptr` must be the exact pointer it returned.
    fn free(&self, ptr: DevicePtr) -> Result<(), DeviceError>;

    /// The virtual-memory operations, when the device supports them. Default: `None`.
    fn vmm(&self) -> Option<&dyn VirtualMemory> {
        None
    }

    /// Creates a new stream.
    ///
    /// Default: returns [`StreamId::DEFAULT`]. A device that runs everything in order has one
    /// queue, and a "new" stream is that queue; returning it (rather than an error) lets
    /// stream-aware callers run unchanged.
    fn create_stream(&self) -> Result<StreamId, DeviceError> {
        Ok(StreamId::DEFAULT)
    }

    /// Destroys a stream made by [`Device::create_stream`]; work queued on it still
    /// completes. The default stream cannot be destroyed.
    ///
    /// Default: does nothing; the default streams are all the one queue.
    fn destroy_stream(&self, stream: StreamId) -> Result<(), DeviceError> {
        let _ = stream;
        Ok(())
    }

    /// Records an event on `stream` after the work queued so far.
    ///
    /// Default: returns `EventId(0)` for any stream. All work has finished by the time it is
    /// issued, so every event has already completed and they are all the same event. The
    /// defaults keep no state and accept any stream or event id.
    fn record_event(&self, stream: StreamId) -> Result<EventId, DeviceError> {
        let _ = stream;
        Ok(EventId(0))
    }

    /// Whether `event` has completed (`cudaEventQuery`). The event stays valid.
    ///
    /// Default: `true`, since all work has finished when it is issued.
    fn event_completed(&self, event: EventId) -> Result<bool, DeviceError> {
        let _ = event;
        Ok(true)
    }

    /// Blocks until `event` has completed (`cudaEventSynchronize`).
    ///
    /// Default: returns at once; the event has completed.
    fn wait_event(&self, event: EventId) -> Result<(), DeviceError> {
        let _ = event;
        Ok(())
    }

    /// Makes work issued to `stream` from now on wait until `event` has completed, without
    /// blocking the host (`cuStreamWaitEvent`): how work on one stream is ordered after work
    /// on another, e.g. compute after an upload on a copy stream.
    ///
    /// Default: blocks the host until `event` has completed ([`Device::wait_event`]), which
    /// orders the work as well, with less overlap.
    fn stream_wait_event(&self, stream: StreamId, event: EventId) -> Result<(), DeviceError> {
        let _ = stream;
        self.wait_event(event)
    }

    /// Returns the event to the backend; its id must not be used again.
    ///
    /// Default: does nothing; the default events hold no resources.
    fn destroy_event(&self, event: EventId) -> Result<(), DeviceError> {
        let _ = event;
        Ok(())
    }

    /// Blocks until all work on `stream` has finished.
    ///
    /// Default: returns at once; there is no unfinished work.
    fn synchronize_stream(&self, stream: StreamId) -> Result<(), DeviceError> {
        let _ = stream;
        Ok(())
    }

    /// Blocks until all work on every stream has finished.
    ///
    /// Default: returns at once; there is no unfinished work.
    fn synchronize(&self) -> Result<(), DeviceError> {
        Ok(())
    }

    /// Copies host bytes to device memory at `dst`, after the work queued on `stream`, and
    /// returns once they have arrived.
    ///
    /// Default: [`DeviceError::Unsupported`].
    fn copy_to_device(
        &self,
        dst: DevicePtr,
        src: &[u8],
        stream: StreamId,
    ) -> Result<(), DeviceError> {
        let _ = (dst, src, stream);
        Err(DeviceError::unsupported(self.name(), "copy to device"))
    }

    /// Copies device memory at `src` into host bytes, after the work queued on `stream`, and
    /// returns once they have arrived.
    ///
    /// Default: [`DeviceError::Unsupported`].
    fn copy_to_host(
        &self,
        dst: &mut [u8],
        src: DevicePtr,
        stream: StreamId,
    ) -> Result<(), DeviceError> {
        let _ = (dst, src, stream);
        Err(DeviceError::unsupported(self.name(), "copy to host"))
    }

    /// Copies `len` bytes between two device addresses, after the work queued on `stream`,
    /// and returns once they have arrived.
    ///
    /// Default: [`DeviceError::Unsupported`].
    fn copy_on_device(
        &self,
        dst: DevicePtr,
        src: DevicePtr,
        len: u64,
        stream: StreamId,
    ) -> Result<(), DeviceError> {
        let _ = (dst, src, len, stream);
        Err(DeviceError::unsupported(self.name(), "copy on device"))
    }

    /// Allocates `len` zeroed bytes of host memory for transfers, page-locked where the
    /// backend can (`cuMemHostAlloc`), so that copies from and to it can overlap with host
    /// work.
    ///
    /// Default: ordinary host memory ([`PinnedBuffer::pageable`]), which reports
    /// [`PinnedBuffer::is_page_locked`] as `false`.
    fn alloc_pinned(&self, len: usize) -> Result<PinnedBuffer, DeviceError> {
        Ok(PinnedBuffer::pageable(len))
    }

    /// Allocates `size` bytes of managed (unified) memory, which the host and the device both
    /// address and the driver migrates on demand (`cuMemAllocManaged`). Free it with
    /// [`Device::free_managed`]; copies to and from it work as for device memory.
    ///
    /// Default: [`DeviceError::Unsupported`].
    fn alloc_managed(&self, size: u64) -> Result<DevicePtr, DeviceError> {
        let _ = size;
        Err(DeviceError::unsupported(self.name(), "managed memory"))
    }

    /// Frees memory from [`Device::alloc_managed`].
    ///
    /// Default: [`DeviceError::Unsupported`].
    fn free_managed(&self, ptr: DevicePtr) -> Result<(), DeviceError> {
        let _ = ptr;
        Err(DeviceError::unsupported(self.name(), "managed memory"))
    }

    /// Starts migrating `len` bytes of managed memory at `ptr` to `to`, on `stream`
    /// (`cuMemPrefetchAsync`): a hint that spares the faults of on-demand migration.
    ///
    /// Default: [`DeviceError::Unsupported`].
    fn prefetch_managed(
        &self,
        ptr: DevicePtr,
        len: u64,
        to: MemoryLocation,
        stream: StreamId,
    ) -> Result<(), DeviceError> {
        let _ = (ptr, len, to, stream);
        Err(DeviceError::unsupported(self.name(), "managed memory"))
    }

    /// Gives `advice` about `len` bytes of managed memory at `ptr` (`cuMemAdvise`).
    ///
    /// Default: [`DeviceError::Unsupported`].
    fn advise_managed(
        &self,
        ptr: DevicePtr,
        len: u64,
        advice: ManagedAdvice,
    ) -> Result<(), DeviceError> {
        let _ = (ptr, len, advice);
        Err(DeviceError::unsupported(self.name(), "managed memory"))
    }

    /// Enqueues a copy of all of `src` to device memory at `dst` on `stream` and returns at
    /// once; the buffer comes back through the [`InFlight`] once the copy has completed.
    ///
    /// An implementation records an event after the copy and returns
    /// [`InFlight::pending`]. If it fails after the copy was enqueued, it waits for the copy
    /// before returning the error, since the error drops the buffer.
    ///
    /// Default: [`Device::copy_to_device`], then an already-completed [`InFlight`].
    fn copy_to_device_async(
        &self,
        dst: DevicePtr,
        src: PinnedBuffer,
        stream: StreamId,
    ) -> Result<InFlight<'_, PinnedBuffer>, DeviceError> {
        self.copy_to_device(dst, &src, stream)?;
        Ok(InFlight::completed(src))
    }

    /// Enqueues a copy of `dst.len()` bytes of device memory at `src` into `dst` on `stream`
    /// and returns at once; the buffer comes back, filled, through the [`InFlight`] once the
    /// copy has completed. Errors as for [`Device::copy_to_device_async`].
    ///
    /// Default: [`Device::copy_to_host`], then an already-completed [`InFlight`].
    fn copy_to_host_async(
        &self,
        mut dst: PinnedBuffer,
        src: DevicePtr,
        stream: StreamId,
    ) -> Result<InFlight<'_, PinnedBuffer>, DeviceError> {
        self.copy_to_host(&mut dst, src, stream)?;
        Ok(InFlight::completed(dst))
    }

    /// Enqueues a copy of `len` bytes between two device addresses on `stream` and returns an
    /// event that completes with the copy; the caller destroys it
    /// ([`Device::destroy_event`]).
    ///
    /// Default: [`Device::copy_on_device`], then [`Device::record_event`] on `stream`.
    fn copy_on_device_async(
        &self,
        dst: DevicePtr,
        src: DevicePtr,
        len: u64,
        stream: StreamId,
    ) -> Result<EventId, DeviceError> {
        self.copy_on_device(dst, src, len, stream)?;
        self.record_event(stream)
    }
}

/// The CUDA virtual-memory-management calls (`cuMemAddressReserve`, `cuMemCreate`, `cuMemMap`,
/// `cuMemUnmap`, `cuMemRelease`) that expandable segments and page stitching need.
///
/// Physical chunks are created in multiples of [`VirtualMemory::granularity`] and mapped whole
/// at granularity-aligned addresses inside a reservation. A chunk may be mapped at several
/// addresses at once; its memory is returned once it is released and no longer mapped.
pub trait VirtualMemory: Send + Sync {
    /// The size and alignment unit of physical chunks (2 MiB on current NVIDIA GPUs).
    fn granularity(&self) -> u64;
    /// Reserves `size` bytes of address space (no memory behind it).
    fn reserve(&self, size: u64) -> Result<DevicePtr, DeviceError>;
    /// Returns a reservation; nothing may still be mapped inside it.
    fn release_reservation(&self, ptr: DevicePtr, size: u64) -> Result<(), DeviceError>;
    /// Creates a physical chunk of `size` bytes (a multiple of the granularity).
    fn create_physical(&self, size: u64) -> Result<PhysicalHandle, DeviceError>;
    /// Drops the handle; the memory goes back once every mapping of it is gone.
    fn release_physical(&self, handle: PhysicalHandle) -> Result<(), DeviceError>;
    /// Maps the whole chunk at `ptr` (inside a reservation) and makes it accessible.
    fn map(&self, ptr: DevicePtr, handle: PhysicalHandle) -> Result<(), DeviceError>;
    /// Unmaps `[ptr, ptr + size)`, which must cover whole mappings.
    fn unmap(&self, ptr: DevicePtr, size: u64) -> Result<(), DeviceError>;
}
