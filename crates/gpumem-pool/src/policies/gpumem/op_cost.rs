//! Per-operation cost of the `gpumem` policy alone (no pool frame), next to `offset-allocator`
//! on the same operations. A measurement, not a check: ignored by default, run with
//! `cargo test --release -p gpumem-pool --lib op_cost -- --ignored --nocapture`.

use std::collections::HashMap;
use std::hint::black_box;
use std::path::Path;
use std::time::Instant;

use gpumem_device::sim::{SimConfig, SimDevice};
use gpumem_device::StreamId;

use super::GpumemPolicy;
use crate::history::History;
use crate::policy::{AllocRequest, Block, Policy, Upstream};
use crate::stats::MemoryStats;

/// One operation on a table of live slots.
#[derive(Clone, Copy)]
enum Op {
    Alloc { slot: usize, size: u64 },
    Free { slot: usize },
}

/// Operations that leave nothing live, so that they can be replayed pass after pass.
struct Workload {
    name: String,
    ops: Vec<Op>,
    slots: usize,
    peak_live_bytes: u64,
    peak_live_blocks: usize,
}

impl Workload {
    fn from_events(name: String, events: &[gpumem_trace::Event]) -> Workload {
        let mut builder = Builder::default();
        let mut by_addr: HashMap<u64, usize> = HashMap::new();
        for event in events {
            match *event {
                gpumem_trace::Event::Alloc { addr, size, .. } if size > 0 => {
                    by_addr.insert(addr, builder.alloc(size));
                }
                gpumem_trace::Event::Free { addr, .. } => {
                    if let Some(slot) = by_addr.remove(&addr) {
                        builder.free(slot);
                    }
                }
                _ => {}
            }
        }
        builder.finish(name)
    }

    /// `live` blocks from a training-like palette, then `churn` frees of a random live block
    /// each followed by a new allocation.
    fn churn(live: usize, churn: usize) -> Workload {
        let mut rng = 0x9e37_79b9_7f4a_7c15u64;
        let mut next = move || {
            rng ^= rng << 13;
            rng ^= rng >> 7;
            rng ^= rng << 17;
            rng
        };
        let palette: Vec<u64> = (0..80)
            .map(|i| match i {
                0..8 => 4 << (i % 8),
                8..64 => 512 << (i % 8),
                _ => (64 << 10) << (i % 7),
            })
            .collect();
        let mut builder = Builder::default();
        let mut slots: Vec<usize> = (0..live)
            .map(|_| builder.alloc(palette[(next() % 80) as usize]))
            .collect();
        for _ in 0..churn {
            let i = (next() % live as u64) as usize;
            builder.free(slots[i]);
            slots[i] = builder.alloc(palette[(next() % 80) as usize]);
        }
        builder.finish(format!("churn at {live} live blocks"))
    }
}

#[derive(Default)]
struct Builder {
    ops: Vec<Op>,
    live: HashMap<usize, u64>,
    spare: Vec<usize>,
    slots: usize,
    live_bytes: u64,
    peak_live_bytes: u64,
    peak_live_blocks: usize,
}

impl Builder {
    fn alloc(&mut self, size: u64) -> usize {
        let slot = self.spare.pop().unwrap_or_else(|| {
            self.slots += 1;
            self.slots - 1
        });
        self.ops.push(Op::Alloc { slot, size });
        self.live.insert(slot, size);
        self.live_bytes += size;
        self.peak_live_bytes = self.peak_live_bytes.max(self.live_bytes);
        self.peak_live_blocks = self.peak_live_blocks.max(self.live.len());
        slot
    }

    fn free(&mut self, slot: usize) {
        self.ops.push(Op::Free { slot });
        self.live_bytes -= self.live.remove(&slot).unwrap_or(0);
        self.spare.push(slot);
    }

