//! Scenarios of the `gpumem` policy: placement and coalescing, steady state without device
//! calls, pages moved under pressure instead of an OOM, the hard limit, reclaim, the no-VMM
//! fallback, streams, and random operation sequences against the invariants.

use std::collections::BTreeMap;
use std::sync::Arc;

use gpumem_device::sim::{SimConfig, SimDevice};
use gpumem_device::{Device, StreamId};
use gpumem_pool::{Limit, PolicyKind, Pool, PoolConfig, PoolError, PoolOptions};
use proptest::prelude::*;

const MIB: u64 = 1 << 20;
const PAGE: u64 = 2 * MIB;
const S0: StreamId = StreamId::DEFAULT;

fn device(config: SimConfig) -> Arc<SimDevice> {
    Arc::new(SimDevice::new(config).unwrap())
}

fn gpumem(device: &Arc<SimDevice>) -> Pool {
    gpumem_limited(device, None)
}

fn gpumem_limited(device: &Arc<SimDevice>, hard_limit: Option<u64>) -> Pool {
    let config = PoolConfig {
        policy: PolicyKind::Gpumem,
        options: PoolOptions {
            hard_limit: hard_limit.map(Limit::Bytes),
            ..PoolOptions::default()
        },
        ..PoolConfig::default()
    };
    Pool::new(device.clone(), config).unwrap()
}

fn no_vmm(capacity: u64) -> SimConfig {
    SimConfig {
        granularity: None,
        ..SimConfig::host(capacity)
    }
}

fn reserved(pool: &Pool) -> u64 {
    pool.stats().reserved_bytes.all.current
}

#[test]
fn it_is_chosen_by_name_not_by_default() {
    // The default is `expandable` until gpumem's policy has passed the GPU checks
    // (scripts/gpu-check.sh, docs/gpu.md).
    let pool = Pool::new(device(SimConfig::host(64 * MIB)), PoolConfig::default()).unwrap();
    assert_eq!(pool.policy_name(), PolicyKind::Expandable.as_str());
    assert_eq!(
        gpumem(&device(SimConfig::host(64 * MIB))).policy_name(),
        "gpumem"
    );
}

#[test]
fn blocks_are_rounded_to_512_bytes_and_reserve_only_the_pages_they_touch() {
    let dev = device(SimConfig::host(1 << 30));
    let pool = gpumem(&dev);
    let a = pool.allocate(5 * MIB + 1, S0).unwrap();
    let stats = pool.stats();
    assert_eq!(stats.allocated_bytes.all.current, 5 * MIB + 512);
    assert_eq!(stats.reserved_bytes.all.current, 3 * PAGE);
    let b = pool.allocate(MIB - 512, S0).unwrap();
    assert_eq!(
        stats.allocated_bytes.all.current + MIB - 512,
        pool.stats().allocated_bytes.all.current
    );
    assert_eq!(
        reserved(&pool),
        3 * PAGE,
        "a small-pool block fills the page the large one left"
    );
    let c = pool.allocate(4096, S0).unwrap();
    assert_eq!(reserved(&pool), 4 * PAGE, "a tiny block opens a 1 MiB slab");
    for block in [a, b, c] {
        pool.free(block.ptr).unwrap();
    }
}

#[test]
fn neighbours_coalesce_and_serve_a_larger_request_without_device_calls() {
    let dev = device(SimConfig::host(1 << 30));
    let pool = gpumem(&dev);
    let blocks: Vec<_> = [3 * MIB, 5 * MIB, 8 * MIB]
        .iter()
        .map(|&s| pool.allocate(s, S0).unwrap())
        .collect();
    assert_eq!(
        blocks[1].ptr,
        blocks[0].ptr + 3 * MIB,
        "packed back to back"
    );
    assert_eq!(blocks[2].ptr, blocks[1].ptr + 5 * MIB);
    let calls = dev.counters().allocating_calls();
    for b in [&blocks[0], &blocks[2], &blocks[1]] {
        pool.free(b.ptr).unwrap();
    }
    let whole = pool.allocate(16 * MIB, S0).unwrap();
    assert_eq!(whole.ptr, blocks[0].ptr, "the three ranges merged into one");
    assert_eq!(dev.counters().allocating_calls(), calls);
    assert_eq!(pool.stats().reserved_bytes.all.current, 16 * MIB);
    pool.free(whole.ptr).unwrap();
}

