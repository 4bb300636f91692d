//! Properties every policy must keep, over random operation sequences: live blocks never
//! overlap and lie inside the pool's segments, bytes are conserved (in-use + cached =
//! reserved), the hard limit is never exceeded, and freeing everything then emptying the cache
//! returns reserved memory (and the device) to zero. Plus a multi-threaded stress test that
//! writes and checks a pattern in every block, so overlapping blocks would corrupt each other.

use std::collections::BTreeMap;
use std::sync::Arc;

use gpumem_device::sim::{SimConfig, SimDevice};
use gpumem_device::{Device, StreamId};
use gpumem_pool::{Limit, PolicyKind, Pool, PoolConfig, PoolError, PoolOptions};
use proptest::prelude::*;

const MIB: u64 = 1 << 20;

#[derive(Clone, Debug)]
enum Op {
    Alloc { size: u64, stream: u64 },
    Free { pick: usize },
    EmptyCache,
    Synchronize,
}

fn size_strategy() -> impl Strategy<Value = u64> {
    prop_oneof![
        4 => 1u64..4096,
        4 => 4096u64..(2 * MIB),
        2 => (2 * MIB)..(30 * MIB),
        1 => (30 * MIB)..(200 * MIB),
    ]
}

fn op_strategy() -> impl Strategy<Value = Op> {
    prop_oneof![
        10 => (size_strategy(), 0u64..2).prop_map(|(size, stream)| Op::Alloc { size, stream }),
        8 => any::<usize>().prop_map(|pick| Op::Free { pick }),
        1 => Just(Op::EmptyCache),
        1 => Just(Op::Synchronize),
    ]
}

fn policy_strategy() -> impl Strategy<Value = PolicyKind> {
    prop::sample::select(PolicyKind::ALL.to_vec())
}

/// Checks the structural invariants of `pool` given the live allocations `live` (ptr → size).
fn check_invariants(pool: &Pool, live: &BTreeMap<u64, u64>, hard_limit: Option<u64>) {
    let policy = pool.policy_name();
    // No two live allocations overlap.
    let mut end = 0u64;
    for (&ptr, &size) in live {
        assert!(
            ptr >= end,
            "{policy}: allocation at {ptr:#x} overlaps the previous one"
        );
        end = ptr + size;
    }
    let stats = pool.stats();
    let segments = pool.segments();
    // Every live allocation lies inside one segment's in-use block.
    for (&ptr, &size) in live {
        let inside = segments.iter().any(|s| {
            s.blocks
                .iter()
                .any(|b| b.in_use && b.address <= ptr && ptr + size <= b.address + b.size)
        });
        assert!(
            inside,
            "{policy}: allocation {ptr:#x}+{size} is in no in-use block"
        );
    }
    // Blocks tile their segments, and in-use + cached = reserved.
    let mut reserved = 0;
    let mut in_use = 0;
    for s in &segments {
        let mut at = s.address;
        let mut tiled = 0;
        for b in &s.blocks {
            assert!(
                b.address >= at,
                "{policy}: blocks of a segment overlap or are unordered"
            );
            at = b.address + b.size;
            tiled += b.size;
            if b.in_use {
                in_use += b.size;
            }
        }
        if !s.is_expandable {
            assert_eq!(
                tiled, s.total_size,
                "{policy}: blocks do not tile their segment"
            );
        }
        reserved += s.total_size;
    }
    assert_eq!(
        reserved, stats.reserved_bytes.all.current,
        "{policy}: segment sizes do not add up to reserved bytes"
    );
    assert_eq!(
        in_use, stats.active_bytes.all.current,
        "{policy}: in-use blocks do not add up to active bytes"
    );
    assert!(stats.allocated_bytes.all.current <= stats.reserved_bytes.all.current);
    if let Some(limit) = hard_limit {
        assert!(
            stats.reserved_bytes.all.peak <= limit,
            "{policy}: reserved {} exceeded the hard limit {limit}",
            stats.reserved_bytes.all.peak
        );
    }
}

