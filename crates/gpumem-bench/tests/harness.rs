//! The harness on tiny inputs, so that CI checks it still works (the benchmarks themselves are
//! not part of the test suite): every allocator replays the same operations with no failure and
//! no overlapping live ranges, and the report renders.

use std::time::Duration;

use gpumem_bench::report::{measure_ops, measure_replay, ops_markdown, OpsOptions};
use gpumem_bench::run::{prepare, profile};
use gpumem_bench::workload::synthetic_mix;
use gpumem_bench::{
    from_trace, synthetic_training_trace, with_arena, Allocator, Arena, Op, Scenario, WithArena,
};
use gpumem_pool::PolicyKind;
use gpumem_trace::{Event, Trace, TraceMeta};

struct Check<'a>(&'a Scenario);

impl WithArena for Check<'_> {
    type Output = ();
    fn run<A: Arena + 'static>(self, make: &dyn Fn() -> A) {
        let w = self.0;
        let mut arena = make();
        let p = profile(&mut arena, w, true, None).expect("no budget");
        assert_eq!(p.failures, 0, "{}: failures", w.name);
        assert_eq!(p.overlaps, 0, "{}: overlapping live ranges", w.name);
        assert!(p.footprint >= p.peak_live_bytes, "{}: {p:?}", w.name);
        assert!((0.0..=1.0).contains(&p.fragmentation), "{p:?}");
        // The arena is reusable: a second profiling pass on it still checks out.
        let again = profile(&mut arena, w, true, None).expect("no budget");
        assert_eq!((again.failures, again.overlaps), (0, 0));
        let mut prepared = prepare(make, w, Duration::from_secs(60)).expect("setup in budget");
        for _ in 0..2 {
            let ns = prepared.pass(None).expect("no deadline");
            assert!(ns > 0.0, "{ns}");
        }
    }
}

fn check_every_allocator(w: &Scenario) {
    for allocator in Allocator::all() {
        with_arena(allocator, w, Check(w));
    }
}

#[test]
fn every_allocator_replays_a_small_mix_without_overlaps() {
    let w = synthetic_mix(200, 300, 500, 7);
    assert_eq!(w.live_after_setup, 200);
    assert_eq!(w.max_live_blocks, 200);
    assert_eq!(w.body.len(), 1000);
    check_every_allocator(&w);
}

#[test]
fn every_allocator_replays_a_small_training_trace_without_overlaps() {
    let trace = synthetic_training_trace(3_000);
    trace.validate().expect("valid synthetic trace");
    let w = from_trace(&trace);
    assert_eq!(w.live_after_setup, 0, "leftovers are freed at the end");
    check_every_allocator(&w);
}

#[test]
fn traces_normalise_to_dense_slots() {
    let alloc = |addr, size| Event::Alloc {
        addr,
        size,
        stream: 0,
    };
    let free = |addr| Event::Free { addr, stream: 0 };
    let trace = Trace::new(
        TraceMeta::default(),
        vec![
            Event::Step { index: 0 },
            alloc(0x1000, 100),
            alloc(0x2000, 0), // zero-byte: dropped with its free
            alloc(0x3000, 4096),
            free(0x1000),
            free(0x2000),
            alloc(0x1000, 50), // reuses slot 0
            alloc(0x4000, 10), // left live: freed at the end, newest first
        ],
    );
    let w = from_trace(&trace);
    assert_eq!(
        w.body,
        vec![
            Op::Alloc { slot: 0, size: 100 },
            Op::Alloc {
                slot: 1,
                size: 4096
            },
            Op::Free { slot: 0 },
            Op::Alloc { slot: 0, size: 50 },
            Op::Alloc { slot: 2, size: 10 },
            Op::Free { slot: 2 },
            Op::Free { slot: 0 },
            Op::Free { slot: 1 },
        ]
    );
    assert_eq!(w.slots, 3);
    assert_eq!(w.max_live_blocks, 3);
    assert_eq!(w.peak_live_bytes, 4196);
}

#[test]
fn the_report_renders_every_allocator_and_replays() {
    let w = synthetic_mix(100, 100, 200, 3);
    let opts = OpsOptions {
        max_passes: 1,
        min_total: Duration::ZERO,
        budget: Duration::from_secs(60),
        check_overlaps: true,
    };
    let table = measure_ops(&w, &Allocator::all(), &opts);
    let md = ops_markdown(&table);
    for a in Allocator::all() {
        assert!(md.contains(&format!("| {} |", a.name())), "{md}");
    }
    assert!((table.ratio(Allocator::OffsetAllocator).unwrap() - 1.0).abs() < 1e-9);
    let reports = measure_replay(
        &synthetic_training_trace(2_000),
        &PolicyKind::ALL,
        1,
        &Default::default(),
    );
    assert_eq!(reports.len(), PolicyKind::ALL.len());
    assert!(reports.iter().all(|r| r.oom.is_none() && r.events > 0));
}
