//! The `expandable` policy: PyTorch's expandable segments over the simulated device's
//! virtual-memory calls (`c10/cuda/CUDACachingAllocator.cpp`, Note [Expandable Segments]).

use std::sync::Arc;

use gpumem_device::sim::{SimConfig, SimDevice};
use gpumem_device::StreamId;
use gpumem_pool::policies::torch_settings::TorchSettings;
use gpumem_pool::{Action, Limit, PolicyKind, Pool, PoolConfig, PoolError, PoolOptions};

const MIB: u64 = 1 << 20;
const S0: StreamId = StreamId::DEFAULT;

fn sim(capacity: u64) -> Arc<SimDevice> {
    Arc::new(SimDevice::new(SimConfig::host(capacity)).unwrap())
}

fn expandable(device: &Arc<SimDevice>, conf: &str, hard_limit: Option<u64>) -> Pool {
    Pool::new(
        device.clone(),
        PoolConfig {
            policy: PolicyKind::Expandable,
            torch: TorchSettings::parse(conf).unwrap(),
            options: PoolOptions {
                hard_limit: hard_limit.map(Limit::Bytes),
                history_capacity: 1000,
                ..PoolOptions::default()
            },
            ..PoolConfig::default()
        },
    )
    .unwrap()
}

/// (address, size, [(block size, in use)]) per contiguous mapped range, in address order.
type Layout = Vec<(u64, u64, Vec<(u64, bool)>)>;

fn layout(pool: &Pool) -> Layout {
    pool.segments()
        .iter()
        .map(|s| {
            assert!(s.is_expandable);
            (
                s.address,
                s.total_size,
                s.blocks.iter().map(|b| (b.size, b.in_use)).collect(),
            )
        })
        .collect()
}

#[test]
fn one_segment_grows_by_20_mib_chunks_and_splits_any_remainder() {
    let dev = sim(1024 * MIB);
    let pool = expandable(&dev, "", None);
    let a = pool.allocate(3 * MIB, S0).unwrap();
    let s = pool.stats();
    assert_eq!(s.reserved_bytes.large_pool.current, 20 * MIB);
    assert_eq!(s.num_device_alloc, 1);
    // PyTorch counts neither expandable segments nor their free pieces as segments or
    // inactive splits.
    assert_eq!(s.segment.all.current, 0);
    assert_eq!(s.inactive_split.all.current, 0);
    // The 17 MiB free block grows into the unmapped space after it: one more chunk.
    let b = pool.allocate(30 * MIB, S0).unwrap();
    assert_eq!(b.ptr, a.ptr + 3 * MIB);
    let s = pool.stats();
    assert_eq!(s.reserved_bytes.large_pool.current, 40 * MIB);
    assert_eq!(s.num_device_alloc, 2);
    assert_eq!(
        layout(&pool),
        vec![(
            a.ptr,
            40 * MIB,
            vec![(3 * MIB, true), (30 * MIB, true), (7 * MIB, false)]
        )]
    );
    // Small requests get their own segment, growing by 2 MiB chunks.
    let c = pool.allocate(1000, S0).unwrap();
    let s = pool.stats();
    assert_eq!(s.reserved_bytes.small_pool.current, 2 * MIB);
    assert_eq!(
        dev.counters().reserve,
        2,
        "one reservation per (stream, pool)"
    );
    for p in [a.ptr, b.ptr, c.ptr] {
        pool.free(p).unwrap();
    }
    assert_eq!(pool.empty_cache().unwrap(), 42 * MIB);
    let s = pool.stats();
    assert_eq!(s.reserved_bytes.all.current, 0);
    // As PyTorch counts them: one unmap per contiguous range (the large pool's two chunks
    // go together), one map per growth.
    assert_eq!((s.num_device_alloc, s.num_device_free), (3, 2));
    assert_eq!(
        dev.counters().unmap,
        3,
        "the device still sees one unmap per chunk"
    );
    assert_eq!(dev.used(), 0);
    assert!(pool.segments().is_empty());
    assert_eq!(dev.counters().release_reservation, 2);
    let actions: Vec<Action> = pool.history().iter().map(|e| e.action).collect();
    assert_eq!(
        actions.iter().filter(|&&a| a == Action::SegmentMap).count(),
        3
    );
    assert_eq!(actions.last(), Some(&Action::SegmentUnmap));
}

