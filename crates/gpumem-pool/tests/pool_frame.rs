//! The pool frame's behaviour, the same for every policy: null allocations, misuse errors,
//! cross-stream frees that wait on events, reclaim-and-retry, explained OOMs, status, history.

use std::sync::Arc;

use gpumem_device::sim::{SimConfig, SimDevice};
use gpumem_device::StreamId;
use gpumem_pool::{Action, Limit, PolicyKind, Pool, PoolConfig, PoolError, PoolOptions};
use gpumem_snapshot::BlockState;

const MIB: u64 = 1 << 20;

fn pool_on(device: &Arc<SimDevice>, config: PoolConfig) -> Pool {
    Pool::new(device.clone(), config).unwrap()
}

fn sim(capacity: u64) -> Arc<SimDevice> {
    Arc::new(SimDevice::new(SimConfig::host(capacity)).unwrap())
}

fn config(policy: PolicyKind) -> PoolConfig {
    PoolConfig {
        policy,
        ..PoolConfig::default()
    }
}

#[test]
fn zero_bytes_is_a_null_allocation_without_device_calls() {
    for policy in PolicyKind::ALL {
        let dev = sim(64 * MIB);
        let pool = pool_on(&dev, config(policy));
        let a = pool.allocate(0, StreamId::DEFAULT).unwrap();
        assert_eq!((a.ptr, a.size), (0, 0), "{policy}");
        pool.free(0).unwrap();
        assert_eq!(dev.counters().allocating_calls(), 0, "{policy}");
    }
}

#[test]
fn misuse_is_an_error_naming_the_pointer() {
    for policy in PolicyKind::ALL {
        let pool = pool_on(&sim(64 * MIB), config(policy));
        let a = pool.allocate(1000, StreamId::DEFAULT).unwrap();
        pool.free(a.ptr).unwrap();
        let err = pool.free(a.ptr).unwrap_err();
        assert!(
            matches!(err, PoolError::UnknownPointer { ptr, what: "free" } if ptr == a.ptr),
            "{policy}: {err}"
        );
        assert!(err.to_string().contains(&format!("{:#x}", a.ptr)));
        let err = pool.record_stream(12345, StreamId(1)).unwrap_err();
        assert!(matches!(
            err,
            PoolError::UnknownPointer {
                what: "record_stream",
                ..
            }
        ));
    }
}

#[test]
fn block_used_on_another_stream_returns_only_after_its_event() {
    let dev = sim(64 * MIB);
    let pool = pool_on(&dev, config(PolicyKind::None));
    let side = dev.create_stream_for_test();
    let a = pool.allocate(4 * MIB, StreamId::DEFAULT).unwrap();
    pool.record_stream(a.ptr, side).unwrap();
    dev.enqueue_work(side).unwrap();
    pool.free(a.ptr).unwrap();

    let stats = pool.stats();
    assert_eq!(
        stats.allocated_bytes.all.current, 0,
        "freed from the user's view"
    );
    assert_eq!(
        stats.active_bytes.all.current,
        4 * MIB,
        "still active: the side stream may use it"
    );
    assert_eq!(
        dev.counters().free,
        0,
        "not returned while the event is pending"
    );

    // Work on the side stream is still running: the next allocation cannot take the block back.
    pool.allocate(MIB, StreamId::DEFAULT).unwrap();
    assert_eq!(pool.stats().active_bytes.all.current, 4 * MIB + MIB);

    dev.complete_stream(side).unwrap();
    pool.allocate(MIB, StreamId::DEFAULT).unwrap();
    let stats = pool.stats();
    assert_eq!(
        stats.active_bytes.all.current,
        2 * MIB,
        "returned once the event completed"
    );
    assert_eq!(dev.counters().free, 1);
    let actions: Vec<Action> = pool.history().iter().map(|e| e.action).collect();
    assert!(actions.is_empty(), "history is off by default");
}

#[test]
fn oom_frees_pending_and_cached_memory_then_explains() {
    let dev = sim(32 * MIB);
    let pool = pool_on(
        &dev,
        PoolConfig {
            options: PoolOptions {
                history_capacity: 100,
                ..PoolOptions::default()
            },
            ..config(PolicyKind::None)
        },
    );
    let side = dev.create_stream_for_test();
    let a = pool.allocate(20 * MIB, StreamId::DEFAULT).unwrap();
    pool.record_stream(a.ptr, side).unwrap();
    dev.enqueue_work(side).unwrap();
    pool.free(a.ptr).unwrap();
    // Only the pending block stands in the way: the pool waits for it and succeeds.
    let b = pool.allocate(20 * MIB, StreamId::DEFAULT).unwrap();
    let stats = pool.stats();
    assert_eq!(stats.num_sync_all_streams, 1);
    assert_eq!(stats.num_alloc_retries, 1);
    assert_eq!(stats.num_ooms, 0);

    let err = pool.allocate(16 * MIB, StreamId::DEFAULT).unwrap_err();
    let PoolError::OutOfMemory(oom) = err else {
        panic!("expected an OOM, got {err}")
    };
    assert_eq!(oom.requested, 16 * MIB);
    assert_eq!(oom.pool.device_total, 32 * MIB);
    assert_eq!(oom.pool.device_free, 12 * MIB);
    assert_eq!(oom.pool.allocated, 20 * MIB);
    let text = oom.to_string();
    for needle in [
        "tried to allocate 16.00 MiB",
        "32.00 MiB in total",
        "12.00 MiB is free",
        "What to try",
    ] {
        assert!(text.contains(needle), "{needle:?} missing from:\n{text}");
    }
    assert_eq!(pool.stats().num_ooms, 1);
    assert!(pool.history().iter().any(|e| e.action == Action::Oom));
    pool.free(b.ptr).unwrap();
}

