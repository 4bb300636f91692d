//! Latency of one estimate and of one fit (goal: ≤ 1 ms and ≤ 20 ms).
//! Run: `cargo bench -p gpumem-plan --bench plan`.

use criterion::{criterion_group, criterion_main, Criterion};
use gpumem_plan::{estimate, find_model, fit, FitTarget, Overheads, Settings};
use std::hint::black_box;

fn settings(mode: &str) -> Settings {
    Settings {
        mode: Some(mode.into()),
        batch: Some(4),
        seq: Some(2048),
        new_tokens: Some(256),
        amp: Some("bf16".into()),
        ..Settings::default()
    }
}

fn bench(c: &mut Criterion) {
    let overheads = Overheads::default();
    let llama = find_model("llama-3-70b").unwrap();
    let train = settings("train").to_workload().unwrap();
    let generate = settings("generate").to_workload().unwrap();
    c.bench_function("estimate/llama-3-70b train", |b| b.iter(|| estimate(black_box(&llama), black_box(&train), &overheads)));
    c.bench_function("estimate/llama-3-70b generate", |b| b.iter(|| estimate(black_box(&llama), black_box(&generate), &overheads)));
    let small = find_model("llama-3-8b").unwrap();
    c.bench_function("fit/llama-3-8b batch on H100", |b| {
        b.iter(|| fit(black_box(&small), black_box(&train), &overheads, FitTarget::Batch, 80 << 30, 0.1, Some(512)))
    });
    c.bench_function("fit/llama-3-8b seq on H100", |b| {
        b.iter(|| fit(black_box(&small), black_box(&train), &overheads, FitTarget::Seq, 80 << 30, 0.1, None))
    });
}

criterion_group!(benches, bench);
criterion_main!(benches);
