//! Driving an [`Arena`] through a [`Scenario`]: the hot loop the benchmarks time, a profiling
//! pass (failures, footprint, utilisation, fragmentation, overlap check) and a best-of-k
//! timing pass with a time budget.

use std::collections::BTreeMap;
use std::hint::black_box;
use std::time::{Duration, Instant};

use crate::arena::Arena;
use crate::workload::{Op, Scenario};

/// The live-handle table of a run.
pub type Slots<H> = Vec<Option<H>>;

/// A fresh live-handle table for `w`.
pub fn slots<H: Copy>(w: &Scenario) -> Slots<H> {
    vec![None; w.slots]
}

/// Applies `ops` to `arena`; returns the number of failed allocations. A failed allocation
/// leaves its slot empty and its free is skipped. This is the loop every timing measures: per
/// operation one slot load/store around the allocator's own call.
#[inline]
pub fn apply<A: Arena>(arena: &mut A, ops: &[Op], slots: &mut [Option<A::Handle>]) -> u64 {
    let mut failures = 0;
    for op in ops {
        match *op {
            Op::Alloc { slot, size } => {
                let handle = arena.alloc(size);
                failures += handle.is_none() as u64;
                slots[slot as usize] = handle;
            }
            Op::Free { slot } => {
                if let Some(handle) = slots[slot as usize].take() {
                    arena.free(handle);
                }
            }
        }
    }
    failures
}

/// What one profiling pass over setup + body found.
#[derive(Clone, Debug, PartialEq)]
pub struct Profile {
    /// Allocations that failed.
    pub failures: u64,
    /// Peak bytes the allocator needed: peak reserved for a pool, high-water mark (highest
    /// offset + size ever handed out) for a fixed arena.
    pub footprint: u64,
    /// Peak live requested bytes of the workload (the same for every allocator).
    pub peak_live_bytes: u64,
    /// `peak_live_bytes / footprint`: 1.0 is perfect.
    pub utilization: f64,
    /// External fragmentation at the moment live bytes peak: 1 − largest free block / free
    /// bytes, over reserved memory (pool) or below the high-water mark (fixed arena).
    pub fragmentation: f64,
    /// Free bytes (cached or below the high-water mark) at that moment.
    pub free_at_peak: u64,
    /// Live blocks found overlapping another (only counted when checking).
    pub overlaps: u64,
}

/// Runs setup + one body pass on a fresh `arena`, measuring what [`Profile`] holds. With
/// `check`, every allocation's span is checked against every live span (in a `BTreeMap`).
/// Returns `None` if `budget` runs out first.
pub fn profile<A: Arena>(
    arena: &mut A,
    w: &Scenario,
    check: bool,
    budget: Option<Duration>,
) -> Option<Profile> {
    let started = Instant::now();
    let mut slots: Slots<A::Handle> = slots(w);
    let mut live: BTreeMap<u64, u64> = BTreeMap::new();
    let (mut failures, mut overlaps, mut high_water) = (0u64, 0u64, 0u64);
    let mut at_peak = (0u64, 0u64);
    for (index, op) in w.setup.iter().chain(w.body.iter()).enumerate() {
        match *op {
            Op::Alloc { slot, size } => {
                let handle = arena.alloc(size);
                if let Some(h) = handle {
                    let (start, end) = arena.span(h);
                    high_water = high_water.max(end);
                    if check {
                        let clash_before = live
                            .range(..end)
                            .next_back()
                            .is_some_and(|(_, &e)| e > start);
                        if clash_before || end <= start {
                            overlaps += 1;
                        }
                        live.insert(start, end);
                    }
                } else {
                    failures += 1;
                }
                slots[slot as usize] = handle;
            }
            Op::Free { slot } => {
                if let Some(h) = slots[slot as usize].take() {
                    if check {
                        live.remove(&arena.span(h).0);
                    }
                    arena.free(h);
                }
            }
        }
        if index % CHUNK == 0 && budget.is_some_and(|b| started.elapsed() > b) {
            return None;
        }
        if index == w.peak_index {
            at_peak = arena
                .free_space()
                .unwrap_or_else(|| free_below(arena, &slots, high_water));
        }
    }
    // Leave the arena empty (pools keep their cache).
    for h in slots.iter_mut().filter_map(Option::take) {
        arena.free(h);
    }
    let footprint = arena.peak_reserved().unwrap_or(high_water);
    let (free, largest) = at_peak;
    Some(Profile {
        failures,
        footprint,
        peak_live_bytes: w.peak_live_bytes,
        utilization: if footprint == 0 {
            1.0
        } else {
            w.peak_live_bytes as f64 / footprint as f64
        },
        fragmentation: if free == 0 {
            0.0
        } else {
            1.0 - largest as f64 / free as f64
        },
        free_at_peak: free,
        overlaps,
    })
}

