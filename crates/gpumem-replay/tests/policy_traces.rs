//! Utilisation and device calls of the `gpumem` policy on real and synthetic training traces,
//! next to the `torch` policy.
//!
//! utilisation = peak allocated bytes (after the policy's rounding) / peak reserved bytes;
//! device calls per step = allocating device calls (malloc, create, map) between step markers.
//! Run with `cargo test --release -p gpumem-replay --test policy_traces -- --nocapture` to see
//! the table.

use gpumem_testkit::Rng;

use std::path::{Path, PathBuf};

use gpumem_pool::PolicyKind;
use gpumem_replay::{PolicyReport, ReplayOptions};
use gpumem_trace::{Event, ReadOptions, Trace, TraceMeta};

/// The utilisation the `gpumem` policy must reach on every real trace.
const TARGET_UTILISATION: f64 = 0.97;
/// The utilisation it must reach on the adversarial synthetic traces, where a late block
/// larger than any hole can leave a few percent of mapped pages idle (see
/// docs/gpumem-policy.md).
const SYNTHETIC_UTILISATION: f64 = 0.95;

/// Replays `events` through `policy` with the replay engine (`gpumem replay`), which also
/// repeats the steps after the first on the warm pool to measure steady-state device calls.
fn replay(name: &str, events: &[Event], policy: PolicyKind) -> PolicyReport {
    let trace = Trace::new(
        TraceMeta {
            name: name.to_string(),
            ..TraceMeta::default()
        },
        events.to_vec(),
    );
    gpumem_replay::replay(&trace, policy, &ReplayOptions::default(), &mut |_| {})
        .unwrap_or_else(|e| panic!("{name} with {policy}: {e}"))
        .report
}

/// The most allocating device calls of any step in steady state, shown as `-` for a trace
/// without step marks (a PyTorch snapshot).
fn steady_calls(report: &PolicyReport) -> String {
    report
        .steady_state_alloc_calls_per_step
        .map_or("-".to_string(), |calls| calls.to_string())
}

/// Appends to `failures` what keeps `ours` from the targets: utilisation below `target`, not
/// above `torch`'s, or more device calls per step in steady state than `torch`.
fn check(
    name: &str,
    ours: &PolicyReport,
    torch: &PolicyReport,
    target: f64,
    failures: &mut Vec<String>,
) {
    if ours.utilization < target {
        failures.push(format!(
            "{name}: utilisation {:.2} % below {:.0} %",
            100.0 * ours.utilization,
            100.0 * target
        ));
    }
    if ours.utilization <= torch.utilization {
        failures.push(format!("{name}: torch's utilisation is as high"));
    }
    let per_step = |r: &PolicyReport| r.steady_state_alloc_calls_per_step;
    if per_step(ours) > per_step(torch) {
        failures.push(format!(
            "{name}: {} device calls per step in steady state, torch makes {}",
            steady_calls(ours),
            steady_calls(torch)
        ));
    }
}

/// Replays with `gpumem` and `torch` and prints one row of the comparison table.
fn compare(name: &str, events: &[Event]) -> (PolicyReport, PolicyReport) {
    let ours = replay(name, events, PolicyKind::Gpumem);
    let torch = replay(name, events, PolicyKind::Torch);
    let mib = |b: u64| b as f64 / (1 << 20) as f64;
    eprintln!(
        "| {name} | {:.1} % | {:.1} % | {:.0} / {:.0} | {:.0} / {:.0} | {} / {} | {} / {} |",
        100.0 * ours.utilization,
        100.0 * torch.utilization,
        mib(ours.peak_allocated_bytes),
        mib(torch.peak_allocated_bytes),
        mib(ours.peak_reserved_bytes),
        mib(torch.peak_reserved_bytes),
        steady_calls(&ours),
        steady_calls(&torch),
        ours.device_alloc_calls,
        torch.device_alloc_calls,
    );
    (ours, torch)
}

fn print_header() {
    eprintln!(
        "| trace | util gpumem | util torch | peak alloc MiB g/t | peak reserved MiB g/t \
         | steady calls/step g/t | total calls g/t |"
    );
}

fn trace_dir() -> PathBuf {
    Path::new(env!("CARGO_MANIFEST_DIR")).join("../../testdata/traces")
}

