//! Every policy under asynchronous execution: random multi-stream workloads run on a simulated
//! GPU that never finishes work on its own (a kernel completes only when the host waits for
//! it), watched by the [`HazardChecker`]. Each block is written by a kernel on its stream when
//! allocated, used by more kernels (some on other streams, ordered by events and announced
//! with `record_stream`, as PyTorch users do), and read by a last kernel right before its free.
//! Under soft and hard limits, outside memory pressure, `empty_cache`, OOM reclaim and limit
//! changes in the middle of the run, no policy may unmap, release or re-lend memory that queued
//! work still uses: zero hazards.

use std::sync::Arc;

use gpumem_device::sim::{SimConfig, SimDevice};
use gpumem_device::{Device, HazardChecker, StreamId};
use gpumem_pool::{Limit, PolicyKind, Pool, PoolConfig, PoolError, PoolOptions};
use proptest::prelude::*;

const MIB: u64 = 1 << 20;
/// The simulated device's memory: small, so that the workloads meet its limit.
const CAPACITY: u64 = 768 * MIB;
/// Streams of the workload: the default one and two created ones.
const STREAMS: usize = 3;

#[derive(Clone, Debug)]
enum Op {
    Alloc {
        size: u64,
        stream: usize,
    },
    /// A kernel on the block's own stream.
    Use {
        pick: usize,
    },
    /// A kernel on another stream, ordered after the block's own stream by an event and
    /// announced with `record_stream`; the own stream then waits for it.
    UseElsewhere {
        pick: usize,
        stream: usize,
    },
    Free {
        pick: usize,
    },
    EmptyCache,
    Synchronize,
    /// Another user of the device takes (or gives back) memory outside the pool.
    Outside {
        bytes: u64,
    },
    /// The hard limit changes (`None`: removed).
    Limit {
        mib: Option<u64>,
    },
}

fn size_strategy() -> impl Strategy<Value = u64> {
    prop_oneof![
        4 => 1u64..4096,
        4 => 4096u64..(2 * MIB),
        3 => (2 * MIB)..(30 * MIB),
        2 => (30 * MIB)..(160 * MIB),
    ]
}

fn op_strategy() -> impl Strategy<Value = Op> {
    prop_oneof![
        12 => (size_strategy(), 0..STREAMS).prop_map(|(size, stream)| Op::Alloc { size, stream }),
        4 => any::<usize>().prop_map(|pick| Op::Use { pick }),
        2 => (any::<usize>(), 0..STREAMS).prop_map(|(pick, stream)| Op::UseElsewhere { pick, stream }),
        9 => any::<usize>().prop_map(|pick| Op::Free { pick }),
        1 => Just(Op::EmptyCache),
        1 => Just(Op::Synchronize),
        1 => (0u64..300).prop_map(|mib| Op::Outside { bytes: mib * MIB }),
        1 => prop::option::of(100u64..700).prop_map(|mib| Op::Limit { mib }),
    ]
}

/// A pool of `policy` over a hazard-checked simulated device (with or without VMM).
struct Rig {
    checker: Arc<HazardChecker>,
    pool: Pool,
    streams: Vec<StreamId>,
    /// Live blocks: (address, bytes, stream).
    live: Vec<(u64, u64, StreamId)>,
    /// Memory another user holds, outside the pool.
    outside: Option<u64>,
    label: u64,
}

impl Rig {
    fn new(policy: PolicyKind, vmm: bool, options: PoolOptions) -> Rig {
        let sim = Arc::new(
            SimDevice::new(SimConfig {
                granularity: vmm.then_some(2 * MIB),
                ..SimConfig::address_only(CAPACITY)
            })
            .unwrap(),
        );
        let work = sim.clone();
        let checker = Arc::new(
            HazardChecker::new(sim).with_work(Box::new(move |stream, ns| {
                work.enqueue_timed_work(stream, ns)
            })),
        );
        let mut streams = vec![StreamId::DEFAULT];
        for _ in 1..STREAMS {
            streams.push(checker.create_stream().unwrap());
        }
        let config = PoolConfig {
            policy,
            options,
            ..PoolConfig::default()
        };
        let pool = Pool::new(checker.clone(), config).unwrap();
        Rig {
            checker,
            pool,
            streams,
            live: Vec::new(),
            outside: None,
            label: 0,
        }
    }

