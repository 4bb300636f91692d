//! The GPU scenarios, shared by the tests on a real GPU (`gpu.rs`) and on the mock driver
//! (`mock_driver.rs`).

use std::sync::Arc;

use gpumem_cuda::{CudaDevice, CUDA_ERROR_OUT_OF_MEMORY};
use gpumem_device::{Device, DeviceError, DevicePtr, PinnedBuffer, StreamId, VirtualMemory};
use gpumem_pool::{PolicyKind, Pool, PoolConfig, PoolError};

const MIB: u64 = 1 << 20;

/// Bytes that differ per `seed` and per position, so a block read back from the wrong place
/// or an offset copy shows.
pub fn pattern(seed: u64, len: usize) -> Vec<u8> {
    (0..len as u64)
        .map(|i| (i.wrapping_mul(31) ^ seed.wrapping_mul(0x9e37_79b9)).wrapping_add(seed) as u8)
        .collect()
}

pub fn read(dev: &CudaDevice, ptr: DevicePtr, len: usize) -> Vec<u8> {
    let mut back = vec![0u8; len];
    dev.copy_to_host(&mut back, ptr, StreamId::DEFAULT).unwrap();
    back
}

/// `cuMemAlloc`/`cuMemFree`/`cuMemGetInfo`, refusals, and a driver OOM with its code.
pub fn malloc_free_and_mem_info(dev: &Arc<CudaDevice>) {
    assert!(dev.name().starts_with(&format!("cuda:{} (", dev.ordinal())));
    let before = dev.mem_info().unwrap();
    assert!(before.free <= before.total && before.total > 0);
    assert_eq!(before.total, dev.info().total_memory);
    let ptr = dev.malloc(256 * MIB).unwrap();
    assert_ne!(ptr, 0);
    let during = dev.mem_info().unwrap();
    assert!(
        during.free + 256 * MIB <= before.free + 64 * MIB,
        "256 MiB allocated: {before:?} -> {during:?}"
    );
    dev.free(ptr).unwrap();
    assert!(matches!(dev.malloc(0), Err(DeviceError::InvalidValue(_))));
    assert!(matches!(
        dev.free(ptr),
        Err(DeviceError::InvalidAddress { .. })
    ));
    let err = dev.malloc(before.total * 2).unwrap_err();
    assert!(err.is_out_of_memory(), "{err}");
    assert_eq!(
        err.backend_code().map(|c| c.code),
        Some(CUDA_ERROR_OUT_OF_MEMORY)
    );
    assert!(
        err.to_string().contains("requested"),
        "the request is in the message: {err}"
    );
}

/// Host↔device and device↔device copies, synchronous and asynchronous, pinned and staged.
pub fn copies_round_trip_sync_and_async(dev: &Arc<CudaDevice>) {
    let len = 3 * MIB as usize + 123;
    let (a, b) = (
        dev.malloc(len as u64).unwrap(),
        dev.malloc(len as u64).unwrap(),
    );
    let s = dev.create_stream().unwrap();
    for (seed, stream) in [(1, StreamId::DEFAULT), (2, s)] {
        let data = pattern(seed, len);
        dev.copy_to_device(a, &data, stream).unwrap();
        dev.copy_on_device(b, a, len as u64, stream).unwrap();
        let mut back = vec![0u8; len];
        dev.copy_to_host(&mut back, b, stream).unwrap();
        assert_eq!(back, data, "sync round trip on {stream:?}");
    }
    // Asynchronous, from and to page-locked memory.
    let mut up = dev.alloc_pinned(len).unwrap();
    assert!(up.is_page_locked());
    assert!(up.iter().all(|&x| x == 0), "zeroed");
    up.copy_from_slice(&pattern(3, len));
    let up = dev.copy_to_device_async(a, up, s).unwrap().wait().unwrap();
    let event = dev.copy_on_device_async(b, a, len as u64, s).unwrap();
    let down = dev
        .copy_to_host_async(dev.alloc_pinned(len).unwrap(), b, s)
        .unwrap()
        .wait()
        .unwrap();
    assert!(dev.event_completed(event).unwrap());
    dev.destroy_event(event).unwrap();
    assert_eq!(&down[..], &up[..], "async round trip");
    // Pageable buffers go through pinned staging and come back page-locked, same bytes.
    let mut pageable = PinnedBuffer::pageable(len);
    pageable.copy_from_slice(&pattern(4, len));
    let staged = dev
        .copy_to_device_async(a, pageable, s)
        .unwrap()
        .wait()
        .unwrap();
    assert!(staged.is_page_locked());
    assert_eq!(&staged[..], &pattern(4, len)[..]);
    let filled = dev
        .copy_to_host_async(PinnedBuffer::pageable(len), a, s)
        .unwrap()
        .wait()
        .unwrap();
    assert!(filled.is_page_locked());
    assert_eq!(&filled[..], &pattern(4, len)[..]);
    // Outside any allocation: refused before the driver sees it.
    assert!(matches!(
        dev.copy_to_device(a + len as u64 - 4, &[0; 8], s),
        Err(DeviceError::InvalidAddress { .. })
    ));
    dev.free(a).unwrap();
    dev.free(b).unwrap();
    dev.destroy_stream(s).unwrap();
}