#[test]
fn repeated_steps_make_no_device_calls_once_warm() {
    let dev = device(SimConfig::address_only(8 << 30));
    let pool = gpumem(&dev);
    let weights: Vec<_> = (1..20)
        .map(|i| pool.allocate(i * 3 * MIB + 1000, S0).unwrap())
        .collect();
    let step = |batch: u64| {
        let mut acts = Vec::new();
        for layer in 0..24 {
            acts.push(
                pool.allocate(batch * (layer % 5 + 1) * MIB + 4096, S0)
                    .unwrap(),
            );
            let tmp = pool.allocate(batch * 700 * 1024, S0).unwrap();
            let small = pool.allocate(4096 + layer * 512, S0).unwrap();
            pool.free(tmp.ptr).unwrap();
            pool.free(small.ptr).unwrap();
        }
        for a in acts.into_iter().rev() {
            pool.free(a.ptr).unwrap();
        }
    };
    step(4);
    step(4);
    let warm = dev.counters();
    for _ in 0..10 {
        step(4);
        step(3);
    }
    assert_eq!(dev.counters().allocating_calls(), warm.allocating_calls());
    assert_eq!(dev.counters().freeing_calls(), warm.freeing_calls());
    for w in weights {
        pool.free(w.ptr).unwrap();
    }
}

#[test]
fn under_pressure_idle_pages_move_under_a_new_block_instead_of_an_oom() {
    let dev = device(SimConfig::host(64 * MIB));
    let pool = gpumem(&dev);
    // Fill the device with eight 8 MiB blocks, then free every other one: 32 MiB is free,
    // but in four separate 8 MiB holes.
    let blocks: Vec<_> = (0..8)
        .map(|_| pool.allocate(8 * MIB, S0).unwrap())
        .collect();
    for (i, b) in blocks.iter().enumerate() {
        dev.copy_to_device(b.ptr, &[i as u8; 64], S0).unwrap();
    }
    for b in blocks.iter().step_by(2) {
        pool.free(b.ptr).unwrap();
    }
    let big = pool.allocate(24 * MIB, S0).unwrap();
    let stats = pool.stats();
    assert_eq!(
        stats.num_alloc_retries, 0,
        "served without the pool's reclaim-all"
    );
    assert_eq!(stats.num_ooms, 0);
    assert_eq!(
        stats.reserved_bytes.all.current,
        64 * MIB,
        "no memory was added"
    );
    // The 4 MiB chunks of three idle blocks were moved. Work queued before their frees may
    // still use them: they are mapped under the new block at once (six maps), and their old
    // addresses unmapped only once an event after that work has completed — without the
    // host waiting for the GPU.
    assert_eq!(stats.device_calls.map, 8 * 2 + 6);
    assert_eq!(stats.device_calls.record_event, 1);
    assert_eq!(stats.device_calls.synchronize, 0);
    assert_eq!(dev.counters().unmap, 0, "unmapped only once unused");
    pool.synchronize().unwrap();
    let probe = pool.allocate(512, S0).unwrap();
    assert_eq!(dev.counters().unmap, 6, "the next request unmapped them");
    pool.free(probe.ptr).unwrap();
    // The stitched block is usable end to end and the live blocks kept their bytes.
    let pattern: Vec<u8> = (0..24 * MIB).map(|i| (i % 251) as u8).collect();
    dev.copy_to_device(big.ptr, &pattern, S0).unwrap();
    let mut back = vec![0u8; pattern.len()];
    dev.copy_to_host(&mut back, big.ptr, S0).unwrap();
    assert!(back == pattern);
    for (i, b) in blocks.iter().enumerate().skip(1).step_by(2) {
        let mut bytes = [0u8; 64];
        dev.copy_to_host(&mut bytes, b.ptr, S0).unwrap();
        assert_eq!(bytes, [i as u8; 64]);
    }
    pool.free(big.ptr).unwrap();
    for b in blocks.iter().skip(1).step_by(2) {
        pool.free(b.ptr).unwrap();
    }
    pool.empty_cache().unwrap();
    assert_eq!(reserved(&pool), 0);
    assert_eq!(dev.used(), 0);
}

