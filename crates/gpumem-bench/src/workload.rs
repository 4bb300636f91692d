//! Normalised workloads: a trace (or a synthetic mix) turned into a flat list of
//! `alloc(slot, size)` / `free(slot)` operations that every allocator under test replays alike.

use std::collections::HashMap;

use gpumem_testkit::Rng;
use gpumem_trace::{Event, Trace, TraceMeta};

/// One operation of a normalised workload.
///
/// Slots are dense indices (reused after a free) into the driver's table of live handles, so
/// that replaying a workload costs one indexed load and store per operation on top of the
/// allocator itself, the same for every allocator.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Op {
    /// Allocate `size` bytes and keep the handle in `slot` (which is empty).
    Alloc {
        /// Slot of the live-handle table.
        slot: u32,
        /// Bytes requested.
        size: u64,
    },
    /// Free the handle held in `slot`.
    Free {
        /// Slot of the live-handle table.
        slot: u32,
    },
}

/// A benchmark scenario: untimed `setup` operations that bring the allocator to a state, then the timed
/// `body`.
///
/// The body is *repeatable*: it leaves the set of live slots exactly as it found it (a trace is
/// followed by frees of what it left live; a synthetic churn frees and reallocates the same
/// slot), so a benchmark can replay it again and again on the same allocator, as a training
/// loop replays its step.
#[derive(Clone, Debug)]
pub struct Scenario {
    /// Short name, used in benchmark ids and tables.
    pub name: String,
    /// What the workload is, for tables.
    pub description: String,
    /// Operations applied before timing starts.
    pub setup: Vec<Op>,
    /// Operations timed (repeatable, see above).
    pub body: Vec<Op>,
    /// Size of the live-handle table.
    pub slots: usize,
    /// Live blocks after the setup (and after each body pass).
    pub live_after_setup: usize,
    /// Most blocks live at once over setup + one body pass.
    pub max_live_blocks: usize,
    /// Highest sum of live requested bytes over setup + one body pass.
    pub peak_live_bytes: u64,
    /// Index into `setup ++ body` of the operation after which `peak_live_bytes` is first
    /// reached: where fragmentation is sampled.
    pub peak_index: usize,
}

impl Scenario {
    /// Builds a workload and computes its live-set statistics.
    pub fn new(name: &str, description: &str, setup: Vec<Op>, body: Vec<Op>) -> Scenario {
        let mut sizes: Vec<Option<u64>> = Vec::new();
        let (mut live, mut live_bytes) = (0usize, 0u64);
        let (mut max_live, mut peak_bytes, mut peak_index) = (0usize, 0u64, 0usize);
        let mut live_after_setup = 0;
        for (index, op) in setup.iter().chain(body.iter()).enumerate() {
            if index == setup.len() {
                live_after_setup = live;
            }
            match *op {
                Op::Alloc { slot, size } => {
                    let slot = slot as usize;
                    if slot >= sizes.len() {
                        sizes.resize(slot + 1, None);
                    }
                    assert!(sizes[slot].is_none(), "op {index}: alloc into a live slot");
                    sizes[slot] = Some(size);
                    live += 1;
                    live_bytes += size;
                }
                Op::Free { slot } => {
                    let size = sizes
                        .get_mut(slot as usize)
                        .and_then(Option::take)
                        .unwrap_or_else(|| panic!("op {index}: free of an empty slot"));
                    live -= 1;
                    live_bytes -= size;
                }
            }
            max_live = max_live.max(live);
            if live_bytes > peak_bytes {
                peak_bytes = live_bytes;
                peak_index = index;
            }
        }
        if body.is_empty() {
            live_after_setup = live;
        }
        assert_eq!(live, live_after_setup, "the body must be repeatable");
        Scenario {
            name: name.to_string(),
            description: description.to_string(),
            setup,
            body,
            slots: sizes.len(),
            live_after_setup,
            max_live_blocks: max_live,
            peak_live_bytes: peak_bytes,
            peak_index,
        }
    }

    /// Number of allocations in the body.
    pub fn body_allocs(&self) -> usize {
        self.body
            .iter()
            .filter(|op| matches!(op, Op::Alloc { .. }))
            .count()
    }

    /// Largest single request of the workload.
    pub fn largest_request(&self) -> u64 {
        self.setup
            .iter()
            .chain(self.body.iter())
            .filter_map(|op| match op {
                Op::Alloc { size, .. } => Some(*size),
                Op::Free { .. } => None,
            })
            .max()
            .unwrap_or(0)
    }
}

