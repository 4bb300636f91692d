//! Scenarios of the `torch` and `expandable` policies through the public pool API, with the
//! numbers PyTorch's allocator gives (see `c10/cuda/CUDACachingAllocator.cpp`).

use std::sync::Arc;

use gpumem_device::sim::{SimConfig, SimDevice};
use gpumem_device::StreamId;
use gpumem_pool::policies::torch_settings::TorchSettings;
use gpumem_pool::{
    Action, Limit, PolicyKind, Pool, PoolConfig, PoolError, PoolOptions, SegmentView,
};

const MIB: u64 = 1 << 20;
const S0: StreamId = StreamId::DEFAULT;

fn sim(capacity: u64) -> Arc<SimDevice> {
    Arc::new(SimDevice::new(SimConfig::host(capacity)).unwrap())
}

fn torch_pool(device: &Arc<SimDevice>, conf: &str, hard_limit: Option<u64>) -> Pool {
    pool_with(device, PolicyKind::Torch, conf, hard_limit)
}

fn pool_with(
    device: &Arc<SimDevice>,
    policy: PolicyKind,
    conf: &str,
    hard_limit: Option<u64>,
) -> Pool {
    Pool::new(
        device.clone(),
        PoolConfig {
            policy,
            torch: TorchSettings::parse(conf).unwrap(),
            options: PoolOptions {
                hard_limit: hard_limit.map(Limit::Bytes),
                ..PoolOptions::default()
            },
            ..PoolConfig::default()
        },
    )
    .unwrap()
}

/// (segment size, [(block size, in use)]) per segment, in address order.
fn layout(pool: &Pool) -> Vec<(u64, Vec<(u64, bool)>)> {
    pool.segments()
        .iter()
        .map(|s: &SegmentView| {
            (
                s.total_size,
                s.blocks.iter().map(|b| (b.size, b.in_use)).collect(),
            )
        })
        .collect()
}

#[test]
fn small_requests_share_a_2_mib_segment_in_512_byte_blocks() {
    let dev = sim(64 * MIB);
    let pool = torch_pool(&dev, "", None);
    let a = pool.allocate(1, S0).unwrap();
    let b = pool.allocate(1000, S0).unwrap();
    assert_eq!(b.ptr, a.ptr + 512, "front allocation, 512-byte rounding");
    let s = pool.stats();
    assert_eq!(s.allocated_bytes.all.current, 512 + 1024);
    assert_eq!(s.requested_bytes.all.current, 1001);
    assert_eq!(s.reserved_bytes.small_pool.current, 2 * MIB);
    assert_eq!(s.segment.small_pool.current, 1);
    assert_eq!(s.inactive_split.small_pool.current, 1);
    assert_eq!(s.inactive_split_bytes.small_pool.current, 2 * MIB - 1536);
    assert_eq!(
        layout(&pool),
        vec![(
            2 * MIB,
            vec![(512, true), (1024, true), (2 * MIB - 1536, false)]
        )]
    );
}

#[test]
fn a_3_mib_request_takes_a_20_mib_segment_and_splits_it() {
    let dev = sim(256 * MIB);
    let pool = torch_pool(&dev, "", None);
    let a = pool.allocate(3 * MIB, S0).unwrap();
    let b = pool.allocate(5 * MIB, S0).unwrap();
    assert_eq!(
        b.ptr,
        a.ptr + 3 * MIB,
        "the second request reuses the remainder"
    );
    let s = pool.stats();
    assert_eq!(s.reserved_bytes.large_pool.current, 20 * MIB);
    assert_eq!(s.num_device_alloc, 1);
    assert_eq!(
        layout(&pool),
        vec![(
            20 * MIB,
            vec![(3 * MIB, true), (5 * MIB, true), (12 * MIB, false)]
        )]
    );
}

