//! A page stays small whatever the trace holds: the segment maps of 20,000 live allocations
//! are merged into buckets, with every map's bytes still exact.

use gpumem_pool::PolicyKind;
use gpumem_replay::ReplayOptions;
use gpumem_report::{build, render, RangeState, ReportOptions, DEFAULT_BUCKETS, MAP_CELLS};
use gpumem_trace::{Event, Trace, TraceMeta};

/// 20,000 allocations of a little over 3 MiB on 7 streams, all live at the end.
fn many_live() -> Trace {
    let events = (0..20_000u64)
        .map(|i| Event::Alloc {
            addr: (1 << 20) + (i << 26),
            size: (3 << 20) + i * 512,
            stream: i % 7,
        })
        .collect();
    Trace::new(
        TraceMeta {
            name: "many-live".into(),
            ..TraceMeta::default()
        },
        events,
    )
}

fn options(policies: Vec<PolicyKind>) -> ReportOptions {
    ReportOptions {
        policies,
        replay: ReplayOptions::default(),
        tune: None,
        buckets: DEFAULT_BUCKETS,
    }
}

#[test]
fn twenty_thousand_live_allocations_make_a_small_page_with_exact_maps() {
    let trace = many_live();
    // One policy: its map held all 20,000 segments before (over 2 MB); now it is bounded.
    let torch = render(
        &build(
            std::slice::from_ref(&trace),
            &options(vec![PolicyKind::Torch]),
        )
        .unwrap(),
    );
    assert!(torch.len() < 1_000_000, "page of {} bytes", torch.len());
    let all = options(vec![
        PolicyKind::None,
        PolicyKind::Torch,
        PolicyKind::Expandable,
        PolicyKind::Gpumem,
    ]);
    let report = build(&[trace], &all).unwrap();
    for p in &report.ranks[0].policies {
        let map = &p.peak_map;
        let elements: usize = map.segments.iter().map(|s| s.ranges.len()).sum();
        assert!(elements as u64 <= 4 * MAP_CELLS + 4, "{elements} ranges");
        let mapped: u64 = map.segments.iter().map(|s| s.size).sum();
        assert_eq!(mapped, p.report.peak_reserved_bytes, "{}", p.report.policy);
        let counted: usize = map.segments.iter().map(|s| s.count).sum();
        assert_eq!(counted, map.segment_count);
        assert_eq!(map.live_bytes, p.report.peak_allocated_bytes);
        for s in &map.segments {
            let tiled: u64 = s.ranges.iter().map(|r| r.1).sum();
            assert_eq!(tiled, s.size, "ranges tile their segment");
            assert!(s.ranges.windows(2).all(|w| w[0].0 + w[0].1 == w[1].0));
        }
        let live = map.segments.iter().flat_map(|s| &s.ranges);
        assert!(live.clone().any(|r| r.2 == RangeState::Live));
    }
}
