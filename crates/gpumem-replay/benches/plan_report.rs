//! Latency of the whole `gpumem plan` (what the Python package's `gpumem.plan` calls), for the
//! example of the Python docs: Llama-3-8B training, batch 4, sequence 2048, bf16 autocast,
//! checkpointing, on an A100 80GB — reserved memory estimated (`reserved="estimate"`, the
//! sweep path; goal ≤ 1 ms) and replayed (the default). The Python side of the same calls is
//! `python/benchmarks/test_plan_speed.py` (`bash scripts/bench-python.sh`).
//! A second case asks for a plan far past every GPU (Llama-3.1-8B over 32768 tokens with eager
//! attention: 7 TB of score matrices), the question of someone trying a longer context, which
//! must answer as fast: replays map a trace past 512 GiB on coarser pages.
//! Run: `cargo bench -p gpumem-replay --bench plan_report`.

use criterion::{criterion_group, criterion_main, Criterion};
use gpumem_replay::plan::{plan, PlanRequest};
use std::hint::black_box;

/// The request as the Python package passes it: a JSON object of settings by name.
fn request(reserved: &str) -> String {
    format!(
        r#"{{"model": "llama-3-8b", "mode": "train", "batch": 4, "seq": 2048, "amp": "bf16",
            "grad_ckpt": true, "gpu": "a100-80gb", "reserved": "{reserved}"}}"#
    )
}

/// The request for a plan far past every GPU (no GPU named: every policy replays unbounded).
const PAST_EVERY_GPU: &str = r#"{"model": "llama-3.1-8b", "mode": "train", "batch": 1,
    "seq": 32768, "dtype": "bf16", "attn": "eager"}"#;

fn bench(c: &mut Criterion) {
    for reserved in ["estimate", "replay"] {
        let text = request(reserved);
        c.bench_function(&format!("plan/llama-3-8b ({reserved})"), |b| {
            b.iter(|| {
                let request = PlanRequest::from_json(black_box(&text)).unwrap();
                serde_json::to_string(&plan(&request).unwrap()).unwrap()
            })
        });
    }
    c.bench_function("plan/llama-3.1-8b 32768 tokens eager (7 TB, replay)", |b| {
        b.iter(|| {
            let request = PlanRequest::from_json(black_box(PAST_EVERY_GPU)).unwrap();
            serde_json::to_string(&plan(&request).unwrap()).unwrap()
        })
    });
}

criterion_group! {
    name = benches;
    config = Criterion::default().sample_size(20);
    targets = bench
}
criterion_main!(benches);
