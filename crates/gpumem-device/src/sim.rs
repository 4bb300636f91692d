//! A simulated GPU: the default backend, used by tests, replays and machines without a GPU.
//!
//! Two modes ([`SimMemory`]):
//! - **host-backed**: every allocation and physical chunk is host memory, so bytes really
//!   round-trip through `copy_to_device` / `copy_to_host`, through VMM mappings too (a chunk
//!   mapped at two addresses shows the same bytes at both);
//! - **address-only**: no memory is touched, only addresses and sizes are tracked, so an
//!   80 GiB trace replays on a machine with far less memory. Copies are refused.
//!
//! Streams are simulated with work tickets: [`SimDevice::enqueue_work`] queues work on a stream,
//! an event records the stream's ticket, and the event completes when the stream's work up to
//! that ticket is done ([`SimDevice::complete_stream`], [`Device::synchronize`] or
//! [`Device::wait_event`]). That is enough to test record-stream semantics deterministically.
//!
//! Copies move the bytes when they are issued. An asynchronous copy
//! ([`Device::copy_to_device_async`] and the others) is also queued as one unit of work on its
//! stream, with an event behind it, so its buffer comes back only once the stream's work up to
//! the copy is completed: tests can check that nothing hands a buffer back early.
//!
//! Every device call is counted in [`SimCounters`], which is how replays report device calls.
//!
//! # Virtual time
//!
//! Every stream and the host also have a virtual clock in nanoseconds, so that overlap can be
//! measured deterministically, without timing real threads. Work on a stream starts when both
//! the stream and the host are there (the host issues it) and takes its duration: a copy
//! takes its bytes over [`SimConfig::copy_bandwidth`] (zero time when that is `None`, the
//! default), [`SimDevice::enqueue_timed_work`] takes the time it is given. An event carries
//! its stream's time when recorded; [`Device::stream_wait_event`] moves a stream's clock up to
//! it, and host waits ([`Device::wait_event`], synchronisations, synchronous copies) move the
//! host's. [`SimDevice::elapsed_ns`] is the time when everything issued so far has finished.
//! The clocks only measure: which events have completed is still decided by the work tickets.

use std::collections::{BTreeMap, HashMap, VecDeque};
use std::sync::{Mutex, MutexGuard};

use crate::vmm_ledger::{check_granularity_multiple, VmmLedger};
use crate::{
    Device, DeviceError, DevicePtr, EventId, InFlight, ManagedAdvice, MemInfo, MemoryLocation,
    PhysicalHandle, PinnedBuffer, StreamId, VirtualMemory,
};

/// 2 MiB: the VMM granularity of current NVIDIA GPUs.
pub const DEFAULT_GRANULARITY: u64 = 2 << 20;

/// Where a simulated device keeps its bytes.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum SimMemory {
    /// Host memory behind every allocation: copies work.
    Host,
    /// Addresses and sizes only: nothing is allocated on the host.
    AddressOnly,
}

/// Settings of a simulated device.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct SimConfig {
    /// Device memory in bytes.
    pub capacity: u64,
    /// Host-backed or address-only.
    pub memory: SimMemory,
    /// VMM chunk size, or `None` for a device without virtual-memory support.
    pub granularity: Option<u64>,
    /// Alignment of `malloc` results (cudaMalloc returns 512-byte aligned memory; real
    /// drivers hand out 2 MiB-aligned ranges for large requests).
    pub malloc_alignment: u64,
    /// Host-device copy speed in bytes per second for the virtual clocks (see the
    /// [module](self) documentation), or `None` for copies that take no time.
    pub copy_bandwidth: Option<u64>,
}

impl SimConfig {
    /// A host-backed device of `capacity` bytes with 2 MiB VMM granularity.
    pub fn host(capacity: u64) -> Self {
        SimConfig {
            capacity,
            memory: SimMemory::Host,
            granularity: Some(DEFAULT_GRANULARITY),
            malloc_alignment: DEFAULT_GRANULARITY,
            copy_bandwidth: None,
        }
    }

    /// An address-only device of `capacity` bytes with 2 MiB VMM granularity.
    pub fn address_only(capacity: u64) -> Self {
        SimConfig {
            memory: SimMemory::AddressOnly,
            ..SimConfig::host(capacity)
        }
    }
}

/// How often each device call was made. Failed calls count too: a replay wants to see every
/// attempt a policy made.
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq)]
pub struct SimCounters {
    /// `malloc` calls.
    pub malloc: u64,
    /// `malloc` calls that failed for lack of memory.
    pub malloc_failed: u64,
    /// `free` calls.
    pub free: u64,
    /// Address reservations.
    pub reserve: u64,
    /// Reservations returned.
    pub release_reservation: u64,
    /// Physical chunks created.
    pub create_physical: u64,
    /// Physical chunk creations that failed for lack of memory.
    pub create_physical_failed: u64,
    /// Physical chunks released.
    pub release_physical: u64,
    /// Map calls.
    pub map: u64,
    /// Unmap calls.
    pub unmap: u64,
    /// Events recorded, by `record_event` and behind asynchronous copies.
    pub record_event: u64,
    /// Event queries.
    pub event_query: u64,
    /// Event waits.
    pub wait_event: u64,
    /// Stream or device synchronisations.
    pub synchronize: u64,
    /// Host-to-device copies.
    pub copy_to_device: u64,
    /// Device-to-host copies.
    pub copy_to_host: u64,
    /// Device-to-device copies.
    pub copy_on_device: u64,
    /// Host buffers allocated for transfers.
    pub alloc_pinned: u64,
    /// Asynchronous host-to-device copies.
    pub copy_to_device_async: u64,
    /// Asynchronous device-to-host copies.
    pub copy_to_host_async: u64,
    /// Asynchronous device-to-device copies.
    pub copy_on_device_async: u64,
    /// Streams made to wait for an event.
    pub stream_wait_event: u64,
    /// Managed allocations (each also counted as a `malloc`, and its free as a `free`).
    pub alloc_managed: u64,
    /// Prefetches of managed memory.
    pub prefetch_managed: u64,
    /// Advice about managed memory.
    pub advise_managed: u64,
}

impl SimCounters {
    /// Calls that allocate or map device memory: what a pool should make rarely.
    pub fn allocating_calls(&self) -> u64 {
        self.malloc + self.create_physical + self.map
    }

    /// Calls that free or unmap device memory.
    pub fn freeing_calls(&self) -> u64 {
        self.free + self.release_physical + self.unmap
    }
}