/// Every real trace committed: our JSON lines (PyTorch's CPU allocations) and the snapshots
/// PyTorch wrote on a GPU.
fn real_traces() -> Vec<PathBuf> {
    let mut paths: Vec<PathBuf> = std::fs::read_dir(trace_dir())
        .unwrap_or_else(|e| panic!("{}: {e}", trace_dir().display()))
        .filter_map(|e| e.ok().map(|e| e.path()))
        .filter(|p| {
            let name = p.to_string_lossy();
            name.ends_with(".jsonl.gz") || name.ends_with(".pickle.gz")
        })
        .collect();
    paths.sort();
    assert!(
        paths
            .iter()
            .any(|p| p.to_string_lossy().ends_with(".pickle.gz")),
        "the GPU snapshots in {} are missing",
        trace_dir().display()
    );
    paths
}

#[test]
fn real_traces_reach_the_target_utilisation() {
    let paths = real_traces();
    print_header();
    let mut failures = Vec::new();
    for path in paths {
        let trace = gpumem_trace::read_path(&path, ReadOptions::default()).unwrap();
        let name = &trace.meta.name;
        let (ours, torch) = compare(name, &trace.events);
        check(name, &ours, &torch, TARGET_UTILISATION, &mut failures);
    }
    assert!(failures.is_empty(), "{failures:#?}");
}

/// Builds traces: hands out trace addresses and records events.
#[derive(Default)]
struct TraceBuilder {
    events: Vec<Event>,
    next_addr: u64,
    steps: u64,
}

impl TraceBuilder {
    fn alloc_on(&mut self, size: u64, stream: u64) -> u64 {
        self.next_addr += 1;
        let addr = self.next_addr;
        self.events.push(Event::Alloc { addr, size, stream });
        addr
    }

    fn alloc(&mut self, size: u64) -> u64 {
        self.alloc_on(size, 0)
    }

    fn free(&mut self, addr: u64) {
        self.events.push(Event::Free { addr, stream: 0 });
    }

    fn step(&mut self) {
        self.events.push(Event::Step { index: self.steps });
        self.steps += 1;
    }
}

/// The shape of a synthetic transformer training run.
struct Training {
    layers: u64,
    hidden: u64,
    seq: u64,
    /// Batch size of each step.
    batches: Vec<u64>,
    /// Keep only each layer's input for backward (gradient checkpointing).
    checkpointing: bool,
    /// Allocate a long-lived small block after every layer's activations (e.g. RNG states,
    /// per-layer statistics), freed two steps later.
    interleaved_small: bool,
    /// Copy each batch in on a second stream.
    copy_stream: bool,
}

