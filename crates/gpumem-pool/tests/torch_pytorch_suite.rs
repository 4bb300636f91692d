//! Allocator scenarios ported from PyTorch's own test suite (`test/test_cuda.py`, classes
//! `TestCuda` and `TestCudaMallocAsync`), run through the public pool API over the simulated
//! device with the `torch` (and where PyTorch runs them with expandable segments, the
//! `expandable`) policy, and checked against the same expected numbers.
//!
//! PyTorch's tests change allocator settings at run time (`_set_allocator_settings`) and set
//! a per-process memory fraction; here settings are fixed per pool, so a test builds one pool
//! per settings phase, and the fraction is the pool's hard limit.

use gpumem_testkit::Rng;

use std::sync::Arc;

use gpumem_device::sim::{SimConfig, SimDevice};
use gpumem_device::{Device, StreamId};
use gpumem_pool::policies::torch_settings::TorchSettings;
use gpumem_pool::{Action, Limit, PolicyKind, Pool, PoolConfig, PoolError, PoolOptions};

const MIB: u64 = 1 << 20;
const GIB: u64 = 1 << 30;
const S0: StreamId = StreamId::DEFAULT;
/// Bytes of a float32 element: PyTorch's tests allocate float tensors.
const FLOAT: u64 = 4;

fn host(capacity: u64) -> Arc<SimDevice> {
    Arc::new(SimDevice::new(SimConfig::host(capacity)).unwrap())
}

fn address_only(capacity: u64) -> Arc<SimDevice> {
    Arc::new(SimDevice::new(SimConfig::address_only(capacity)).unwrap())
}

fn pool(device: &Arc<SimDevice>, policy: PolicyKind, conf: &str, limit: Option<Limit>) -> Pool {
    Pool::new(
        device.clone(),
        PoolConfig {
            policy,
            torch: TorchSettings::parse(conf).unwrap(),
            options: PoolOptions {
                hard_limit: limit,
                history_capacity: 1 << 16,
                ..PoolOptions::default()
            },
            ..PoolConfig::default()
        },
    )
    .unwrap()
}

fn stat(pool: &Pool, key: &str) -> u64 {
    pool.stats().to_map()[key]
}

/// Port of `TestCuda._check_memory_stat_consistency`: the statistics agree with a snapshot
/// of the segments. Like PyTorch's, it leaves expandable segments out of the segment count
/// and their free blocks out of `inactive_split`.
fn check_memory_stat_consistency(pool: &Pool) {
    let mut expected = std::collections::BTreeMap::<String, u64>::new();
    let mut add = |key: String, n: u64| *expected.entry(key).or_default() += n;
    for segment in pool.segments() {
        let pool_str = segment.size_class.key();
        if !segment.is_expandable {
            add("segment.all.current".into(), 1);
            add(format!("segment.{pool_str}.current"), 1);
        }
        add("reserved_bytes.all.current".into(), segment.total_size);
        add(
            format!("reserved_bytes.{pool_str}.current"),
            segment.total_size,
        );
        let is_split = segment.blocks.len() > 1;
        for block in &segment.blocks {
            if block.in_use {
                for name in ["allocation", "active"] {
                    add(format!("{name}.all.current"), 1);
                    add(format!("{name}.{pool_str}.current"), 1);
                }
                for name in ["allocated_bytes", "active_bytes"] {
                    add(format!("{name}.all.current"), block.size);
                    add(format!("{name}.{pool_str}.current"), block.size);
                }
            } else if is_split && !segment.is_expandable {
                add("inactive_split.all.current".into(), 1);
                add(format!("inactive_split.{pool_str}.current"), 1);
                add("inactive_split_bytes.all.current".into(), block.size);
                add(
                    format!("inactive_split_bytes.{pool_str}.current"),
                    block.size,
                );
            }
        }
    }
    let stats = pool.stats().to_map();
    for (key, value) in expected {
        assert_eq!(stats[&key], value, "{key}");
    }
    for key in ["segment", "allocation", "inactive_split"] {
        let all = stats[&format!("{key}.all.current")];
        let parts = stats[&format!("{key}.small_pool.current")]
            + stats[&format!("{key}.large_pool.current")];
        assert_eq!(all, parts, "{key}");
    }
}

