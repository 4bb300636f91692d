//! (a) Per-operation cost of every gpumem policy (through the pool, on the address-only
//! simulated device) side by side with offset-allocator, range-alloc and
//! buddy_system_allocator, all driven by the same normalised operations: one criterion group
//! per input (each real trace in `testdata/traces`, a synthetic training trace, and synthetic
//! mixes at 10³…10⁶ live blocks). Each iteration replays the input's timed body once on an
//! arena brought to steady state by the input's setup (built lazily, only for benchmarks that
//! criterion's filter selects); throughput is in operations. After criterion's output, a table
//! gives ns/op and the ratio to offset-allocator per input.
//!
//! `cargo bench -p gpumem-bench --bench ops` (filter: `-- mix-1e4`, `-- pool/gpumem`, …).

use std::hint::black_box;
use std::time::{Duration, Instant};

use criterion::{BenchmarkId, Criterion, SamplingMode, Throughput};
use gpumem_bench::report::Recorder;
use gpumem_bench::run::{apply, slots};
use gpumem_bench::workload::MIX_LIVE_COUNTS;
use gpumem_bench::{
    default_trace_dir, from_trace, load_traces, standard_mix, synthetic_training_trace, with_arena,
    Allocator, Arena, Scenario, WithArena,
};

const SAMPLES: usize = 10;

struct Bench<'a, 'g, 'c> {
    group: &'g mut criterion::BenchmarkGroup<'c, criterion::measurement::WallTime>,
    w: &'a Scenario,
    allocator: Allocator,
    recorder: &'a Recorder,
}

impl WithArena for Bench<'_, '_, '_> {
    type Output = ();

    fn run<A: Arena + 'static>(self, make: &dyn Fn() -> A) {
        let w = self.w;
        let name = self.allocator.name();
        let group_name = format!("ops/{}", w.name);
        let mut state = None;
        self.group
            .bench_function(BenchmarkId::from_parameter(&name), |b| {
                let (arena, table) = state.get_or_insert_with(|| {
                    let mut arena = make();
                    let mut table = slots(w);
                    apply(&mut arena, &w.setup, &mut table);
                    (arena, table)
                });
                b.iter_custom(|iters| {
                    let t = Instant::now();
                    for _ in 0..iters {
                        black_box(apply(arena, &w.body, table));
                    }
                    let elapsed = t.elapsed();
                    self.recorder
                        .record(&group_name, &name, iters, elapsed, w.body.len() as u64);
                    elapsed
                })
            });
    }
}

fn main() {
    let mut c = Criterion::default()
        .sample_size(SAMPLES)
        .warm_up_time(Duration::from_millis(300))
        .measurement_time(Duration::from_millis(1500))
        .configure_from_args();
    let recorder = Recorder::default();

    let mut workloads: Vec<Scenario> = load_traces(&default_trace_dir())
        .iter()
        .map(from_trace)
        .collect();
    workloads.push(from_trace(&synthetic_training_trace(1_000_000)));
    workloads.extend(MIX_LIVE_COUNTS.iter().map(|&n| standard_mix(n)));

    for w in &workloads {
        let mut group = c.benchmark_group(format!("ops/{}", w.name));
        group
            .sampling_mode(SamplingMode::Flat)
            .throughput(Throughput::Elements(w.body.len() as u64));
        for allocator in Allocator::all() {
            if w.max_live_blocks > allocator.criterion_max_live() {
                continue;
            }
            with_arena(
                allocator,
                w,
                Bench {
                    group: &mut group,
                    w,
                    allocator,
                    recorder: &recorder,
                },
            );
        }
        group.finish();
    }
    c.final_summary();
    println!(
        "\nPer-operation cost (median of criterion's {SAMPLES} samples; an op is one alloc or free):"
    );
    println!("{}", recorder.markdown(SAMPLES, "offset-allocator", "op"));
}
