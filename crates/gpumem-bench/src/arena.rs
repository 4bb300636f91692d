//! The allocators under test behind one small trait: the three Rust peers over one fixed arena,
//! each gpumem policy through a [`Pool`] on the address-only simulated device, and each policy
//! alone through a [`PolicyDriver`].

use std::sync::{Arc, Mutex};

use buddy_system_allocator::FrameAllocator;
use gpumem_device::sim::{SimConfig, SimDevice};
use gpumem_device::{AddressMap, StreamId};
use gpumem_pool::{AllocRequest, Block, PolicyDriver, PolicyKind, Pool, PoolConfig};
use offset_allocator::Allocation;
use range_alloc::RangeAllocator;

use crate::workload::Scenario;

/// Offsets of the peers are counted in units of this many bytes (cudaMalloc's granularity; and
/// offset-allocator's offsets are u32, so 512-byte units reach 2 TiB).
pub const UNIT: u64 = 512;

/// An allocator the harness can drive.
///
/// Handles are `Copy` values the driver keeps in its slot table; an allocator that needs the
/// size back on free keeps it in its handle.
pub trait Arena {
    /// What `alloc` returns and `free` takes back.
    type Handle: Copy;

    /// Allocates `size` bytes; `None` on failure (the driver counts it and skips its free).
    fn alloc(&mut self, size: u64) -> Option<Self::Handle>;

    /// Frees a handle from [`Arena::alloc`].
    fn free(&mut self, handle: Self::Handle);

    /// The bytes `[start, end)` a live handle occupies (after the allocator's rounding).
    fn span(&self, handle: Self::Handle) -> (u64, u64);

    /// Peak bytes obtained from the device, for allocators that obtain memory (pools). Fixed
    /// arenas return `None`, and their footprint is the high-water mark of their spans.
    fn peak_reserved(&self) -> Option<u64> {
        None
    }

    /// `(cached free bytes, largest free block)` right now, for allocators that can tell
    /// (pools). Fixed arenas return `None`; the driver then computes both from the live spans
    /// below the high-water mark.
    fn free_space(&self) -> Option<(u64, u64)> {
        None
    }
}

/// Every allocator the benchmarks compare.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash)]
pub enum Allocator {
    /// `offset-allocator` 0.2 (TLSF-like, O(1)), the reference for per-op cost.
    OffsetAllocator,
    /// `offset-allocator` behind the frame a device pool needs: a mutex (callers share it
    /// across threads) and a table from address to allocation (callers free by pointer, as
    /// `cudaFree` and PyTorch's pluggable allocator do). The reference for `pool/<policy>`.
    FramedOffsetAllocator,
    /// `range-alloc` 0.1 (best fit by linear scan, O(free ranges)).
    RangeAlloc,
    /// `buddy_system_allocator` 0.13 `FrameAllocator` (binary buddy, power-of-two rounding).
    Buddy,
    /// A gpumem policy through [`Pool`] on the address-only simulated device.
    Pool(PolicyKind),
    /// A gpumem policy driven directly through its [`gpumem_pool::Upstream`], without the pool
    /// frame (no mutex, live table, block statistics or events): the policy's own cost.
    Policy(PolicyKind),
}

impl Allocator {
    /// All allocators, peers first, then every gpumem policy.
    pub fn all() -> Vec<Allocator> {
        let mut v = vec![
            Allocator::OffsetAllocator,
            Allocator::FramedOffsetAllocator,
            Allocator::RangeAlloc,
            Allocator::Buddy,
        ];
        v.extend(PolicyKind::ALL.iter().map(|&p| Allocator::Pool(p)));
        v.extend(
            PolicyKind::ALL
                .iter()
                .filter(|&&p| p != PolicyKind::None)
                .map(|&p| Allocator::Policy(p)),
        );
        v
    }