    /// A kernel on `stream` touching the whole block.
    fn kernel(&mut self, stream: StreamId, ptr: u64, size: u64) {
        self.label += 1;
        self.checker
            .launch(stream, &[(ptr, size)], 10_000, self.label)
            .unwrap();
    }

    fn apply(&mut self, op: &Op) {
        self.checker.set_context(format!("{op:?}"));
        match *op {
            Op::Alloc { size, stream } => {
                let stream = self.streams[stream];
                match self.pool.allocate(size, stream) {
                    Ok(a) => {
                        self.kernel(stream, a.ptr, size);
                        self.live.push((a.ptr, size, stream));
                    }
                    Err(PoolError::OutOfMemory(_)) => {}
                    Err(e) => panic!("{}: {e}", self.pool.policy_name()),
                }
            }
            Op::Use { pick } if !self.live.is_empty() => {
                let (ptr, size, stream) = self.live[pick % self.live.len()];
                self.kernel(stream, ptr, size);
            }
            Op::UseElsewhere { pick, stream } if !self.live.is_empty() => {
                let (ptr, size, own) = self.live[pick % self.live.len()];
                let other = self.streams[stream];
                let ready = self.checker.record_event(own).unwrap();
                self.checker.stream_wait_event(other, ready).unwrap();
                self.checker.destroy_event(ready).unwrap();
                self.kernel(other, ptr, size);
                self.pool.record_stream(ptr, other).unwrap();
                // Later work on the block's own stream waits for the other stream (a program
                // that did not would race on the block itself, whatever the pool does).
                let done = self.checker.record_event(other).unwrap();
                self.checker.stream_wait_event(own, done).unwrap();
                self.checker.destroy_event(done).unwrap();
            }
            Op::Free { pick } if !self.live.is_empty() => {
                let (ptr, size, stream) = self.live.swap_remove(pick % self.live.len());
                self.kernel(stream, ptr, size);
                self.pool.free(ptr).unwrap();
            }
            Op::EmptyCache => {
                self.pool.empty_cache().unwrap();
            }
            Op::Synchronize => self.pool.synchronize().unwrap(),
            Op::Outside { bytes } => match self.outside.take() {
                Some(ptr) => self.checker.free(ptr).unwrap(),
                None if bytes > 0 => self.outside = self.checker.malloc(bytes).ok(),
                None => {}
            },
            Op::Limit { mib } => {
                let options = PoolOptions {
                    hard_limit: mib.map(|m| Limit::Bytes(m * MIB)),
                    ..PoolOptions::default()
                };
                self.pool.set_limits(&options).unwrap();
            }
            Op::Use { .. } | Op::UseElsewhere { .. } | Op::Free { .. } => {}
        }
    }

    /// Panics with every hazard found since the last call, if there is one.
    fn assert_no_hazards(&self, what: &str) {
        let hazards = self.checker.take_hazards();
        let lines: Vec<String> = hazards.iter().map(ToString::to_string).collect();
        assert!(hazards.is_empty(), "{what}: {}", lines.join("\n"));
    }

    /// Runs `ops`, frees everything and empties the cache; panics on the first hazard.
    fn run(mut self, ops: &[Op]) {
        let policy = self.pool.policy_name();
        for op in ops {
            self.apply(op);
            self.assert_no_hazards(policy);
        }
        while !self.live.is_empty() {
            self.apply(&Op::Free { pick: 0 });
        }
        self.apply(&Op::EmptyCache);
        self.assert_no_hazards(policy);
        assert_eq!(self.pool.stats().reserved_bytes.all.current, 0, "{policy}");
    }
}

fn options_strategy() -> impl Strategy<Value = PoolOptions> {
    (prop::option::of(50u64..600), prop::option::of(100u64..700)).prop_map(|(soft, hard)| {
        PoolOptions {
            soft_limit: soft.map(|m| Limit::Bytes(m * MIB)),
            hard_limit: hard.map(|m| Limit::Bytes(m.max(soft.unwrap_or(0)) * MIB)),
            ..PoolOptions::default()
        }
    })
}

