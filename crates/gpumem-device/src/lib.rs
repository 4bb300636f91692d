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

#![deny(unsafe_code)]

pub mod address_map;
mod error;
pub mod sim;

pub use address_map::{AddressMap, AddressSet};
pub use error::{BackendCode, DeviceError};

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

/// What a memory pool needs from a GPU.
///
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
    /// The virtual-memory operations, when the device supports them.
    fn vmm(&self) -> Option<&dyn VirtualMemory>;
    /// Creates a new stream.
    fn create_stream(&self) -> Result<StreamId, DeviceError>;
    /// Records an event on `stream` after the work queued so far.
    fn record_event(&self, stream: StreamId) -> Result<EventId, DeviceError>;
    /// Whether `event` has completed (`cudaEventQuery`). The event stays valid.
    fn event_completed(&self, event: EventId) -> Result<bool, DeviceError>;
    /// Blocks until `event` has completed (`cudaEventSynchronize`).
    fn wait_event(&self, event: EventId) -> Result<(), DeviceError>;
    /// Returns the event to the backend; its id must not be used again.
    fn destroy_event(&self, event: EventId) -> Result<(), DeviceError>;
    /// Blocks until all work on `stream` has finished.
    fn synchronize_stream(&self, stream: StreamId) -> Result<(), DeviceError>;
    /// Blocks until all work on every stream has finished.
    fn synchronize(&self) -> Result<(), DeviceError>;
    /// Copies host bytes to device memory at `dst`.
    fn copy_to_device(
        &self,
        dst: DevicePtr,
        src: &[u8],
        stream: StreamId,
    ) -> Result<(), DeviceError>;
    /// Copies device memory at `src` into host bytes.
    fn copy_to_host(
        &self,
        dst: &mut [u8],
        src: DevicePtr,
        stream: StreamId,
    ) -> Result<(), DeviceError>;
    /// Copies `len` bytes between two device addresses.
    fn copy_on_device(
        &self,
        dst: DevicePtr,
        src: DevicePtr,
        len: u64,
        stream: StreamId,
    ) -> Result<(), DeviceError>;
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