    /// Name in tables and benchmark ids.
    pub fn name(self) -> String {
        match self {
            Allocator::OffsetAllocator => "offset-allocator".into(),
            Allocator::FramedOffsetAllocator => "offset-allocator+frame".into(),
            Allocator::RangeAlloc => "range-alloc".into(),
            Allocator::Buddy => "buddy_system_allocator".into(),
            Allocator::Pool(p) => format!("pool/{p}"),
            Allocator::Policy(p) => format!("policy/{p}"),
        }
    }

    /// Whether it is a gpumem policy (through the pool or directly).
    pub fn is_pool(self) -> bool {
        matches!(self, Allocator::Pool(_) | Allocator::Policy(_))
    }

    /// Largest live-block count at which the criterion benchmarks include this allocator:
    /// range-alloc's best fit scans every free range, so a steady state with 10⁵ holes costs
    /// seconds per body and would make the benchmark run for minutes.
    pub fn criterion_max_live(self) -> usize {
        match self {
            Allocator::RangeAlloc => 10_000,
            _ => usize::MAX,
        }
    }
}

/// Size in units of the fixed arena the peers get for `w`: 4× the peak live bytes, at least
/// 512 MiB, rounded up to a power of two (the buddy allocator's best case), at most 2³¹ units
/// (1 TiB) so that u32 offsets and sizes never overflow.
pub fn arena_units(w: &Scenario) -> u64 {
    let need = (w.peak_live_bytes.div_ceil(UNIT) * 4).max((512 << 20) / UNIT);
    need.next_power_of_two().min(1 << 31)
}

fn units(size: u64) -> u64 {
    size.div_ceil(UNIT).max(1)
}

/// `offset-allocator` over `arena_units` units, with room for every live block and free node.
pub struct OffsetArena {
    inner: offset_allocator::Allocator<u32>,
}

impl OffsetArena {
    /// An arena sized for `w`; `max_allocs` covers the live blocks plus the free regions
    /// between them (at most one more than the live blocks), as the crate needs.
    pub fn new(w: &Scenario) -> Self {
        let max_allocs = (2 * w.max_live_blocks + 1024).min(u32::MAX as usize - 2) as u32;
        OffsetArena {
            inner: offset_allocator::Allocator::with_max_allocs(arena_units(w) as u32, max_allocs),
        }
    }
}

impl Arena for OffsetArena {
    type Handle = (Allocation<u32>, u32);

    #[inline]
    fn alloc(&mut self, size: u64) -> Option<Self::Handle> {
        let u = units(size);
        if u > u32::MAX as u64 {
            return None;
        }
        self.inner.allocate(u as u32).map(|a| (a, u as u32))
    }

    #[inline]
    fn free(&mut self, handle: Self::Handle) {
        self.inner.free(handle.0);
    }

    fn span(&self, (a, u): Self::Handle) -> (u64, u64) {
        let start = a.offset as u64 * UNIT;
        (start, start + u as u64 * UNIT)
    }
}

/// [`OffsetArena`] behind a mutex and an address table, freed by address: what a pool's
/// frame adds to any placement structure, so that `pool/<policy>` rows have a peer doing the
/// same job.
pub struct FramedOffsetArena {
    inner: Mutex<FramedOffset>,
}

struct FramedOffset {
    arena: OffsetArena,
    live: AddressMap<(Allocation<u32>, u32)>,
}

impl FramedOffsetArena {
    /// An arena sized for `w`, as [`OffsetArena::new`].
    pub fn new(w: &Scenario) -> Self {
        FramedOffsetArena {
            inner: Mutex::new(FramedOffset {
                arena: OffsetArena::new(w),
                live: AddressMap::default(),
            }),
        }
    }
}

impl Arena for FramedOffsetArena {
    type Handle = (u64, u64);

