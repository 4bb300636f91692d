//! The conformance suite (`gpumem_testkit::conformance`) on the wgpu backend: one queue, copies,
//! no VMM. Each scenario opens a fresh device with a memory limit; without an adapter the test
//! fails, or skips when the user opted out, as the other tests do (`gpumem_testkit::deps`).

mod common;

use gpumem_testkit::conformance::{self, Offers};

/// Each device's memory: the limit `malloc` enforces, so that growth meets it.
const LIMIT: u64 = 256 << 20;

#[test]
fn the_conformance_suite_passes() {
    if common::open_with_limit(LIMIT).is_none() {
        return;
    }
    let offers = Offers {
        vmm: false,
        streams: false,
        copies: true,
    };
    let report = conformance::run(offers, &|| {
        common::open_with_limit(LIMIT)
            .expect("an adapter opened a moment ago")
            .into()
    });
    eprintln!("{report}");
    assert!(report.failures.is_empty(), "{report}");
}
