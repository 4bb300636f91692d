//! The conformance suite (`gpumem_testkit::conformance`) on the simulated device: host-backed
//! with and without VMM, and address-only (no copies). Declared kernels are queued work on the
//! simulated streams, so events complete only once the host waits for them, as on a GPU.

use std::sync::Arc;

use gpumem_device::sim::{SimConfig, SimDevice};
use gpumem_testkit::conformance::{self, Offers, Subject};

const MIB: u64 = 1 << 20;

/// A fresh simulated device of `config` whose kernels run on its streams.
fn subject(config: &SimConfig) -> Subject {
    let sim = Arc::new(SimDevice::new(config.clone()).unwrap());
    let work = sim.clone();
    Subject::new(sim).with_work(Box::new(move |stream, ns| {
        work.enqueue_timed_work(stream, ns)
    }))
}

fn passes(config: SimConfig, offers: Offers) {
    let report = conformance::run(offers, &|| subject(&config));
    eprintln!("{report}");
    assert!(report.failures.is_empty(), "{report}");
}

#[test]
fn host_backed_with_vmm() {
    passes(
        SimConfig::host(256 * MIB),
        Offers {
            vmm: true,
            streams: true,
            copies: true,
        },
    );
}

#[test]
fn host_backed_without_vmm() {
    passes(
        SimConfig {
            granularity: None,
            ..SimConfig::host(256 * MIB)
        },
        Offers {
            vmm: false,
            streams: true,
            copies: true,
        },
    );
}

#[test]
fn address_only() {
    passes(
        SimConfig::address_only(256 * MIB),
        Offers {
            vmm: true,
            streams: true,
            copies: false,
        },
    );
}
