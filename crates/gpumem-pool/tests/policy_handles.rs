//! Policies find a freed block through its handle, not by address. These tests drive each
//! policy directly (as the pool does, through a `PolicyDriver`) and check that a handle that does
//! not name a live block — a second free, or a handle paired with another block's address —
//! changes nothing, and that the blocks left are still the ones in use.

use std::sync::Arc;

use gpumem_device::sim::{SimConfig, SimDevice};
use gpumem_device::StreamId;
use gpumem_pool::{AllocRequest, Block, PolicyDriver, PolicyKind, PoolConfig, ReleaseTarget};

const MIB: u64 = 1 << 20;

fn driver(kind: PolicyKind, config: SimConfig) -> PolicyDriver {
    let pool_config = PoolConfig {
        policy: kind,
        ..PoolConfig::default()
    };
    let device = Arc::new(SimDevice::new(config).unwrap());
    PolicyDriver::new(device, kind.build(&pool_config).unwrap(), None)
}

fn allocate(driver: &mut PolicyDriver, size: u64) -> Block {
    let request = AllocRequest {
        size,
        stream: StreamId::DEFAULT,
    };
    driver.allocate(request).unwrap()
}

/// The addresses of the blocks the policy shows in use, sorted.
fn in_use(driver: &PolicyDriver) -> Vec<u64> {
    let mut used: Vec<u64> = driver
        .policy()
        .segments()
        .iter()
        .flat_map(|s| s.blocks.iter())
        .filter(|b| b.in_use)
        .map(|b| b.address)
        .collect();
    used.sort_unstable();
    used
}

fn check(kind: PolicyKind, config: SimConfig) {
    let mut d = driver(kind, config);
    // Tiny, small and large blocks: the gpumem policy's slab, small and large arenas.
    let blocks: Vec<Block> = [256, 4096, 300 << 10, 3 * MIB, 40 * MIB]
        .iter()
        .flat_map(|&size| [allocate(&mut d, size), allocate(&mut d, size)])
        .collect();
    let mut live: Vec<u64> = blocks.iter().map(|b| b.addr).collect();
    live.sort_unstable();
    assert_eq!(in_use(&d), live, "{kind}: every block is in use");

    for (i, &block) in blocks.iter().enumerate().step_by(2) {
        d.free(block);
        live.retain(|&a| a != block.addr);
        let reserved = d.stats().reserved_bytes.all.current;
        // Freed again: ignored.
        d.free(block);
        // Another live block's address with this (now stale) handle: ignored.
        d.free(Block {
            addr: blocks[i + 1].addr,
            ..block
        });
        assert_eq!(in_use(&d), live, "{kind}: stale handles change nothing");
        assert_eq!(d.stats().reserved_bytes.all.current, reserved, "{kind}");
    }
    for &block in blocks.iter().skip(1).step_by(2) {
        d.free(block);
    }
    assert!(in_use(&d).is_empty(), "{kind}: nothing is in use");
    d.release_cached(ReleaseTarget::All);
    assert_eq!(
        d.stats().reserved_bytes.all.current,
        0,
        "{kind}: all given back"
    );
}

#[test]
fn stale_or_mismatched_handles_are_ignored_by_every_policy() {
    for kind in PolicyKind::ALL {
        check(kind, SimConfig::address_only(64 << 30));
    }
}

#[test]
fn stale_handles_are_ignored_without_virtual_memory_too() {
    let config = SimConfig {
        granularity: None,
        ..SimConfig::address_only(64 << 30)
    };
    check(PolicyKind::Gpumem, config);
}
