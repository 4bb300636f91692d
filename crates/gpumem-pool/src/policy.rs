//! The contract between the pool and its placement policies.
//!
//! The pool ([`crate::Pool`]) owns everything that is the same for every policy: the table of
//! live blocks, block-level statistics, cross-stream frees that wait on events, the
//! reclaim-and-retry sequence on out-of-memory, limits, history and the OOM explanation. A
//! [`Policy`] owns only placement: which cached block serves a request, when to grow, how to
//! split and coalesce, what to give back. It reaches the device through an [`Upstream`], which
//! layers the hard limit, segment statistics, device-call counts and history over the raw
//! device, the way RMM stacks adaptors over an upstream resource.

use gpumem_device::{Device, DeviceError, DevicePtr, EventId, PhysicalHandle, StreamId};

use crate::events::EventSink;
use crate::stats::{MemoryStats, SizeClass};
use gpumem_snapshot::{Action, SettingValue};

/// A request as the pool hands it to a policy.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct AllocRequest {
    /// Bytes asked for by the user (non-zero).
    pub size: u64,
    /// The stream the block will be used on.
    pub stream: StreamId,
}

/// A block handed out by a policy.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct Block {
    /// Device address of the block.
    pub addr: DevicePtr,
    /// Bytes the block occupies (after the policy's rounding); at least the request.
    pub size: u64,
    /// Bytes the user asked for.
    pub requested: u64,
    /// Stream it was allocated on.
    pub stream: StreamId,
    /// The size class it is accounted to in statistics.
    pub size_class: SizeClass,
    /// The policy's own reference to the block (an index node, a slab slot), opaque to the
    /// pool and handed back to [`Policy::free`]: with it a policy finds the block without an
    /// address lookup of its own, so each operation pays for one address table, the pool's.
    pub handle: BlockHandle,
}

/// A policy's own name for a block it handed out (an index node, a slab slot, an allocation
/// number): opaque to the pool, which stores it beside the block and gives it back on free.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash)]
pub struct BlockHandle(u64);

impl BlockHandle {
    /// Wraps a policy's raw reference.
    pub const fn new(raw: u64) -> Self {
        BlockHandle(raw)
    }

    /// The raw reference the policy stored.
    pub const fn get(self) -> u64 {
        self.0
    }
}

/// How much cached memory [`Policy::release_cached`] should give back.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum ReleaseTarget {
    /// Everything the policy can release (`empty_cache`).
    All,
    /// At least this many bytes if possible, preferring the oldest or least useful (soft limit,
    /// garbage collection).
    AtLeast(u64),
}

/// The policy could not serve a request even after growing as far as it is allowed to.
/// The pool then reclaims and retries, and reports an explained OOM if that fails too.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct Exhausted {
    /// Bytes the policy tried to obtain from the device last (e.g. the segment size), which
    /// the OOM message reports next to the request.
    pub attempted: u64,
    /// The last device or limit error seen.
    pub cause: UpstreamError,
}

impl Exhausted {
    /// A request of `requested` bytes that no rounding or segment can hold (its rounded size
    /// passes `u64`): the device's out-of-memory error for that size, as the pool reports it.
    pub fn too_large(requested: u64, up: &Upstream<'_>) -> Self {
        Exhausted {
            attempted: requested,
            cause: up.out_of_memory(requested),
        }
    }
}

/// A device range as a policy sees it, for snapshots, status and fragmentation.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct SegmentView {
    /// Start address.
    pub address: DevicePtr,
    /// Bytes backed by device memory.
    pub total_size: u64,
    /// Stream the segment serves.
    pub stream: StreamId,
    /// The size class it is accounted to.
    pub size_class: SizeClass,
    /// Whether it is a growable (VMM) segment.
    pub is_expandable: bool,
    /// The blocks that tile the segment, in address order.
    pub blocks: Vec<BlockView>,
}

/// A block inside a [`SegmentView`].
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct BlockView {
    /// Start address.
    pub address: DevicePtr,
    /// Bytes.
    pub size: u64,
    /// Whether the block is handed out (or waits on events) rather than cached.
    pub in_use: bool,
}