/// Normalises a trace: addresses become dense slots, `Step` markers and streams are dropped
/// (the peers know no streams), zero-byte allocations and their frees are dropped (a pool
/// returns a null pointer for them), and blocks still live at the end are freed, last
/// allocated first, so that the body is repeatable.
pub fn from_trace(trace: &Trace) -> Scenario {
    let mut live: HashMap<u64, u32> = HashMap::new();
    let mut zero: HashMap<u64, ()> = HashMap::new();
    let mut free_slots: Vec<u32> = Vec::new();
    let mut next_slot = 0u32;
    let mut order: Vec<u32> = Vec::new();
    let mut body = Vec::with_capacity(trace.events.len());
    for event in &trace.events {
        match *event {
            Event::Alloc { addr, size, .. } => {
                if size == 0 {
                    zero.insert(addr, ());
                    continue;
                }
                if live.contains_key(&addr) {
                    continue; // invalid trace; readers reject these
                }
                let slot = free_slots.pop().unwrap_or_else(|| {
                    next_slot += 1;
                    next_slot - 1
                });
                live.insert(addr, slot);
                order.push(slot);
                body.push(Op::Alloc { slot, size });
            }
            Event::Free { addr, .. } => {
                if let Some(slot) = live.remove(&addr) {
                    free_slots.push(slot);
                    body.push(Op::Free { slot });
                } else {
                    zero.remove(&addr);
                }
            }
            Event::Step { .. } => {}
        }
    }
    // Free what is left, most recent allocation first.
    let mut left: Vec<u32> = live.into_values().collect();
    let rank: HashMap<u32, usize> = order.iter().enumerate().map(|(i, &s)| (s, i)).collect();
    left.sort_unstable_by_key(|s| std::cmp::Reverse(rank[s]));
    body.extend(left.into_iter().map(|slot| Op::Free { slot }));
    let name = if trace.meta.name.is_empty() {
        "trace".to_string()
    } else {
        trace.meta.name.clone()
    };
    let description = format!("trace `{name}` ({} events)", trace.events.len());
    Scenario::new(&name, &description, Vec::new(), body)
}

/// The sizes a synthetic mix draws from, uniformly: a training-like palette of 80 tensor
/// shapes (shapes repeat in training, which is what makes caching work): 8 tiny (4 B – 512 B:
/// scalars, norms' statistics), 56 small (512 B – 64 KiB: biases, norm weights, small
/// activations) and 16 large (64 KiB – 4 MiB: activations, weights). Mean ≈ 200 KiB, so that
/// 10⁶ live blocks (≈ 200 GB) still fit a u32 offset allocator in 512-byte units.
pub fn training_palette(seed: u64) -> Vec<u64> {
    let mut rng = Rng::new(seed ^ 0x7061_6c65_7474_6500);
    let mut sizes = Vec::with_capacity(80);
    sizes.extend((0..8).map(|_| rng.log_uniform(4, 512)));
    sizes.extend((0..56).map(|_| rng.log_uniform(512, 64 << 10)));
    sizes.extend((0..16).map(|_| rng.log_uniform(64 << 10, 4 << 20)));
    sizes
}

/// Synthetic steady-state churn at a fixed live count: the setup allocates `live` blocks and
/// churns `warm_pairs` times (free a uniformly chosen live block, allocate a new one of a
/// palette size in its slot); the body churns `body_pairs` more times. Live count stays at
/// `live` throughout the body, so per-operation cost is measured at that live count.
pub fn synthetic_mix(live: usize, warm_pairs: usize, body_pairs: usize, seed: u64) -> Scenario {
    assert!(live > 0 && live < u32::MAX as usize);
    let palette = training_palette(seed);
    let mut rng = Rng::new(seed);
    let pick = |rng: &mut Rng| palette[rng.below(palette.len() as u64) as usize];
    let mut setup = Vec::with_capacity(live + 2 * warm_pairs);
    for slot in 0..live as u32 {
        setup.push(Op::Alloc {
            slot,
            size: pick(&mut rng),
        });
    }
    let churn = |n: usize, ops: &mut Vec<Op>, rng: &mut Rng| {
        for _ in 0..n {
            let slot = rng.below(live as u64) as u32;
            ops.push(Op::Free { slot });
            ops.push(Op::Alloc {
                slot,
                size: pick(rng),
            });
        }
    };
    churn(warm_pairs, &mut setup, &mut rng);
    let mut body = Vec::with_capacity(2 * body_pairs);
    churn(body_pairs, &mut body, &mut rng);
    Scenario::new(
        &format!("mix-{}", pow10_name(live)),
        &format!(
            "synthetic mix, {} live blocks: {} setup ops (fill + {} churn pairs), {} timed ops",
            live,
            live + 2 * warm_pairs,
            warm_pairs,
            2 * body_pairs
        ),
        setup,
        body,
    )
}

