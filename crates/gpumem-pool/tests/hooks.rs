//! What other components attach to: device-call counts that read the same on every backend,
//! pool event observers, the per-device registry and statistics as labelled records.

use std::sync::{Arc, Mutex};

use gpumem_device::sim::{SimConfig, SimDevice};
use gpumem_device::StreamId;
use gpumem_pool::{
    global_registry, Action, DeviceRegistry, PolicyKind, Pool, PoolConfig, PoolError, PoolEvent,
    PoolObserver, PoolOptions,
};
use gpumem_testkit::Rng;

const MIB: u64 = 1 << 20;

fn pool(device: &Arc<SimDevice>, policy: PolicyKind, history: usize) -> Pool {
    let config = PoolConfig {
        policy,
        options: PoolOptions {
            history_capacity: history,
            ..PoolOptions::default()
        },
        ..PoolConfig::default()
    };
    Pool::new(device.clone(), config).unwrap()
}

/// Random allocations and frees on a small device, so that policies grow, reclaim, stitch and
/// run out of memory.
fn churn(pool: &Pool, seed: u64) {
    let mut rng = Rng::new(seed);
    let mut live = Vec::new();
    for _ in 0..2_000 {
        if live.is_empty() || rng.below(5) < 3 {
            let size = rng.log_uniform(256, 24 * MIB);
            let stream = StreamId(rng.below(2));
            match pool.allocate(size, stream) {
                Ok(a) => live.push(a.ptr),
                Err(PoolError::OutOfMemory(_)) => {}
                Err(e) => panic!("{e}"),
            }
        } else {
            let ptr = live.swap_remove(rng.below(live.len() as u64) as usize);
            pool.free(ptr).unwrap();
        }
    }
    for ptr in live {
        pool.free(ptr).unwrap();
    }
    pool.empty_cache().unwrap();
}

#[test]
fn device_calls_in_the_stats_are_exactly_the_calls_the_device_saw() {
    for vmm in [true, false] {
        for policy in PolicyKind::ALL {
            if policy == PolicyKind::Expandable && !vmm {
                continue;
            }
            let config = SimConfig {
                granularity: vmm.then_some(2 * MIB),
                ..SimConfig::address_only(96 * MIB)
            };
            let device = Arc::new(SimDevice::new(config).unwrap());
            let pool = pool(&device, policy, 0);
            churn(&pool, 42);
            let ours = pool.stats().device_calls;
            let sim = device.counters();
            let seen = [
                sim.malloc,
                sim.free,
                sim.reserve,
                sim.release_reservation,
                sim.create_physical,
                sim.release_physical,
                sim.map,
                sim.unmap,
            ];
            let counted = [
                ours.malloc,
                ours.free,
                ours.reserve,
                ours.release_reservation,
                ours.create_physical,
                ours.release_physical,
                ours.map,
                ours.unmap,
            ];
            assert_eq!(counted, seen, "{policy}, vmm {vmm}");
            assert!(ours.allocating() > 0, "{policy}: the workload made calls");
            assert_eq!(ours.allocating(), sim.allocating_calls());
        }
    }
}

struct Recorder(Arc<Mutex<Vec<PoolEvent>>>);

impl PoolObserver for Recorder {
    fn on_event(&mut self, event: &PoolEvent) {
        self.0.lock().unwrap().push(*event);
    }
}

#[test]
fn an_observer_sees_what_the_history_records() {
    for policy in PolicyKind::ALL {
        let device = Arc::new(SimDevice::new(SimConfig::address_only(64 * MIB)).unwrap());
        let pool = pool(&device, policy, 1 << 20);
        let seen = Arc::new(Mutex::new(Vec::new()));
        pool.add_observer(Box::new(Recorder(seen.clone())));
        churn(&pool, 7);
        let _ = pool.allocate(1 << 40, StreamId::DEFAULT);
        let events = seen.lock().unwrap();
        let history = pool.history();
        assert_eq!(events.len(), history.len(), "{policy}");
        for (event, entry) in events.iter().zip(&history) {
            assert_eq!(
                (event.action, event.addr, event.size, event.stream.0),
                (entry.action, entry.addr, entry.size, entry.stream),
                "{policy}"
            );
        }
        let count = |action| events.iter().filter(|e| e.action == action).count();
        assert!(count(Action::Alloc) > 100, "{policy}");
        assert_eq!(
            count(Action::Alloc),
            count(Action::FreeCompleted),
            "{policy}"
        );
        assert!(count(Action::Oom) >= 1, "{policy}");
    }
}

