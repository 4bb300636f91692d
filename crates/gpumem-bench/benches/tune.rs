//! `gpumem tune`'s search (`gpumem_replay::tune::tune`) with the default budget: on a
//! synthetic 10⁶-event training trace for every objective (goal: ≤ 10 s on two cores), and on
//! every committed trace for the default objective.
//!
//! `cargo bench -p gpumem-bench --bench tune` (filter: `-- reserved/synthetic`, …). Each
//! iteration is one whole tuning: the search's screening replays (in parallel on every core)
//! and the final replays of the best settings, PyTorch's defaults and the gpumem policy.

use std::hint::black_box;
use std::time::Duration;

use criterion::{BenchmarkId, Criterion, SamplingMode};
use gpumem_bench::{default_trace_dir, load_traces, synthetic_training_trace};
use gpumem_replay::tune::{tune, Objective, TuneOptions};

fn main() {
    let mut c = Criterion::default()
        .sample_size(10)
        .warm_up_time(Duration::from_millis(100))
        .measurement_time(Duration::from_secs(5))
        .configure_from_args();
    let synthetic = synthetic_training_trace(1_000_000);
    let committed = load_traces(&default_trace_dir());
    let mut runs = Vec::new();
    for objective in [Objective::Reserved, Objective::Fit, Objective::Calls] {
        runs.push((objective, &synthetic));
        if objective == Objective::Reserved {
            runs.extend(committed.iter().map(|t| (objective, t)));
        }
    }
    let mut summary = Vec::new();
    let mut group = c.benchmark_group("tune");
    group.sampling_mode(SamplingMode::Flat);
    for (objective, trace) in runs {
        let options = TuneOptions {
            objective,
            ..TuneOptions::default()
        };
        let id = BenchmarkId::new(objective.as_str(), &trace.meta.name);
        let mut last = None;
        group.bench_function(id, |b| {
            b.iter(|| {
                let report = tune(trace, &options, &|_| {}).expect("tune");
                let line = format!(
                    "{objective}/{}: {} events, {} settings screened ({}), best {}",
                    trace.meta.name,
                    trace.events.len(),
                    report.replays,
                    if report.complete {
                        "complete"
                    } else {
                        "budget"
                    },
                    report.ranked[0].conf
                );
                last = Some(line);
                black_box(report.ranked[0].report.peak_reserved_bytes)
            })
        });
        summary.extend(last);
    }
    group.finish();
    c.final_summary();
    println!(
        "\nWhat each tuning searched ({} rayon threads):",
        rayon::current_num_threads()
    );
    for line in summary {
        println!("  {line}");
    }
}