/// A transformer-like training trace: parameters, per-step activations kept for backward,
/// temporaries, gradients re-created every step (`zero_grad(set_to_none=True)`), and Adam
/// states created lazily in the first optimizer step.
fn training_trace(t: &Training, seed: u64) -> Vec<Event> {
    let mut rng = Rng::new(seed);
    let mut b = TraceBuilder::default();
    let h = t.hidden;
    let f32s = |n: u64| 4 * n;
    let layer_params = [
        3 * h * h,
        3 * h,
        h * h,
        h,
        4 * h * h,
        4 * h,
        4 * h * h,
        h,
        h,
        h,
    ];
    // Parameters and the embedding live for the whole run.
    for &n in layer_params.iter().cycle().take((t.layers * 10) as usize) {
        b.alloc(f32s(n));
    }
    b.alloc(f32s(50_000 * h));
    let mut adam: Vec<u64> = Vec::new();
    let mut small_pending: Vec<Vec<u64>> = Vec::new();
    for &batch in &t.batches {
        b.step();
        let tokens = batch * t.seq;
        let input = if t.copy_stream {
            b.alloc_on(8 * tokens, 1)
        } else {
            b.alloc(8 * tokens)
        };
        let mut saved: Vec<Vec<u64>> = Vec::new();
        let mut small_now = Vec::new();
        let mut x = b.alloc(f32s(tokens * h));
        for _ in 0..t.layers {
            let mut keep = vec![x];
            let qkv = b.alloc(f32s(3 * tokens * h));
            let scores = b.alloc(f32s(batch * 12 * t.seq * t.seq));
            let probs = b.alloc(f32s(batch * 12 * t.seq * t.seq));
            b.free(scores);
            let attn = b.alloc(f32s(tokens * h));
            let out = b.alloc(f32s(tokens * h));
            let mlp_in = b.alloc(f32s(tokens * 4 * h));
            let act = b.alloc(f32s(tokens * 4 * h));
            let next = b.alloc(f32s(tokens * h));
            let tmp = b.alloc(f32s(tokens * h) + 512 * rng.below(8));
            b.free(tmp);
            if t.checkpointing {
                for a in [qkv, probs, attn, out, mlp_in, act] {
                    b.free(a);
                }
            } else {
                keep.extend([qkv, probs, attn, out, mlp_in, act]);
            }
            if t.interleaved_small {
                small_now.push(b.alloc(4096 + 512 * rng.below(16)));
            }
            saved.push(keep);
            x = next;
        }
        let logits = b.alloc(f32s(tokens * 50_000 / 8));
        let loss = b.alloc(4);
        b.free(logits);
        b.free(x);
        let mut grads: Vec<u64> = Vec::new();
        let mut grad_x = b.alloc(f32s(tokens * h));
        for keep in saved.into_iter().rev() {
            if t.checkpointing {
                // Recompute the layer's activations from its saved input.
                let re: Vec<u64> = [3, 12 * t.seq / h.max(1), 1, 1, 4, 4]
                    .iter()
                    .map(|&k| b.alloc(f32s(k.max(1) * tokens * h)))
                    .collect();
                for a in re {
                    b.free(a);
                }
            }
            let g_mlp = b.alloc(f32s(tokens * 4 * h));
            let g_attn = b.alloc(f32s(tokens * h));
            let g_scores = b.alloc(f32s(batch * 12 * t.seq * t.seq));
            b.free(g_scores);
            grads.extend(layer_params.iter().map(|&n| b.alloc(f32s(n))));
            b.free(g_mlp);
            b.free(g_attn);
            for a in keep {
                b.free(a);
            }
            let g_next = b.alloc(f32s(tokens * h));
            b.free(grad_x);
            grad_x = g_next;
        }
        grads.push(b.alloc(f32s(50_000 * h)));
        b.free(grad_x);
        b.free(loss);
        b.free(input);
        // Optimizer step: Adam states on the first step, a temporary per parameter.
        if adam.is_empty() {
            for &n in layer_params.iter().cycle().take((t.layers * 10) as usize) {
                adam.push(b.alloc(f32s(n)));
                adam.push(b.alloc(f32s(n)));
            }
            adam.push(b.alloc(f32s(50_000 * h)));
            adam.push(b.alloc(f32s(50_000 * h)));
        }
        for &n in layer_params.iter().cycle().take((t.layers * 10) as usize) {
            let tmp = b.alloc(f32s(n));
            b.free(tmp);
        }
        for g in grads {
            b.free(g);
        }
        small_pending.push(small_now);
        if small_pending.len() > 2 {
            for s in small_pending.remove(0) {
                b.free(s);
            }
        }
    }
    b.events
}

fn base_training() -> Training {
    Training {
        layers: 12,
        hidden: 768,
        seq: 256,
        batches: vec![8; 8],
        checkpointing: false,
        interleaved_small: false,
        copy_stream: false,
    }
}

/// The synthetic traces: name and events.
fn synthetic_traces() -> Vec<(&'static str, Vec<Event>)> {
    let steady = base_training();
    let growing = Training {
        batches: (4..16).collect(),
        ..base_training()
    };
    let shrinking = Training {
        batches: (4..16).rev().collect(),
        ..base_training()
    };
    let varying = Training {
        batches: vec![8, 13, 5, 16, 9, 11, 6, 15, 8, 12, 7, 10],
        ..base_training()
    };
    let sliver = Training {
        layers: 48,
        hidden: 512,
        batches: (8..20).collect(),
        ..base_training()
    };
    let interleaved = Training {
        interleaved_small: true,
        batches: vec![8, 9, 8, 10, 8, 11, 8, 12],
        ..base_training()
    };
    let checkpointed = Training {
        checkpointing: true,
        batches: vec![16; 8],
        ..base_training()
    };
    let two_streams = Training {
        copy_stream: true,
        interleaved_small: true,
        ..base_training()
    };
    vec![
        ("synthetic steady batch", training_trace(&steady, 1)),
        ("synthetic growing batch", training_trace(&growing, 2)),
        ("synthetic shrinking batch", training_trace(&shrinking, 3)),
        ("synthetic varying batch", training_trace(&varying, 4)),
        (
            "synthetic N→N+1 slivers, 48 layers",
            training_trace(&sliver, 5),
        ),
        (
            "synthetic interleaved small blocks",
            training_trace(&interleaved, 6),
        ),
        ("synthetic checkpointing", training_trace(&checkpointed, 7)),
        ("synthetic two streams", training_trace(&two_streams, 8)),
    ]
}

#[test]
fn synthetic_training_traces_beat_torch() {
    print_header();
    let mut failures = Vec::new();
    for (name, events) in synthetic_traces() {
        let (ours, torch) = compare(name, &events);
        check(name, &ours, &torch, SYNTHETIC_UTILISATION, &mut failures);
    }
    assert!(failures.is_empty(), "{failures:#?}");
}