/// A simulated GPU. Cheap to share behind an `Arc`.
#[derive(Debug)]
pub struct SimDevice {
    config: SimConfig,
    state: Mutex<SimState>,
}

#[derive(Debug, Default)]
struct SimState {
    counters: SimCounters,
    /// Physical bytes in use: live mallocs plus chunks not yet returned.
    used: u64,
    next_address: u64,
    /// Addresses `malloc` hands out by size, in order, before it picks its own
    /// ([`SimDevice::place_mallocs_at`]).
    placements: HashMap<u64, VecDeque<DevicePtr>>,
    /// Live `malloc` ranges by start address.
    allocations: BTreeMap<DevicePtr, Region>,
    /// Reservations and mappings (a mapping keeps its chunk's handle id).
    vmm: VmmLedger<u64>,
    /// Physical chunks by handle id.
    physical: HashMap<u64, Physical>,
    next_physical: u64,

    /// Per stream: (tickets queued, tickets completed).
    streams: HashMap<StreamId, (u64, u64)>,
    next_stream: u64,
    /// Live events: the stream and ticket they wait for.
    events: HashMap<EventId, (StreamId, u64)>,
    next_event: u64,
    /// The virtual clocks.
    time: Timeline,
    /// Managed allocations among `allocations`, by start address.
    managed: std::collections::BTreeSet<DevicePtr>,
}

/// Virtual clocks in nanoseconds: the host's, each stream's, and each live event's time.
#[derive(Debug, Default)]
struct Timeline {
    host: u64,
    streams: HashMap<StreamId, u64>,
    events: HashMap<EventId, u64>,
}

impl Timeline {
    /// Runs `duration` of work on `stream`, starting once the stream and the host are there.
    fn run(&mut self, stream: StreamId, duration: u64) {
        let clock = self.streams.entry(stream).or_default();
        *clock = (*clock).max(self.host) + duration;
    }

    /// The time work issued to `stream` now would start.
    fn now(&self, stream: StreamId) -> u64 {
        self.streams
            .get(&stream)
            .copied()
            .unwrap_or(0)
            .max(self.host)
    }

    /// The host waits until `time`.
    fn host_waits(&mut self, time: u64) {
        self.host = self.host.max(time);
    }

    /// When everything issued so far has finished.
    fn makespan(&self) -> u64 {
        self.streams.values().copied().fold(self.host, u64::max)
    }
}

#[derive(Debug)]
struct Region {
    size: u64,
    bytes: Option<Vec<u8>>,
}

#[derive(Debug)]
struct Physical {
    size: u64,
    released: bool,
    mapped: u32,
    bytes: Option<Vec<u8>>,
}

/// Base of simulated device addresses: looks like a real CUDA pointer in messages and traces.
const ADDRESS_BASE: u64 = 0x7f00_0000_0000;

fn align_up(value: u64, align: u64) -> u64 {
    value.div_ceil(align) * align
}

/// The largest capacity a simulated device takes, 1 PiB: far past any GPU, while its
/// addresses and every policy's reservations (several times the device's size) stay well
/// within 64 bits.
pub const MAX_CAPACITY: u64 = 1 << 50;

impl SimDevice {
    /// Creates a device. Fails on a capacity of zero or above [`MAX_CAPACITY`], or a
    /// granularity that is not a power of two.
    pub fn new(config: SimConfig) -> Result<Self, DeviceError> {
        if config.capacity == 0 || config.capacity > MAX_CAPACITY {
            return Err(DeviceError::InvalidValue(format!(
                "simulated device capacity {} bytes: accepted: 1 byte to {MAX_CAPACITY} (1 PiB)",
                config.capacity
            )));
        }
        if let Some(g) = config.granularity {
            if g == 0 || !g.is_power_of_two() {
                return Err(DeviceError::InvalidValue(format!(
                    "VMM granularity must be a power of two, got {g}"
                )));
            }
        }
        if config.malloc_alignment == 0 || !config.malloc_alignment.is_power_of_two() {
            return Err(DeviceError::InvalidValue(format!(
                "malloc alignment must be a power of two, got {}",
                config.malloc_alignment
            )));
        }
        let mut state = SimState {
            next_address: ADDRESS_BASE,
            next_stream: 1,
            ..SimState::default()
        };
        state.streams.insert(StreamId::DEFAULT, (0, 0));
        Ok(SimDevice {
            config,
            state: Mutex::new(state),
        })
    }

    /// The settings this device was made with.
    pub fn config(&self) -> &SimConfig {
        &self.config
    }

    /// Has `malloc` hand out the given `(address, size)` placements: a later `malloc` of a
    /// size takes the first placement of that size not yet taken whose range is free, and
    /// picks an address of its own only when none is left. A replay gives it the addresses a
    /// real driver returned to the traced allocator, so that a policy that breaks ties by
    /// address sees the blocks in the order the traced process did. The device's own
    /// addresses continue above every placement, so the two never overlap. Placements of zero
    /// bytes, at address 0 (the null pointer: a block there could never be freed), or beyond a
    /// 56-bit address space (no driver's), are left out.
    pub fn place_mallocs_at(&self, placements: impl IntoIterator<Item = (DevicePtr, u64)>) {
        let mut s = self.lock();
        for (address, size) in placements {
            let end = address.checked_add(size).filter(|&end| end <= 1 << 56);
            let Some(end) = end.filter(|_| size > 0 && address != 0) else {
                continue;
            };
            s.next_address = s.next_address.max(end);
            s.placements.entry(size).or_default().push_back(address);
        }
    }

    /// The call counters so far.
    pub fn counters(&self) -> SimCounters {
        self.lock().counters
    }

    /// Events recorded and not yet destroyed: a test's check that nothing leaks events.
    pub fn live_events(&self) -> usize {
        self.lock().events.len()
    }

    /// Physical bytes in use right now (allocations plus unreleased chunks).
    pub fn used(&self) -> u64 {
        self.lock().used
    }

    /// Queues a unit of work on `stream` (a kernel, say): events recorded after it complete
    /// only once the stream's work is completed.
    pub fn enqueue_work(&self, stream: StreamId) -> Result<(), DeviceError> {
        self.lock().stream_mut(stream)?.0 += 1;
        Ok(())
    }

    /// Queues `duration_ns` of work on `stream` (a kernel of known run time): like
    /// [`SimDevice::enqueue_work`], and it advances the stream's virtual clock.
    pub fn enqueue_timed_work(
        &self,
        stream: StreamId,
        duration_ns: u64,
    ) -> Result<(), DeviceError> {
        let mut s = self.lock();
        s.stream_mut(stream)?.0 += 1;
        s.time.run(stream, duration_ns);
        Ok(())
    }

