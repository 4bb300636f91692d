//! A `gpumem_pool::Pool` over the wgpu backend: every policy without VMM places blocks in
//! wgpu buffers that really hold their bytes, reuses freed blocks, frees its cache and retries
//! on the device's out-of-memory, and gives everything back; `expandable` says VMM is missing.

mod common;

use std::sync::Arc;

use common::{open_with_limit, pattern};
use gpumem_device::{Device, DeviceError, StreamId};
use gpumem_pool::{PolicyKind, Pool, PoolConfig, PoolError};
use gpumem_wgpu::WgpuDevice;

const MIB: u64 = 1 << 20;
const S: StreamId = StreamId::DEFAULT;

/// A pool of `policy`, or why the device refuses it.
fn try_pool(dev: &Arc<WgpuDevice>, policy: PolicyKind) -> Result<Pool, PoolError> {
    let config = PoolConfig {
        policy,
        ..PoolConfig::default()
    };
    Pool::new(dev.clone(), config)
}

fn pool(dev: &Arc<WgpuDevice>, policy: PolicyKind) -> Pool {
    try_pool(dev, policy).unwrap()
}

/// Writes a pattern of its own into a block.
fn fill(dev: &WgpuDevice, ptr: u64, size: u64, seed: u64) -> Vec<u8> {
    let bytes = pattern(seed, size as usize);
    dev.copy_to_device(ptr, &bytes, S).unwrap();
    bytes
}

fn check(dev: &WgpuDevice, blocks: &[(u64, Vec<u8>)], policy: PolicyKind) {
    for (i, (ptr, bytes)) in blocks.iter().enumerate() {
        let mut back = vec![0u8; bytes.len()];
        dev.copy_to_host(&mut back, *ptr, S).unwrap();
        assert!(back == *bytes, "{policy}: block {i} at {ptr:#x} changed");
    }
}

#[test]
fn policies_without_vmm_keep_every_block_s_bytes_through_reuse() {
    let sizes = [
        1u64,
        100,
        512,
        4000,
        4099,
        65_536,
        300_001,
        MIB,
        3 * MIB + 5,
        12 * MIB,
    ];
    for policy in [PolicyKind::None, PolicyKind::Torch, PolicyKind::Gpumem] {
        let Some(dev) = open_with_limit(256 * MIB) else {
            return;
        };
        let pool = pool(&dev, policy);
        let mut seed = 0;
        let mut live = Vec::new();
        for round in 0..2 {
            for &size in &sizes {
                let a = pool.allocate(size, S).unwrap();
                seed += 1;
                live.push((a.ptr, fill(&dev, a.ptr, size, seed)));
                assert!(
                    dev.resolve(a.ptr, size).is_some(),
                    "{policy}: a block lies inside one buffer"
                );
            }
            check(&dev, &live, policy);
            // Free every other block; the next round reuses them (caching policies).
            let mut kept = Vec::new();
            for (i, (ptr, bytes)) in live.into_iter().enumerate() {
                if i % 2 == round % 2 {
                    pool.free(ptr).unwrap();
                } else {
                    kept.push((ptr, bytes));
                }
            }
            live = kept;
            check(&dev, &live, policy);
        }
        // A freed block comes back for the same request on a caching policy, and holds the
        // new bytes.
        let a = pool.allocate(MIB, S).unwrap();
        pool.free(a.ptr).unwrap();
        let b = pool.allocate(MIB, S).unwrap();
        if policy != PolicyKind::None {
            assert_eq!(a.ptr, b.ptr, "{policy}: reused");
        }
        seed += 1;
        live.push((b.ptr, fill(&dev, b.ptr, MIB, seed)));
        check(&dev, &live, policy);
        for (ptr, _) in live {
            pool.free(ptr).unwrap();
        }
        pool.synchronize().unwrap();
        pool.empty_cache().unwrap();
        assert_eq!(dev.allocated(), 0, "{policy}: everything went back");
        assert_eq!(dev.live_allocations(), 0, "{policy}");
    }
}

#[test]
fn cross_stream_frees_wait_for_submissions() {
    let Some(dev) = open_with_limit(64 * MIB) else {
        return;
    };
    for policy in [PolicyKind::Torch, PolicyKind::Gpumem] {
        let pool = pool(&dev, policy);
        let a = pool.allocate(2 * MIB, S).unwrap();
        fill(&dev, a.ptr, 2 * MIB, 7);
        pool.record_stream(a.ptr, StreamId(3)).unwrap();
        pool.free(a.ptr).unwrap();
        pool.synchronize().unwrap();
        let b = pool.allocate(2 * MIB, S).unwrap();
        assert_eq!(b.ptr, a.ptr, "{policy}: reused once the event completed");
        pool.free(b.ptr).unwrap();
        pool.empty_cache().unwrap();
        assert_eq!(dev.allocated(), 0, "{policy}");
    }
}

#[test]
fn the_device_out_of_memory_makes_the_pool_free_its_cache_and_retry() {
    for policy in [PolicyKind::Torch, PolicyKind::Gpumem] {
        let Some(dev) = open_with_limit(64 * MIB) else {
            return;
        };
        let pool = pool(&dev, policy);
        let cached = pool.allocate(40 * MIB, S).unwrap();
        pool.free(cached.ptr).unwrap();
        assert!(
            dev.allocated() >= 40 * MIB,
            "{policy}: the block stays cached"
        );
        let big = pool.allocate(50 * MIB, StreamId(5)).unwrap();
        fill(&dev, big.ptr, 50 * MIB, 3);
        assert!(dev.allocated() < 90 * MIB, "{policy}: the cache was freed");
        let err = pool.allocate(64 * MIB, S).unwrap_err();
        assert!(matches!(err, PoolError::OutOfMemory(_)), "{policy}: {err}");
        // Beyond what one wgpu buffer can hold: a typed device error naming the limit.
        let too_big = dev.limits().max_buffer_size + 1;
        let err = pool.allocate(too_big, S).unwrap_err();
        assert!(
            matches!(&err, PoolError::Device(DeviceError::InvalidValue(m)) if m.contains("max_buffer_size")),
            "{policy}: {err}"
        );
        pool.free(big.ptr).unwrap();
        pool.empty_cache().unwrap();
        assert_eq!(
            dev.allocated(),
            0,
            "{policy}: nothing leaked on the error paths"
        );
    }
}

#[test]
fn expandable_segments_say_the_backend_has_no_vmm() {
    let Some(dev) = open_with_limit(64 * MIB) else {
        return;
    };
    let refused = try_pool(&dev, PolicyKind::Expandable).err();
    assert!(
        matches!(&refused, Some(PoolError::Config(e)) if e.problem.contains(&dev.name())),
        "{refused:?}"
    );
    assert_eq!(dev.allocated(), 0);
}