/// The memory-accounting checks of `TestCuda._test_memory_stats_generator`'s `assert_change`.
struct Tracker {
    last_allocated: u64,
    max_allocated: u64,
    last_reserved: u64,
    max_reserved: u64,
}

impl Tracker {
    fn new(pool: &Pool) -> Tracker {
        let s = pool.stats();
        Tracker {
            last_allocated: s.allocated_bytes.all.current,
            max_allocated: s.allocated_bytes.all.peak,
            last_reserved: s.reserved_bytes.all.current,
            max_reserved: s.reserved_bytes.all.peak,
        }
    }

    fn assert_change(&mut self, pool: &Pool, comp: i64, empty_cache: bool, reset_peak: bool) {
        let s = pool.stats();
        let (new_m, new_max_m) = (s.allocated_bytes.all.current, s.allocated_bytes.all.peak);
        match comp.signum() {
            1 => assert!(new_m > self.last_allocated),
            -1 => assert!(new_m < self.last_allocated),
            _ => assert_eq!(new_m, self.last_allocated),
        }
        assert!(new_m <= new_max_m);
        assert!(new_max_m >= self.max_allocated);
        self.last_allocated = new_m;
        self.max_allocated = new_max_m;
        let (new_r, new_max_r) = (s.reserved_bytes.all.current, s.reserved_bytes.all.peak);
        assert!(new_r <= new_max_r);
        assert!(new_max_r >= self.max_reserved);
        self.last_reserved = new_r;
        self.max_reserved = new_max_r;
        if empty_cache {
            pool.empty_cache().unwrap();
            let s = pool.stats();
            assert!(s.reserved_bytes.all.current <= self.last_reserved);
            assert_eq!(s.reserved_bytes.all.peak, self.max_reserved);
            self.last_reserved = s.reserved_bytes.all.current;
        }
        if reset_peak {
            pool.reset_peak_stats();
            let s = pool.stats();
            assert_eq!(s.allocated_bytes.all.current, self.last_allocated);
            assert_eq!(s.allocated_bytes.all.peak, self.last_allocated);
            self.max_allocated = self.last_allocated;
            assert_eq!(s.reserved_bytes.all.current, self.last_reserved);
            assert_eq!(s.reserved_bytes.all.peak, self.last_reserved);
            self.max_reserved = self.last_reserved;
        }
    }
}

/// Port of `TestCuda._test_memory_stats_generator` (N = 35) with the consistency check at
/// every `yield`, as `test_memory_stats` runs it.
fn memory_stats_generator(pool: &Pool) {
    const N: u64 = 35;
    let alloc = |dims: &[u64]| -> (u64, u64) {
        let numel: u64 = dims.iter().product();
        (pool.allocate(numel * FLOAT, S0).unwrap().ptr, numel)
    };
    let m0 = stat(pool, "allocated_bytes.all.current");
    let mut t = Tracker::new(pool);
    let step = |t: &mut Tracker, comp: i64, empty_cache: bool, reset_peak: bool| {
        t.assert_change(pool, comp, empty_cache, reset_peak);
        check_memory_stat_consistency(pool);
    };
    step(&mut t, 0, false, false);
    step(&mut t, 0, false, true);
    step(&mut t, 0, true, false);
    step(&mut t, 0, false, true);

    let tensors1 = [alloc(&[1]), alloc(&[10, 20]), alloc(&[200, 300, 2000])];
    let m1 = stat(pool, "allocated_bytes.all.current");
    step(&mut t, 1, false, false);

    let mut tensors2 = Vec::new();
    for i in 1..=N / 2 {
        tensors2.push(alloc(&[i, i * 4]));
        step(&mut t, 1, false, false);
    }
    for i in 5..N / 2 + 5 {
        tensors2.push(alloc(&[i, i * 7, i * 9, i * 11]));
        step(&mut t, 1, false, i % 2 == 0);
    }
    tensors2.push(alloc(&[0, 0, 0]));
    step(&mut t, 0, false, false);

    let mut rng = Rng::new(0x9E37_79B9_7F4A_7C15);
    for i in (1..tensors2.len()).rev() {
        let j = rng.below(i as u64 + 1) as usize;
        tensors2.swap(i, j);
        step(&mut t, 0, false, false);
    }
    step(&mut t, 0, false, true);

    for i in 0..(N / 2) as usize {
        let (ptr, numel) = tensors2.remove(i);
        pool.free(ptr).unwrap();
        step(&mut t, -(numel as i64), false, false);
    }
    for i in 2..(2 * N / 3 + 2) {
        tensors2.push(alloc(&[i, i * 3, i * 8]));
        step(&mut t, 1, false, false);
    }
    for (ptr, _) in tensors2 {
        pool.free(ptr).unwrap();
    }
    step(&mut t, -1, false, true);
    step(&mut t, 0, false, false);
    assert_eq!(stat(pool, "allocated_bytes.all.current"), m1);

    for (ptr, _) in tensors1 {
        pool.free(ptr).unwrap();
    }
    step(&mut t, -1, false, true);
    assert_eq!(stat(pool, "allocated_bytes.all.current"), m0);
    step(&mut t, 0, true, false);
    step(&mut t, 0, false, true);
    assert_eq!(stat(pool, "reserved_bytes.all.current"), 0);
}