/// The standard mix at `live` blocks: warm churn of min(live, 10⁵) pairs, 5·10⁴ timed pairs.
pub fn standard_mix(live: usize) -> Scenario {
    synthetic_mix(
        live,
        live.min(100_000),
        50_000,
        0x6770_756d_656d + live as u64,
    )
}

/// The live counts of the standard mixes: 10³, 10⁴, 10⁵, 10⁶.
pub const MIX_LIVE_COUNTS: [usize; 4] = [1_000, 10_000, 100_000, 1_000_000];

/// `1e3`-style name of a count (exact powers of ten), else the number.
pub fn pow10_name(n: usize) -> String {
    let mut k = 0;
    let mut m = n;
    while m >= 10 && m.is_multiple_of(10) {
        m /= 10;
        k += 1;
    }
    if m == 1 && k > 0 {
        format!("1e{k}")
    } else {
        n.to_string()
    }
}

/// A synthetic training trace of about `target_events` events, shaped like a decoder
/// transformer trained with Adam in PyTorch (24 layers, hidden 1024, 2048 tokens, fp16
/// activations, fp32 weights): weights and optimizer state allocated once; per step a forward
/// pass that saves activations and frees temporaries, a logits/loss peak, a backward pass that
/// frees saved activations in reverse and allocates gradients, an optimizer step with
/// temporaries, and `zero_grad(set_to_none=True)` freeing the gradients. A `Step` marker opens
/// each step. Shapes repeat every step, as they do in training.
pub fn synthetic_training_trace(target_events: usize) -> Trace {
    const LAYERS: usize = 24;
    const TOKENS: u64 = 2048;
    const HIDDEN: u64 = 1024;
    const HEADS: u64 = 16;
    const SEQ: u64 = 512;
    const VOCAB: u64 = 32_000;
    let fp16 = |n: u64| 2 * n;
    let fp32 = |n: u64| 4 * n;
    let act = fp16(TOKENS * HIDDEN);
    let weights: Vec<u64> = vec![
        fp32(3 * HIDDEN * HIDDEN), // qkv
        fp32(3 * HIDDEN),          // qkv bias
        fp32(HIDDEN * HIDDEN),     // out proj
        fp32(HIDDEN),              // ln1
        fp32(4 * HIDDEN * HIDDEN), // mlp up
        fp32(4 * HIDDEN * HIDDEN), // mlp down
        fp32(HIDDEN),              // ln2
    ];
    struct Gen {
        events: Vec<Event>,
        next: u64,
    }
    impl Gen {
        fn alloc(&mut self, size: u64) -> u64 {
            self.next += size.div_ceil(512) * 512 + 512;
            self.events.push(Event::Alloc {
                addr: self.next,
                size,
                stream: 0,
            });
            self.next
        }
        fn free(&mut self, addr: u64) {
            self.events.push(Event::Free { addr, stream: 0 });
        }
    }
    let mut g = Gen {
        events: Vec::with_capacity(target_events + 4096),
        next: 1 << 30,
    };
    // Parameters, embedding and Adam state (exp_avg, exp_avg_sq), allocated once.
    let embedding = fp32(VOCAB * HIDDEN);
    let mut persistent = vec![g.alloc(embedding)];
    for _ in 0..LAYERS {
        for &w in &weights {
            persistent.push(g.alloc(w));
        }
    }
    let params: Vec<u64> = std::iter::once(embedding)
        .chain((0..LAYERS).flat_map(|_| weights.iter().copied()))
        .collect();
    let mut adam = Vec::new();
    for &p in &params {
        adam.push(g.alloc(p));
        adam.push(g.alloc(p));
    }
    let mut step = 0u64;
    while g.events.len() < target_events {
        g.events.push(Event::Step { index: step });
        step += 1;
        // Forward: per layer, saved activations and freed temporaries.
        let mut saved: Vec<(u64, u64)> = Vec::new();
        let x = g.alloc(act); // embedding output
        saved.push((x, act));
        for _ in 0..LAYERS {
            for size in [act, fp32(TOKENS)] {
                saved.push((g.alloc(size), size)); // ln1 output, ln1 stats
            }
            saved.push((g.alloc(3 * act), 3 * act)); // qkv
            let scores_size = fp16(TOKENS / SEQ * HEADS * SEQ * SEQ);
            let scores = g.alloc(scores_size);
            saved.push((g.alloc(scores_size), scores_size)); // softmax probs
            g.free(scores);
            saved.push((g.alloc(act), act)); // attention output
            let proj = g.alloc(act);
            saved.push((g.alloc(act), act)); // residual
            g.free(proj);
            for size in [act, fp32(TOKENS)] {
                saved.push((g.alloc(size), size)); // ln2 output, ln2 stats
            }
            saved.push((g.alloc(4 * act), 4 * act)); // mlp up
            saved.push((g.alloc(4 * act), 4 * act)); // gelu
            let down = g.alloc(act);
            saved.push((g.alloc(act), act)); // residual
            g.free(down);
            saved.push((g.alloc(TOKENS * HIDDEN / 8), TOKENS * HIDDEN / 8)); // dropout mask
        }
        // Loss: a large logits temporary and a scalar.
        let logits = g.alloc(fp16(TOKENS * VOCAB));
        let loss = g.alloc(4);
        let dlogits = g.alloc(fp16(TOKENS * VOCAB));
        g.free(logits);
        // Backward: gradient of each saved activation, freed with it; weight gradients kept.
        let mut grads = vec![g.alloc(embedding)];
        let per_layer = saved.len().saturating_sub(1) / LAYERS;
        let mut grad_out = g.alloc(act);
        g.free(dlogits);
        for layer in (0..LAYERS).rev() {
            for &w in weights.iter().rev() {
                grads.push(g.alloc(w));
            }
            let start = 1 + layer * per_layer;
            for &(addr, size) in saved[start..start + per_layer].iter().rev() {
                let gtmp = g.alloc(size);
                g.free(addr);
                g.free(gtmp);
            }
            let next = g.alloc(act);
            g.free(grad_out);
            grad_out = next;
        }
        g.free(saved[0].0);
        g.free(grad_out);
        g.free(loss);
        // Optimizer (Adam, foreach): a temporary per parameter, then zero_grad frees grads.
        for &p in &params {
            let t = g.alloc(p);
            g.free(t);
        }
        for addr in grads {
            g.free(addr);
        }
    }
    let _ = (persistent, adam); // live to the end, like a model's parameters
    Trace::new(
        TraceMeta {
            name: "synthetic-training".into(),
            source: "gpumem-bench synthetic_training_trace".into(),
            device_total: None,
            extra: Default::default(),
        },
        g.events,
    )
}