    /// The virtual time, in nanoseconds, at which all work issued so far has finished.
    pub fn elapsed_ns(&self) -> u64 {
        self.lock().time.makespan()
    }

    /// Completes all work queued so far on `stream`.
    pub fn complete_stream(&self, stream: StreamId) -> Result<(), DeviceError> {
        let mut s = self.lock();
        let entry = s.stream_mut(stream)?;
        entry.1 = entry.0;
        Ok(())
    }

    fn lock(&self) -> MutexGuard<'_, SimState> {
        // A panic while holding the lock cannot leave the state half-updated in a way that
        // matters for a simulation, so a poisoned lock is taken over.
        self.state.lock().unwrap_or_else(|p| p.into_inner())
    }

    fn host_backed(&self) -> bool {
        self.config.memory == SimMemory::Host
    }

    fn require_host(&self, what: &str) -> Result<(), DeviceError> {
        if self.host_backed() {
            Ok(())
        } else {
            Err(DeviceError::unsupported(
                self.name(),
                format!("{what}: an address-only simulated device holds no bytes"),
            ))
        }
    }

    /// A copy of `bytes` on `stream`, synchronous or asynchronous alike: counts it
    /// (`counter`), checks that the device holds bytes and that the stream exists, moves the
    /// bytes at once (`move_bytes`) and runs the copy's time on the stream's clock. Returns the
    /// lock so that an asynchronous copy can enqueue its work under it; a synchronous copy
    /// makes the host wait for it ([`SimState::host_waits_for`]).
    fn copy(
        &self,
        what: &str,
        stream: StreamId,
        bytes: u64,
        counter: fn(&mut SimCounters) -> &mut u64,
        move_bytes: impl FnOnce(&mut SimState) -> Result<(), DeviceError>,
    ) -> Result<MutexGuard<'_, SimState>, DeviceError> {
        let mut s = self.lock();
        *counter(&mut s.counters) += 1;
        self.require_host(what)?;
        s.stream_mut(stream)?;
        move_bytes(&mut s)?;
        let duration = self.config.copy_bandwidth.map_or(0, |bandwidth| {
            (u128::from(bytes) * 1_000_000_000 / u128::from(bandwidth.max(1))) as u64
        });
        s.time.run(stream, duration);
        Ok(s)
    }

    fn take_memory(&self, s: &mut SimState, size: u64) -> Result<(), DeviceError> {
        let free = self.config.capacity - s.used;
        if size > free {
            return Err(DeviceError::out_of_memory(
                size,
                Some(MemInfo {
                    free,
                    total: self.config.capacity,
                }),
            ));
        }
        s.used += size;
        Ok(())
    }

    fn zeroed(&self, size: u64) -> Option<Vec<u8>> {
        self.host_backed().then(|| vec![0u8; size as usize])
    }

    fn vmm_granularity(&self) -> Result<u64, DeviceError> {
        self.config
            .granularity
            .ok_or_else(|| DeviceError::unsupported(self.name(), "virtual memory management"))
    }
}

impl SimState {
    fn stream_mut(&mut self, stream: StreamId) -> Result<&mut (u64, u64), DeviceError> {
        self.streams
            .get_mut(&stream)
            .ok_or(DeviceError::UnknownHandle {
                kind: "stream",
                id: stream.0,
            })
    }