/// Port of `TestCuda.test_memory_stats`.
#[test]
fn test_memory_stats() {
    let dev = address_only(64 * GIB);
    memory_stats_generator(&pool(&dev, PolicyKind::Torch, "", None));
}

/// Port of `TestCuda.test_memory_stats` as PyTorch's CI runs it with
/// `PYTORCH_CUDA_ALLOC_CONF=expandable_segments:True`.
#[test]
fn test_memory_stats_expandable() {
    let dev = address_only(64 * GIB);
    memory_stats_generator(&pool(&dev, PolicyKind::Expandable, "", None));
}

/// Port of `TestCuda.test_memory_stats` with a split limit, where oversize blocks stay whole.
#[test]
fn test_memory_stats_max_split_size() {
    let dev = address_only(64 * GIB);
    let p = pool(&dev, PolicyKind::Torch, "max_split_size_mb:20", None);
    memory_stats_generator(&p);
    let s = p.stats();
    assert_eq!(s.oversize_allocations.current, 0);
    assert!(s.oversize_allocations.allocated > 0);
    assert_eq!(s.oversize_segments.current, 0);
}

/// Port of `TestCuda.test_memory_allocation`: a 1-byte allocation raises
/// `memory_allocated`, and freeing it restores it.
#[test]
fn test_memory_allocation() {
    let dev = host(64 * MIB);
    let p = pool(&dev, PolicyKind::Torch, "", None);
    let prev = stat(&p, "allocated_bytes.all.current");
    let mem = p.allocate(1, S0).unwrap();
    assert!(stat(&p, "allocated_bytes.all.current") > prev);
    p.free(mem.ptr).unwrap();
    assert_eq!(stat(&p, "allocated_bytes.all.current"), prev);
}

/// Port of `TestCuda.test_memory_stats` (the newer, `torch.accelerator` version): a
/// 256-float tensor makes 1 KiB active, and after freeing and emptying the cache 1 KiB has
/// been freed; resetting peaks after empty_cache restores the previous peaks.
#[test]
fn test_memory_stats_active_bytes() {
    let dev = host(64 * MIB);
    let p = pool(&dev, PolicyKind::Torch, "", None);
    p.reset_peak_stats();
    p.reset_accumulated_stats();
    let prev_max_allocated = stat(&p, "allocated_bytes.all.peak");
    let prev_max_reserved = stat(&p, "reserved_bytes.all.peak");
    let prev_active = stat(&p, "active_bytes.all.current");
    let tmp = p.allocate(256 * FLOAT, S0).unwrap();
    assert_eq!(stat(&p, "active_bytes.all.current"), 1024 + prev_active);
    assert_eq!(stat(&p, "active_bytes.all.freed"), 0);
    p.free(tmp.ptr).unwrap();
    p.empty_cache().unwrap();
    assert_eq!(stat(&p, "active_bytes.all.current"), prev_active);
    assert_eq!(stat(&p, "active_bytes.all.freed"), 1024);
    p.reset_peak_stats();
    assert_eq!(stat(&p, "allocated_bytes.all.peak"), prev_max_allocated);
    assert_eq!(stat(&p, "reserved_bytes.all.peak"), prev_max_reserved);
}