#[test]
fn the_registry_makes_one_pool_per_device_even_under_races() {
    let registry = Arc::new(DeviceRegistry::new());
    let made = Arc::new(Mutex::new(0));
    let threads: Vec<_> = (0..8)
        .map(|i| {
            let (registry, made) = (registry.clone(), made.clone());
            std::thread::spawn(move || {
                let device = i % 2;
                let pool = registry
                    .get_or_try_init(device, || {
                        *made.lock().unwrap() += 1;
                        let sim = SimDevice::new(SimConfig::address_only(64 * MIB)).unwrap();
                        Pool::new(Arc::new(sim), PoolConfig::default())
                    })
                    .unwrap();
                (device, Arc::as_ptr(&pool) as usize)
            })
        })
        .collect();
    let results: Vec<(usize, usize)> = threads.into_iter().map(|t| t.join().unwrap()).collect();
    assert_eq!(*made.lock().unwrap(), 2, "one pool per device");
    for &(device, pool) in &results {
        assert_eq!(
            Arc::as_ptr(&registry.get(device).unwrap()) as usize,
            pool,
            "every caller got the registered pool of device {device}"
        );
    }
    assert_eq!(registry.devices(), vec![0, 1]);
    // A failed initialisation registers nothing and says why.
    let err = registry
        .get_or_try_init(5, || {
            let sim = SimDevice::new(SimConfig::address_only(64 * MIB)).unwrap();
            let config = PoolConfig {
                options: PoolOptions {
                    hard_limit: Some(gpumem_pool::Limit::Bytes(1 << 20)),
                    soft_limit: Some(gpumem_pool::Limit::Bytes(2 << 20)),
                    ..PoolOptions::default()
                },
                ..PoolConfig::default()
            };
            Pool::new(Arc::new(sim), config)
        })
        .err()
        .expect("soft limit above the hard one");
    assert!(err.to_string().contains("above the hard limit"), "{err}");
    assert!(registry.get(5).is_none());
    assert!(registry.remove(1).is_some());
    assert_eq!(registry.devices(), vec![0]);
    // The process-wide registry is one instance.
    assert!(std::ptr::eq(global_registry(), global_registry()));
}

#[test]
fn statistics_as_labelled_records_match_the_pytorch_keys() {
    let device = Arc::new(SimDevice::new(SimConfig::address_only(64 * MIB)).unwrap());
    let pool = pool(&device, PolicyKind::Torch, 0);
    let a = pool.allocate(3 * MIB, StreamId::DEFAULT).unwrap();
    let _small = pool.allocate(4096, StreamId::DEFAULT).unwrap();
    pool.free(a.ptr).unwrap();
    let stats = pool.stats();
    let records = stats.records();
    let map = stats.to_map();
    assert_eq!(records.len(), map.len());
    for record in &records {
        assert_eq!(map[&record.key()], record.value, "{}", record.key());
    }
    let find = |name, class, field| {
        records
            .iter()
            .find(|r| r.name == name && r.size_class == class && r.field == field)
            .unwrap()
            .value
    };
    assert_eq!(
        find("allocated_bytes", Some("large_pool"), Some("peak")),
        3 * MIB
    );
    assert_eq!(
        find("allocated_bytes", Some("small_pool"), Some("current")),
        4096
    );
    assert_eq!(find("device_calls", None, Some("malloc")), 2);
    assert_eq!(find("num_ooms", None, None), 0);
}