    /// Checks that `[ptr, ptr + len)` lies inside one managed allocation.
    fn check_managed(&self, ptr: DevicePtr, len: u64) -> Result<(), DeviceError> {
        let inside = self.managed.range(..=ptr).next_back().is_some_and(|start| {
            ptr.checked_add(len)
                .is_some_and(|end| end <= start + self.allocations[start].size)
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

    /// Completes the work of every stream, the host waiting for it on the virtual clocks.
    fn complete_everything(&mut self) {
        for entry in self.streams.values_mut() {
            entry.1 = entry.0;
        }
        let end = self.time.makespan();
        self.time.host_waits(end);
    }

    /// The host waits for the work issued to `stream` so far (on the virtual clocks).
    fn host_waits_for(&mut self, stream: StreamId) {
        let end = self.time.now(stream);
        self.time.host_waits(end);
    }

    /// Records an event on `stream` at the stream's latest ticket.
    fn record(&mut self, stream: StreamId) -> Result<EventId, DeviceError> {
        self.counters.record_event += 1;
        let ticket = self.stream_mut(stream)?.0;
        let id = EventId(self.next_event);
        self.next_event += 1;
        self.events.insert(id, (stream, ticket));
        let now = self.time.now(stream);
        self.time.events.insert(id, now);
        Ok(id)
    }

    /// Queues an asynchronous copy as one unit of work on `stream` and records the event
    /// that completes with it.
    fn enqueue_copy(&mut self, stream: StreamId) -> Result<EventId, DeviceError> {
        self.stream_mut(stream)?.0 += 1;
        self.record(stream)
    }

    /// The next `malloc` address for `size` bytes: the first placement given for that size
    /// whose range no live allocation overlaps (those that one does are dropped), else the
    /// next address of the device's own.
    fn malloc_address(&mut self, size: u64, align: u64) -> DevicePtr {
        while let Some(ptr) = self.placements.get_mut(&size).and_then(VecDeque::pop_front) {
            let overlaps = self
                .allocations
                .range(..ptr + size)
                .next_back()
                .is_some_and(|(&start, region)| start + region.size > ptr);
            if !overlaps {
                return ptr;
            }
        }
        self.bump_address(size, align)
    }

    fn bump_address(&mut self, size: u64, align: u64) -> DevicePtr {
        let ptr = align_up(self.next_address, align);
        self.next_address = ptr + size;
        ptr
    }

    /// Writes `src` to device memory at `dst`.
    fn write(&mut self, dst: DevicePtr, src: &[u8]) -> Result<(), DeviceError> {
        self.for_each_span(dst, src.len() as u64, |span, off| {
            span.copy_from_slice(&src[off..off + span.len()])
        })
    }

    /// Reads device memory at `src` into `dst`.
    fn read(&mut self, dst: &mut [u8], src: DevicePtr) -> Result<(), DeviceError> {
        self.for_each_span(src, dst.len() as u64, |span, off| {
            dst[off..off + span.len()].copy_from_slice(span)
        })
    }

    /// Copies `len` bytes from `src` to `dst` through a staging buffer (the ranges may
    /// overlap or alias through mappings).
    fn copy_within(&mut self, dst: DevicePtr, src: DevicePtr, len: u64) -> Result<(), DeviceError> {
        let mut staging = vec![0u8; len as usize];
        self.read(&mut staging, src)?;
        self.write(dst, &staging)
    }

    /// Applies `f` to each host byte range that `[ptr, ptr+len)` covers, in address order,
    /// whether it lies in a malloc region or in mapped chunks.
    fn for_each_span(
        &mut self,
        ptr: DevicePtr,
        len: u64,
        mut f: impl FnMut(&mut [u8], usize),
    ) -> Result<(), DeviceError> {
        let end = ptr
            .checked_add(len)
            .ok_or_else(|| DeviceError::InvalidAddress {
                ptr,
                what: "range overflows the address space".into(),
            })?;
        if let Some((&start, region)) = self.allocations.range_mut(..=ptr).next_back() {
            if end <= start + region.size {
                let bytes = region.bytes.as_mut().expect("host-backed region");
                let off = (ptr - start) as usize;
                f(&mut bytes[off..off + len as usize], 0);
                return Ok(());
            }
        }
        let spans: Vec<(DevicePtr, u64, u64)> = self
            .vmm
            .spans(ptr, len)?
            .into_iter()
            .map(|(start, mapped)| (start, mapped.size, mapped.data))
            .collect();
        let mut at = ptr;
        for (start, size, handle) in spans {
            let stop = end.min(start + size);
            let chunk = self.physical.get_mut(&handle).expect("mapped chunk exists");
            let bytes = chunk.bytes.as_mut().expect("host-backed chunk");
            let off = (at - start) as usize;
            f(
                &mut bytes[off..off + (stop - at) as usize],
                (at - ptr) as usize,
            );
            at = stop;
        }
        Ok(())
    }
}

impl Device for SimDevice {
    fn name(&self) -> String {
        let mode = match self.config.memory {
            SimMemory::Host => "host-backed",
            SimMemory::AddressOnly => "address-only",
        };
        format!(
            "sim ({:.2} GiB, {mode})",
            self.config.capacity as f64 / (1u64 << 30) as f64
        )
    }

    fn mem_info(&self) -> Result<MemInfo, DeviceError> {
        let s = self.lock();
        Ok(MemInfo {
            free: self.config.capacity - s.used,
            total: self.config.capacity,
        })
    }

    fn malloc(&self, size: u64) -> Result<DevicePtr, DeviceError> {
        let mut s = self.lock();
        s.counters.malloc += 1;
        if size == 0 {
            return Err(DeviceError::InvalidValue("malloc of zero bytes".into()));
        }
        if let Err(e) = self.take_memory(&mut s, size) {
            s.counters.malloc_failed += 1;
            return Err(e);
        }
        let ptr = s.malloc_address(size, self.config.malloc_alignment);
        let bytes = self.zeroed(size);
        s.allocations.insert(ptr, Region { size, bytes });
        Ok(ptr)
    }

    /// Frees the region after all queued work has completed, as `cudaFree` synchronises the
    /// device (the host's clock waits for every stream).
    fn free(&self, ptr: DevicePtr) -> Result<(), DeviceError> {
        let mut s = self.lock();
        s.counters.free += 1;
        let region = s
            .allocations
            .remove(&ptr)
            .ok_or_else(|| DeviceError::InvalidAddress {
                ptr,
                what: "free of an address that no live malloc returned".into(),
            })?;
        s.used -= region.size;
        s.complete_everything();
        Ok(())
    }

    fn vmm(&self) -> Option<&dyn VirtualMemory> {
        self.config.granularity.map(|_| self as &dyn VirtualMemory)
    }

    /// Managed memory is an allocation like any other here (every allocation of the
    /// simulated device is host memory, or only an address): `malloc`, remembered as managed.
    fn alloc_managed(&self, size: u64) -> Result<DevicePtr, DeviceError> {
        let ptr = self.malloc(size)?;
        let mut s = self.lock();
        s.counters.alloc_managed += 1;
        s.managed.insert(ptr);
        Ok(ptr)
    }

    fn free_managed(&self, ptr: DevicePtr) -> Result<(), DeviceError> {
        if !self.lock().managed.remove(&ptr) {
            return Err(DeviceError::InvalidAddress {
                ptr,
                what: "free_managed of an address that no live alloc_managed returned".into(),
            });
        }
        self.free(ptr)
    }

    /// Checks the range and the stream and counts the call; there is nothing to migrate.
    fn prefetch_managed(
        &self,
        ptr: DevicePtr,
        len: u64,
        to: MemoryLocation,
        stream: StreamId,
    ) -> Result<(), DeviceError> {
        let _ = to;
        let mut s = self.lock();
        s.counters.prefetch_managed += 1;
        s.stream_mut(stream)?;
        s.check_managed(ptr, len)
    }

    /// Checks the range and counts the call.
    fn advise_managed(
        &self,
        ptr: DevicePtr,
        len: u64,
        advice: ManagedAdvice,
    ) -> Result<(), DeviceError> {
        let _ = advice;
        let mut s = self.lock();
        s.counters.advise_managed += 1;
        s.check_managed(ptr, len)
    }

    fn create_stream(&self) -> Result<StreamId, DeviceError> {
        let mut s = self.lock();
        let id = StreamId(s.next_stream);
        s.next_stream += 1;
        s.streams.insert(id, (0, 0));
        Ok(id)
    }

    /// Forgets the stream. Stricter than CUDA, so that tests catch events left behind: it is
    /// refused while an event recorded on the stream is alive.
    fn destroy_stream(&self, stream: StreamId) -> Result<(), DeviceError> {
        if stream == StreamId::DEFAULT {
            return Err(DeviceError::InvalidValue(
                "the default stream cannot be destroyed".into(),
            ));
        }
        let mut s = self.lock();
        s.stream_mut(stream)?;
        if let Some(event) = s.events.iter().find(|(_, (on, _))| *on == stream) {
            return Err(DeviceError::InvalidValue(format!(
                "stream {} still has a live event ({})",
                stream.0, event.0 .0
            )));
        }
        s.streams.remove(&stream);
        s.time.streams.remove(&stream);
        Ok(())
    }

    fn record_event(&self, stream: StreamId) -> Result<EventId, DeviceError> {
        self.lock().record(stream)
    }

    fn event_completed(&self, event: EventId) -> Result<bool, DeviceError> {
        let mut s = self.lock();
        s.counters.event_query += 1;
        let (stream, ticket) = *s.events.get(&event).ok_or(DeviceError::UnknownHandle {
            kind: "event",
            id: event.0,
        })?;
        Ok(s.stream_mut(stream)?.1 >= ticket)
    }

    fn wait_event(&self, event: EventId) -> Result<(), DeviceError> {
        let mut s = self.lock();
        s.counters.wait_event += 1;
        let (stream, ticket) = *s.events.get(&event).ok_or(DeviceError::UnknownHandle {
            kind: "event",
            id: event.0,
        })?;
        let entry = s.stream_mut(stream)?;
        entry.1 = entry.1.max(ticket);
        let time = s.time.events[&event];
        s.time.host_waits(time);
        Ok(())
    }

    /// Completes the awaited work in the ticket model (as the default does, so that events
    /// behind the wait complete only with it); on the virtual clocks only `stream` waits, the
    /// host goes on.
    fn stream_wait_event(&self, stream: StreamId, event: EventId) -> Result<(), DeviceError> {
        let mut s = self.lock();
        s.counters.stream_wait_event += 1;
        let (awaited, ticket) = *s.events.get(&event).ok_or(DeviceError::UnknownHandle {
            kind: "event",
            id: event.0,
        })?;
        s.stream_mut(stream)?;
        let entry = s.stream_mut(awaited)?;
        entry.1 = entry.1.max(ticket);
        let time = s.time.events[&event];
        let clock = s.time.streams.entry(stream).or_default();
        *clock = (*clock).max(time);
        Ok(())
    }

    fn destroy_event(&self, event: EventId) -> Result<(), DeviceError> {
        let mut s = self.lock();
        s.events.remove(&event).ok_or(DeviceError::UnknownHandle {
            kind: "event",
            id: event.0,
        })?;
        s.time.events.remove(&event);
        Ok(())
    }

    fn synchronize_stream(&self, stream: StreamId) -> Result<(), DeviceError> {
        let mut s = self.lock();
        s.counters.synchronize += 1;
        let entry = s.stream_mut(stream)?;
        entry.1 = entry.0;
        s.host_waits_for(stream);
        Ok(())
    }

    fn synchronize(&self) -> Result<(), DeviceError> {
        let mut s = self.lock();
        s.counters.synchronize += 1;
        s.complete_everything();
        Ok(())
    }

    fn copy_to_device(
        &self,
        dst: DevicePtr,
        src: &[u8],
        stream: StreamId,
    ) -> Result<(), DeviceError> {
        self.copy(
            "copy to device",
            stream,
            src.len() as u64,
            |c| &mut c.copy_to_device,
            |s| s.write(dst, src),
        )
        .map(|mut s| s.host_waits_for(stream))
    }

    fn copy_to_host(
        &self,
        dst: &mut [u8],
        src: DevicePtr,
        stream: StreamId,
    ) -> Result<(), DeviceError> {
        self.copy(
            "copy to host",
            stream,
            dst.len() as u64,
            |c| &mut c.copy_to_host,
            |s| s.read(dst, src),
        )
        .map(|mut s| s.host_waits_for(stream))
    }

    fn copy_on_device(
        &self,
        dst: DevicePtr,
        src: DevicePtr,
        len: u64,
        stream: StreamId,
    ) -> Result<(), DeviceError> {
        self.copy(
            "copy on device",
            stream,
            len,
            |c| &mut c.copy_on_device,
            |s| s.copy_within(dst, src, len),
        )
        .map(|mut s| s.host_waits_for(stream))
    }

    fn alloc_pinned(&self, len: usize) -> Result<PinnedBuffer, DeviceError> {
        self.lock().counters.alloc_pinned += 1;
        Ok(PinnedBuffer::pageable(len))
    }

    fn copy_to_device_async(
        &self,
        dst: DevicePtr,
        src: PinnedBuffer,
        stream: StreamId,
    ) -> Result<InFlight<'_, PinnedBuffer>, DeviceError> {
        let event = self
            .copy(
                "copy to device",
                stream,
                src.len() as u64,
                |c| &mut c.copy_to_device_async,
                |s| s.write(dst, &src),
            )?
            .enqueue_copy(stream)?;
        Ok(InFlight::pending(self, event, src))
    }

    fn copy_to_host_async(
        &self,
        mut dst: PinnedBuffer,
        src: DevicePtr,
        stream: StreamId,
    ) -> Result<InFlight<'_, PinnedBuffer>, DeviceError> {
        let event = self
            .copy(
                "copy to host",
                stream,
                dst.len() as u64,
                |c| &mut c.copy_to_host_async,
                |s| s.read(&mut dst, src),
            )?
            .enqueue_copy(stream)?;
        Ok(InFlight::pending(self, event, dst))
    }

    fn copy_on_device_async(
        &self,
        dst: DevicePtr,
        src: DevicePtr,
        len: u64,
        stream: StreamId,
    ) -> Result<EventId, DeviceError> {
        self.copy(
            "copy on device",
            stream,
            len,
            |c| &mut c.copy_on_device_async,
            |s| s.copy_within(dst, src, len),
        )?
        .enqueue_copy(stream)
    }
}

impl VirtualMemory for SimDevice {
    fn granularity(&self) -> u64 {
        self.config.granularity.unwrap_or(DEFAULT_GRANULARITY)
    }