#[test]
fn large_requests_get_segments_rounded_to_2_mib_and_small_remainders_stay_attached() {
    let dev = sim(256 * MIB);
    let pool = torch_pool(&dev, "", None);
    // 11 MiB + 1 byte → 11 MiB + 512 B block in a 12 MiB segment; the 1 MiB − 512 B rest is
    // not worth splitting (a large block splits only for more than 1 MiB).
    pool.allocate(11 * MIB + 1, S0).unwrap();
    assert_eq!(layout(&pool), vec![(12 * MIB, vec![(12 * MIB, true)])]);
    let s = pool.stats();
    assert_eq!(s.allocated_bytes.large_pool.current, 12 * MIB);
    assert_eq!(s.requested_bytes.large_pool.current, 11 * MIB + 1);
}

#[test]
fn frees_coalesce_back_to_one_block_and_empty_cache_returns_everything() {
    let dev = sim(256 * MIB);
    let pool = torch_pool(&dev, "", None);
    // 18 MiB in six blocks of one 20 MiB segment.
    let ptrs: Vec<u64> = [2, 3, 4, 2, 3, 4]
        .iter()
        .map(|&mib| pool.allocate(mib * MIB, S0).unwrap().ptr)
        .collect();
    assert_eq!(pool.stats().inactive_split.all.current, 1);
    for &p in [ptrs[1], ptrs[4], ptrs[0], ptrs[5], ptrs[2], ptrs[3]].iter() {
        pool.free(p).unwrap();
    }
    assert_eq!(layout(&pool), vec![(20 * MIB, vec![(20 * MIB, false)])]);
    let s = pool.stats();
    assert_eq!(s.inactive_split.all.current, 0);
    assert_eq!(s.inactive_split_bytes.all.current, 0);
    assert!(s.inactive_split.all.peak > 0);
    assert_eq!(pool.empty_cache().unwrap(), 20 * MIB);
    let s = pool.stats();
    assert_eq!(s.reserved_bytes.all.current, 0);
    assert_eq!(s.segment.all.current, 0);
    assert_eq!((s.num_device_alloc, s.num_device_free), (1, 1));
    assert_eq!(dev.used(), 0);
}

#[test]
fn best_fit_prefers_the_smallest_block_then_the_lowest_address() {
    let dev = sim(1024 * MIB);
    let pool = torch_pool(&dev, "", None);
    let a = pool.allocate(40 * MIB, S0).unwrap();
    let b = pool.allocate(30 * MIB, S0).unwrap();
    let c = pool.allocate(30 * MIB, S0).unwrap();
    for p in [a.ptr, b.ptr, c.ptr] {
        pool.free(p).unwrap();
    }
    // 25 MiB fits all three; the 30 MiB ones are smaller, and b has the lower address.
    let lower = b.ptr.min(c.ptr);
    assert_eq!(pool.allocate(25 * MIB, S0).unwrap().ptr, lower);
    assert_eq!(pool.stats().num_device_alloc, 3);
}

#[test]
fn blocks_are_reused_only_on_their_own_stream() {
    let dev = sim(256 * MIB);
    let pool = torch_pool(&dev, "", None);
    let s1 = StreamId(1);
    let a = pool.allocate(4 * MIB, S0).unwrap();
    pool.free(a.ptr).unwrap();
    let b = pool.allocate(4 * MIB, s1).unwrap();
    assert_ne!(b.ptr, a.ptr);
    assert_eq!(pool.stats().segment.all.current, 2);
    let c = pool.allocate(4 * MIB, S0).unwrap();
    assert_eq!(c.ptr, a.ptr);
}

