//! The pool: one policy over one device, with everything that is the same for every policy.

use std::collections::{BTreeMap, HashMap};
use std::fmt;
use std::sync::{Arc, Mutex, MutexGuard};

use gpumem_device::{AddressMap, Device, DeviceError, DevicePtr, EventId, StreamId};

use crate::config::{ConfigError, PolicyKind, PoolConfig, PoolOptions};
use crate::driver::PolicyDriver;
use crate::events::PoolObserver;
use crate::oom::{OomError, PoolFacts};
use crate::policy::{
    AllocRequest, Block, BlockHandle, Exhausted, Policy, ReleaseTarget, SegmentView, UpstreamError,
};
use crate::size::Bytes;
use crate::stats::{MemoryStats, SizeClass};
use gpumem_snapshot::{
    Action, BlockState, SegmentType, SettingValue, Snapshot, SnapshotBlock, SnapshotSegment,
    TraceEntry,
};

/// Memory handed out by [`Pool::allocate`].
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct Allocation {
    /// Device address (0 for a zero-byte request, like a null pointer).
    pub ptr: DevicePtr,
    /// Bytes requested.
    pub size: u64,
}

/// What a pool call can fail with.
#[derive(Debug, Clone, PartialEq, thiserror::Error)]
pub enum PoolError {
    /// The allocation does not fit, even after the cache was freed; the error explains why.
    #[error("{0}")]
    OutOfMemory(Box<OomError>),
    /// A pointer this pool did not hand out, or already freed.
    #[error("{ptr:#x} is not a live allocation of this pool ({what})")]
    UnknownPointer {
        /// The pointer given.
        ptr: DevicePtr,
        /// Which call got it.
        what: &'static str,
    },
    /// The device failed for a reason other than lack of memory.
    #[error("device error: {0}")]
    Device(#[from] DeviceError),
    /// The configuration is invalid.
    #[error(transparent)]
    Config(#[from] ConfigError),
}

/// A caching device-memory pool. Thread-safe: share it behind an `Arc`.
pub struct Pool {
    device: Arc<dyn Device>,
    /// The policy's name, asked once.
    policy_name: &'static str,
    device_total: u64,
    inner: Mutex<Inner>,
}

struct Inner {
    /// The policy with its upstream layers, statistics and events.
    driver: PolicyDriver,
    /// Handed-out blocks by address: the one table every allocation and free updates.
    live: AddressMap<LiveBlock>,
    /// Streams other than the allocation stream that used a live block (`record_stream`),
    /// for the blocks marked `shared`: kept apart so that live entries stay small.
    stream_uses: AddressMap<Vec<StreamId>>,
    pending: Vec<PendingFree>,
    /// The last allocation that ran out of memory, explained (for monitors: `last_oom`).
    last_oom: Option<Box<OomError>>,
    /// Cached memory above this is released at synchronisation points.
    soft_limit: Option<u64>,
}

/// A handed-out [`Block`] without its address (the table's key), and whether other streams
/// used it.
#[derive(Clone, Copy)]
struct LiveBlock {
    size: u64,
    requested: u64,
    handle: BlockHandle,
    stream: StreamId,
    size_class: SizeClass,
    /// Whether `stream_uses` holds streams for it.
    shared: bool,
}

impl LiveBlock {
    fn new(block: &Block) -> LiveBlock {
        LiveBlock {
            size: block.size,
            requested: block.requested,
            handle: block.handle,
            stream: block.stream,
            size_class: block.size_class,
            shared: false,
        }
    }

    fn block(&self, addr: DevicePtr) -> Block {
        Block {
            addr,
            size: self.size,
            requested: self.requested,
            stream: self.stream,
            size_class: self.size_class,
            handle: self.handle,
        }
    }
}

/// A freed block whose use on other streams may not be over yet.
struct PendingFree {
    block: Block,
    events: Vec<EventId>,
}

impl Pool {
    /// A pool of the built-in policy `config` names, with its settings, limits and history.
    /// `expandable` (the default) is refused on a device without virtual memory management,
    /// with an error that names the policies that run there.
    pub fn new(device: Arc<dyn Device>, config: PoolConfig) -> Result<Pool, PoolError> {
        if config.policy == PolicyKind::Expandable && device.vmm().is_none() {
            return Err(PoolError::Config(ConfigError {
                source_name: "the pool policy (GPUMEM_POOL; expandable when unset)".into(),
                value: "expandable".into(),
                problem: format!(
                    "expandable segments need virtual memory management, which {} lacks",
                    device.name()
                ),
                accepted: "torch, gpumem or none on this device".into(),
            }));
        }
        let policy = config.policy.build(&config)?;
        Pool::with_policy(device, policy, config.options)
    }

    /// A pool running `policy` — a built-in one or any other implementation of [`Policy`] —
    /// over `device`, with `options`' limits and history. The pool owns what is the same for
    /// every policy (live blocks, block statistics, cross-stream frees, reclaim and retry,
    /// limits, events, the OOM explanation); the policy owns placement.
    pub fn with_policy(
        device: Arc<dyn Device>,
        policy: Box<dyn Policy>,
        options: PoolOptions,
    ) -> Result<Pool, PoolError> {
        let total = device.mem_info()?.total;
        let (soft_limit, hard_limit) = options.resolve_limits(total)?;
        let policy_name = policy.name();
        let mut driver = PolicyDriver::new(device.clone(), policy, hard_limit);
        driver
            .events_mut()
            .set_history_capacity(options.history_capacity);
        Ok(Pool {
            policy_name,
            device_total: total,
            inner: Mutex::new(Inner {
                driver,
                live: AddressMap::default(),
                stream_uses: AddressMap::default(),
                pending: Vec::new(),
                last_oom: None,
                soft_limit,
            }),
            device,
        })
    }

    /// A pool configured by the environment (see [`PoolConfig::from_env`]).
    pub fn from_env(device: Arc<dyn Device>) -> Result<Pool, PoolError> {
        Pool::new(device, PoolConfig::from_env()?)
    }

    /// The name of the policy in force.
    pub fn policy_name(&self) -> &'static str {
        self.policy_name
    }

    /// Attaches an observer that sees every pool event from now on (allocations, frees,
    /// segment changes, OOMs). It runs under the pool's lock: keep it quick, and never call
    /// the pool from it.
    pub fn add_observer(&self, observer: Box<dyn PoolObserver>) {
        self.lock().driver.events_mut().add_observer(observer);
    }

    /// The device under the pool.
    pub fn device(&self) -> &Arc<dyn Device> {
        &self.device
    }

    /// Allocates `size` bytes for use on `stream`.
    ///
    /// On a miss the policy grows the pool; if the device (or the hard limit) refuses, the pool
    /// waits for pending cross-stream frees, releases every cached block, searches again and
    /// retries, and only then fails with an [`OomError`] that explains what happened. A
    /// zero-byte request returns a null allocation without touching the device.
    pub fn allocate(&self, size: u64, stream: StreamId) -> Result<Allocation, PoolError> {
        if size == 0 {
            return Ok(Allocation { ptr: 0, size: 0 });
        }
        let mut guard = self.lock();
        let inner = &mut *guard;
        if !inner.pending.is_empty() {
            self.process_events(inner, false)?;
        }
        let request = AllocRequest { size, stream };
        let first = inner.driver.allocate(request);
        let block = match first {
            Ok(block) => block,
            Err(first_failure) => {
                if let UpstreamError::Device(e) = &first_failure.cause {
                    if !e.is_out_of_memory() {
                        return Err(PoolError::Device(e.clone()));
                    }
                }
                self.process_events(inner, true)?;
                let retry = inner.driver.with_upstream(|policy, up| {
                    policy.release_cached(ReleaseTarget::All, up);
                    up.stats.num_alloc_retries += 1;
                    policy.allocate(request, up)
                });
                match retry {
                    Ok(block) => block,
                    Err(failure) => return Err(self.out_of_memory(inner, request, *failure)),
                }
            }
        };
        Ok(Self::hand_out(inner, &block))
    }

    /// Hands `block` to the caller: counts it, records its allocation event and files it
    /// among the live blocks.
    fn hand_out(inner: &mut Inner, block: &Block) -> Allocation {
        let s = inner.driver.stats_mut();
        s.allocation.increase(block.size_class, 1);
        s.allocated_bytes.increase(block.size_class, block.size);
        s.requested_bytes
            .increase(block.size_class, block.requested);
        s.active.increase(block.size_class, 1);
        s.active_bytes.increase(block.size_class, block.size);
        inner
            .driver
            .events_mut()
            .emit(Action::Alloc, block.addr, block.requested, block.stream);
        inner.live.insert(block.addr, LiveBlock::new(block));
        Allocation {
            ptr: block.addr,
            size: block.requested,
        }
    }

    /// Frees an allocation. If other streams used it ([`Pool::record_stream`]), the block
    /// returns to the cache only once their recorded events complete. Freeing a null pointer
    /// does nothing.
    pub fn free(&self, ptr: DevicePtr) -> Result<(), PoolError> {
        if ptr == 0 {
            return Ok(());
        }
        let mut guard = self.lock();
        let inner = &mut *guard;
        let live = inner
            .live
            .remove(&ptr)
            .ok_or(PoolError::UnknownPointer { ptr, what: "free" })?;
        let block = live.block(ptr);
        let s = inner.driver.stats_mut();
        s.allocation.decrease(block.size_class, 1);
        s.allocated_bytes.decrease(block.size_class, block.size);
        s.requested_bytes
            .decrease(block.size_class, block.requested);
        inner.driver.events_mut().emit(
            Action::FreeRequested,
            block.addr,
            block.requested,
            block.stream,
        );
        let stream_uses = if live.shared {
            inner.stream_uses.remove(&ptr).unwrap_or_default()
        } else {
            Vec::new()
        };
        if stream_uses.is_empty() {
            self.return_block(inner, block);
            return Ok(());
        }
        let mut events = Vec::with_capacity(stream_uses.len());
        for stream in stream_uses {
            match self.device.record_event(stream) {
                Ok(event) => events.push(event),
                Err(e) => {
                    // The block is not lost: it waits on the events recorded so far, after
                    // the whole device has been waited for (which covers the other streams).
                    let synced = self.device.synchronize();
                    inner.pending.push(PendingFree { block, events });
                    synced?;
                    return Err(e.into());
                }
            }
        }
        inner.pending.push(PendingFree { block, events });
        Ok(())
    }

    /// Marks `ptr` as used on `stream` as well as its allocation stream, so that a later free
    /// waits for that stream's work before the block is reused (`Tensor.record_stream`).
    pub fn record_stream(&self, ptr: DevicePtr, stream: StreamId) -> Result<(), PoolError> {
        let mut guard = self.lock();
        let inner = &mut *guard;
        let live = inner.live.get_mut(&ptr).ok_or(PoolError::UnknownPointer {
            ptr,
            what: "record_stream",
        })?;
        if stream == live.stream {
            return Ok(());
        }
        live.shared = true;
        let uses = inner.stream_uses.entry(ptr).or_default();
        if !uses.contains(&stream) {
            uses.push(stream);
        }
        Ok(())
    }

    /// The live allocation at `ptr` (its address and the bytes requested), if this pool
    /// handed it out and it is not freed: for callers that check a free's size or device.
    pub fn allocation(&self, ptr: DevicePtr) -> Option<Allocation> {
        self.lock().live.get(&ptr).map(|live| Allocation {
            ptr,
            size: live.requested,
        })
    }

    /// The stream the live allocation at `ptr` was made for, if this pool handed it out and it
    /// is not freed: for callers that check that a free names the allocation's stream.
    pub fn allocation_stream(&self, ptr: DevicePtr) -> Option<StreamId> {
        self.lock().live.get(&ptr).map(|live| live.stream)
    }

    /// Changes the soft and hard limits at run time (`None`: no limit), resolved against the
    /// device's total memory as [`PoolOptions`] are; an error, and nothing changed, if the soft
    /// limit is above the hard one. Cached memory above a lowered hard limit is released now;
    /// memory in use above it stays, and later growth fails until usage falls below it.
    pub fn set_limits(&self, options: &PoolOptions) -> Result<(), PoolError> {
        let (soft, hard) = options.resolve_limits(self.device_total)?;
        let mut guard = self.lock();
        let inner = &mut *guard;
        inner.soft_limit = soft;
        inner.driver.set_hard_limit(hard);
        if let Some(hard) = hard {
            let reserved = inner.driver.stats().reserved_bytes.all.current;
            if reserved > hard {
                inner
                    .driver
                    .release_cached(ReleaseTarget::AtLeast(reserved - hard));
            }
        }
        Ok(())
    }

    /// Releases every cached block the policy can release (`torch.cuda.empty_cache`); returns
    /// the bytes given back to the device. Blocks still waiting on stream events are waited
    /// for first.
    pub fn empty_cache(&self) -> Result<u64, PoolError> {
        let mut guard = self.lock();
        let inner = &mut *guard;
        self.process_events(inner, true)?;
        Ok(inner.driver.release_cached(ReleaseTarget::All))
    }

    /// A synchronisation point: waits for the device, returns completed cross-stream frees to
    /// the cache, and releases cached memory above the soft limit.
    pub fn synchronize(&self) -> Result<(), PoolError> {
        // Under the lock, so that no block freed during the wait counts as settled by it.
        let mut guard = self.lock();
        let inner = &mut *guard;
        self.device.synchronize()?;
        inner.driver.device_synchronized();
        self.process_events(inner, false)?;
        if let Some(soft) = inner.soft_limit {
            let reserved = inner.driver.stats().reserved_bytes.all.current;
            if reserved > soft {
                inner
                    .driver
                    .release_cached(ReleaseTarget::AtLeast(reserved - soft));
            }
        }
        Ok(())
    }

    /// A copy of the statistics (`torch.cuda.memory_stats`).
    pub fn stats(&self) -> MemoryStats {
        self.lock().driver.stats().clone()
    }

    /// The explanation of the last allocation that ran out of memory, if any did: what a
    /// monitor shows next to the statistics after the error itself went to the caller.
    pub fn last_oom(&self) -> Option<OomError> {
        self.lock().last_oom.as_deref().cloned()
    }

    /// Whether a panic struck while the pool's state was locked (in the policy, an observer,
    /// the statistics): its state may be half-updated. The pool goes on serving — later calls
    /// take the lock over — so a caller that can refuse it (the C library, through
    /// [`crate::DeviceRegistry::unusable`]) asks this after catching a panic.
    pub fn is_poisoned(&self) -> bool {
        self.inner.is_poisoned()
    }

    /// Sets every peak statistic to its current value.
    pub fn reset_peak_stats(&self) {
        self.lock().driver.stats_mut().reset_peaks();
    }

    /// Zeroes historical totals and counters.
    pub fn reset_accumulated_stats(&self) {
        self.lock().driver.stats_mut().reset_accumulated();
    }

    /// The segments the pool holds, with their blocks.
    pub fn segments(&self) -> Vec<SegmentView> {
        self.lock().driver.policy().segments()
    }

    /// Starts (capacity > 0) or stops (0) recording history for snapshots.
    pub fn set_history_capacity(&self, capacity: usize) {
        self.lock()
            .driver
            .events_mut()
            .set_history_capacity(capacity);
    }

    /// The recorded history, oldest first.
    pub fn history(&self) -> Vec<TraceEntry> {
        self.lock()
            .driver
            .events()
            .history()
            .entries()
            .cloned()
            .collect()
    }

    /// The pool as a PyTorch memory snapshot: its segments with every block's state, and the
    /// recorded history as device 0's trace. Written with [`Snapshot::write_pickle`], it opens
    /// in PyTorch's memory_viz.
    pub fn snapshot(&self) -> Snapshot {
        let inner = self.lock();
        let pending: HashMap<DevicePtr, &Block> = inner
            .pending
            .iter()
            .map(|p| (p.block.addr, &p.block))
            .collect();
        let segments = inner
            .driver
            .policy()
            .segments()
            .into_iter()
            .map(|view| {
                let blocks: Vec<SnapshotBlock> = view
                    .blocks
                    .iter()
                    .map(|b| {
                        let (state, requested_size) =
                            match (inner.live.get(&b.address), pending.get(&b.address)) {
                                (Some(live), _) if b.in_use => {
                                    (BlockState::ActiveAllocated, live.requested)
                                }
                                (None, Some(p)) if b.in_use => {
                                    (BlockState::ActivePendingFree, p.requested)
                                }
                                _ => (BlockState::Inactive, 0),
                            };
                        SnapshotBlock {
                            address: b.address,
                            size: b.size,
                            requested_size,
                            state,
                        }
                    })
                    .collect();
                let sum = |keep: &dyn Fn(&SnapshotBlock) -> bool| -> u64 {
                    blocks.iter().filter(|b| keep(b)).map(|b| b.size).sum()
                };
                SnapshotSegment {
                    device: 0,
                    address: view.address,
                    total_size: view.total_size,
                    allocated_size: sum(&|b| b.state == BlockState::ActiveAllocated),
                    active_size: sum(&|b| b.state != BlockState::Inactive),
                    requested_size: blocks.iter().map(|b| b.requested_size).sum(),
                    stream: view.stream.0,
                    segment_type: Some(match view.size_class {
                        SizeClass::Small => SegmentType::Small,
                        SizeClass::Large => SegmentType::Large,
                    }),
                    segment_pool_id: (0, 0),
                    is_expandable: view.is_expandable,
                    blocks,
                }
            })
            .collect();
        let mut allocator_settings: BTreeMap<String, SettingValue> =
            inner.driver.policy().settings().into_iter().collect();
        allocator_settings.insert(
            "gpumem_policy".to_string(),
            SettingValue::Str(self.policy_name.to_string()),
        );
        Snapshot {
            segments,
            device_traces: vec![inner.driver.events().history().entries().cloned().collect()],
            allocator_settings,
            stacks: Default::default(),
        }
    }

    /// A human summary in the spirit of CUDA.jl's `pool_status`, with fragmentation.
    pub fn status(&self) -> Result<PoolStatus, PoolError> {
        let info = self.device.mem_info()?;
        let inner = self.lock();
        let stats = inner.driver.stats();
        Ok(PoolStatus {
            policy: self.policy_name,
            caches: inner.driver.policy().caches(),
            device_used: info.total - info.free,
            device_total: info.total,
            allocated: stats.allocated_bytes.all.current,
            reserved: stats.reserved_bytes.all.current,
            largest_free_block: inner.driver.policy().largest_free_block(),
            soft_limit: inner.soft_limit,
            hard_limit: inner.driver.hard_limit(),
        })
    }

    fn lock(&self) -> MutexGuard<'_, Inner> {
        // Every mutation keeps the state consistent before anything can panic, so a poisoned
        // lock (a panic in another thread) leaves usable state.
        self.inner.lock().unwrap_or_else(|p| p.into_inner())
    }