#[test]
fn a_big_block_that_fits_no_hole_is_stitched_from_idle_chunks_once() {
    let dev = device(SimConfig::address_only(1 << 30));
    let pool = gpumem(&dev);
    let a = pool.allocate(128 * MIB, S0).unwrap();
    let keep = pool.allocate(2 * MIB, S0).unwrap();
    pool.free(a.ptr).unwrap();
    // 200 MiB fits no free range: the hole's 128 MiB of idle chunks move under it and only
    // 72 MiB are new.
    let big = pool.allocate(200 * MIB, S0).unwrap();
    assert_eq!(big.ptr, keep.ptr + 2 * MIB);
    assert_eq!(reserved(&pool), 202 * MIB);
    // Thirty-two 4 MiB chunks moved; their old addresses wait for the freed block's work.
    assert_eq!(pool.stats().device_calls.record_event, 1);
    assert_eq!(dev.counters().unmap, 0);
    // The hole's addresses are retired: a new 128 MiB block lands in mapped memory.
    pool.free(big.ptr).unwrap();
    let calls = dev.counters().allocating_calls();
    let again = pool.allocate(128 * MIB, S0).unwrap();
    assert_eq!(again.ptr, big.ptr);
    assert_eq!(dev.counters().allocating_calls(), calls);
    assert_eq!(
        dev.counters().unmap,
        32,
        "no work was queued: the event had completed, the request unmapped the old addresses"
    );
    for b in [again, keep] {
        pool.free(b.ptr).unwrap();
    }
    pool.empty_cache().unwrap();
    assert_eq!(reserved(&pool), 0);
}

#[test]
fn a_big_block_takes_every_idle_chunk_of_a_hole_split_by_earlier_moves() {
    let dev = device(SimConfig::address_only(1 << 30));
    let pool = gpumem(&dev);
    // Two 5 MiB blocks over five pages: a 2-page chunk, the page they share (a chunk of its
    // own), another 2-page chunk. Freed, they leave one hole of three idle chunks.
    let a = pool.allocate(5 * MIB, S0).unwrap();
    let b = pool.allocate(5 * MIB, S0).unwrap();
    let keep = pool.allocate(2 * MIB, S0).unwrap();
    assert_eq!(b.ptr, a.ptr + 5 * MIB);
    assert_eq!(reserved(&pool), 12 * MIB);
    pool.free(a.ptr).unwrap();
    pool.free(b.ptr).unwrap();
    // The 2-page chunks move first, the second from the start of the hole: what is left of
    // it, the shared page, is a free range of its own by then, and moves too.
    let big = pool.allocate(200 * MIB, S0).unwrap();
    assert_eq!(big.ptr, keep.ptr + 2 * MIB);
    assert_eq!(reserved(&pool), 202 * MIB, "all 10 MiB of the hole moved");
    for block in [big, keep] {
        pool.free(block.ptr).unwrap();
    }
    pool.empty_cache().unwrap();
    assert_eq!(reserved(&pool), 0);
}

#[test]
fn addresses_retired_by_stitching_come_back_when_the_reservation_runs_out() {
    // 64 MiB of memory, 256 MiB of address space: each round retires 24 MiB of addresses.
    let dev = device(SimConfig::address_only(64 * MIB));
    let pool = gpumem(&dev);
    for round in 0..20 {
        let blocks: Vec<_> = (0..8)
            .map(|_| pool.allocate(8 * MIB, S0).unwrap())
            .collect();
        for b in blocks.iter().step_by(2) {
            pool.free(b.ptr).unwrap();
        }
        let big = pool
            .allocate(24 * MIB, S0)
            .unwrap_or_else(|e| panic!("round {round}: {e}"));
        assert!(reserved(&pool) <= 64 * MIB);
        pool.free(big.ptr).unwrap();
        for b in blocks.iter().skip(1).step_by(2) {
            pool.free(b.ptr).unwrap();
        }
    }
    assert_eq!(pool.stats().num_ooms, 0);
    pool.empty_cache().unwrap();
    assert_eq!(reserved(&pool), 0);
}