/// Port of `TestCuda.test_cuda_memory_leak_detection`: a function that frees what it
/// allocates leaves `memory_allocated` unchanged; one that keeps 8 Mi floats is caught by it
/// and by the device's usage, while a leak small enough to land in cached memory shows in the
/// pool's statistics only ("increasing by just 1 byte can be hidden by the caching
/// allocator").
#[test]
fn test_cuda_memory_leak_detection() {
    let dev = host(256 * MIB);
    let p = pool(&dev, PolicyKind::Torch, "", None);
    let check = |f: &mut dyn FnMut()| -> (u64, u64) {
        let (allocated, used) = (stat(&p, "allocated_bytes.all.current"), dev.used());
        f();
        (
            stat(&p, "allocated_bytes.all.current") - allocated,
            dev.used() - used,
        )
    };
    let mut leaked = Vec::new();
    let no_leak = || {
        let t = p.allocate(1024 * FLOAT, S0).unwrap();
        p.free(t.ptr).unwrap();
    };
    // The cache keeps the 2 MiB segment: device usage grows without a leak, which is why
    // the check goes by memory_allocated.
    assert_eq!(check(&mut { no_leak }), (0, 2 * MIB));
    let leak_one_byte = || leaked.push(p.allocate(1, S0).unwrap());
    assert_eq!(
        check(&mut { leak_one_byte }),
        (512, 0),
        "hidden from the device"
    );
    let leak_gpu0 = || leaked.push(p.allocate(1024 * 1024 * 8 * FLOAT, S0).unwrap());
    assert_eq!(check(&mut { leak_gpu0 }), (32 * MIB, 32 * MIB));
    for a in leaked {
        p.free(a.ptr).unwrap();
    }
}

/// PyTorch's `power2_div` helper from `test_allocator_settings`.
fn power2_div(size: u64, div_factor: u64) -> u64 {
    let mut pow2 = 1;
    while pow2 < size {
        pow2 *= 2;
    }
    if pow2 == size {
        return pow2;
    }
    let step = pow2 / 2 / div_factor;
    let mut ret = pow2 / 2;
    while ret < size {
        ret += step;
    }
    ret
}

/// Port of `TestCudaMallocAsync.test_allocator_settings` (native backend): the growth of
/// `active_bytes.all.allocated` for 21 Mi floats under each setting.
#[test]
fn test_allocator_settings() {
    let nelems = 21 * 1024 * 1024;
    let nbytes = FLOAT * nelems;
    let nelems_big = 100 * 1024 * 1024;
    let nbytes_big = FLOAT * nelems_big;
    let key_allocated = "active_bytes.all.allocated";
    let key_requested = "requested_bytes.all.allocated";
    let dev = address_only(8 * GIB);
    let grows_by = |p: &Pool, bytes: u64| -> (u64, u64) {
        let (start, start_requested) = (stat(p, key_allocated), stat(p, key_requested));
        p.allocate(bytes, S0).unwrap();
        (
            stat(p, key_allocated) - start,
            stat(p, key_requested) - start_requested,
        )
    };

    let p = pool(&dev, PolicyKind::Torch, "", None);
    assert_eq!(grows_by(&p, nbytes), (nbytes, nbytes));

    // roundup_power2_divisions single value syntax
    let p = pool(&dev, PolicyKind::Torch, "roundup_power2_divisions:4", None);
    assert_eq!(grows_by(&p, nbytes), (power2_div(nbytes, 4), nbytes));
    assert_eq!(power2_div(nbytes, 4), 96 * MIB);

    // "should have reset the power2 divisions now"
    let p = pool(
        &dev,
        PolicyKind::Torch,
        "garbage_collection_threshold:0.5,max_split_size_mb:40",
        None,
    );
    assert_eq!(grows_by(&p, nbytes).0, nbytes);

    // roundup_power2_divisions knob array syntax
    let p = pool(
        &dev,
        PolicyKind::Torch,
        "garbage_collection_threshold:0.5,roundup_power2_divisions:[64:8,128:2,256:2,512:2,1024:1,>:1]",
        None,
    );
    assert_eq!(grows_by(&p, nbytes).0, power2_div(nbytes, 8));
    assert_eq!(power2_div(nbytes, 8), 88 * MIB);
    p.empty_cache().unwrap();
    assert_eq!(grows_by(&p, nbytes_big).0, power2_div(nbytes_big, 2));
    assert_eq!(power2_div(nbytes_big, 2), 512 * MIB);

    let p = pool(
        &dev,
        PolicyKind::Torch,
        "release_lock_on_cudamalloc:True",
        None,
    );
    assert_eq!(grows_by(&p, nbytes).0, nbytes);

    for bad in [
        "foo:1,bar:2",
        "garbage_collection_threshold:1.2",
        "max_split_size_mb:2",
    ] {
        assert!(TorchSettings::parse(bad).is_err(), "{bad}");
    }
}