#[test]
fn hard_limit_is_never_exceeded_and_named_in_the_oom() {
    let dev = sim(64 * MIB);
    let pool = pool_on(
        &dev,
        PoolConfig {
            options: PoolOptions {
                hard_limit: Some(Limit::Bytes(10 * MIB)),
                ..PoolOptions::default()
            },
            ..config(PolicyKind::None)
        },
    );
    let _a = pool.allocate(8 * MIB, StreamId::DEFAULT).unwrap();
    let err = pool.allocate(4 * MIB, StreamId::DEFAULT).unwrap_err();
    let PoolError::OutOfMemory(oom) = err else {
        panic!("expected an OOM")
    };
    assert_eq!(oom.pool.hard_limit, Some(10 * MIB));
    assert_eq!(oom.advice[0].action, "raise GPUMEM_HARD_LIMIT", "{oom}");
    assert!(oom.to_string().contains("hard = 10.00 MiB"));
    assert!(pool.stats().reserved_bytes.all.peak <= 10 * MIB);
}

#[test]
fn status_reads_like_pool_status_with_fragmentation() {
    let dev = sim(1 << 30);
    let pool = pool_on(
        &dev,
        PoolConfig {
            options: PoolOptions {
                soft_limit: Some(Limit::Fraction(0.5)),
                ..PoolOptions::default()
            },
            ..config(PolicyKind::None)
        },
    );
    let _a = pool.allocate(3 * MIB, StreamId::DEFAULT).unwrap();
    let text = pool.status().unwrap().to_string();
    assert!(
        text.starts_with("Effective GPU memory usage: 0.29% (3.00 MiB/1024.00 MiB)"),
        "{text}"
    );
    assert!(text.contains("No memory pool is in use"), "{text}");
    assert!(text.contains("soft = 512.00 MiB, hard = none"), "{text}");
    assert!(
        text.contains("Fragmentation: 0 bytes reserved but unallocated"),
        "{text}"
    );
}

#[test]
fn history_records_the_snapshot_vocabulary() {
    let dev = sim(64 * MIB);
    let pool = pool_on(&dev, config(PolicyKind::None));
    pool.set_history_capacity(16);
    let a = pool.allocate(1000, StreamId::DEFAULT).unwrap();
    pool.free(a.ptr).unwrap();
    let actions: Vec<&str> = pool.history().iter().map(|e| e.action.as_str()).collect();
    assert_eq!(
        actions,
        [
            "segment_alloc",
            "alloc",
            "free_requested",
            "free_completed",
            "segment_free"
        ]
    );
    let alloc = pool.history()[1].clone();
    assert_eq!((alloc.addr, alloc.size), (a.ptr, 1000));
}

/// Creates streams on the simulated device from tests.
trait CreateStream {
    fn create_stream_for_test(&self) -> StreamId;
}

impl CreateStream for SimDevice {
    fn create_stream_for_test(&self) -> StreamId {
        gpumem_device::Device::create_stream(self).unwrap()
    }
}

#[test]
fn snapshot_holds_segments_block_states_and_history() {
    let dev = sim(64 * MIB);
    let pool = pool_on(
        &dev,
        PoolConfig {
            options: PoolOptions {
                history_capacity: 64,
                ..PoolOptions::default()
            },
            ..config(PolicyKind::None)
        },
    );
    let side = dev.create_stream_for_test();
    let kept = pool.allocate(3000, StreamId::DEFAULT).unwrap();
    let waiting = pool.allocate(5000, StreamId::DEFAULT).unwrap();
    pool.record_stream(waiting.ptr, side).unwrap();
    dev.enqueue_work(side).unwrap();
    pool.free(waiting.ptr).unwrap();

    let snapshot = pool.snapshot();
    let state_of = |ptr: u64| {
        snapshot
            .segments
            .iter()
            .flat_map(|s| &s.blocks)
            .find(|b| b.address == ptr)
            .map(|b| (b.state, b.requested_size))
    };
    assert_eq!(
        state_of(kept.ptr),
        Some((BlockState::ActiveAllocated, 3000))
    );
    assert_eq!(
        state_of(waiting.ptr),
        Some((BlockState::ActivePendingFree, 5000))
    );
    let trace = &snapshot.device_traces[0];
    assert_eq!(
        trace.len(),
        5,
        "two segment_alloc, two alloc, one free_requested"
    );

    let mut pickle = Vec::new();
    snapshot.write_pickle(&mut pickle).unwrap();
    let back = gpumem_trace::snapshot::read(pickle.as_slice()).unwrap();
    assert_eq!(back.segments, snapshot.segments);
    assert_eq!(back.device_traces, snapshot.device_traces);
}