#[test]
fn record_stream_delays_reuse_until_the_event_and_then_reuses_on_the_allocation_stream() {
    let dev = sim(256 * MIB);
    let side = gpumem_device::Device::create_stream(dev.as_ref()).unwrap();
    let pool = torch_pool(&dev, "", None);
    let a = pool.allocate(4 * MIB, S0).unwrap();
    pool.record_stream(a.ptr, side).unwrap();
    dev.enqueue_work(side).unwrap();
    pool.free(a.ptr).unwrap();
    let b = pool.allocate(4 * MIB, S0).unwrap();
    assert_ne!(b.ptr, a.ptr, "reused before the side stream finished");
    pool.free(b.ptr).unwrap();
    dev.complete_stream(side).unwrap();
    // The event completed: the block is back on its allocation stream only.
    let c = pool.allocate(4 * MIB, side).unwrap();
    assert_ne!(c.ptr, a.ptr, "a block must not move to another stream");
    let d = pool.allocate(4 * MIB, S0).unwrap();
    assert!(d.ptr == a.ptr || d.ptr == b.ptr);
}

#[test]
fn max_split_size_keeps_oversize_blocks_whole_and_counts_them() {
    let dev = sim(2048 * MIB);
    let pool = torch_pool(&dev, "max_split_size_mb:128", None);
    let big = pool.allocate(600 * MIB, S0).unwrap();
    let s = pool.stats();
    assert_eq!(s.oversize_allocations.current, 1);
    assert_eq!(s.oversize_segments.current, 1);
    assert_eq!(s.max_split_size, 128 * MIB);
    pool.free(big.ptr).unwrap();
    assert_eq!(pool.stats().oversize_allocations.current, 0);
    // 512 MiB ≥ max_split_size: a cached block more than 20 MiB larger is not used.
    let other = pool.allocate(512 * MIB, S0).unwrap();
    assert_ne!(other.ptr, big.ptr);
    // A request below max_split_size never takes an oversize block either.
    let small = pool.allocate(100 * MIB, S0).unwrap();
    assert_ne!(small.ptr, big.ptr);
    assert_eq!(pool.stats().oversize_segments.current, 2);
    // A request within 20 MiB of the cached block takes it whole, unsplit.
    let near = pool.allocate(590 * MIB, S0).unwrap();
    assert_eq!(near.ptr, big.ptr);
    assert_eq!(
        pool.stats().allocated_bytes.all.current,
        600 * MIB + 512 * MIB + 100 * MIB
    );
}

#[test]
fn max_non_split_rounding_lets_a_512_mib_request_use_a_600_mib_block() {
    let dev = sim(2048 * MIB);
    let pool = torch_pool(
        &dev,
        "max_split_size_mb:128,max_non_split_rounding_mb:1024",
        None,
    );
    let big = pool.allocate(600 * MIB, S0).unwrap();
    pool.free(big.ptr).unwrap();
    let a = pool.allocate(512 * MIB, S0).unwrap();
    assert_eq!(a.ptr, big.ptr);
    assert_eq!(pool.stats().allocated_bytes.all.current, 600 * MIB);
    assert_eq!(pool.stats().num_device_alloc, 1);
}

#[test]
fn oom_after_reclaim_explains_itself() {
    let dev = sim(64 * MIB);
    let pool = torch_pool(&dev, "", None);
    let keep = pool.allocate(30 * MIB, S0).unwrap();
    let cached = pool.allocate(20 * MIB, S0).unwrap();
    pool.free(cached.ptr).unwrap();
    // 40 MiB does not fit next to 30 MiB in use, even after the 20 MiB cached segment goes.
    let err = pool.allocate(40 * MIB, S0).unwrap_err();
    let PoolError::OutOfMemory(oom) = err else {
        panic!("expected an OOM, got {err}")
    };
    assert_eq!(oom.requested, 40 * MIB);
    assert_eq!(oom.attempted, 40 * MIB);
    assert_eq!(oom.pool.allocated, 30 * MIB);
    assert_eq!(
        oom.pool.reserved,
        30 * MIB,
        "the cached segment was released first"
    );
    let s = pool.stats();
    assert_eq!((s.num_alloc_retries, s.num_ooms), (1, 1));
    assert!(oom.to_string().contains("40"), "{oom}");
    pool.free(keep.ptr).unwrap();
    pool.allocate(40 * MIB, S0).unwrap();
}