    fn reserve(&self, size: u64) -> Result<DevicePtr, DeviceError> {
        let g = self.vmm_granularity()?;
        let mut s = self.lock();
        s.counters.reserve += 1;
        check_granularity_multiple(size, g, "reservation")?;
        let ptr = s.bump_address(size, g);
        s.vmm.add_reservation(ptr, size);
        Ok(ptr)
    }

    fn release_reservation(&self, ptr: DevicePtr, size: u64) -> Result<(), DeviceError> {
        let mut s = self.lock();
        s.counters.release_reservation += 1;
        s.vmm.remove_reservation(ptr, size)
    }

    fn create_physical(&self, size: u64) -> Result<PhysicalHandle, DeviceError> {
        let g = self.vmm_granularity()?;
        let mut s = self.lock();
        s.counters.create_physical += 1;
        check_granularity_multiple(size, g, "physical chunk")?;
        if let Err(e) = self.take_memory(&mut s, size) {
            s.counters.create_physical_failed += 1;
            return Err(e);
        }
        let id = s.next_physical;
        s.next_physical += 1;
        let bytes = self.zeroed(size);
        s.physical.insert(
            id,
            Physical {
                size,
                released: false,
                mapped: 0,
                bytes,
            },
        );
        Ok(PhysicalHandle(id))
    }