    /// Returns a block whose use is over to the policy.
    fn return_block(&self, inner: &mut Inner, block: Block) {
        let stats = inner.driver.stats_mut();
        stats.active.decrease(block.size_class, 1);
        stats.active_bytes.decrease(block.size_class, block.size);
        inner.driver.events_mut().emit(
            Action::FreeCompleted,
            block.addr,
            block.requested,
            block.stream,
        );
        inner.driver.free(block);
    }

    /// Returns pending frees whose events completed; with `wait`, waits for all of them first
    /// (counted as a full synchronisation, as PyTorch does).
    fn process_events(&self, inner: &mut Inner, wait: bool) -> Result<(), PoolError> {
        if inner.pending.is_empty() {
            return Ok(());
        }
        if wait {
            inner.driver.stats_mut().num_sync_all_streams += 1;
        }
        let mut still_pending = Vec::new();
        for pending in std::mem::take(&mut inner.pending) {
            let mut done = true;
            for &event in &pending.events {
                if wait {
                    self.device.wait_event(event)?;
                } else if !self.device.event_completed(event)? {
                    done = false;
                    break;
                }
            }
            if done {
                for event in pending.events {
                    self.device.destroy_event(event)?;
                }
                self.return_block(inner, pending.block);
            } else {
                still_pending.push(pending);
            }
        }
        inner.pending = still_pending;
        Ok(())
    }

