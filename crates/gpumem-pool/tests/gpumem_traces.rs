//! Utilisation and device calls of the `gpumem` policy on real and synthetic training traces,
//! next to the `torch` policy.
//!
//! utilisation = peak allocated bytes (after the policy's rounding) / peak reserved bytes;
//! device calls per step = allocating device calls (malloc, create, map) between step markers.
//! Run with `cargo test --release -p gpumem-pool --test gpumem_traces -- --nocapture` to see
//! the table.

mod support;
use support::Rng;

use std::collections::HashMap;
use std::path::{Path, PathBuf};
use std::sync::Arc;

use gpumem_device::sim::{SimConfig, SimDevice};
use gpumem_device::StreamId;
use gpumem_pool::{PolicyKind, Pool, PoolConfig};
use gpumem_trace::{Event, ReadOptions};

/// Device size for replays: an 80 GiB GPU, address-only.
const CAPACITY: u64 = 80 << 30;
/// The utilisation the `gpumem` policy must reach on every real trace.
const TARGET_UTILISATION: f64 = 0.97;
/// The utilisation it must reach on the adversarial synthetic traces, where a late block
/// larger than any hole can leave a few percent of mapped pages idle (see
/// docs/gpumem-policy.md).
const SYNTHETIC_UTILISATION: f64 = 0.95;

/// Times the steps after the first are replayed again after the trace, as a training loop
/// goes on, to measure device calls in steady state.
const STEADY_REPEATS: usize = 3;

/// What one replay measured.
#[derive(Debug)]
struct Replay {
    /// Peaks over the trace itself.
    peak_allocated: u64,
    peak_reserved: u64,
    /// Allocating device calls of each step of the trace (between step markers; the events
    /// before the first marker count as a step).
    calls_per_step: Vec<u64>,
    /// The most allocating device calls of any repeated step.
    steady_calls_per_step: u64,
}

impl Replay {
    fn utilisation(&self) -> f64 {
        self.peak_allocated as f64 / self.peak_reserved.max(1) as f64
    }
}

/// Replays `events` through a pool with `policy` on an address-only simulated device, then
/// the steps after the first [`STEADY_REPEATS`] times more (the last step when the trace has
/// fewer than two); checks that freeing everything and emptying the cache gives every byte
/// back. In a repetition, a trace address allocated again while still live (a block that
/// outlived the recorded steps) frees its previous block first.
fn replay(events: &[Event], policy: PolicyKind) -> Replay {
    let device = Arc::new(SimDevice::new(SimConfig::address_only(CAPACITY)).unwrap());
    let config = PoolConfig {
        policy,
        ..PoolConfig::default()
    };
    let pool = Pool::new(device.clone(), config).unwrap();
    let mut live: HashMap<u64, u64> = HashMap::new();
    let mut calls_per_step = Vec::new();
    let mut calls_before = 0;
    let mut run = |events: &[Event], calls_per_step: &mut Vec<u64>| {
        let mut close_step = |calls_per_step: &mut Vec<u64>| {
            let calls = device.counters().allocating_calls();
            calls_per_step.push(calls - calls_before);
            calls_before = calls;
        };
        for (i, event) in events.iter().enumerate() {
            match *event {
                Event::Alloc { addr, size, stream } => {
                    if let Some(previous) = live.remove(&addr) {
                        pool.free(previous).unwrap();
                    }
                    let a = pool
                        .allocate(size, StreamId(stream))
                        .unwrap_or_else(|e| panic!("{policy}: event {i}: {e}"));
                    live.insert(addr, a.ptr);
                }
                Event::Free { addr, .. } => {
                    if let Some(ptr) = live.remove(&addr) {
                        pool.free(ptr).unwrap();
                    }
                }
                Event::Step { .. } => close_step(calls_per_step),
            }
        }
        close_step(calls_per_step);
    };
    run(events, &mut calls_per_step);
    let stats = pool.stats();
    let second_step = events
        .iter()
        .enumerate()
        .filter(|(_, e)| matches!(e, Event::Step { .. }))
        .nth(1)
        .map(|(i, _)| i);
    let steady_calls_per_step = match second_step {
        Some(from) => {
            let mut repeated = Vec::new();
            for _ in 0..STEADY_REPEATS {
                run(&events[from..], &mut repeated);
            }
            repeated.into_iter().max().unwrap_or(0)
        }
        None => calls_per_step.last().copied().unwrap_or(0),
    };
    for ptr in live.into_values() {
        pool.free(ptr).unwrap();
    }
    pool.empty_cache().unwrap();
    assert_eq!(pool.stats().reserved_bytes.all.current, 0, "{policy}");
    Replay {
        peak_allocated: stats.allocated_bytes.all.peak,
        peak_reserved: stats.reserved_bytes.all.peak,
        calls_per_step,
        steady_calls_per_step,
    }
}