    fn release_physical(&self, handle: PhysicalHandle) -> Result<(), DeviceError> {
        let mut s = self.lock();
        s.counters.release_physical += 1;
        let chunk = match s.physical.get_mut(&handle.0) {
            Some(c) if !c.released => c,
            _ => {
                return Err(DeviceError::UnknownHandle {
                    kind: "physical handle",
                    id: handle.0,
                })
            }
        };
        chunk.released = true;
        if chunk.mapped == 0 {
            let size = chunk.size;
            s.physical.remove(&handle.0);
            s.used -= size;
        }
        Ok(())
    }

    fn map(&self, ptr: DevicePtr, handle: PhysicalHandle) -> Result<(), DeviceError> {
        let g = self.vmm_granularity()?;
        let mut s = self.lock();
        s.counters.map += 1;
        let SimState { physical, vmm, .. } = &mut *s;
        let chunk = match physical.get_mut(&handle.0) {
            Some(c) if !c.released => c,
            _ => {
                return Err(DeviceError::UnknownHandle {
                    kind: "physical handle",
                    id: handle.0,
                })
            }
        };
        vmm.check_map(ptr, chunk.size, g)?;
        vmm.add_mapping(ptr, chunk.size, handle.0);
        chunk.mapped += 1;
        Ok(())
    }