#[test]
fn the_hard_limit_is_never_exceeded_and_an_oom_explains() {
    let dev = device(SimConfig::address_only(1 << 30));
    let pool = gpumem_limited(&dev, Some(100 * MIB));
    assert!(pool.last_oom().is_none());
    let mut live = Vec::new();
    let err = loop {
        match pool.allocate(7 * MIB + 3, S0) {
            Ok(a) => live.push(a),
            Err(e) => break e,
        }
        assert!(reserved(&pool) <= 100 * MIB);
    };
    assert!(matches!(err, PoolError::OutOfMemory(_)), "{err}");
    let kept = pool
        .last_oom()
        .expect("the pool keeps the last OOM for monitors");
    assert_eq!(kept.to_string(), err.to_string());
    assert_eq!(
        live.len(),
        14,
        "the limit is filled to the last whole block"
    );
    // Freed blocks are reused (moved if need be) within the limit.
    for a in live.drain(..).step_by(2) {
        pool.free(a.ptr).unwrap();
    }
    let a = pool.allocate(20 * MIB, S0).unwrap();
    assert!(pool.stats().reserved_bytes.all.peak <= 100 * MIB);
    pool.free(a.ptr).unwrap();
}

#[test]
fn empty_cache_returns_every_page_and_the_address_space() {
    let dev = device(SimConfig::host(256 * MIB));
    let pool = gpumem(&dev);
    let a = pool.allocate(30 * MIB, S0).unwrap();
    let b = pool.allocate(1000, S0).unwrap();
    let c = pool.allocate(3 * MIB, StreamId(7)).unwrap();
    pool.free(a.ptr).unwrap();
    // Only whole idle pages can go while b and c live.
    let released = pool.empty_cache().unwrap();
    assert_eq!(released, 15 * PAGE);
    assert_eq!(reserved(&pool), PAGE + 2 * PAGE);
    pool.free(b.ptr).unwrap();
    pool.free(c.ptr).unwrap();
    pool.empty_cache().unwrap();
    assert_eq!(reserved(&pool), 0);
    assert_eq!(dev.used(), 0);
    let counters = dev.counters();
    assert_eq!(counters.reserve, counters.release_reservation);
}

#[test]
fn synchronize_above_the_soft_limit_releases_idle_pages_down_to_it() {
    let dev = device(SimConfig::host(256 * MIB));
    let config = PoolConfig {
        policy: PolicyKind::Gpumem,
        options: PoolOptions {
            soft_limit: Some(Limit::Bytes(20 * MIB)),
            ..PoolOptions::default()
        },
        ..PoolConfig::default()
    };
    let pool = Pool::new(dev.clone(), config).unwrap();
    let keep = pool.allocate(10 * MIB, S0).unwrap();
    let a = pool.allocate(50 * MIB, S0).unwrap();
    pool.free(a.ptr).unwrap();
    assert_eq!(reserved(&pool), 60 * MIB);
    pool.synchronize().unwrap();
    let after = reserved(&pool);
    assert!(
        (10 * MIB..=20 * MIB).contains(&after),
        "released whole idle chunks down to the soft limit: {after}"
    );
    pool.free(keep.ptr).unwrap();
}

#[test]
fn without_vmm_the_index_runs_over_device_segments() {
    let dev = device(no_vmm(1 << 30));
    let pool = gpumem(&dev);
    let a = pool.allocate(3 * MIB, S0).unwrap();
    let b = pool.allocate(4 * MIB, S0).unwrap();
    assert_eq!(b.ptr, a.ptr + 3 * MIB, "one 20 MiB segment serves both");
    assert_eq!(dev.counters().malloc, 1);
    let big = pool.allocate(33 * MIB, S0).unwrap();
    assert_eq!(reserved(&pool), 20 * MIB + 34 * MIB);
    let small = pool.allocate(100, S0).unwrap();
    assert_eq!(reserved(&pool), 20 * MIB + 34 * MIB + 2 * MIB);
    pool.free(a.ptr).unwrap();
    pool.free(big.ptr).unwrap();
    let again = pool.allocate(30 * MIB, S0).unwrap();
    assert_eq!(again.ptr, big.ptr, "cached segment reused");
    assert_eq!(dev.counters().malloc, 3);
    // Reclaim frees only the segments nothing lives in.
    pool.free(again.ptr).unwrap();
    pool.empty_cache().unwrap();
    assert_eq!(reserved(&pool), 20 * MIB + 2 * MIB);
    pool.free(b.ptr).unwrap();
    pool.free(small.ptr).unwrap();
    pool.empty_cache().unwrap();
    assert_eq!(reserved(&pool), 0);
    assert_eq!(dev.used(), 0);
}