/// `copies_take_time`: whether 32 large device copies are sure to be still running when the
/// next call returns (on a GPU; not on the mock driver, whose copies are done when issued).
pub fn streams_and_events_order_the_work(dev: &Arc<CudaDevice>, copies_take_time: bool) {
    let s1 = dev.create_stream().unwrap();
    let s2 = dev.create_stream().unwrap();
    assert_ne!(s1, s2);
    assert_ne!(s1, StreamId::DEFAULT);
    // Enough copying on s1 to be still running when the event is first queried.
    let chunk = (dev.mem_info().unwrap().free / 8).clamp(64 * MIB, 1 << 30);
    let (a, b) = (dev.malloc(chunk).unwrap(), dev.malloc(chunk).unwrap());
    let small = pattern(5, 4096);
    dev.copy_to_device(a, &small, s1).unwrap();
    for _ in 0..16 {
        let e = dev.copy_on_device_async(b, a, chunk, s1).unwrap();
        dev.destroy_event(e).unwrap();
        let e = dev.copy_on_device_async(a, b, chunk, s1).unwrap();
        dev.destroy_event(e).unwrap();
    }
    let busy = dev.record_event(s1).unwrap();
    let early = dev.event_completed(busy).unwrap();
    // The buffer of an asynchronous copy queued behind that work comes back only after it.
    let in_flight = dev
        .copy_to_host_async(dev.alloc_pinned(4096).unwrap(), a, s1)
        .unwrap();
    let in_flight = match in_flight.try_finish().unwrap() {
        Ok(_) if copies_take_time => panic!(
            "a copy behind {} MiB of copies finished at once",
            32 * chunk / MIB
        ),
        Ok(back) => {
            assert_eq!(&back[..], &small[..]);
            dev.copy_to_host_async(back, a, s1).unwrap()
        }
        Err(pending) => pending,
    };
    dev.wait_event(busy).unwrap();
    assert!(dev.event_completed(busy).unwrap());
    let back = in_flight.wait().unwrap();
    assert_eq!(&back[..], &small[..], "stream order: the copies ran first");
    eprintln!("event queried while busy: completed = {early}");
    // Another stream sees the data once the host has waited for s1's event.
    let done = dev.record_event(s1).unwrap();
    dev.wait_event(done).unwrap();
    let mut other = vec![0u8; 4096];
    dev.copy_to_host(&mut other, b, s2).unwrap();
    assert_eq!(other, small);
    for e in [busy, done] {
        dev.destroy_event(e).unwrap();
        assert!(matches!(
            dev.event_completed(e),
            Err(DeviceError::UnknownHandle { kind: "event", .. })
        ));
    }
    dev.synchronize_stream(s1).unwrap();
    dev.synchronize().unwrap();
    dev.destroy_stream(s1).unwrap();
    assert!(matches!(
        dev.record_event(s1),
        Err(DeviceError::UnknownHandle { kind: "stream", .. })
    ));
    dev.destroy_stream(s2).unwrap();
    dev.free(a).unwrap();
    dev.free(b).unwrap();
}

