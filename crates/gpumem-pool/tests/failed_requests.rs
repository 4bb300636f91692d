//! A request the pool refuses must not leave memory behind: after any failed allocation,
//! reserved memory is at most what it was before the request (the reclaim may lower it), for
//! every policy, with and without VMM, under a hard limit and under the device's own capacity.

use std::sync::Arc;

use gpumem_device::sim::{SimConfig, SimDevice};
use gpumem_device::StreamId;
use gpumem_pool::{Limit, PolicyKind, Pool, PoolConfig, PoolError, PoolOptions};
use proptest::prelude::*;

const KIB: u64 = 1 << 10;
const MIB: u64 = 1 << 20;
const GIB: u64 = 1 << 30;
const S0: StreamId = StreamId::DEFAULT;
const S1: StreamId = StreamId(1);

const POLICIES: [PolicyKind; 4] = [
    PolicyKind::None,
    PolicyKind::Torch,
    PolicyKind::Expandable,
    PolicyKind::Gpumem,
];

/// One way a pool can be set up for a failing request.
#[derive(Clone, Copy, Debug)]
struct Setup {
    policy: PolicyKind,
    vmm: bool,
    /// Device capacity in bytes.
    capacity: u64,
    /// The pool's hard limit in bytes, if any.
    hard_limit: Option<u64>,
}

impl Setup {
    fn pool(self) -> Pool {
        let config = SimConfig {
            granularity: if self.vmm {
                SimConfig::address_only(self.capacity).granularity
            } else {
                None
            },
            ..SimConfig::address_only(self.capacity)
        };
        let device = Arc::new(SimDevice::new(config).unwrap());
        let config = PoolConfig {
            policy: self.policy,
            options: PoolOptions {
                hard_limit: self.hard_limit.map(Limit::Bytes),
                ..PoolOptions::default()
            },
            ..PoolConfig::default()
        };
        Pool::new(device, config).unwrap()
    }
}

/// Every policy, with and without VMM, limited by a 1 GiB hard limit on a 4 GiB device and
/// by a 1 GiB device alone.
fn setups() -> impl Iterator<Item = Setup> {
    POLICIES.into_iter().flat_map(|policy| {
        // Expandable segments need VMM.
        let vmm = if policy == PolicyKind::Expandable {
            &[true][..]
        } else {
            &[true, false]
        };
        vmm.iter().flat_map(move |&vmm| {
            [(4 * GIB, Some(GIB)), (GIB, None)]
                .into_iter()
                .map(move |(capacity, hard_limit)| Setup {
                    policy,
                    vmm,
                    capacity,
                    hard_limit,
                })
        })
    })
}

fn reserved(pool: &Pool) -> u64 {
    pool.stats().reserved_bytes.all.current
}

/// Requests `size` bytes, which must fail with an out-of-memory error, and checks that
/// reserved memory did not grow.
fn refused(pool: &Pool, size: u64, stream: StreamId, setup: Setup) {
    let before = reserved(pool);
    let error = pool
        .allocate(size, stream)
        .expect_err("the request is larger than what is left");
    assert!(
        matches!(error, PoolError::OutOfMemory(_)),
        "{setup:?}: {error}"
    );
    let after = reserved(pool);
    assert!(
        after <= before,
        "{setup:?}: a failed {size}-byte request left {after} bytes reserved, {before} before"
    );
}

#[test]
fn a_request_over_the_limit_leaves_reserved_as_it_was() {
    for setup in setups() {
        let pool = setup.pool();
        let small = pool.allocate(KIB, S0).unwrap();
        refused(&pool, 2 * GIB, S0, setup);
        // A request just over what is left fails late, after some growth succeeded.
        refused(&pool, GIB, S0, setup);
        pool.free(small.ptr).unwrap();
    }
}

#[test]
fn a_refused_request_beside_cached_and_live_blocks_leaves_reserved_as_it_was() {
    for setup in setups() {
        let pool = setup.pool();
        let live = pool
            .allocate(300 * MIB, S0)
            .unwrap_or_else(|e| panic!("{setup:?}: {e}"));
        let cached = pool
            .allocate(200 * MIB, S1)
            .unwrap_or_else(|e| panic!("{setup:?}: {e}"));
        pool.free(cached.ptr).unwrap();
        refused(&pool, 800 * MIB, S0, setup);
        pool.free(live.ptr).unwrap();
    }
}

/// A size whose rounding passes `u64` (a corrupt trace, a C caller's `SIZE_MAX`) is an
/// out-of-memory error like any request too large, and the pool stays usable after it.
#[test]
fn a_request_whose_rounding_overflows_is_an_oom_and_the_pool_goes_on() {
    for setup in setups() {
        let pool = setup.pool();
        for size in [u64::MAX, u64::MAX - 1, u64::MAX - 511, u64::MAX / 2 + 1] {
            refused(&pool, size, S0, setup);
        }
        let block = pool
            .allocate(MIB, S0)
            .unwrap_or_else(|e| panic!("{setup:?}: {e}"));
        pool.free(block.ptr).unwrap();
    }
}

proptest! {
    #![proptest_config(ProptestConfig::with_cases(32))]

    /// Random live blocks, then a request that cannot fit: reserved never grows.
    #[test]
    fn no_failed_request_grows_reserved(
        policy in 0..POLICIES.len(),
        vmm in any::<bool>(),
        limited in any::<bool>(),
        live in prop::collection::vec(1..64 * MIB, 0..8),
        extra in 1..512 * MIB,
    ) {
        let setup = Setup {
            policy: POLICIES[policy],
            vmm: vmm || POLICIES[policy] == PolicyKind::Expandable,
            capacity: if limited { 4 * GIB } else { GIB },
            hard_limit: limited.then_some(GIB),
        };
        let pool = setup.pool();
        let mut held = 0;
        for (i, &size) in live.iter().enumerate() {
            let stream = if i % 2 == 0 { S0 } else { S1 };
            let block = pool.allocate(size, stream).unwrap();
            held += size;
            if i % 3 == 2 {
                pool.free(block.ptr).unwrap();
                held -= size;
            }
        }
        refused(&pool, GIB - held + extra, S0, setup);
    }
}
