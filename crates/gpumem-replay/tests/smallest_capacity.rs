//! The smallest-capacity search: the capacity it finds runs the trace, one step less does not,
//! and it lies between what the live blocks need and what the unlimited run reserved.

use gpumem_pool::PolicyKind;
use gpumem_replay::{replay, ReplayOptions, CAPACITY_RESOLUTION};
use gpumem_trace::{read_path, ReadOptions, Trace};

fn trace(name: &str) -> Trace {
    let path = format!(
        "{}/../../testdata/traces/{name}.jsonl.gz",
        env!("CARGO_MANIFEST_DIR")
    );
    read_path(std::path::Path::new(&path), ReadOptions::default()).unwrap()
}

fn fits(trace: &Trace, policy: PolicyKind, capacity: u64) -> bool {
    let options = ReplayOptions {
        capacity: Some(capacity),
        ..ReplayOptions::default()
    };
    replay(trace, policy, &options, &mut |_| {})
        .unwrap()
        .report
        .oom
        .is_none()
}

#[test]
fn the_smallest_capacity_fits_and_one_step_less_does_not() {
    for name in ["small-gpt2-2l-infer-b1-s32", "gpt2-12l-infer-b8-s256"] {
        let trace = trace(name);
        for policy in PolicyKind::ALL {
            let options = ReplayOptions {
                smallest_capacity: true,
                ..ReplayOptions::default()
            };
            let report = replay(&trace, policy, &options, &mut |_| {})
                .unwrap()
                .report;
            let smallest = report
                .smallest_capacity_bytes
                .unwrap_or_else(|| panic!("{name} {policy}: no capacity found"));
            assert_eq!(smallest % CAPACITY_RESOLUTION, 0, "{name} {policy}");
            assert!(smallest >= report.peak_allocated_bytes, "{name} {policy}");
            assert!(
                smallest
                    <= report
                        .peak_reserved_bytes
                        .next_multiple_of(CAPACITY_RESOLUTION),
                "{name} {policy}: {smallest} above the unlimited peak"
            );
            assert!(fits(&trace, policy, smallest), "{name} {policy}");
            assert!(
                !fits(&trace, policy, smallest - CAPACITY_RESOLUTION),
                "{name} {policy}: {smallest} is not the smallest"
            );
        }
    }
}

#[test]
fn the_search_runs_only_when_asked() {
    let report = replay(
        &trace("small-gpt2-2l-infer-b1-s32"),
        PolicyKind::Gpumem,
        &ReplayOptions::default(),
        &mut |_| {},
    )
    .unwrap()
    .report;
    assert_eq!(report.smallest_capacity_bytes, None);
}