/// A trace of random requests that grows with its steps or streams, where the replay's model
/// of asynchronous work once grew super-linearly: 50 long-lived blocks, then per step
/// `per_step` operations, each an allocation of 1 B to 16 MiB on one of `streams` streams or
/// (45 %) a free of a random live block, and what is left freed as the step ends. Addresses
/// never repeat in the trace (the replay's pool places the blocks). `seed` fixes the trace.
pub fn random_requests_trace(steps: u64, per_step: u64, streams: u64, seed: u64) -> Trace {
    let mut rng = Rng::new(seed);
    let mut events = Vec::new();
    let mut next = 1u64 << 20;
    let mut alloc = |events: &mut Vec<Event>, rng: &mut Rng, stream: u64| {
        next += 1 << 26;
        events.push(Event::Alloc {
            addr: next,
            size: 1 + rng.below(1 << 24),
            stream,
        });
        (next, stream)
    };
    for _ in 0..50 {
        alloc(&mut events, &mut rng, 0);
    }
    for step in 0..steps {
        events.push(Event::Step { index: step });
        let mut live: Vec<(u64, u64)> = Vec::new();
        for _ in 0..per_step {
            if !live.is_empty() && rng.unit() < 0.45 {
                let (addr, stream) = live.swap_remove(rng.below(live.len() as u64) as usize);
                events.push(Event::Free { addr, stream });
            } else {
                let stream = rng.below(streams.max(1));
                live.push(alloc(&mut events, &mut rng, stream));
            }
        }
        events.extend(
            live.into_iter()
                .map(|(addr, stream)| Event::Free { addr, stream }),
        );
    }
    Trace::new(
        TraceMeta {
            name: format!("random-{steps}-steps-{streams}-streams"),
            source: "gpumem-bench random_requests_trace".into(),
            device_total: None,
            extra: Default::default(),
        },
        events,
    )
}
