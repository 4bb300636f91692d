//! Latency of one estimate, of an estimate with the replay of its allocation sequence through
//! PyTorch's allocator policy, and of one fit (goals: ≤ 1 ms, ≤ 20 ms, ≤ 300 ms).
//! Run: `cargo bench -p gpumem-plan --bench plan`.

use criterion::{criterion_group, criterion_main, Criterion};
use gpumem_plan::{estimate, find_model, fit, FitTarget, Overheads, Settings};
use gpumem_replay::planned::{estimate_replayed, fit_reserved};
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
    c.bench_function("estimate/llama-3-70b train", |b| {
        b.iter(|| estimate(black_box(&llama), black_box(&train), &overheads))
    });
    c.bench_function("estimate/llama-3-70b generate", |b| {
        b.iter(|| estimate(black_box(&llama), black_box(&generate), &overheads))
    });
    // What `gpumem plan` does for reserved memory: the estimate, the allocation sequence and its
    // replay through the torch policy.
    c.bench_function("estimate+replay/llama-3-70b train (torch)", |b| {
        b.iter(|| estimate_replayed(black_box(&llama), black_box(&train), &overheads).unwrap())
    });
    // A fit that succeeds (a failing fit stops after one estimate and would flatter the timing).
    let small = find_model("llama-3.2-3b").unwrap();
    let fitting = Settings {
        grad_ckpt: true,
        ..settings("train")
    }
    .to_workload()
    .unwrap();
    let gpu = 80 << 30;
    assert!(fit(
        &small,
        &fitting,
        &overheads,
        FitTarget::Batch,
        gpu,
        0.1,
        Some(512)
    )
    .is_ok());
    assert!(fit(&small, &fitting, &overheads, FitTarget::Seq, gpu, 0.1, None).is_ok());
    // What `gpumem plan --fit` does: the fit checked (and shrunk) on replayed reserved memory.
    c.bench_function("fit on reserved/llama-3.2-3b batch on 80 GiB", |b| {
        b.iter(|| {
            fit_reserved(
                black_box(&small),
                black_box(&fitting),
                &overheads,
                FitTarget::Batch,
                gpu,
                0.1,
                Some(512),
            )
            .map(|f| f.fit.value)
        })
    });
    c.bench_function("fit/llama-3.2-3b batch on 80 GiB", |b| {
        b.iter(|| {
            fit(
                black_box(&small),
                black_box(&fitting),
                &overheads,
                FitTarget::Batch,
                gpu,
                0.1,
                Some(512),
            )
        })
    });
    c.bench_function("fit/llama-3.2-3b seq on 80 GiB", |b| {
        b.iter(|| {
            fit(
                black_box(&small),
                black_box(&fitting),
                &overheads,
                FitTarget::Seq,
                gpu,
                0.1,
                None,
            )
        })
    });
}

criterion_group!(benches, bench);
criterion_main!(benches);
