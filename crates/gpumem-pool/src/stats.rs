//! Memory statistics with PyTorch's `torch.cuda.memory_stats()` keys and update rules, so that
//! tools reading PyTorch's stats read ours unchanged.

use std::collections::BTreeMap;

/// Which of PyTorch's two block pools a block or segment belongs to: requests of at most 1 MiB
/// are "small", larger ones "large". Policies without that split report everything as large.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash, PartialOrd, Ord)]
pub enum SizeClass {
    /// Requests ≤ 1 MiB.
    Small,
    /// Requests > 1 MiB.
    Large,
}

/// Requests up to this size count as small-pool requests (PyTorch's `kSmallSize`).
pub const SMALL_REQUEST_MAX: u64 = 1 << 20;

impl SizeClass {
    /// The pool PyTorch would account a request of `size` bytes to.
    pub fn for_request(size: u64) -> SizeClass {
        if size <= SMALL_REQUEST_MAX {
            SizeClass::Small
        } else {
            SizeClass::Large
        }
    }

    /// The key PyTorch uses for this pool.
    pub fn key(self) -> &'static str {
        match self {
            SizeClass::Small => "small_pool",
            SizeClass::Large => "large_pool",
        }
    }
}

/// One statistic: its current value, its peak since the last reset, and the historical totals
/// of increases (`allocated`) and decreases (`freed`).
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq)]
pub struct Stat {
    /// Value now.
    pub current: u64,
    /// Highest value since creation or the last peak reset.
    pub peak: u64,
    /// Sum of all increases.
    pub allocated: u64,
    /// Sum of all decreases.
    pub freed: u64,
}

impl Stat {
    /// Adds `n`: current and allocated grow, peak follows.
    pub fn increase(&mut self, n: u64) {
        self.current += n;
        self.allocated += n;
        self.peak = self.peak.max(self.current);
    }

    /// Subtracts `n`: current shrinks, freed grows.
    pub fn decrease(&mut self, n: u64) {
        debug_assert!(n <= self.current, "stat would go negative");
        self.current = self.current.saturating_sub(n);
        self.freed += n;
    }

    fn reset_peak(&mut self) {
        self.peak = self.current;
    }

    fn reset_accumulated(&mut self) {
        self.allocated = 0;
        self.freed = 0;
    }
}

/// A statistic split by pool: `all`, `small_pool`, `large_pool`.
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq)]
pub struct StatArray {
    /// Both pools together.
    pub all: Stat,
    /// The small pool.
    pub small_pool: Stat,
    /// The large pool.
    pub large_pool: Stat,
}

impl StatArray {
    /// Adds `n` to `all` and to `pool`.
    pub fn increase(&mut self, pool: SizeClass, n: u64) {
        self.all.increase(n);
        self.pool_mut(pool).increase(n);
    }

    /// Subtracts `n` from `all` and from `pool`.
    pub fn decrease(&mut self, pool: SizeClass, n: u64) {
        self.all.decrease(n);
        self.pool_mut(pool).decrease(n);
    }

    /// The statistic of one size class.
    pub fn get(&self, pool: SizeClass) -> &Stat {
        match pool {
            SizeClass::Small => &self.small_pool,
            SizeClass::Large => &self.large_pool,
        }
    }

    fn pool_mut(&mut self, pool: SizeClass) -> &mut Stat {
        match pool {
            SizeClass::Small => &mut self.small_pool,
            SizeClass::Large => &mut self.large_pool,
        }
    }

    fn each_mut(&mut self) -> [&mut Stat; 3] {
        [&mut self.all, &mut self.small_pool, &mut self.large_pool]
    }
}

/// Every statistic a pool keeps, named as in `torch.cuda.memory_stats()`.
#[derive(Clone, Debug, Default, PartialEq, Eq)]
pub struct MemoryStats {
    /// Number of live allocations (PyTorch's key is `allocation`).
    pub allocation: StatArray,
    /// Number of device segments (cudaMalloc'd ranges, or expandable segments).
    pub segment: StatArray,
    /// Number of active blocks: allocated, or freed but waiting on a stream event.
    pub active: StatArray,
    /// Number of free blocks inside split segments (not releasable without the rest).
    pub inactive_split: StatArray,
    /// Bytes of allocated blocks (after rounding).
    pub allocated_bytes: StatArray,
    /// Bytes reserved from the device.
    pub reserved_bytes: StatArray,
    /// Bytes of active blocks.
    pub active_bytes: StatArray,
    /// Bytes of inactive split blocks.
    pub inactive_split_bytes: StatArray,
    /// Bytes as requested, before rounding.
    pub requested_bytes: StatArray,
    /// Allocations of at least `max_split_size`.
    pub oversize_allocations: Stat,
    /// Segments of at least `max_split_size`.
    pub oversize_segments: Stat,
    /// Allocations that succeeded only after freeing the whole cache.
    pub num_alloc_retries: u64,
    /// Allocations that failed with out-of-memory.
    pub num_ooms: u64,
    /// Full synchronisations of pending cross-stream frees.
    pub num_sync_all_streams: u64,
    /// Device allocations and mappings.
    pub num_device_alloc: u64,
    /// Device frees and unmappings.
    pub num_device_free: u64,
    /// The split threshold in force (`u64::MAX` when unlimited), as PyTorch reports it.
    pub max_split_size: u64,
    /// Every call made to the device's memory API, by kind (gpumem's own; PyTorch counts
    /// only [`MemoryStats::num_device_alloc`] and [`MemoryStats::num_device_free`]).
    pub device_calls: DeviceCalls,
}

