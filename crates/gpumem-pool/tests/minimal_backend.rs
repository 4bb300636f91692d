//! A pool over a backend that implements only the required `Device` core (name, mem_info,
//! malloc, free): the default streams, events and capabilities must be enough for every
//! policy that does not need virtual memory, and the backend's own out-of-memory code must
//! drive the pool's free-and-retry.

use std::collections::BTreeMap;
use std::sync::{Arc, Mutex};

use gpumem_device::{BackendCode, Device, DeviceError, DevicePtr, MemInfo, StreamId};
use gpumem_pool::{PolicyKind, Pool, PoolConfig, PoolError};

const MIB: u64 = 1 << 20;
const CAPACITY: u64 = 64 * MIB;

/// Memory only: a bump allocator over `CAPACITY` bytes that counts its calls.
#[derive(Default)]
struct Minimal {
    state: Mutex<MinimalState>,
}

#[derive(Default)]
struct MinimalState {
    live: BTreeMap<DevicePtr, u64>,
    next: DevicePtr,
    mallocs: u64,
}

impl Minimal {
    fn used(&self) -> u64 {
        self.state.lock().unwrap().live.values().sum()
    }

    fn mallocs(&self) -> u64 {
        self.state.lock().unwrap().mallocs
    }
}

impl Device for Minimal {
    fn name(&self) -> String {
        "minimal".into()
    }

    fn mem_info(&self) -> Result<MemInfo, DeviceError> {
        Ok(MemInfo {
            free: CAPACITY - self.used(),
            total: CAPACITY,
        })
    }

    fn malloc(&self, size: u64) -> Result<DevicePtr, DeviceError> {
        let free = CAPACITY - self.used();
        let mut s = self.state.lock().unwrap();
        s.mallocs += 1;
        if size > free {
            let code = BackendCode::new("minimal", 2, "MINIMAL_OUT_OF_MEMORY", "no room left");
            return Err(DeviceError::from_backend(code, true));
        }
        let ptr = (s.next + 0x1000).next_multiple_of(2 * MIB);
        s.next = ptr + size;
        s.live.insert(ptr, size);
        Ok(ptr)
    }

    fn free(&self, ptr: DevicePtr) -> Result<(), DeviceError> {
        let removed = self.state.lock().unwrap().live.remove(&ptr);
        removed.map(drop).ok_or(DeviceError::InvalidAddress {
            ptr,
            what: "not allocated".into(),
        })
    }
}

fn pool(policy: PolicyKind) -> (Arc<Minimal>, Pool) {
    let device = Arc::new(Minimal::default());
    let config = PoolConfig {
        policy,
        ..PoolConfig::default()
    };
    let pool = Pool::new(device.clone(), config).unwrap();
    (device, pool)
}

#[test]
fn policies_without_vmm_run_on_the_default_streams_and_events() {
    let side = StreamId(3);
    for policy in [PolicyKind::None, PolicyKind::Torch, PolicyKind::Gpumem] {
        let (dev, pool) = pool(policy);
        let a = pool.allocate(3 * MIB, StreamId::DEFAULT).unwrap();
        pool.record_stream(a.ptr, side).unwrap();
        pool.free(a.ptr).unwrap();
        // The event recorded for the side stream completed at once, so the next allocation
        // may reuse the block: a caching policy asks the device for nothing new.
        let mallocs = dev.mallocs();
        let b = pool.allocate(3 * MIB, StreamId::DEFAULT).unwrap();
        if policy != PolicyKind::None {
            assert_eq!(b.ptr, a.ptr, "{policy}: the freed block is reused");
            assert_eq!(dev.mallocs(), mallocs, "{policy}");
        }
        pool.free(b.ptr).unwrap();
        pool.synchronize().unwrap();
        pool.empty_cache().unwrap();
        assert_eq!(
            dev.used(),
            0,
            "{policy}: everything went back to the device"
        );
    }
}

#[test]
fn the_backend_out_of_memory_code_makes_the_pool_free_its_cache_and_retry() {
    for policy in [PolicyKind::Torch, PolicyKind::Gpumem] {
        let (dev, pool) = pool(policy);
        let cached = pool.allocate(40 * MIB, StreamId::DEFAULT).unwrap();
        pool.free(cached.ptr).unwrap();
        assert!(dev.used() >= 40 * MIB, "{policy}: the block stays cached");
        // 50 MiB do not fit next to the cached 40 MiB: the device refuses with its own
        // code, the pool reads it as out of memory, releases the cache and retries.
        let big = pool.allocate(50 * MIB, StreamId(5)).unwrap();
        assert!(dev.used() >= 50 * MIB && dev.used() < 90 * MIB, "{policy}");
        let err = pool.allocate(CAPACITY, StreamId::DEFAULT).unwrap_err();
        assert!(matches!(err, PoolError::OutOfMemory(_)), "{policy}: {err}");
        pool.free(big.ptr).unwrap();
    }
}

#[test]
fn a_policy_that_needs_virtual_memory_says_the_backend_lacks_it() {
    for config in [
        PoolConfig::default(),
        PoolConfig {
            policy: PolicyKind::Expandable,
            ..PoolConfig::default()
        },
    ] {
        let Err(err) = Pool::new(Arc::new(Minimal::default()), config) else {
            panic!("expandable segments were made without VMM");
        };
        let text = err.to_string();
        assert!(matches!(err, PoolError::Config(_)), "{text}");
        assert!(
            text.contains("minimal") && text.contains("torch, gpumem or none"),
            "{text}"
        );
    }
    // Asked for directly, the policy still says what the backend lacks.
    let policy = PolicyKind::Expandable
        .build(&PoolConfig::default())
        .unwrap();
    let pool = Pool::with_policy(Arc::new(Minimal::default()), policy, Default::default());
    let err = pool.unwrap().allocate(MIB, StreamId::DEFAULT).unwrap_err();
    assert!(
        matches!(&err, PoolError::Device(DeviceError::Unsupported { backend, .. }) if backend == "minimal"),
        "{err}"
    );
}