    fn finish(mut self, name: String) -> Workload {
        let mut left: Vec<usize> = self.live.keys().copied().collect();
        left.sort_unstable();
        for slot in left {
            self.free(slot);
        }
        Workload {
            name,
            ops: self.ops,
            slots: self.slots,
            peak_live_bytes: self.peak_live_bytes,
            peak_live_blocks: self.peak_live_blocks,
        }
    }
}

/// Best nanoseconds per operation over `passes` timed passes, after one warm-up pass.
fn best_ns_per_op(ops: usize, passes: usize, mut pass: impl FnMut()) -> f64 {
    pass();
    (0..passes)
        .map(|_| {
            let t = Instant::now();
            pass();
            t.elapsed().as_nanos() as f64 / ops as f64
        })
        .fold(f64::INFINITY, f64::min)
}

fn gpumem_ns_per_op(w: &Workload) -> f64 {
    let device = SimDevice::new(SimConfig::address_only(1 << 40)).unwrap();
    let mut stats = MemoryStats::default();
    let mut history = History::default();
    let mut up = Upstream::new(&device, None, &mut stats, &mut history);
    let mut policy = GpumemPolicy::new();
    let mut table: Vec<Option<Block>> = vec![None; w.slots];
    best_ns_per_op(w.ops.len(), 5, || {
        for op in &w.ops {
            match *op {
                Op::Alloc { slot, size } => {
                    let req = AllocRequest {
                        size,
                        stream: StreamId::DEFAULT,
                    };
                    table[slot] = policy.allocate(req, &mut up).ok();
                }
                Op::Free { slot } => {
                    if let Some(block) = table[slot].take() {
                        policy.free(black_box(block), &mut up);
                    }
                }
            }
        }
    })
}

fn offset_allocator_ns_per_op(w: &Workload) -> f64 {
    let units = |bytes: u64| bytes.div_ceil(512).max(1) as u32;
    let arena = (4 * w.peak_live_bytes)
        .div_ceil(512)
        .next_power_of_two()
        .min(1 << 31) as u32;
    let max_allocs = (2 * w.peak_live_blocks + 1024) as u32;
    let mut allocator = offset_allocator::Allocator::<u32>::with_max_allocs(arena, max_allocs);
    let mut table: Vec<Option<offset_allocator::Allocation<u32>>> = vec![None; w.slots];
    best_ns_per_op(w.ops.len(), 5, || {
        for op in &w.ops {
            match *op {
                Op::Alloc { slot, size } => table[slot] = allocator.allocate(units(size)),
                Op::Free { slot } => {
                    if let Some(a) = table[slot].take() {
                        allocator.free(black_box(a));
                    }
                }
            }
        }
    })
}

#[test]
#[ignore = "a measurement: run with --ignored --nocapture in release mode"]
fn op_cost_next_to_offset_allocator() {
    let dir = Path::new(env!("CARGO_MANIFEST_DIR")).join("../../testdata/traces");
    let mut paths: Vec<_> = std::fs::read_dir(&dir)
        .map(|d| d.filter_map(|e| e.ok().map(|e| e.path())).collect())
        .unwrap_or_default();
    paths.retain(|p: &std::path::PathBuf| p.to_string_lossy().ends_with(".jsonl.gz"));
    paths.sort();
    let mut workloads: Vec<Workload> = paths
        .iter()
        .filter_map(|p| gpumem_trace::read_path(p, Default::default()).ok())
        .map(|t| Workload::from_events(t.meta.name, &t.events))
        .collect();
    for live in [1_000, 10_000, 100_000] {
        workloads.push(Workload::churn(live, 50_000));
    }
    eprintln!("| workload | ops | gpumem ns/op | offset-allocator ns/op | ratio |");
    eprintln!("|---|---:|---:|---:|---:|");
    for w in &workloads {
        let ours = gpumem_ns_per_op(w);
        let theirs = offset_allocator_ns_per_op(w);
        eprintln!(
            "| {} | {} | {ours:.1} | {theirs:.1} | {:.2}× |",
            w.name,
            w.ops.len(),
            ours / theirs
        );
    }
}