proptest! {
    #![proptest_config(ProptestConfig { cases: 96, ..ProptestConfig::default() })]

    #[test]
    fn no_policy_reuses_memory_under_work_in_flight(
        policy in prop::sample::select(PolicyKind::ALL.to_vec()),
        vmm in any::<bool>(),
        options in options_strategy(),
        ops in prop::collection::vec(op_strategy(), 1..160),
    ) {
        // `expandable` needs VMM; without it the pool refuses to be built.
        let vmm = vmm || policy == PolicyKind::Expandable;
        Rig::new(policy, vmm, options).run(&ops);
    }
}

/// A fixed scenario every policy must pass: growth on one stream, memory freed under queued
/// work, then pressure from another stream that only the first stream's idle memory can
/// relieve, and `empty_cache` with work still queued.
#[test]
fn pressure_across_streams_waits_for_the_work_in_flight() {
    for policy in PolicyKind::ALL {
        for vmm in [true, false] {
            if policy == PolicyKind::Expandable && !vmm {
                continue;
            }
            let mut rig = Rig::new(policy, vmm, PoolOptions::default());
            let mut ops = Vec::new();
            for size in [300, 150, 120, 80, 40] {
                ops.push(Op::Alloc {
                    size: size * MIB,
                    stream: 0,
                });
            }
            for _ in 0..5 {
                ops.push(Op::Free { pick: 0 });
            }
            ops.push(Op::Alloc {
                size: 600 * MIB,
                stream: 1,
            });
            ops.push(Op::Alloc {
                size: 100 * MIB,
                stream: 2,
            });
            ops.push(Op::EmptyCache);
            for op in &ops {
                rig.apply(op);
            }
            rig.assert_no_hazards(&format!("{policy} (vmm {vmm})"));
        }
    }
}

/// gpumem's stitching on growth under queued work: the freed block's chunks move under the
/// big block at once, ordered by one event, and their old addresses are unmapped only once
/// the host has seen that work complete — no synchronisation on the way.
#[test]
fn stitching_under_queued_work_waits_for_an_event_not_the_host() {
    let mut rig = Rig::new(PolicyKind::Gpumem, true, PoolOptions::default());
    for op in [
        Op::Alloc {
            size: 128 * MIB,
            stream: 0,
        },
        Op::Alloc {
            size: 2 * MIB,
            stream: 0,
        },
        Op::Free { pick: 0 },
        Op::Alloc {
            size: 200 * MIB,
            stream: 0,
        },
    ] {
        rig.apply(&op);
    }
    let calls = rig.pool.stats().device_calls;
    assert_eq!(calls.record_event, 1, "one event for the whole stitch");
    assert_eq!((calls.synchronize, calls.unmap), (0, 0));
    assert_eq!(rig.pool.stats().reserved_bytes.all.current, 202 * MIB);
    rig.apply(&Op::Alloc {
        size: 512,
        stream: 0,
    });
    assert_eq!(
        rig.pool.stats().device_calls.unmap,
        0,
        "the freed block's kernels are still queued"
    );
    rig.apply(&Op::Synchronize);
    rig.apply(&Op::Alloc {
        size: 512,
        stream: 0,
    });
    assert_eq!(rig.pool.stats().device_calls.unmap, 32, "now unmapped");
    assert!(rig.checker.take_hazards().is_empty());
}

/// A simulated device whose `unmap` fails while `refuse` is set.
struct FlakyUnmap {
    sim: SimDevice,
    refuse: std::sync::atomic::AtomicBool,
}

impl Device for FlakyUnmap {
    fn name(&self) -> String {
        "flaky unmap".into()
    }
    fn mem_info(&self) -> Result<gpumem_device::MemInfo, gpumem_device::DeviceError> {
        self.sim.mem_info()
    }
    fn malloc(&self, size: u64) -> Result<u64, gpumem_device::DeviceError> {
        self.sim.malloc(size)
    }
    fn free(&self, ptr: u64) -> Result<(), gpumem_device::DeviceError> {
        self.sim.free(ptr)
    }
    fn vmm(&self) -> Option<&dyn gpumem_device::VirtualMemory> {
        Some(self)
    }
    fn record_event(
        &self,
        stream: StreamId,
    ) -> Result<gpumem_device::EventId, gpumem_device::DeviceError> {
        self.sim.record_event(stream)
    }
    fn event_completed(
        &self,
        event: gpumem_device::EventId,
    ) -> Result<bool, gpumem_device::DeviceError> {
        self.sim.event_completed(event)
    }
    fn wait_event(&self, event: gpumem_device::EventId) -> Result<(), gpumem_device::DeviceError> {
        self.sim.wait_event(event)
    }
    fn destroy_event(
        &self,
        event: gpumem_device::EventId,
    ) -> Result<(), gpumem_device::DeviceError> {
        self.sim.destroy_event(event)
    }
    fn synchronize(&self) -> Result<(), gpumem_device::DeviceError> {
        self.sim.synchronize()
    }
    fn synchronize_stream(&self, stream: StreamId) -> Result<(), gpumem_device::DeviceError> {
        self.sim.synchronize_stream(stream)
    }
}