#[test]
fn without_vmm_pressure_frees_idle_segments_first() {
    let dev = device(no_vmm(64 * MIB));
    let pool = gpumem(&dev);
    let a = pool.allocate(40 * MIB, S0).unwrap();
    pool.free(a.ptr).unwrap();
    let b = pool.allocate(50 * MIB, S0).unwrap();
    assert_eq!(pool.stats().num_alloc_retries, 0);
    assert_eq!(reserved(&pool), 50 * MIB);
    pool.free(b.ptr).unwrap();
}

#[test]
fn streams_reuse_their_own_ranges_and_share_idle_pages_under_pressure() {
    let dev = device(SimConfig::host(64 * MIB));
    let pool = gpumem(&dev);
    let s1 = dev.create_stream().unwrap();
    let a = pool.allocate(8 * MIB, S0).unwrap();
    pool.free(a.ptr).unwrap();
    let b = pool.allocate(8 * MIB, s1).unwrap();
    assert_ne!(
        b.ptr, a.ptr,
        "a range freed on stream 0 is not handed to stream 1"
    );
    let a2 = pool.allocate(8 * MIB, S0).unwrap();
    assert_eq!(a2.ptr, a.ptr, "stream 0 reuses its own range");
    pool.free(a2.ptr).unwrap();
    pool.free(b.ptr).unwrap();
    // 16 MiB idle, split between the streams; stream 1 can take all of the device.
    let big = pool.allocate(64 * MIB, s1).unwrap();
    assert_eq!(pool.stats().num_alloc_retries, 0);
    assert_eq!(reserved(&pool), 64 * MIB);
    pool.free(big.ptr).unwrap();
    pool.empty_cache().unwrap();
    assert_eq!(reserved(&pool), 0);
}

#[test]
fn small_requests_share_a_slab_that_returns_to_large_blocks_once_empty() {
    let dev = device(SimConfig::host(1 << 30));
    let pool = gpumem(&dev);
    let large1 = pool.allocate(4 * MIB, S0).unwrap();
    let small1 = pool.allocate(4096, S0).unwrap();
    let small2 = pool.allocate(4096, S0).unwrap();
    let large2 = pool.allocate(4 * MIB, S0).unwrap();
    assert_eq!(
        small1.ptr,
        large1.ptr + 4 * MIB,
        "a 1 MiB slab after the first block"
    );
    assert_eq!(
        small2.ptr,
        small1.ptr + 4096,
        "small blocks pack into the slab"
    );
    assert_eq!(large2.ptr, large1.ptr + 5 * MIB);
    assert_eq!(pool.stats().allocated_bytes.small_pool.current, 8192);
    for a in [large1, small1, small2] {
        pool.free(a.ptr).unwrap();
    }
    let calls = dev.counters().allocating_calls();
    let merged = pool.allocate(5 * MIB, S0).unwrap();
    assert_eq!(
        merged.ptr, large1.ptr,
        "the emptied slab merged back into one range"
    );
    assert_eq!(dev.counters().allocating_calls(), calls);
    pool.free(merged.ptr).unwrap();
    pool.free(large2.ptr).unwrap();
}

#[test]
fn segments_tile_reserved_memory_and_show_the_largest_free_block() {
    let dev = device(SimConfig::host(1 << 30));
    let pool = gpumem(&dev);
    let a = pool.allocate(5 * MIB, S0).unwrap();
    let b = pool.allocate(3 * MIB, S0).unwrap();
    pool.free(a.ptr).unwrap();
    let segments = pool.segments();
    let total: u64 = segments.iter().map(|s| s.total_size).sum();
    assert_eq!(total, reserved(&pool));
    for s in &segments {
        assert!(s.is_expandable);
        let tiled: u64 = s.blocks.iter().map(|b| b.size).sum();
        assert_eq!(tiled, s.total_size);
    }
    let status = pool.status().unwrap();
    assert_eq!(status.largest_free_block, 5 * MIB);
    pool.free(b.ptr).unwrap();
    assert_eq!(pool.status().unwrap().largest_free_block, 8 * MIB);
}

