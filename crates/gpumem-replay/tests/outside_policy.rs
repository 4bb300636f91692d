//! A placement policy written outside gpumem's crates — the recipe "add a policy" of
//! docs/architecture.md — runs in a `Pool` and through replay like the built-in ones.
//!
//! The toy caches freed blocks by exact size: a request reuses a cached block of the same
//! rounded size on the same stream, or allocates a segment of its own.

use std::collections::HashMap;
use std::sync::Arc;

use gpumem_device::sim::{SimConfig, SimDevice};
use gpumem_device::{Device, StreamId};
use gpumem_pool::{
    AllocRequest, Block, BlockHandle, BlockView, Exhausted, Policy, PolicyKind, Pool, PoolError,
    PoolOptions, ReleaseTarget, SegmentView, SizeClass, Upstream,
};
use gpumem_replay::{replay, CustomPolicy, ReplayOptions};

const MIB: u64 = 1 << 20;

/// Freed blocks kept by (stream, size), each its own device segment.
#[derive(Default)]
struct ExactSizeCache {
    cached: HashMap<(StreamId, u64), Vec<u64>>,
    /// Every segment held: address → (size, stream, in use).
    segments: HashMap<u64, (u64, StreamId, bool)>,
}

impl Policy for ExactSizeCache {
    fn name(&self) -> &'static str {
        "exact-size"
    }

    fn allocate(
        &mut self,
        req: AllocRequest,
        up: &mut Upstream<'_>,
    ) -> Result<Block, Box<Exhausted>> {
        let size = req.size.next_multiple_of(512);
        let size_class = SizeClass::for_request(req.size);
        let reused = self.cached.get_mut(&(req.stream, size)).and_then(Vec::pop);
        let addr = match reused {
            Some(addr) => addr,
            None => up
                .malloc_segment(size, size_class, req.stream)
                .map_err(|cause| {
                    Box::new(Exhausted {
                        attempted: size,
                        cause,
                    })
                })?,
        };
        self.segments.insert(addr, (size, req.stream, true));
        Ok(Block {
            addr,
            size,
            requested: req.size,
            stream: req.stream,
            size_class,
            handle: BlockHandle::new(addr),
        })
    }

    fn free(&mut self, block: Block, _: &mut Upstream<'_>) {
        if let Some(segment) = self.segments.get_mut(&block.handle.get()) {
            segment.2 = false;
            self.cached
                .entry((block.stream, block.size))
                .or_default()
                .push(block.addr);
        }
    }

    fn release_cached(&mut self, _: ReleaseTarget, up: &mut Upstream<'_>) -> u64 {
        let mut released = 0;
        for ((stream, size), addrs) in self.cached.drain() {
            for addr in addrs {
                self.segments.remove(&addr);
                let class = SizeClass::for_request(size);
                if up.free_segment(addr, size, class, stream).is_ok() {
                    released += size;
                }
            }
        }
        released
    }

    fn segments(&self) -> Vec<SegmentView> {
        let mut views: Vec<SegmentView> = self
            .segments
            .iter()
            .map(|(&address, &(size, stream, in_use))| SegmentView {
                address,
                total_size: size,
                stream,
                size_class: SizeClass::for_request(size),
                is_expandable: false,
                blocks: vec![BlockView {
                    address,
                    size,
                    in_use,
                }],
            })
            .collect();
        views.sort_by_key(|v| v.address);
        views
    }

    fn largest_free_block(&self) -> u64 {
        self.cached
            .iter()
            .filter(|(_, addrs)| !addrs.is_empty())
            .map(|(&(_, size), _)| size)
            .max()
            .unwrap_or(0)
    }
}

#[test]
fn an_outside_policy_runs_in_a_pool() {
    let device = Arc::new(SimDevice::new(SimConfig::host(64 * MIB)).unwrap());
    let pool = Pool::with_policy(
        device.clone(),
        Box::new(ExactSizeCache::default()),
        PoolOptions::default(),
    )
    .unwrap();
    assert_eq!(pool.policy_name(), "exact-size");

    let a = pool.allocate(3 * MIB, StreamId::DEFAULT).unwrap();
    let bytes = vec![7u8; 1024];
    device
        .copy_to_device(a.ptr, &bytes, StreamId::DEFAULT)
        .unwrap();
    pool.free(a.ptr).unwrap();
    let calls = pool.stats().device_calls.malloc;
    let b = pool.allocate(3 * MIB, StreamId::DEFAULT).unwrap();
    assert_eq!(b.ptr, a.ptr, "the cached block is reused");
    assert_eq!(
        pool.stats().device_calls.malloc,
        calls,
        "without a device call"
    );
    assert_eq!(pool.stats().allocated_bytes.all.current, 3 * MIB);

    // The pool's own machinery works over it: status, snapshot, OOM with reclaim.
    pool.free(b.ptr).unwrap();
    let status = pool.status().unwrap();
    assert_eq!((status.policy, status.reserved), ("exact-size", 3 * MIB));
    assert_eq!(pool.snapshot().segments.len(), 1);
    let big = pool.allocate(62 * MIB, StreamId::DEFAULT).unwrap();
    assert_eq!(
        pool.stats().num_alloc_retries,
        1,
        "the cached 3 MiB block was released to make room"
    );
    let err = pool.allocate(4 * MIB, StreamId::DEFAULT).unwrap_err();
    let PoolError::OutOfMemory(oom) = err else {
        panic!("{err}")
    };
    assert_eq!(oom.pool.policy, "exact-size");
    pool.free(big.ptr).unwrap();
    assert_eq!(pool.empty_cache().unwrap(), 62 * MIB);
    assert_eq!(device.used(), 0);
}

#[test]
fn an_outside_policy_replays_a_real_trace() {
    let path = concat!(
        env!("CARGO_MANIFEST_DIR"),
        "/../../testdata/traces/gpt2-12l-infer-b8-s256.jsonl.gz"
    );
    let trace = gpumem_trace::read_path(path, Default::default()).unwrap();
    let options = ReplayOptions::default();
    let toy = CustomPolicy {
        name: "exact-size",
        make: || Box::new(ExactSizeCache::default()) as Box<dyn Policy>,
    };
    let ours = replay(&trace, toy, &options, &mut |_| {}).unwrap().report;
    let none = replay(&trace, PolicyKind::None, &options, &mut |_| {})
        .unwrap()
        .report;
    assert_eq!(ours.policy, "exact-size");
    // Same 512-byte rounding as the uncached policy, so the same blocks are live...
    assert_eq!(ours.peak_allocated_bytes, none.peak_allocated_bytes);
    // ...but a warm cache serves the repeated steps without device calls.
    assert!(ours.device_alloc_calls < none.device_alloc_calls / 2);
    assert_eq!(ours.steady_state_alloc_calls_per_step, Some(0));
}
