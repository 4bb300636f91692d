//! (b) Replay throughput: `gpumem_replay::replay` of each real trace in `testdata/traces`, of a
//! 10⁶-event synthetic training trace, and of two random traces with many steps (400) and
//! many streams (100), where the model of asynchronous work once grew super-linearly, through
//! every policy, in events per second (goal: ≥ 5 M events/s). Each iteration is one whole
//! replay (fresh pool and address-only device).
//!
//! `cargo bench -p gpumem-bench --bench replay` (filter: `-- gpumem`, …).

use std::hint::black_box;
use std::time::{Duration, Instant};

use criterion::{BenchmarkId, Criterion, SamplingMode, Throughput};
use gpumem_bench::report::Recorder;
use gpumem_bench::{
    default_trace_dir, load_traces, random_requests_trace, synthetic_training_trace,
};
use gpumem_pool::PolicyKind;
use gpumem_replay::{replay, ReplayOptions};

const SAMPLES: usize = 10;

fn main() {
    let mut c = Criterion::default()
        .sample_size(SAMPLES)
        .warm_up_time(Duration::from_millis(300))
        .measurement_time(Duration::from_secs(2))
        .configure_from_args();
    let recorder = Recorder::default();
    let mut traces = load_traces(&default_trace_dir());
    traces.push(synthetic_training_trace(1_000_000));
    traces.push(random_requests_trace(400, 100, 1, 0));
    traces.push(random_requests_trace(5, 5000, 100, 0));
    let options = ReplayOptions::default();
    for trace in &traces {
        let group_name = format!("replay/{}", trace.meta.name);
        let mut group = c.benchmark_group(&group_name);
        group
            .sampling_mode(SamplingMode::Flat)
            .throughput(Throughput::Elements(trace.events.len() as u64));
        for policy in PolicyKind::ALL {
            let id = policy.to_string();
            group.bench_function(BenchmarkId::from_parameter(&id), |b| {
                b.iter_custom(|iters| {
                    let t = Instant::now();
                    for _ in 0..iters {
                        let r = replay(trace, policy, &options, &mut |_| {}).expect("replay");
                        black_box(r.report.peak_reserved_bytes);
                    }
                    let elapsed = t.elapsed();
                    recorder.record(&group_name, &id, iters, elapsed, trace.events.len() as u64);
                    elapsed
                })
            });
        }
        group.finish();
    }
    c.final_summary();
    println!("\nReplay throughput (median of criterion's {SAMPLES} samples; whole `replay` calls; pool and device set-up and teardown cost < 0.1 ms):");
    println!("{}", recorder.markdown(SAMPLES, "torch", "event"));
}