/// A placement policy: the part of a caching allocator that differs between PyTorch's,
/// expandable segments and gpumem's own design.
///
/// Invariants the pool relies on (and the property tests check):
/// - blocks handed out never overlap and lie inside device memory the policy obtained through
///   its [`Upstream`];
/// - `free` takes back exactly the blocks `allocate` returned, once each;
/// - after `release_cached(All)` with no blocks in use, the policy holds no device memory.
pub trait Policy: Send {
    /// The policy's name (`torch`, `expandable`, `gpumem`, `none`, or an outside policy's
    /// own), shown in status, OOM messages, snapshots and reports.
    fn name(&self) -> &'static str;

    /// The settings in force, as snapshot `allocator_settings` entries (PyTorch's key names
    /// where PyTorch has the setting), for snapshots and status.
    fn settings(&self) -> Vec<(String, SettingValue)> {
        Vec::new()
    }

    /// Whether freed blocks are kept for reuse; `false` for a policy that frees every block
    /// to the device at once (its status then says no pool is in use).
    fn caches(&self) -> bool {
        true
    }

    /// The size from which blocks are never split, for PyTorch's `max_split_size` statistic;
    /// `None` when the policy has no such threshold.
    fn max_split_size(&self) -> Option<u64> {
        None
    }

    /// What to try when an allocation failed although enough memory was reserved but
    /// unallocated — the fragmentation this policy leaves — for the OOM explanation.
    fn fragmentation_advice(&self) -> String {
        "free blocks that are no longer needed sooner; look at the snapshot (GPUMEM_HISTORY) \
         for long-lived small blocks between large ones"
            .to_string()
    }

    /// Serves a request from the cache or by obtaining device memory through `up`. A policy may
    /// release some of its own cache and retry the device (PyTorch frees oversize blocks, say)
    /// but must not empty the whole cache: the pool does that as its last resort. (The failure
    /// is boxed so that the result is no larger than a [`Block`]: it is returned on every
    /// allocation, and failures are rare.)
    fn allocate(
        &mut self,
        req: AllocRequest,
        up: &mut Upstream<'_>,
    ) -> Result<Block, Box<Exhausted>>;