fn run_ops(policy: PolicyKind, ops: &[Op], hard_limit: Option<u64>) {
    let device = Arc::new(SimDevice::new(SimConfig::address_only(1 << 30)).unwrap());
    let pool = Pool::new(
        device.clone(),
        PoolConfig {
            policy,
            options: PoolOptions {
                hard_limit: hard_limit.map(Limit::Bytes),
                ..PoolOptions::default()
            },
            ..PoolConfig::default()
        },
    )
    .unwrap();
    let mut live: BTreeMap<u64, u64> = BTreeMap::new();
    for op in ops {
        match *op {
            Op::Alloc { size, stream } => match pool.allocate(size, StreamId(stream)) {
                Ok(a) => {
                    live.insert(a.ptr, size);
                }
                Err(PoolError::OutOfMemory(_)) => {}
                Err(e) => panic!("{policy}: unexpected error {e}"),
            },
            Op::Free { pick } => {
                if !live.is_empty() {
                    let ptr = *live.keys().nth(pick % live.len()).unwrap();
                    live.remove(&ptr);
                    pool.free(ptr).unwrap();
                }
            }
            Op::EmptyCache => {
                pool.empty_cache().unwrap();
            }
            Op::Synchronize => pool.synchronize().unwrap(),
        }
        check_invariants(&pool, &live, hard_limit);
    }
    for ptr in std::mem::take(&mut live).into_keys() {
        pool.free(ptr).unwrap();
    }
    pool.empty_cache().unwrap();
    let stats = pool.stats();
    assert_eq!(
        stats.reserved_bytes.all.current, 0,
        "{policy}: memory left reserved"
    );
    assert_eq!(stats.allocated_bytes.all.current, 0);
    assert_eq!(
        device.mem_info().unwrap().free,
        1 << 30,
        "{policy}: device memory leaked"
    );
}

proptest! {
    #![proptest_config(ProptestConfig { cases: 64, ..ProptestConfig::default() })]

    #[test]
    fn invariants_hold_for_every_policy(
        policy in policy_strategy(),
        ops in prop::collection::vec(op_strategy(), 1..120),
    ) {
        run_ops(policy, &ops, None);
    }

    #[test]
    fn hard_limit_is_never_exceeded(
        policy in policy_strategy(),
        limit_mib in 40u64..400,
        ops in prop::collection::vec(op_strategy(), 1..120),
    ) {
        run_ops(policy, &ops, Some(limit_mib * MIB));
    }
}

/// Threads share one pool on a host-backed device; each fills its blocks with its own pattern
/// and checks it before freeing, so any overlap between concurrently live blocks shows.
#[test]
fn threads_sharing_a_pool_never_see_each_others_bytes() {
    for policy in PolicyKind::ALL {
        let device = Arc::new(SimDevice::new(SimConfig::host(512 * MIB)).unwrap());
        let pool = Arc::new(
            Pool::new(
                device.clone(),
                PoolConfig {
                    policy,
                    ..PoolConfig::default()
                },
            )
            .unwrap(),
        );
        let handles: Vec<_> = (0..4u8)
            .map(|thread| {
                let pool = pool.clone();
                let device = device.clone();
                std::thread::spawn(move || {
                    let mut rng = thread as u64 * 7919 + 1;
                    let mut live: Vec<(u64, u64, u8)> = Vec::new();
                    for step in 0..300u32 {
                        rng = rng
                            .wrapping_mul(6364136223846793005)
                            .wrapping_add(1442695040888963407);
                        let roll = (rng >> 33) % 100;
                        if roll < 55 || live.is_empty() {
                            let size = match roll % 4 {
                                0 => 100 + (rng >> 40) % 4000,
                                1 => 64 * 1024 + (rng >> 40) % (900 * 1024),
                                2 => 2 * MIB + (rng >> 40) % (2 * MIB),
                                _ => 512 + (rng >> 40) % 100_000,
                            };
                            let a = pool.allocate(size, StreamId::DEFAULT).unwrap();
                            let tag = thread.wrapping_mul(31).wrapping_add(step as u8);
                            device
                                .copy_to_device(a.ptr, &vec![tag; size as usize], StreamId::DEFAULT)
                                .unwrap();
                            live.push((a.ptr, size, tag));
                        } else {
                            let (ptr, size, tag) =
                                live.swap_remove((rng as usize >> 3) % live.len());
                            let mut back = vec![0u8; size as usize];
                            device
                                .copy_to_host(&mut back, ptr, StreamId::DEFAULT)
                                .unwrap();
                            assert!(
                                back.iter().all(|&b| b == tag),
                                "{policy}: block {ptr:#x} was overwritten"
                            );
                            pool.free(ptr).unwrap();
                        }
                    }
                    for (ptr, _, _) in live {
                        pool.free(ptr).unwrap();
                    }
                })
            })
            .collect();
        for h in handles {
            h.join().unwrap();
        }
        pool.empty_cache().unwrap();
        assert_eq!(pool.stats().reserved_bytes.all.current, 0, "{policy}");
        assert_eq!(device.mem_info().unwrap().free, 512 * MIB, "{policy}");
    }
}