/// Replays with `gpumem` and `torch` and prints one row of the comparison table.
fn compare(name: &str, events: &[Event]) -> (Replay, Replay) {
    let ours = replay(events, PolicyKind::Gpumem);
    let torch = replay(events, PolicyKind::Torch);
    let mib = |b: u64| b as f64 / (1 << 20) as f64;
    eprintln!(
        "| {name} | {:.1} % | {:.1} % | {:.0} / {:.0} | {:.0} / {:.0} | {} / {} | {} / {} |",
        100.0 * ours.utilisation(),
        100.0 * torch.utilisation(),
        mib(ours.peak_allocated),
        mib(torch.peak_allocated),
        mib(ours.peak_reserved),
        mib(torch.peak_reserved),
        ours.steady_calls_per_step,
        torch.steady_calls_per_step,
        ours.calls_per_step.iter().sum::<u64>(),
        torch.calls_per_step.iter().sum::<u64>(),
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

#[test]
fn real_traces_reach_the_target_utilisation() {
    let mut paths: Vec<PathBuf> = std::fs::read_dir(trace_dir())
        .map(|dir| {
            dir.filter_map(|e| e.ok().map(|e| e.path()))
                .filter(|p| p.to_string_lossy().ends_with(".jsonl.gz"))
                .collect()
        })
        .unwrap_or_default();
    paths.sort();
    if paths.is_empty() {
        eprintln!(
            "skipped: no real traces in {} (testdata/traces/*.jsonl.gz)",
            trace_dir().display()
        );
        return;
    }
    print_header();
    let mut failures = Vec::new();
    for path in paths {
        let trace = gpumem_trace::read_path(&path, ReadOptions::default()).unwrap();
        let name = &trace.meta.name;
        let (ours, torch) = compare(name, &trace.events);
        if ours.utilisation() < TARGET_UTILISATION {
            failures.push(format!(
                "{name}: utilisation {:.2} % below {:.0} %",
                100.0 * ours.utilisation(),
                100.0 * TARGET_UTILISATION
            ));
        }
        if ours.utilisation() <= torch.utilisation() {
            failures.push(format!("{name}: torch's utilisation is as high"));
        }
        if ours.steady_calls_per_step > torch.steady_calls_per_step {
            failures.push(format!(
                "{name}: {} device calls per step in steady state, torch makes {}",
                ours.steady_calls_per_step, torch.steady_calls_per_step
            ));
        }
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
    let mut rng = Rng(seed);
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
        if ours.utilisation() < SYNTHETIC_UTILISATION {
            failures.push(format!(
                "{name}: utilisation {:.2} %",
                100.0 * ours.utilisation()
            ));
        }
        if ours.utilisation() <= torch.utilisation() {
            failures.push(format!("{name}: torch's utilisation is as high"));
        }
        if ours.steady_calls_per_step > torch.steady_calls_per_step {
            failures.push(format!(
                "{name}: {} device calls per step in steady state, torch makes {}",
                ours.steady_calls_per_step, torch.steady_calls_per_step
            ));
        }
    }
    assert!(failures.is_empty(), "{failures:#?}");
}