    /// Records an allocation that failed after the reclaim and retry, and explains it.
    fn out_of_memory(
        &self,
        inner: &mut Inner,
        request: AllocRequest,
        failure: Exhausted,
    ) -> PoolError {
        inner.driver.stats_mut().num_ooms += 1;
        let info = self.device.mem_info().unwrap_or_default();
        inner
            .driver
            .events_mut()
            .emit_oom(request.size, request.stream, info.free);
        let stats = inner.driver.stats();
        let policy = inner.driver.policy();
        let facts = PoolFacts {
            policy: self.policy_name,
            device: self.device.name(),
            device_total: self.device_total,
            device_free: info.free,
            allocated: stats.allocated_bytes.all.current,
            reserved: stats.reserved_bytes.all.current,
            largest_free_block: policy.largest_free_block(),
            hard_limit: inner.driver.hard_limit(),
        };
        let error = Box::new(OomError::explain(
            request,
            failure,
            facts,
            &policy.fragmentation_advice(),
        ));
        inner.last_oom = Some(error.clone());
        PoolError::OutOfMemory(error)
    }

    /// Takes over `segment`, memory a process held before this pool began (a trace recorded
    /// mid-process, replayed from where that process stood): the policy reserves a segment of
    /// its size, places its live blocks at their offsets and caches the rest
    /// ([`Policy::adopt_segment`]); the pool then holds those blocks as live allocations,
    /// counted and recorded as allocations are. Returns them in the order of
    /// `segment.blocks`. If the device or the hard limit refuses, the cache is freed and the
    /// policy tried again, as for an allocation, before an explained out-of-memory error.
    /// A policy that cannot lay memory out as asked returns
    /// [`crate::AdoptError::Unsupported`] and nothing changes.
    pub fn adopt_segment(
        &self,
        segment: &crate::adopt::SegmentToAdopt,
    ) -> Result<Vec<Allocation>, crate::adopt::AdoptError> {
        use crate::adopt::AdoptError;
        segment.check()?;
        let mut guard = self.lock();
        let inner = &mut *guard;
        let adopt = |policy: &mut dyn Policy, up: &mut crate::policy::Upstream<'_>| {
            policy.adopt_segment(segment, up)
        };
        let blocks = match inner.driver.with_upstream(adopt) {
            Err(AdoptError::Upstream(cause)) if cause.is_out_of_memory() => {
                self.process_events(inner, true)?;
                let retry = inner.driver.with_upstream(|policy, up| {
                    policy.release_cached(ReleaseTarget::All, up);
                    adopt(policy, up)
                });
                match retry {
                    Err(AdoptError::Upstream(cause)) if cause.is_out_of_memory() => {
                        let request = AllocRequest {
                            size: segment.size,
                            stream: segment.stream,
                        };
                        let failure = Exhausted {
                            attempted: segment.size,
                            cause,
                        };
                        return Err(self.out_of_memory(inner, request, failure).into());
                    }
                    other => other,
                }
            }
            other => other,
        };
        let blocks = blocks.map_err(|error| match error {
            AdoptError::Upstream(UpstreamError::Device(e)) => PoolError::Device(e).into(),
            other => other,
        })?;
        let mut allocations = Vec::with_capacity(blocks.len());
        for block in blocks {
            allocations.push(Self::hand_out(inner, &block));
        }
        Ok(allocations)
    }
}