#[test]
fn soft_limit_releases_cache_at_synchronisation_only() {
    for policy in [
        PolicyKind::Torch,
        PolicyKind::Expandable,
        PolicyKind::Gpumem,
    ] {
        let dev = sim(512 * MIB);
        let pool = pool_on(
            &dev,
            PoolConfig {
                options: PoolOptions {
                    soft_limit: Some(Limit::Bytes(64 * MIB)),
                    ..PoolOptions::default()
                },
                ..config(policy)
            },
        );
        let blocks: Vec<_> = (0..4)
            .map(|_| pool.allocate(40 * MIB, StreamId::DEFAULT).unwrap())
            .collect();
        assert!(
            pool.stats().reserved_bytes.all.current >= 160 * MIB,
            "{policy}"
        );
        for b in &blocks {
            pool.free(b.ptr).unwrap();
        }
        assert!(
            pool.stats().reserved_bytes.all.current >= 160 * MIB,
            "{policy}: the cache is kept until a synchronisation point"
        );
        pool.synchronize().unwrap();
        let reserved = pool.stats().reserved_bytes.all.current;
        assert!(
            reserved <= 64 * MIB,
            "{policy}: {reserved} bytes still reserved above the soft limit"
        );
    }
}

#[test]
fn limits_change_at_run_time_and_a_lowered_hard_limit_releases_the_cache() {
    let dev = sim(256 * MIB);
    let pool = pool_on(&dev, config(PolicyKind::Torch));
    let a = pool.allocate(40 * MIB, StreamId::DEFAULT).unwrap();
    let b = pool.allocate(40 * MIB, StreamId::DEFAULT).unwrap();
    pool.free(b.ptr).unwrap();
    let cached = pool.stats().reserved_bytes.all.current;
    assert!(cached >= 80 * MIB, "{cached}");
    let limits = |soft: Option<u64>, hard: Option<u64>| PoolOptions {
        soft_limit: soft.map(Limit::Bytes),
        hard_limit: hard.map(Limit::Bytes),
        ..PoolOptions::default()
    };
    // A soft limit above the hard one is refused and changes nothing.
    let refused = pool.set_limits(&limits(Some(100 * MIB), Some(50 * MIB)));
    assert!(matches!(refused, Err(PoolError::Config(_))), "{refused:?}");
    assert_eq!(pool.status().unwrap().hard_limit, None);
    pool.set_limits(&limits(None, Some(64 * MIB))).unwrap();
    let status = pool.status().unwrap();
    assert_eq!(status.hard_limit, Some(64 * MIB));
    assert!(
        status.reserved <= 64 * MIB,
        "cache not released: {}",
        status.reserved
    );
    let over = pool.allocate(40 * MIB, StreamId::DEFAULT);
    assert!(matches!(over, Err(PoolError::OutOfMemory(_))), "{over:?}");
    pool.set_limits(&limits(None, None)).unwrap();
    let c = pool.allocate(40 * MIB, StreamId::DEFAULT).unwrap();
    for ptr in [a.ptr, c.ptr] {
        pool.free(ptr).unwrap();
    }
}

#[test]
fn a_limit_of_0_bytes_on_the_device_is_refused() {
    let dev = sim(256 * MIB);
    let zero = PoolOptions {
        hard_limit: Some(Limit::Fraction(1e-12)),
        ..PoolOptions::default()
    };
    let made = Pool::new(
        dev.clone(),
        PoolConfig {
            options: zero.clone(),
            ..config(PolicyKind::None)
        },
    );
    match made {
        Err(PoolError::Config(e)) => assert!(
            e.to_string().contains("0 bytes on a device of 256.00 MiB"),
            "{e}"
        ),
        other => panic!("{:?}", other.map(|_| ())),
    }
    let pool = pool_on(&dev, config(PolicyKind::None));
    let refused = pool.set_limits(&zero);
    assert!(matches!(refused, Err(PoolError::Config(_))), "{refused:?}");
    assert_eq!(pool.status().unwrap().hard_limit, None);
}

#[test]
fn a_live_allocation_is_found_by_its_address_until_it_is_freed() {
    let dev = sim(64 * MIB);
    let pool = pool_on(&dev, config(PolicyKind::Gpumem));
    let a = pool.allocate(1000, StreamId::DEFAULT).unwrap();
    assert_eq!(pool.allocation(a.ptr), Some(a));
    assert_eq!(pool.allocation(a.ptr + 512), None);
    pool.free(a.ptr).unwrap();
    assert_eq!(pool.allocation(a.ptr), None);
}