/// Calls a pool made to its device's memory API, by kind, failed calls included: counted by
/// the layer every device call goes through ([`crate::Upstream`]), so they read the same on
/// every backend.
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq)]
pub struct DeviceCalls {
    /// `malloc` (`cudaMalloc`).
    pub malloc: u64,
    /// `free` (`cudaFree`).
    pub free: u64,
    /// Address reservations (`cuMemAddressReserve`).
    pub reserve: u64,
    /// Reservations returned (`cuMemAddressFree`).
    pub release_reservation: u64,
    /// Physical chunks created (`cuMemCreate`).
    pub create_physical: u64,
    /// Physical chunks released (`cuMemRelease`).
    pub release_physical: u64,
    /// Mappings (`cuMemMap`).
    pub map: u64,
    /// Unmappings (`cuMemUnmap`).
    pub unmap: u64,
    /// Waits for the device, a stream or an event (`cudaStreamSynchronize`,
    /// `cudaEventSynchronize`) so that memory could be unmapped or released; `cudaFree`'s own
    /// implicit synchronisation is counted under `free`.
    pub synchronize: u64,
    /// Events recorded to order a later use of memory after earlier work.
    pub record_event: u64,
    /// Streams made to wait for such an event (`cudaStreamWaitEvent`).
    pub stream_wait_event: u64,
    /// Queries whether such an event has completed (`cudaEventQuery`).
    pub event_query: u64,
}

impl DeviceCalls {
    /// Calls that allocate or map device memory: what a pool should make rarely.
    pub fn allocating(&self) -> u64 {
        self.malloc + self.create_physical + self.map
    }

    /// Calls that free or unmap device memory.
    pub fn freeing(&self) -> u64 {
        self.free + self.release_physical + self.unmap
    }

    /// Synchronisations, `cudaFree`'s implicit ones included: each stalls the host until the
    /// GPU has caught up.
    pub fn synchronizing(&self) -> u64 {
        self.synchronize + self.free
    }

    fn named(&self) -> [(&'static str, u64); 12] {
        [
            ("malloc", self.malloc),
            ("free", self.free),
            ("reserve", self.reserve),
            ("release_reservation", self.release_reservation),
            ("create_physical", self.create_physical),
            ("release_physical", self.release_physical),
            ("map", self.map),
            ("unmap", self.unmap),
            ("synchronize", self.synchronize),
            ("record_event", self.record_event),
            ("stream_wait_event", self.stream_wait_event),
            ("event_query", self.event_query),
        ]
    }
}

/// One statistic as a labelled record — the form metrics exporters and loggers want — beside
/// the dotted key PyTorch uses ([`StatRecord::key`]).
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct StatRecord {
    /// The statistic, e.g. `allocated_bytes`, `num_ooms`, `device_calls`.
    pub name: &'static str,
    /// `all`, `small_pool` or `large_pool` for statistics kept per size class.
    pub size_class: Option<&'static str>,
    /// `current`, `peak`, `allocated` or `freed` for gauges; the call kind for
    /// `device_calls`; `None` for plain counters.
    pub field: Option<&'static str>,
    /// The value.
    pub value: u64,
}

impl StatRecord {
    /// PyTorch's flattened key, e.g. `allocated_bytes.all.peak`, `num_alloc_retries`.
    pub fn key(&self) -> String {
        [Some(self.name), self.size_class, self.field]
            .into_iter()
            .flatten()
            .collect::<Vec<_>>()
            .join(".")
    }
}

impl MemoryStats {
    /// Sets every peak to its current value (`torch.cuda.reset_peak_memory_stats`).
    pub fn reset_peaks(&mut self) {
        for array in self.arrays_mut() {
            for stat in array.each_mut() {
                stat.reset_peak();
            }
        }
        self.oversize_allocations.reset_peak();
        self.oversize_segments.reset_peak();
    }

    /// Zeroes the historical totals and counters (`torch.cuda.reset_accumulated_memory_stats`).
    pub fn reset_accumulated(&mut self) {
        for array in self.arrays_mut() {
            for stat in array.each_mut() {
                stat.reset_accumulated();
            }
        }
        self.oversize_allocations.reset_accumulated();
        self.oversize_segments.reset_accumulated();
        self.num_alloc_retries = 0;
        self.num_ooms = 0;
        self.num_sync_all_streams = 0;
        self.num_device_alloc = 0;
        self.num_device_free = 0;
        self.device_calls = DeviceCalls::default();
    }