/// Port of `TestCuda.test_set_per_process_memory_fraction`, the fraction being the pool's
/// hard limit: 0.499 of the device (less what is reserved) fits, half of it does not.
#[test]
fn test_set_per_process_memory_fraction() {
    let dev = address_only(8 * GIB);
    let total = 8 * GIB;
    let p = pool(&dev, PolicyKind::Torch, "", Some(Limit::Fraction(0.5)));
    let tensor = p.allocate(1024 * FLOAT, S0).unwrap();
    p.empty_cache().unwrap();
    let application = (total as f64 * 0.499) as u64 - stat(&p, "reserved_bytes.all.peak");
    let tmp = p.allocate(application, S0).unwrap();
    p.free(tmp.ptr).unwrap();
    p.empty_cache().unwrap();
    let application = total / 2;
    let err = p.allocate(application, S0).unwrap_err();
    assert!(matches!(err, PoolError::OutOfMemory(_)));
    assert!(err.to_string().contains("out of memory"), "{err}");
    // "ensure out of memory error doesn't disturb subsequent kernel"
    p.free(tensor.ptr).unwrap();
    assert_eq!(stat(&p, "allocated_bytes.all.current"), 0);
}

/// Port of `TestCuda.test_out_of_memory_retry`: half the device fits once; a second half
/// fails; after freeing the first, it fits.
#[test]
fn test_out_of_memory_retry() {
    // A real device keeps some memory for the CUDA context, so half of it twice does not
    // fit; the simulated device keeps none, so the port asks for a little more than half.
    let dev = host(256 * MIB);
    let p = pool(&dev, PolicyKind::Torch, "", None);
    let size = 129 * MIB;
    let a = p.allocate(size, S0).unwrap();
    let err = p.allocate(size, S0).unwrap_err();
    assert!(err.to_string().contains("tried to allocate"), "{err}");
    p.free(a.ptr).unwrap();
    let b = p.allocate(size, S0).unwrap();
    p.free(b.ptr).unwrap();
    p.empty_cache().unwrap();
    assert_eq!(dev.used(), 0);
}

/// Port of `TestCuda.test_out_of_memory` and `TestCudaMallocAsync.test_raises_oom` (with and
/// without `max_split_size_mb:1024`): absurd requests fail with an OOM, and the pool still
/// works afterwards.
#[test]
fn test_raises_oom() {
    for conf in ["", "max_split_size_mb:1024"] {
        for policy in [PolicyKind::Torch, PolicyKind::Expandable] {
            let dev = host(64 * MIB);
            let p = pool(&dev, policy, conf, None);
            let tensor = p.allocate(1024 * FLOAT, S0).unwrap();
            for bytes in [
                1024u64 * 1024 * 1024 * 1024 * FLOAT,
                8_000_000_000 * GIB,
                u64::MAX,
            ] {
                let err = p.allocate(bytes, S0).unwrap_err();
                assert!(
                    matches!(err, PoolError::OutOfMemory(_)),
                    "{policy} {conf}: {err}"
                );
            }
            p.free(tensor.ptr).unwrap();
            assert_eq!(stat(&p, "num_ooms"), 3);
        }
    }
}