/// A snapshot of how the pool and the device are used, printable like CUDA.jl's `pool_status`
/// with a fragmentation line.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct PoolStatus {
    /// The name of the policy in force.
    pub policy: &'static str,
    /// Whether the policy caches freed blocks.
    pub caches: bool,
    /// Device bytes in use by anyone.
    pub device_used: u64,
    /// Device total.
    pub device_total: u64,
    /// Bytes allocated from the pool.
    pub allocated: u64,
    /// Bytes the pool reserved from the device.
    pub reserved: u64,
    /// The largest cached block.
    pub largest_free_block: u64,
    /// Soft limit in bytes, if set.
    pub soft_limit: Option<u64>,
    /// Hard limit in bytes, if set.
    pub hard_limit: Option<u64>,
}

impl PoolStatus {
    /// Allocated / reserved: 1.0 means no cached or fragmented memory.
    pub fn utilization(&self) -> f64 {
        if self.reserved == 0 {
            1.0
        } else {
            self.allocated as f64 / self.reserved as f64
        }
    }
}

impl fmt::Display for PoolStatus {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        writeln!(
            f,
            "Effective GPU memory usage: {:.2}% ({}/{})",
            100.0 * self.device_used as f64 / self.device_total.max(1) as f64,
            Bytes(self.device_used),
            Bytes(self.device_total)
        )?;
        if !self.caches {
            writeln!(
                f,
                "No memory pool is in use (policy {} caches nothing).",
                self.policy
            )?;
        } else {
            writeln!(
                f,
                "Memory pool usage: {} ({} reserved), policy {}",
                Bytes(self.allocated),
                Bytes(self.reserved),
                self.policy
            )?;
        }
        let limit = |l: Option<u64>| l.map_or("none".to_string(), |b| Bytes(b).to_string());
        writeln!(
            f,
            "Memory limit: soft = {}, hard = {}",
            limit(self.soft_limit),
            limit(self.hard_limit)
        )?;
        write!(
            f,
            "Fragmentation: {} reserved but unallocated, largest free block {}, utilization {:.1}%",
            Bytes(self.reserved.saturating_sub(self.allocated)),
            Bytes(self.largest_free_block),
            100.0 * self.utilization()
        )
    }
}