#[test]
fn history_records_segment_alloc_and_free() {
    let dev = sim(64 * MIB);
    let pool = torch_pool(&dev, "", None);
    pool.set_history_capacity(100);
    let a = pool.allocate(3 * MIB, S0).unwrap();
    pool.free(a.ptr).unwrap();
    pool.empty_cache().unwrap();
    let actions: Vec<Action> = pool.history().iter().map(|e| e.action).collect();
    assert_eq!(
        actions,
        vec![
            Action::SegmentAlloc,
            Action::Alloc,
            Action::FreeRequested,
            Action::FreeCompleted,
            Action::SegmentFree
        ]
    );
}

#[test]
fn device_oom_frees_one_large_enough_oversize_block_before_the_full_reclaim() {
    // PyTorch's release_available_cached_blocks, run when max_split_size is set.
    let dev = sim(1024 * MIB);
    let pool = torch_pool(&dev, "max_split_size_mb:128", None);
    let cached = pool.allocate(600 * MIB, S0).unwrap();
    pool.free(cached.ptr).unwrap();
    // 600 MiB is more than 20 MiB above 500 MiB, so the block is not used; the device has
    // 424 MiB free, so the cached block is freed and the device asked again.
    pool.allocate(500 * MIB, S0).unwrap();
    let s = pool.stats();
    assert_eq!(s.num_device_free, 1);
    assert_eq!(s.num_alloc_retries, 0, "no full reclaim was needed");
    assert_eq!(s.oversize_segments.current, 1);
    assert_eq!(s.reserved_bytes.all.current, 500 * MIB);
}

#[test]
fn device_oom_frees_oversize_blocks_largest_first_until_they_add_up() {
    let dev = sim(1024 * MIB);
    let pool = torch_pool(&dev, "max_split_size_mb:128", None);
    let _live = pool.allocate(400 * MIB, S0).unwrap();
    let a = pool.allocate(200 * MIB, S0).unwrap();
    let b = pool.allocate(210 * MIB, S0).unwrap();
    let small = pool.allocate(150 * MIB, S0).unwrap();
    for p in [a.ptr, b.ptr, small.ptr] {
        pool.free(p).unwrap();
    }
    // 350 MiB: no single cached block is large enough; 210 + 200 MiB are.
    pool.allocate(350 * MIB, S0).unwrap();
    let s = pool.stats();
    assert_eq!(s.num_device_free, 2);
    assert_eq!(s.num_alloc_retries, 0);
    assert_eq!(
        s.reserved_bytes.all.current,
        (400 + 150 + 350) * MIB,
        "the 150 MiB block was not needed"
    );
}

#[test]
fn the_soft_limit_releases_the_largest_cached_segments_first() {
    let dev = sim(1024 * MIB);
    let pool = Pool::new(
        dev.clone(),
        PoolConfig {
            policy: PolicyKind::Torch,
            options: PoolOptions {
                soft_limit: Some(Limit::Bytes(50 * MIB)),
                ..PoolOptions::default()
            },
            ..PoolConfig::default()
        },
    )
    .unwrap();
    let a = pool.allocate(40 * MIB, S0).unwrap();
    let b = pool.allocate(30 * MIB, S0).unwrap();
    let live = pool.allocate(12 * MIB, S0).unwrap();
    pool.free(a.ptr).unwrap();
    pool.free(b.ptr).unwrap();
    pool.synchronize().unwrap();
    // 82 MiB reserved, 32 MiB above the limit: the 40 MiB segment suffices.
    let s = pool.stats();
    assert_eq!(s.reserved_bytes.all.current, 42 * MIB);
    assert_eq!(s.num_device_free, 1);
    assert_eq!(pool.allocate(30 * MIB, S0).unwrap().ptr, b.ptr);
    pool.free(live.ptr).unwrap();
}