#[test]
fn a_request_beyond_the_device_is_an_oom_not_a_panic() {
    let pool = gpumem(&device(SimConfig::address_only(1 << 30)));
    for size in [2 << 30, u64::MAX - 10, u64::MAX] {
        let err = pool.allocate(size, S0).unwrap_err();
        assert!(matches!(err, PoolError::OutOfMemory(_)), "{size}: {err}");
    }
    let pool = gpumem(&device(no_vmm(1 << 30)));
    for size in [2 << 30, u64::MAX] {
        assert!(matches!(
            pool.allocate(size, S0).unwrap_err(),
            PoolError::OutOfMemory(_)
        ));
    }
}

/// One step of a random operation sequence.
#[derive(Clone, Debug)]
enum Op {
    Alloc { size: u64, stream: u64 },
    Free(usize),
    Reclaim,
}

fn op() -> impl Strategy<Value = Op> {
    prop_oneof![
        5 => (1u64..=(12 * MIB), 0u64..3).prop_map(|(size, stream)| Op::Alloc { size, stream }),
        5 => (1u64..=4096, 0u64..3).prop_map(|(size, stream)| Op::Alloc { size, stream }),
        6 => any::<usize>().prop_map(Op::Free),
        1 => Just(Op::Reclaim),
    ]
}

/// Runs `ops` and checks after every one: live blocks never overlap, allocated bytes match
/// the blocks the segments show in use, segments cover reserved memory exactly, the hard limit
/// holds; at the end everything is returned.
fn run_ops(config: SimConfig, limit: Option<u64>, ops: &[Op]) {
    let dev = device(config);
    let pool = gpumem_limited(&dev, limit);
    let mut live: BTreeMap<u64, u64> = BTreeMap::new();
    for op in ops {
        match *op {
            Op::Alloc { size, stream } => {
                if let Ok(a) = pool.allocate(size, StreamId(stream)) {
                    let end = a.ptr + size;
                    if let Some((&p, &s)) = live.range(..end).next_back() {
                        assert!(p + s <= a.ptr, "{:#x}+{size} overlaps {p:#x}+{s}", a.ptr);
                    }
                    live.insert(a.ptr, size);
                }
            }
            Op::Free(i) if !live.is_empty() => {
                let ptr = *live.keys().nth(i % live.len()).unwrap();
                live.remove(&ptr);
                pool.free(ptr).unwrap();
            }
            Op::Free(_) => {}
            Op::Reclaim => {
                pool.empty_cache().unwrap();
            }
        }
        let stats = pool.stats();
        let segments = pool.segments();
        let in_use: u64 = segments
            .iter()
            .flat_map(|s| &s.blocks)
            .filter(|b| b.in_use)
            .map(|b| b.size)
            .sum();
        assert_eq!(in_use, stats.allocated_bytes.all.current);
        let total: u64 = segments.iter().map(|s| s.total_size).sum();
        assert_eq!(total, stats.reserved_bytes.all.current);
        assert_eq!(dev.used(), stats.reserved_bytes.all.current);
        if let Some(limit) = limit {
            assert!(stats.reserved_bytes.all.current <= limit);
        }
    }
    for ptr in live.into_keys() {
        pool.free(ptr).unwrap();
    }
    pool.empty_cache().unwrap();
    assert_eq!(reserved(&pool), 0);
    assert_eq!(dev.used(), 0);
}

proptest! {
    #![proptest_config(ProptestConfig::with_cases(64))]

    #[test]
    fn random_operations_keep_the_invariants_with_vmm(ops in prop::collection::vec(op(), 1..150)) {
        run_ops(SimConfig::address_only(64 * MIB), None, &ops);
    }

    #[test]
    fn random_operations_keep_the_invariants_under_a_limit(ops in prop::collection::vec(op(), 1..150)) {
        run_ops(SimConfig::address_only(1 << 30), Some(40 * MIB), &ops);
    }

    #[test]
    fn random_operations_keep_the_invariants_without_vmm(ops in prop::collection::vec(op(), 1..150)) {
        run_ops(SimConfig { granularity: None, ..SimConfig::address_only(96 * MIB) }, None, &ops);
    }
}