/// Reserve, create, map (twice), write through one mapping and read through the other, unmap
/// and release; no VMM: nothing but a refusal.
pub fn vmm_chunks_show_the_same_bytes_through_two_mappings(dev: &Arc<CudaDevice>) {
    let Some(vmm) = dev.vmm() else {
        eprintln!("{} has no VMM: nothing to test", dev.name());
        assert!(dev.reserve(2 * MIB).is_err());
        return;
    };
    let g = vmm.granularity();
    assert!(g.is_power_of_two() && g >= 64 * 1024, "granularity {g}");
    let before = dev.mem_info().unwrap().free;
    let va = vmm.reserve(4 * g).unwrap();
    assert_eq!(va % g, 0);
    let h1 = vmm.create_physical(g).unwrap();
    let h2 = vmm.create_physical(2 * g).unwrap();
    vmm.map(va, h1).unwrap();
    vmm.map(va + g, h2).unwrap();
    // A write across the boundary between the two chunks.
    let data = pattern(6, 8192);
    dev.copy_to_device(va + g - 4096, &data, StreamId::DEFAULT)
        .unwrap();
    assert_eq!(read(dev, va + g - 4096, 8192), data);
    // Chunk 2 mapped a second time elsewhere shows the same bytes.
    let va2 = vmm.reserve(2 * g).unwrap();
    vmm.map(va2, h2).unwrap();
    assert_eq!(read(dev, va2, 4096), data[4096..]);
    let more = pattern(7, 4096);
    dev.copy_to_device(va2 + 4096, &more, StreamId::DEFAULT)
        .unwrap();
    assert_eq!(read(dev, va + g + 4096, 4096), more, "written through va2");
    // Mapping checks and refusals.
    assert!(vmm.map(va, h1).is_err(), "already mapped");
    assert!(vmm.unmap(va + g, g).is_err(), "part of a mapping");
    assert!(vmm.release_reservation(va, 4 * g).is_err(), "still mapped");
    assert!(dev.create_physical(g + 1).is_err());
    // Released while mapped: the bytes stay until the last mapping goes.
    vmm.release_physical(h2).unwrap();
    assert_eq!(read(dev, va2, 4096), data[4096..]);
    vmm.unmap(va + g, 2 * g).unwrap();
    vmm.unmap(va2, 2 * g).unwrap();
    vmm.unmap(va, g).unwrap();
    vmm.release_physical(h1).unwrap();
    vmm.release_reservation(va, 4 * g).unwrap();
    vmm.release_reservation(va2, 2 * g).unwrap();
    let after = dev.mem_info().unwrap().free;
    assert!(
        after + 3 * g >= before,
        "the chunks' memory went back: {before} -> {after}"
    );
}

/// A pool of `policy`, or why the device refuses it.
fn try_pool(dev: &Arc<CudaDevice>, policy: PolicyKind) -> Result<Pool, PoolError> {
    let config = PoolConfig {
        policy,
        ..PoolConfig::default()
    };
    Pool::new(dev.clone(), config)
}

fn pool(dev: &Arc<CudaDevice>, policy: PolicyKind) -> Pool {
    try_pool(dev, policy).unwrap()
}

/// A `Pool` per built-in policy: distinct patterns per block survive frees and reuse.
pub fn a_pool_over_the_gpu_runs_every_policy(dev: &Arc<CudaDevice>) {
    let side = dev.create_stream().unwrap();
    for policy in PolicyKind::ALL {
        if policy == PolicyKind::Expandable && dev.vmm().is_none() {
            let refused = try_pool(dev, policy).err();
            assert!(
                matches!(refused, Some(PoolError::Config(_))),
                "expandable without VMM: {refused:?}"
            );
            continue;
        }
        let pool = pool(dev, policy);
        let sizes = [512, 4096, 100_000, MIB, 3 * MIB + 17, 20 * MIB, 65 * MIB];
        let mut live = Vec::new();
        for (i, &size) in sizes.iter().enumerate() {
            let stream = if i % 2 == 0 { StreamId::DEFAULT } else { side };
            let a = pool.allocate(size, stream).unwrap();
            let data = pattern(i as u64 + 10, size as usize);
            dev.copy_to_device(a.ptr, &data, stream).unwrap();
            live.push((a, data, stream));
        }
        // Free every other block, allocate the same sizes again (reused from the cache by the
        // caching policies) with new patterns, then check every live block.
        let mut kept = Vec::new();
        for (i, (a, data, stream)) in live.into_iter().enumerate() {
            if i % 2 == 0 {
                pool.free(a.ptr).unwrap();
                let b = pool.allocate(a.size, stream).unwrap();
                let fresh = pattern(i as u64 + 100, a.size as usize);
                dev.copy_to_device(b.ptr, &fresh, stream).unwrap();
                kept.push((b, fresh));
            } else {
                kept.push((a, data));
            }
        }
        for (a, data) in &kept {
            assert_eq!(
                &read(dev, a.ptr, data.len()),
                data,
                "{policy}: block at {:#x}",
                a.ptr
            );
        }
        for (a, _) in kept {
            pool.free(a.ptr).unwrap();
        }
        pool.synchronize().unwrap();
        pool.empty_cache().unwrap();
        assert_eq!(pool.stats().reserved_bytes.all.current, 0, "{policy}");
    }
    dev.destroy_stream(side).unwrap();
}