    fn unmap(&self, ptr: DevicePtr, size: u64) -> Result<(), DeviceError> {
        let mut s = self.lock();
        s.counters.unmap += 1;
        for start in s.vmm.covered_mappings(ptr, size)? {
            let handle = s.vmm.remove_mapping(start).expect("listed above").data;
            let chunk = s.physical.get_mut(&handle).expect("mapped chunk exists");
            chunk.mapped -= 1;
            if chunk.released && chunk.mapped == 0 {
                let freed = chunk.size;
                s.physical.remove(&handle);
                s.used -= freed;
            }
        }
        Ok(())
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    const MIB: u64 = 1 << 20;

    fn host(capacity: u64) -> SimDevice {
        SimDevice::new(SimConfig::host(capacity)).unwrap()
    }

    #[test]
    fn a_placement_at_the_null_pointer_is_left_out() {
        let dev = host(64 * MIB);
        dev.place_mallocs_at([(0, 4 * MIB)]);
        let ptr = dev.malloc(4 * MIB).unwrap();
        assert_ne!(ptr, 0);
        dev.free(ptr).unwrap();
    }

    #[test]
    fn a_capacity_of_zero_or_past_a_petabyte_is_refused() {
        for capacity in [0, MAX_CAPACITY + 1, u64::MAX] {
            let e = SimDevice::new(SimConfig::address_only(capacity))
                .err()
                .unwrap();
            assert!(e.to_string().contains("accepted: 1 byte to"), "{e}");
        }
        assert!(SimDevice::new(SimConfig::address_only(MAX_CAPACITY)).is_ok());
    }

    #[test]
    fn bytes_round_trip_through_malloc() {
        let dev = host(64 * MIB);
        let ptr = dev.malloc(4096).unwrap();
        let data: Vec<u8> = (0..4096u32).map(|i| (i * 7) as u8).collect();
        dev.copy_to_device(ptr, &data, StreamId::DEFAULT).unwrap();
        let mut back = vec![0u8; 4096];
        dev.copy_to_host(&mut back, ptr, StreamId::DEFAULT).unwrap();
        assert_eq!(back, data);
        let other = dev.malloc(4096).unwrap();
        dev.copy_on_device(other, ptr, 4096, StreamId::DEFAULT)
            .unwrap();
        let mut again = vec![0u8; 4096];
        dev.copy_to_host(&mut again, other, StreamId::DEFAULT)
            .unwrap();
        assert_eq!(again, data);
    }

    #[test]
    fn mallocs_take_the_placements_of_their_size_when_free() {
        let dev = host(64 * MIB);
        let top = 0x7f0c_0000_0000;
        dev.place_mallocs_at([(top, 4 * MIB), (top - 8 * MIB, 4 * MIB), (top, 2 * MIB)]);
        let first = dev.malloc(4 * MIB).unwrap();
        assert_eq!(first, top);
        assert_eq!(dev.malloc(4 * MIB).unwrap(), top - 8 * MIB);
        // `top` is live: its 2 MiB placement is dropped and the device picks its own address,
        // above every placement.
        let own = dev.malloc(2 * MIB).unwrap();
        assert!(own >= top + 4 * MIB, "{own:#x}");
        dev.free(first).unwrap();
        assert!(dev.malloc(4 * MIB).unwrap() > own);
    }

    #[test]
    fn capacity_is_enforced_and_freed() {
        let dev = host(8 * MIB);
        let a = dev.malloc(6 * MIB).unwrap();
        let err = dev.malloc(4 * MIB).unwrap_err();
        assert_eq!(
            err,
            DeviceError::out_of_memory(
                4 * MIB,
                Some(MemInfo {
                    free: 2 * MIB,
                    total: 8 * MIB
                })
            )
        );
        dev.free(a).unwrap();
        assert_eq!(dev.mem_info().unwrap().free, 8 * MIB);
        assert_eq!(dev.counters().malloc, 2);
        assert_eq!(dev.counters().malloc_failed, 1);
    }

    #[test]
    fn bad_frees_and_zero_sizes_are_errors() {
        let dev = host(8 * MIB);
        assert!(matches!(dev.malloc(0), Err(DeviceError::InvalidValue(_))));
        let a = dev.malloc(MIB).unwrap();
        assert!(matches!(
            dev.free(a + 512),
            Err(DeviceError::InvalidAddress { .. })
        ));
        dev.free(a).unwrap();
        assert!(matches!(
            dev.free(a),
            Err(DeviceError::InvalidAddress { .. })
        ));
    }

    #[test]
    fn vmm_chunks_alias_and_span_mappings() {
        let dev = host(16 * MIB);
        let vmm = dev.vmm().unwrap();
        let va = vmm.reserve(8 * MIB).unwrap();
        let h1 = vmm.create_physical(2 * MIB).unwrap();
        let h2 = vmm.create_physical(2 * MIB).unwrap();
        vmm.map(va, h1).unwrap();
        vmm.map(va + 2 * MIB, h2).unwrap();
        // A write across the chunk boundary lands in both chunks.
        let data = vec![0xabu8; 1024];
        dev.copy_to_device(va + 2 * MIB - 512, &data, StreamId::DEFAULT)
            .unwrap();
        // Map chunk 2 a second time elsewhere (stitching) and read it there.
        let va2 = vmm.reserve(2 * MIB).unwrap();
        vmm.map(va2, h2).unwrap();
        let mut back = vec![0u8; 512];
        dev.copy_to_host(&mut back, va2, StreamId::DEFAULT).unwrap();
        assert_eq!(back, vec![0xab; 512]);
        assert_eq!(dev.used(), 4 * MIB);
        // Released while mapped: memory returns only when the last mapping goes.
        vmm.release_physical(h2).unwrap();
        vmm.unmap(va + 2 * MIB, 2 * MIB).unwrap();
        assert_eq!(dev.used(), 4 * MIB);
        vmm.unmap(va2, 2 * MIB).unwrap();
        assert_eq!(dev.used(), 2 * MIB);
        assert!(
            vmm.release_reservation(va, 8 * MIB).is_err(),
            "h1 still mapped"
        );
        vmm.unmap(va, 2 * MIB).unwrap();
        vmm.release_physical(h1).unwrap();
        vmm.release_reservation(va, 8 * MIB).unwrap();
        assert_eq!(dev.used(), 0);
        let c = dev.counters();
        assert_eq!((c.map, c.unmap, c.create_physical), (3, 3, 2));
    }

    #[test]
    fn vmm_rejects_bad_mappings() {
        let dev = host(16 * MIB);
        let vmm = dev.vmm().unwrap();
        assert!(
            vmm.create_physical(MIB).is_err(),
            "not a granularity multiple"
        );
        let va = vmm.reserve(4 * MIB).unwrap();
        let h = vmm.create_physical(4 * MIB).unwrap();
        assert!(
            vmm.map(va + 2 * MIB, h).is_err(),
            "runs past the reservation"
        );
        vmm.map(va, h).unwrap();
        assert!(vmm.map(va, h).is_err(), "already mapped");
        assert!(vmm.unmap(va, 2 * MIB).is_err(), "partial unmap");
    }

    #[test]
    fn address_only_tracks_without_bytes() {
        let dev = SimDevice::new(SimConfig::address_only(80 << 30)).unwrap();
        let ptrs: Vec<_> = (0..40).map(|_| dev.malloc(2 << 30).unwrap()).collect();
        assert_eq!(dev.used(), 80 << 30);
        assert!(dev.malloc(1).is_err());
        let mut buf = [0u8; 4];
        assert!(matches!(
            dev.copy_to_host(&mut buf, ptrs[0], StreamId::DEFAULT),
            Err(DeviceError::Unsupported { .. })
        ));
        for p in ptrs {
            dev.free(p).unwrap();
        }
        assert_eq!(dev.used(), 0);
    }

    #[test]
    fn events_complete_with_their_stream() {
        let dev = host(MIB * 4);
        let s = dev.create_stream().unwrap();
        dev.enqueue_work(s).unwrap();
        let e = dev.record_event(s).unwrap();
        assert!(!dev.event_completed(e).unwrap());
        dev.enqueue_work(s).unwrap();
        let later = dev.record_event(s).unwrap();
        dev.wait_event(e).unwrap();
        assert!(dev.event_completed(e).unwrap());
        assert!(!dev.event_completed(later).unwrap());
        dev.synchronize().unwrap();
        assert!(dev.event_completed(later).unwrap());
        dev.destroy_event(e).unwrap();
        assert!(dev.event_completed(e).is_err());
        assert!(dev.record_event(StreamId(999)).is_err());
    }

    fn pattern(len: usize) -> Vec<u8> {
        (0..len).map(|i| (i * 31 % 251) as u8).collect()
    }

    #[test]
    fn async_upload_gives_the_buffer_back_only_once_the_stream_ran_the_copy() {
        let dev = host(4 * MIB);
        let s = dev.create_stream().unwrap();
        let ptr = dev.malloc(4096).unwrap();
        let mut buf = dev.alloc_pinned(4096).unwrap();
        assert!(!buf.is_page_locked());
        buf.copy_from_slice(&pattern(4096));
        dev.enqueue_work(s).unwrap();
        let in_flight = dev.copy_to_device_async(ptr, buf, s).unwrap();
        let in_flight = in_flight
            .try_finish()
            .unwrap()
            .expect_err("the stream has not run the copy yet");
        dev.complete_stream(s).unwrap();
        let buf = in_flight.try_finish().unwrap().expect("the copy completed");
        assert_eq!(&buf[..], &pattern(4096)[..]);
        let mut back = vec![0u8; 4096];
        dev.copy_to_host(&mut back, ptr, s).unwrap();
        assert_eq!(back, pattern(4096));
        assert!(
            dev.lock().events.is_empty(),
            "the copy's event is destroyed"
        );
        let c = dev.counters();
        assert_eq!((c.alloc_pinned, c.copy_to_device_async), (1, 1));
        assert_eq!((c.record_event, c.event_query, c.wait_event), (1, 2, 0));
    }

    #[test]
    fn async_download_fills_the_buffer_and_wait_completes_the_copy() {
        let dev = host(4 * MIB);
        let s = dev.create_stream().unwrap();
        let ptr = dev.malloc(4096).unwrap();
        dev.copy_to_device(ptr, &pattern(4096), s).unwrap();
        dev.enqueue_work(s).unwrap();
        let in_flight = dev
            .copy_to_host_async(dev.alloc_pinned(4096).unwrap(), ptr, s)
            .unwrap();
        let after = dev.record_event(s).unwrap();
        assert!(!dev.event_completed(after).unwrap());
        let buf = in_flight.wait().unwrap();
        assert_eq!(&buf[..], &pattern(4096)[..]);
        assert!(dev.event_completed(after).unwrap(), "waited up to the copy");
        let c = dev.counters();
        assert_eq!((c.copy_to_host_async, c.wait_event), (1, 1));
    }

    #[test]
    fn dropping_an_in_flight_copy_waits_for_it() {
        let dev = host(4 * MIB);
        let s = dev.create_stream().unwrap();
        let ptr = dev.malloc(4096).unwrap();
        let in_flight = dev
            .copy_to_device_async(ptr, dev.alloc_pinned(4096).unwrap(), s)
            .unwrap();
        drop(in_flight);
        assert_eq!(dev.counters().wait_event, 1);
        let after = dev.record_event(s).unwrap();
        assert!(
            dev.event_completed(after).unwrap(),
            "the copy has completed"
        );
        assert_eq!(dev.lock().events.len(), 1, "only `after` is left");
    }

    #[test]
    fn async_device_copy_completes_with_its_event() {
        let dev = host(4 * MIB);
        let s = dev.create_stream().unwrap();
        let (a, b) = (dev.malloc(4096).unwrap(), dev.malloc(4096).unwrap());
        dev.copy_to_device(a, &pattern(4096), s).unwrap();
        let event = dev.copy_on_device_async(b, a, 4096, s).unwrap();
        assert!(!dev.event_completed(event).unwrap());
        dev.synchronize().unwrap();
        assert!(dev.event_completed(event).unwrap());
        dev.destroy_event(event).unwrap();
        let mut back = vec![0u8; 4096];
        dev.copy_to_host(&mut back, b, s).unwrap();
        assert_eq!(back, pattern(4096));
        assert_eq!(dev.counters().copy_on_device_async, 1);
    }

    #[test]
    fn virtual_clocks_overlap_streams_and_order_them_through_events() {
        // 1 byte per nanosecond: a 1000-byte copy takes 1 µs.
        let config = SimConfig {
            copy_bandwidth: Some(1_000_000_000),
            ..SimConfig::host(4 * MIB)
        };
        let dev = SimDevice::new(config).unwrap();
        let (copy, compute) = (dev.create_stream().unwrap(), dev.create_stream().unwrap());
        let ptr = dev.malloc(1000).unwrap();
        let upload = dev
            .copy_to_device_async(ptr, dev.alloc_pinned(1000).unwrap(), copy)
            .unwrap();
        dev.enqueue_timed_work(compute, 700).unwrap();
        assert_eq!(dev.elapsed_ns(), 1000, "the streams ran side by side");
        let copied = dev.record_event(copy).unwrap();
        dev.stream_wait_event(compute, copied).unwrap();
        dev.enqueue_timed_work(compute, 500).unwrap();
        assert_eq!(dev.elapsed_ns(), 1500, "compute waited for the copy");
        drop(upload); // the host waits for the copy: until 1000
        let mut back = vec![0u8; 1000];
        dev.copy_to_host(&mut back, ptr, StreamId::DEFAULT).unwrap();
        assert_eq!(dev.elapsed_ns(), 2000, "issued by the host at 1000");
        dev.enqueue_timed_work(compute, 100).unwrap();
        assert_eq!(
            dev.elapsed_ns(),
            2100,
            "the host waited for the synchronous copy"
        );
        dev.synchronize().unwrap();
        dev.copy_to_host(&mut back, ptr, StreamId::DEFAULT).unwrap();
        assert_eq!(
            dev.elapsed_ns(),
            3100,
            "after a synchronisation the host is at 2100"
        );
        assert_eq!(dev.counters().stream_wait_event, 1);
        let none = host(4 * MIB);
        let p = none.malloc(1000).unwrap();
        none.copy_to_device(p, &[1u8; 1000], StreamId::DEFAULT)
            .unwrap();
        assert_eq!(none.elapsed_ns(), 0, "copies take no time by default");
    }

    #[test]
    fn managed_memory_is_host_memory_with_checked_hints() {
        let dev = host(4 * MIB);
        let ptr = dev.alloc_managed(4096).unwrap();
        dev.copy_to_device(ptr, &pattern(4096), StreamId::DEFAULT)
            .unwrap();
        let to = MemoryLocation::Device;
        dev.prefetch_managed(ptr + 1024, 1024, to, StreamId::DEFAULT)
            .unwrap();
        dev.advise_managed(ptr, 4096, ManagedAdvice::ReadMostly)
            .unwrap();
        assert!(dev
            .advise_managed(ptr, 4097, ManagedAdvice::ReadMostly)
            .is_err());
        assert!(dev.prefetch_managed(ptr, 8, to, StreamId(9)).is_err());
        let plain = dev.malloc(4096).unwrap();
        assert!(dev
            .prefetch_managed(plain, 8, to, StreamId::DEFAULT)
            .is_err());
        assert!(dev.free_managed(plain).is_err());
        let mut back = vec![0u8; 4096];
        dev.copy_to_host(&mut back, ptr, StreamId::DEFAULT).unwrap();
        assert_eq!(back, pattern(4096));
        dev.free_managed(ptr).unwrap();
        dev.free(plain).unwrap();
        assert_eq!(dev.used(), 0);
        let c = dev.counters();
        assert_eq!(
            (c.alloc_managed, c.prefetch_managed, c.advise_managed),
            (1, 3, 2)
        );
        assert_eq!(
            (c.malloc, c.free),
            (2, 2),
            "the refused free_managed freed nothing"
        );
    }

    #[test]
    fn a_stream_is_destroyed_once_its_events_are_gone() {
        let dev = host(4 * MIB);
        let s = dev.create_stream().unwrap();
        let e = dev.record_event(s).unwrap();
        assert!(matches!(
            dev.destroy_stream(s),
            Err(DeviceError::InvalidValue(_))
        ));
        dev.destroy_event(e).unwrap();
        dev.destroy_stream(s).unwrap();
        assert!(dev.record_event(s).is_err(), "the stream is gone");
        assert!(dev.destroy_stream(s).is_err());
        assert!(dev.destroy_stream(StreamId::DEFAULT).is_err());
    }

    #[test]
    fn refused_async_copies_leave_no_work_or_event_behind() {
        let dev = SimDevice::new(SimConfig::address_only(4 * MIB)).unwrap();
        let ptr = dev.malloc(4096).unwrap();
        let buf = dev.alloc_pinned(4096).unwrap();
        assert!(matches!(
            dev.copy_to_device_async(ptr, buf, StreamId::DEFAULT),
            Err(DeviceError::Unsupported { .. })
        ));
        let dev = host(4 * MIB);
        let ptr = dev.malloc(4096).unwrap();
        let buf = dev.alloc_pinned(4096).unwrap();
        assert!(matches!(
            dev.copy_to_host_async(buf, ptr, StreamId(7)),
            Err(DeviceError::UnknownHandle { kind: "stream", .. })
        ));
        let buf = dev.alloc_pinned(4096).unwrap();
        assert!(matches!(
            dev.copy_to_device_async(ptr + 4096, buf, StreamId::DEFAULT),
            Err(DeviceError::InvalidAddress { .. })
        ));
        let s = dev.lock();
        assert!(s.events.is_empty());
        assert_eq!(s.streams[&StreamId::DEFAULT], (0, 0));
    }
}