    #[inline]
    fn alloc(&mut self, size: u64) -> Option<Self::Handle> {
        let mut guard = self.inner.lock().unwrap_or_else(|p| p.into_inner());
        let state = &mut *guard;
        let handle = state.arena.alloc(size)?;
        let (start, _) = state.arena.span(handle);
        state.live.insert(start, handle);
        Some((start, size))
    }

    #[inline]
    fn free(&mut self, (ptr, _): Self::Handle) {
        let mut guard = self.inner.lock().unwrap_or_else(|p| p.into_inner());
        let state = &mut *guard;
        if let Some(handle) = state.live.remove(&ptr) {
            state.arena.free(handle);
        }
    }

    fn span(&self, (ptr, size): Self::Handle) -> (u64, u64) {
        (ptr, ptr + units(size) * UNIT)
    }
}

/// `range-alloc` over `0..arena_units` units.
pub struct RangeArena {
    inner: RangeAllocator<u64>,
}

impl RangeArena {
    /// An arena sized for `w`.
    pub fn new(w: &Scenario) -> Self {
        RangeArena {
            inner: RangeAllocator::new(0..arena_units(w)),
        }
    }
}

impl Arena for RangeArena {
    type Handle = (u64, u64);

    #[inline]
    fn alloc(&mut self, size: u64) -> Option<Self::Handle> {
        self.inner
            .allocate_range(units(size))
            .ok()
            .map(|r| (r.start, r.end))
    }

    #[inline]
    fn free(&mut self, (start, end): Self::Handle) {
        self.inner.free_range(start..end);
    }

    fn span(&self, (start, end): Self::Handle) -> (u64, u64) {
        (start * UNIT, end * UNIT)
    }
}

/// `buddy_system_allocator::FrameAllocator` over `0..arena_units` frames of 512 bytes.
pub struct BuddyArena {
    inner: FrameAllocator<33>,
}

impl BuddyArena {
    /// An arena sized for `w`.
    pub fn new(w: &Scenario) -> Self {
        let mut inner = FrameAllocator::<33>::new();
        inner.add_frame(0, arena_units(w) as usize);
        BuddyArena { inner }
    }
}

impl Arena for BuddyArena {
    type Handle = (usize, usize);

    #[inline]
    fn alloc(&mut self, size: u64) -> Option<Self::Handle> {
        let count = units(size) as usize;
        self.inner.alloc(count).map(|start| (start, count))
    }

    #[inline]
    fn free(&mut self, (start, count): Self::Handle) {
        self.inner.dealloc(start, count);
    }

    fn span(&self, (start, count): Self::Handle) -> (u64, u64) {
        // The buddy system hands out the next power of two.
        let start = start as u64 * UNIT;
        (start, start + count.next_power_of_two() as u64 * UNIT)
    }
}

/// A gpumem policy through [`Pool`] (its mutex, live table, statistics; history off) over an
/// address-only [`SimDevice`] of 1 PiB, as `gpumem replay` runs it. Every allocation is on the
/// default stream.
pub struct PoolArena {
    pool: Pool,
}

/// Capacity of the simulated device under a [`PoolArena`]: large enough never to limit.
pub const POOL_DEVICE_CAPACITY: u64 = 1 << 50;

impl PoolArena {
    /// A fresh pool with `policy` (default settings otherwise).
    pub fn new(policy: PolicyKind) -> Self {
        let device = Arc::new(
            SimDevice::new(SimConfig::address_only(POOL_DEVICE_CAPACITY))
                .expect("address-only simulated device"),
        );
        let pool = Pool::new(
            device,
            PoolConfig {
                policy,
                ..PoolConfig::default()
            },
        )
        .expect("pool with default settings");
        PoolArena { pool }
    }

    /// The pool, for statistics.
    pub fn pool(&self) -> &Pool {
        &self.pool
    }
}

impl Arena for PoolArena {
    type Handle = (u64, u64);

    #[inline]
    fn alloc(&mut self, size: u64) -> Option<Self::Handle> {
        self.pool
            .allocate(size, StreamId::DEFAULT)
            .ok()
            .map(|a| (a.ptr, size))
    }