/// Port of `TestCudaMallocAsync.test_max_split_expandable` (120 MiB allowed,
/// `max_split_size_mb:40`): three 40 MiB blocks fill the limit, a fourth OOMs, and after
/// freeing them 120 MiB fits because the cache is released. PyTorch switches
/// `expandable_segments` between the three allocations; here each mode runs on its own.
#[test]
fn test_max_split_expandable() {
    for policy in [PolicyKind::Torch, PolicyKind::Expandable] {
        let dev = host(1024 * MIB);
        let p = pool(
            &dev,
            policy,
            "max_split_size_mb:40",
            Some(Limit::Bytes(120 * MIB)),
        );
        let alloc = |n: u64| p.allocate(n * MIB, S0);
        let a = alloc(40).unwrap();
        let b = alloc(40).unwrap();
        let c = alloc(40).unwrap();
        assert!(
            matches!(alloc(40), Err(PoolError::OutOfMemory(_))),
            "{policy}"
        );
        for x in [a, b, c] {
            p.free(x.ptr).unwrap();
        }
        alloc(120).unwrap();
        assert_eq!(
            stat(&p, "reserved_bytes.all.current"),
            120 * MIB,
            "{policy}"
        );
    }
}

/// Port of `TestCudaMallocAsync.test_garbage_collect_expandable` (120 MiB allowed,
/// `garbage_collection_threshold:0.5`): after two 40 MiB blocks are freed, an 80 MiB request
/// runs the garbage collector, which frees the old cached segments before the device is
/// asked, so no reclaim-and-retry is needed.
#[test]
fn test_garbage_collect_expandable() {
    let dev = host(1024 * MIB);
    let p = pool(
        &dev,
        PolicyKind::Torch,
        "garbage_collection_threshold:0.5",
        Some(Limit::Bytes(120 * MIB)),
    );
    let a = p.allocate(40 * MIB, S0).unwrap();
    let b = p.allocate(40 * MIB, S0).unwrap();
    p.free(a.ptr).unwrap();
    p.free(b.ptr).unwrap();
    p.allocate(80 * MIB, S0).unwrap();
    let s = p.stats();
    assert_eq!(s.num_device_free, 2, "GC freed both cached segments");
    assert_eq!(
        s.num_alloc_retries, 0,
        "GC avoided the reclaim-and-retry path"
    );
    assert_eq!(s.reserved_bytes.all.current, 80 * MIB);

    // With expandable segments the cached block is split (an unmapped tail follows it), so
    // the collector leaves it; the request grows the segment instead.
    let dev = host(1024 * MIB);
    let p = pool(
        &dev,
        PolicyKind::Expandable,
        "garbage_collection_threshold:0.5",
        Some(Limit::Bytes(120 * MIB)),
    );
    let a = p.allocate(40 * MIB, S0).unwrap();
    let b = p.allocate(40 * MIB, S0).unwrap();
    p.free(a.ptr).unwrap();
    p.free(b.ptr).unwrap();
    let c = p.allocate(80 * MIB, S0).unwrap();
    assert_eq!(c.ptr, a.ptr);
    assert_eq!(stat(&p, "reserved_bytes.all.current"), 80 * MIB);
}

/// PyTorch's garbage collector frees blocks at least as old as the average age, counted in
/// searches of the large pool, and keeps the young ones.
#[test]
fn garbage_collection_frees_old_blocks_first() {
    let dev = host(1024 * MIB);
    let p = pool(
        &dev,
        PolicyKind::Torch,
        "garbage_collection_threshold:0.5",
        Some(Limit::Bytes(100 * MIB)),
    );
    let old = p.allocate(40 * MIB, S0).unwrap(); // search 1
    let hot = p.allocate(2 * MIB, S0).unwrap(); // search 2: a 20 MiB segment
    p.free(old.ptr).unwrap();
    p.free(hot.ptr).unwrap();
    // Searches 3–7 reuse the 20 MiB block (the best fit), which is cached again each time.
    for _ in 0..5 {
        let x = p.allocate(2 * MIB, S0).unwrap();
        assert_eq!(x.ptr, hot.ptr);
        p.free(x.ptr).unwrap();
    }
    // 60 MiB fits no cached block; 60 MiB reserved is above 0.5 × 100 MiB, so the collector
    // runs: ages 6 (old) and 1 (hot), average 3.5 — only the old block goes.
    p.allocate(60 * MIB, S0).unwrap();
    let s = p.stats();
    assert_eq!(s.num_device_free, 1);
    assert_eq!(s.num_alloc_retries, 0);
    assert_eq!(s.reserved_bytes.all.current, 80 * MIB);
    assert_eq!(p.allocate(2 * MIB, S0).unwrap().ptr, hot.ptr);
}