/// A device OOM makes the pool release its cache and retry; past the device, the pool's OOM.
pub fn device_out_of_memory_makes_the_pool_reclaim_and_retry(dev: &Arc<CudaDevice>) {
    for policy in [PolicyKind::Torch, PolicyKind::Gpumem] {
        let pool = pool(dev, policy);
        let free = dev.mem_info().unwrap().free;
        // Cache 55% of free memory, then ask for 60%: the device refuses with
        // CUDA_ERROR_OUT_OF_MEMORY until the pool releases its cache.
        let cached_size = (free / 100 * 55) & !(MIB - 1);
        let cached = pool.allocate(cached_size, StreamId::DEFAULT).unwrap();
        pool.free(cached.ptr).unwrap();
        let big_size = (free / 100 * 60) & !(MIB - 1);
        let big = pool
            .allocate(big_size, StreamId::DEFAULT)
            .unwrap_or_else(|e| panic!("{policy}: no reclaim and retry: {e}"));
        let reserved = pool.stats().reserved_bytes.all.current;
        assert!(
            reserved < cached_size + big_size,
            "{policy}: the cached block was released ({reserved} bytes reserved)"
        );
        let err = pool
            .allocate(dev.info().total_memory, StreamId::DEFAULT)
            .unwrap_err();
        assert!(matches!(err, PoolError::OutOfMemory(_)), "{policy}: {err}");
        pool.free(big.ptr).unwrap();
        pool.empty_cache().unwrap();
    }
}

/// Every device listed opens, describes itself the same way and round-trips bytes.
pub fn every_device_opens_and_describes_itself() {
    let all = gpumem_cuda::devices().unwrap();
    assert_eq!(all.len(), CudaDevice::count().unwrap());
    for info in &all {
        eprintln!("{info}");
        let dev = CudaDevice::open(info.ordinal).unwrap();
        assert_eq!(dev.info(), info);
        let p = dev.malloc(MIB).unwrap();
        dev.copy_to_device(p, &pattern(8, 4096), StreamId::DEFAULT)
            .unwrap();
        assert_eq!(read(&dev, p, 4096), pattern(8, 4096));
        dev.free(p).unwrap();
    }
    let (major, _) = gpumem_cuda::driver_version().unwrap();
    assert!(major >= 11);
}

/// A stream made elsewhere in the primary context (here by a second device value, as PyTorch
/// makes its own) is accepted once adopted — synchronised, recorded on, and used by a pool's
/// cross-stream free — and is never destroyed by the device that adopted it: its owner destroys
/// it afterwards, once (the mock driver's `free` would fail on a second destroy).
pub fn a_foreign_stream_is_used_once_adopted_and_left_to_its_owner(dev: &Arc<CudaDevice>) {
    let owner = CudaDevice::open(dev.ordinal()).unwrap();
    let foreign = owner.create_stream().unwrap();
    let unknown = dev.synchronize_stream(foreign);
    assert!(
        matches!(unknown, Err(DeviceError::UnknownHandle { .. })),
        "{unknown:?}"
    );
    assert_eq!(dev.adopt_stream(foreign.0), foreign);
    assert_eq!(
        dev.adopt_stream(foreign.0),
        foreign,
        "adopting twice is harmless"
    );
    dev.synchronize_stream(foreign).unwrap();
    let event = dev.record_event(foreign).unwrap();
    dev.wait_event(event).unwrap();
    dev.destroy_event(event).unwrap();
    let pool = pool(dev, PolicyKind::Gpumem);
    let a = pool.allocate(MIB, StreamId::DEFAULT).unwrap();
    pool.record_stream(a.ptr, foreign).unwrap();
    pool.free(a.ptr).unwrap();
    pool.synchronize().unwrap();
    drop(pool);
    dev.destroy_stream(foreign).unwrap();
    assert!(dev.synchronize_stream(foreign).is_err(), "forgotten");
    owner.destroy_stream(foreign).unwrap();
}

/// The conformance suite (`gpumem_testkit::conformance`), each scenario on a freshly opened
/// device of the same ordinal, with VMM as the mock reports it (checked by the suite).
pub fn the_conformance_suite_passes(dev: &Arc<CudaDevice>) {
    let offers = gpumem_testkit::conformance::Offers {
        vmm: dev.info().vmm_supported(),
        streams: true,
        copies: true,
    };
    let ordinal = dev.ordinal();
    let report = gpumem_testkit::conformance::run(offers, &|| {
        Arc::new(CudaDevice::open(ordinal).unwrap()).into()
    });
    eprintln!("{report}");
    assert!(report.failures.is_empty(), "{report}");
}