    #[inline]
    fn free(&mut self, (ptr, _): Self::Handle) {
        let freed = self.pool.free(ptr);
        debug_assert!(freed.is_ok(), "pool free failed: {freed:?}");
    }

    fn span(&self, (ptr, size): Self::Handle) -> (u64, u64) {
        (ptr, ptr + size)
    }

    fn peak_reserved(&self) -> Option<u64> {
        Some(self.pool.stats().reserved_bytes.all.peak)
    }

    fn free_space(&self) -> Option<(u64, u64)> {
        let status = self.pool.status().ok()?;
        Some((
            status.reserved.saturating_sub(status.allocated),
            status.largest_free_block,
        ))
    }
}

/// A gpumem policy driven directly through a [`PolicyDriver`] (`Policy::allocate` /
/// `Policy::free` through its upstream layers) over the address-only [`SimDevice`] (hard limit
/// none, history off), as the pool calls them but without the pool around it. A failed
/// allocation is not retried after a reclaim (the device is never full here).
pub struct PolicyArena {
    driver: PolicyDriver,
    allocated: u64,
}

impl PolicyArena {
    /// A fresh policy of `kind` with default settings.
    pub fn new(kind: PolicyKind) -> Self {
        let config = PoolConfig {
            policy: kind,
            ..PoolConfig::default()
        };
        let device = SimDevice::new(SimConfig::address_only(POOL_DEVICE_CAPACITY))
            .expect("address-only simulated device");
        PolicyArena {
            driver: PolicyDriver::new(
                Arc::new(device),
                kind.build(&config).expect("default settings"),
                None,
            ),
            allocated: 0,
        }
    }
}

impl Arena for PolicyArena {
    type Handle = Block;

    #[inline]
    fn alloc(&mut self, size: u64) -> Option<Block> {
        let request = AllocRequest {
            size,
            stream: StreamId::DEFAULT,
        };
        let block = self.driver.allocate(request).ok()?;
        self.allocated += block.size;
        Some(block)
    }

    #[inline]
    fn free(&mut self, block: Block) {
        self.allocated -= block.size;
        self.driver.free(block);
    }

    fn span(&self, block: Block) -> (u64, u64) {
        (block.addr, block.addr + block.size)
    }

    fn peak_reserved(&self) -> Option<u64> {
        Some(self.driver.stats().reserved_bytes.all.peak)
    }

    fn free_space(&self) -> Option<(u64, u64)> {
        Some((
            self.driver
                .stats()
                .reserved_bytes
                .all
                .current
                .saturating_sub(self.allocated),
            self.driver.policy().largest_free_block(),
        ))
    }
}

/// Something to run with whichever concrete arena an [`Allocator`] names (the harness is
/// generic, so each allocator's loop is compiled for it, with no dynamic dispatch).
pub trait WithArena {
    /// What the visit returns.
    type Output;
    /// Runs with a constructor of fresh arenas.
    fn run<A: Arena + 'static>(self, make: &dyn Fn() -> A) -> Self::Output;
}

/// Calls `visitor` with a constructor of fresh arenas of `allocator`, sized for `w`.
pub fn with_arena<V: WithArena>(allocator: Allocator, w: &Scenario, visitor: V) -> V::Output {
    match allocator {
        Allocator::OffsetAllocator => visitor.run(&|| OffsetArena::new(w)),
        Allocator::FramedOffsetAllocator => visitor.run(&|| FramedOffsetArena::new(w)),
        Allocator::RangeAlloc => visitor.run(&|| RangeArena::new(w)),
        Allocator::Buddy => visitor.run(&|| BuddyArena::new(w)),
        Allocator::Pool(p) => visitor.run(&|| PoolArena::new(p)),
        Allocator::Policy(p) => visitor.run(&|| PolicyArena::new(p)),
    }
}