    /// Every statistic as a labelled record, in a fixed order.
    pub fn records(&self) -> Vec<StatRecord> {
        let mut records = Vec::with_capacity(160);
        let mut gauge = |name, size_class, stat: &Stat| {
            for (field, value) in [
                ("current", stat.current),
                ("peak", stat.peak),
                ("allocated", stat.allocated),
                ("freed", stat.freed),
            ] {
                records.push(StatRecord {
                    name,
                    size_class,
                    field: Some(field),
                    value,
                });
            }
        };
        for (name, array) in self.arrays() {
            gauge(name, Some("all"), &array.all);
            for class in [SizeClass::Small, SizeClass::Large] {
                gauge(name, Some(class.key()), array.get(class));
            }
        }
        gauge("oversize_allocations", None, &self.oversize_allocations);
        gauge("oversize_segments", None, &self.oversize_segments);
        for (name, value) in [
            ("num_alloc_retries", self.num_alloc_retries),
            ("num_ooms", self.num_ooms),
            ("num_sync_all_streams", self.num_sync_all_streams),
            ("num_device_alloc", self.num_device_alloc),
            ("num_device_free", self.num_device_free),
            ("max_split_size", self.max_split_size),
        ] {
            records.push(StatRecord {
                name,
                size_class: None,
                field: None,
                value,
            });
        }
        for (kind, value) in self.device_calls.named() {
            records.push(StatRecord {
                name: "device_calls",
                size_class: None,
                field: Some(kind),
                value,
            });
        }
        records
    }

    /// The flattened key → value map that `torch.cuda.memory_stats()` returns, e.g.
    /// `allocated_bytes.all.peak`, `num_alloc_retries` (plus gpumem's `device_calls.<kind>`).
    pub fn to_map(&self) -> BTreeMap<String, u64> {
        self.records()
            .into_iter()
            .map(|record| (record.key(), record.value))
            .collect()
    }

    fn arrays(&self) -> [(&'static str, &StatArray); 9] {
        [
            ("allocation", &self.allocation),
            ("segment", &self.segment),
            ("active", &self.active),
            ("inactive_split", &self.inactive_split),
            ("allocated_bytes", &self.allocated_bytes),
            ("reserved_bytes", &self.reserved_bytes),
            ("active_bytes", &self.active_bytes),
            ("inactive_split_bytes", &self.inactive_split_bytes),
            ("requested_bytes", &self.requested_bytes),
        ]
    }

    fn arrays_mut(&mut self) -> [&mut StatArray; 9] {
        [
            &mut self.allocation,
            &mut self.segment,
            &mut self.active,
            &mut self.inactive_split,
            &mut self.allocated_bytes,
            &mut self.reserved_bytes,
            &mut self.active_bytes,
            &mut self.inactive_split_bytes,
            &mut self.requested_bytes,
        ]
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn update_rules_follow_pytorch() {
        let mut s = MemoryStats::default();
        s.allocated_bytes.increase(SizeClass::Large, 100);
        s.allocated_bytes.increase(SizeClass::Small, 10);
        s.allocated_bytes.decrease(SizeClass::Large, 100);
        let m = s.to_map();
        assert_eq!(m["allocated_bytes.all.current"], 10);
        assert_eq!(m["allocated_bytes.all.peak"], 110);
        assert_eq!(m["allocated_bytes.all.allocated"], 110);
        assert_eq!(m["allocated_bytes.all.freed"], 100);
        assert_eq!(m["allocated_bytes.large_pool.peak"], 100);
        s.reset_peaks();
        assert_eq!(s.allocated_bytes.all.peak, 10);
        s.reset_accumulated();
        assert_eq!(s.allocated_bytes.all.allocated, 0);
        assert_eq!(s.allocated_bytes.all.current, 10);
    }

    #[test]
    fn map_has_every_pytorch_key() {
        let m = MemoryStats::default().to_map();
        for key in [
            "allocation.all.current",
            "segment.small_pool.peak",
            "active_bytes.large_pool.freed",
            "inactive_split_bytes.all.allocated",
            "requested_bytes.all.current",
            "reserved_bytes.all.peak",
            "oversize_allocations.current",
            "oversize_segments.peak",
            "num_alloc_retries",
            "num_ooms",
            "num_sync_all_streams",
            "num_device_alloc",
            "num_device_free",
            "max_split_size",
        ] {
            assert!(m.contains_key(key), "{key}");
        }
        assert_eq!(m.len(), 9 * 3 * 4 + 2 * 4 + 6 + 12);
        assert_eq!(m["device_calls.map"], 0);
    }
}