impl gpumem_device::VirtualMemory for FlakyUnmap {
    fn granularity(&self) -> u64 {
        self.sim.vmm().unwrap().granularity()
    }
    fn reserve(&self, size: u64) -> Result<u64, gpumem_device::DeviceError> {
        self.sim.vmm().unwrap().reserve(size)
    }
    fn release_reservation(&self, ptr: u64, size: u64) -> Result<(), gpumem_device::DeviceError> {
        self.sim.vmm().unwrap().release_reservation(ptr, size)
    }
    fn create_physical(
        &self,
        size: u64,
    ) -> Result<gpumem_device::PhysicalHandle, gpumem_device::DeviceError> {
        self.sim.vmm().unwrap().create_physical(size)
    }
    fn release_physical(
        &self,
        handle: gpumem_device::PhysicalHandle,
    ) -> Result<(), gpumem_device::DeviceError> {
        self.sim.vmm().unwrap().release_physical(handle)
    }
    fn map(
        &self,
        ptr: u64,
        handle: gpumem_device::PhysicalHandle,
    ) -> Result<(), gpumem_device::DeviceError> {
        self.sim.vmm().unwrap().map(ptr, handle)
    }
    fn unmap(&self, ptr: u64, size: u64) -> Result<(), gpumem_device::DeviceError> {
        if self.refuse.load(std::sync::atomic::Ordering::Relaxed) {
            return Err(gpumem_device::DeviceError::InvalidValue(
                "unmap refused".into(),
            ));
        }
        self.sim.vmm().unwrap().unmap(ptr, size)
    }
}

/// A device that refuses the deferred unmaps for a while: nothing is lost, reserved stays
/// what the device holds, and the unmaps happen once it accepts them again.
#[test]
fn a_refused_deferred_unmap_loses_nothing_and_is_tried_again() {
    use std::sync::atomic::Ordering;
    let flaky = Arc::new(FlakyUnmap {
        sim: SimDevice::new(SimConfig::address_only(CAPACITY)).unwrap(),
        refuse: false.into(),
    });
    let config = PoolConfig {
        policy: PolicyKind::Gpumem,
        ..PoolConfig::default()
    };
    let pool = Pool::new(flaky.clone(), config).unwrap();
    let used = || CAPACITY - flaky.mem_info().unwrap().free;
    let a = pool.allocate(128 * MIB, StreamId::DEFAULT).unwrap();
    let keep = pool.allocate(2 * MIB, StreamId::DEFAULT).unwrap();
    flaky.sim.enqueue_work(StreamId::DEFAULT).unwrap();
    pool.free(a.ptr).unwrap();
    let big = pool.allocate(200 * MIB, StreamId::DEFAULT).unwrap();
    flaky.refuse.store(true, Ordering::Relaxed);
    pool.synchronize().unwrap();
    let probe = pool.allocate(512, StreamId::DEFAULT).unwrap();
    let stats = pool.stats();
    assert!(stats.device_calls.unmap > 0, "the unmaps were tried");
    assert_eq!(
        stats.reserved_bytes.all.current,
        used(),
        "reserved is what the device holds"
    );
    flaky.refuse.store(false, Ordering::Relaxed);
    let again = pool.allocate(512, StreamId::DEFAULT).unwrap();
    for b in [probe, again, big, keep] {
        pool.free(b.ptr).unwrap();
    }
    pool.empty_cache().unwrap();
    assert_eq!(pool.stats().reserved_bytes.all.current, 0);
    assert_eq!(
        used(),
        0,
        "every chunk went back once the device took the unmaps"
    );
}
