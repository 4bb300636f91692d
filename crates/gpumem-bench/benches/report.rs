//! `gpumem report` on a synthetic 10⁶-event training trace through every policy: the replays
//! that gather the page's data (`gpumem_report::build`: figures, per-event timelines reduced to
//! min/max buckets, segment maps at the peak) and the HTML rendering (`render`), with the page's
//! size, which is what a browser has to load. Beside it, in the same run, the plain replays of
//! the same trace through the same policies (`gpumem_replay::replay_all`, what `gpumem replay`
//! does): the report's cost is a ratio to that.
//!
//! `cargo bench -p gpumem-bench --bench report`.

use std::hint::black_box;
use std::time::Duration;

use criterion::{Criterion, SamplingMode};
use gpumem_bench::synthetic_training_trace;
use gpumem_pool::PolicyKind;
use gpumem_replay::{replay_all, ReplayOptions};
use gpumem_report::{build, render, ReportOptions, DEFAULT_BUCKETS};

fn main() {
    let mut c = Criterion::default()
        .sample_size(10)
        .warm_up_time(Duration::from_millis(100))
        .measurement_time(Duration::from_secs(10))
        .configure_from_args();
    let traces = vec![synthetic_training_trace(1_000_000)];
    let options = ReportOptions {
        policies: PolicyKind::ALL.to_vec(),
        replay: ReplayOptions::default(),
        tune: None,
        buckets: DEFAULT_BUCKETS,
    };
    let mut group = c.benchmark_group("report");
    group.sampling_mode(SamplingMode::Flat);
    group.bench_function("replay_all/synthetic-1M", |b| {
        b.iter(|| {
            let reports = replay_all(&traces[0], &options.policies, &options.replay, &mut |_| {});
            black_box(reports.expect("replay")[0].peak_reserved_bytes)
        })
    });
    group.bench_function("build/synthetic-1M", |b| {
        b.iter(|| black_box(build(&traces, &options).expect("report").highest_rank))
    });
    let report = build(&traces, &options).expect("report");
    let mut bytes = 0;
    group.bench_function("render/synthetic-1M", |b| {
        b.iter(|| {
            bytes = render(&report).len();
            black_box(bytes)
        })
    });
    group.finish();
    println!(
        "report: {} events, {} policies, page {:.2} MiB",
        traces[0].events.len(),
        options.policies.len(),
        bytes as f64 / (1 << 20) as f64
    );
}