/// Port of `TestCuda.test_record_stream`: a block freed while another stream still uses it
/// is not handed out again until that stream's work is done, then it is, on its own stream.
#[test]
fn test_record_stream() {
    let dev = host(64 * MIB);
    let p = pool(&dev, PolicyKind::Torch, "", None);
    let stream = dev.create_stream().unwrap();
    let current = S0;
    let _result = p.allocate(4 * FLOAT, current).unwrap();
    // perform_copy: tmp is allocated on the side stream and used on the current one.
    let tmp = p.allocate(4 * FLOAT, stream).unwrap();
    p.record_stream(tmp.ptr, current).unwrap();
    dev.enqueue_work(current).unwrap(); // the delayed copy
    p.free(tmp.ptr).unwrap();
    let tmp2 = p.allocate(4 * FLOAT, stream).unwrap();
    assert_ne!(tmp2.ptr, tmp.ptr, "allocation reused to soon");
    dev.synchronize_stream(current).unwrap();
    dev.complete_stream(current).unwrap();
    let tmp3 = p.allocate(4 * FLOAT, stream).unwrap();
    assert_eq!(tmp3.ptr, tmp.ptr, "allocation not reused");
}

/// Port of `TestCuda.test_record_stream_on_shifted_view`: a block recorded on a busy stream
/// is not reallocated on its own stream before that stream's work completes.
#[test]
fn test_record_stream_on_shifted_view() {
    let dev = host(64 * MIB);
    let p = pool(&dev, PolicyKind::Torch, "", None);
    let stream_alloc = dev.create_stream().unwrap();
    let base = p.allocate(2 * FLOAT, stream_alloc).unwrap();
    let stream_record = dev.create_stream().unwrap();
    dev.enqueue_work(stream_record).unwrap();
    p.record_stream(base.ptr, stream_record).unwrap();
    p.free(base.ptr).unwrap();
    let try_realloc = p.allocate(2 * FLOAT, stream_alloc).unwrap();
    assert_ne!(try_realloc.ptr, base.ptr);
}

/// Port of `TestCuda.test_caching_allocator_record_stream_oom` (issue #19219): blocks whose
/// reuse waits on a busy stream are still freed when the device runs out of memory.
#[test]
fn test_caching_allocator_record_stream_oom() {
    let dev = host(1024 * MIB);
    let p = pool(&dev, PolicyKind::Torch, "", None);
    let stream = dev.create_stream().unwrap();
    let bytes = 40 * 1024 * 1024 * FLOAT;
    let _y = p.allocate(bytes, stream).unwrap();
    for _ in 0..100 {
        let x = p.allocate(bytes, S0).unwrap();
        dev.enqueue_work(stream).unwrap(); // y += x on the side stream
        p.record_stream(x.ptr, stream).unwrap();
        p.free(x.ptr).unwrap();
    }
    let s = p.stats();
    assert!(s.num_sync_all_streams > 0);
    assert!(s.num_alloc_retries > 0);
    assert_eq!(s.num_ooms, 0);
    p.empty_cache().unwrap();
}