    /// Takes back a block returned by [`Policy::allocate`] whose use is over on every stream,
    /// as it was returned (its `handle` included).
    fn free(&mut self, block: Block, up: &mut Upstream<'_>);

    /// Gives cached device memory back; returns the bytes released.
    fn release_cached(&mut self, target: ReleaseTarget, up: &mut Upstream<'_>) -> u64;

    /// The segments the policy holds, with their blocks.
    fn segments(&self) -> Vec<SegmentView>;

    /// Size of the largest cached block that could serve a request without growing.
    fn largest_free_block(&self) -> u64;

    /// Takes over `segment`, memory a process held before this policy's pool began (a trace
    /// recorded mid-process): obtains a segment of its size through `up`, places its live
    /// blocks at their offsets and caches the rest as this policy would have left it. Returns
    /// the live blocks, in the order of `segment.blocks`, which the pool then holds as live
    /// allocations. Nothing is obtained when the layout is refused. By default a policy
    /// cannot ([`crate::AdoptError::Unsupported`]), and the caller allocates the
    /// blocks instead.
    fn adopt_segment(
        &mut self,
        _segment: &crate::adopt::SegmentToAdopt,
        _up: &mut Upstream<'_>,
    ) -> Result<Vec<Block>, crate::adopt::AdoptError> {
        Err(crate::adopt::AdoptError::Unsupported {
            policy: self.name(),
            what: "segments held before it began: it lays memory out its own way",
        })
    }
}

/// Why the upstream refused device memory.
#[derive(Clone, Debug, PartialEq, Eq, thiserror::Error)]
pub enum UpstreamError {
    /// The pool's hard limit would be exceeded.
    #[error("the hard limit of {limit} bytes would be exceeded ({reserved} reserved, {requested} more requested)")]
    OverLimit {
        /// The limit in bytes.
        limit: u64,
        /// Bytes reserved now.
        reserved: u64,
        /// Bytes asked for.
        requested: u64,
    },
    /// The device refused.
    #[error(transparent)]
    Device(#[from] DeviceError),
}

impl UpstreamError {
    /// Whether this refusal means "no memory now" (the limit, or the device out of memory),
    /// so that freeing idle memory and retrying may help, rather than a device fault.
    pub fn is_out_of_memory(&self) -> bool {
        match self {
            UpstreamError::OverLimit { .. } => true,
            UpstreamError::Device(e) => e.is_out_of_memory(),
        }
    }
}

/// The streams on which memory was handed back to the policy since the host last saw that
/// stream's work complete.
///
/// The pool returns a freed block to its policy at once, as PyTorch does: the block's own
/// stream may reuse it straight away, since that stream runs its work in order. But the work
/// queued before the free may still be running, so the block's memory must not be unmapped,
/// released or lent to another stream until the host has seen that work complete (a
/// synchronisation) or the other stream has been ordered after it (an event). A stream listed
/// here may have such work; one that is not has none.
#[derive(Debug, Default)]
pub struct FreedInFlight {
    streams: Vec<StreamId>,
}

impl FreedInFlight {
    /// A block of `stream` was handed back to the policy.
    pub fn freed_on(&mut self, stream: StreamId) {
        if !self.streams.contains(&stream) {
            self.streams.push(stream);
        }
    }

    /// Whether memory freed on `stream` may still be used by queued work.
    pub fn may_be_in_use(&self, stream: StreamId) -> bool {
        self.streams.contains(&stream)
    }

    /// The host has seen all work of `stream` complete.
    pub fn settled(&mut self, stream: StreamId) {
        self.streams.retain(|&s| s != stream);
    }

    /// The host has seen all work of every stream complete.
    pub fn all_settled(&mut self) {
        self.streams.clear();
    }
}

/// The device as a policy reaches it: each call checks the hard limit, updates segment and
/// reserved-bytes statistics and device-call counts, and emits the pool's segment events. Every
/// device call a policy makes goes through here, so the counts in
/// [`MemoryStats::device_calls`] are exact on every backend.
///
/// It also knows which streams may still be using memory they freed ([`FreedInFlight`]):
/// before a policy unmaps, releases or moves memory of a stream, it asks
/// [`Upstream::may_be_in_use`] and, if so, waits ([`Upstream::settle_stream`]) or orders the
/// new use after the old with an event ([`Upstream::record_event`],
/// [`Upstream::stream_wait_event`]).
pub struct Upstream<'a> {
    device: &'a dyn Device,
    hard_limit: Option<u64>,
    /// Statistics, for policies that keep policy-specific ones (inactive splits, oversize).
    pub stats: &'a mut MemoryStats,
    events: &'a mut EventSink,
    freed: &'a mut FreedInFlight,
}

impl<'a> Upstream<'a> {
    /// Layers the limit, statistics, event emission and the streams' freed memory over
    /// `device`.
    pub fn new(
        device: &'a dyn Device,
        hard_limit: Option<u64>,
        stats: &'a mut MemoryStats,
        events: &'a mut EventSink,
        freed: &'a mut FreedInFlight,
    ) -> Self {
        Upstream {
            device,
            hard_limit,
            stats,
            events,
            freed,
        }
    }

    /// Whether memory freed on `stream` may still be used by work queued before its free.
    pub fn may_be_in_use(&self, stream: StreamId) -> bool {
        self.freed.may_be_in_use(stream)
    }

    /// Waits until the work queued on `stream` has completed, if memory freed there may still
    /// be in use: what must come before unmapping or releasing that memory (unlike
    /// `cudaFree`, `cuMemUnmap` and `cuMemRelease` do not wait for the GPU).
    pub fn settle_stream(&mut self, stream: StreamId) -> Result<(), UpstreamError> {
        if self.freed.may_be_in_use(stream) {
            self.synchronize_stream(stream)?;
        }
        Ok(())
    }

    /// Waits until the work queued on `stream` has completed (`cudaStreamSynchronize`), as
    /// PyTorch does before it unmaps an expandable segment's pages; if the device cannot wait
    /// for that stream (one it does not know), waits for the whole device.
    pub fn synchronize_stream(&mut self, stream: StreamId) -> Result<(), UpstreamError> {
        self.stats.device_calls.synchronize += 1;
        if self.device.synchronize_stream(stream).is_err() {
            return self.synchronize_device();
        }
        self.freed.settled(stream);
        Ok(())
    }

    /// Waits until the work queued on every stream has completed (`cudaDeviceSynchronize`):
    /// the fallback when a stream cannot be waited for or ordered by an event.
    pub fn synchronize_device(&mut self) -> Result<(), UpstreamError> {
        self.stats.device_calls.synchronize += 1;
        self.device.synchronize()?;
        self.freed.all_settled();
        Ok(())
    }

    /// Records an event on `stream` after the work queued so far.
    pub fn record_event(&mut self, stream: StreamId) -> Result<EventId, UpstreamError> {
        self.stats.device_calls.record_event += 1;
        Ok(self.device.record_event(stream)?)
    }

    /// Makes work issued to `stream` from now on wait for `event`, without blocking the host.
    pub fn stream_wait_event(
        &mut self,
        stream: StreamId,
        event: EventId,
    ) -> Result<(), UpstreamError> {
        self.stats.device_calls.stream_wait_event += 1;
        Ok(self.device.stream_wait_event(stream, event)?)
    }

    /// Whether `event` has completed; never blocks.
    pub fn event_completed(&mut self, event: EventId) -> Result<bool, UpstreamError> {
        self.stats.device_calls.event_query += 1;
        Ok(self.device.event_completed(event)?)
    }

    /// Blocks until `event` has completed.
    pub fn wait_event(&mut self, event: EventId) -> Result<(), UpstreamError> {
        self.stats.device_calls.synchronize += 1;
        Ok(self.device.wait_event(event)?)
    }

    /// Returns an event from [`Upstream::record_event`].
    pub fn destroy_event(&mut self, event: EventId) -> Result<(), UpstreamError> {
        Ok(self.device.destroy_event(event)?)
    }

    /// The raw device, for queries (memory info, granularity).
    pub fn device(&self) -> &dyn Device {
        self.device
    }

    /// The VMM granularity, or `None` when the device has no virtual-memory support.
    pub fn granularity(&self) -> Option<u64> {
        self.device.vmm().map(|v| v.granularity())
    }

    /// The pool's hard limit in bytes, if any: PyTorch's "allowed memory" for garbage
    /// collection thresholds.
    pub fn hard_limit(&self) -> Option<u64> {
        self.hard_limit
    }

    /// Bytes reserved from the device through this pool right now.
    pub fn reserved(&self) -> u64 {
        self.stats.reserved_bytes.all.current
    }

    /// The device's out-of-memory refusal of `requested` bytes, with its free and total memory
    /// now when the device can say: for requests a policy finds impossible before it asks the
    /// device.
    pub fn out_of_memory(&self, requested: u64) -> UpstreamError {
        UpstreamError::Device(DeviceError::out_of_memory(
            requested,
            self.device.mem_info().ok(),
        ))
    }

    fn check_limit(&self, requested: u64) -> Result<(), UpstreamError> {
        match self.hard_limit {
            Some(limit) if self.reserved() + requested > limit => Err(UpstreamError::OverLimit {
                limit,
                reserved: self.reserved(),
                requested,
            }),
            _ => Ok(()),
        }
    }

    /// Allocates a new segment of `size` bytes (one `cudaMalloc`).
    pub fn malloc_segment(
        &mut self,
        size: u64,
        pool: SizeClass,
        stream: StreamId,
    ) -> Result<DevicePtr, UpstreamError> {
        self.check_limit(size)?;
        self.stats.device_calls.malloc += 1;
        let ptr = self.device.malloc(size)?;
        self.stats.num_device_alloc += 1;
        self.stats.segment.increase(pool, 1);
        self.stats.reserved_bytes.increase(pool, size);
        self.events.emit(Action::SegmentAlloc, ptr, size, stream);
        Ok(ptr)
    }

    /// Frees a segment from [`Upstream::malloc_segment`].
    pub fn free_segment(
        &mut self,
        ptr: DevicePtr,
        size: u64,
        pool: SizeClass,
        stream: StreamId,
    ) -> Result<(), UpstreamError> {
        self.stats.device_calls.free += 1;
        self.device.free(ptr)?;
        // cudaFree waits for the whole device before it frees.
        self.freed.all_settled();
        self.stats.num_device_free += 1;
        self.stats.segment.decrease(pool, 1);
        self.stats.reserved_bytes.decrease(pool, size);
        self.events.emit(Action::SegmentFree, ptr, size, stream);
        Ok(())
    }

    /// Reserves address space (no memory, no statistics).
    pub fn reserve_address(&mut self, size: u64) -> Result<DevicePtr, UpstreamError> {
        let vmm = self.vmm()?;
        self.stats.device_calls.reserve += 1;
        Ok(vmm.reserve(size)?)
    }

    /// Returns address space from [`Upstream::reserve_address`].
    pub fn release_address(&mut self, ptr: DevicePtr, size: u64) -> Result<(), UpstreamError> {
        let vmm = self.vmm()?;
        self.stats.device_calls.release_reservation += 1;
        Ok(vmm.release_reservation(ptr, size)?)
    }

    /// Creates a physical chunk of `size` bytes and maps it at `ptr`: reserved memory grows by
    /// `size`. Counts as one device allocation, as PyTorch counts a map.
    pub fn map_new(
        &mut self,
        ptr: DevicePtr,
        size: u64,
        pool: SizeClass,
        stream: StreamId,
    ) -> Result<PhysicalHandle, UpstreamError> {
        self.check_limit(size)?;
        let vmm = self.vmm()?;
        let calls = &mut self.stats.device_calls;
        calls.create_physical += 1;
        let handle = vmm.create_physical(size)?;
        calls.map += 1;
        if let Err(e) = vmm.map(ptr, handle) {
            // The chunk was never visible: give it back before reporting.
            calls.release_physical += 1;
            let _ = vmm.release_physical(handle);
            return Err(e.into());
        }
        self.stats.num_device_alloc += 1;
        self.stats.reserved_bytes.increase(pool, size);
        self.events.emit(Action::SegmentMap, ptr, size, stream);
        Ok(handle)
    }

    /// Maps an existing chunk at a second address (page stitching): no new memory.
    pub fn map_existing(
        &mut self,
        ptr: DevicePtr,
        handle: PhysicalHandle,
    ) -> Result<(), UpstreamError> {
        let vmm = self.vmm()?;
        self.stats.device_calls.map += 1;
        vmm.map(ptr, handle)?;
        self.stats.num_device_alloc += 1;
        Ok(())
    }

    /// Unmaps `[ptr, ptr+size)` without releasing the chunks behind it (they may be mapped
    /// elsewhere too).
    pub fn unmap(&mut self, ptr: DevicePtr, size: u64) -> Result<(), UpstreamError> {
        let vmm = self.vmm()?;
        self.stats.device_calls.unmap += 1;
        vmm.unmap(ptr, size)?;
        self.stats.num_device_free += 1;
        Ok(())
    }

    /// Unmaps `[ptr, ptr+size)` and releases the chunk mapped there: reserved memory shrinks
    /// by `size`. The inverse of [`Upstream::map_new`].
    pub fn unmap_release(
        &mut self,
        ptr: DevicePtr,
        size: u64,
        handle: PhysicalHandle,
        pool: SizeClass,
        stream: StreamId,
    ) -> Result<(), UpstreamError> {
        let vmm = self.vmm()?;
        self.stats.device_calls.unmap += 1;
        vmm.unmap(ptr, size)?;
        self.release_physical(handle, size, pool)?;
        self.events.emit(Action::SegmentUnmap, ptr, size, stream);
        Ok(())
    }

    /// Creates `count` physical chunks of `chunk` bytes and maps them back to back from `ptr`,
    /// as PyTorch's `map_block` does for an expandable segment: reserved memory grows by
    /// `count × chunk`, counted as one device allocation and recorded as one `segment_map`.
    /// All or nothing: on failure the chunks mapped so far are unmapped and released.
    pub fn map_new_chunks(
        &mut self,
        ptr: DevicePtr,
        chunk: u64,
        count: u64,
        pool: SizeClass,
        stream: StreamId,
    ) -> Result<Vec<PhysicalHandle>, UpstreamError> {
        let total = chunk.checked_mul(count).ok_or_else(|| {
            UpstreamError::Device(DeviceError::InvalidValue(format!(
                "{count} chunks of {chunk} bytes overflow the address space"
            )))
        })?;
        self.check_limit(total)?;
        let vmm = self.vmm()?;
        let calls = &mut self.stats.device_calls;
        let mut handles = Vec::new();
        for at in (0..count).map(|i| ptr + i * chunk) {
            calls.create_physical += 1;
            let mapped = vmm.create_physical(chunk).and_then(|handle| {
                calls.map += 1;
                vmm.map(at, handle).map(|()| handle).inspect_err(|_| {
                    calls.release_physical += 1;
                    let _ = vmm.release_physical(handle);
                })
            });
            match mapped {
                Ok(handle) => handles.push(handle),
                Err(e) => {
                    for (i, &handle) in handles.iter().enumerate() {
                        calls.unmap += 1;
                        let _ = vmm.unmap(ptr + i as u64 * chunk, chunk);
                        calls.release_physical += 1;
                        let _ = vmm.release_physical(handle);
                    }
                    return Err(e.into());
                }
            }
        }
        self.stats.num_device_alloc += 1;
        self.stats.reserved_bytes.increase(pool, total);
        self.events.emit(Action::SegmentMap, ptr, total, stream);
        Ok(handles)
    }

    /// Unmaps and releases chunks of `chunk` bytes mapped back to back from `ptr`, as PyTorch's
    /// `unmap_block` does: reserved memory shrinks by their total, counted as one device free
    /// and recorded as one `segment_unmap`. Returns how many chunks, from the first, were given
    /// back: all of them unless the device refused one.
    pub fn unmap_release_chunks(
        &mut self,
        ptr: DevicePtr,
        chunk: u64,
        handles: &[PhysicalHandle],
        pool: SizeClass,
        stream: StreamId,
    ) -> usize {
        let Ok(vmm) = self.vmm() else {
            return 0;
        };
        let calls = &mut self.stats.device_calls;
        let released = handles
            .iter()
            .enumerate()
            .take_while(|&(i, &handle)| {
                calls.unmap += 1;
                vmm.unmap(ptr + i as u64 * chunk, chunk).is_ok() && {
                    calls.release_physical += 1;
                    vmm.release_physical(handle).is_ok()
                }
            })
            .count();
        if released > 0 {
            let total = released as u64 * chunk;
            self.stats.num_device_free += 1;
            self.stats.reserved_bytes.decrease(pool, total);
            self.events.emit(Action::SegmentUnmap, ptr, total, stream);
        }
        released
    }

    /// Releases a chunk of `size` bytes from [`Upstream::map_new`] whose mappings the policy has
    /// removed with [`Upstream::unmap`]: reserved memory shrinks by `size`.
    pub fn release_physical(
        &mut self,
        handle: PhysicalHandle,
        size: u64,
        pool: SizeClass,
    ) -> Result<(), UpstreamError> {
        let vmm = self.vmm()?;
        self.stats.device_calls.release_physical += 1;
        vmm.release_physical(handle)?;
        self.stats.num_device_free += 1;
        self.stats.reserved_bytes.decrease(pool, size);
        Ok(())
    }

    /// Emits a policy-level pool event (e.g. a segment created by mapping).
    pub fn record(&mut self, action: Action, addr: DevicePtr, size: u64, stream: StreamId) {
        self.events.emit(action, addr, size, stream);
    }

    fn vmm(&self) -> Result<&'a dyn gpumem_device::VirtualMemory, UpstreamError> {
        self.device.vmm().ok_or_else(|| {
            UpstreamError::Device(DeviceError::Unsupported {
                backend: self.device.name(),
                what: "virtual memory management (needed by this policy)".into(),
            })
        })
    }
}