/// Checks what must hold after every operation: the blocks of a segment tile it, no two free
/// blocks are neighbours (they would have been merged), and the statistics agree with the
/// segments.
fn check_invariants(pool: &Pool, context: &str) {
    let segments = pool.segments();
    let s = pool.stats();
    let (mut reserved, mut allocated, mut largest_free) = (0, 0, 0);
    let (mut allocations, mut inactive_split, mut inactive_split_bytes) = (0, 0, 0);
    for seg in &segments {
        let mut at = seg.address;
        let mut previous_free = false;
        for b in &seg.blocks {
            assert_eq!(b.address, at, "{context}: blocks tile the segment");
            at += b.size;
            assert!(b.in_use || !previous_free, "{context}: unmerged neighbours");
            previous_free = !b.in_use;
            if b.in_use {
                allocated += b.size;
                allocations += 1;
            } else {
                largest_free = largest_free.max(b.size);
                if seg.blocks.len() > 1 && !seg.is_expandable {
                    inactive_split += 1;
                    inactive_split_bytes += b.size;
                }
            }
        }
        assert_eq!(at - seg.address, seg.total_size, "{context}");
        reserved += seg.total_size;
    }
    assert_eq!(s.reserved_bytes.all.current, reserved, "{context}");
    assert_eq!(s.allocated_bytes.all.current, allocated, "{context}");
    assert_eq!(s.allocation.all.current, allocations, "{context}");
    assert_eq!(s.inactive_split.all.current, inactive_split, "{context}");
    assert_eq!(
        s.inactive_split_bytes.all.current, inactive_split_bytes,
        "{context}"
    );
    assert_eq!(
        pool.status().unwrap().largest_free_block,
        largest_free,
        "{context}"
    );
}

#[test]
fn random_operations_keep_segments_tiled_merged_and_counted() {
    let settings = [
        (PolicyKind::Torch, "", None),
        (PolicyKind::Torch, "max_split_size_mb:40", None),
        (
            PolicyKind::Torch,
            "roundup_power2_divisions:[1:2,8:4,>:8],garbage_collection_threshold:0.7",
            Some(600 * MIB),
        ),
        (PolicyKind::Expandable, "", None),
        (
            PolicyKind::Expandable,
            "max_split_size_mb:20",
            Some(600 * MIB),
        ),
    ];
    for (policy, conf, limit) in settings {
        let dev = Arc::new(SimDevice::new(SimConfig::address_only(1024 * MIB)).unwrap());
        let pool = pool_with(&dev, policy, conf, limit);
        let mut state = 0x2545_F491_4F6C_DD1Du64;
        let mut rnd = move || {
            state ^= state << 13;
            state ^= state >> 7;
            state ^= state << 17;
            state
        };
        let mut live: Vec<u64> = Vec::new();
        for step in 0..3000 {
            let context = format!("{policy} {conf:?} step {step}");
            let roll = rnd() % 100;
            if roll < 55 || live.is_empty() {
                let size = match rnd() % 4 {
                    0 => rnd() % 4096 + 1,
                    1 => rnd() % (1 << 20) + 1,
                    2 => rnd() % (12 << 20) + 1,
                    _ => rnd() % (90 << 20) + 1,
                };
                let stream = StreamId(rnd() % 2);
                match pool.allocate(size, stream) {
                    Ok(a) => live.push(a.ptr),
                    Err(PoolError::OutOfMemory(_)) => {}
                    Err(e) => panic!("{context}: {e}"),
                }
            } else if roll < 98 {
                let i = (rnd() as usize) % live.len();
                pool.free(live.swap_remove(i)).unwrap();
            } else {
                pool.empty_cache().unwrap();
            }
            check_invariants(&pool, &context);
        }
        for p in live {
            pool.free(p).unwrap();
        }
        pool.empty_cache().unwrap();
        check_invariants(&pool, "the end");
        assert_eq!(pool.stats().reserved_bytes.all.current, 0);
        assert_eq!(dev.used(), 0);
    }
}