/// Port of `TestCudaMallocAsync.test_memory_snapshot`: the block of `x` is the second in its
/// segment, tiny tensors tile one segment, and after `empty_cache` the last recorded action
/// gives a segment back.
#[test]
fn test_memory_snapshot() {
    for policy in [PolicyKind::Torch, PolicyKind::Expandable] {
        let dev = host(256 * MIB);
        let p = pool(&dev, policy, "", None);
        // make x the second block in a segment
        let first = p.allocate(2 * 311 * 411 * FLOAT, S0).unwrap();
        p.free(first.ptr).unwrap();
        let unused = p.allocate(310 * 410 * FLOAT, S0).unwrap();
        let x = p.allocate(311 * 411 * FLOAT, S0).unwrap();
        // tensors of 128 floats (512 B, the minimum block) tile one segment
        let mut tensors: Vec<u64> = (0..1000)
            .map(|_| p.allocate(128 * FLOAT, S0).unwrap().ptr)
            .collect();
        let mut rng = Rng::new(123);
        while !tensors.is_empty() {
            let i = rng.below(tensors.len() as u64) as usize;
            p.free(tensors.swap_remove(i)).unwrap();
        }
        let temporary = p.allocate(128 * 5 * FLOAT, S0).unwrap();
        p.free(temporary.ptr).unwrap();
        let segment = p
            .segments()
            .into_iter()
            .find(|s| s.blocks.iter().any(|b| b.address == x.ptr))
            .unwrap();
        let position = segment.blocks.iter().position(|b| b.address == x.ptr);
        assert_eq!(position, Some(1), "{policy}");
        assert_eq!(segment.blocks[0].address, unused.ptr);
        p.free(unused.ptr).unwrap();
        p.free(x.ptr).unwrap();
        p.empty_cache().unwrap();
        let last = p.history().last().map(|e| e.action);
        assert!(
            matches!(last, Some(Action::SegmentFree | Action::SegmentUnmap)),
            "{policy}: {last:?}"
        );
    }
}

/// Port of `TestCudaMallocAsync.test_allocator_fuzz` (seeded, 10 000 steps): random
/// allocations of 2–20 MiB, frees and `empty_cache` calls while keeping under 1 GiB; each
/// block is filled with its own value and checked when freed, so overlapping blocks would
/// show. Here the value is stamped at both ends of each block, on a host-backed device.
#[test]
fn test_allocator_fuzz() {
    for policy in [PolicyKind::Torch, PolicyKind::Expandable] {
        let dev = host(2 * GIB);
        let p = pool(&dev, policy, "", None);
        let mut rng = Rng::new(123);
        let mut mem: Vec<(u64, u64, u64)> = Vec::new();
        let mut total = 0u64;
        let mut c = 0u64;
        let stamp = |ptr: u64, len: u64, value: u64| {
            let bytes = value.to_le_bytes();
            dev.copy_to_device(ptr, &bytes, S0).unwrap();
            dev.copy_to_device(ptr + len - 8, &bytes, S0).unwrap();
        };
        let check = |ptr: u64, len: u64, value: u64| {
            for at in [ptr, ptr + len - 8] {
                let mut bytes = [0u8; 8];
                dev.copy_to_host(&mut bytes, at, S0).unwrap();
                assert_eq!(
                    u64::from_le_bytes(bytes),
                    value,
                    "{policy}: block overwritten"
                );
            }
        };
        for _ in 0..10_000 {
            while total >= GIB / (4 * 10) {
                let (ptr, len, v) = mem.swap_remove(rng.below(mem.len() as u64) as usize);
                check(ptr, len, v);
                p.free(ptr).unwrap();
                total -= len / 4;
            }
            // weights: alloc 1, free 1 (if any), empty_cache 0.1
            let roll = rng.below(21);
            if roll < 10 || (mem.is_empty() && roll < 20) {
                let b = 2 * 1024 * 1024 / 4 + rng.below((20 - 2) * 1024 * 1024 / 4);
                let len = b * 4;
                let ptr = p.allocate(len, S0).unwrap().ptr;
                stamp(ptr, len, c);
                mem.push((ptr, len, c));
                c += 1;
                total += b;
            } else if roll < 20 {
                let (ptr, len, v) = mem.swap_remove(rng.below(mem.len() as u64) as usize);
                check(ptr, len, v);
                p.free(ptr).unwrap();
                total -= len / 4;
            } else {
                p.empty_cache().unwrap();
            }
        }
        for (ptr, len, v) in mem {
            check(ptr, len, v);
            p.free(ptr).unwrap();
        }
        p.empty_cache().unwrap();
        assert_eq!(stat(&p, "reserved_bytes.all.current"), 0, "{policy}");
        assert_eq!(dev.used(), 0, "{policy}");
    }
}