/// Free bytes below `high_water` and the largest free hole there, from the live spans.
fn free_below<A: Arena>(arena: &A, slots: &[Option<A::Handle>], high_water: u64) -> (u64, u64) {
    let mut spans: Vec<(u64, u64)> = slots.iter().flatten().map(|&h| arena.span(h)).collect();
    spans.sort_unstable();
    let (mut cursor, mut free, mut largest) = (0u64, 0u64, 0u64);
    for (start, end) in spans {
        if start > cursor {
            free += start - cursor;
            largest = largest.max(start - cursor);
        }
        cursor = cursor.max(end);
    }
    if high_water > cursor {
        free += high_water - cursor;
        largest = largest.max(high_water - cursor);
    }
    (free, largest)
}

/// An arena brought to the state after the setup, ready to replay its workload's body again
/// and again; lets several allocators be timed in turns (round-robin), so that a burst of
/// background load on a shared machine hits all of them rather than one.
pub trait Prepared {
    /// Replays the body once. With a deadline, looks at the clock every few thousand
    /// operations and stops past it: `Err(ns per op over the operations done)`.
    fn pass(&mut self, deadline: Option<Instant>) -> Result<f64, f64>;
}

struct PreparedArena<'w, A: Arena> {
    arena: A,
    slots: Slots<A::Handle>,
    body: &'w [Op],
}

impl<A: Arena> Prepared for PreparedArena<'_, A> {
    fn pass(&mut self, deadline: Option<Instant>) -> Result<f64, f64> {
        let t = Instant::now();
        match deadline {
            None => {
                black_box(apply(&mut self.arena, self.body, &mut self.slots));
            }
            Some(deadline) => {
                let mut done = 0usize;
                for chunk in self.body.chunks(CHUNK) {
                    black_box(apply(&mut self.arena, chunk, &mut self.slots));
                    done += chunk.len();
                    if Instant::now() > deadline && done < self.body.len() {
                        return Err(t.elapsed().as_nanos() as f64 / done as f64);
                    }
                }
            }
        }
        Ok(t.elapsed().as_nanos() as f64 / self.body.len().max(1) as f64)
    }
}

/// A fresh arena from `make` with `w`'s setup applied, or `None` if the setup took longer than
/// `budget`.
pub fn prepare<'w, A: Arena + 'static>(
    make: &dyn Fn() -> A,
    w: &'w Scenario,
    budget: Duration,
) -> Option<Box<dyn Prepared + 'w>> {
    let started = Instant::now();
    let mut arena = make();
    let mut slots: Slots<A::Handle> = slots(w);
    for chunk in w.setup.chunks(CHUNK) {
        apply(&mut arena, chunk, &mut slots);
        if started.elapsed() > budget {
            return None;
        }
    }
    Some(Box::new(PreparedArena {
        arena,
        slots,
        body: &w.body,
    }))
}

/// How one allocator's timing went (see [`crate::report::measure_ops`]).
#[derive(Clone, Debug, PartialEq)]
pub struct Timing {
    /// Nanoseconds per body operation, best of the passes (or over the operations done when
    /// the budget ran out).
    pub ns_per_op: f64,
    /// Body passes completed.
    pub passes: u32,
    /// False when the time budget ran out before one whole pass (setup included): then
    /// `ns_per_op` is over the body operations done, or NaN if the setup did not finish.
    pub complete: bool,
}

/// Operations between two looks at the clock in a budgeted run.
const CHUNK: usize = 4096;