#[test]
fn reclaim_unmaps_only_empty_chunks_and_new_memory_fills_the_hole_first() {
    let dev = sim(1024 * MIB);
    let pool = expandable(&dev, "", None);
    let a = pool.allocate(20 * MIB, S0).unwrap();
    let b = pool.allocate(20 * MIB, S0).unwrap();
    let c = pool.allocate(20 * MIB, S0).unwrap();
    assert_eq!((b.ptr, c.ptr), (a.ptr + 20 * MIB, a.ptr + 40 * MIB));
    pool.free(b.ptr).unwrap();
    assert_eq!(pool.empty_cache().unwrap(), 20 * MIB);
    assert_eq!(
        layout(&pool),
        vec![
            (a.ptr, 20 * MIB, vec![(20 * MIB, true)]),
            (c.ptr, 20 * MIB, vec![(20 * MIB, true)])
        ]
    );
    // The lowest address that fits is the hole, not the end of the segment.
    let d = pool.allocate(20 * MIB, S0).unwrap();
    assert_eq!(d.ptr, b.ptr);
    assert_eq!(
        layout(&pool),
        vec![(
            a.ptr,
            60 * MIB,
            vec![(20 * MIB, true), (20 * MIB, true), (20 * MIB, true)]
        )]
    );
}

#[test]
fn partly_used_chunks_stay_mapped_on_reclaim() {
    let dev = sim(1024 * MIB);
    let pool = expandable(&dev, "", None);
    let a = pool.allocate(30 * MIB, S0).unwrap();
    let b = pool.allocate(30 * MIB, S0).unwrap();
    assert_eq!(pool.stats().reserved_bytes.all.current, 60 * MIB);
    pool.free(a.ptr).unwrap();
    // a spans chunk 0 and half of chunk 1: only chunk 0 is empty.
    assert_eq!(pool.empty_cache().unwrap(), 20 * MIB);
    assert_eq!(
        layout(&pool),
        vec![(
            a.ptr + 20 * MIB,
            40 * MIB,
            vec![(10 * MIB, false), (30 * MIB, true)]
        )]
    );
    // 25 MiB fits the 10 MiB sliver only together with the hole before it: the lowest
    // fitting address is chunk 0, mapped again and merged with the sliver.
    let c = pool.allocate(25 * MIB, S0).unwrap();
    assert_eq!(c.ptr, a.ptr);
    pool.free(b.ptr).unwrap();
    pool.free(c.ptr).unwrap();
    pool.empty_cache().unwrap();
    assert_eq!(pool.stats().reserved_bytes.all.current, 0);
    assert_eq!(dev.used(), 0);
}

#[test]
fn segments_are_per_stream() {
    let dev = sim(1024 * MIB);
    let pool = expandable(&dev, "", None);
    let a = pool.allocate(4 * MIB, S0).unwrap();
    pool.free(a.ptr).unwrap();
    let b = pool.allocate(4 * MIB, StreamId(7)).unwrap();
    assert_ne!(b.ptr, a.ptr);
    assert_eq!(dev.counters().reserve, 2);
    assert_eq!(pool.allocate(4 * MIB, S0).unwrap().ptr, a.ptr);
}

#[test]
fn the_hard_limit_is_checked_against_the_segment_size_as_pytorch_does() {
    let dev = sim(1024 * MIB);
    let pool = expandable(&dev, "", Some(30 * MIB));
    pool.allocate(3 * MIB, S0).unwrap();
    // 12 MiB would fit in the mapped 20 MiB, so it needs no new memory.
    pool.allocate(12 * MIB, S0).unwrap();
    // 10 MiB more: PyTorch's check of the 10 MiB segment size passes (20 + 10 ≤ 30), but the
    // 20 MiB chunk it must map does not fit: an explained OOM, nothing leaked.
    let err = pool.allocate(10 * MIB, S0).unwrap_err();
    assert!(matches!(err, PoolError::OutOfMemory(_)), "{err}");
    assert_eq!(pool.stats().reserved_bytes.all.current, 20 * MIB);
    assert_eq!(dev.used(), 20 * MIB);
}

#[test]
fn a_device_without_virtual_memory_is_an_error_not_a_panic() {
    let config = SimConfig {
        granularity: None,
        ..SimConfig::host(64 * MIB)
    };
    let dev = Arc::new(SimDevice::new(config).unwrap());
    let config = PoolConfig {
        policy: PolicyKind::Expandable,
        ..PoolConfig::default()
    };
    let Err(err) = Pool::new(dev, config) else {
        panic!("expandable segments were made without VMM");
    };
    assert!(matches!(err, PoolError::Config(_)), "{err}");
    assert!(err.to_string().contains("virtual memory"), "{err}");
}

#[test]
fn requests_beyond_the_device_are_an_oom_and_leave_nothing_mapped() {
    let dev = sim(64 * MIB);
    let pool = expandable(&dev, "", None);
    let err = pool.allocate(80 * MIB, S0).unwrap_err();
    assert!(matches!(err, PoolError::OutOfMemory(_)), "{err}");
    let err = pool.allocate(u64::MAX, S0).unwrap_err();
    assert!(matches!(err, PoolError::OutOfMemory(_)), "{err}");
    assert_eq!(pool.stats().reserved_bytes.all.current, 0);
    assert_eq!(dev.used(), 0);
}
